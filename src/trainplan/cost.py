"""Run cost: time to train, device-hours, money and energy.

    run.compute_time_s = tokens / tokens_per_s
    run.time_s        = compute_time_s + checkpoint_time_s + lost_time_s   (goodput.py: interruptions,
                        checkpoint writes, redone work and restarts; = compute_time_s with --no-goodput)
    run.device_hours  = devices · time_s / 3600
    run.cost_usd      = device_hours · price ($ per device-hour), null when no price is known
    run.energy_kwh    = devices · P_avg · time_s / 3.6e6 · PUE

Price: ``--price`` (user, $/device-hour), else the catalog's dated offering picked by
:mod:`trainplan.hardware.prices` (``--provider``, ``--price-kind`` and ``--max-price-age`` narrow
it; :data:`~trainplan.hardware.prices.DEFAULT_RULE` ranks what remains); every offering names its
provider, kind, instance, date and source. Energy counts the accelerators only (not hosts, switches or storage)
and scales by the data-centre PUE. Average device power follows the linear utilisation model
used by Patterson et al. 2021 ("Carbon Emissions and Large Neural Network Training", Sec. 2):

    P_avg = P_idle + (TDP − P_idle) · u,    u = compute time / step time (the busy fraction)

with P_idle = ``IDLE_POWER_FRACTION`` · TDP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from trainplan.errors import TrainplanError
from trainplan.goodput import GoodputTerms, Reliability, goodput_terms
from trainplan.hardware.accelerator import CloudOffering
from trainplan.hardware.prices import OPEN, PriceQuery, select_offering
from trainplan.hardware.system import System
from trainplan.num import Int, Num, as_float, where
from trainplan.timing import Throughput, TimeBreakdown
from trainplan.units import SECONDS_PER_HOUR

IDLE_POWER_FRACTION: Final = 0.25
"""Idle power of an accelerator as a fraction of its TDP. Assumption: datacentre GPUs idle at
roughly 60–100 W against 400–700 W TDPs (nvidia-smi on A100/H100); stated, not measured here."""

DEFAULT_PUE: Final = 1.2
"""Power usage effectiveness of the data centre. Assumption between hyperscale (~1.1, Google
data-centre efficiency reports) and the industry average (~1.5, Uptime Institute surveys)."""


@dataclass(frozen=True, kw_only=True)
class RunCost:
    tokens: float | None
    time_s: float | None
    device_hours: float | None
    cost_usd: float | None
    usd_per_device_hour: float | None
    price_source: str | None
    energy_kwh: float | None
    average_power_w: float | None
    pue: float
    goodput: GoodputTerms | None = None  # None: no tokens, or --no-goodput
    checkpoint_bytes: float | None = None
    reliability: Reliability | None = None
    offering: CloudOffering | None = None
    """The catalog offering the price comes from; ``None`` for a user price or no price."""

    @property
    def compute_time_s(self) -> float | None:
        return None if self.goodput is None else float(self.goodput.compute_s)

    @property
    def price_label(self) -> str:
        """``$6.88/device-h AWS on-demand (2026-08-26)``, ``user price`` or ``no price``."""
        if self.usd_per_device_hour is None:
            return "no price"
        if self.offering is None:
            return f"${self.usd_per_device_hour:.2f}/device-h user price"
        o = self.offering
        return f"${o.usd_per_device_hour:.2f}/device-h {o.provider} {o.kind} ({o.date})"

    def to_dict(self) -> dict[str, object]:
        g = self.goodput
        o = self.offering
        return {
            "tokens": self.tokens,
            "time_s": self.time_s,
            "compute_time_s": self.time_s if g is None else float(g.compute_s),
            "goodput": None
            if g is None
            else {
                "fraction": float(g.compute_s / g.wall_s),
                "compute_s": float(g.compute_s),
                "checkpoint_s": float(g.checkpoint_s),
                "lost_s": float(g.lost_s),
                "interruptions": float(g.interruptions),
                "job_mtbf_s": float(g.job_mtbf_s),
                "checkpoint_interval_s": float(g.checkpoint_interval_s),
                "checkpoint_write_s": float(g.checkpoint_write_s),
                "checkpoint_bytes": self.checkpoint_bytes,
                "assumptions": None if self.reliability is None else self.reliability.describe(),
            },
            "device_hours": self.device_hours,
            "cost_usd": self.cost_usd,
            "usd_per_device_hour": self.usd_per_device_hour,
            "price_source": self.price_source,
            "energy_kwh": self.energy_kwh,
            "average_power_w": self.average_power_w,
            "pue": self.pue,
            "offering": None if o is None else o.to_dict(),
            "price_provider": None if o is None else o.provider,
            "price_kind": None if o is None else o.kind,
            "price_date": None if o is None else o.date,
        }


MAX_PUE: Final = 5.0
"""Largest power usage effectiveness accepted: industry averages are about 1.6 (Uptime Institute
Global Data Center Survey, 2020-2023: 1.59, 1.57, 1.55, 1.58), so 5 is far above any facility."""


def choose_offering(
    system: System, provider: str | None = None, query: PriceQuery = OPEN
) -> CloudOffering | None:
    """The system's chosen offering, else the one ``query`` (with ``provider``, if given) picks
    from the catalog (:func:`~trainplan.hardware.prices.select_offering`; a filter that leaves
    nothing raises :class:`~trainplan.hardware.prices.PriceError`)."""
    if provider is not None:
        query = PriceQuery(
            kind=query.kind, provider=provider, max_age_days=query.max_age_days, today=query.today
        )
    if system.offering is not None and query.is_open:
        return system.offering
    acc = system.accelerator
    return select_offering(acc.name, acc.cloud, query)


def run_cost(
    system: System,
    time: TimeBreakdown,
    throughput: Throughput,
    *,
    tokens: float | None,
    price_usd_per_device_hour: float | None = None,
    provider: str | None = None,
    pue: float = DEFAULT_PUE,
    checkpoint_bytes: float = 0.0,
    reliability: Reliability | None = None,
    price_query: PriceQuery = OPEN,
) -> RunCost:
    """Time, device-hours, dollars and kWh to train ``tokens`` tokens (all null without tokens);
    with ``reliability``, the time includes the interruptions and checkpoints of goodput.py."""
    if not 1.0 <= pue <= MAX_PUE:
        raise TrainplanError(
            "pue", f"PUE is facility power / IT power, between 1.0 and {MAX_PUE:g}, got {pue}"
        )
    offer: CloudOffering | None = None
    if price_usd_per_device_hour is not None:
        price: float | None = price_usd_per_device_hour
        price_source: str | None = "user (--price)"
    else:
        offer = choose_offering(system, provider, price_query)
        price = None if offer is None else offer.usd_per_device_hour
        price_source = (
            None
            if offer is None
            else f"{offer.provider} {offer.kind} {offer.instance} ({offer.date}): {offer.source}"
        )
    acc = system.accelerator
    power = None if acc.tdp_w is None else float(average_power_w(acc.tdp_w, time.compute_s, time.step_s))
    if tokens is None:
        return RunCost(
            tokens=None,
            time_s=None,
            device_hours=None,
            cost_usd=None,
            usd_per_device_hour=price,
            price_source=price_source,
            energy_kwh=None,
            average_power_w=power,
            pue=pue,
            offering=offer,
        )
    time_s, device_hours, cost, energy, terms = run_totals(
        tokens,
        throughput.tokens_per_s,
        system.num_devices,
        price=price if price is not None else math.nan,
        power_w=power if power is not None else math.nan,
        pue=pue,
        checkpoint_bytes=checkpoint_bytes,
        reliability=reliability,
    )
    return RunCost(
        goodput=terms,
        checkpoint_bytes=checkpoint_bytes if reliability is not None else None,
        reliability=reliability,
        tokens=tokens,
        time_s=float(time_s),
        device_hours=float(device_hours),
        cost_usd=None if price is None else float(cost),
        usd_per_device_hour=price,
        price_source=price_source,
        energy_kwh=None if power is None else float(energy),
        average_power_w=power,
        pue=pue,
        offering=offer,
    )


def average_power_w(tdp_w: Num, compute_s: Num, step_s: Num) -> Num:
    """``P_idle + (TDP − P_idle) · u`` with u = compute time / step time (module docstring)."""
    busy = where(step_s > 0, compute_s / where(step_s > 0, step_s, 1.0), 0.0)
    idle = IDLE_POWER_FRACTION * tdp_w
    return idle + (tdp_w - idle) * busy


def run_totals(
    tokens: Num,
    tokens_per_s: Num,
    devices: Int,
    *,
    price: Num,
    power_w: Num,
    pue: float,
    checkpoint_bytes: Num = 0.0,
    reliability: Reliability | None = None,
) -> tuple[Num, Num, Num, Num, GoodputTerms | None]:
    """(time_s, device_hours, cost_usd, energy_kwh, goodput terms) of training ``tokens`` (module
    docstring); NaN prices or powers give NaN costs or energies. The devices draw the average
    power for the whole wall time (they stay allocated through checkpoints and restarts)."""
    time_s = tokens / tokens_per_s
    terms = None
    if reliability is not None:
        terms = goodput_terms(time_s, devices, checkpoint_bytes, reliability)
        time_s = terms.wall_s
    dev = as_float(devices)
    device_hours = dev * time_s / SECONDS_PER_HOUR
    return time_s, device_hours, device_hours * price, dev * power_w * time_s / 3.6e6 * pue, terms
