"""Regression tests: inputs that were accepted and ignored, gave impossible numbers, raised
something other than a typed error, or hung. Each is refused with its reason and fix, or modelled."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import trainplan
from trainplan.cli import SUBCOMMANDS, main
from trainplan.errors import CatalogError, ModelError, RecipeError, TrainplanError
from trainplan.hardware import get_accelerator, load_hardware_file
from trainplan.layout import Layout
from trainplan.limits import MAX_DEVICES, MAX_LAYERS, MAX_SEQ_LEN
from trainplan.models import from_hf_config, load_hf_config, load_model
from trainplan.models.spec import MoESpec
from trainplan.recipe import LoRASpec, Recipe

LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
}


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI; assert exit status 2 with one error line; return that line."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainplan: error: "), err
    return lines[0]


def answered(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


EST = ("estimate", "llama-3.2-1b", "--hardware", "h100-sxm")


# --- already refused: kept refused --------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (("--pp-schedule", "zb"), "pp_schedule"),
        (("--devices", "4", "--pp", "4", "--pp-schedule", "interleaved"), "virtual_stages"),
        (("--devices", "2", "--cp", "2", "--seq-len", "4098"), "cp"),
        (("--tokens", "inf"), "tokens"),
        (("--price", "inf"), "price"),
        (("--pue", "inf"), "pue"),
        (("--pue", "nan"), "pue"),
        (("--dropout", "inf"), "dropout"),
        (("--tokens", "5e-324"), "tokens"),
    ],
)
def test_unmodelled_or_non_finite_inputs_are_refused(
    capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], field: str
) -> None:
    line = refused(capsys, *EST, *extra)
    assert field.replace("_", "-") in line or field in line, line


def test_no_named_memory_term_is_negative() -> None:
    for kw in ({"method": "qlora"}, {"offload": "optimizer", "zero": 3, "devices": 8}, {"recompute": "full"}):
        d = trainplan.estimate("llama-3-8b", hardware="h100-sxm", **kw).to_dict()  # type: ignore[arg-type]
        assert all(v >= 0 for v in d["memory"].values() if isinstance(v, int | float))


# --- accepted and ignored -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (("--no-double-quant",), "no_double_quant"),
        (("--method", "lora", "--no-double-quant"), "no_double_quant"),
        (("--lora-rank", "8"), "lora_rank"),
        (("--lora-targets", "q,v"), "lora_targets"),
        (("--method", "lora", "--lora-targets", ""), "lora_targets"),
        (("--precision", "fp32", "--no-master-weights"), "no_master_weights"),
        (("--zero", "3", "--zero3-granularity", "parameter"), "zero3_granularity"),
        (("--no-overlap-grad-reduce",), "no_overlap_grad_reduce"),
        (("--devices", "2", "--grad-accumulation", "autograd"), "grad_accumulation"),
        (("--no-goodput",), "no_goodput"),
        (("--device-mtbf", "1000"), "device_mtbf"),
    ],
)
def test_flags_that_would_change_nothing_are_refused(
    capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], field: str
) -> None:
    assert f"error: {field}:" in refused(capsys, *EST, *extra)


def test_the_same_flags_are_answered_where_they_apply(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (
        ("--method", "qlora", "--no-double-quant"),
        ("--method", "lora", "--lora-rank", "8", "--lora-targets", "q,v"),
        ("--recompute", "full", "--recompute-early-stop"),
        ("--devices", "2", "--zero", "1", "--no-overlap-grad-reduce"),
        ("--devices", "2", "--zero", "3", "--zero3-granularity", "parameter"),
        ("--devices", "2", "--global-batch", "8", "--grad-accumulation", "autograd"),
        ("--tokens", "1e9", "--no-goodput"),
        ("--tokens", "1e9", "--device-mtbf", "1000"),
    ):
        answered(capsys, *EST, *extra)


def test_a_lora_only_spec_setting_on_plain_lora_is_refused() -> None:
    with pytest.raises(RecipeError, match="QLoRA"):
        Recipe(method="lora", lora=LoRASpec(double_quant=False))
    Recipe(method="qlora", lora=LoRASpec(double_quant=False))


def test_an_uncalibrated_accelerator_says_which_stack_it_lacks() -> None:
    # MI355X (CDNA 4) has Megatron rows but no PyTorch row: its PyTorch κ is derived, and says so
    notes = {
        stack: trainplan.estimate("llama-3.2-1b", hardware="mi355x", stack=stack).time.notes
        for stack in ("megatron", "pytorch")
    }
    assert notes["megatron"] != notes["pytorch"]
    assert any("no pytorch calibration rows" in n for n in notes["pytorch"])
    # MI300X (CDNA 3) has its own PyTorch row (torchtitan): no such note
    fitted = trainplan.estimate("llama-3.2-1b", hardware="mi300x", stack="pytorch").time.notes
    assert not any("no pytorch calibration rows" in n for n in fitted)


# --- impossible numbers -------------------------------------------------------------------------
def test_lora_rank_above_an_adapted_matrix_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, *EST, "--method", "lora", "--lora-rank", "4096")
    assert "lora_rank" in line and "at most 512" in line  # k, v: 2048 in x 512 out
    d = answered(capsys, *EST, "--method", "lora", "--lora-rank", "512")
    assert d["model"]["trainable_params"] < d["model"]["params"]
    answered(capsys, *EST, "--method", "lora", "--lora-rank", "2048", "--lora-targets", "q,o")


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("attention", ["flash", "eager"])
def test_mfu_is_at_most_hfu_under_lora(method: str, attention: str) -> None:
    for model in ("llama-3.2-1b", "gpt2", "qwen1.5-moe-a2.7b"):
        e = trainplan.estimate(model, hardware="h100-sxm", method=method, attention=attention, seq_len=1024)
        assert 0 < e.throughput.mfu <= e.throughput.hfu < 1, (model, e.throughput)


def test_the_mfu_definition_names_the_lora_model_flops(capsys: pytest.CaptureFixture[str]) -> None:
    full = answered(capsys, *EST)["throughput"]["mfu_definition"]
    lora = answered(capsys, *EST, "--method", "qlora")["throughput"]["mfu_definition"]
    assert "6·N·T" in full and "N_adapter" not in full
    assert "4·N_base·T + 6·N_adapter·T" in lora and "qlora" in lora
    main([*EST, "--method", "lora"])
    assert "N_adapter" in capsys.readouterr().out


def test_a_sequence_past_a_learned_position_table_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "estimate", "gpt2", "--hardware", "h100-sxm", "--seq-len", "8192")
    assert "seq_len" in line and "1024" in line
    answered(capsys, "estimate", "gpt2", "--hardware", "h100-sxm", "--seq-len", "1024")
    answered(capsys, "estimate", "llama-3.2-1b", "--hardware", "h100-sxm", "--seq-len", "8192")  # rotary


@pytest.mark.parametrize("hardware", ["tpu-v5p", "trn2", "wse-3"])
def test_qlora_without_a_4bit_kernel_library_is_refused(hardware: str) -> None:
    with pytest.raises(TrainplanError) as info:
        trainplan.estimate("llama-3.2-1b", hardware=hardware, method="qlora", precision="fp16")
    assert info.value.field in ("method", "hardware")


@pytest.mark.parametrize("hardware", ["h100-sxm", "mi300x", "gaudi3"])
def test_qlora_with_a_bitsandbytes_backend_is_answered(hardware: str) -> None:
    assert trainplan.estimate("llama-3.2-1b", hardware=hardware, method="qlora").memory.per_device_bytes > 0


def test_a_weight_streaming_wafer_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "estimate", "llama-3.2-1b", "--hardware", "wse-3", "--precision", "fp16")
    assert "weight streaming" in line and "hardware" in line


def test_plan_and_compare_skip_refused_accelerators_with_the_reason() -> None:
    c = trainplan.compare(
        "llama-3.2-1b", hardware="h100-sxm,tpu-v5p,wse-3", method="qlora", max_devices=8, precision="fp16"
    ).to_dict()
    reasons = {r["hardware"]: r["reason"] for r in c["hardware"]}
    assert "4-bit" in reasons["tpu-v5p"] and "weight streaming" in reasons["wse-3"]
    assert reasons["h100-sxm"] is None


def test_sliding_window_and_soft_capping_are_stated_in_the_notes(tmp_path: Path) -> None:
    notes = trainplan.estimate("gemma-2-9b", hardware="h200", seq_len=8192).to_dict()["time"]["notes"]
    assert any("sliding-window attention (4096 keys)" in n for n in notes)
    assert any("soft-capping" in n for n in notes)
    short = trainplan.estimate("gemma-2-9b", hardware="h200", seq_len=4096).to_dict()["time"]["notes"]
    assert not any("sliding-window" in n for n in short)  # the window covers the whole sequence
    cfg = {
        **LLAMA_CONFIG,
        "model_type": "gemma2",
        "head_dim": 64,
        "sliding_window": 4096,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    }
    spec = from_hf_config(cfg, "g2", strict=False)
    assert any("soft-capping" in a for a in spec.approximations)
    assert (spec.attention_window, spec.global_every) == (4096, 2)  # modelled, not an approximation


def test_plan_rows_name_the_catalog_offering_not_the_user(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("plan", "llama-3.2-1b", "--hardware", "h100-sxm", "--tokens", "1e9", "--max-devices", "8")
    for row in answered(capsys, *argv)["plans"]:
        assert row["run"]["price_source"] != "user (--price)"
        catalog = trainplan.estimate("llama-3.2-1b", hardware="h100-sxm", tokens=1e9).run.price_source
        assert row["run"]["price_source"] == catalog
    for row in answered(capsys, *argv, "--price", "2")["plans"]:
        assert row["run"]["price_source"] == "user (--price)"


# --- typed errors instead of tracebacks ---------------------------------------------------------
def test_model_names_too_long_for_the_file_system(capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, "estimate", "x" * 300, "--hardware", "h100-sxm")
    refused(capsys, "estimate", "/tmp/" + "x" * 300 + ".json", "--hardware", "h100-sxm")
    with pytest.raises(ModelError):
        load_model("y" * 5000)


def test_export_output_that_cannot_be_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = ("export", "llama-3.2-1b", "--hardware", "h100-sxm", "--to", "deepspeed", "--output")
    assert "is a directory" in refused(capsys, *base, str(tmp_path))
    assert "does not exist" in refused(capsys, *base, str(tmp_path / "missing" / "ds.json"))
    if os.path.exists("/dev/full"):
        assert "disk is full" in refused(capsys, *base, "/dev/full")
    assert main([*base, str(tmp_path / "ds.json")]) == 0
    assert json.loads((tmp_path / "ds.json").read_text())


def test_deeply_nested_and_huge_integer_configs(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ModelError, match="nests"):
        load_hf_config(deep)
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(LLAMA_CONFIG)[:-1] + ', "rope_theta": ' + "9" * 5000 + "}")
    with pytest.raises(ModelError, match="integer"):
        load_hf_config(huge)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**LLAMA_CONFIG, "hidden_size": 10**100}))
    with pytest.raises(ModelError, match="limit"):
        load_hf_config(big)


@pytest.mark.parametrize("key", ["num_attention_heads", "num_key_value_heads", "hidden_size"])
def test_zero_heads_or_width_is_a_typed_error(key: str) -> None:
    with pytest.raises(ModelError):
        from_hf_config({**LLAMA_CONFIG, key: 0}, "zero")
    with pytest.raises(ModelError):
        from_hf_config(
            {**LLAMA_CONFIG, "model_type": "gpt2", "n_embd": 768, "n_head": 0}, "zero", strict=False
        )


def test_a_fifo_as_hardware_file_does_not_hang(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    fifo = tmp_path / "catalog.toml"
    os.mkfifo(fifo)
    code = f"from trainplan.hardware import load_hardware_file; load_hardware_file({str(fifo)!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "not a regular file" in result.stderr and "CatalogError" in result.stderr
    with pytest.raises(CatalogError, match="regular file"):
        load_hardware_file(tmp_path)


def test_absurd_layer_counts_are_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_CONFIG, "num_hidden_layers": 2**31}))
    start = time.perf_counter()
    with pytest.raises(ModelError, match=f"{MAX_LAYERS:,}"):
        load_hf_config(path)
    spec = load_model("llama-3.2-1b")
    for bad in (2**31, MAX_LAYERS + 1, 0, -1, 1.5, math.inf, True):
        with pytest.raises(ModelError):
            replace(spec, num_layers=bad)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "extra",
    [
        ("--micro-batch", str(10**20)),
        ("--global-batch", str(10**23)),
        ("--devices", str(10**23)),
        ("--seq-len", str(10**23)),
        ("--seq-len", str(MAX_SEQ_LEN * 2)),
        ("--devices", str(MAX_DEVICES * 2)),
        ("--tokens", "1e30"),
        ("--virtual-stages", str(10**9)),
    ],
)
def test_overflowing_sizes_are_refused(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]) -> None:
    assert "limit" in refused(capsys, *EST, *extra)


@pytest.mark.parametrize(("flag", "field"), [("--devices", "devices"), ("--max-devices", "max_devices")])
def test_overflowing_plan_device_counts_are_refused(
    capsys: pytest.CaptureFixture[str], flag: str, field: str
) -> None:
    line = refused(capsys, "plan", "llama-3.2-1b", "--hardware", "h100-sxm", flag, str(10**17))
    assert f"error: {field}:" in line and "limit" in line


def test_non_string_names_are_typed_errors() -> None:
    with pytest.raises(ModelError):
        load_model(2)  # type: ignore[arg-type]
    with pytest.raises(CatalogError):
        get_accelerator(2)  # type: ignore[arg-type]
    with pytest.raises(TrainplanError):
        trainplan.estimate("gpt2", hardware=2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["num_experts", "top_k", "expert_ffn_hidden", "layer_freq", "num_shared_experts"]
)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 2.0, 2**40, True])
def test_infinite_or_non_integer_moe_fields_are_typed_errors(field: str, value: object) -> None:
    with pytest.raises(ModelError, match=field):
        MoESpec(**{"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 1024, field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw",
    [
        {"seq_len": 2.0},
        {"micro_batch": True},
        {"tokens": math.inf},
        {"tokens": 0.5},
        {"dropout": math.nan},
        {"master_weights": 1},
    ],
)
def test_recipe_fields_are_checked_in_the_constructor(kw: dict[str, object]) -> None:
    with pytest.raises(RecipeError):
        Recipe(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw", [{"dp": 2**21}, {"tp": 1.0}, {"zero": True}, {"sequence_parallel": 1, "tp": 2}]
)
def test_layout_fields_are_checked_in_the_constructor(kw: dict[str, object]) -> None:
    with pytest.raises(TrainplanError):
        Layout(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_command_prints_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A help text with a percent sign made argparse's --help raise ValueError."""
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra", [("--years", "1e308"), ("--node-price", "1e308"), ("--pue", "100"), ("--devices", str(10**20))]
)
def test_buy_or_rent_bounds_its_inputs(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]) -> None:
    refused(capsys, "cost", "h100-sxm", *extra)


# --- refused since a review of the CLI: each was accepted and silently ignored, or contradicted ---
PLAN = ("plan", "llama-3.2-1b", "--hardware", "h100-sxm,mi300x")


def test_grpo_group_size_without_global_batch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --global-batch the step is one micro-batch per rank: the group size changed nothing."""
    grpo = (*EST, "--devices", "8", "--zero", "3", "--method", "grpo")
    assert "--global-batch" in refused(capsys, *grpo, "--group-size", "16")
    small, large = (answered(capsys, *grpo, "--group-size", g, "--global-batch", "8") for g in ("2", "16"))
    assert large["time"]["step_s"] > small["time"]["step_s"]


@pytest.mark.parametrize("objective", ["cost", "balanced"])
def test_a_cost_objective_needs_tokens(capsys: pytest.CaptureFixture[str], objective: str) -> None:
    assert "--tokens" in refused(capsys, *PLAN, "--devices", "8", "--objective", objective)


def test_devices_above_max_devices_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, *PLAN, "--tokens", "1e9", "--devices", "16", "--max-devices", "8")
    assert "--max-devices" in line
    assert "--max-devices" in refused(capsys, *PLAN, "--tokens", "1e9", "--devices", "1000000")


def test_device_price_names_a_searched_accelerator(capsys: pytest.CaptureFixture[str]) -> None:
    for item in ("nosuch=3", "b200=3"):
        assert "not among the accelerators searched" in refused(
            capsys, *PLAN, "--tokens", "1e9", "--devices", "8", "--device-price", item
        )
    got = answered(capsys, *PLAN, "--tokens", "1e9", "--devices", "8", "--device-price", "h100=0.5")
    assert any(p["hardware"] == "h100-sxm" and p["usd_per_device_hour"] == 0.5 for p in got["plans"])


@pytest.mark.parametrize("flag", [("--provider", "AWS"), ("--price-kind", "spot"), ("--max-price-age", "1")])
def test_price_with_catalog_filters_is_refused(
    capsys: pytest.CaptureFixture[str], flag: tuple[str, str]
) -> None:
    assert flag[0] in refused(capsys, *EST, "--devices", "8", "--price", "5", *flag)


def test_an_alias_beside_its_name_is_one_accelerator(capsys: pytest.CaptureFixture[str]) -> None:
    got = answered(
        capsys, "compare", "llama-3.2-1b", "--method", "lora", "--hardware", "h100-sxm,h100", "--devices", "8"
    )
    assert [r["hardware"] for r in got["hardware"]].count("h100-sxm") == 1


def test_the_memory_band_verdict_reads_the_margin(capsys: pytest.CaptureFixture[str]) -> None:
    got = answered(capsys, *EST, "--devices", "1", "--global-batch", "64", "--memory-margin", "0.9")
    assert got["memory"]["fits"] is False and got["memory"]["fit_verdict"] != "fits"


def test_unknown_dataset_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "unknown dataset 'nosuch'" in refused(capsys, "validate", "--dataset", "nosuch")


def test_recompute_every_beyond_the_stage_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, *EST, "--devices", "1", "--recompute", "full", "--recompute-every", "1000")
    assert "--recompute-every 16 or less" in line  # llama-3.2-1b: 16 blocks


def test_early_stop_without_a_recomputed_forward_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for mode in ("none", "selective"):
        assert "--recompute-early-stop" in refused(
            capsys, *EST, "--devices", "1", "--recompute", mode, "--recompute-early-stop"
        )


def test_no_export_for_accelerators_the_targets_do_not_run_on(capsys: pytest.CaptureFixture[str]) -> None:
    for hw in ("tpu-v5p", "trn2"):
        for target in ("megatron", "torchtitan", "deepspeed", "accelerate"):
            line = refused(
                capsys,
                "export",
                "llama-3.2-1b",
                "--hardware",
                hw,
                "--devices",
                "16",
                "--zero",
                "3",
                "--to",
                target,
            )
            assert "would not run there" in line


def test_the_neuron_stack_only_on_trainium(capsys: pytest.CaptureFixture[str]) -> None:
    assert "Trainium" in refused(capsys, *EST, "--devices", "8", "--stack", "neuron")


def test_a_plot_name_is_checked_before_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, *EST, "--devices", "1", "--plot", "x.txt")
    assert ".png or .svg" in line


def test_the_export_error_names_the_flag_that_exists(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(
        capsys,
        "export",
        "llama-3.2-1b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--zero",
        "1",
        "--to",
        "megatron",
        "--no-master-weights",
    )
    assert "without --no-master-weights" in line


def test_host_memory_with_a_system_is_refused() -> None:
    from trainplan.hardware.system import System

    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    with pytest.raises(TrainplanError, match="host_memory"):
        trainplan.estimate("llama-3.2-1b", hardware=system, host_memory=1, zero=3, offload="optimizer")


def test_switching_off_an_overlap_that_cannot_apply_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--no-pp-comm-overlap" in refused(capsys, *EST, "--devices", "1", "--no-pp-comm-overlap")
    assert "--no-tp-comm-overlap" in refused(
        capsys, *EST, "--devices", "2", "--tp", "2", "--no-tp-comm-overlap"
    )
    answered(capsys, *EST, "--devices", "2", "--tp", "2", "--sequence-parallel", "--no-tp-comm-overlap")
