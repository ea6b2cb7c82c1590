"""The planner on rack-sized questions: NVL72 device counts, a global batch dp does not divide,
headroom (``--memory-margin``), simpler plans on ties, and explanations that say "dominated"."""

from __future__ import annotations

import json
from typing import Any

import pytest

import trainplan
from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.layout import nearest_micro_batches
from trainplan.memory import usable_bytes
from trainplan.planner.search import device_ladder


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_405b_pretraining_on_one_gb200_nvl72(capsys: pytest.CaptureFixture[str]) -> None:
    """ "Does Llama-3.1-405B full pre-training fit on one GB200 NVL72?" — one command, a layout."""
    out = _json(
        capsys, "plan", "llama-3.1-405b", "--hardware", "gb200", "--devices", "72", "--tokens", "1e12"
    )
    best = out["plans"][0]
    assert best["devices"] == 72 and best["feasible"]
    layout = best["layout"]
    assert layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"] == 72
    # 1024 sequences do not split over dp = 72 / (tp·pp·cp): the plan trains the nearest multiple, and says so
    per_step = layout["dp"] * best["recipe"]["micro_batch"]
    assert best["recipe"]["global_batch"] % per_step == 0
    assert abs(best["recipe"]["global_batch"] - out["global_batch"]) <= per_step / 2
    if best["recipe"]["global_batch"] != out["global_batch"]:
        assert any("nearest multiple" in n and str(best["recipe"]["global_batch"]) in n for n in out["notes"])


def test_max_devices_144_keeps_the_racks(capsys: pytest.CaptureFixture[str]) -> None:
    gb200 = trainplan.hardware.get_accelerator("gb200")
    assert {72, 144} <= set(device_ladder(gb200, 144))
    out = _json(
        capsys,
        "plan",
        "llama-3.1-405b",
        "--hardware",
        "gb200",
        "--max-devices",
        "144",
        "--tokens",
        "1e12",
        "--top",
        "10",
    )
    assert {72, 144} <= {p["devices"] for p in out["plans"]}


def test_nearest_micro_batches_rounds_to_the_nearest_multiple() -> None:
    assert nearest_micro_batches(1024, 72) == 14  # 1008 (1080 is 56 away, 1008 is 16)
    assert nearest_micro_batches(1024, 18) == 57  # 1026
    assert nearest_micro_batches(1024, 64) == 16  # divides: unchanged
    assert nearest_micro_batches(10, 64) == 1  # at least one micro-batch
    assert nearest_micro_batches(96, 64) == 2  # a half rounds up


def test_memory_margin_is_one_definition(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["llama-3.1-8b", "--hardware", "h100-sxm", "--tokens", "1e9", "--max-devices", "16"]
    plain = _json(capsys, "plan", *args)
    margin = _json(capsys, "plan", *args, "--memory-margin", "0.3")
    for p in margin["plans"]:
        mem = p["memory"]
        assert mem["per_device_bytes"] <= usable_bytes(mem["capacity_bytes"], 0.3) == mem["usable_bytes"]
        assert mem["memory_margin"] == 0.3
    fullest = max(p["memory"]["per_device_bytes"] / p["memory"]["capacity_bytes"] for p in plain["plans"])
    assert fullest > 0.7  # without headroom the planner fills memory further
    # the estimate of a ranked plan agrees: it fits with the margin, and not with a larger one
    best = margin["plans"][0]
    lay = best["layout"]
    flags = [
        "--devices", str(best["devices"]), "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--zero", str(lay["zero"]),
        "--micro-batch", str(best["recipe"]["micro_batch"]), "--recompute", best["recipe"]["recompute"],
        "--offload", best["recipe"]["offload"], "--global-batch", str(best["recipe"]["global_batch"]),
    ]  # fmt: skip
    if lay["sequence_parallel"]:
        flags.append("--sequence-parallel")
    est = _json(
        capsys, "estimate", "llama-3.1-8b", "--hardware", "h100-sxm", *flags, "--memory-margin", "0.3"
    )
    assert est["memory"]["fits"] and est["memory"]["per_device_bytes"] == best["memory"]["per_device_bytes"]
    tight = 1 - best["memory"]["per_device_bytes"] / best["memory"]["capacity_bytes"] + 0.01
    est = _json(
        capsys, "estimate", "llama-3.1-8b", "--hardware", "h100-sxm", *flags, "--memory-margin", f"{tight}"
    )
    assert not est["memory"]["fits"] and "--memory-margin" in est["reasons"][0]
    with pytest.raises(TrainplanError, match="memory_margin"):
        trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", memory_margin=1.0)


def test_explanations_name_dominated_alternatives(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(
        capsys,
        "plan",
        "llama-3.1-8b",
        "--hardware",
        "h100-sxm,a100-80gb",
        "--tokens",
        "1e10",
        "--max-devices",
        "64",
    )
    lines = [a for p in out["plans"] for a in p["explanation"]["alternatives"]]
    assert lines
    assert not any("$0.00 more" in a for a in lines)
    assert any("dominated: " in a for a in lines)
    for a in lines:
        if "dominated: " in a:
            assert "× the time" in a and ("more (" in a or "the same cost" in a)


def test_ties_break_toward_the_simpler_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """A small model with room to spare: no offload, no ZeRO, no model parallelism."""
    out = _json(
        capsys,
        "plan",
        "gpt2",
        "--seq-len",
        "1024",  # GPT-2's learned position table has 1024 rows
        "--hardware",
        "h100-sxm",
        "--devices",
        "1",
        "--method",
        "full",
        "--tokens",
        "1e8",
    )
    best = out["plans"][0]
    assert best["recipe"]["offload"] == "none" and best["layout"]["zero"] == 0


def test_no_candidate_error_names_why() -> None:
    with pytest.raises(TrainplanError) as info:
        trainplan.plan("llama-3.1-8b", hardware="h100-sxm", precision="fp4", tokens=1e9)
    message = info.value.message
    assert message.startswith("no candidate layout: h100-sxm: supports none of the precisions searched")


def test_memory_margin_is_refused_where_it_is_not_applied() -> None:
    with pytest.raises(TrainplanError, match="memory_margin"):
        trainplan.estimate("llama-3.2-1b", hardware="h100-sxm", method="grpo", memory_margin=0.1)
