"""Fused-attention kernel throughput as measured curves: sequence length, head dim, mask, pass, GPU.

The attention term of the roofline (``timing._pass_time_s``) divides the attention FLOPs of a pass
by ``peak · η_attn``. η_attn is read here from the kernels' own published benchmarks, stored with
their figure numbers in ``trainplan/hardware/data/attention.toml``:

* FlashAttention-2, FlashAttention-3 and cuDNN fused attention on the H100 SXM5, BF16: Shah et al.
  2024, "FlashAttention-3" (arXiv:2407.08608), Fig. 5 (forward; head dim 64/128/256; with and
  without a causal mask) and Fig. 6 (backward; head dim 64/128; no mask), sequence 512–16k.
* FlashAttention-2 on the A100: Dao 2023, "FlashAttention-2" (arXiv:2307.08691), abstract and
  Sec. 4.1 (forward up to 73% of peak), with the H100 curve's shape of the same sm80 kernel.

Which kernel runs depends on the stack and the generation (the data file's ``[[generation]]``
tables): Transformer Engine (Megatron-Core, NeMo) selects cuDNN fused attention on Hopper and
later, PyTorch SDPA / flash-attn (torchtitan, torchtune, llm-foundry with attn_impl: flash) FlashAttention-2;
llm-foundry's attn_impl: triton runs FlashAttention in Triton (``Recipe.triton_attention``, step 5).

How a point is read, each step named in :attr:`AttentionEfficiency.notes` when it applies:

1. sequence length: linear interpolation of TFLOP/s in log₂(seq) between the published points;
   outside 512–16k the nearest end point is held (extrapolated, stated);
2. a panel the figures do not contain is derived from the published ones by a ratio at the same
   sequence length: the causal backward is the unmasked backward times the forward's
   causal / unmasked ratio; head dim 256 without a mask is the masked curve times the head-dim-128
   unmasked / masked ratio; the head-dim-256 backward is the head-dim-128 backward times the
   forward's 256 / 128 ratio;
3. head dim: linear in log₂(d) between 64, 128 and 256; outside, the nearest one is held;
4. generation: the H100 fraction of peak times the generation's ``scale`` (1.951 on Ampere); a
   generation without its own published curve is marked ``assumed``;
5. a kernel published only as a speed ratio to one with curves (the data file's ``[[ratio]]``):
   that kernel's fraction times the pass's ratio. FlashAttention in Triton (the flash-attention
   repository's ``flash_attn_triton.py``, which llm-foundry's ``attn_impl: triton`` runs): Dao 2023
   Sec. 4.1 on the A100, FlashAttention-2 "around 1.3-1.5× faster [...] in the forward pass and
   around 2× faster in the backward pass", so 1/1.4 and 1/2 of FlashAttention-2. On generations
   the ratio was not measured on, the kernel is charged at the reference kernel's curve and the
   estimate says so (the A100 ratio carried to the H100 rows of llm-foundry made them worse:
   docs/timing.md).

Context parallelism (ring attention, Liu et al. 2023; Transformer Engine's load-balanced causal
split, ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``): each
rank attends with its s/cp queries to s/cp keys per ring step. Of a causal sequence's FLOPs on a
rank, the diagonal block (masked) is the share ``1/cp`` and the rest are unmasked blocks, so::

    1/η = (1/cp) / η_causal(s/cp) + (1 − 1/cp) / η_full(s/cp)        (:func:`ring_efficiency`)

The kernel length is taken as s/cp (the load-balanced split's half-chunk steps are s/(2cp) on one
side); that simplification is stated in the notes under cp > 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from trainplan.data_files import data_toml
from trainplan.errors import CatalogError

DATA_FILE: Final = "attention.toml"
KERNELS: Final = ("fa2", "fa3", "cudnn")
PASSES: Final = ("forward", "backward")
HEAD_DIMS: Final = (64, 128, 256)
_CURVE_KEYS: Final = frozenset({"kernel", "pass", "causal", "head_dim", "tflops", "source"})
_RATIO_KEYS: Final = frozenset({"kernel", "of", "forward", "backward", "measured_on", "source"})
RATIO_KERNELS: Final = ("triton",)
"""Kernels stored as a published speed ratio to a kernel with curves (the data file's ``[[ratio]]``)."""
_FP8_KEYS: Final = frozenset(
    {
        "generation",
        "gpu",
        "seq_len",
        "forward_causal",
        "backward_causal",
        "forward_full",
        "backward_full",
        "source",
    }
)
_GEN_KEYS: Final = frozenset(
    {"name", "default", "scale", "assumed", "source", "megatron", "pytorch", "deepspeed", "maxtext", "neuron"}
)


@dataclass(frozen=True)
class _Generation:
    name: str
    kernels: Mapping[str, str]  # stack -> kernel; "default" for the rest
    scale: float
    assumed: bool
    source: str


@dataclass(frozen=True)
class _Ratio:
    of: str
    passes: Mapping[str, float]  # pass -> fraction of the ``of`` kernel's throughput
    measured_on: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class _Fp8:
    """One generation's FP8 / BF16 attention measurement (the data file's ``[[fp8]]``)."""

    gpu: str
    seq_len: tuple[int, ...]
    # (pass, causal) -> (bf16 TFLOP/s, fp8 TFLOP/s) per sequence length
    tflops: Mapping[tuple[str, bool], tuple[tuple[float, ...], tuple[float, ...]]]
    source: str

    def ratio(self, pass_: str, causal: bool, seq: float) -> float:
        """FP8 / BF16 throughput of one pass at ``seq`` (interpolated in log₂ seq, ends held)."""
        bf16, fp8 = self.tflops[(pass_, causal)]
        return _interp_log(self.seq_len, [f / b for b, f in zip(bf16, fp8, strict=True)], seq)


@dataclass(frozen=True)
class _Table:
    peak_tflops: float
    seq_len: tuple[int, ...]
    curves: Mapping[tuple[str, str, bool, int], tuple[float, ...]]
    sources: Mapping[tuple[str, str, bool, int], str]
    generations: Mapping[str, _Generation]
    ratios: Mapping[str, _Ratio]
    fp8: Mapping[str, _Fp8]


@functools.cache
def _load() -> _Table:
    """Parse and check the data file once."""
    doc = data_toml("trainplan.hardware", "data", DATA_FILE)
    where = DATA_FILE
    peak = doc.get("peak_tflops")
    seq = doc.get("seq_len")
    if not isinstance(peak, int | float) or isinstance(peak, bool) or peak <= 0:
        raise CatalogError("peak_tflops", f"{where}: must be a positive number, got {peak!r}")
    if (
        not isinstance(seq, list)
        or len(seq) < 2
        or not all(isinstance(s, int) and s > 0 for s in seq)
        or sorted(set(seq)) != seq
    ):
        raise CatalogError("seq_len", f"{where}: must be increasing positive integers, got {seq!r}")
    curves: dict[tuple[str, str, bool, int], tuple[float, ...]] = {}
    sources: dict[tuple[str, str, bool, int], str] = {}
    for entry in doc.get("curve", []):
        unknown = set(entry) - _CURVE_KEYS
        if unknown:
            raise CatalogError(
                sorted(unknown)[0], f"{where}: unknown [[curve]] key; allowed: {sorted(_CURVE_KEYS)}"
            )
        kernel, pass_, causal, d = (
            entry.get("kernel"),
            entry.get("pass"),
            entry.get("causal"),
            entry.get("head_dim"),
        )
        if kernel not in KERNELS or pass_ not in PASSES or not isinstance(causal, bool) or d not in HEAD_DIMS:
            raise CatalogError("curve", f"{where}: bad curve key ({kernel!r}, {pass_!r}, {causal!r}, {d!r})")
        key = (str(kernel), str(pass_), causal, int(d))
        values = entry.get("tflops")
        if (
            not isinstance(values, list)
            or len(values) != len(seq)
            or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= peak for v in values
            )
        ):
            raise CatalogError("tflops", f"{where}, curve {key}: need {len(seq)} values in (0, peak]")
        if key in curves:
            raise CatalogError("curve", f"{where}: curve {key} defined twice")
        curves[key] = tuple(float(v) for v in values)
        sources[key] = str(entry.get("source", ""))
    for kernel in KERNELS:  # what the derivations of _panel need
        for needed in (
            (kernel, "forward", True, 64),
            (kernel, "forward", False, 64),
            (kernel, "forward", True, 128),
            (kernel, "forward", False, 128),
            (kernel, "forward", True, 256),
            (kernel, "backward", False, 64),
            (kernel, "backward", False, 128),
        ):
            if needed not in curves:
                raise CatalogError("curve", f"{where}: missing curve {needed}")
    gens: dict[str, _Generation] = {}
    for entry in doc.get("generation", []):
        unknown = set(entry) - _GEN_KEYS
        if unknown:
            raise CatalogError(sorted(unknown)[0], f"{where}: unknown [[generation]] key")
        name = entry.get("name")
        kernels = {k: str(v) for k, v in entry.items() if k not in ("name", "scale", "assumed", "source")}
        scale = entry.get("scale")
        if (
            not isinstance(name, str)
            or "default" not in kernels
            or any(v not in KERNELS for v in kernels.values())
        ):
            raise CatalogError(
                "generation", f"{where}: generation {name!r} needs a default kernel of {KERNELS}"
            )
        if not isinstance(scale, int | float) or isinstance(scale, bool) or scale <= 0:
            raise CatalogError("scale", f"{where}, generation {name}: must be a positive number")
        gens[name] = _Generation(
            name, kernels, float(scale), bool(entry.get("assumed")), str(entry.get("source"))
        )
    ratios: dict[str, _Ratio] = {}
    for entry in doc.get("ratio", []):
        unknown = set(entry) - _RATIO_KEYS
        if unknown:
            raise CatalogError(
                sorted(unknown)[0], f"{where}: unknown [[ratio]] key; allowed: {sorted(_RATIO_KEYS)}"
            )
        kernel, of, measured = entry.get("kernel"), entry.get("of"), entry.get("measured_on")
        passes = {p: entry.get(p) for p in PASSES}
        if (
            kernel not in RATIO_KERNELS
            or of not in KERNELS
            or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1 for v in passes.values()
            )
            or not isinstance(measured, list)
        ):
            raise CatalogError(
                "ratio",
                f"{where}: [[ratio]] {kernel!r} needs of in {KERNELS}, forward and backward in (0, 1]",
            )
        ratios[str(kernel)] = _Ratio(
            str(of),
            MappingProxyType({p: float(v) for p, v in passes.items()}),
            tuple(str(g) for g in measured),
            str(entry.get("source", "")),
        )
    if "other" not in gens:
        raise CatalogError("generation", f"{where}: needs the 'other' generation (the stated fallback)")
    fp8: dict[str, _Fp8] = {}
    for entry in doc.get("fp8", []):
        unknown = set(entry) - _FP8_KEYS
        if unknown:
            raise CatalogError(
                sorted(unknown)[0], f"{where}: unknown [[fp8]] key; allowed: {sorted(_FP8_KEYS)}"
            )
        gen, lengths = entry.get("generation"), entry.get("seq_len")
        if gen not in gens or gen in fp8:
            raise CatalogError("fp8", f"{where}: [[fp8]] generation {gen!r} unknown or given twice")
        if not isinstance(lengths, list) or len(lengths) < 2 or sorted(set(lengths)) != lengths:
            raise CatalogError("seq_len", f"{where}, [[fp8]] {gen}: increasing sequence lengths")
        table: dict[tuple[str, bool], tuple[tuple[float, ...], tuple[float, ...]]] = {}
        for pass_ in PASSES:
            for causal, mask in ((True, "causal"), (False, "full")):
                pair = entry.get(f"{pass_}_{mask}")
                if (
                    not isinstance(pair, list)
                    or len(pair) != 2
                    or not all(
                        isinstance(row, list)
                        and len(row) == len(lengths)
                        and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in row)
                        for row in pair
                    )
                ):
                    raise CatalogError(
                        f"{pass_}_{mask}",
                        f"{where}, [[fp8]] {gen}: [[bf16 TFLOP/s], [fp8 TFLOP/s]] per sequence length",
                    )
                table[(pass_, causal)] = (tuple(map(float, pair[0])), tuple(map(float, pair[1])))
        fp8[str(gen)] = _Fp8(
            str(entry.get("gpu")), tuple(lengths), MappingProxyType(table), str(entry.get("source"))
        )
    return _Table(
        float(peak),
        tuple(seq),
        MappingProxyType(curves),
        MappingProxyType(sources),
        MappingProxyType(gens),
        MappingProxyType(ratios),
        MappingProxyType(fp8),
    )


def _interp_log(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Linear interpolation of ``ys`` in log₂(x); the end values are held outside ``xs``."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            t = (math.log2(x) - math.log2(xs[i - 1])) / (math.log2(xs[i]) - math.log2(xs[i - 1]))
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]  # pragma: no cover - the loop returns


def _panel(kernel: str, pass_: str, causal: bool, d: int, seq: float, derived: list[str]) -> float:
    """TFLOP/s of one published (or derived, module docstring step 2) panel at ``seq``."""
    tab = _load()

    def at(key: tuple[str, str, bool, int]) -> float:
        return _interp_log(tab.seq_len, tab.curves[key], seq)

    key = (kernel, pass_, causal, d)
    if key in tab.curves:
        return at(key)
    if pass_ == "forward":  # head dim 256 without a mask
        derived.append("forward at head dim 256 without a mask: the masked curve × the head-dim-128 ratio")
        return (
            at((kernel, "forward", True, 256))
            * at((kernel, "forward", False, 128))
            / at((kernel, "forward", True, 128))
        )
    if causal:
        derived.append("causal backward: the unmasked backward × the forward's causal / unmasked ratio")
        return (
            _panel(kernel, "backward", False, d, seq, derived)
            * _panel(kernel, "forward", True, d, seq, derived)
            / _panel(kernel, "forward", False, d, seq, derived)
        )
    derived.append("backward at head dim 256: the head-dim-128 backward × the forward's 256 / 128 ratio")
    return (
        at((kernel, "backward", False, 128))
        * _panel(kernel, "forward", False, 256, seq, derived)
        / at((kernel, "forward", False, 128))
    )


def kernel_for(generation: str, stack: str) -> tuple[str, str, bool]:
    """(kernel, generation table used, assumed) for a stack on an accelerator generation."""
    gens = _load().generations
    gen = gens.get(generation) or gens["other"]
    return gen.kernels.get(stack, gen.kernels["default"]), gen.name, gen.assumed


def kernel_fraction(
    kernel: str, generation: str, pass_: str, causal: bool, head_dim: int, seq_len: float
) -> tuple[float, tuple[str, ...]]:
    """(fraction of the dense BF16 peak, notes) of one attention kernel pass.

    Steps 1–4 of the module docstring; the notes name every derivation and extrapolation used.
    A kernel of :data:`RATIO_KERNELS` is the kernel it is published against times the published
    ratio of the pass (step 5 of the module docstring).
    """
    ratio = _load().ratios.get(kernel)
    if ratio is not None and pass_ in PASSES:
        base, base_notes = kernel_fraction(ratio.of, generation, pass_, causal, head_dim, seq_len)
        gen_name = (_load().generations.get(generation) or _load().generations["other"]).name
        if gen_name not in ratio.measured_on:
            return base, (
                *base_notes,
                f"{kernel} attention on {gen_name}: no published figure for this generation, charged at "
                f"{ratio.of}'s curve (assumed; the ratio is measured on {', '.join(ratio.measured_on)} only)",
            )
        note = (
            f"{kernel} attention: {ratio.passes[pass_]:g} x {ratio.of} in the {pass_} pass ({ratio.source})"
        )
        return base * ratio.passes[pass_], (*base_notes, note)
    if kernel not in KERNELS or pass_ not in PASSES:
        raise CatalogError("attention", f"unknown kernel {kernel!r} or pass {pass_!r}")
    if head_dim <= 0 or seq_len <= 0:
        raise CatalogError("attention", f"head_dim and seq_len must be positive, got {head_dim}, {seq_len}")
    tab = _load()
    gens = tab.generations
    gen = gens.get(generation) or gens["other"]
    notes: list[str] = []
    derived: list[str] = []
    lo, hi = tab.seq_len[0], tab.seq_len[-1]
    if seq_len < lo or seq_len > hi:
        notes.append(
            f"attention at sequence {seq_len:g} is outside the published {lo}-{hi}: the "
            f"{'shortest' if seq_len < lo else 'longest'} point is held (extrapolated)"
        )
    d = float(head_dim)
    if d < HEAD_DIMS[0] or d > HEAD_DIMS[-1]:
        notes.append(
            f"head dim {head_dim} is outside the published 64-256: the nearest is held (extrapolated)"
        )
    clamped = min(max(d, HEAD_DIMS[0]), HEAD_DIMS[-1])
    upper = next(x for x in HEAD_DIMS if x >= clamped)
    lower = max(x for x in HEAD_DIMS if x <= clamped)
    if lower == upper:
        tflops = _panel(kernel, pass_, causal, lower, seq_len, derived)
    else:
        ends = [_panel(kernel, pass_, causal, x, seq_len, derived) for x in (lower, upper)]
        tflops = _interp_log((lower, upper), ends, clamped)
    for msg in dict.fromkeys(derived):
        notes.append(f"{kernel} {msg} (not published)")
    if gen.assumed:
        notes.append(f"attention kernel efficiency: {gen.source}")
    return min(1.0, tflops * gen.scale / tab.peak_tflops), tuple(notes)


def ring_efficiency(eta_causal: float, eta_full: float, cp: int) -> float:
    """η of a causal sequence's attention on one rank of a cp-way ring (module docstring)."""
    share = 1.0 / cp
    return 1.0 / (share / eta_causal + (1.0 - share) / eta_full)


@dataclass(frozen=True, kw_only=True)
class AttentionEfficiency:
    """η_attn of the forward (and recompute) and of the backward pass, with how they were read."""

    forward: float
    backward: float
    kernel: str
    generation: str
    assumed: bool
    notes: tuple[str, ...]


@functools.cache
def attention_efficiency(
    generation: str,
    stack: str,
    head_dim: int,
    seq_len: int,
    cp: int = 1,
    causal: bool = True,
    kernel: str | None = None,
    fp8: bool = False,
) -> AttentionEfficiency:
    """η_attn per pass of a stack's fused attention kernel on a generation, for a causal (default)
    sequence of ``seq_len`` tokens split over ``cp`` ranks (:func:`ring_efficiency`). ``kernel``
    names the kernel the run selected instead of the stack's (``triton``: :data:`RATIO_KERNELS`).

    ``fp8``: the kernel runs in FP8 (Transformer Engine's FP8 dot-product attention): each pass's
    fraction of the BF16 peak is the BF16 one times the FP8 / BF16 throughput ratio cuDNN's
    benchmark measures on the generation (the data file's ``[[fp8]]``, :func:`fp8_generations`),
    at the kernel's sequence length, masked and unmasked alike under a ring. A generation without
    such a measurement raises."""
    if cp < 1 or seq_len < cp:
        raise CatalogError("cp", f"cp must be in [1, seq_len], got {cp} for sequence {seq_len}")
    own_kernel, gen, assumed = kernel_for(generation, stack)
    if kernel is not None:
        ratio = _load().ratios.get(kernel)
        if ratio is None and kernel not in KERNELS:
            raise CatalogError("attention", f"unknown attention kernel {kernel!r}")
        if ratio is not None:
            assumed = assumed or gen not in ratio.measured_on
        own_kernel = kernel
    kernel = own_kernel
    length = seq_len / cp
    notes: list[str] = []
    etas: list[float] = []
    measured = _load().fp8.get(gen) if fp8 else None
    if fp8:
        if measured is None:
            raise CatalogError(
                "fp8_attention",
                f"no FP8 attention measurement for the {gen} generation (published: "
                f"{', '.join(fp8_generations())}); drop --fp8-attention",
            )
        notes.append(
            f"FP8 attention: the BF16 kernel's fraction times cuDNN's FP8 / BF16 ratio per pass, measured on "
            f"{measured.gpu}" + ("" if head_dim == 128 else f" (head dim 128's ratio at head dim {head_dim})")
        )

    def fraction(pass_: str, masked: bool) -> float:
        eta, more = kernel_fraction(kernel, gen, pass_, masked, head_dim, length)
        notes.extend(more)
        return eta * measured.ratio(pass_, masked, length) if measured is not None else eta

    for pass_ in PASSES:
        own = fraction(pass_, causal)
        if cp > 1 and causal:
            own = ring_efficiency(own, fraction(pass_, False), cp)
        etas.append(own)
    if cp > 1 and causal:
        notes.append(
            f"ring attention over cp={cp}: 1/{cp} of the FLOPs in masked diagonal blocks, the rest unmasked, "
            f"each at kernel length {length:g} (seq/cp)"
        )
    return AttentionEfficiency(
        forward=etas[0],
        backward=etas[1],
        kernel=kernel,
        generation=gen,
        assumed=assumed,
        notes=tuple(dict.fromkeys(notes)),
    )


def fp8_generations() -> tuple[str, ...]:
    """The generations with a measured FP8 / BF16 attention ratio (the data file's ``[[fp8]]``)."""
    return tuple(_load().fp8)


def curve_sources() -> dict[str, str]:
    """The figure each stored curve was read from, keyed ``kernel/pass/causal|full/d<head dim>``."""
    tab = _load()
    return {f"{k}/{p}/{'causal' if c else 'full'}/d{d}": src for (k, p, c, d), src in tab.sources.items()}


__all__ = [
    "RATIO_KERNELS",
    "AttentionEfficiency",
    "attention_efficiency",
    "curve_sources",
    "fp8_generations",
    "kernel_for",
    "kernel_fraction",
    "ring_efficiency",
]
