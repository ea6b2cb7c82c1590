"""trainplan choose: fastest, cheapest to rent and best to buy across families, with bands."""

from __future__ import annotations

import json

import pytest

from trainplan.cli import main

ARGS = [
    "choose",
    "llama-3.1-8b",
    "--method",
    "full",
    "--tokens",
    "1e10",
    "--max-devices",
    "16",
    "--hardware",
    "h100-sxm,mi300x,b200,a100-80gb,trn1,trn2,gaudi3",
]


def _choose(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main([*ARGS, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fastest_and_cheapest_are_the_extremes(capsys: pytest.CaptureFixture[str]) -> None:
    d = _choose(capsys)
    opts = d["options"]
    assert isinstance(opts, list) and len(opts) >= 4
    fastest = min(opts, key=lambda o: o["time_s"])
    cheapest = min((o for o in opts if o["cost_usd"] is not None), key=lambda o: o["cost_usd"])
    assert d["fastest"] == fastest["label"] and d["cheapest"] == cheapest["label"]
    buy = [o for o in opts if o["owned_cost_usd"] is not None]
    assert d["to_buy"] == min(buy, key=lambda o: o["owned_cost_usd"])["label"]
    for o in opts:
        low, high = o["time_s_band"]
        assert low <= o["time_s"] <= high
        assert o["plan"]["run"]["time_s"] == pytest.approx(o["time_s"])  # the estimate's own number


def test_uncalibrated_families_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    d = _choose(capsys)
    by_hw = {o["hardware"]: o for o in d["options"]}
    # gaudi3: a fitted κ (from Gaudi 2 runs), but fewer validation rows than a band needs
    assert by_hw["gaudi3"]["calibrated"] is False and by_hw["h100-sxm"]["calibrated"] is True
    assert by_hw["mi300x"]["calibrated"] is True  # MLPerf Training v5.1 rows (mlperf51_llama2_70b_lora)
    assert "uncalibrated" in by_hw["gaudi3"]["facts"]
    # trn2: the Trainium band, measured on Trn1 only: calibrated, and the facts say on which part
    assert by_hw["trn2"]["calibrated"] is True and "none on trn2 (runs on trn1)" in by_hw["trn2"]["facts"]
    assert any("mixes calibrated and uncalibrated" in v for v in d["verdicts"])


def test_a_deadline_excludes_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    d = _choose(capsys, "--deadline", "2")
    for o in d["options"]:
        assert o["time_s"] <= 2 * 3600
    reasons = [e["reason"] for e in d["excluded"]]
    assert any("misses the deadline" in r for r in reasons)


def test_human_output_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    for word in (
        "fastest:",
        "cheapest to rent:",
        "to buy:",
        "dense peak",
        "HBM",
        "scale-up",
        "software",
        "price",
    ):
        assert word in out
    assert main(["choose", "llama-3.1-8b", "--method", "full", "--hardware", "h100-sxm"]) == 2
    assert "--tokens" in capsys.readouterr().err


def test_plan_rows_name_their_price_source() -> None:
    import trainplan

    result = trainplan.plan(
        "llama-2-7b",
        hardware="rtx-4090,h100-sxm",
        method="qlora",
        tokens=1e8,
        max_devices=8,
        device_price=["rtx-4090=0.40"],
        objective="cost",
        top=10,
    )
    sources = {p.estimate.system.accelerator.name: p.estimate.run.price_source for p in result.plans}
    assert sources.get("rtx-4090", "").startswith("user")
    assert "h100-sxm" not in sources or not (sources["h100-sxm"] or "").startswith("user")
    for p in result.plans:  # the catalog's offering is named with its date
        if p.estimate.system.accelerator.name == "h100-sxm":
            assert "(20" in (p.estimate.run.price_source or "")


def test_choose_describes_its_own_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The table holds each accelerator's fastest plan plus the cheapest picks: it says so, and does not
    repeat the cost planner's "one row per accelerator" note, which an extra cheapest row would contradict."""
    out = _choose(capsys)
    notes = out["notes"]
    assert isinstance(notes, list)
    assert not any(str(n).startswith("objective cost:") for n in notes)
    assert any(str(n).startswith("table: each accelerator's fastest plan") for n in notes)
