"""Published runs fit: a run a table publishes ran, so its configuration fit in its devices' memory.

Every timing row is therefore also a memory observation, a one-sided one: the true peak of the
run's configuration was at most the device's capacity. For each target row (VERBATIM or DERIVED,
calibration and validation alike: no memory figure was fitted on them) the estimate of the row's
documented configuration (:func:`trainplan.validate.timing.row_inputs`) is checked against it::

    fits         predicted peak ≤ capacity
    band         predicted peak > capacity, but the memory band's low end ≤ capacity: the run is
                 possible within the stated error
    refuted      even the band's low end exceeds the capacity: the model says the published run
                 could not have run, so the memory model (or the row's documented configuration)
                 is wrong for it

Where a row's configuration is known to differ from what trainplan charges (a partial activation
checkpoint charged as none, activations offloaded to host memory), the row's notes say so and
the check shows the consequence rather than hiding it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.errors import TrainplanError
from trainplan.validate.datasets import REGISTRY, timing_rows
from trainplan.validate.timing import row_inputs


@dataclass(frozen=True, kw_only=True)
class FitRow:
    name: str
    dataset: str
    predicted_bytes: float
    low_bytes: float
    capacity_bytes: float
    largest_term: str

    @property
    def verdict(self) -> str:
        if self.predicted_bytes <= self.capacity_bytes:
            return "fits"
        return "band" if self.low_bytes <= self.capacity_bytes else "refuted"


def fit_rows(names: list[str] | None = None) -> list[FitRow]:
    """The fit check of every target row of the timing datasets (``names``: these only)."""
    from trainplan.predict import estimate

    out: list[FitRow] = []
    for name, info in REGISTRY.items():
        if info.kind != "timing" or (names is not None and name not in names):
            continue
        for row in timing_rows(name):
            if not row.is_target:
                continue
            try:
                system, model, recipe, layout, _ = row_inputs(row)
                e = estimate(system, model, recipe, layout, reliability=None)
            except TrainplanError:
                continue
            mem = e.memory
            low, _ = e.memory_band.around(mem.per_device_bytes)
            term, _ = max(mem.terms(), key=lambda t: t[1])
            out.append(
                FitRow(
                    name=row.name,
                    dataset=name,
                    predicted_bytes=mem.per_device_bytes,
                    low_bytes=low,
                    capacity_bytes=mem.capacity_bytes,
                    largest_term=term,
                )
            )
    return out


def counts(rows: list[FitRow]) -> dict[str, dict[str, int]]:
    """{dataset: {verdict: rows}} in registry order."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        c = out.setdefault(r.dataset, {"fits": 0, "band": 0, "refuted": 0})
        c[r.verdict] += 1
    return out


def render_fits_markdown(rows: list[FitRow] | None = None) -> list[str]:
    """The "Published runs fit" section of docs/validation.md."""
    rows = fit_rows() if rows is None else rows
    by = counts(rows)
    total = {v: sum(c[v] for c in by.values()) for v in ("fits", "band", "refuted")}
    out = [
        "",
        "## Published runs fit",
        "",
        "A published run ran, so its configuration fit in its devices' memory (`trainplan/validate/fits.py`).",
        "Each target row's configuration is estimated and its predicted peak compared with the capacity:",
        "**fits**; **band**: over the capacity, but the memory band's low end is not; **refuted**: even",
        "the band's low end is over, so the model says the published run could not have run.",
        "",
        "| dataset | rows | fits | band | refuted |",
        "|---|---|---|---|---|",
    ]
    for name, c in by.items():
        n = sum(c.values())
        out.append(f"| {name} | {n} | {c['fits']} | {c['band']} | {c['refuted']} |")
    n = sum(total.values())
    out.append(f"| **all** | {n} | {total['fits']} | {total['band']} | {total['refuted']} |")
    over = sorted(
        (r for r in rows if r.verdict != "fits"), key=lambda r: -r.predicted_bytes / r.capacity_bytes
    )
    if over:
        out += [
            "",
            "Rows predicted over the capacity (predicted peak / capacity, largest term):",
            "",
            "| row | dataset | predicted / capacity | verdict | largest term |",
            "|---|---|---|---|---|",
        ]
        for r in over:
            out.append(
                f"| {r.name} | {r.dataset} | {r.predicted_bytes / 1e9:.1f} / {r.capacity_bytes / 1e9:.1f} GB | "
                f"{r.verdict} | {r.largest_term} |"
            )
    return out


__all__ = ["FitRow", "counts", "fit_rows", "render_fits_markdown"]
