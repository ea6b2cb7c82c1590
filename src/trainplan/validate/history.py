"""Model changes, before → after: each change set beside the errors measured before it.

``data/history.toml`` holds what ``trainplan validate`` printed at named commits of this repository
(baselines: per dataset, the validation rows scored, MAPE and bias) and the model changes made
since, each with the datasets it was made for. The report puts each dataset's baseline MAPE beside
the same dataset scored now by the running code (:func:`trainplan.validate.report.run_all`), so
"after" is never a stored number: it is recomputed on every run, all later changes included.
"""

from __future__ import annotations

import statistics
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from trainplan.data_files import data_text
from trainplan.validate.timing import DatasetResult


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One dataset as ``trainplan validate`` printed it at a baseline commit."""

    rows: int
    mape_pct: float
    bias_pct: float


@dataclass(frozen=True, kw_only=True)
class Baseline:
    commit: str
    date: str
    datasets: Mapping[str, Measured]


@dataclass(frozen=True, kw_only=True)
class Change:
    """A model change and the datasets it was made for."""

    name: str
    what: str
    docs: str
    baseline: str
    datasets: tuple[str, ...]
    measured_at: str | None = None
    before_pct: Mapping[str, float]


def _table(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ValueError(f"history.toml: {where} must be a table")
    return value


@cache
def load() -> tuple[tuple[Baseline, ...], tuple[Change, ...]]:
    """The baselines and changes of ``data/history.toml``, checked: every change names a known
    baseline, and a dataset it lists has a baseline figure, a ``before_pct`` or neither (new)."""
    text = data_text("trainplan.validate", "data", "history.toml")
    doc = tomllib.loads(text)
    baselines = []
    for i, raw in enumerate(doc.get("baseline", [])):
        b = _table(raw, f"baseline {i}")
        measured = {
            name: Measured(
                rows=int(_table(v, name)["rows"]),  # type: ignore[call-overload]
                mape_pct=float(_table(v, name)["mape_pct"]),  # type: ignore[arg-type]
                bias_pct=float(_table(v, name)["bias_pct"]),  # type: ignore[arg-type]
            )
            for name, v in _table(b["datasets"], f"baseline {i} datasets").items()
        }
        baselines.append(Baseline(commit=str(b["commit"]), date=str(b["date"]), datasets=measured))
    known = {b.commit for b in baselines}
    changes = []
    for i, raw in enumerate(doc.get("change", [])):
        c = _table(raw, f"change {i}")
        if c["baseline"] not in known:
            raise ValueError(f"history.toml: change {c['name']!r} names unknown baseline {c['baseline']!r}")
        before = {k: float(v) for k, v in _table(c.get("before_pct", {}), "before_pct").items()}  # type: ignore[arg-type]
        datasets = tuple(str(d) for d in c["datasets"])  # type: ignore[attr-defined]
        if set(before) - set(datasets):
            raise ValueError(
                f"history.toml: change {c['name']!r}: before_pct names a dataset it does not list"
            )
        changes.append(
            Change(
                name=str(c["name"]),
                what=str(c["what"]),
                docs=str(c["docs"]),
                baseline=str(c["baseline"]),
                datasets=datasets,
                measured_at=None if c.get("measured_at") is None else str(c["measured_at"]),
                before_pct=before,
            )
        )
    return tuple(baselines), tuple(changes)


@dataclass(frozen=True, kw_only=True)
class Line:
    """One dataset of one change: before (stored measurement) and now (this run)."""

    dataset: str
    before: str  # "14.9% at c39b29c", "78.9% (new rows, at 519b625)", "new"
    now_rows: int
    now_mape: float | None
    now_bias: float | None


def lines(change: Change, results: Sequence[DatasetResult]) -> list[Line]:
    """The change's datasets, each with its before and its current score from ``results``."""
    baselines, _ = load()
    base = next(b for b in baselines if b.commit == change.baseline)
    by_name = {r.name: r for r in results}
    out = []
    for name in change.datasets:
        if name in base.datasets:
            m = base.datasets[name]
            before = f"{m.mape_pct:.1f}% ({m.rows} rows, {base.commit})"
        elif name in change.before_pct:
            before = f"{change.before_pct[name]:.1f}% (new rows, at {change.measured_at})"
        else:
            before = "new dataset"
        res = by_name.get(name)
        errs = [] if res is None else [r.error for r in res.scored if r.error is not None]
        out.append(
            Line(
                dataset=name,
                before=before,
                now_rows=len(errs),
                now_mape=None if res is None else res.mape,
                now_bias=statistics.fmean(errs) if errs else None,
            )
        )
    return out


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def render_text(results: Sequence[DatasetResult]) -> list[str]:
    _, changes = load()
    out = ["", "model changes, before → now (validation rows; now = this run, every change included):"]
    for c in changes:
        out.append(f"  {c.name} ({c.docs})")
        for ln in lines(c, results):
            out.append(
                f"    {ln.dataset:28s} {ln.before:>48s} → {_pct(ln.now_mape):>6s} ({ln.now_rows} rows)"
            )
    return out


def render_markdown(results: Sequence[DatasetResult]) -> list[str]:
    baselines, changes = load()
    out = [
        "",
        "## Model changes: before → now",
        "",
        "Each change to the model, with the datasets it was made for. *Before* is what `trainplan "
        "validate` printed at the named commit (validation rows only; `src/trainplan/validate/data/"
        "history.toml`); *now* is this report's own score of the same dataset, every later change "
        "included. Baselines: " + ", ".join(f"{b.commit} ({b.date})" for b in baselines) + ".",
    ]
    for c in changes:
        out += [
            "",
            f"### {c.name}",
            "",
            f"{c.what} ({c.docs}).",
            "",
            "| dataset | before | now | now rows | now bias |",
            "|---|---|---|---|---|",
        ]
        for ln in lines(c, results):
            out.append(
                f"| {ln.dataset} | {ln.before} | {_pct(ln.now_mape)} | {ln.now_rows} | {_pct(ln.now_bias, signed=True)} |"
            )
    return out


__all__ = ["Baseline", "Change", "Line", "lines", "load", "render_markdown", "render_text"]
