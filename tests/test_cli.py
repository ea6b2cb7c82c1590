"""The CLI, pinned to its flags, its JSON keys and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan.cli import main

DESIGN_KEYS = {
    "model": ("params", "trainable_params"),
    "memory": (
        "per_device_bytes",
        "capacity_bytes",
        "fits",
        "weights_bytes",
        "gradients_bytes",
        "optimizer_bytes",
        "activations_bytes",
    ),
    "time": ("step_s",),
    "throughput": ("tokens_per_s", "mfu"),
    "run": ("time_s", "device_hours", "cost_usd"),
}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_estimate_json_has_the_stable_keys(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys, "estimate", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"
    )
    for section, keys in DESIGN_KEYS.items():
        block = data[section]
        assert isinstance(block, dict)
        for key in keys:
            assert key in block, f"{section}.{key} missing"
    model = data["model"]
    assert isinstance(model, dict) and model["params"] == 6_738_415_616
    memory = data["memory"]
    assert isinstance(memory, dict) and memory["fits"] is True


def test_seven_b_full_finetune_does_not_fit_one_h100(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "estimate", "llama-2-7b", "--hardware", "h100-sxm", "--method", "full")
    memory = data["memory"]
    assert isinstance(memory, dict)
    assert memory["fits"] is False
    # 16 bytes per parameter of model states alone exceed the 80 GB card
    states = (
        float(memory["weights_bytes"]) + float(memory["gradients_bytes"]) + float(memory["optimizer_bytes"])
    )
    assert states == pytest.approx(16 * 6_738_415_616)
    reasons = data["reasons"]
    assert isinstance(reasons, list) and "optimizer states" in reasons[0]


def test_qlora_7b_fits_a_24gb_rtx_4090(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys,
        "estimate",
        "llama-2-7b",
        "--hardware",
        "rtx-4090",
        "--method",
        "qlora",
        "--seq-len",
        "2048",
        "--micro-batch",
        "1",
        "--recompute",
        "full",
    )
    memory = data["memory"]
    assert isinstance(memory, dict) and memory["fits"] is True
    assert float(memory["per_device_bytes"]) < 24e9


def smallest_fitting(offload: str) -> int:
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.predict import estimate
    from trainplan.recipe import Recipe

    model = load_model("llama-3.1-70b")
    recipe = Recipe(method="full", seq_len=2048, recompute="full", offload=offload)  # type: ignore[arg-type]
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        est = estimate(
            System(accelerator=get_accelerator("h100-sxm"), num_devices=n),
            model,
            recipe,
            Layout(dp=n, zero=3),
        )
        if est.memory.fits:
            return n
    raise AssertionError("no layout up to 128 devices fits")


def test_smallest_80gb_layout_for_70b_full_finetune() -> None:
    """ZeRO-3 over dp: 16 bytes × 70.6B = 1.13 TB of model states must be split until they fit."""
    without = smallest_fitting("none")
    with_offload = smallest_fitting("optimizer")
    assert without == 32  # 16 × 70.55e9 / 16 = 70.6 GB of states + step temporaries > 85.5 GB at 16
    # offloaded: 2-byte weight shards (70.6 GB at 2 devices, 35.3 GB at 4) + gathered units + activations
    assert with_offload == 4
    assert with_offload < without


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["estimate", "lama-2-7b", "--hardware", "h100-sxm"], "model"),
        (["estimate", "llama-2-7b", "--hardware", "h1000"], "hardware"),
        (["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "8", "--tp", "3"], "devices"),
        (["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "3", "--tp", "3"], "tp"),
        (["estimate", "llama-2-7b", "--hardware", "a100-80gb", "--precision", "fp8"], "precision"),
        (["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--ep", "2", "--devices", "2"], "ep"),
        (["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--sequence-parallel"], "sequence_parallel"),
        (
            ["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--global-batch", "3", "--devices", "2"],
            "global_batch",
        ),
        (["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--lora-rank", "8"], "lora_rank"),
        (["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--offload", "optimizer"], "offload"),
        (
            [
                "estimate",
                "llama-2-7b",
                "--hardware",
                "h100-sxm",
                "--devices",
                "8",
                "--zero3-granularity",
                "parameter",
            ],
            "zero3_granularity",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"trainplan: error: {field}:"), err


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "gpt2", "--hardware", "h100-sxm", "--seq-len", "0"],
        ["estimate", "gpt2", "--hardware", "h100-sxm", "--devices", "-1"],
        ["estimate", "gpt2"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_malformed_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert main(["estimate", str(bad), "--hardware", "h100-sxm"]) == 2
    assert "config" in capsys.readouterr().err.lower()


def test_human_output_has_a_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "gpt2", "--hardware", "rtx-4090", "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "weights" in out and "GB" in out


def test_hardware_and_models_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware", "list"]) == 0
    assert "h100-sxm" in capsys.readouterr().out
    assert main(["hardware", "show", "h200"]) == 0
    assert "source" in capsys.readouterr().out.lower()
    assert main(["models"]) == 0
    assert "llama-3.1-405b" in capsys.readouterr().out


def test_console_script_runs() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainplan.cli",
            "estimate",
            "gpt2",
            "--hardware",
            "h100-sxm",
            "--seq-len",
            "1024",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(result.stdout)["model"]["params"] == 124_439_808


def test_zero3_granularity_flag_reaches_the_layout_and_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "gpt-22b", "--hardware", "a100-80gb", "--devices", "256", "--zero", "3"]
    argv += ["--seq-len", "2048", "--recompute", "full", "--global-batch", "256"]
    block = run_json(capsys, *argv)
    per_param = run_json(capsys, *argv, "--zero3-granularity", "parameter")
    assert block["layout"]["zero3_granularity"] == "block"  # type: ignore[index]
    assert per_param["layout"]["zero3_granularity"] == "parameter"  # type: ignore[index]
    assert per_param["time"]["step_s"] > block["time"]["step_s"]  # type: ignore[index]


def test_recompute_early_stop_flag_lowers_hardware_flops_not_model_flops(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["estimate", "llama-3-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    argv += ["--seq-len", "4096", "--recompute", "full"]
    whole = run_json(capsys, *argv)
    early = run_json(capsys, *argv, "--recompute-early-stop")
    assert whole["recipe"]["recompute_early_stop"] is False  # type: ignore[index]
    assert early["recipe"]["recompute_early_stop"] is True  # type: ignore[index]
    w, e = whole["throughput"], early["throughput"]
    assert e["model_flops_per_step"] == w["model_flops_per_step"]  # type: ignore[index]
    # one down projection per layer and sequence: 2·s·h·f · L · 8 sequences
    skipped = 2 * 4096 * 4096 * 14336 * 32 * 8
    assert w["hardware_flops_per_step"] - e["hardware_flops_per_step"] == pytest.approx(skipped)  # type: ignore[index,operator]
    assert early["time"]["step_s"] < whole["time"]["step_s"]  # type: ignore[index,operator]


def test_recompute_sac_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """--recompute sac: torchtitan's per-op selective checkpointing; activations between full and
    none, the even matmuls (k, o, up) recomputed, model FLOPs unchanged."""
    argv = ["estimate", "llama-3-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    argv += ["--seq-len", "4096"]
    est = {rc: run_json(capsys, *argv, "--recompute", rc) for rc in ("none", "sac", "full")}
    assert est["sac"]["recipe"]["recompute"] == "sac"  # type: ignore[index]
    act = {rc: e["memory"]["activations_bytes"] for rc, e in est.items()}  # type: ignore[index]
    b, s, h, q, g, f, a, layers = 1, 4096, 4096, 4096, 1024, 14336, 32, 32
    per_layer = 2 * b * s * (2 * h + 2 * q + g + f) + 4 * b * a * s
    inputs = 8 * b * s + 2 * 2 * s * 128  # token ids, RoPE cos/sin
    assert act["sac"] == pytest.approx(layers * per_layer + inputs)
    assert act["full"] < act["sac"] < act["none"]
    flops = {rc: e["throughput"] for rc, e in est.items()}
    assert flops["sac"]["model_flops_per_step"] == flops["none"]["model_flops_per_step"]  # type: ignore[index]
    recomputed = 2 * s * h * (g + q + f) * layers * 8  # 8 sequences (dp = 8)
    extra = flops["sac"]["hardware_flops_per_step"] - flops["none"]["hardware_flops_per_step"]  # type: ignore[index,operator]
    assert extra == pytest.approx(recomputed)


def test_recompute_sac_where_not_modelled_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "llama-3-8b", "--hardware", "h100-sxm", "--devices", "8", "--recompute", "sac"]
    for extra, field in ((["--tp", "8"], "tp"), (["--method", "lora"], "recompute")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"trainplan: error: {field}:") and "\n" not in err, err
        assert "--recompute full or selective" in err


def test_grad_accumulation_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "64"]
    fused = run_json(capsys, *argv)
    auto = run_json(capsys, *argv, "--grad-accumulation", "autograd")
    assert auto["layout"]["grad_accumulation"] == "autograd"  # type: ignore[index]
    assert fused["time"]["grad_accum_s"] == 0.0  # type: ignore[index]
    assert auto["time"]["grad_accum_s"] > 0  # type: ignore[index]


def test_stack_flag_sets_the_calibrated_kappa(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "llama-3.1-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    mega = run_json(capsys, *argv)
    torch_stack = run_json(capsys, *argv, "--stack", "pytorch")
    assert mega["recipe"]["stack"] == "megatron"  # type: ignore[index]
    assert torch_stack["recipe"]["stack"] == "pytorch"  # type: ignore[index]
    assert torch_stack["time"]["kappa"] < mega["time"]["kappa"]  # type: ignore[index,operator]
    assert torch_stack["time"]["step_s"] > mega["time"]["step_s"]  # type: ignore[index,operator]
    assert (
        main(["plan", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-devices", "8", "--stack", "pytorch"])
        == 0
    )
