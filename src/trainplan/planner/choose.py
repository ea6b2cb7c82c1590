"""How to choose your training accelerator: one job, every family, the fastest, the cheapest to
rent and the one to buy, each with its error band and the reasons in the terms hardware is sold on.

``choose`` runs :func:`trainplan.planner.search.compare` twice over the same accelerators (best
layout per accelerator for time, then for cost; the same estimate for every number), keeps the
plans that meet the deadline and the budget, and ranks them:

* fastest — least time-to-train (goodput included);
* cheapest — least rental cost of the run at the catalog's dated price (or ``--price``);
* to buy — least cost of the run on owned accelerators (:mod:`trainplan.ownership` at its stated
  defaults: the run's device-hours at the owned cost per used device-hour).

Two options whose bands (``run.time_s_band`` / ``run.cost_usd_band``) overlap tie within error,
and the answer says so; an uncalibrated accelerator is named as such. Each row states the
figures a buyer compares: dense peak at the recipe's GEMM dtype, HBM capacity and bandwidth,
the scale-up link, software maturity (whether validated runs calibrate the accelerator's family
and stack, and its training-stack factor κ) and the price with its source and date.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import Accelerator
from trainplan.ownership import Ownership, default_node_price
from trainplan.planner.command import layout_cell
from trainplan.planner.search import COST_TABLE_NOTE, Plan, PlanResult


@dataclass(frozen=True, kw_only=True)
class Option:
    """One accelerator's best plan for one objective, with what ranks it."""

    plan: Plan
    time_s: float
    time_band: tuple[float, float]
    cost_usd: float | None
    cost_band: tuple[float, float] | None
    owned_usd: float | None
    owned_note: str

    @property
    def accelerator(self) -> Accelerator:
        return self.plan.estimate.system.accelerator

    @property
    def calibrated(self) -> bool:
        return self.plan.estimate.step_band.calibrated

    def facts(self) -> str:
        """The figures the choice turns on, in the terms accelerators are compared by."""
        e = self.plan.estimate
        acc = self.accelerator
        dtype = e.recipe.gemm_dtype
        peak = acc.peak_flops.get(dtype)
        link = acc.scale_up
        maturity = (
            f"calibrated ({e.step_band.class_name}{e.step_band.part_note()}, κ = {e.time.kappa:.2f})"
            if self.calibrated
            else f"uncalibrated (too few validated training runs on this family for a band; κ = {e.time.kappa:.2f})"
        )
        price = e.run.price_source or "no price"
        return (
            f"{dtype} dense peak {peak / 1e12:,.0f} TFLOP/s; HBM {acc.memory_bytes / 1e9:,.0f} GB at "
            f"{acc.memory_bandwidth_bytes_per_s / 1e12:.2f} TB/s; scale-up {link.name} "
            f"{link.bandwidth_bytes_per_s / 1e9:,.0f} GB/s × {link.domain_size}; software {maturity}; "
            f"price {price}"
            if peak is not None
            else f"no {dtype} peak"
        )


@dataclass(frozen=True, kw_only=True)
class Choice:
    model: str
    tokens: float
    deadline_h: float | None
    budget_usd: float | None
    options: tuple[Option, ...]  # one per accelerator that meets the constraints, fastest first
    excluded: tuple[tuple[str, str], ...]  # (accelerator, why)
    fastest: Option | None
    cheapest: Option | None
    to_buy: Option | None
    notes: tuple[str, ...]

    def _tie(self, best: Option | None, key: str) -> list[str]:
        """The options whose band overlaps the best one's (tie within error)."""
        if best is None:
            return []
        out = []
        for o in self.options:
            if o is best:
                continue
            if key == "time":
                a, b = best.time_band, o.time_band
            else:
                if best.cost_band is None or o.cost_band is None:
                    continue
                a, b = best.cost_band, o.cost_band
            if b[0] <= a[1] and a[0] <= b[1]:
                out.append(o.plan.label)
        return out

    def verdicts(self) -> list[str]:
        lines = []
        for name, best, key in (
            ("fastest", self.fastest, "time"),
            ("cheapest to rent", self.cheapest, "cost"),
        ):
            if best is None:
                lines.append(f"{name}: none meets the constraints")
                continue
            what = (
                f"{_hours(best.time_s)} ({_hours(best.time_band[0])} … {_hours(best.time_band[1])})"
                if key == "time"
                else f"${best.cost_usd:,.0f} (${best.cost_band[0]:,.0f} … ${best.cost_band[1]:,.0f})"
                if best.cost_usd is not None and best.cost_band is not None
                else "no price"
            )
            ties = self._tie(best, key)
            lines.append(
                f"{name}: {best.plan.label} {layout_cell(best.plan)} — {what}"
                + ("" if best.calibrated else " [uncalibrated]")
                + (f"; ties within error with {', '.join(ties)}" if ties else "")
            )
        if self.to_buy is not None and self.to_buy.owned_usd is not None:
            lines.append(
                f"to buy: {self.to_buy.plan.label} — the run costs ${self.to_buy.owned_usd:,.0f} on owned "
                f"accelerators ({self.to_buy.owned_note})"
                + ("" if self.to_buy.calibrated else " [uncalibrated]")
            )
        else:
            lines.append("to buy: no accelerator with a purchase price meets the constraints")
        mixed = {o.calibrated for o in self.options}
        if mixed == {True, False}:
            lines.append(
                "the ranking mixes calibrated and uncalibrated accelerators: the uncalibrated ones' "
                "times and costs carry the wide uncalibrated band: too few validated training runs back them"
            )
        return lines

    def render(self) -> str:
        head = f"how to choose a training accelerator for {self.model}: {self.tokens:.3g} tokens"
        if self.deadline_h is not None:
            head += f", deadline {self.deadline_h:g} h"
        if self.budget_usd is not None:
            head += f", budget ${self.budget_usd:,.0f}"
        lines = [head]
        lines += [f"note: {n}" for n in self.notes]
        lines.append("")
        lines.append(
            f" {'accelerator':18s} {'layout':34s} {'time':>10s} {'time band':>21s} {'rent':>10s} {'own':>10s}  calibrated"
        )
        for o in self.options:
            lines.append(
                f" {o.plan.label:18s} {layout_cell(o.plan)[:34]:34s} {_hours(o.time_s):>10s} "
                f"{_hours(o.time_band[0]) + ' … ' + _hours(o.time_band[1]):>21s} "
                f"{_usd(o.cost_usd):>10s} {_usd(o.owned_usd):>10s}  {'yes' if o.calibrated else 'no'}"
            )
        for name, why in self.excluded:
            lines.append(f" {name:18s} — {why}")
        lines.append("")
        lines += self.verdicts()
        lines.append("")
        lines.append("why (the figures each option turns on):")
        for o in self.options:
            lines.append(f"  {o.plan.label}: {o.facts()}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        def one(o: Option | None) -> object:
            return None if o is None else o.plan.label

        return {
            "model": self.model,
            "tokens": self.tokens,
            "deadline_h": self.deadline_h,
            "budget_usd": self.budget_usd,
            "fastest": one(self.fastest),
            "cheapest": one(self.cheapest),
            "to_buy": one(self.to_buy),
            "options": [
                {
                    "label": o.plan.label,
                    "hardware": o.accelerator.name,
                    "calibrated": o.calibrated,
                    "time_s": o.time_s,
                    "time_s_band": list(o.time_band),
                    "cost_usd": o.cost_usd,
                    "cost_usd_band": None if o.cost_band is None else list(o.cost_band),
                    "owned_cost_usd": o.owned_usd,
                    "owned_note": o.owned_note,
                    "facts": o.facts(),
                    "plan": o.plan.to_dict(),
                }
                for o in self.options
            ],
            "excluded": [{"hardware": h, "reason": r} for h, r in self.excluded],
            "verdicts": self.verdicts(),
            "notes": list(self.notes),
        }


def _hours(seconds: float) -> str:
    h = seconds / 3600.0
    if h < 1:
        return f"{60 * h:.0f} min"
    if h < 48:
        return f"{h:.1f} h"
    return f"{h / 24:.1f} days"


def _usd(v: float | None) -> str:
    return "—" if v is None else f"${v:,.0f}"


def _option(plan: Plan) -> Option:
    e = plan.estimate
    t = e.run.time_s
    if t is None:
        raise TrainplanError("tokens", "choosing needs --tokens (the length of the run)")
    cost = e.run.cost_usd
    owned, note = _owned_cost(plan)
    return Option(
        plan=plan,
        time_s=t,
        time_band=e.step_band.around(t),
        cost_usd=cost,
        cost_band=None if cost is None else e.step_band.around(cost),
        owned_usd=owned,
        owned_note=note,
    )


def _owned_cost(plan: Plan) -> tuple[float | None, str]:
    """The run's device-hours at the owned cost per used device-hour (ownership defaults)."""
    e = plan.estimate
    acc = e.system.accelerator
    purchase = acc.purchase
    if purchase is None or acc.tdp_w is None or e.run.device_hours is None:
        return None, "no purchase price or power in the catalog"
    price, _ = default_node_price(acc)
    own = Ownership(
        accelerator=acc,
        devices=e.system.num_devices,
        node_price_usd=price,
        rent_usd_per_device_hour=e.run.usd_per_device_hour or 1.0,
        rent_source="catalog",
    )
    rate = own.owned_usd_per_used_device_hour(own.utilisation)
    return e.run.device_hours * rate, (
        f"${rate:.2f}/device-hour owned at {100 * own.utilisation:.0f}% utilisation over "
        f"{own.years:g} years, purchase price ({purchase.label}) of {purchase.date}; "
        f"`trainplan cost {acc.name}` for the inputs"
    )


def choose(
    by_time: PlanResult,
    by_cost: PlanResult,
    *,
    deadline_h: float | None = None,
    budget_usd: float | None = None,
) -> Choice:
    """Rank the per-accelerator bests of two ``compare`` runs (objective time, then cost)."""
    if by_time.tokens is None:
        raise TrainplanError("tokens", "choosing needs --tokens (the length of the run)")
    options: list[Option] = []
    excluded: list[tuple[str, str]] = []
    cost_best = {b.hardware: b for b in by_cost.per_accelerator}
    for b in by_time.per_accelerator:
        plans: Sequence[Plan] = [p for p in (b.plan, cost_best.get(b.hardware, b).plan) if p is not None]
        if not plans:
            excluded.append((b.hardware, b.reason or "no layout fits"))
            continue
        cands = [_option(p) for p in plans]
        ok = [
            o
            for o in cands
            if (deadline_h is None or o.time_s <= deadline_h * 3600.0)
            and (budget_usd is None or (o.cost_usd is not None and o.cost_usd <= budget_usd))
        ]
        if not ok:
            best = min(cands, key=lambda o: o.time_s)
            why = []
            if deadline_h is not None and best.time_s > deadline_h * 3600.0:
                why.append(f"misses the deadline ({_hours(best.time_s)} at best)")
            if budget_usd is not None:
                least = min((o.cost_usd for o in cands if o.cost_usd is not None), default=None)
                why.append("has no price" if least is None else f"exceeds the budget (${least:,.0f} at best)")
            excluded.append((b.hardware, "; ".join(why) or "does not meet the constraints"))
            continue
        options.extend(ok)
    fastest = min(options, key=lambda o: o.time_s, default=None)
    priced = [o for o in options if o.cost_usd is not None]
    cheapest = min(priced, key=lambda o: o.cost_usd or math.inf, default=None)
    ownable = [o for o in options if o.owned_usd is not None]
    to_buy = min(ownable, key=lambda o: o.owned_usd or math.inf, default=None)
    # one row per accelerator in the table: its fastest option that met the constraints
    seen: dict[str, Option] = {}
    for o in sorted(options, key=lambda o: o.time_s):
        seen.setdefault(o.accelerator.name, o)
    rows = tuple(seen.values())
    keep = {id(o) for o in rows}
    for pick in (fastest, cheapest, to_buy):
        if pick is not None and id(pick) not in keep:
            rows = (*rows, pick)
            keep.add(id(pick))
    return Choice(
        model=by_time.model,
        tokens=by_time.tokens,
        deadline_h=deadline_h,
        budget_usd=budget_usd,
        options=rows,
        excluded=tuple(excluded),
        fastest=fastest,
        cheapest=cheapest,
        to_buy=to_buy,
        notes=tuple(
            dict.fromkeys(
                (
                    # the planner's own table notes describe its tables, not this one
                    *(n for n in (*by_time.notes, *by_cost.notes) if n != COST_TABLE_NOTE),
                    "table: each accelerator's fastest plan within the constraints, then the cheapest to rent "
                    "and the cheapest to own where those are other plans",
                )
            )
        ),
    )


__all__ = ["Choice", "Option", "choose"]
