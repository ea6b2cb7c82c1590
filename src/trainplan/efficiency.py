"""Measured achievable efficiency of GEMMs and of device-memory streaming, per accelerator.

The roofline in the time model divides work by *achievable*, not peak, rates:

* GEMM time = FLOPs / (dense peak x :func:`gemm_efficiency`), where the efficiency is the best
  measured fraction of peak of one large GEMM (``gemm_efficiency_max``) times the NVIDIA
  tile- and wave-quantization factors for the actual shape;
* memory-bound time = bytes / (HBM bytes/s x ``memory_bandwidth_efficiency``).

Every constant comes from a published microbenchmark, stored with its citation in
``trainplan/hardware/data/efficiency.toml`` (the table and the method are in
``docs/efficiency.md``). None is fitted to end-to-end training results. The main sources:

* Stas Bekman, "Maximum Achievable Matmul FLOPS (MAMF)" comparison table, ml-engineering
  ``compute/accelerator/README.md`` (torch.matmul, brute-force shape search, BF16 and FP8).
* AMD ROCm blog, "Measuring Max-Achievable FLOPs - Part 2" (2025-02-28, hipBLASLt-bench).
* JAX Pallas TPU "Matrix Multiplication" guide (XLA matmul on TPU v5e).
* AMD MI300X customer acceptance guide (BabelStream) and ROCm/rocm-systems#8480 (TransferBench).
* NVIDIA Deep Learning Performance docs, "Matrix Multiplication Background User's Guide"
  (tile quantization and wave quantization).

A chip without its own measurement borrows the fraction of its nearest measured sibling (the
entry says which and why). A dtype, a memory figure or a whole accelerator that is not in the
file falls back to the **fleet default**: the median of the measured (not borrowed) entries for
that quantity. Fallback values are flagged (:attr:`DeviceEfficiency.assumed`) and say so in
:attr:`DeviceEfficiency.notes`.

No small-``k`` or small-problem penalty is applied: no published, citable per-accelerator
curve was found, so :func:`gemm_efficiency` accepts ``k`` but models only the M x N output
tiling. Small GEMMs are usually memory-bound and are caught by the memory roofline instead.
"""

from __future__ import annotations

import functools
import math
import statistics
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Final

from trainplan.errors import CatalogError

DATA_FILE: Final = "efficiency.toml"

#: dtypes whose tensor-core rate and kernels equal another dtype's: a missing entry reuses it.
_SAME_RATE: Final[Mapping[str, str]] = MappingProxyType({"fp16": "bf16"})

_DEVICE_KEYS: Final = frozenset(
    {
        "name",
        "compute_units",
        "unit_kind",
        "tile_m",
        "tile_n",
        "wave_quantization",
        "units_source",
        "tile_source",
        "notes",
        "gemm",
        "memory",
    }
)
_GEMM_KEYS: Final = frozenset({"measured_tflops", "peak_tflops", "shape", "library", "date", "source"})
_MEMORY_KEYS: Final = frozenset({"measured_bytes_per_s", "peak_bytes_per_s", "benchmark", "date", "source"})


@dataclass(frozen=True, kw_only=True)
class DeviceEfficiency:
    """Achievable fractions of peak for one accelerator.

    ``gemm_efficiency_max`` maps a compute dtype (``bf16``, ``fp8``, ...) to the best measured
    large-GEMM throughput over the dense peak of that dtype, in (0, 1].
    ``memory_bandwidth_efficiency`` is the best measured streaming bandwidth over the vendor
    HBM peak. ``compute_units`` (SMs / CUs) with ``tile_m`` x ``tile_n`` drive wave
    quantization; ``None`` means that effect is not modelled for this chip. ``sources`` maps
    ``gemm.<dtype>``, ``memory``, ``compute_units`` and ``tile`` to citations; ``assumed``
    lists the quantities that came from the fleet default rather than a measurement.
    """

    name: str
    gemm_efficiency_max: Mapping[str, float]
    memory_bandwidth_efficiency: float
    compute_units: int | None = None
    tile_m: int | None = None
    tile_n: int | None = None
    wave_quantization: bool = True
    sources: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"efficiency '{self.name}'"
        for dtype, value in self.gemm_efficiency_max.items():
            _fraction(f"gemm_efficiency_max.{dtype}", value, where)
        _fraction("memory_bandwidth_efficiency", self.memory_bandwidth_efficiency, where)
        for key in ("compute_units", "tile_m", "tile_n"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise CatalogError(key, f"{where}: must be a positive integer or absent, got {value!r}")
        if (self.tile_m is None) != (self.tile_n is None):
            raise CatalogError("tile_m", f"{where}: give both tile_m and tile_n, or neither")
        object.__setattr__(self, "gemm_efficiency_max", MappingProxyType(dict(self.gemm_efficiency_max)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    @property
    def is_assumed(self) -> bool:
        """True when any figure came from the fleet default instead of a measurement."""
        return bool(self.assumed)

    def gemm_max(self, dtype: str) -> float:
        """Large-GEMM efficiency for ``dtype``.

        Order: the dtype's own entry; ``fp16`` uses ``bf16`` (same tensor-core rate and
        kernels); otherwise this chip's ``bf16`` entry; otherwise the fleet default for the
        dtype (or for ``bf16``). The last two are assumptions documented in docs/efficiency.md.
        """
        if dtype in self.gemm_efficiency_max:
            return self.gemm_efficiency_max[dtype]
        alias = _SAME_RATE.get(dtype)
        if alias is not None and alias in self.gemm_efficiency_max:
            return self.gemm_efficiency_max[alias]
        if "bf16" in self.gemm_efficiency_max:
            return self.gemm_efficiency_max["bf16"]
        defaults = _fleet_defaults()[0]
        return defaults.get(dtype, defaults["bf16"])


def _fraction(key: str, value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CatalogError(key, f"{where}: must be a number in (0, 1], got {value!r}")
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise CatalogError(key, f"{where}: must be in (0, 1], got {value!r}; check measured vs peak")


def _check_keys(table: Mapping[str, object], allowed: frozenset[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise CatalogError(key, f"{where}: unknown key '{key}'; allowed: {', '.join(sorted(allowed))}")


def _number(table: Mapping[str, object], key: str, where: str) -> float:
    value = table.get(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise CatalogError(key, f"{where}: must be a positive number, got {value!r}")
    return float(value)


def _string(table: Mapping[str, object], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise CatalogError(key, f"{where}: must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class _Figure:
    """One measured or borrowed fraction with its citation."""

    fraction: float
    source: str
    measured: bool


def _read_document() -> dict[str, object]:
    text = resources.files("trainplan.hardware").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    return tomllib.loads(text)


def _figure(table: Mapping[str, object], kind: str, where: str) -> tuple[_Figure | None, str | None]:
    """Return (figure, None) for a measurement or (None, sibling) for a ``same_as`` entry."""
    if "same_as" in table:
        if set(table) != {"same_as"}:
            raise CatalogError("same_as", f"{where}: same_as must stand alone")
        return None, _string(table, "same_as", where)
    if kind == "gemm":
        _check_keys(table, _GEMM_KEYS, where)
        measured, peak = _number(table, "measured_tflops", where), _number(table, "peak_tflops", where)
        cite = (
            f"{_string(table, 'source', where)}; {measured:g} of {peak:g} TFLOP/s, "
            f"shape {_string(table, 'shape', where)}, {_string(table, 'library', where)}, "
            f"{_string(table, 'date', where)}"
        )
    else:
        _check_keys(table, _MEMORY_KEYS, where)
        measured = _number(table, "measured_bytes_per_s", where)
        peak = _number(table, "peak_bytes_per_s", where)
        cite = (
            f"{_string(table, 'source', where)}; {measured / 1e12:g} of {peak / 1e12:g} TB/s, "
            f"{_string(table, 'benchmark', where)}, {_string(table, 'date', where)}"
        )
    fraction = measured / peak
    _fraction(f"{kind}.efficiency", fraction, where)
    return _Figure(fraction, cite, True), None


@dataclass(frozen=True)
class _Raw:
    gemm: dict[str, tuple[_Figure | None, str | None]]
    memory: tuple[_Figure | None, str | None] | None
    entry: Mapping[str, object]


@functools.cache
def _load() -> tuple[Mapping[str, DeviceEfficiency], Mapping[str, float], float]:
    """Parse the data file once: (devices by name, fleet GEMM defaults, fleet memory default)."""
    doc = _read_document()
    devices = doc.get("device")
    if set(doc) != {"device"} or not isinstance(devices, list):
        raise CatalogError("device", f"{DATA_FILE}: expected only [[device]] tables")
    raw: dict[str, _Raw] = {}
    for entry in devices:
        if not isinstance(entry, dict):
            raise CatalogError("device", f"{DATA_FILE}: every [[device]] must be a table")
        where = f"{DATA_FILE}, device '{entry.get('name', '?')}'"
        _check_keys(entry, _DEVICE_KEYS, where)
        name = _string(entry, "name", where)
        if name in raw:
            raise CatalogError("name", f"{where}: defined twice")
        gemm_tables = entry.get("gemm", {})
        if not isinstance(gemm_tables, dict):
            raise CatalogError("gemm", f"{where}: must be a table of dtype tables")
        gemm = {str(d): _figure(t, "gemm", f"{where}, gemm.{d}") for d, t in gemm_tables.items()}
        mem_table = entry.get("memory")
        memory = None if mem_table is None else _figure(mem_table, "memory", f"{where}, memory")
        raw[name] = _Raw(gemm, memory, entry)

    def resolve(kind: str, name: str, dtype: str, seen: tuple[str, ...] = ()) -> _Figure:
        if name in seen or name not in raw:
            raise CatalogError(
                "same_as",
                f"{DATA_FILE}: {kind} of '{seen[-1] if seen else name}' borrows "
                f"from '{name}', which is missing or circular",
            )
        item = raw[name].gemm.get(dtype) if kind == "gemm" else raw[name].memory
        if item is None:
            raise CatalogError("same_as", f"{DATA_FILE}: '{name}' has no {kind} {dtype} figure to borrow")
        figure, sibling = item
        if figure is not None:
            return figure
        assert sibling is not None
        got = resolve(kind, sibling, dtype, (*seen, name))
        return _Figure(got.fraction, f"borrowed from {sibling}: {got.source}", False)

    resolved: dict[str, tuple[dict[str, _Figure], _Figure | None]] = {}
    for name, item in raw.items():
        gemm_fig = {d: resolve("gemm", name, d) for d in item.gemm}
        mem_fig = resolve("memory", name, "") if item.memory is not None else None
        resolved[name] = (gemm_fig, mem_fig)

    by_dtype: dict[str, list[float]] = {}
    mem_measured: list[float] = []
    for gemm_fig, mem_fig in resolved.values():
        for dtype, fig in gemm_fig.items():
            if fig.measured:
                by_dtype.setdefault(dtype, []).append(fig.fraction)
        if mem_fig is not None and mem_fig.measured:
            mem_measured.append(mem_fig.fraction)
    gemm_default = {d: statistics.median(v) for d, v in by_dtype.items()}
    if "bf16" not in gemm_default or not mem_measured:
        raise CatalogError("device", f"{DATA_FILE}: needs at least one measured bf16 GEMM and memory figure")
    mem_default = statistics.median(mem_measured)

    result: dict[str, DeviceEfficiency] = {}
    for name, (gemm_fig, mem_fig) in resolved.items():
        entry = raw[name].entry
        sources = {f"gemm.{d}": f.source for d, f in gemm_fig.items()}
        assumed: list[str] = []
        if mem_fig is None:
            mem_value = mem_default
            sources["memory"] = _MEMORY_DEFAULT_NOTE
            assumed.append("memory_bandwidth_efficiency")
        else:
            mem_value = mem_fig.fraction
            sources["memory"] = mem_fig.source
        if "bf16" not in gemm_fig:
            assumed.append("gemm_efficiency_max.bf16")
            sources["gemm.bf16"] = _GEMM_DEFAULT_NOTE
        for key, src in (("compute_units", "units_source"), ("tile", "tile_source")):
            if src in entry:
                sources[key] = _string(entry, src, f"{DATA_FILE}, device '{name}'")
        notes = entry.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise CatalogError("notes", f"{DATA_FILE}, device '{name}': must be a list of strings")
        wave = entry.get("wave_quantization", True)
        if not isinstance(wave, bool):
            raise CatalogError("wave_quantization", f"{DATA_FILE}, device '{name}': must be true or false")
        result[name] = DeviceEfficiency(
            name=name,
            gemm_efficiency_max={d: f.fraction for d, f in gemm_fig.items()},
            memory_bandwidth_efficiency=mem_value,
            compute_units=_opt_int(entry, "compute_units"),
            tile_m=_opt_int(entry, "tile_m"),
            tile_n=_opt_int(entry, "tile_n"),
            wave_quantization=wave,
            sources=sources,
            notes=tuple(notes) + tuple(_assumed_note(a) for a in assumed),
            assumed=tuple(assumed),
        )
    return MappingProxyType(result), MappingProxyType(gemm_default), mem_default


_GEMM_DEFAULT_NOTE: Final = (
    "fleet default: median of the measured large-GEMM fractions in efficiency.toml (assumption, no "
    "measurement for this accelerator)"
)
_MEMORY_DEFAULT_NOTE: Final = (
    "fleet default: median of the measured streaming-bandwidth fractions in efficiency.toml "
    "(assumption, no measurement for this accelerator)"
)


def _assumed_note(quantity: str) -> str:
    return f"{quantity} is the fleet default (median of measured entries), an assumption"


def _opt_int(entry: Mapping[str, object], key: str) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(
            key, f"{DATA_FILE}, device '{entry.get('name')}': must be an integer, got {value!r}"
        )
    return value


def _fleet_defaults() -> tuple[Mapping[str, float], float]:
    _, gemm, mem = _load()
    return gemm, mem


def known_devices() -> tuple[str, ...]:
    """Accelerator names that have an entry in the efficiency file."""
    return tuple(sorted(_load()[0]))


def fleet_default() -> DeviceEfficiency:
    """The documented fallback for accelerators without an entry (every figure assumed).

    GEMM: per-dtype median of the measured (not borrowed) large-GEMM fractions; memory: median of
    the measured streaming fractions. No wave or tile quantization (unit count and tile unknown).
    """
    gemm, mem = _fleet_defaults()
    return DeviceEfficiency(
        name="fleet-default",
        gemm_efficiency_max=dict(gemm),
        memory_bandwidth_efficiency=mem,
        sources={"gemm": _GEMM_DEFAULT_NOTE, "memory": _MEMORY_DEFAULT_NOTE},
        notes=("No efficiency entry for this accelerator: fleet medians are used (an assumption).",),
        assumed=("gemm_efficiency_max", "memory_bandwidth_efficiency"),
    )


def get_efficiency(accelerator_name: str) -> DeviceEfficiency:
    """Efficiency figures for a catalog accelerator, or the flagged fleet default.

    ``accelerator_name`` is the canonical catalog name (``h100-sxm``, ``mi300x`` ...); case,
    spaces and underscores are normalised. An unknown or user-defined accelerator gets
    :func:`fleet_default` renamed to it, with ``assumed`` set and a note saying so.
    """
    key = accelerator_name.strip().lower().replace("_", "-").replace(" ", "-")
    devices = _load()[0]
    if key in devices:
        return devices[key]
    default = fleet_default()
    return DeviceEfficiency(
        name=key,
        gemm_efficiency_max=default.gemm_efficiency_max,
        memory_bandwidth_efficiency=default.memory_bandwidth_efficiency,
        sources=default.sources,
        notes=(f"'{key}' has no efficiency entry: fleet medians are used (an assumption).",),
        assumed=default.assumed,
    )


def tile_fraction(m: int, n: int, tile_m: int, tile_n: int) -> float:
    """Useful share of the padded output tiles (tile quantization).

    NVIDIA, "Matrix Multiplication Background User's Guide", tile quantization: the output is
    computed in ``tile_m`` x ``tile_n`` tiles, so a partial last tile costs a whole one.
    Returns ``m*n / (ceil(m/tile_m)*tile_m * ceil(n/tile_n)*tile_n)``.
    """
    padded = math.ceil(m / tile_m) * tile_m * math.ceil(n / tile_n) * tile_n
    return (m * n) / padded


def wave_fraction(tiles: int, units: int) -> float:
    """Share of compute-unit slots doing work (wave quantization).

    Same guide, wave quantization: tiles are scheduled in waves of ``units`` (one tile per SM at
    a time for these large tiles), so the last partial wave costs a full one. Returns
    ``tiles / (ceil(tiles/units)*units)``: exactly 1 when ``tiles`` is a multiple of ``units``,
    about 1/2 for ``units + 1`` tiles.
    """
    return tiles / (math.ceil(tiles / units) * units)


def gemm_efficiency(eff: DeviceEfficiency, m: int, n: int, k: int, dtype: str) -> float:
    """Achieved fraction of the dense peak for one (m x k) @ (k x n) GEMM in ``dtype``.

    ``eff.gemm_max(dtype)`` (best measured large-GEMM fraction) x tile-quantization fraction x
    wave-quantization fraction, the last two only when the chip's tile (and unit count) are
    known. ``k`` is validated but does not enter: no sourced small-k penalty exists (see module
    docstring). The measured maximum comes from a shape with no quantization loss, so a large,
    tile-aligned GEMM returns (almost exactly) ``gemm_max``.
    """
    for label, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CatalogError(f"gemm.{label}", f"must be a positive integer, got {value!r}")
    fraction = eff.gemm_max(dtype)
    if eff.tile_m is None or eff.tile_n is None:
        return fraction
    fraction *= tile_fraction(m, n, eff.tile_m, eff.tile_n)
    if eff.wave_quantization and eff.compute_units is not None:
        tiles = math.ceil(m / eff.tile_m) * math.ceil(n / eff.tile_n)
        fraction *= wave_fraction(tiles, eff.compute_units)
    return fraction
