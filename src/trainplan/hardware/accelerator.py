"""Accelerator, network-link and cloud-offering types.

Every figure is SI: FLOP/s, bytes, bytes/s, seconds, watts, US dollars. Conventions (see
``docs/hardware.md`` for the sources and every discrepancy resolved):

* ``peak_flops`` are **dense** peaks. Vendor figures quoted "with sparsity" (NVIDIA 2:4
  structured sparsity, AMD/Cerebras sparsity) are halved. ``fp32`` is the non-tensor
  (vector) FP32 rate; ``tf32`` is the tensor-core TF32 rate. A dtype that is absent is
  unsupported (or unpublished) and is never extrapolated from another dtype.
* Link bandwidths are per chip and **one direction** (NVLink 4 "900 GB/s" is 450e9 B/s).
* ``latency_s`` is the per-message (per ring step) latency alpha of an alpha-beta collective
  model. Defaults per link type come from NCCL's own cost model (``src/graph/tuning.cc``,
  ``hwLat``, Ring/LL: NVLink 0.47 us, PCIe 1.0 us, network 2.7 us); links NCCL does not know
  reuse the nearest class and say so in their ``source``.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from trainplan.dtypes import PEAK_KEYS
from trainplan.errors import CatalogError

STATUSES: Final[tuple[str, ...]] = ("shipping", "announced")
SOURCE_KEYS: Final[tuple[str, ...]] = (
    "peak_flops",
    "memory",
    "usable_memory",
    "power",
    "price",
    "links",
    "host_memory",
)
PRICE_KINDS: Final[tuple[str, ...]] = (
    "on-demand",
    "spot",
    "reserved",
    "committed",
    "capacity-block",
    "estimate",
)
"""How a price is sold: ``on-demand`` (pay as you go, no commitment), ``spot`` (preemptible or
interruptible capacity), ``reserved`` (a reservation or contract of a fixed term), ``committed``
(a committed-use discount such as Google's 1- or 3-year CUD), ``capacity-block`` (a fixed-duration
block booked ahead, e.g. AWS EC2 Capacity Blocks for ML). ``estimate`` is not a price anyone sells
at: a per-hour rental rate that a named report (a paper, the press, an analyst) states as its own
estimate or assumption, for a part no provider publishes a rate for; its ``provider`` names the
report, and it is ranked after every sold kind."""

PURCHASE_KIND: Final = "purchase"
"""The kind of a dated purchase price the vendor published (list price, MSRP, launch price per
device): a capital cost, compared with renting by ``trainplan cost``, never ranked with the
per-hour kinds above."""

PURCHASE_ESTIMATE_KIND: Final = "purchase-estimate"
"""The kind of a dated purchase price that is a press or analyst report (a street price, a quote
from the channel, a rack price divided by its devices), not a vendor list price."""

PURCHASE_KINDS: Final[tuple[str, ...]] = (PURCHASE_KIND, PURCHASE_ESTIMATE_KIND)
"""The kinds of a purchase price; every catalog purchase price states one (``purchase_kind``)."""

PURCHASE_KIND_LABELS: Final[dict[str, str]] = {
    PURCHASE_KIND: "list price",
    PURCHASE_ESTIMATE_KIND: "reported estimate, not a list price",
}
"""How every surface that prints a purchase price names its kind."""

NO_PUBLIC_PRICE_REASONS: Final[tuple[str, ...]] = ("announced, unshipped",)
"""Why an accelerator may carry no dated price at all: only a part that is announced and not yet
shipped, with a source saying no price has been published (``no_public_price``)."""

_NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_DATE_RE: Final = re.compile(r"^\d{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$")


def _positive(field_name: str, value: float, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CatalogError(field_name, f"must be a number, got {value!r}; {hint}")
    if not math.isfinite(value) or value <= 0:
        raise CatalogError(field_name, f"must be a positive finite number, got {value!r}; {hint}")


def _nonneg(field_name: str, value: float, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CatalogError(field_name, f"must be a number, got {value!r}; {hint}")
    if not math.isfinite(value) or value < 0:
        raise CatalogError(field_name, f"must be a finite number >= 0, got {value!r}; {hint}")


def _positive_int(field_name: str, value: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CatalogError(field_name, f"must be a positive integer, got {value!r}; {hint}")


def _text(field_name: str, value: str, hint: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise CatalogError(field_name, f"must be a non-empty string, got {value!r}; {hint}")


@dataclass(frozen=True, kw_only=True)
class Link:
    """One network level of one chip, ONE direction.

    ``domain_size`` is the number of chips in one scale-up domain (8 for an HGX board, 72 for
    an NVL72 rack, the pod or slice size for TPU ICI); it is ignored for scale-out and host
    links.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    domain_size: int = 1
    source: str

    def __post_init__(self) -> None:
        _text("name", self.name, "name the link, e.g. 'NVLink 4 (NVSwitch)'")
        _positive(
            "bandwidth_bytes_per_s",
            self.bandwidth_bytes_per_s,
            "give the per-chip, one-direction bandwidth in bytes/s (900 GB/s bidirectional = 450e9)",
        )
        _nonneg("latency_s", self.latency_s, "give the per-message latency in seconds (e.g. 2.7e-6)")
        _positive_int("domain_size", self.domain_size, "give the number of chips in one scale-up domain")
        _text("source", self.source, "cite a URL or document name for this link's figures")

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "bandwidth_bytes_per_s": float(self.bandwidth_bytes_per_s),
            "latency_s": float(self.latency_s),
            "domain_size": self.domain_size,
            "source": self.source,
        }


@dataclass(frozen=True, kw_only=True)
class CloudOffering:
    """A dated public price for renting the device: ``usd_per_device_hour`` is the instance
    price divided by ``devices_per_instance``."""

    provider: str
    instance: str
    usd_per_device_hour: float
    date: str
    source: str
    devices_per_instance: int
    kind: str = "on-demand"

    def __post_init__(self) -> None:
        _text("provider", self.provider, "name the cloud, e.g. 'AWS'")
        if self.kind not in PRICE_KINDS:
            raise CatalogError("kind", f"must be one of {', '.join(PRICE_KINDS)}, got {self.kind!r}")
        _text("instance", self.instance, "name the instance type, e.g. 'p5.48xlarge'")
        _positive("usd_per_device_hour", self.usd_per_device_hour, "give the USD per device-hour")
        if not isinstance(self.date, str) or not _DATE_RE.match(self.date):
            raise CatalogError("date", f"must be YYYY-MM or YYYY-MM-DD, got {self.date!r}")
        _text("source", self.source, "cite the price list or page the price comes from")
        _positive_int("devices_per_instance", self.devices_per_instance, "give the accelerators per instance")

    @property
    def usd_per_instance_hour(self) -> float:
        return self.usd_per_device_hour * self.devices_per_instance

    @property
    def day(self) -> datetime.date:
        """The price's date; a month-only date (``YYYY-MM``) reads as the first of the month, so
        an age computed from it is never younger than the price."""
        parts = [int(p) for p in self.date.split("-")]
        return datetime.date(parts[0], parts[1], parts[2] if len(parts) == 3 else 1)

    def age_days(self, today: datetime.date) -> int:
        """Days from the price's date to ``today``."""
        return (today - self.day).days

    def describe(self) -> str:
        """``provider kind instance, $X/device-h (date)``: the offering in one line."""
        return f"{self.provider} {self.kind} {self.instance}, ${self.usd_per_device_hour:.2f}/device-h ({self.date})"

    def to_dict(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "instance": self.instance,
            "kind": self.kind,
            "usd_per_device_hour": float(self.usd_per_device_hour),
            "devices_per_instance": self.devices_per_instance,
            "date": self.date,
            "source": self.source,
        }


@dataclass(frozen=True, kw_only=True)
class PurchasePrice:
    """A dated public purchase price for one device (kind :data:`PURCHASE_KIND`): the catalog's
    ``purchase_usd`` with the date it was published (``purchase_date``) and its ``sources.price``."""

    usd_per_device: float
    date: str
    source: str
    kind: str
    """One of :data:`PURCHASE_KINDS`, checked where the price is built (``Accelerator.purchase_kind``)."""

    @property
    def day(self) -> datetime.date:
        parts = [int(p) for p in self.date.split("-")]
        return datetime.date(parts[0], parts[1], parts[2] if len(parts) == 3 else 1)

    @property
    def label(self) -> str:
        """The kind in words: ``list price`` or ``reported estimate, not a list price``."""
        return PURCHASE_KIND_LABELS[self.kind]

    def describe(self) -> str:
        return f"purchase ${self.usd_per_device:,.0f}/device ({self.label}, {self.date})"

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "label": self.label,
            "usd_per_device": float(self.usd_per_device),
            "date": self.date,
            "source": self.source,
        }


def _freeze_floats(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(value))


def _freeze_strs(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """One chip (or, where stated in ``notes``, the unit software sees as one device)."""

    name: str
    display_name: str
    vendor: str
    family: str
    year: int
    status: str
    aliases: tuple[str, ...] = ()
    peak_flops: Mapping[str, float]
    sparse_peak_flops: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Vendor peaks *with* structured sparsity, kept apart for reference; no estimate reads them."""
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    memory_type: str
    usable_memory_bytes: float | None = None
    scale_up: Link
    scale_out: Link | None = None
    host_link: Link | None = None
    tdp_w: float | None = None
    purchase_usd: float | None = None
    purchase_date: str | None = None
    """When ``purchase_usd`` was published or reported (YYYY-MM or YYYY-MM-DD); required with it."""
    purchase_kind: str | None = None
    """What ``purchase_usd`` is, one of :data:`PURCHASE_KINDS` (a vendor list price or a reported
    estimate); required with it, so no estimate reads as a list price."""
    no_public_price: str | None = None
    """The explicit marker of an accelerator with no dated price at all, one of
    :data:`NO_PUBLIC_PRICE_REASONS`; ``sources.price`` names the source that says so."""
    cloud: tuple[CloudOffering, ...] = ()
    devices_per_node: int
    whole_system: bool = False
    """The entry is a whole system, priced and powered as one box (a Cerebras CS-3: the wafer with
    its power, cooling and I/O): ``purchase_usd`` and ``tdp_w`` are the system's, so buy-vs-rent
    adds no server share and no server power ratio (:mod:`trainplan.ownership`)."""
    host_memory_bytes_per_node: float | None = None
    """CPU memory of the reference server (``devices_per_node`` accelerators), for offloaded
    states; ``None`` when the catalog knows no reference server (give it per system)."""
    sources: Mapping[str, str]
    dates: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise CatalogError(
                "name", f"must be a lowercase hyphenated id like 'h100-sxm', got {self.name!r}"
            )
        for key in ("display_name", "vendor", "family", "memory_type"):
            _text(key, getattr(self, key), f"describe the accelerator's {key.replace('_', ' ')}")
        if isinstance(self.year, bool) or not isinstance(self.year, int) or not 1990 <= self.year <= 2100:
            raise CatalogError("year", f"must be a year such as 2024, got {self.year!r}")
        if self.status not in STATUSES:
            raise CatalogError("status", f"must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if not isinstance(self.whole_system, bool):
            raise CatalogError("whole_system", f"must be true or false, got {self.whole_system!r}")
        object.__setattr__(self, "aliases", tuple(a.lower() for a in self.aliases))
        for alias in self.aliases:
            if not _NAME_RE.match(alias):
                raise CatalogError("aliases", f"alias {alias!r} must be lowercase letters, digits, '.', '-'")
        if not self.peak_flops:
            raise CatalogError(
                "peak_flops", f"declare at least one dense peak, keys from {', '.join(PEAK_KEYS)}"
            )
        for key, value in self.peak_flops.items():
            if key not in PEAK_KEYS:
                raise CatalogError(
                    f"peak_flops.{key}", f"unknown dtype {key!r}; use one of {', '.join(PEAK_KEYS)}"
                )
            _positive(f"peak_flops.{key}", value, "give the dense peak in FLOP/s (halve sparse figures)")
        object.__setattr__(self, "peak_flops", _freeze_floats(self.peak_flops))
        for key, value in self.sparse_peak_flops.items():
            if key not in PEAK_KEYS:
                raise CatalogError(
                    f"sparse_peak_flops.{key}", f"unknown dtype {key!r}; use one of {', '.join(PEAK_KEYS)}"
                )
            _positive(f"sparse_peak_flops.{key}", value, "give the vendor's with-sparsity peak in FLOP/s")
            dense = self.peak_flops.get(key)
            if dense is not None and value < dense:
                raise CatalogError(
                    f"sparse_peak_flops.{key}",
                    f"{value:g} is below the dense peak {dense:g}; a sparse peak is never lower",
                )
        object.__setattr__(self, "sparse_peak_flops", _freeze_floats(self.sparse_peak_flops))
        _positive("memory_bytes", self.memory_bytes, "give device memory in bytes (80 GB = 80e9)")
        if self.usable_memory_bytes is not None:
            _positive(
                "usable_memory_bytes",
                self.usable_memory_bytes,
                "give the memory a program can allocate in bytes, or leave it out when it equals memory_bytes",
            )
            if self.usable_memory_bytes > self.memory_bytes:
                raise CatalogError(
                    "usable_memory_bytes",
                    f"{self.usable_memory_bytes:g} exceeds the nominal memory_bytes {self.memory_bytes:g}",
                )
        _positive(
            "memory_bandwidth_bytes_per_s",
            self.memory_bandwidth_bytes_per_s,
            "give memory bandwidth in bytes/s (3.35 TB/s = 3.35e12)",
        )
        if not isinstance(self.scale_up, Link):
            raise CatalogError("scale_up", "must be a Link")
        for key in ("scale_out", "host_link"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, Link):
                raise CatalogError(key, "must be a Link or absent")
        if self.tdp_w is not None:
            _positive("tdp_w", self.tdp_w, "give the board power in watts, or leave it out when unknown")
        if self.purchase_usd is not None:
            _positive("purchase_usd", self.purchase_usd, "give the purchase price in USD, or leave it out")
            if not isinstance(self.purchase_date, str) or not _DATE_RE.match(self.purchase_date):
                raise CatalogError(
                    "purchase_date",
                    f"must be YYYY-MM or YYYY-MM-DD (when the purchase price was published), got {self.purchase_date!r}",
                )
            if self.purchase_kind not in PURCHASE_KINDS:
                raise CatalogError(
                    "purchase_kind",
                    f"must be one of {', '.join(PURCHASE_KINDS)} (a vendor list price or a press/analyst "
                    f"estimate), got {self.purchase_kind!r}",
                )
        elif self.purchase_date is not None:
            raise CatalogError("purchase_date", "a purchase date needs a purchase_usd; give both or neither")
        elif self.purchase_kind is not None:
            raise CatalogError("purchase_kind", "a purchase kind needs a purchase_usd; give both or neither")
        object.__setattr__(self, "cloud", tuple(self.cloud))
        for offering in self.cloud:
            if not isinstance(offering, CloudOffering):
                raise CatalogError("cloud", "each entry must be a CloudOffering")
        _positive_int("devices_per_node", self.devices_per_node, "give the accelerators per server")
        if self.no_public_price is not None:
            if self.no_public_price not in NO_PUBLIC_PRICE_REASONS:
                raise CatalogError(
                    "no_public_price",
                    f"must be one of {', '.join(repr(r) for r in NO_PUBLIC_PRICE_REASONS)}, got "
                    f"{self.no_public_price!r}; a shipping part needs a dated price",
                )
            if self.status != "announced":
                raise CatalogError(
                    "no_public_price",
                    f"{self.no_public_price!r} marks an announced part, but the status is {self.status!r}; "
                    "give a dated price instead",
                )
            if self.cloud or self.purchase_usd is not None:
                raise CatalogError(
                    "no_public_price", "the marker is for a part with no price; remove it or the prices"
                )
        for key in self.sources:
            if key not in SOURCE_KEYS:
                raise CatalogError(f"sources.{key}", f"unknown source group; use {', '.join(SOURCE_KEYS)}")
        if self.host_memory_bytes_per_node is not None:
            _positive(
                "host_memory_bytes_per_node",
                self.host_memory_bytes_per_node,
                "give the server's CPU memory in bytes (2 TiB = 2199023255552), or leave it out",
            )
        required = ["peak_flops", "memory"]
        if self.host_memory_bytes_per_node is not None:
            required.append("host_memory")
        if self.usable_memory_bytes is not None:
            required.append("usable_memory")
        if self.tdp_w is not None:
            required.append("power")
        if self.purchase_usd is not None or self.no_public_price is not None:
            required.append("price")
        for key in required:
            text = self.sources.get(key)
            if not isinstance(text, str) or not text.strip():
                raise CatalogError(f"sources.{key}", f"missing source for {key}; cite a URL or document name")
        object.__setattr__(self, "sources", _freeze_strs(self.sources))
        for key, day in self.dates.items():
            if key not in SOURCE_KEYS:
                raise CatalogError(f"dates.{key}", f"unknown source group; use {', '.join(SOURCE_KEYS)}")
            if not isinstance(day, str) or not _DATE_RE.match(day):
                raise CatalogError(f"dates.{key}", f"must be YYYY-MM or YYYY-MM-DD, got {day!r}")
        object.__setattr__(self, "dates", _freeze_strs(self.dates))
        object.__setattr__(self, "notes", tuple(self.notes))

    def __hash__(self) -> int:
        return hash((self.name, self.vendor, self.memory_bytes, tuple(sorted(self.peak_flops.items()))))

    @property
    def supported_dtypes(self) -> tuple[str, ...]:
        """Dtypes with a declared dense peak, in :data:`PEAK_KEYS` order."""
        return tuple(k for k in PEAK_KEYS if k in self.peak_flops)

    def supports(self, dtype: str) -> bool:
        return dtype in self.peak_flops

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; :class:`CatalogError` when the device has none."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            supported = self.supported_dtypes
            hint = ""
            for candidate in ("bf16", "fp16", "fp8", "tf32", "fp32"):
                if candidate in supported:
                    hint = f"; use --precision {candidate}"
                    break
            raise CatalogError(
                "precision",
                f"{self.name} has no {dtype} peak (supports {', '.join(supported)}){hint}",
            ) from None

    @property
    def capacity_bytes(self) -> float:
        """The memory a training process can fill: the usable figure where the catalog gives one
        (drivers and firmware reserve part of the nominal HBM), else the nominal memory."""
        return self.memory_bytes if self.usable_memory_bytes is None else self.usable_memory_bytes

    @property
    def purchase(self) -> PurchasePrice | None:
        """The dated purchase price, or ``None`` when the catalog has none."""
        if self.purchase_usd is None or self.purchase_date is None or self.purchase_kind is None:
            return None
        return PurchasePrice(
            usd_per_device=self.purchase_usd,
            date=self.purchase_date,
            source=self.sources["price"],
            kind=self.purchase_kind,
        )

    @property
    def dated_prices(self) -> tuple[CloudOffering | PurchasePrice, ...]:
        """Every dated public price: the rental offerings, then the purchase price."""
        purchase = self.purchase
        return (*self.cloud, *(() if purchase is None else (purchase,)))

    def cheapest_offering(self) -> CloudOffering | None:
        """The default offering (:func:`trainplan.hardware.prices.default_offering`), or ``None``
        when no dated public price is known."""
        from trainplan.hardware.prices import default_offering

        return default_offering(self.cloud)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict in SI units."""
        return {
            "name": self.name,
            "display_name": self.display_name,
            "vendor": self.vendor,
            "family": self.family,
            "year": self.year,
            "status": self.status,
            "aliases": list(self.aliases),
            "peak_flops": {k: float(v) for k, v in self.peak_flops.items()},
            "sparse_peak_flops": {k: float(v) for k, v in self.sparse_peak_flops.items()},
            "memory_bytes": float(self.memory_bytes),
            "memory_bandwidth_bytes_per_s": float(self.memory_bandwidth_bytes_per_s),
            "memory_type": self.memory_type,
            "usable_memory_bytes": None
            if self.usable_memory_bytes is None
            else float(self.usable_memory_bytes),
            "capacity_bytes": float(self.capacity_bytes),
            "scale_up": self.scale_up.to_dict(),
            "scale_out": None if self.scale_out is None else self.scale_out.to_dict(),
            "host_link": None if self.host_link is None else self.host_link.to_dict(),
            "tdp_w": None if self.tdp_w is None else float(self.tdp_w),
            "purchase_usd": None if self.purchase_usd is None else float(self.purchase_usd),
            "purchase_date": self.purchase_date,
            "purchase_kind": self.purchase_kind,
            "no_public_price": self.no_public_price,
            "cloud": [o.to_dict() for o in self.cloud],
            "devices_per_node": self.devices_per_node,
            "whole_system": self.whole_system,
            "host_memory_bytes_per_node": self.host_memory_bytes_per_node,
            "sources": dict(self.sources),
            "dates": dict(self.dates),
            "notes": list(self.notes),
        }
