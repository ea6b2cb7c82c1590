"""Prediction bands: generated table, held-out coverage, uncalibrated label on every surface."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from trainplan import api
from trainplan.bands import (
    ALPHA,
    Band,
    ClassKey,
    band_table,
    conformal_interval,
    fit_verdict,
    log_band,
    normal_interval,
    t_quantile,
)
from trainplan.cli import main
from trainplan.validate import bands as vbands

UNCALIBRATED = ("gaudi2", "gaudi3")
"""No κ (MI250X's CDNA 2), or a κ with fewer validation rows than a band needs (Gaudi 2, Gaudi 3)."""


@pytest.fixture(scope="module")
def residuals() -> list[vbands.Residual]:
    return vbands.residuals()


def test_committed_band_table_equals_the_regenerated_one(residuals: list[vbands.Residual]) -> None:
    committed = vbands.bands_path().read_text(encoding="utf-8")
    assert vbands.derive(residuals).to_json() == committed, "run `trainplan validate --bands`"


def test_held_out_coverage_is_at_least_the_printed_level(residuals: list[vbands.Residual]) -> None:
    cov = vbands.held_out_coverage(residuals)
    for q in ("step_s", "memory_bytes"):
        rows = sum(c.rows for c in cov if c.quantity == q)
        assert rows >= 20, q
        detail = (q, [(c.dataset, c.inside, c.rows) for c in cov])
        assert vbands.total_coverage(cov, q) >= 1.0 - ALPHA, detail
        assert vbands.dataset_mean_coverage(cov, q) >= 1.0 - ALPHA, detail


def test_bands_use_validation_rows_only(residuals: list[vbands.Residual]) -> None:
    from trainplan.validate.datasets import REGISTRY, timing_rows

    calibrate = {
        r.name
        for n, d in REGISTRY.items()
        if d.kind == "timing"
        for r in timing_rows(n)
        if r.split == "calibrate"
    }
    assert not calibrate & {r.name for r in residuals}
    assert not any(r.dataset == "zero2020_table1" for r in residuals)


def test_t_quantile_matches_tables() -> None:
    # Student-t 0.95 quantiles (Abramowitz & Stegun Table 26.10): df 4 → 2.132, 10 → 1.812, 30 → 1.697
    for df, want in ((4, 2.132), (10, 1.812), (30, 1.697)):
        assert t_quantile(0.95, df) == pytest.approx(want, abs=0.01)


def test_conformal_needs_enough_rows_and_then_uses_order_statistics() -> None:
    assert conformal_interval([0.1] * 5) == (-math.inf, math.inf)
    r = [i / 100 for i in range(39)]  # n = 39: ranks 2 and 38
    assert conformal_interval(r) == (0.01, 0.37)


def test_band_grows_with_the_spread_between_datasets() -> None:
    same = [0.0, 0.05, -0.05, 0.02, -0.02, 0.01] * 2
    lo1, hi1 = log_band(same, ["a"] * 12)
    lo2, hi2 = log_band(same, ["a"] * 6 + ["b"] * 6)
    shifted = [x + (0.2 if i >= 6 else 0.0) for i, x in enumerate(same)]
    lo3, hi3 = log_band(shifted, ["a"] * 6 + ["b"] * 6)
    assert (lo1, hi1) == (lo2, hi2)  # same means: no shift
    assert hi3 - lo3 > hi1 - lo1 + 0.2
    assert normal_interval(same)[0] >= lo1


def test_every_uncalibrated_band_is_wider_than_every_calibrated_one() -> None:
    t = band_table()
    for q, (lo, hi) in t.uncalibrated.items():
        for c in t.classes:
            if c.quantity == q:
                assert lo < c.low and hi > c.high, (q, c.name)


def test_fallback_order_pools_axes_then_gives_up() -> None:
    key = ClassKey(family="nvidia", stack="pytorch", method="lora", parallelism="model")
    names = [k.name for k in key.fallbacks()]
    assert names == [
        "nvidia/pytorch/lora/model",
        "nvidia/pytorch/lora/*",
        "nvidia/*/lora/*",
        "nvidia/pytorch/*/*",
        "nvidia/*/*/*",
    ]
    dense = ClassKey(family="nvidia", stack="pytorch", method="lora", parallelism="model", arch="dense")
    # the architecture's own chain first, then the same chain pooled over architectures
    assert [k.name for k in dense.fallbacks()] == [*(f"{n}/dense" for n in names), *names]
    moe = ClassKey(family="nvidia", stack="pytorch", method="lora", parallelism="model", arch="moe")
    # an MoE estimate never borrows dense rows
    assert [k.name for k in moe.fallbacks()] == [f"{n}/moe" for n in names]
    band = band_table().lookup("step_s", key, part="h100-sxm")
    assert band.calibrated and band.class_name in names[1:]
    none = band_table().lookup(
        "step_s", ClassKey(family="gaudi", stack="pytorch", method="lora", parallelism="data"), part="gaudi3"
    )
    assert not none.calibrated and none.rows == 0


def _est(hardware: str, **kw: Any) -> dict[str, Any]:
    return api.estimate("llama-3.1-8b", hardware=hardware, devices=8, zero=3, stack="pytorch", **kw).to_dict()


def test_h100_band_is_calibrated_and_narrower_than_uncalibrated() -> None:
    h = _est("h100-sxm", tokens=1e9, price=2.0)
    cal = h["calibration"]
    assert (
        cal["calibrated"] and cal["rows"] >= 100 and cal["class"] == "nvidia/pytorch/pre-train/zero-3/dense"
    )
    lo, hi = h["time"]["step_s_band"]
    assert lo < h["time"]["step_s"] < hi
    tl, th = h["throughput"]["tokens_per_s_band"]
    tokens_per_step = h["throughput"]["tokens_per_s"] * h["time"]["step_s"]
    assert tl == pytest.approx(tokens_per_step / hi) and th == pytest.approx(tokens_per_step / lo)
    ml, mh = h["memory"]["per_device_bytes_band"]
    assert ml < h["memory"]["per_device_bytes"] < mh
    assert h["run"]["cost_usd_band"][0] < h["run"]["cost_usd"] < h["run"]["cost_usd_band"][1]
    for name in UNCALIBRATED:
        u = _est(name)
        assert u["calibration"]["calibrated"] is False and u["calibration"]["rows"] == 0
        ul, uh = u["time"]["step_s_band"]
        assert (uh - ul) / u["time"]["step_s"] > (hi - lo) / h["time"]["step_s"]
        assert u["calibration"]["memory"]["calibrated"] is False


@pytest.mark.parametrize("hardware", UNCALIBRATED)
def test_estimate_text_says_uncalibrated(hardware: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "llama-3.1-8b", "--hardware", hardware, "--devices", "8", "--zero", "3"]) == 0
    out = capsys.readouterr().out
    step_line = next(
        line for line in out.splitlines() if line.strip().startswith("step ") and "busiest" not in line
    )
    assert "(uncalibrated: −" in step_line
    assert "tokens/s (uncalibrated:" in out
    total = next(line for line in out.splitlines() if line.strip().startswith("total"))
    assert "uncalibrated" in total


def test_estimate_text_names_the_class_and_rows(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "estimate",
        "llama-3.1-8b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--zero",
        "3",
        "--stack",
        "pytorch",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = (
        band_table()
        .lookup(
            "step_s",
            ClassKey(
                family="nvidia", stack="pytorch", method="pre-train", parallelism="zero-3", arch="dense"
            ),
            part="h100-sxm",
        )
        .rows
    )
    assert f"90% of {rows} validated nvidia/pytorch/pre-train/zero-3/dense runs" in out
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (
        d["calibration"]["rows"] == rows
        and "step_s_band" in d["time"]
        and d["memory"]["fit_verdict"] == "fits"
    )


def _band(low: float, high: float) -> Band:
    return Band(
        quantity="memory_bytes",
        class_name="x",
        family="x",
        rows=9,
        calibrated=True,
        low=low,
        high=high,
        part="x",
        parts=("x",),
    )


def test_fit_verdict_three_cases() -> None:
    b = _band(-0.2, 0.3)
    assert fit_verdict(70.0, 100.0, b) == "fits"  # 56 … 91
    assert fit_verdict(90.0, 100.0, b) == "fits only at the optimistic edge"  # 72 … 117, prediction fits
    assert fit_verdict(110.0, 100.0, b) == "fits only at the optimistic edge"  # 88 … 143, prediction does not
    assert fit_verdict(130.0, 100.0, b) == "does not fit"  # 104 … 169


def test_fit_verdict_agrees_with_the_boolean() -> None:
    seen: set[str] = set()
    for mb in (1, 4, 16, 64):
        d = api.estimate("llama-3.1-8b", hardware="h100-sxm", devices=8, zero=3, micro_batch=mb).to_dict()
        m = d["memory"]
        if m["fit_verdict"] == "fits":
            assert m["fits"] and m["per_device_bytes_band"][1] <= m["capacity_bytes"]
        elif m["fit_verdict"] == "does not fit":
            assert not m["fits"] and m["per_device_bytes_band"][0] > m["capacity_bytes"]
            seen.add("does not fit")
        else:
            lo, hi = m["per_device_bytes_band"]
            assert lo <= m["capacity_bytes"] < hi
        seen.add(m["fit_verdict"])
    assert len(seen) >= 2


def test_offload_over_the_host_memory_does_not_fit_whatever_the_device_band() -> None:
    est = api.estimate(
        "llama-3.1-405b",
        hardware="h100-sxm",
        devices=8,
        zero=3,
        offload="optimizer+params",
        method="full",
        seq_len=1024,
        global_batch=8,
        recompute="full",
    )
    assert est.memory.host_fits is False and est.memory.device_fits
    d = est.to_dict()["memory"]
    assert d["fit_verdict"] == "does not fit" and d["fits"] is False


def test_compare_labels_uncalibrated_and_says_so_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "llama-3.1-8b", "--hardware", "h100-sxm,gaudi2,gaudi3,trn2", "--devices", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for name in UNCALIBRATED:
        row = next(line for line in out.splitlines() if f"8×{name} " in line and "dp=" in line)
        assert "uncal −" in row
    assert "mixes calibrated accelerators (h100-sxm, trn2) with uncalibrated ones (gaudi2, gaudi3)" in out
    assert "trn2 has no validated run of its own" in out
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    by = {b["hardware"]: b["plan"] for b in d["hardware"]}
    assert by["h100-sxm"]["calibration"]["calibrated"]
    assert all(not by[n]["calibration"]["calibrated"] for n in UNCALIBRATED)
    assert any("mixes calibrated" in s for s in d["ranking"])


def test_plan_says_tie_within_error_when_bands_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "llama-3.1-8b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8,12,16",  # 1.5x apart: inside the time band of one another
        "--tokens",
        "1e10",
        "--price",
        "2",
    ]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    plans = sorted(d["plans"], key=lambda p: p["rank"])
    assert len(plans) >= 2
    for above, p in itertools.pairwise(plans):
        a, b = above["run"]["time_s_band"], p["run"]["time_s_band"]
        assert p["tie_within_error"] == (b[0] <= a[1] and a[0] <= b[1])
    assert any(p["tie_within_error"] for p in plans)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tie within error: their time bands overlap" in out
    assert "mixes calibrated" not in out


def test_plan_with_clearly_separated_options_is_not_a_tie() -> None:
    from trainplan.planner.search import mark_ties, objective_band

    d = api.plan("llama-3.1-8b", hardware="h100-sxm", devices="8,64", tokens=1e10, price=2.0)
    plans = d.plans
    ranked = mark_ties(plans, "time")
    for above, p in itertools.pairwise(ranked):
        a, b = objective_band(above.estimate, "time"), objective_band(p.estimate, "time")
        assert a is not None and b is not None
        if b[0] > a[1]:
            assert not p.tie_within_error


def test_web_estimate_json_carries_bands() -> None:
    from trainplan.web.api import estimate

    d = estimate({"model": "llama-3.1-8b", "hardware": "gaudi2", "devices": 8, "zero": 3})
    assert d["calibration"]["calibrated"] is False
    assert len(d["time"]["step_s_band"]) == 2 and len(d["memory"]["per_device_bytes_band"]) == 2


def test_web_page_shows_bands_and_the_label() -> None:
    static = Path(__file__).resolve().parents[1] / "src" / "trainplan" / "web" / "static"
    js = (static / "app.js").read_text(encoding="utf-8")
    html = (static / "index.html").read_text(encoding="utf-8")
    for el in (
        "step-band",
        "tokens-band",
        "mem-band",
        "fit-verdict",
        "calibration",
        "plan-ranking",
        "compare-ranking",
    ):
        assert f'id="{el}"' in html and f'"{el}"' in js
    assert "uncalibrated: ${span}" in js and "(uncalibrated)" in js


def _texts(fig: Any) -> str:
    out: list[str] = []
    for ax in fig.axes:
        out.append(ax.get_title(loc="left"))
        out += [t.get_text() for t in ax.get_yticklabels()]
        out += [t.get_text() for t in ax.texts]
        assert ax.containers, "each panel draws its band as error bars"
    return " | ".join(out)


def test_estimate_plot_shows_band_and_uncalibrated_label() -> None:
    pytest.importorskip("matplotlib")
    from trainplan.web import plots

    est = plots._payload(api.estimate("llama-3.1-8b", hardware="gaudi2", devices=8, zero=3))
    fig = plots._figure(9.0, 6.4)
    top, bottom = fig.subplots(2, 1)
    plots._memory_panel(top, est)
    plots._time_panel(bottom, est)
    text = _texts(fig)
    assert "Step time" in text and "(uncalibrated: −" in text
    assert "Memory per device" in text and est["memory"]["fit_verdict"] in text


def test_compare_and_plan_plots_tag_uncalibrated_rows() -> None:
    pytest.importorskip("matplotlib")
    from trainplan.web import plots

    fig = plots._compare_figure(api.compare("llama-3.1-8b", hardware="h100-sxm,gaudi3", devices=8))
    text = _texts(fig)
    assert "8×gaudi3 (uncalibrated)" in text and "8×h100-sxm (uncalibrated)" not in text
    # a plan plots priced rows only: gaudi3 has a catalog price and no band of its own family's runs;
    # trn2 has a price and the Trainium band, measured on Trn1 only
    fig = plots._plan_figure(
        api.plan("llama-3.1-8b", hardware="h100-sxm,gaudi3,trn2", devices="8", price=2.0)
    )
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "gaudi3 (uncalibrated)" in texts and "trn2 (no run on this part)" in texts
    assert "h100-sxm (" not in texts


def test_plan_mixing_calibrated_and_uncalibrated_says_so() -> None:
    result = api.plan("llama-3.1-8b", hardware="h100-sxm,gaudi3", devices="8", price=2.0, top=4)
    names = {p.estimate.system.accelerator.name for p in result.plans}
    assert names == {"h100-sxm", "gaudi3"}
    assert any(
        "mixes calibrated accelerators (h100-sxm) with uncalibrated ones (gaudi3)" in s
        for s in result.ranking
    )
    only = api.plan("llama-3.1-8b", hardware="h100-sxm", devices="8", price=2.0)
    assert not any("uncalibrated" in s for s in only.ranking)


@pytest.mark.parametrize(
    ("hardware", "measured"),
    [
        ("h100-sxm", True),
        ("tpu-v5p", True),
        ("tpu-v7", True),
        ("tpu-v4", False),
        ("trn1", True),
        ("trn2", False),
    ],
)
def test_band_says_whether_its_family_was_measured_on_this_part(
    hardware: str, measured: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The family's rows decide, not the chosen class's: H100 is measured under other classes
    of its family, TPU v4 under none (its band is the TPU family's error on v5e, v5p, v6e and TPU7x), Trn2
    under none (the Trainium band is measured on Trn1)."""
    argv = ["estimate", "llama-3.1-8b", "--hardware", hardware, "--devices", "8", "--zero", "3"]
    assert main([*argv, "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert cal["calibrated"] is True
    assert cal["on_part"] is measured and (hardware in cal["parts"]) is measured
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (f"no validated run on {hardware}" in out) is not measured
    assert (f"none on {hardware} (runs on " in out) is not measured


def test_plan_marks_a_part_without_runs_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "llama-3.1-8b", "--hardware", "tpu-v4,tpu-v5p", "--devices", "8", "--tokens", "1e10"]
    assert main([*argv, "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    by_part = {p["calibration"]["part"]: p["calibration"]["on_part"] for p in plans}
    assert by_part == {"tpu-v4": False, "tpu-v5p": True}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tpu-v4 has no validated run of its own (* in the band column)" in out
    assert "tpu-v5p has no validated run" not in out
    starred = [line for line in out.splitlines() if "tpu-v4" in line and "%*" in line]
    assert starred and not any("tpu-v5p" in line and "%*" in line for line in out.splitlines())


def test_dense_and_moe_bands_keep_their_own_rows() -> None:
    """A dense estimate's band holds no MoE row while dense rows suffice: TPU's MoE runs (the
    under-predicted Qwen3-235B pair among them) widen neither the dense TPU band nor its row
    count; an MoE estimate takes an MoE class or is uncalibrated."""
    from trainplan.validate.bands import timing_residuals

    rs = [r for r in timing_residuals() if r.key.family == "tpu"]
    moe = [r for r in rs if r.key.arch == "moe"]
    assert moe and all(r.key.arch in ("dense", "moe") for r in rs)
    dense = api.estimate("llama-3.1-8b", hardware="tpu-v5p", devices=64, zero=3, stack="maxtext")
    b = dense.step_band
    assert b.class_name.endswith("/dense")
    assert b.rows == sum(1 for r in rs if r.key.arch == "dense" and r.key.parallelism == "zero-3")
    # NVIDIA's Megatron MoE runs make a class of their own, and so do TPU's MoE runs (Qwen3,
    # Mixtral, DeepSeek-V3); an MoE estimate never takes a dense band. TPU's MoE rows all come from
    # one dataset, so their band envelopes the uncalibrated one (its width is not measured)
    m = api.estimate("qwen3-30b-a3b", hardware="h100-sxm", devices=16, ep=16, zero=1, global_batch=1024)
    assert m.step_band.calibrated and m.step_band.class_name.endswith("/moe")
    t = api.estimate("mixtral-8x7b", hardware="tpu-v5p", devices=64, zero=3, stack="maxtext")
    assert t.step_band.class_name.endswith("/moe") and t.step_band.rows == len(moe)
    unc_lo, unc_hi = band_table().uncalibrated["step_s"]
    assert t.step_band.low <= unc_lo and t.step_band.high >= unc_hi
    assert t.to_dict()["calibration"]["arch"] == "moe"
