"""Buy or rent: owning accelerators against renting them, per year and per used device-hour.

Owning ``nodes`` servers of ``devices_per_node`` accelerators for ``years`` at utilisation ``u``
(the fraction of hours they train):

    capex_usd          = nodes · node_price · (1 + network_fraction)
    node_kw            = devices_per_node · TDP · NODE_POWER_PER_ACCELERATOR_TDP / 1000
    power_usd/yr (u)   = nodes · node_kw · (u + f_idle · (1 − u)) · 8760 h · PUE · usd_per_kwh
    facility_usd/yr    = nodes · node_kw · usd_per_kw_month · 12      (space, cooling, colocation)
    owned_usd/yr (u)   = capex_usd / years + power_usd/yr (u) + facility_usd/yr
    owned $/used device-hour = owned_usd/yr (u) / (devices · 8760 h · u)

Renting costs ``rent`` $ per device-hour, for the hours used only. The break-even utilisation is
the ``u`` at which both cost the same per year (power is linear in ``u``):

    u* = (capex/years + facility + P_idle) / (rent · devices · 8760 − P_busy)

with P_idle = nodes · node_kw · f_idle · 8760 · PUE · $/kWh and P_busy the rest of the power bill
at u = 1. Above ``u*`` owning is cheaper; ``u* > 1`` means renting is cheaper at any utilisation.
The break-even time at utilisation ``u`` is the months after which the rent paid exceeds the
purchase plus the running costs: capex / (monthly rent − monthly power and facility); it must fall
inside the amortisation period for the purchase to pay.

Every input is stated in the output and overridable. Defaults:

* node price: the catalog's accelerator purchase price × devices per node × (1 + SERVER_OVERHEAD)
  (CPUs, memory, NICs, chassis and storage around the accelerators; an assumption);
* NODE_POWER_PER_ACCELERATOR_TDP = 10.2 kW / (8 × 700 W) = 1.82: a DGX H100's maximum system
  power over its GPUs' TDP (NVIDIA DGX H100 datasheet; the DGX B200's 14.3 kW over 8 × 1 kW gives
  1.79);
* f_idle: :data:`trainplan.cost.IDLE_POWER_FRACTION`; PUE: :data:`trainplan.cost.DEFAULT_PUE`;
* the other defaults below are stated assumptions, to be replaced by the buyer's own quotes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from trainplan.cost import DEFAULT_PUE, IDLE_POWER_FRACTION, MAX_PUE
from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import Accelerator
from trainplan.limits import check_real

HOURS_PER_YEAR: Final = 8760.0
NODE_POWER_PER_ACCELERATOR_TDP: Final = 10_200.0 / (8 * 700.0)
"""Server power per watt of accelerator TDP (DGX H100: 10.2 kW maximum for 8 × 700 W GPUs)."""
SERVER_OVERHEAD: Final = 0.25
"""Server cost beyond its accelerators, as a fraction of their price (assumption)."""
DEFAULT_NETWORK_FRACTION: Final = 0.15
"""Scale-out network (NICs' switch ports, optics, switches) per server, as a fraction of its price
(assumption)."""
DEFAULT_USD_PER_KWH: Final = 0.08
"""Electricity price (assumption: about the US industrial average of 2024-2025)."""
DEFAULT_USD_PER_KW_MONTH: Final = 150.0
"""Colocation space and cooling per kW of IT load per month (assumption: wholesale colocation)."""
DEFAULT_YEARS: Final = 4.0
MAX_YEARS: Final = 30.0
"""Longest service life accepted (accelerators are written off in 3-6 years)."""
MAX_NODE_PRICE_USD: Final = 1e9
"""Dearest node accepted: a billion dollars, far above any server (an 8-GPU node is ~$0.3M)."""
"""Amortisation period (assumption; accelerators are commonly depreciated over 4-6 years)."""
DEFAULT_UTILISATION: Final = 0.7
"""Fraction of the hours the owned accelerators train (assumption)."""


@dataclass(frozen=True, kw_only=True)
class Ownership:
    """The inputs of a buy-or-rent comparison (module docstring), each stated in the output."""

    accelerator: Accelerator
    devices: int
    node_price_usd: float
    rent_usd_per_device_hour: float
    rent_source: str
    years: float = DEFAULT_YEARS
    utilisation: float = DEFAULT_UTILISATION
    usd_per_kwh: float = DEFAULT_USD_PER_KWH
    usd_per_kw_month: float = DEFAULT_USD_PER_KW_MONTH
    network_fraction: float = DEFAULT_NETWORK_FRACTION
    pue: float = DEFAULT_PUE
    node_price_source: str = "given (--node-price)"

    def __post_init__(self) -> None:
        def positive(name: str, value: float) -> None:
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise TrainplanError(name, f"must be a positive finite number, got {value!r}")

        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or self.devices <= 0:
            raise TrainplanError("devices", f"must be a positive integer, got {self.devices!r}")
        for name in (
            "node_price_usd",
            "rent_usd_per_device_hour",
            "years",
            "usd_per_kwh",
            "usd_per_kw_month",
        ):
            positive(name, getattr(self, name))
        if not 0 < self.utilisation <= 1:
            raise TrainplanError("utilisation", f"must be in (0, 1], got {self.utilisation!r}")
        if not 0 <= self.network_fraction < 10 or not math.isfinite(self.network_fraction):
            raise TrainplanError(
                "network_fraction", f"must be a fraction >= 0, got {self.network_fraction!r}"
            )
        if not self.pue >= 1.0 or not math.isfinite(self.pue):
            raise TrainplanError("pue", f"PUE is at least 1.0, got {self.pue!r}")
        # bounds far above any real purchase (trainplan.limits): a 10^308-year or 10^308-dollar
        # input would print infinities or hundred-digit prices
        check_real("years", self.years, low=0.0, high=MAX_YEARS, what="years of service")
        check_real("node_price_usd", self.node_price_usd, low=0.0, high=MAX_NODE_PRICE_USD, what="USD")
        check_real("pue", self.pue, low=1.0, high=MAX_PUE)
        if self.accelerator.tdp_w is None:
            raise TrainplanError(
                "hardware", f"{self.accelerator.name} has no TDP in the catalog: its power cannot be costed"
            )

    @property
    def nodes(self) -> int:
        return math.ceil(self.devices / self.accelerator.devices_per_node)

    @property
    def node_kw(self) -> float:
        tdp = self.accelerator.tdp_w
        assert tdp is not None
        ratio = 1.0 if self.accelerator.whole_system else NODE_POWER_PER_ACCELERATOR_TDP
        return self.accelerator.devices_per_node * tdp * ratio / 1000.0

    @property
    def capex_usd(self) -> float:
        return self.nodes * self.node_price_usd * (1.0 + self.network_fraction)

    def power_usd_per_year(self, utilisation: float) -> float:
        busy = utilisation + IDLE_POWER_FRACTION * (1.0 - utilisation)
        return self.nodes * self.node_kw * busy * HOURS_PER_YEAR * self.pue * self.usd_per_kwh

    @property
    def facility_usd_per_year(self) -> float:
        return self.nodes * self.node_kw * self.usd_per_kw_month * 12.0

    def owned_usd_per_year(self, utilisation: float) -> float:
        return self.capex_usd / self.years + self.power_usd_per_year(utilisation) + self.facility_usd_per_year

    def rented_usd_per_year(self, utilisation: float) -> float:
        return self.rent_usd_per_device_hour * self.devices * HOURS_PER_YEAR * utilisation

    def owned_usd_per_used_device_hour(self, utilisation: float) -> float:
        return self.owned_usd_per_year(utilisation) / (self.devices * HOURS_PER_YEAR * utilisation)

    @property
    def break_even_utilisation(self) -> float:
        """u*: owning and renting cost the same per year (``inf`` when renting never costs more)."""
        idle = self.power_usd_per_year(0.0)
        busy = self.power_usd_per_year(1.0) - idle
        denom = self.rent_usd_per_device_hour * self.devices * HOURS_PER_YEAR - busy
        if denom <= 0:
            return math.inf
        return (self.capex_usd / self.years + self.facility_usd_per_year + idle) / denom

    def break_even_months(self, utilisation: float) -> float:
        """Months at ``utilisation`` after which the rent paid exceeds purchase + running costs."""
        monthly_rent = self.rented_usd_per_year(utilisation) / 12.0
        monthly_running = (self.power_usd_per_year(utilisation) + self.facility_usd_per_year) / 12.0
        if monthly_rent <= monthly_running:
            return math.inf
        return self.capex_usd / (monthly_rent - monthly_running)

    def verdict(self) -> str:
        u = self.utilisation
        months = self.break_even_months(u)
        if months <= self.years * 12.0:
            return (
                f"buy: at {100 * u:.0f}% utilisation owning costs "
                f"${self.owned_usd_per_used_device_hour(u):.2f} per used device-hour against "
                f"${self.rent_usd_per_device_hour:.2f} rented, and the purchase pays back in "
                f"{months:.1f} months (of {self.years * 12:.0f})"
            )
        return (
            f"rent: at {100 * u:.0f}% utilisation owning costs ${self.owned_usd_per_used_device_hour(u):.2f} "
            f"per used device-hour against ${self.rent_usd_per_device_hour:.2f} rented; owning pays only "
            + (
                f"above {100 * self.break_even_utilisation:.0f}% utilisation"
                if self.break_even_utilisation <= 1.0
                else "never: renting is cheaper even at 100% utilisation"
            )
        )

    def to_dict(self) -> dict[str, object]:
        u = self.utilisation
        months = self.break_even_months(u)
        be = self.break_even_utilisation
        return {
            "hardware": self.accelerator.name,
            "devices": self.devices,
            "nodes": self.nodes,
            "inputs": {
                "node_price_usd": self.node_price_usd,
                "node_price_source": self.node_price_source,
                "network_fraction": self.network_fraction,
                "node_kw": self.node_kw,
                "years": self.years,
                "utilisation": u,
                "usd_per_kwh": self.usd_per_kwh,
                "usd_per_kw_month": self.usd_per_kw_month,
                "pue": self.pue,
                "rent_usd_per_device_hour": self.rent_usd_per_device_hour,
                "rent_source": self.rent_source,
            },
            "capex_usd": self.capex_usd,
            "owned_usd_per_year": self.owned_usd_per_year(u),
            "power_usd_per_year": self.power_usd_per_year(u),
            "facility_usd_per_year": self.facility_usd_per_year,
            "rented_usd_per_year": self.rented_usd_per_year(u),
            "owned_usd_per_used_device_hour": self.owned_usd_per_used_device_hour(u),
            # None: no utilisation up to 100% makes owning the cheaper (the verdict says so)
            "break_even_utilisation": None if be > 1.0 else be,
            "break_even_months": None if math.isinf(months) else months,
            "verdict": self.verdict(),
        }

    def render(self) -> str:
        u = self.utilisation
        d = self.to_dict()
        be = self.break_even_utilisation
        months = self.break_even_months(u)
        lines = [
            f"buy or rent {self.devices} × {self.accelerator.name} ({self.nodes} server(s) of "
            f"{self.accelerator.devices_per_node}), over {self.years:g} years at {100 * u:.0f}% utilisation",
            "inputs (each overridable):",
            f"  server price            ${self.node_price_usd:,.0f} ({self.node_price_source})",
            f"  network share           {100 * self.network_fraction:.0f}% of the server price (--network-fraction)",
            f"  server power            {self.node_kw:.1f} kW at full load "
            + (
                "(the system's own power)"
                if self.accelerator.whole_system
                else "(DGX H100 system/GPU power ratio)"
            ),
            f"  electricity             ${self.usd_per_kwh:.3f}/kWh (--usd-per-kwh), PUE {self.pue:g} (--pue)",
            f"  space and cooling       ${self.usd_per_kw_month:.0f} per kW-month (--usd-per-kw-month)",
            f"  rent                    ${self.rent_usd_per_device_hour:.2f}/device-hour ({self.rent_source})",
            "owning:",
            f"  purchase                ${self.capex_usd:,.0f}",
            f"  per year                ${d['owned_usd_per_year']:,.0f} = ${self.capex_usd / self.years:,.0f} "
            f"amortised + ${self.power_usd_per_year(u):,.0f} power + ${self.facility_usd_per_year:,.0f} facility",
            f"  per used device-hour    ${self.owned_usd_per_used_device_hour(u):.2f}",
            f"renting: ${self.rented_usd_per_year(u):,.0f} per year for the same hours",
            "break-even: "
            + (
                f"{100 * be:.0f}% utilisation"
                if be <= 1.0
                else "none (renting is cheaper at any utilisation)"
            )
            + (
                f"; the purchase pays back after {months:.1f} months at {100 * u:.0f}%"
                if not math.isinf(months)
                else ""
            )
            + (
                f", beyond the {self.years * 12:.0f}-month amortisation"
                if not math.isinf(months) and months > self.years * 12
                else ""
            ),
            self.verdict(),
        ]
        return "\n".join(lines)


def default_node_price(acc: Accelerator) -> tuple[float, str]:
    """The catalog's purchase price × devices per node × (1 + SERVER_OVERHEAD), and its source."""
    purchase = acc.purchase
    if purchase is None:
        raise TrainplanError(
            "node_price",
            f"{acc.name} has no purchase price in the catalog; give --node-price USD (one server of "
            f"{acc.devices_per_node})",
        )
    if acc.whole_system:
        price = purchase.usd_per_device * acc.devices_per_node
        return price, (
            f"{acc.devices_per_node} × ${purchase.usd_per_device:,.0f} (purchase price of the whole system, "
            f"{purchase.label}, of {purchase.date}: {purchase.source}; --node-price)"
        )
    price = purchase.usd_per_device * acc.devices_per_node * (1.0 + SERVER_OVERHEAD)
    return price, (
        f"{acc.devices_per_node} × ${purchase.usd_per_device:,.0f} (purchase price, {purchase.label}, of {purchase.date}: "
        f"{purchase.source}) "
        f"+ {100 * SERVER_OVERHEAD:.0f}% for the rest of the server (assumption; --node-price)"
    )


__all__ = ["Ownership", "default_node_price"]
