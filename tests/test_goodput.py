"""Goodput: Daly's expected wall time, its optimum interval, and the run terms built on them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import trainplan
from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.goodput import (
    DEFAULT_DEVICE_MTBF_H,
    Reliability,
    checkpoint_bytes,
    daly_interval_s,
    expected_wall_s,
    goodput_terms,
    job_mtbf_s,
)
from trainplan.recipe import Recipe


def test_default_mtbf_reproduces_the_llama3_interruptions() -> None:
    # 419 unexpected interruptions in 54 days on 16,384 GPUs (Llama 3, Sec. 3.3.4)
    assert 54 * 86400 / job_mtbf_s(DEFAULT_DEVICE_MTBF_H, 16384) == pytest.approx(419)


@pytest.mark.parametrize("write_s, mtbf_s", [(3.0, 1e4), (60.0, 3600.0 * 3), (600.0, 3600.0 * 50)])
def test_daly_interval_minimises_the_expected_wall_time(write_s: float, mtbf_s: float) -> None:
    taus = np.geomspace(write_s / 10, mtbf_s * 2, 20001)
    walls = expected_wall_s(1e6, write_s, taus, 600.0, mtbf_s)
    best = float(taus[int(np.argmin(walls))])
    tau = daly_interval_s(write_s, mtbf_s)
    assert tau == pytest.approx(best, rel=0.02)
    # Young's first-order interval is its leading term
    assert tau == pytest.approx(math.sqrt(2 * write_s * mtbf_s), rel=0.25)


def test_no_failures_leaves_the_steps_and_the_checkpoints() -> None:
    wall = expected_wall_s(1e5, 10.0, 1e3, 600.0, 1e15)
    assert wall == pytest.approx(1e5 * (1 + 10.0 / 1e3), rel=1e-6)


def test_terms_add_up_and_arrays_equal_scalars() -> None:
    rel = Reliability()
    devices = np.array([8, 512, 16384])
    compute = np.array([3600.0, 86400.0, 86400.0 * 60])
    ckpt = np.array([1e11, 1e12, 6.5e12])
    arr = goodput_terms(compute, devices, ckpt, rel)
    for i in range(3):
        one = goodput_terms(float(compute[i]), int(devices[i]), float(ckpt[i]), rel)
        assert float(one.wall_s) == pytest.approx(float(arr.wall_s[i]), rel=1e-12)
        assert float(one.wall_s) == pytest.approx(float(one.compute_s + one.checkpoint_s + one.lost_s))
        assert float(one.interruptions) == pytest.approx(float(one.wall_s / one.job_mtbf_s))
    fraction = arr.compute_s / arr.wall_s
    assert fraction[0] > fraction[1] > fraction[2] > 0.85  # more devices, more interruptions


def test_checkpoint_holds_weights_optimizer_and_master() -> None:
    # mixed-precision AdamW: bf16 weight 2 + two FP32 moments 8 + FP32 master 4 = 14 bytes per parameter
    assert checkpoint_bytes(1e9, Recipe()) == pytest.approx(14e9)
    assert checkpoint_bytes(1e9, Recipe(optimizer="sgd", master_weights=False)) == pytest.approx(2e9)


def test_estimate_names_the_terms_and_no_goodput_drops_them() -> None:
    kw = dict(hardware="h100-sxm", devices=8, zero=3, method="full", global_batch=64, tokens=1e10)
    est = trainplan.estimate("llama-3.1-8b", **kw)
    run = est.to_dict()["run"]
    g = run["goodput"]
    assert run["time_s"] == pytest.approx(g["compute_s"] + g["checkpoint_s"] + g["lost_s"])
    assert run["compute_time_s"] == pytest.approx(1e10 / est.throughput.tokens_per_s)
    bare = trainplan.estimate("llama-3.1-8b", no_goodput=True, **kw)
    assert (
        bare.run.time_s == pytest.approx(run["compute_time_s"]) and bare.to_dict()["run"]["goodput"] is None
    )
    # a shorter MTBF costs time; a fixed interval is used as given
    flaky = trainplan.estimate("llama-3.1-8b", device_mtbf=10.0, **kw)
    assert flaky.run.time_s > est.run.time_s
    fixed = trainplan.estimate("llama-3.1-8b", checkpoint_interval=30.0, **kw)
    assert fixed.run.goodput is not None and float(fixed.run.goodput.checkpoint_interval_s) == 1800.0


def test_goodput_flags_with_no_goodput_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "llama-3.1-8b", "--hardware", "h100-sxm", "--tokens", "1e9", "--no-goodput"]
    assert main([*argv, "--restart-time", "5"]) == 2
    assert "no effect with --no-goodput" in capsys.readouterr().err
    with pytest.raises(TrainplanError):
        Reliability(device_mtbf_h=0.0)
    with pytest.raises(TrainplanError):
        Reliability(restart_s=-1.0)


def test_planner_charges_the_same_goodput() -> None:
    kw = dict(hardware="h100-sxm", method="full", tokens=1e10, max_devices=64, seq_len=2048, global_batch=64)
    result = trainplan.plan("llama-3.1-8b", **kw)
    best = result.plans[0].estimate
    assert best.run.goodput is not None and best.run.time_s > best.run.compute_time_s
    bare = trainplan.plan("llama-3.1-8b", no_goodput=True, **kw).plans[0].estimate
    assert bare.run.goodput is None and bare.run.time_s < best.run.time_s


def test_llama3_405b_gpu_hours_are_bracketed_by_its_documented_layouts() -> None:
    """Meta's 30.84M H100-hours for Llama 3.1 405B on 15.6T tokens (model card; arXiv:2407.21783)
    against the paper's stages (docs/goodput.md): the 8K-context tokens on the 8K- or the 16K-GPU
    layout of Table 4, and the long-context stage's ~800B tokens (Sec. 3.4.2) on its 131k-token
    CP16 layout."""
    import dataclasses

    from trainplan.predict import estimate
    from trainplan.validate.datasets import timing_rows
    from trainplan.validate.timing import row_inputs

    long_tokens = 0.8e12
    per_token: dict[str, float] = {}
    for row in timing_rows("llama3_paper_table4"):
        system, model, recipe, layout, _ = row_inputs(row)
        e = estimate(system, model, dataclasses.replace(recipe, tokens=15.6e12), layout)
        assert (
            e.run.goodput is not None and 0.9 < float(e.run.goodput.compute_s / e.run.goodput.wall_s) < 0.97
        )
        per_token[row.name] = e.run.device_hours / 15.6e12
    long = per_token.pop("llama3paper-405b-16384gpu-cp16-s131072") * long_tokens
    hours = [h * (15.6e12 - long_tokens) + long for h in per_token.values()]
    assert len(hours) == 2
    assert min(hours) < 30.84e6 < max(hours)
    assert all(abs(h / 30.84e6 - 1) < 0.1 for h in hours)
