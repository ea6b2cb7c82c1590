"""The input schema: one declaration per field, the CLI built from it, defaults from the dataclasses."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from trainplan import inputs
from trainplan.cli import build_parser
from trainplan.errors import TrainplanError
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.recipe import LoRASpec, Recipe


def _defaults(fields: tuple[inputs.Field, ...]) -> dict[str, Any]:
    return {f.name: f.default for f in fields}


def test_schema_defaults_are_the_dataclass_defaults() -> None:
    assert inputs.build_recipe(_defaults(inputs.RECIPE_FIELDS)) == Recipe()
    assert inputs.build_layout(_defaults(inputs.LAYOUT_FIELDS)) == Layout()
    lora = inputs.build_recipe({**_defaults(inputs.RECIPE_FIELDS), "method": "lora"}).lora
    assert lora is not None and lora.rank == LoRASpec().rank and lora.targets == LoRASpec().targets


def test_the_planner_reads_its_defaults_from_the_schema() -> None:
    from trainplan.planner import search

    assert search.SearchSpace().max_devices == inputs.DEFAULT_MAX_DEVICES
    with pytest.raises(TrainplanError, match="time, cost, balanced"):
        search.plan(load_model("gpt2"), Recipe(), [], objective="fastest")


def test_searchable_fields_are_what_the_planner_searches() -> None:
    from trainplan.planner.command import request

    searched = {f.name for f in inputs.ESTIMATE_FIELDS if f.searchable}
    assert searched == {
        "devices",
        "tp",
        "pp",
        "cp",
        "ep",
        "zero",
        "sequence_parallel",
        "pp_schedule",
        "virtual_stages",
        "micro_batch",
        "recompute",
        "offload",
        "precision",
    }
    open_values = inputs.read({}, [f for f in inputs.PLAN_FIELDS if f.name != "hardware_file"])
    _, space = request(open_values, compare_mode=False)
    assert len(space.micro_batches) > 1 and len(space.recomputes) > 1 and len(space.offloads) > 1
    fixed = {**open_values, "micro_batch": 2, "recompute": "full", "offload": "none", "precision": "fp8"}
    _, space = request(fixed, compare_mode=False)
    assert (space.micro_batches, space.recomputes, space.offloads, space.precisions) == (
        (2,),
        ("full",),
        ("none",),
        ("fp8",),
    )
    # a field that is not searchable is the same for every plan: the plan request keeps its default
    plan_fields = {f.name: f for f in inputs.PLAN_FIELDS}
    for f in inputs.RECIPE_FIELDS:
        assert plan_fields[f.name].default == (None if f.searchable else f.default), f.name


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p: argparse.ArgumentParser = sub.choices[name]
    return p


@pytest.mark.parametrize("command", list(inputs.COMMANDS))
def test_each_command_has_exactly_its_schema_fields(command: str) -> None:
    actions = {a.dest: a for a in _subparser(command)._actions if a.dest != "help"}
    fields = {f.name: f for f in inputs.COMMANDS[command]}
    assert set(actions) == set(fields)
    for name, f in fields.items():
        a = actions[name]
        if not (f.required or f.positional):
            assert a.default == f.default, name
        assert (tuple(a.choices) if a.choices is not None else None) == f.choices, name
        assert (a.help or "").replace("%%", "%") == f.help, name  # argparse help escapes %


def test_parse_checks_values_as_the_cli_does() -> None:
    by_name = {f.name: f for f in inputs.ESTIMATE_FIELDS}
    assert by_name["tp"].parse(4) == 4 and by_name["tp"].parse("4") == 4
    assert by_name["tokens"].parse(1e9) == 1e9
    assert by_name["zero"].parse(None) == 0
    for name, bad, says in [
        ("tp", 0, "positive"),
        ("tp", True, "string or a number"),
        ("zero", 4, "not one of"),
        ("sequence_parallel", "yes", "true or false"),
        ("tokens", float("inf"), "finite"),
    ]:
        with pytest.raises(TrainplanError) as err:
            by_name[name].parse(bad)
        assert err.value.field == name and says in err.value.message


def test_validation_happens_in_the_dataclasses() -> None:
    values = {**_defaults(inputs.RECIPE_FIELDS), "paged_optimizer": True, "optimizer": "sgd"}
    with pytest.raises(TrainplanError) as err:
        inputs.build_recipe(values)
    assert err.value.field == "paged_optimizer"
    with pytest.raises(TrainplanError) as err:
        inputs.build_layout({**_defaults(inputs.LAYOUT_FIELDS), "tp_comm_overlap": True})
    assert err.value.field == "tp_comm_overlap"


@pytest.mark.parametrize("flag", ["--tokens", "--price"])
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e999"])
def test_non_finite_numbers_are_refused(flag: str, text: str) -> None:
    """`--tokens inf` used to print `Infinity`, which is not JSON."""
    field = next(f for f in inputs.ESTIMATE_FIELDS if f.option == flag)
    with pytest.raises(ValueError, match=r"finite|positive"):
        field.convert(text)
