"""The band table of :mod:`trainplan.bands`, generated from the validation rows, and its held-out coverage.

Residuals come from the **validation** split only (calibration rows fitted κ and would make the
bands look tighter than they are):

    step_s        every scored timing row of ``trainplan validate``; a tokens/s or MFU error e
                  is a step-time residual log(1 + e), a step-time error e is −log(1 + e)
    memory_bytes  torchtitan_memory (peak reserved vs ``per_device_bytes``) and torchtune_memory
                  (peak active vs ``peak_bytes``, ``validate/torchtune_memory.py``). zero2020_table1
                  is left out: it checks model states, not a peak, and its 0.1% would pass for the
                  accuracy of a measured peak.

``trainplan validate --bands`` writes ``trainplan/data/bands.json``; a test regenerates it and
compares. :func:`held_out_coverage` derives the table without one dataset at a time and counts
how many of that dataset's true values fall inside the bands it gets (leave-one-dataset-out).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainplan.bands import (
    MIN_ROWS,
    QUANTITIES,
    BandTable,
    ClassBand,
    ClassKey,
    classify,
    dataset_shift,
    log_band,
    uncalibrated_band,
)
from trainplan.data_files import data_path
from trainplan.errors import TrainplanError
from trainplan.hardware import get_accelerator, list_accelerators
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.validate.datasets import REGISTRY, memory_rows, timing_rows
from trainplan.validate.timing import predict_row, row_inputs

ROUND: int = 4
"""Decimals stored in bands.json (a relative error to 0.01%)."""


@dataclass(frozen=True, kw_only=True)
class Residual:
    """One validation row: its class, dataset and r = log(published / predicted)."""

    quantity: str
    name: str
    dataset: str
    key: ClassKey
    log_residual: float
    part: str  # the catalog accelerator the row ran on


def timing_residuals() -> list[Residual]:
    out: list[Residual] = []
    for name, info in REGISTRY.items():
        if info.kind != "timing":
            continue
        for row in timing_rows(name):
            if not row.is_target or row.split != "validate":
                continue
            res = predict_row(row)
            if res.error is None:
                continue
            system, model, recipe, layout, _ = row_inputs(row)
            step_like = info.metric in ("step_s", "layer_s")
            r = -math.log1p(res.error) if step_like else math.log1p(res.error)
            key = classify(system.accelerator, model, recipe, layout)
            out.append(
                Residual(
                    quantity="step_s",
                    name=row.name,
                    dataset=name,
                    key=key,
                    log_residual=r,
                    part=system.accelerator.name,
                )
            )
    return out


def memory_residuals() -> list[Residual]:
    from trainplan.memory import memory_breakdown
    from trainplan.validate.report import memory_row_inputs
    from trainplan.validate.torchtune_memory import comparisons

    out: list[Residual] = []
    for row in memory_rows("torchtitan_memory"):
        if not row.is_target or row.bound != "eq" or row.split != "validate":
            continue
        try:
            model, recipe, layout = memory_row_inputs(row)
        except TrainplanError:
            continue
        predicted = memory_breakdown(model, recipe, layout).per_device_bytes
        key = classify(
            get_accelerator(row.hardware), model, recipe, layout, stack=REGISTRY[row.dataset].stack
        )
        out.append(
            Residual(
                quantity="memory_bytes",
                name=row.name,
                dataset=row.dataset,
                key=key,
                log_residual=math.log(row.measured_bytes / predicted),
                part=get_accelerator(row.hardware).name,
            )
        )
    for c in comparisons():
        row = c.row
        if not row.is_target or row.split != "validate" or row.num_devices is None:
            continue
        if row.hardware not in catalog_names():
            continue
        layout = Layout.for_devices(row.num_devices, zero=c.run.zero)
        if not row.preset:
            continue
        key = classify(
            get_accelerator(row.hardware),
            load_model(row.preset),
            c.run.recipe,
            layout,
            stack=REGISTRY[row.dataset].stack,
        )
        out.append(
            Residual(
                quantity="memory_bytes",
                name=row.name,
                dataset=row.dataset,
                key=key,
                log_residual=math.log(c.published_bytes / c.predicted_bytes),
                part=get_accelerator(row.hardware).name,
            )
        )
    return out


def catalog_names() -> set[str]:
    """Built-in accelerator names: a row on a device outside the catalog (the RTX A6000 of
    torchtune_memory) has no family an estimate could ever fall in, and is left out."""
    return {a.name for a in list_accelerators()}


def residuals() -> list[Residual]:
    return timing_residuals() + memory_residuals()


def _rel(x: float) -> float:
    return round(math.expm1(x), ROUND)


def _candidate_keys(rs: Sequence[Residual]) -> list[ClassKey]:
    """Every exact class of the rows and every pooled class of the fallback order, sorted by name."""
    keys: dict[str, ClassKey] = {}
    for r in rs:
        for k in r.key.fallbacks():
            keys[k.name] = k
    return [keys[n] for n in sorted(keys)]


def derive(rs: Sequence[Residual]) -> BandTable:
    """The band table of these residuals (:mod:`trainplan.bands`, Method)."""
    classes: list[ClassBand] = []
    uncalibrated: dict[str, tuple[float, float]] = {}
    for q in QUANTITIES:
        mine = [r for r in rs if r.quantity == q]
        floor = dataset_shift([r.log_residual for r in mine], [r.dataset for r in mine])
        logs: list[tuple[float, float]] = []
        for key in _candidate_keys(mine):
            inside = [r for r in mine if key.matches(r.key)]
            if len(inside) < MIN_ROWS:
                continue
            lo, hi = log_band(
                [r.log_residual for r in inside], [r.dataset for r in inside], shift_floor=floor
            )
            logs.append((lo, hi))
            classes.append(
                ClassBand(
                    quantity=q,
                    name=key.name,
                    rows=len(inside),
                    datasets=tuple(sorted({r.dataset for r in inside})),
                    parts=tuple(sorted({r.part for r in inside})),
                    low=_rel(lo),
                    high=_rel(hi),
                )
            )
        lo, hi = uncalibrated_band(logs, _dataset_biases(mine))
        uncalibrated[q] = (_rel(lo), _rel(hi))
    return BandTable(classes=tuple(classes), uncalibrated=uncalibrated)


def _dataset_biases(rs: Sequence[Residual]) -> list[float]:
    """Mean residual of every dataset with at least ``MIN_ROWS`` rows."""
    groups: dict[str, list[float]] = {}
    for r in rs:
        groups.setdefault(r.dataset, []).append(r.log_residual)
    return [statistics.fmean(g) for g in groups.values() if len(g) >= MIN_ROWS]


def table() -> BandTable:
    """The band table of the current model over every validation row."""
    return derive(residuals())


def bands_path() -> Path:
    return Path(data_path("trainplan", "data", "bands.json"))


def write_table(path: Path | None = None) -> Path:
    target = path or bands_path()
    target.write_text(table().to_json(), encoding="utf-8")
    return target


@dataclass(frozen=True, kw_only=True)
class Coverage:
    """Held-out coverage of one dataset: how many of its true values fell inside their band."""

    quantity: str
    dataset: str
    rows: int
    inside: int
    uncalibrated: int  # rows whose family had no other dataset (scored with the uncalibrated band)

    @property
    def fraction(self) -> float:
        return self.inside / self.rows if self.rows else 1.0


def held_out_coverage(rs: Sequence[Residual] | None = None) -> list[Coverage]:
    """Leave-one-dataset-out: bands derived without dataset D, scored on D's rows."""
    rows = list(residuals() if rs is None else rs)
    out: list[Coverage] = []
    for q in QUANTITIES:
        names = sorted({r.dataset for r in rows if r.quantity == q})
        for d in names:
            held = [r for r in rows if r.quantity == q and r.dataset == d]
            rest = [r for r in rows if r.dataset != d]
            t = derive(rest)
            inside = unc = 0
            for r in held:
                band = t.lookup(q, r.key, part=r.part)
                unc += not band.calibrated
                inside += math.log1p(band.low) <= r.log_residual <= math.log1p(band.high)
            out.append(Coverage(quantity=q, dataset=d, rows=len(held), inside=inside, uncalibrated=unc))
    return out


def dataset_mean_coverage(items: Sequence[Coverage], quantity: str) -> float:
    """Coverage averaged over the held-out datasets (each dataset counts once, however many rows)."""
    mine = [c.fraction for c in items if c.quantity == quantity and c.rows]
    return statistics.fmean(mine) if mine else 1.0


def total_coverage(items: Sequence[Coverage], quantity: str) -> float:
    mine = [c for c in items if c.quantity == quantity]
    n = sum(c.rows for c in mine)
    return sum(c.inside for c in mine) / n if n else 1.0


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def render_bands_text(t: BandTable | None = None, cov: Sequence[Coverage] | None = None) -> str:
    """The band table and its held-out coverage, as ``trainplan validate --bands`` prints them."""
    t = table() if t is None else t
    cov = held_out_coverage() if cov is None else cov
    lines = [f"{'quantity':12s} {'class':36s} {'rows':>5s} {'low':>8s} {'high':>8s}"]
    for c in t.classes:
        lines.append(f"{c.quantity:12s} {c.name:36s} {c.rows:5d} {_pct(c.low):>8s} {_pct(c.high):>8s}")
    for q, (lo, hi) in t.uncalibrated.items():
        lines.append(f"{q:12s} {'uncalibrated':36s} {'—':>5s} {_pct(lo):>8s} {_pct(hi):>8s}")
    lines.append("")
    lines.append("held-out coverage (bands derived without the dataset, scored on it):")
    for h in cov:
        lines.append(f"{h.quantity:12s} {h.dataset:28s} {h.inside:4d}/{h.rows:<4d} {100 * h.fraction:5.1f}%")
    for q in QUANTITIES:
        lines.append(f"{q:12s} {'all held-out rows':28s} {100 * total_coverage(cov, q):5.1f}%")
        lines.append(f"{q:12s} {'mean over datasets':28s} {100 * dataset_mean_coverage(cov, q):5.1f}%")
    return "\n".join(lines)


def _family_only_markdown(t: BandTable) -> list[str]:
    """The catalog parts whose family is calibrated but which no validation row ran on."""
    from trainplan.bands import accelerator_family
    from trainplan.hardware.catalog import all_accelerators

    widest = {(c.quantity, c.name): c for c in t.classes}
    out = [
        "### Parts calibrated by their family only",
        "",
        "A part whose family holds validated rows but none of its own takes its family's band, and",
        "every surface says so (`no validated run on <part>`; `*` in a plan's band column): how far",
        "it departs from the family's measured parts is not measured.",
        "",
        "| part | family | step-time rows on | memory rows on |",
        "|---|---|---|---|",
    ]
    for acc in all_accelerators():
        fam = accelerator_family(acc)
        cells = []
        for q in QUANTITIES:
            c = widest.get((q, f"{fam}/*/*/*"))
            cells.append(
                "—" if c is None else ("**this part**" if acc.name in c.parts else ", ".join(c.parts))
            )
        if all(cell in ("—", "**this part**") for cell in cells):
            continue
        out.append(f"| {acc.name} | {fam} | {cells[0]} | {cells[1]} |")
    return out


def render_bands_markdown(t: BandTable | None = None, cov: Sequence[Coverage] | None = None) -> str:
    """The bands section of docs/validation.md."""
    t = table() if t is None else t
    cov = held_out_coverage() if cov is None else cov
    out = [
        "## Prediction bands",
        "",
        "Every estimate carries the 90% band of its validation class (`trainplan/bands.py`: classes,",
        "fallback order and method). Band = range of true / predicted − 1; derived from the",
        "validation rows above by `trainplan validate --bands` (`trainplan/data/bands.json`).",
        "Method, in log(published / predicted): the union of the split-conformal order statistics",
        "and the normal prediction interval of the class, widened on each side by the standard",
        "deviation of the per-dataset mean residuals (of the class, or of every dataset, the larger).",
        "Calibration rows and zero2020_table1 (model states, not a peak) are left out. Parts = the",
        "catalog accelerators the class's rows ran on. Classes ending in `/dense` or `/moe` hold one",
        "architecture's rows; a dense estimate looks through its own architecture's chain before the",
        "pooled one, and an MoE estimate without an MoE class is uncalibrated (`bands.OWN_ARCH_ONLY`).",
        "",
        "| quantity | class | rows | low | high | datasets | parts |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in t.classes:
        out.append(
            f"| {c.quantity} | {c.name} | {c.rows} | {_pct(c.low)} | {_pct(c.high)} "
            f"| {', '.join(c.datasets)} | {', '.join(c.parts)} |"
        )
    for q, (lo, hi) in t.uncalibrated.items():
        out.append(f"| {q} | **uncalibrated** (no validated rows) | — | {_pct(lo)} | {_pct(hi)} | | |")
    out += ["", *_family_only_markdown(t)]
    out += [
        "",
        "### Held-out coverage",
        "",
        "Leave one dataset out: the bands are derived from every other dataset, and each row of the",
        "held-out dataset is scored against the band its class gets (a family left without rows gets",
        "the uncalibrated band). Coverage = share of true values inside the printed 90% band.",
        "",
        "| quantity | held-out dataset | rows | inside | coverage | rows scored as uncalibrated |",
        "|---|---|---|---|---|---|",
    ]
    for h in cov:
        out.append(
            f"| {h.quantity} | {h.dataset} | {h.rows} | {h.inside} | {100 * h.fraction:.1f}% | {h.uncalibrated} |"
        )
    for q in QUANTITIES:
        n = sum(h.rows for h in cov if h.quantity == q)
        out.append(f"| {q} | **all rows** | {n} | | **{100 * total_coverage(cov, q):.1f}%** | |")
        out.append(f"| {q} | **mean over datasets** | | | **{100 * dataset_mean_coverage(cov, q):.1f}%** | |")
    return "\n".join(out) + "\n"
