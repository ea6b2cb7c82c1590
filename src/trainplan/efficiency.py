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

Small and skinny GEMMs (``gemm_shapes.toml``, GH100 devices): a measured table of BF16 GEMM
throughput over m, n, k = 256..4096 (OpenXLA's default matmul table, sm_90) shows two effects the
tile and wave factors alone miss: a fixed cost per output tile that a short ``k`` loop does not
amortise (k = 256 runs at half the rate of k = 4096), and under-filled launches (fewer tiles than
SMs) that cuBLAS fills by splitting ``k`` across SMs rather than idling them. With ``s`` = split
factor and ``W`` = waves of tiles (:func:`mainloop_fraction`)::

    s = max(1, units // tiles)      (1 when the tiles fill the SMs)
    f = wave_fraction(s·tiles) · k' / (k' + a + b / W),   k' = k / s,  W = s·tiles / units

``a`` and ``b`` (in units of k) are fitted to that table (:func:`fit_k_overhead`; a test re-fits
them): the per-tile prologue/epilogue, part of it hidden when an SM runs several tiles. The
efficiency is ``gemm_max`` × tile fraction × ``f`` / ``f`` of the shape ``gemm_max`` was measured
at, capped at ``gemm_max``. Other devices (no such table) keep the tile and wave factors only, and
their small-``k`` cost is not modelled (stated in docs/efficiency.md).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from trainplan.data_files import data_toml
from trainplan.errors import CatalogError

DATA_FILE: Final = "efficiency.toml"
SHAPES_FILE: Final = "gemm_shapes.toml"
K_OVERHEAD_DTYPES: Final = ("bf16", "fp16")
"""The dtypes the small-shape table measures (BF16; FP16 runs the same kernels). Others keep the
tile and wave factors only."""

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
        "gemm_shapes",
        "grouped_gemm_tile_rows",
        "grouped_gemm_source",
        "devices_per_chip",
        "devices_source",
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
    k_overhead: tuple[float, float] | None = None  # (a, b) of :func:`mainloop_fraction`, in k elements
    reference_shapes: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # gemm_max's m, n, k
    grouped_gemm_tile_rows: int | None = None  # row tile of a packed-group (megablox-style) kernel
    devices_per_chip: int = 1  # kernel-launching devices one catalog chip is (TPU7x: 2 TensorCores)

    def __post_init__(self) -> None:
        where = f"efficiency '{self.name}'"
        for dtype, value in self.gemm_efficiency_max.items():
            _fraction(f"gemm_efficiency_max.{dtype}", value, where)
        _fraction("memory_bandwidth_efficiency", self.memory_bandwidth_efficiency, where)
        for key in ("compute_units", "tile_m", "tile_n", "grouped_gemm_tile_rows", "devices_per_chip"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise CatalogError(key, f"{where}: must be a positive integer or absent, got {value!r}")
        if (self.tile_m is None) != (self.tile_n is None):
            raise CatalogError("tile_m", f"{where}: give both tile_m and tile_n, or neither")
        object.__setattr__(self, "gemm_efficiency_max", MappingProxyType(dict(self.gemm_efficiency_max)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "reference_shapes", MappingProxyType(dict(self.reference_shapes)))

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
    """One measured or borrowed fraction with its citation (and, for a GEMM, its m, n, k)."""

    fraction: float
    source: str
    measured: bool
    shape: tuple[int, int, int] | None = None


def _read_document() -> dict[str, object]:
    return data_toml("trainplan.hardware", "data", DATA_FILE)


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
    return _Figure(fraction, cite, True, _shape(table.get("shape")) if kind == "gemm" else None), None


def _shape(text: object) -> tuple[int, int, int] | None:
    """``"MxNxK"`` as integers, or None when the entry states no such shape."""
    parts = str(text).lower().split("x") if isinstance(text, str) else []
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        return None
    m, n, k = (int(p) for p in parts)
    return m, n, k


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
        return _Figure(got.fraction, f"borrowed from {sibling}: {got.source}", False, got.shape)

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
        gemm_values = {d: f.fraction for d, f in gemm_fig.items()}
        if not gemm_fig:  # an entry for its other figures only: the fleet GEMM defaults, as for no entry
            gemm_values = dict(gemm_default)
            sources.update({f"gemm.{d}": _GEMM_DEFAULT_NOTE for d in gemm_values})
        if "bf16" not in gemm_fig:
            assumed.append("gemm_efficiency_max.bf16")
            sources["gemm.bf16"] = _GEMM_DEFAULT_NOTE
        for key, src in (
            ("compute_units", "units_source"),
            ("tile", "tile_source"),
            ("grouped_gemm", "grouped_gemm_source"),
            ("devices_per_chip", "devices_source"),
        ):
            if src in entry:
                sources[key] = _string(entry, src, f"{DATA_FILE}, device '{name}'")
        notes = entry.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise CatalogError("notes", f"{DATA_FILE}, device '{name}': must be a list of strings")
        wave = entry.get("wave_quantization", True)
        if not isinstance(wave, bool):
            raise CatalogError("wave_quantization", f"{DATA_FILE}, device '{name}': must be true or false")
        shapes_of = entry.get("gemm_shapes")
        k_overhead = None
        if shapes_of is not None:
            table = _gemm_shapes().get(str(shapes_of))
            if table is None:
                raise CatalogError(
                    "gemm_shapes", f"{DATA_FILE}, device '{name}': no table '{shapes_of}' in {SHAPES_FILE}"
                )
            k_overhead = table.k_overhead
            sources["k_overhead"] = (
                f"{table.source}; fitted a = {k_overhead[0]:g}, b = {k_overhead[1]:g} (k elements)"
            )
        result[name] = DeviceEfficiency(
            name=name,
            k_overhead=k_overhead,
            reference_shapes={d: f.shape for d, f in gemm_fig.items() if f.shape is not None},
            gemm_efficiency_max=gemm_values,
            memory_bandwidth_efficiency=mem_value,
            compute_units=_opt_int(entry, "compute_units"),
            tile_m=_opt_int(entry, "tile_m"),
            tile_n=_opt_int(entry, "tile_n"),
            grouped_gemm_tile_rows=_opt_int(entry, "grouped_gemm_tile_rows"),
            devices_per_chip=_opt_int(entry, "devices_per_chip") or 1,
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


@dataclass(frozen=True)
class GemmShapes:
    """One measured small-shape table of ``gemm_shapes.toml`` and its stored fit."""

    name: str
    units: int
    tile_m: int
    tile_n: int
    points: tuple[tuple[int, int, int, int, float], ...]  # b, m, n, k, TFLOP/s
    k_overhead: tuple[float, float]  # (a, b), fitted by fit_k_overhead and stored
    source: str


@functools.cache
def _gemm_shapes() -> Mapping[str, GemmShapes]:
    doc = data_toml("trainplan.hardware", "data", SHAPES_FILE)
    out: dict[str, GemmShapes] = {}
    for entry in doc.get("device", []):
        where = f"{SHAPES_FILE}, device '{entry.get('name', '?')}'"
        name = _string(entry, "name", where)
        points = entry.get("points")
        tile = entry.get("tile")
        ko = entry.get("k_overhead")
        if (
            not isinstance(points, list)
            or not points
            or not all(
                isinstance(p, list) and len(p) == 5 and all(isinstance(v, int | float) and v > 0 for v in p)
                for p in points
            )
        ):
            raise CatalogError("points", f"{where}: a list of [b, m, n, k, TFLOP/s] with positive values")
        if not (isinstance(tile, list) and len(tile) == 2) or not (isinstance(ko, list) and len(ko) == 2):
            raise CatalogError("tile", f"{where}: needs tile = [m, n] and k_overhead = [a, b]")
        out[name] = GemmShapes(
            name=name,
            units=int(_number(entry, "units", where)),
            tile_m=int(tile[0]),
            tile_n=int(tile[1]),
            points=tuple((int(b), int(m), int(n), int(k), float(t)) for b, m, n, k, t in points),
            k_overhead=(float(ko[0]), float(ko[1])),
            source=_string(entry, "source", where),
        )
    return MappingProxyType(out)


def gemm_shape_tables() -> Mapping[str, GemmShapes]:
    """The measured small-shape tables by name (``gemm_shapes.toml``)."""
    return _gemm_shapes()


def mainloop_fraction(tiles: int, k: int, units: int, a: float, b: float) -> float:
    """Wave and per-tile-overhead share of a GEMM of ``tiles`` output tiles and depth ``k`` (module
    docstring): an under-filled launch is split along k into ``s = units // tiles`` parts (split-K,
    CUTLASS ``media/docs/efficient_gemm.md``, "Parallelized reductions"), then each SM's tiles pay
    ``a + b / W`` k-steps of prologue and epilogue beside their ``k'`` k-steps of work."""
    split = max(1, units // tiles) if tiles < units else 1
    spread = tiles * split
    depth = k / split
    waves = spread / units
    return wave_fraction(spread, units) * depth / (depth + a + b / waves)


def fit_k_overhead(table: GemmShapes) -> tuple[float, float, float]:
    """(a, b, rms log error) of :func:`mainloop_fraction` fitted to a measured table.

    Measured TFLOP/s = R · tile_fraction · mainloop_fraction(a, b) with R the best log-mean scale;
    (a, b) by grid search (a step 4 up to 400, b step 10 up to 1500, in k elements), least squares
    on the log ratio. A batched GEMM of b × (m × k) @ (k × n) has b times the tiles of one.
    """
    rows = []
    for bt, m, n, k, tflops in table.points:
        tiles = bt * math.ceil(m / table.tile_m) * math.ceil(n / table.tile_n)
        rows.append(
            (tiles, k, math.log(tflops * 1e12) - math.log(tile_fraction(m, n, table.tile_m, table.tile_n)))
        )
    best = (math.inf, 0.0, 0.0)
    for ia in range(0, 101):
        for ib in range(0, 151):
            a, b = 4.0 * ia, 10.0 * ib
            resid = [y - math.log(mainloop_fraction(t, k, table.units, a, b)) for t, k, y in rows]
            mean = sum(resid) / len(resid)
            err = sum((r - mean) ** 2 for r in resid) / len(resid)
            if err < best[0]:
                best = (err, a, b)
    return best[1], best[2], math.sqrt(best[0])


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


def packed_group_fraction(rows: float, groups: float, tile_rows: int) -> float:
    """Useful share of the row tiles a packed-group grouped GEMM computes.

    A megablox-style grouped matmul (JAX ``pallas/ops/tpu/megablox/gmm.py``; tokamax
    ``ragged_dot`` ``pallas_mosaic_tpu_kernel.py`` ``make_group_metadata``) stores the ``rows``
    rows of all ``groups`` groups back to back, sorted by group, and walks them in tiles of
    ``tile_rows``. A tile that a group boundary crosses is computed once for each group it holds,
    as a whole tile, and masked on store: ``tiles_m <= Σ group_tiles <= tiles_m + groups − 1``
    (the kernel's own comment). Routed tokens (balanced or random) put nearly every boundary
    inside a tile, so a call computes ``rows + (groups − 1)·tile_rows`` rows of work for ``rows``
    useful ones. Returns ``rows / (rows + (groups − 1)·tile_rows)``; 1 for one group.
    """
    if groups <= 1 or rows <= 0:
        return 1.0
    return rows / (rows + (groups - 1.0) * tile_rows)


def gemm_efficiency(eff: DeviceEfficiency, m: int, n: int, k: int, dtype: str) -> float:
    """Achieved fraction of the dense peak for one (m x k) @ (k x n) GEMM in ``dtype``.

    ``eff.gemm_max(dtype)`` (best measured large-GEMM fraction) x tile-quantization fraction x
    wave-quantization fraction, the last two only when the chip's tile (and unit count) are
    known. With a measured small-shape table (``eff.k_overhead``, BF16/FP16) the wave factor is
    :func:`mainloop_fraction` instead (split-K of under-filled launches, per-tile overhead of a
    short ``k``), relative to its value at the shape ``gemm_max`` was measured at and capped at 1,
    so a large GEMM returns ``gemm_max``. Otherwise ``k`` is validated but does not enter.
    """
    for label, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CatalogError(f"gemm.{label}", f"must be a positive integer, got {value!r}")
    fraction = eff.gemm_max(dtype)
    if eff.tile_m is None or eff.tile_n is None:
        return fraction
    fraction *= tile_fraction(m, n, eff.tile_m, eff.tile_n)
    tiles = math.ceil(m / eff.tile_m) * math.ceil(n / eff.tile_n)
    ref = eff.reference_shapes.get("bf16")
    if eff.k_overhead is not None and eff.compute_units is not None and dtype in K_OVERHEAD_DTYPES and ref:
        a, b = eff.k_overhead
        rm, rn, rk = ref
        ref_tiles = math.ceil(rm / eff.tile_m) * math.ceil(rn / eff.tile_n)
        ratio = mainloop_fraction(tiles, k, eff.compute_units, a, b) / mainloop_fraction(
            ref_tiles, rk, eff.compute_units, a, b
        )
        return fraction * min(1.0, ratio)
    if eff.wave_quantization and eff.compute_units is not None:
        fraction *= wave_fraction(tiles, eff.compute_units)
    return fraction
