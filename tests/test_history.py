"""The model-changes section: stored baselines beside scores recomputed on every run."""

from __future__ import annotations

import pytest

from trainplan.validate.history import lines, load, render_text
from trainplan.validate.timing import DatasetResult, RowResult


def _known_datasets() -> set[str]:
    from trainplan.validate.hf_context import DATASET as HF_CONTEXT
    from trainplan.validate.report import MEMORY_DATASETS
    from trainplan.validate.rlhf import RLHF_DATASETS
    from trainplan.validate.timing import TIMING_DATASETS

    return {*TIMING_DATASETS, *MEMORY_DATASETS, HF_CONTEXT, *RLHF_DATASETS}


def test_every_change_names_known_datasets_and_a_baseline() -> None:
    baselines, changes = load()
    assert baselines and changes
    known = _known_datasets()
    commits = {b.commit for b in baselines}
    for change in changes:
        assert change.baseline in commits
        assert set(change.datasets) <= known, f"{change.name}: {set(change.datasets) - known}"
    for b in baselines:
        assert set(b.datasets) <= known


def _result(name: str, errors: list[float]) -> DatasetResult:
    rows = tuple(
        RowResult(
            name=f"r{i}",
            dataset=name,
            split="validate",
            metric="step_s",
            published=1.0,
            predicted=1.0 + e,
            error=e,
            assumptions=(),
        )
        for i, e in enumerate(errors)
    )
    return DatasetResult(name=name, bound=1.0, rows=rows)


def test_now_is_recomputed_from_the_results_not_stored() -> None:
    _, changes = load()
    change = next(c for c in changes if "megatron2021_table2" in c.datasets)
    first = {ln.dataset: ln for ln in lines(change, [_result("megatron2021_table2", [0.1, -0.3])])}
    line = first["megatron2021_table2"]
    assert line.now_mape == pytest.approx(0.2)
    assert line.now_bias == pytest.approx(-0.1)
    assert line.now_rows == 2
    assert "14.9%" in line.before  # what `trainplan validate` printed at the baseline commit
    other = {ln.dataset: ln for ln in lines(change, [_result("megatron2021_table2", [0.5])])}
    assert other["megatron2021_table2"].now_mape == pytest.approx(0.5)
    # a dataset absent from the run is shown without a score, never with a stored one
    assert first["megatron2021_table1"].now_mape is None
    assert any(
        "megatron2021_table2" in s and "20.0%" in s
        for s in render_text([_result("megatron2021_table2", [0.2])])
    )


def test_validation_report_carries_the_section() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "validation.md").read_text(encoding="utf-8")
    assert "## Model changes: before → now" in text
    _, changes = load()
    for change in changes:
        assert f"### {change.name}" in text
