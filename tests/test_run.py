"""``trainplan run``: real distributed steps on CPU with gloo, beside the prediction.

The checks are that the measured steps happened — the run completes, every loss is finite and
the loss falls — not how long they took (CPU timings say nothing about the predicted GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed (pip install torch==2.13.0)")

from trainplan.run.cli import main, register  # noqa: E402

pytestmark = pytest.mark.torch

HW = "h100-sxm"
STEPS = 6
# 2 layers, hidden 64, 4 query / 2 key-value heads, vocab 256: a Llama in miniature.
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
COMMON = ["--hardware", HW, "--devices", "2", "--seq-len", "64", "--micro-batch", "2", "--device", "cpu"]


def _config(tmp_path: Path, name: str = "tiny-llama", **over: Any) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TINY, **over}), encoding="utf-8")
    return str(d / "config.json")


def _run(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainplan.run", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _assert_trained(losses: list[float]) -> None:
    assert len(losses) == STEPS
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], losses


@pytest.mark.slow
def test_fsdp_two_processes_gloo(tmp_path: Path) -> None:
    """ZeRO-3 = FSDP2 fully_shard over 2 gloo ranks, bf16 mixed precision: trains, JSON keys stable."""
    cfg = _config(tmp_path)
    proc = _run(cfg, *COMMON, "--zero", "3", "--steps", str(STEPS), "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = json.loads(proc.stdout)
    for key in ("step_s", "tokens_per_s", "peak_bytes", "losses"):
        assert key in out["measured"], key
    for key in ("step_s", "tokens_per_s", "peak_bytes"):
        assert key in out["predicted"], key
        assert out["predicted"][key] > 0
    assert out["config"]["layout"]["dp"] == 2 and out["config"]["layout"]["zero"] == 3
    assert out["config"]["devices"] == 2
    _assert_trained(out["measured"]["losses"])
    m = out["measured"]
    assert m["backend"] == "gloo" and m["peak_kind"] == "cpu_rss_high_water_mark"
    assert m["comparable_time"] is False and m["comparable_memory"] is False
    assert m["step_s"] > 0 and m["tokens_per_s"] > 0 and m["peak_bytes"] > 0
    assert m["tokens_per_step"] == 2 * 2 * 64
    assert len(m["step_times_s"]) == STEPS and len(m["peak_bytes_per_rank"]) == 2
    assert m["params"] == out["config"]["params"]  # the model that ran is the model that was estimated


@pytest.mark.slow
def test_tensor_parallel_sequence_parallel_gloo(tmp_path: Path) -> None:
    """tp=2 with sequence parallelism (DTensor on gloo) and full recompute; the human table."""
    cfg = _config(tmp_path)
    proc = _run(
        cfg, *COMMON, "--tp", "2", "--sequence-parallel", "--recompute", "full", "--steps", str(STEPS)
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    text = proc.stdout
    assert "measured (cpu/gloo)" in text and f"predicted ({HW})" in text
    for row in ("step time", "tokens/s", "peak memory (RSS)"):
        assert row in text
    assert "tp=2" in text and " sp" in text
    loss_line = next(line for line in text.splitlines() if line.startswith("loss:"))
    losses = [float(x) for x in loss_line.split("(")[0].split()[1:]]
    _assert_trained(losses)
    assert "(finite, falling)" in loss_line


@pytest.mark.slow
def test_per_op_selective_checkpointing_gloo(tmp_path: Path) -> None:
    """--recompute sac: FSDP2 blocks wrapped with torchtitan's per-op policy (trace.step.apply_sac)."""
    cfg = _config(tmp_path)
    proc = _run(cfg, *COMMON, "--zero", "3", "--recompute", "sac", "--steps", str(STEPS), "--json")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = json.loads(proc.stdout)
    _assert_trained(out["measured"]["losses"])
    assert out["predicted"]["peak_bytes"] > 0


@pytest.mark.parametrize(
    ("over", "flags", "field"),
    [
        ({"hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 3}, ["--tp", "2"], "tp"),
        ({}, ["--pp", "2"], "pp"),
        ({}, ["--precision", "fp8"], "precision"),
        ({}, ["--steps", "1"], "steps"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], over: dict[str, Any], flags: list[str], field: str
) -> None:
    cfg = _config(tmp_path, **over)
    assert main([cfg, *COMMON, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"trainplan: error: {field}"), err


def test_missing_torch_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # importlib.util.find_spec("torch") -> None
    assert main([_config(tmp_path), *COMMON]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install torch==2.13.0 -e '.[torch]'" in err


def test_register_on_a_fresh_parser() -> None:
    parser = argparse.ArgumentParser(prog="trainplan")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", "llama-3-8b", "--hardware", HW, "--devices", "4", "--zero", "3"])
    assert args.command == "run" and args.steps == 8 and args.device == "auto" and not args.json
    assert args.zero == 3 and args.devices == 4 and args.precision == "bf16"


def test_parser_does_not_import_torch() -> None:
    code = (
        "import sys; from trainplan.run.cli import build_parser; "
        "build_parser().format_help(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
