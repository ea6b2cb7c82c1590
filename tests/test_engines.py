"""``--engine``: one flag sets what a training engine decides, explicit flags override it, and the
published runs expressed with their engine score the same errors as with every flag spelled out."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from trainplan import inputs
from trainplan.cli import main
from trainplan.engines import DEFAULT_ENGINE, ENGINE_FIELDS, ENGINES, Engine, Setting, get_engine, resolve
from trainplan.errors import TrainplanError
from trainplan.hardware.system import System
from trainplan.layout import DEFAULT_LAYOUT_OPTIONS, Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe
from trainplan.timing import step_time, throughput
from trainplan.validate.datasets import REGISTRY, TimingRow, timing_rows
from trainplan.validate.timing import predict_row, row_inputs


def cli_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    return json.loads(cli_text(capsys, *argv))


# The engine each dataset's runs used (DatasetInfo.source names the software and its release).
ENGINE_OF = {
    "torchtitan_llama3": "torchtitan",
    "megatron_bridge_llama3": "nemo",
    "nemo2407_h100": "nemo",
    "torchtune_throughput": "torchtune",
}


def _values(row: TimingRow, engine: str) -> tuple[dict[str, Any], list[str]]:
    """The row as estimate field values with ``--engine`` and the run's own sizes; plus an explicit
    flag for each engine setting the row states differently (named in the returned list)."""
    system, _, recipe, layout, _ = row_inputs(row)
    lora = recipe.lora
    values: dict[str, Any] = {
        "engine": engine,
        "devices": system.num_devices,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "ep": layout.ep,
        "zero": layout.zero,
        "sequence_parallel": layout.sequence_parallel,
        "pp_schedule": layout.pp_schedule,
        "virtual_stages": layout.virtual_stages,
        "pp_split_embedding": layout.pp_split_embedding,
        "pp_split_head": layout.pp_split_head,
        "method": recipe.method,
        "precision": recipe.precision,
        "optimizer": recipe.optimizer,
        "seq_len": recipe.seq_len,
        "micro_batch": recipe.micro_batch,
        "global_batch": recipe.global_batch,
        "recompute": recipe.recompute,
        "attention": recipe.attention,
        "offload": recipe.offload,
        "dropout": recipe.dropout,
        "no_master_weights": not recipe.master_weights,
        "loss_chunks": recipe.loss_chunks,
        "optimizer_in_backward": recipe.optimizer_in_backward,
        "paged_optimizer": recipe.paged_optimizer,
        "lora_rank": lora.rank if lora else None,
        "lora_targets": ",".join(lora.targets) if lora else None,
        "no_double_quant": bool(lora and not lora.double_quant),
    }
    stated = {
        "stack": recipe.stack,
        "recompute_early_stop": recipe.recompute_early_stop,
        "torch_compile": recipe.torch_compile,
        "tp_comm_overlap": layout.tp_comm_overlap,
        "pp_comm_overlap": layout.pp_comm_overlap,
        "zero3_granularity": layout.zero3_granularity,
        "grad_accumulation": layout.grad_accumulation,
    }
    by_engine = inputs.build_layout(values), inputs.build_recipe(values)
    engine_says = {
        "stack": by_engine[1].stack,
        "recompute_early_stop": by_engine[1].recompute_early_stop,
        "torch_compile": by_engine[1].torch_compile,
        **{k: getattr(by_engine[0], k) for k in stated if hasattr(by_engine[0], k)},
    }
    overrides = [k for k in stated if stated[k] != engine_says[k]]
    for k in overrides:
        values[k] = stated[k]
    if recipe.recompute not in ("full", "sac"):
        # how a checkpoint re-runs a block says nothing about a run without one: not an override
        overrides = [k for k in overrides if k != "recompute_early_stop"]
    if not layout.overlap_grad_reduce:
        values["no_overlap_grad_reduce"] = True
        overrides.append("overlap_grad_reduce")
    return values, overrides


def _metric(row: TimingRow, system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> float:
    metric = REGISTRY[row.dataset].metric
    t = step_time(system, model, recipe, layout)
    if metric == "step_s":
        return t.step_s
    if metric == "layer_s":
        return (t.forward_s + t.backward_s + t.recompute_s + t.exposed_tp_s) / model.num_layers
    th = throughput(system, model, recipe, layout, t)
    return th.tokens_per_s if metric == "tokens_per_s" else th.mfu


# What each dataset's runs state beyond their engine's defaults, row by row (the flags the
# engine spelling adds): torchtitan's published benchmarks ran torchtitan before 0.2, whose
# checkpoint stopped early, and some of them async TP and torch.compile (off by default in
# torchtitan and torchtune; the torchtune README's tables turn it on); NeMo 24.07's GPT-3 175B and
# the NVFP4 Megatron Bridge runs left the tensor-parallel overlap off.
EXPECTED_OVERRIDES = {
    "torchtitan_llama3": {"recompute_early_stop", "tp_comm_overlap", "torch_compile"},
    "megatron_bridge_llama3": {"tp_comm_overlap"},
    "nemo2407_h100": {"tp_comm_overlap"},
    "torchtune_throughput": {"torch_compile"},
}


@pytest.mark.parametrize("dataset", sorted(ENGINE_OF))
def test_published_runs_with_engine_score_the_same_errors(dataset: str) -> None:
    rows = [r for r in timing_rows(dataset) if r.is_target]
    assert rows
    bare = 0
    seen: set[str] = set()
    scored = 0
    for row in rows:
        explicit = predict_row(row)
        if explicit.error is None:
            continue  # not predicted with the explicit flags either (validate lists why)
        scored += 1
        system, model, recipe, layout, _ = row_inputs(row)
        values, overrides = _values(row, ENGINE_OF[dataset])
        seen.update(overrides)
        # torch.compile is a per-run switch the published benchmarks turn on: a row that adds only
        # --torch-compile to its engine still counts as the engine spelled alone
        bare += not set(overrides) - {"torch_compile"}
        by_engine = inputs.build_recipe(values), inputs.build_layout(values)
        assert by_engine == (recipe, layout), row.name
        published = explicit.published
        engine_error = _metric(row, system, model, *by_engine) / published - 1.0
        assert engine_error == pytest.approx(explicit.error, abs=1e-12), row.name
    assert seen == EXPECTED_OVERRIDES[dataset]
    assert scored >= len(rows) // 2
    assert bare >= scored // 3, f"{dataset}: only {bare} of {scored} rows are --engine alone"


def test_every_engine_setting_has_a_version_and_a_source() -> None:
    for engine in ENGINES.values():
        assert engine.version and engine.title
        settings = engine.settings()
        assert set(settings) == set(ENGINE_FIELDS)
        for name, setting in settings.items():
            assert setting.source.strip(), f"{engine.name}.{name} names no source"
        assert engine.export_target is not None or engine.export_note, engine.name


def test_nemo_engine_states_the_bridge_release_the_export_writes() -> None:
    """The nemo engine's version and every Megatron Bridge / Megatron-Core file it cites are the
    release ``trainplan export --to nemo`` writes a recipe for (and whose field lists it copies)."""
    from trainplan.export import nemo

    engine = get_engine("nemo")
    assert engine.export_target == nemo.TARGET
    assert engine.version == f"Megatron Bridge {nemo.VERSION} (Megatron-Core {nemo.MCORE_VERSION})"
    assert nemo.schema()["versions"] == {"megatron-bridge": nemo.VERSION, "megatron-core": nemo.MCORE_VERSION}
    cited = {**engine.settings(), **engine.capabilities()}
    for name, setting in cited.items():
        # each repository named is named at the export's release
        bridge = re.findall(r"NVIDIA-NeMo/Megatron-Bridge ([^\s)]+)", setting.source)
        assert set(bridge) <= {f"v{nemo.VERSION}"}, (name, bridge)
        core = re.findall(r"NVIDIA/Megatron-LM ([^\s)]+)", setting.source)
        assert set(core) <= {f"core_v{nemo.MCORE_VERSION}"}, (name, core)
    bridge_cited = [n for n, s in cited.items() if "Megatron-Bridge" in s.source or "Megatron-LM" in s.source]
    assert set(bridge_cited) >= {
        "stack",
        "recompute_early_stop",
        "zero3_granularity",
        "overlap_grad_reduce",
        "tp_comm_overlap",
        "pp_comm_overlap",
        "grad_accumulation",
        "softmax_fp32",
        "recomputes",
        "zero_stages",
    }


def test_default_engine_keeps_the_layout_and_recipe_defaults() -> None:
    engine = get_engine(None)
    assert engine.name == DEFAULT_ENGINE
    assert engine.stack.value == Recipe().stack
    assert engine.recompute_early_stop.value == Recipe().recompute_early_stop
    for name in ("overlap_grad_reduce", "tp_comm_overlap", "zero3_granularity", "grad_accumulation"):
        assert getattr(engine, name).value == getattr(DEFAULT_LAYOUT_OPTIONS, name), name


def test_explicit_flags_override_the_engine() -> None:
    base = {"engine": "nemo", "sequence_parallel": True}
    applied = resolve(base)
    assert applied.values["tp_comm_overlap"] is True and "tp_comm_overlap" not in applied.explicit
    off = resolve({**base, "tp_comm_overlap": False, "stack": "pytorch"})
    assert off.values["tp_comm_overlap"] is False and off.values["stack"] == "pytorch"
    assert set(off.explicit) == {"tp_comm_overlap", "stack"}
    assert (
        resolve({"engine": "torchtitan", "no_overlap_grad_reduce": True}).values["overlap_grad_reduce"]
        is False
    )
    with pytest.raises(TrainplanError, match="unknown engine 'megatorn'"):
        resolve({"engine": "megatorn"})


def test_engine_overlap_applies_only_where_the_layout_has_it() -> None:
    fields = inputs.fill_defaults({}, inputs.ESTIMATE_FIELDS)
    one_f_one_b = {**fields, "engine": "megatron", "devices": 8, "pp": 4, "global_batch": 32}
    assert not inputs.build_layout(one_f_one_b).pp_comm_overlap
    inter = {**one_f_one_b, "pp_schedule": "interleaved", "virtual_stages": 2}
    assert inputs.build_layout(inter).pp_comm_overlap
    assert not inputs.build_layout({**inter, "pp_comm_overlap": False}).pp_comm_overlap
    # the engine's tensor-parallel overlap without sequence parallelism stays off; the flag is refused
    no_sp = {**fields, "engine": "nemo", "devices": 8, "tp": 2}
    assert not inputs.build_layout(no_sp).tp_comm_overlap
    with pytest.raises(TrainplanError, match="needs sequence parallelism"):
        inputs.build_layout({**no_sp, "tp_comm_overlap": True})


def test_cli_names_the_engine_and_what_it_set(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    text = cli_text(capsys, *args)
    assert f"engine: {DEFAULT_ENGINE} (default engine" in text
    text = cli_text(capsys, *args, "--engine", "torchtitan", "--recompute", "full", "--recompute-early-stop")
    assert "engine: torchtitan (torchtitan 0.2.2) set stack=pytorch" in text
    assert "given by flag: recompute_early_stop=true" in text
    out = cli_json(
        capsys, *args, "--engine", "torchtitan", "--recompute", "full", "--recompute-early-stop", "--json"
    )
    settings = out["engine"]["settings"]
    assert out["engine"]["name"] == "torchtitan" and out["engine"]["default"] is False
    assert settings["recompute_early_stop"] == {
        **settings["recompute_early_stop"],
        "value": True,
        "engine_value": False,
        "set_by": "flag",
    }
    assert out["recipe"]["stack"] == "pytorch"
    json.dumps(out)


def test_engine_changes_the_prediction_as_its_settings_do(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3", "--json"]
    titan = cli_json(capsys, *args, "--engine", "torchtitan")
    spelled = cli_json(capsys, *args, "--stack", "pytorch")
    assert titan["time"] == spelled["time"] and titan["memory"] == spelled["memory"]
    assert titan["time"] != cli_json(capsys, *args)["time"]


def test_a_registered_engine_is_used_by_its_name() -> None:
    base = get_engine("torchtitan")
    custom = dataclasses.replace(
        base, name="my-fsdp", tp_comm_overlap=Setting(value=True, source="our fork: async TP on")
    )
    from trainplan.engines import register

    register(custom)
    try:
        with pytest.raises(ValueError, match="registered already"):
            register(custom)
        assert resolve({"engine": "my-fsdp"}).values["tp_comm_overlap"] is True
    finally:
        del ENGINES["my-fsdp"]
    assert isinstance(base, Engine)


def test_docs_engines_table_is_current() -> None:
    from pathlib import Path

    from trainplan.engines import engines_markdown

    text = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text(encoding="utf-8")
    table = text.split("<!-- engines: generated -->\n", 1)[1].split("<!-- end of engines -->", 1)[0]
    assert table == engines_markdown(), (
        "docs/engines.md is out of date: regenerate it with engines_markdown()"
    )


def test_a_named_engine_runs_only_what_it_has(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "llama-3.1-8b", "--hardware", "h100-sxm", "--devices", "8"]
    capsys.readouterr()
    assert main([*base, "--zero", "1", "--engine", "torchtitan"]) == 2
    assert "torchtitan has no ZeRO-1; it has ZeRO 0, 2, 3" in capsys.readouterr().err
    assert main([*base, "--recompute", "sac", "--engine", "megatron"]) == 2
    assert "megatron has no 'sac' recompute" in capsys.readouterr().err
    # the default engine, named by nobody, holds a request to nothing
    assert main([*base, "--zero", "3", "--recompute", "sac"]) == 0
    capsys.readouterr()
    # the planner searches only what the named engine runs
    out = cli_json(
        capsys, "plan", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-devices", "16", "--engine", "torchtitan",
        "--tokens", "1e9", "--top", "10", "--json",
    )  # fmt: skip
    assert out["plans"]
    for p in out["plans"]:
        assert p["layout"]["zero"] in (0, 2, 3) and p["recipe"]["recompute"] in ("none", "full", "sac")
    assert out["engine"]["zero_stages"] == [0, 2, 3]
