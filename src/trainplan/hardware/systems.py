"""Rack- and pod-scale systems: GB200/GB300 NVL72, Vera Rubin NVL72, AMD Helios, TPU pods, Trn2/Trn3
UltraServers, DGX B200.

A :class:`SystemSpec` is a named count of one catalog accelerator with its scale-up domain (the
devices one NVLink/ICI/NeuronLink/UALink fabric joins) and a description of its scale-out network.
The per-chip numbers (peaks, memory, link bandwidths and latencies) stay in the accelerator's entry;
a spec's totals are computed from them (:meth:`SystemSpec.totals`), so no figure is written twice.
:meth:`SystemSpec.system` turns a spec (or a slice of it) into the :class:`System` the estimate and
planner use. Built-in specs are ``trainplan/hardware/data/systems.toml``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Final

from trainplan.data_files import data_toml
from trainplan.errors import CatalogError
from trainplan.hardware.accelerator import _DATE_RE, Accelerator
from trainplan.hardware.system import System

DATA_FILE: Final = "systems.toml"
_KEYS: Final = (
    "name",
    "display_name",
    "accelerator",
    "devices",
    "scale_up_domain",
    "scale_up",
    "scale_out",
    "source",
    "date",
)


@dataclass(frozen=True, kw_only=True)
class SystemSpec:
    """``devices`` × ``accelerator`` joined by a ``scale_up_domain``-device fabric."""

    name: str
    display_name: str
    accelerator: Accelerator
    devices: int
    scale_up_domain: int
    scale_up: str
    scale_out: str
    source: str
    date: str

    def __post_init__(self) -> None:
        for key in ("name", "display_name", "scale_up", "scale_out", "source"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip():
                raise CatalogError(key, f"system {self.name!r}: {key} must be a non-empty string")
        for key in ("devices", "scale_up_domain"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CatalogError(key, f"system {self.name!r}: {key} must be a positive integer")
        if self.scale_up_domain > self.devices:
            raise CatalogError(
                "scale_up_domain", f"system {self.name!r}: domain exceeds its {self.devices} devices"
            )
        if self.scale_up_domain > self.accelerator.scale_up.domain_size:
            raise CatalogError(
                "scale_up_domain",
                f"system {self.name!r}: domain {self.scale_up_domain} exceeds the "
                f"{self.accelerator.scale_up.domain_size} of {self.accelerator.name}'s {self.accelerator.scale_up.name}",
            )
        if not _DATE_RE.match(self.date):
            raise CatalogError("date", f"system {self.name!r}: date must be YYYY-MM or YYYY-MM-DD")

    @property
    def status(self) -> str:
        """The accelerator's status: a system of an announced part is announced too."""
        return self.accelerator.status

    def system(self, num_devices: int | None = None) -> System:
        """The whole system, or a slice of ``num_devices`` of it (a TPU slice, part of a rack)."""
        n = self.devices if num_devices is None else num_devices
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= self.devices:
            raise CatalogError(
                "devices", f"{self.name} has {self.devices} devices; a slice has 1 to {self.devices}"
            )
        return System(
            accelerator=self.accelerator, num_devices=n, scale_up_domain=min(self.scale_up_domain, n)
        )

    def totals(self) -> dict[str, float]:
        """System totals computed from the accelerator's per-chip figures (SI units)."""
        acc, n = self.accelerator, self.devices
        out = {
            "memory_bytes": acc.memory_bytes * n,
            "capacity_bytes": acc.capacity_bytes * n,
            "memory_bandwidth_bytes_per_s": acc.memory_bandwidth_bytes_per_s * n,
            "scale_up_bytes_per_s": acc.scale_up.bandwidth_bytes_per_s * n,
        }
        for dtype, flops in acc.peak_flops.items():
            out[f"peak_flops.{dtype}"] = flops * n
        if acc.scale_out is not None:
            out["scale_out_bytes_per_s"] = acc.scale_out.bandwidth_bytes_per_s * n
        if acc.tdp_w is not None:
            out["accelerator_power_w"] = acc.tdp_w * n
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "display_name": self.display_name,
            "accelerator": self.accelerator.name,
            "status": self.status,
            "devices": self.devices,
            "scale_up_domain": self.scale_up_domain,
            "scale_up": self.scale_up,
            "scale_out": self.scale_out,
            "source": self.source,
            "date": self.date,
            "totals": self.totals(),
        }


def _parse(entry: dict[str, object], where: str) -> SystemSpec:
    from trainplan.hardware import get_accelerator

    unknown = set(entry) - set(_KEYS)
    missing = set(_KEYS) - set(entry)
    if unknown or missing:
        raise CatalogError(
            "system", f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}"
        )
    kwargs = dict(entry)
    kwargs["accelerator"] = get_accelerator(str(entry["accelerator"]))
    return SystemSpec(**kwargs)  # type: ignore[arg-type]


@functools.cache
def builtin_systems() -> tuple[SystemSpec, ...]:
    """Every built-in system, in file order."""
    entries = data_toml("trainplan.hardware", "data", DATA_FILE).get("system", [])
    specs = tuple(_parse(e, f"built-in {DATA_FILE}, system #{i + 1}") for i, e in enumerate(entries))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise CatalogError("name", f"built-in {DATA_FILE}: a system name is used twice")
    return specs


def get_system(name: str) -> SystemSpec:
    """The built-in system ``name`` (case-insensitive); :class:`CatalogError` naming them all."""
    key = name.strip().lower()
    for spec in builtin_systems():
        if spec.name == key:
            return spec
    names = ", ".join(s.name for s in builtin_systems())
    raise CatalogError("system", f"unknown system {name!r}; the catalog has: {names}")
