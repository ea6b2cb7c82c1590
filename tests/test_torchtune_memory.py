"""torchtune README peak-memory rows: error per row, each row within 15% or explained in the docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainplan.validate import memory_rows
from trainplan.validate.torchtune_memory import (
    DATASET,
    ERROR_BOUND,
    EXPLAINED,
    RUNS,
    RowComparison,
    comparisons,
    markdown_explained,
    markdown_table,
    text_table,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "memory.md"
ITEMS = comparisons()
BY_NAME = {c.row.name: c for c in ITEMS}


def test_every_target_row_has_a_config() -> None:
    targets = {r.name for r in memory_rows(DATASET) if r.is_target}
    assert targets == {run.row for run in RUNS}


def test_print_per_row_table() -> None:
    table = text_table(ITEMS)
    print("\n" + table)
    assert len(table.splitlines()) == len(ITEMS) + 1


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_row_within_bound_or_explained(name: str) -> None:
    c: RowComparison = BY_NAME[name]
    assert c.predicted_bytes > 0
    if name in EXPLAINED:
        # An explanation is for a row that needs one: a row back within the bound drops it.
        assert abs(c.error) > ERROR_BOUND, f"{name} is within {ERROR_BOUND:.0%}; remove it from EXPLAINED"
    else:
        assert abs(c.error) <= ERROR_BOUND, f"{name}: error {c.error:+.1%} and no explanation"


def test_explanations_and_table_are_in_the_docs() -> None:
    docs = " ".join(DOCS.read_text(encoding="utf-8").split())
    for name, why in EXPLAINED.items():
        assert " ".join(why.split()) in docs, f"docs/memory.md lacks the explanation of {name}"
    assert markdown_table(ITEMS) in DOCS.read_text(encoding="utf-8"), "regenerate the docs table"
    assert markdown_explained(ITEMS) in DOCS.read_text(encoding="utf-8"), "regenerate the docs list"


def test_published_units_are_kept() -> None:
    units = {c.row.name[:12]: c.row.unit for c in ITEMS}
    assert units["torchtune-00"] == "GiB" and units["torchtune-08"] == "GB"
