"""One formula per term: the numeric layer, the term registry, and that the estimate and the
planner read the same terms."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from trainplan import num
from trainplan.comm import LinkLevel, collective_time_s, hierarchical_s, ranks_per_domain
from trainplan.terms import BY_KEY, TERM_GROUPS, TIME_TERMS, group_of
from trainplan.timing import TimeBreakdown

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "trainplan"


def test_num_layer_is_the_same_on_floats_and_arrays() -> None:
    a = np.array([1.0, 5.0, -2.0])
    b = np.array([3.0, 2.0, -2.0])
    for i in range(3):
        assert num.maximum(float(a[i]), float(b[i])) == num.maximum(a, b)[i]
        assert num.minimum(float(a[i]), float(b[i])) == num.minimum(a, b)[i]
        assert num.where(bool(a[i] > b[i]), 1.0, 0.0) == num.where(a > b, 1.0, 0.0)[i]
    assert num.ceil_div(7, 2) == 4 and list(num.ceil_div(np.array([7, 8]), 2)) == [4, 4]
    assert num.logical_not(True) is False  # never ~True (== -2, truthy)
    assert list(num.logical_not(np.array([True, False]))) == [False, True]
    assert num.total([1.0, 2.0, 3.0]) == 6.0


def test_num_does_not_import_numpy() -> None:
    code = "import sys, trainplan.num, trainplan.comm, trainplan.timing; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"])
def test_collective_time_is_one_formula_for_one_and_many(kind: str) -> None:
    """The planner's array call and the estimate's scalar call of the same collective agree."""
    up = LinkLevel(bandwidth_bytes_per_s=450e9, latency_s=3e-6, efficiency=0.8)
    out = LinkLevel(bandwidth_bytes_per_s=50e9, latency_s=1e-5, efficiency=0.85)
    sizes = np.array([1, 2, 8, 16, 64, 64])
    strides = np.array([1, 1, 1, 1, 1, 8])
    local = ranks_per_domain(sizes, strides, 8)
    up_t = (450e9, 3e-6, 0.8)
    out_t = (50e9, 1e-5, 0.85)
    many = collective_time_s(kind, np.full(6, 1e9), sizes, local, up_t, out_t)  # type: ignore[arg-type]
    for i in range(6):
        n, n_l = int(sizes[i]), int(local[i])
        one = 0.0 if n == 1 else hierarchical_s(kind, 1e9, n, n_l, up, out)  # type: ignore[arg-type]
        assert many[i] == pytest.approx(one, rel=1e-12)


def test_registry_declares_every_term_once_with_a_source() -> None:
    keys = [t.key for t in TIME_TERMS]
    assert len(keys) == len(set(keys)) and len({t.label for t in TIME_TERMS}) == len(keys)
    assert all(t.source and t.group in TERM_GROUPS for t in TIME_TERMS)
    assert group_of("pipeline bubble") == "bubble" and group_of("offload_s") == "offload"
    with pytest.raises(KeyError):
        group_of("no such term")
    # the breakdown's fields are exactly the registry's terms (plus bookkeeping)
    fields = set(TimeBreakdown.__dataclass_fields__)
    assert set(BY_KEY) <= fields


def _defined_functions(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_the_planner_keeps_no_copy_of_the_step_time_or_collective_formulas() -> None:
    """bulk.py gathers and ranks: it calls comm / timing / cost for every term and defines none of
    them (the names below are the formulas it used to mirror)."""
    bulk = SRC / "planner" / "bulk.py"
    text = bulk.read_text(encoding="utf-8")
    defined = _defined_functions(bulk)
    for copy in ("_bus", "_steps", "_place", "_flat", "pipeline_bubble", "data_parallel"):
        assert copy not in defined, copy
    assert "class _Net" not in text
    for shared in (
        "step_terms(",
        "step_lower_bound_s(",
        "step_traffic(",
        "collective_time_s(",
        "run_totals(",
    ):
        assert shared in text, shared


def test_no_term_is_grouped_by_its_label() -> None:
    """The web page, the plots and the planner read a term's group from the registry, never by
    matching its label (a renamed label would silently move a term to another group)."""
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert 'startswith("compute' not in text and 'startswith("offload' not in text, path
