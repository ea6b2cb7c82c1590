"""Megatron Bridge recipe export: every key a field of the Megatron Bridge 0.3.1 dataclass it sets
(the field lists copied into the package from the wheel), the values the plan's, and — where
``megatron.bridge`` is installed — the recipe run to a ``ConfigContainer`` that validates."""

from __future__ import annotations

import ast
import importlib.util
import math
import os
from pathlib import Path
from typing import Any

import pytest

from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.export import export_plan, nemo
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

H100 = get_accelerator("h100-sxm", [])

PLANS: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = [
    (
        "llama-3.1-8b",
        8,
        {"recompute": "full", "tokens": 1e9, "global_batch": 64},
        {"zero": 3, "tp": 2, "sequence_parallel": True},
    ),
    ("mixtral-8x7b", 16, {"tokens": 1e10, "global_batch": 256}, {"zero": 1, "ep": 8}),
    (
        "llama-3.1-70b",
        64,
        {"precision": "fp8", "global_batch": 128},
        {
            "zero": 1,
            "tp": 4,
            "pp": 4,
            "pp_schedule": "interleaved",
            "virtual_stages": 5,
            "sequence_parallel": True,
            "tp_comm_overlap": True,
            "pp_comm_overlap": True,
        },
    ),
    (
        "qwen2.5-7b",
        8,
        {"recompute": "selective", "global_batch": 32},
        {"zero": 0, "tp": 2, "sequence_parallel": True},
    ),
    ("qwen1.5-moe-a2.7b", 8, {"offload": "optimizer", "global_batch": 32}, {"zero": 1, "ep": 4}),
]


def _plan(
    model: str, devices: int, recipe: dict[str, Any], layout: dict[str, Any]
) -> tuple[System, ModelSpec, Recipe, Layout]:
    return (
        System(accelerator=H100, num_devices=devices),
        load_model(model),
        Recipe(**recipe),
        Layout.for_devices(devices, **layout),
    )


@pytest.mark.parametrize(("model", "devices", "recipe", "layout"), PLANS)
def test_every_key_is_a_field_of_its_bridge_dataclass(
    model: str, devices: int, recipe: dict[str, Any], layout: dict[str, Any]
) -> None:
    schema = nemo.schema()
    classes = schema["classes"]
    sections, mixed_precision, facts, _ = nemo.build_recipe(*_plan(model, devices, recipe, layout))
    assert mixed_precision in schema["mixed_precision"]
    assert set(sections) <= set(classes["ConfigContainer"])
    for section, values in sections.items():
        unknown = set(values) - set(classes[nemo.SECTION_CLASSES[section]])
        assert not unknown, (section, unknown)
    # the values are the plan's
    _, spec, rec, lay = _plan(model, devices, recipe, layout)
    m = sections["model"]
    assert (
        m["tensor_model_parallel_size"],
        m["pipeline_model_parallel_size"],
        m["context_parallel_size"],
    ) == (
        lay.tp,
        lay.pp,
        lay.cp,
    )
    assert m["expert_model_parallel_size"] == lay.ep and m["sequence_parallel"] == lay.sequence_parallel
    assert m["num_layers"] == spec.num_layers and m["num_query_groups"] == spec.num_kv_heads
    assert m["virtual_pipeline_model_parallel_size"] == (
        lay.virtual_stages if lay.pp_schedule == "interleaved" else None
    )
    assert m.get("num_moe_experts") == (spec.moe.num_experts if spec.moe else None)
    train = sections["train"]
    assert train["global_batch_size"] == facts.global_batch == lay.dp * rec.micro_batch * facts.micro_batches
    if rec.tokens is None:
        assert "train_iters" not in train and "lr_decay_iters" not in sections["scheduler"]
    else:
        steps = math.ceil(rec.tokens / (facts.global_batch * rec.seq_len))
        assert train["train_iters"] == sections["scheduler"]["lr_decay_iters"] == steps
    ddp = sections["ddp"]
    assert (
        ddp["use_distributed_optimizer"]
        == (lay.zero >= 1)
        == sections["optimizer"]["use_distributed_optimizer"]
    )
    assert ddp["use_megatron_fsdp"] == (lay.zero >= 2)
    assert ("checkpoint" in sections) == (lay.zero >= 2)
    assert sections["comm_overlap"]["tp_comm_overlap"] == lay.tp_comm_overlap
    assert m["recompute_granularity"] == (None if rec.recompute == "none" else rec.recompute)


def _bridge_dp_overlap(sections: dict[str, dict[str, object]], dp: int) -> dict[str, object]:
    """``ddp.overlap_grad_reduce`` / ``overlap_param_gather`` after Megatron Bridge 0.3.1's
    ``CommOverlapConfig.setup`` (``training/comm_overlap.py`` lines 527-549, 557-565, 598-606): with
    the distributed optimizer it sets both to its own choice (on with DP > 1) unless the
    ``CommOverlapConfig`` gives a value."""
    ddp, user = sections["ddp"], sections["comm_overlap"]
    out = {k: ddp[k] for k in ("overlap_grad_reduce", "overlap_param_gather")}
    if ddp["use_distributed_optimizer"]:
        for key in out:
            out[key] = user[key] if user.get(key) is not None else dp > 1
    return out


@pytest.mark.parametrize(
    ("model", "devices", "recipe", "layout"),
    [*PLANS, ("llama-3.1-8b", 8, {"global_batch": 32}, {"zero": 1, "overlap_grad_reduce": False})],
)
def test_bridge_runs_the_plans_gradient_overlap(
    model: str, devices: int, recipe: dict[str, Any], layout: dict[str, Any]
) -> None:
    """The data-parallel overlaps the recipe runs with are the plan's, also where the plan turns
    them off: the comm_overlap section states them, so Bridge's setup keeps them."""
    plan = _plan(model, devices, recipe, layout)
    lay = plan[3]
    sections, _, _, _ = nemo.build_recipe(*plan)
    assert _bridge_dp_overlap(sections, lay.dp) == {
        "overlap_grad_reduce": lay.overlap_grad_reduce,
        "overlap_param_gather": lay.overlap_grad_reduce and lay.zero >= 1,
    }


@pytest.mark.parametrize(("model", "devices", "recipe", "layout"), PLANS[:2])
def test_the_recipe_file_holds_the_sections(
    model: str, devices: int, recipe: dict[str, Any], layout: dict[str, Any]
) -> None:
    """The written file is Python whose PLAN table is the sections, key for key."""
    plan = _plan(model, devices, recipe, layout)
    text = export_plan("nemo", *plan).text
    tree = ast.parse(text)
    [table] = [
        n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "PLAN"
    ]
    assert isinstance(table, ast.Dict)
    sections, mixed_precision, _, _ = nemo.build_recipe(*plan)
    written = {
        ast.literal_eval(k): [ast.literal_eval(kk) for kk in v.keys if kk is not None]
        for k, v in zip(table.keys, table.values, strict=True)
        if k is not None and isinstance(v, ast.Dict)
    }
    assert written == {name: list(values) for name, values in sections.items()}
    assert f"MIXED_PRECISION = {mixed_precision!r}".replace("'", '"') in text


@pytest.mark.parametrize(
    ("recipe", "layout", "field"),
    [
        ({"method": "lora"}, {"zero": 1}, "method"),
        ({"precision": "fp32"}, {"zero": 1}, "precision"),
        ({"recompute": "sac"}, {"zero": 1}, "recompute"),
        ({"offload": "optimizer+params"}, {"zero": 3}, "offload"),
        ({}, {"zero": 1, "pp": 2, "pp_schedule": "zb"}, "pp_schedule"),
        ({}, {"zero": 3, "zero3_granularity": "parameter"}, "zero3_granularity"),
    ],
)
def test_what_megatron_core_cannot_run_is_refused(
    recipe: dict[str, Any], layout: dict[str, Any], field: str
) -> None:
    with pytest.raises(TrainplanError) as info:
        export_plan("nemo", *_plan("llama-3.1-8b", 8, recipe, layout))
    assert info.value.field == field and "nemo cannot express" in info.value.message


def test_engine_nemo_exports_a_bridge_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "recipe.py"
    argv = ["export", "llama-3.1-8b", "--hardware", "h100-sxm", "--devices", "8", "--engine", "nemo"]
    assert main([*argv, "--tokens", "1e9", "--output", str(out)]) == 0
    assert "as nemo config" in capsys.readouterr().err or out.exists()
    text = out.read_text()
    assert text.startswith(f"# Megatron Bridge {nemo.VERSION}")
    compile(text, str(out), "exec")


def _bridge() -> None:
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
        pytest.skip("megatron-bridge==0.3.1 not installed (pip install --no-deps megatron-bridge==0.3.1)")


@pytest.mark.parametrize(("model", "devices", "recipe", "layout"), PLANS)
def test_bridge_builds_and_validates_the_recipe(
    model: str,
    devices: int,
    recipe: dict[str, Any],
    layout: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Megatron Bridge's own classes: the recipe's ConfigContainer has the plan's degrees and batch,
    and ``ConfigContainer.validate`` accepts it at the plan's world size."""
    _bridge()
    plan = _plan(model, devices, recipe, layout)
    path = tmp_path / "recipe.py"
    path.write_text(export_plan("nemo", *plan).text)
    spec = importlib.util.spec_from_file_location("trainplan_bridge_recipe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.trainplan_pretrain_config()
    sections, _, facts, _ = nemo.build_recipe(*plan)
    for section, values in sections.items():
        for key, value in values.items():
            got = getattr(getattr(cfg, section), key)
            if isinstance(value, nemo.Code):  # a function or an enum member, by name
                assert value.source.split(".")[-1] == getattr(got, "__name__", getattr(got, "name", None))
            else:
                assert got == value, (section, key, got, value)
    monkeypatch.setitem(os.environ, "WORLD_SIZE", str(devices))
    cfg.validate()
    assert cfg.train.global_batch_size == facts.global_batch
