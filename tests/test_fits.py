"""Published runs fit: every timing row is a one-sided memory observation (the run ran)."""

from __future__ import annotations

import pytest

from trainplan.validate.datasets import REGISTRY, timing_rows
from trainplan.validate.fits import FitRow, counts, fit_rows


@pytest.fixture(scope="module")
def rows() -> list[FitRow]:
    return fit_rows()


def test_every_target_timing_row_is_checked(rows: list[FitRow]) -> None:
    names = {r.name for r in rows}
    for name, info in REGISTRY.items():
        if info.kind != "timing":
            continue
        for row in timing_rows(name):
            if row.is_target and row.dataset == "megatron2021_table1":
                assert row.name in names
    assert len(rows) > 400


def test_the_model_refutes_a_published_run_only_where_the_row_documents_what_it_does_not_charge(
    rows: list[FitRow],
) -> None:
    """A run that ran fit its devices: where even the memory band's low end is over the capacity,
    the row must document the reason (activations offloaded to host memory, which trainplan does
    not charge), else the memory model is refuted by a published run."""
    by_name = {r.name: r for n in REGISTRY if REGISTRY[n].kind == "timing" for r in timing_rows(n)}
    refuted = [r for r in rows if r.verdict == "refuted"]
    for r in refuted:
        notes = by_name[r.name].notes.lower()
        assert "offload" in notes, (r.name, r.predicted_bytes / r.capacity_bytes)


def test_verdicts_follow_the_band(rows: list[FitRow]) -> None:
    for r in rows:
        assert r.low_bytes <= r.predicted_bytes
        v = r.verdict
        assert (v == "fits") == (r.predicted_bytes <= r.capacity_bytes)
        assert (v == "refuted") == (r.low_bytes > r.capacity_bytes)
    c = counts(rows)
    assert sum(sum(x.values()) for x in c.values()) == len(rows)
    # the datasets measured without host offload or partial checkpoints all fit
    for name in ("megatron2021_table1", "torchtitan_llama3", "torchtune_throughput", "neuron_trn1"):
        assert c[name]["fits"] == sum(c[name].values()), name
