"""Step time as a visible sum of named terms.

For the busiest pipeline stage, one device, one optimizer step with m micro-batches::

    step_s = compute_s                      m · (forward + backward + recompute) of the stage
           + exposed_tp_s + exposed_ep_s    tensor / expert parallel collectives (critical path;
                                            --tp-comm-overlap: only what the GEMMs do not hide)
           + exposed_cp_s                   context-parallel K/V exchange not hidden by attention
           + pp_p2p_s                       pipeline activation sends (--pp-comm-overlap: only
                                            what exceeds the stage's compute)
           + exposed_dp_s                   data-parallel / ZeRO traffic not hidden by compute
           + bubble_s                       pipeline fill and drain (schedule-dependent)
           + grad_accum_s                   summing the micro-batches' gradients outside the GEMMs
                                            (memory-bound; ``grad_accumulation_bytes``)
           + optimizer_s                    the optimizer update (memory-bound), on the device
           + offload_s                      host-link transfers and the CPU step under offload

Compute is a roofline per op class (Williams et al. 2009, "Roofline"), with efficiencies measured
by microbenchmarks, never fitted to end-to-end runs (``efficiency.py``, docs/efficiency.md):

    GEMM       flops / (peak[dtype] · η_gemm(m, n, k))     η_gemm: best large-GEMM fraction × tile
                                                           and wave quantization of each shape
                                                           (FP8/FP4 recipes: the LM head at the
                                                           activation dtype, ``Peaks``)
    attention  flops / (peak[act] · η_attn[pass])          η_attn: the stack's fused-attention kernel
                                                           (FA2 / FA3 / cuDNN) at the pass's
                                                           sequence length, head dim and mask, from
                                                           the kernels' published curves
                                                           (``attention.py``); act = the activation
                                                           dtype (BF16 under FP8/FP4 recipes)
    memory     bytes / (HBM bandwidth · η_bw)              norms, activations, softmax, rotary,
                                                           residuals, MoE permutation, loss

FLOPs and bytes come from ``flops.py`` (per device, per stage, per micro-batch), collectives from
``comm.py`` (alpha-beta on the two-level network). Pipeline bubbles (Narayanan et al. 2021
Sec. 2.2; Qi et al. 2023 for zero bubble)::

    1f1b         (p − 1) · t_slot
    interleaved  (p − 1) · t_slot / v
    zb (ZB-H1)   (p − 1) · t_slot / 3      (T_F + T_B − T_W with T_F ≈ T_B ≈ T_W; Qi et al. Sec. 3)

    t_slot = t_mb + (exposed_tp_s + exposed_ep_s + pp_p2p_s) / m   one micro-batch on a stage
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from trainplan.attention import AttentionEfficiency, attention_efficiency
from trainplan.comm import Collective, group_placement, step_collectives
from trainplan.data_files import data_toml
from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.efficiency import DeviceEfficiency, gemm_efficiency, get_efficiency, packed_group_fraction
from trainplan.errors import LayoutError
from trainplan.flops import (
    DROPLESS,
    MoEGemmRouting,
    PassCost,
    StageFlops,
    causal_pairs,
    device_flops,
    layer_gemms,
    moe_gemm_routing,
    optimizer_update_bytes,
    step_flops,
)
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import MemoryBreakdown, memory_breakdown
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.num import Bool, Int, Num, all_true, as_float, maximum, minimum, total, where
from trainplan.recipe import OFFLOADS, Recipe, fp32_main_grad, reruns_forward_hooks
from trainplan.sharding import layer_kinds
from trainplan.terms import RLHF_TERM_KEYS, TIME_TERMS

GENERATION: Final[dict[str, str]] = {
    "a100-40gb": "ampere",
    "a100-80gb": "ampere",
    "a800": "ampere",
    "rtx-a6000": "ampere",
    "rtx-3090": "ampere",
    "a10g": "ampere",
    "rtx-4090": "ada",
    "l40s": "ada",
    "l4": "ada",
    "h100-sxm": "hopper",
    "h100-pcie": "hopper",
    "h200": "hopper",
    "h800": "hopper",
    "h20": "hopper",
    "b200": "blackwell",
    "b300": "blackwell",
    "gb200": "blackwell",
    "gb300": "blackwell",
    "mi250x": "cdna2",
    "mi300x": "cdna3-750w",
    "mi325x": "cdna3-1000w",
    "mi350x": "cdna4-1000w",
    "mi355x": "cdna4-1400w",
    "tpu-v4": "tpu",
    "tpu-v5e": "tpu",
    "tpu-v5p": "tpu",
    "tpu-v6e": "tpu",
    "tpu-v7": "tpu",
    "trn1": "trainium",
    "trn2": "trainium",
    "trn2-ultraserver": "trainium",
    "trn3": "trainium",
    "gaudi2": "gaudi",
    "gaudi3": "gaudi",
}
"""Accelerator generations: the unit of the calibrated κ (and, for NVIDIA, of the attention-kernel
efficiency, ``attention.toml``). NVIDIA GPUs by architecture. AMD GPUs by architecture and board power: the MI300X
(750 W) and MI325X (1,000 W) share CDNA 3 and its peak, the MI350X (1,000 W) and MI355X (1,400 W)
CDNA 4, but the same MLPerf LoRA run is 1.34x faster on the MI325X and 1.21x on the MI355X —
sustained clocks under load, which κ carries, differ with the power envelope; the MI250X's CDNA 2
is fitted on LUMI's Megatron-DeepSpeed runs). Google TPUs and AWS Trainium chips as one generation
each, because their κ measures a compiler stack (XLA, Neuron) rather than one chip: it is fitted
on TPU v5p / v6e and on Trn1 runs and used for every chip of the family (the kernel efficiencies
stay per chip, ``efficiency.toml``). Intel Gaudi chips likewise form one generation: their κ
measures Intel's Gaudi software stack (graph compiler, Megatron-DeepSpeed), fitted on Intel's
published Gaudi 2 runs and used for Gaudi 3, which has no published training run with its
configuration (its kernel efficiencies stay its own). The GA102 parts (RTX A6000, RTX 3090, A10G; sm_86) take the
Ampere κ and attention curves of the GA100 A100 (sm_80): the same CUDA 11 / cuBLAS / FlashAttention
Ampere kernels, a different die (:data:`OTHER_DIE`). The V100 (Volta) has no generation: no κ, no
attention curve, uncalibrated."""

OTHER_DIE: Final[frozenset[str]] = frozenset({"rtx-a6000", "rtx-3090", "a10g"})
"""Parts that share a calibrated generation's software (its κ and attention curves) on a die no
calibration row ran on: GA102 beside the GA100 of the Ampere rows. Their bands are never the
generation's calibrated ones (``bands.accelerator_family``: the consumer class)."""

NATIVE_STACK: Final[dict[str, str]] = {"tpu": "maxtext", "trainium": "neuron"}
"""The training stack each non-GPU generation's published runs use: XLA (MaxText) on TPU, the
Neuron SDK on Trainium. A request for another stack on these devices takes the native stack's
κ, and the estimate says so (a CUDA stack such as Megatron-Core does not run there)."""


@functools.cache
def _calibration() -> dict[tuple[str, str], float]:
    """(stack, generation) -> κ from ``calibration.toml`` (entries without a stack: Megatron)."""
    doc = data_toml("trainplan.hardware", "data", "calibration.toml")
    return {
        (str(g.get("stack", "megatron")), str(g["name"])): float(g["kappa"])
        for g in doc.get("generation", [])
    }


_KAPPA_OVERRIDE: ContextVar[tuple[tuple[str, str, float], ...]] = ContextVar("kappa_override", default=())


@contextlib.contextmanager
def kappa_override(stack: str, generation: str, kappa: float) -> Iterator[None]:
    """Evaluate with κ[stack, generation] = ``kappa`` inside the block: ``validate/calibrate.py``
    fits a stack on rows predicted through the whole estimate (the RL step's updates), where no
    ``kappa`` argument reaches ``step_time``."""
    token = _KAPPA_OVERRIDE.set((*_KAPPA_OVERRIDE.get(), (stack, generation, kappa)))
    try:
        yield
    finally:
        _KAPPA_OVERRIDE.reset(token)


def _overridden(stack: str, generation: str) -> float | None:
    for st, gen, k in reversed(_KAPPA_OVERRIDE.get()):
        if (st, gen) == (stack, generation):
            return k
    return None


def generation_vendor(generation: str) -> str:
    """The vendor whose software a generation's κ measures: ``amd`` for the CDNA generations,
    ``nvidia`` for Ampere, Ada, Hopper and Blackwell, the generation itself otherwise (TPU,
    Trainium, Gaudi: one generation per vendor)."""
    if generation.startswith("cdna"):
        return "amd"
    if generation in ("ampere", "ada", "hopper", "blackwell"):
        return "nvidia"
    return generation


def stack_ratio(stack: str, generation: str | None = None) -> float | None:
    """Geometric mean of κ[stack] / κ[megatron] over the generations where both are fitted: those of
    ``generation``'s vendor (:func:`generation_vendor`) when the vendor has one, else all. A
    vendor's PyTorch stack trails its Megatron stack by a measured amount of its own: on MI300X
    0.73 (torchtitan against AMD's MLPerf Megatron), on Ampere and Hopper 0.86-0.96."""
    cal = _calibration()
    pairs = [
        (g, k / cal[("megatron", g)]) for (st, g), k in cal.items() if st == stack and ("megatron", g) in cal
    ]
    if generation is not None:
        vendor = generation_vendor(generation)
        own = [(g, r) for g, r in pairs if generation_vendor(g) == vendor]
        pairs = own or pairs
    if not pairs:
        return None
    return math.exp(sum(math.log(r) for _, r in pairs) / len(pairs))


def kappa_source(accelerator_name: str, stack: str = "megatron") -> str:
    """How :func:`calibrated_kappa` got its value: "fitted", "ratio", "native" or "none"."""
    gen = GENERATION.get(accelerator_name, "")
    cal = _calibration()
    if (stack, gen) in cal or _overridden(stack, gen) is not None:
        return "fitted"
    if ("megatron", gen) in cal and stack_ratio(stack, gen) is not None:
        return "ratio"
    if (NATIVE_STACK.get(gen, ""), gen) in cal:
        return "native"
    return "none"


def calibrated_kappa(accelerator_name: str, stack: str = "megatron") -> float | None:
    """κ of the device's generation for the training stack (``validate/calibrate.py``), or None.

    Fitted where the stack has calibration rows on that generation; otherwise the Megatron κ of
    the generation times the stack's mean ratio to Megatron over the generations fitted for both
    (:func:`stack_ratio`, the vendor's own generations where it has any); on a TPU or Trainium generation, the κ of its native stack
    (:data:`NATIVE_STACK`); None when none of these is fitted.
    """
    gen = GENERATION.get(accelerator_name, "")
    cal = _calibration()
    over = _overridden(stack, gen)
    if over is not None:
        return over
    if (stack, gen) in cal:
        return cal[(stack, gen)]
    base = cal.get(("megatron", gen))
    ratio = stack_ratio(stack, gen)
    if base is not None and ratio is not None:
        return base * ratio
    return cal.get((NATIVE_STACK.get(gen, ""), gen))


EAGER_ATTENTION_EFFICIENCY_FACTOR: Final = 0.5
"""Batched QKᵀ / PV GEMMs of eager attention have k = d = 64..128: short reductions that
run at about half the large-GEMM rate. Assumption (k-dependence is not published per device)."""

HOST_MEMORY_BYTES_PER_S: Final = 100e9
"""Achievable CPU memory bandwidth available to one device's CPU optimizer step (a dual-socket
server streams ~200–400 GB/s, shared by its 8 devices). Assumption, stated; ZeRO-Offload (Ren et
al. 2021, Sec. 5) shows the CPU Adam step is memory-bandwidth bound."""


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """Seconds per optimizer step for the busiest device; ``step_s`` is the sum of the terms."""

    compute_s: float
    forward_s: float
    backward_s: float
    recompute_s: float
    exposed_tp_s: float
    exposed_ep_s: float
    exposed_cp_s: float
    pp_p2p_s: float
    exposed_dp_s: float
    bubble_s: float
    optimizer_s: float
    offload_s: float
    micro_batches: int
    stage: int
    gemm_efficiency: float  # FLOP-weighted η_gemm of the stage's GEMMs
    kappa: float  # training-stack factor applied to compute (1 = uncalibrated)
    grad_accum_s: float = 0.0  # summing the micro-batches' gradients outside the GEMMs
    # RLHF terms (terms.RLHF_TERM_KEYS): 0 for a training step, filled by rlhf.estimate_rlhf
    rollout_prefill_s: float = 0.0
    rollout_decode_s: float = 0.0
    scoring_s: float = 0.0
    critic_update_s: float = 0.0
    weight_sync_s: float = 0.0
    phase_reload_s: float = 0.0
    collectives: tuple[Collective, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def terms(self) -> list[tuple[str, float]]:
        """(label, seconds) of every term of :data:`trainplan.terms.TIME_TERMS`, in order."""
        return [(t.label, getattr(self, t.key)) for t in TIME_TERMS]

    @functools.cached_property
    def step_s(self) -> float:
        """The terms' sum (computed once: the fields are frozen)."""
        return sum(v for _, v in self.terms())

    def to_dict(self) -> dict[str, object]:
        return {
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            **{t.key: getattr(self, t.key) for t in TIME_TERMS},
            "micro_batches": self.micro_batches,
            "stage": self.stage,
            "gemm_efficiency": self.gemm_efficiency,
            "kappa": self.kappa,
            "notes": list(self.notes),
        }


def stage_kind_counts(model: ModelSpec, layers: tuple[int, ...]) -> tuple[tuple[bool, int], ...]:
    """(MoE?, number of layers) of each kind of layer among ``layers``, dense first: what
    :func:`_stage_gemm_efficiency` depends on of a stage (the key its callers cache η by). A stage
    of one kind has the η of one of its layers whatever their number: its count is given as 1."""
    kinds = layer_kinds(model, layers)
    if len(kinds) == 1:
        return ((model.is_moe_layer(kinds[0][0]), 1),)
    return tuple((model.is_moe_layer(rep), n) for rep, n in kinds)


def _stage_gemm_efficiency(
    model: ModelSpec,
    layers: tuple[int, ...],
    tokens: int,
    layout: Layout,
    eff: DeviceEfficiency,
    dtype: str,
    routing: MoEGemmRouting = DROPLESS,
) -> float:
    """FLOP-weighted harmonic mean of η_gemm over the stage's forward GEMM shapes.

    Time = Σ flops_i / (peak·η_i) = (Σ flops_i) / (peak·η) with η = Σ flops_i / Σ (flops_i/η_i),
    the sum over every layer of the stage: each kind of layer (dense, MoE) weighted by its number
    of layers (``sharding.layer_kinds``). Backward GEMMs (dX, dW) have the same FLOPs with permuted
    shapes; they are charged the forward shape's efficiency (the measured maximum is
    shape-agnostic beyond quantization).

    On a device whose grouped matmul packs the groups (``DeviceEfficiency.grouped_gemm_tile_rows``:
    the TPU megablox / tokamax kernels), each routed-expert GEMM is one call per device over the
    rows of all its local experts, and the tiles its group boundaries cross are computed once per
    group (:func:`~trainplan.efficiency.packed_group_fraction`); its backward calls (the input
    gradient gmm and the weight-gradient tgmm) walk the same rows and pay the same share.
    """
    flops = slow = 0.0
    # routed experts through a packed-group kernel (dropless or padded, not the one-hot einsums)
    packed = eff.grouped_gemm_tile_rows if routing[1] is None else None
    for rep, count in layer_kinds(model, layers):
        for g in layer_gemms(
            model,
            rep,
            tokens,
            tp=layout.tp,
            ep=layout.ep,
            slot_ratio=routing[0],
            einsum=routing[1],
            etp=layout.expert_tp,
        ):
            m, n, k = max(1, round(g.m)), max(1, round(g.n)), max(1, round(g.k))
            e = gemm_efficiency(eff, m, n, k, dtype)
            if packed and g.name in ROUTED_EXPERT_GEMMS:
                # one grouped call per device over all its local experts' rows
                groups = model.moe.num_experts / layout.ep  # type: ignore[union-attr]
                e *= packed_group_fraction(g.m * groups / eff.devices_per_chip, groups, packed)
            flops += count * g.flops
            slow += count * g.flops / e
    return flops / slow if slow else eff.gemm_max(dtype)


ROUTED_EXPERT_GEMMS: Final = frozenset({"expert_up", "expert_down"})
"""The routed experts' GEMMs of :func:`~trainplan.flops.layer_gemms` (grouped-matmul calls)."""

LOW_PRECISION: Final = ("fp8", "fp4")
"""Recipes whose transformer-block GEMMs run in a narrower dtype than their activations."""


@dataclass(frozen=True, kw_only=True)
class Peaks:
    """The compute rates one pass is charged at, for one accelerator and recipe.

    ``peak`` is the dense peak of the GEMM dtype (the block's linear layers). Under an FP8 / FP4
    recipe only those layers are low-precision: attention runs at the activation dtype
    (FlashAttention in BF16; FP8 attention is a separate opt-in in Transformer Engine) and so
    does the LM head (``flops.PassCost.hp_gemm_flops``). ``peak_attn`` is the activation dtype's
    dense peak; ``peak_hp`` is that peak times ``gemm_max(activation) / gemm_max(GEMM dtype)``, so
    that ``hp / (peak_hp · η)`` charges the LM head at the activation dtype's large-GEMM efficiency
    with the stage's shape (tile and wave) fraction (``efficiency.gemm_efficiency`` is
    ``gemm_max(dtype)`` times a dtype-independent shape fraction). Other recipes: all three equal.
    """

    dtype: str
    activation_dtype: str
    peak: float
    peak_hp: float
    peak_attn: float


def attention_etas(
    acc: Accelerator, recipe: Recipe, eff: DeviceEfficiency, model: ModelSpec, cp: int
) -> AttentionEfficiency:
    """η_attn of the forward (and recompute) and of the backward pass: ``step_time`` and the planner
    read this one function (per accelerator and cp degree).

    Flash attention: the stack's kernel on the device's generation from the published curves
    (:func:`trainplan.attention.attention_efficiency`, at the sequence per rank ``seq_len / cp``,
    the model's head dim, causal; ``Recipe.triton_attention``: the Triton kernel's published ratio to
    FlashAttention-2). Eager attention: the batched QKᵀ / PV GEMMs at
    :data:`EAGER_ATTENTION_EFFICIENCY_FACTOR` of the large-GEMM rate. Both are capped at the
    activation dtype's large-GEMM fraction (a fused kernel is not faster than the GEMMs it is made of;
    FP8 attention, ``Recipe.fp8_attention``: the FP8 GEMMs' fraction of the FP8 peak).
    """
    act = recipe_peaks(acc, recipe, eff).activation_dtype
    cap = eff.gemm_max(act)
    if recipe.attention != "flash":
        eta = cap * EAGER_ATTENTION_EFFICIENCY_FACTOR
        return AttentionEfficiency(
            forward=eta, backward=eta, kernel="eager", generation="", assumed=False, notes=()
        )

    def curve(length: int, ranks: int) -> AttentionEfficiency:
        return attention_efficiency(
            GENERATION.get(acc.name, ""),
            recipe.stack,
            model.head_dim,
            length,
            ranks,
            kernel="triton" if recipe.triton_attention else None,
            fp8=recipe.fp8_attention,
        )

    got = curve(recipe.seq_len, cp)
    if recipe.fp8_attention:
        # FP8 attention against the BF16 peak: capped at the FP8 GEMMs' fraction of the FP8 peak
        cap = eff.gemm_max("fp8") * acc.peak_flops_per_s("fp8") / acc.peak_flops_per_s(act)
    forward, backward, notes = got.forward, got.backward, got.notes
    w, s = model.attention_window, recipe.seq_len
    if 0 < w < s:
        # A banded kernel of window w runs B-row query blocks over w/B + 1 key blocks, two of them
        # partly masked: B·(w + B) pairs computed per B·w useful, the waste of a causal kernel of
        # length w (L·(L + B) per L²). So the local layers run at the causal curve at length w and
        # the global ones at s; the pass's η is the FLOP-weighted harmonic blend of the two
        # (cp = 1: a ring over a window is refused, flops.check_window_layout).
        local = curve(w, 1)
        n_local = model.num_local_layers
        f_local = n_local * causal_pairs(s, w)
        f_global = (model.num_layers - n_local) * causal_pairs(s)
        total = f_local + f_global
        forward = total / (f_local / local.forward + f_global / got.forward)
        backward = total / (f_local / local.backward + f_global / got.backward)
        notes = (
            *notes,
            *(n for n in local.notes if n not in notes),
            f"sliding-window attention ({w} keys) on {n_local} of {model.num_layers} layers: their FLOPs are "
            f"counted over the window, at the causal kernel's efficiency at length {w} (a banded kernel "
            "wastes the masked tile pairs of a causal one of its window's length; windowed kernels not measured)",
        )
    return dataclasses.replace(
        got, forward=min(forward, cap), backward=min(backward, cap), notes=tuple(notes)
    )


def recipe_peaks(acc: Accelerator, recipe: Recipe, eff: DeviceEfficiency) -> Peaks:
    """:class:`Peaks` of ``recipe`` on ``acc`` (the preamble ``step_time`` and the planner share)."""
    dtype = recipe.gemm_dtype if recipe.gemm_dtype != "tf32" or acc.supports("tf32") else "fp32"
    act = (
        recipe.weight_dtype
        if recipe.precision in LOW_PRECISION and acc.supports(recipe.weight_dtype)
        else dtype
    )
    peak = acc.peak_flops_per_s(dtype)
    peak_attn = acc.peak_flops_per_s(act)
    peak_hp = peak_attn * (eff.gemm_max(act) / eff.gemm_max(dtype)) if act != dtype else peak
    return Peaks(dtype=dtype, activation_dtype=act, peak=peak, peak_hp=peak_hp, peak_attn=peak_attn)


def _pass_time_s(
    cost: PassCost, peak: float, eta_gemm: float, eta_attn: float, bw: float, peak_hp: float, peak_attn: float
) -> float:
    """Roofline of one pass: low-precision GEMMs, activation-precision GEMMs, attention, memory.

    ``eta_attn`` is the pass's own attention-kernel fraction (:func:`attention_etas`: the forward's
    for the forward and the recompute, the backward's for the backward)."""
    return (
        (cost.gemm_flops - cost.hp_gemm_flops) / (peak * eta_gemm)
        + cost.hp_gemm_flops / (peak_hp * eta_gemm)
        + cost.attention_flops / (peak_attn * eta_attn)
        + cost.memory_bytes / bw
    )


TP_OVERLAP_PIPELINE_SPLITS: Final = 4
"""Chunks of a GEMM + reduce-scatter pipeline under Transformer Engine userbuffers: the
``proj_fprop`` / ``fc2_fprop`` presets use ``PipelineOverlapCfg(num_splits=4)`` (NeMo
``collections/llm/recipes/tp_overlap_configs/userbuffers.py``; Megatron Bridge
``training/comm_overlap.py``)."""


class TimedCollective(Protocol):
    """What the step-time terms read of a collective (``comm.Collective``, or the planner's arrays)."""

    @property
    def group(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def phase(self) -> str | None: ...
    @property
    def overlappable_with(self) -> str: ...
    @property
    def calls(self) -> Num: ...
    @property
    def time_s(self) -> Num: ...


def overlapped_tp_s(colls: Sequence[TimedCollective], gemm_s: Mapping[str, Num]) -> Num:
    """Exposed tensor-parallel time when the sequence-parallel collectives overlap the GEMMs.

    Transformer Engine's userbuffers overlap (Megatron-Core ``--tp-comm-overlap``) pairs every
    sequence-parallel collective of a pass with a linear layer's GEMM of the same pass: the
    all-gather before QKV / FC1 is a ring exchange that feeds the GEMM chunk by chunk, the
    reduce-scatter after the output projection / FC2 is pipelined with that GEMM in
    ``TP_OVERLAP_PIPELINE_SPLITS`` chunks, and the backward's re-gather and input-gradient
    reduce-scatter run beside the independent weight- / input-gradient GEMM ("bulk" overlap).
    Per pass (forward, backward, recompute), with C the pass's TP collective time and G its GEMM
    time::

        exposed = max(0, C − G) + C_rs / splits      (C_rs: the pipelined forward reduce-scatters)

    The last chunk's reduce-scatter has no GEMM left to hide behind. Not modelled: the GEMM
    slow-down from the SMs the communication kernels take (``set_sm_margin``), which the presets
    bound at 16–32 of 132 H100 SMs for the pipelined pairs. Same idea as the collective-matmul
    decomposition of Wang et al. 2023 (ASPLOS, "Overlap communication with dependent computation
    via decomposition in large deep learning models").
    """
    exposed: Num = 0.0
    for name, g in gemm_s.items():
        # The backward's collectives include the weight-gradient input re-gather.
        tp = [x for x in colls if x.group == "tp" and x.phase == name]
        exposed = exposed + maximum(0.0, total(x.time_s for x in tp) - g)
        if name != "backward":
            c_rs = total(x.time_s for x in tp if x.kind == "reduce_scatter")
            exposed = exposed + c_rs / TP_OVERLAP_PIPELINE_SPLITS
    return exposed


def grad_accumulation_bytes(
    trainable_params_on_device: float, recipe: Recipe, layout: Layout, micro_batches: int
) -> float:
    """:func:`grad_accumulation_bytes_n` of one layout and recipe."""
    return float(
        grad_accumulation_bytes_n(
            layout.grad_accumulation,
            trainable_params_on_device,
            float(BYTES_PER_ELEMENT[recipe.weight_dtype]),
            fp32_main_grad(recipe.weight_dtype),
            layout.zero,
            layout.shard_group,
            micro_batches,
        )
    )


def grad_accumulation_bytes_n(
    mode: str,
    trainable_params_on_device: Num,
    e: Num,
    fp32_main: Bool,
    zero: Int,
    shard: Int,
    micro_batches: Int,
) -> Num:
    """HBM bytes one device moves per step to sum its micro-batches' gradients outside the GEMMs.

    With e the gradient dtype's bytes (the recipe's weight dtype) and P the device's trained
    parameters, per ``mode`` (``Layout.grad_accumulation``):

    * ``fused``: 0 — the weight-gradient GEMM accumulates into the gradient buffer itself
      (Megatron-LM ``--gradient-accumulation-fusion``: ``fused_weight_gradient_mlp_cuda``
      ``wgrad_gemm_accum_fp32``, ``megatron/core/tensor_parallel/layers.py``); FSDP / ZeRO-2/3
      reduce-scatter every micro-batch and only add shards, which this term neglects.
    * ``autograd``: PyTorch's ``AccumulateGrad`` keeps the first micro-batch's gradient as
      ``.grad`` and adds each later one in place (``.grad += g``: read both, write one):
      ``(m − 1) · 3e · P``. ZeRO-2/3 reduce-scatter every micro-batch, so P is the shard
      ``P / (dp·cp)``.
    * ``main_grad``: Megatron-LM's LocalDDP with contiguous buffers (``megatron/model/distributed.py``
      ``_make_param_hook``: ``param.main_grad.add_(param.grad.data)``, 2021-2022) adds ``.grad``
      into the main-gradient buffer after every micro-batch: ``m · (e + 2e_main) · P``, e_main
      4 bytes (FP32) with BF16 weights (``megatron/arguments.py`` forces FP32 accumulation for
      BF16) and for FP32 training (``fp32_main``), else e.

    Example: 1.65 B parameters per device in FP16, 16 micro-batches, ``autograd``:
    15 · 6 B · 1.65e9 = 149 GB, 87 ms at 1.7 TB/s.
    """
    m = micro_batches
    p = trainable_params_on_device
    if mode == "autograd":
        return (m - 1) * 3.0 * e * p / where(zero >= 2, shard, 1)
    if mode == "main_grad":
        return m * (e + 2.0 * where(fp32_main, 4.0, e)) * p
    return 0.0 * p


OFFLOAD_CODES: Final = OFFLOADS
"""``Recipe.offload`` as the integer code the step-time terms read: its index here (0 none)."""


def bubble_divisor(schedule: str, virtual_stages: Int) -> Num:
    """What divides (p − 1)·t_slot for a pipeline schedule (module docstring): 1 (1F1B), the
    virtual stages v (interleaved), 3 (ZB-H1)."""
    if schedule == "interleaved":
        return as_float(virtual_stages)
    return 3.0 if schedule == "zb" else 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class StepInputs:
    """The numbers the step-time terms read: floats for one estimate, arrays for planner candidates.

    Per micro-batch on the busiest pipeline stage (κ applied): ``t_f``, ``t_b``, ``t_r`` the
    forward, backward and recompute passes, ``gemm_f/b/r`` their GEMM part (the windows of the
    tensor-parallel overlap), ``attn_f/b`` the attention kernels (the windows of the
    context-parallel ring). ``collectives``: every collective of the step with its seconds.
    Options the planner holds fixed for a whole search are plain values.
    """

    micro_batches: Int
    t_f: Num
    t_b: Num
    t_r: Num
    gemm_f: Num
    gemm_b: Num
    gemm_r: Num
    attn_f: Num
    attn_b: Num
    collectives: Sequence[TimedCollective]
    pp: Int
    bubble_divisor: Num
    zero: Int
    shard: Int  # ZeRO / FSDP shard group dp·cp
    trainable_params_on_device: Num
    params_on_device: Num
    update_bytes_per_param: Num  # flops.optimizer_update_bytes of one parameter
    hbm_bytes_per_s: Num  # achievable HBM bandwidth (catalog × measured efficiency)
    host_bytes_per_s: Num  # host link per device (0: none in the catalog)
    offload: Int  # OFFLOAD_CODES index
    weight_refetches: Int  # parameter offload: weight streams per micro-batch (3 with full/sac recompute)
    grad_accum_bytes: Num
    tp_comm_overlap: Bool = False  # per candidate: only where sequence parallelism is on
    pp_comm_overlap: Bool = False  # per candidate: only on the schedules the engine overlaps
    overlap_grad_reduce: bool = True
    ep_comm_overlap: Bool = False  # per candidate: where Megatron-Core accepts it (layout.ep_overlap_applies)
    ep_unpaired: Num = 1.0  # :func:`ep_overlap_unpaired_fraction`


DATA_PARALLEL_GROUPS: Final = ("dp", "shard", "expert_dp")


def exposed_dp_s(x: StepInputs) -> Num:
    """Data-parallel / ZeRO traffic not hidden by compute.

    Per-micro-batch collectives hide behind that pass of every micro-batch; once-per-step gradient
    reductions hide only behind the last backward (bucketed overlap, Li et al. 2020 "PyTorch
    Distributed", Sec. 3.2.3); "none" is exposed. Without ``overlap_grad_reduce`` the reduction
    starts after the last backward: nothing hides it.
    """
    m = x.micro_batches
    mf = as_float(m)
    dp = [c for c in x.collectives if c.group in DATA_PARALLEL_GROUPS]
    exposed: Num = 0.0
    t_b_window = x.t_b if x.overlap_grad_reduce else 0.0 * x.t_b
    for phase, window in (("forward", x.t_f + x.t_r), ("backward", t_b_window)):
        per_mb: Num = 0.0
        per_step: Num = 0.0
        for c in dp:
            if c.overlappable_with != phase:
                continue
            many = (c.calls >= m) & (m > 1)
            per_mb = per_mb + where(many, c.time_s, 0.0)
            per_step = per_step + where(many, 0.0, c.time_s)
        exposed = exposed + maximum(0.0, per_mb - mf * window) + maximum(0.0, per_step - window)
    return exposed + total(c.time_s for c in dp if c.overlappable_with == "none")


def exposed_cp_s(x: StepInputs) -> Num:
    """Ring-attention exchange not hidden by the attention of the same pass (Liu et al. 2023)."""
    mf = as_float(x.micro_batches)
    cp = [c for c in x.collectives if c.group == "cp"]
    fwd = total(c.time_s for c in cp if c.overlappable_with == "forward")
    bwd = total(c.time_s for c in cp if c.overlappable_with == "backward")
    return maximum(0.0, fwd - x.attn_f * mf) + maximum(0.0, bwd - x.attn_b * mf)


def exposed_tp_s(x: StepInputs) -> Num:
    """Tensor-parallel collectives on the critical path (:func:`overlapped_tp_s` with overlap)."""
    tp = [c for c in x.collectives if c.group == "tp"]
    plain = total(c.time_s for c in tp)
    if x.tp_comm_overlap is False:
        return plain
    mf = as_float(x.micro_batches)
    gemm = {"forward": mf * x.gemm_f, "backward": mf * x.gemm_b, "recompute": mf * x.gemm_r}
    return where(x.tp_comm_overlap, overlapped_tp_s(tp, gemm), plain)


def ep_overlap_unpaired_fraction(pp: Int, virtual_stages: Int, micro_batches: Int) -> Num:
    """Share of a stage's expert all-to-alls that EP overlap (``Layout.ep_comm_overlap``) leaves
    without a partner pass of the other direction to hide behind.

    Megatron-Core's combined 1F1B schedules (megatron/core/pipeline_parallel/combined_1f1b.py at
    core_r0.14.0) run one micro-batch's forward beside another's backward: without a pipeline the
    first forward and the last backward run alone, 1/m of each. With the interleaved schedule the
    first stage's warmup, ``W = 2·(p − 1) + (v − 1)·p + 1`` model chunks (schedules.py
    ``get_pp_rank_microbatches`` L733-739: group size p, one more chunk with the overlap), runs
    its forwards alone and as many backwards drain alone: ``W / (m·v)`` of each, at most 1. The
    first stage's warmup is the longest; it is charged to the busiest stage."""
    m = as_float(micro_batches)
    chunks = m * virtual_stages
    warm = 2.0 * (pp - 1) + (virtual_stages - 1) * pp + 1.0
    return where(pp == 1, 1.0 / m, minimum(1.0, warm / chunks))


def exposed_ep_s(x: StepInputs) -> Num:
    """Expert dispatch communication on the critical path: the expert-parallel all-to-alls and the
    expert tensor-parallel gathers of the dispatcher (``comm.expert_tp_traffic``), which run on the
    compute stream and are never hidden. With ``ep_comm_overlap`` the paired share of the all-to-alls,
    ``1 − u`` (:func:`ep_overlap_unpaired_fraction`), runs beside the other micro-batch's compute
    (its attention and MLP GEMMs, Megatron-Core's ``ScheduleNode`` streams), so only what exceeds
    that compute shows; the unpaired share ``u`` stays exposed."""
    ep = total(c.time_s for c in x.collectives if c.group == "ep")
    # the expert-TP gathers run inside the experts' compute node, on the compute stream
    # (Megatron-Core fine_grained_callables.py routed_experts_compute): never hidden
    etp = total(c.time_s for c in x.collectives if c.group == "etp")
    if x.ep_comm_overlap is False:
        return ep + etp
    u = x.ep_unpaired
    compute = as_float(x.micro_batches) * (x.t_f + x.t_b + x.t_r)
    overlapped = u * ep + (1.0 - u) * maximum(0.0, ep - compute)
    return where(x.ep_comm_overlap, overlapped, ep) + etp


def pp_p2p_s(x: StepInputs) -> Num:
    """Pipeline sends; with ``pp_comm_overlap`` (Megatron-Core ``overlap_p2p_comm``) the sends of
    one micro-batch run while the stage computes another: only what exceeds its compute shows."""
    t = total(c.time_s for c in x.collectives if c.group == "pp")
    hidden = maximum(0.0, t - as_float(x.micro_batches) * (x.t_f + x.t_b + x.t_r))
    return where(x.pp_comm_overlap, hidden, t)


def pipeline_bubble_s(x: StepInputs, blocking_comm_s: Num) -> Num:
    """Fill and drain: (p − 1) slots over the schedule's divisor, 0 without a pipeline.

    A slot is everything a micro-batch costs on the critical path of a stage: its compute and its
    blocking tensor / expert-parallel collectives and pipeline sends (``blocking_comm_s`` per step;
    Narayanan et al. 2021 Sec. 2.2.1: bubble = (p − 1)·(t_f + t_b) with t_f, t_b the
    per-micro-batch stage times; Qi et al. 2023 Sec. 3 for ZB-H1)."""
    slot = x.t_f + x.t_b + x.t_r + blocking_comm_s / as_float(x.micro_batches)
    return where(x.pp == 1, 0.0, (x.pp - 1) * slot / x.bubble_divisor)


def optimizer_offload_s(x: StepInputs) -> tuple[Num, Num]:
    """(optimizer_s, offload_s): the update on the device (memory-bound), or on the CPU
    (:func:`offload_terms_s`, evaluated only for the candidates that offload)."""
    trained_shard = x.trainable_params_on_device / where(x.zero >= 1, x.shard, 1)
    update = trained_shard * x.update_bytes_per_param
    on_device = x.offload == 0
    optimizer_s = where(on_device, update / x.hbm_bytes_per_s, 0.0)
    if all_true(on_device):  # nothing offloaded: the host terms are 0 (not evaluated)
        return optimizer_s, 0.0 * optimizer_s
    if isinstance(on_device, bool):
        return optimizer_s, offload_terms_s(x, update, lambda v: v)
    import numpy as np  # an array argument: numpy is loaded already

    idx = np.flatnonzero(~on_device)

    def take(v: Any) -> Any:
        return v[idx] if isinstance(v, np.ndarray) and v.ndim else v

    offload_s = np.zeros(np.shape(on_device))
    offload_s[idx] = offload_terms_s(x, take(update), take)
    return optimizer_s, offload_s


def offload_terms_s(x: StepInputs, update_bytes: Num, take: Callable[[Any], Any]) -> Num:
    """Seconds of an offloaded step: gradients out and parameters back over the host link, the
    CPU update at :data:`HOST_MEMORY_BYTES_PER_S` (ZeRO-Offload, Ren et al. 2021, Sec. 5);
    parameter offload (ZeRO-Infinity) also streams every layer's weights in for forward and
    backward (and the recompute's forward hooks) beyond what the compute of those passes hides.
    ``take`` selects the offloading candidates of an input (identity for one estimate)."""
    host = take(x.host_bytes_per_s)
    has_host = host > 0
    safe_host = where(has_host, host, 1.0)
    shard = maximum(1, take(x.shard))
    grads_out = take(x.trainable_params_on_device) * 2.0 / shard
    transfer = where(has_host, (grads_out + grads_out) / safe_host, 0.0)
    offload_s = transfer + update_bytes / HOST_MEMORY_BYTES_PER_S
    weights = take(x.params_on_device) * 2.0 / shard
    mf = as_float(take(x.micro_batches))
    compute = take(x.t_f) + take(x.t_b)
    stream = maximum(0.0, mf * take(x.weight_refetches) * weights / safe_host - mf * compute)
    return where((take(x.offload) == 2) & has_host, offload_s + stream, offload_s)


def step_terms(x: StepInputs) -> dict[str, Num]:
    """Every term of the step (:data:`trainplan.terms.TIME_TERMS` keys) and ``step_s``, their sum
    in the registry's order, and ``compute_s``."""
    mf = as_float(x.micro_batches)
    tp_s = exposed_tp_s(x)
    ep_s = exposed_ep_s(x)
    pp_s = pp_p2p_s(x)
    optimizer_s, offload_s = optimizer_offload_s(x)
    out: dict[str, Num] = {
        "forward_s": mf * x.t_f,
        "backward_s": mf * x.t_b,
        "recompute_s": mf * x.t_r,
        "exposed_tp_s": tp_s,
        "exposed_ep_s": ep_s,
        "exposed_cp_s": exposed_cp_s(x),
        "pp_p2p_s": pp_s,
        "exposed_dp_s": exposed_dp_s(x),
        "bubble_s": pipeline_bubble_s(x, tp_s + ep_s + pp_s),
        "grad_accum_s": x.grad_accum_bytes / x.hbm_bytes_per_s,
        "optimizer_s": optimizer_s,
        "offload_s": offload_s,
        **dict.fromkeys(RLHF_TERM_KEYS, 0.0),
    }
    out["step_s"] = total(out[t.key] for t in TIME_TERMS)
    out["compute_s"] = mf * (x.t_f + x.t_b + x.t_r)
    return out


def step_lower_bound_s(x: StepInputs) -> Num:
    """A lower bound of ``step_terms(x)["step_s"]`` that reads no collective: the terms that do not
    depend on communication (the bubble of compute alone), added in the registry's order. Every
    term left out is non-negative and the bubble grows with communication, and rounded addition
    is monotone, so the bound never exceeds the step time."""
    mf = as_float(x.micro_batches)
    optimizer_s, offload_s = optimizer_offload_s(x)
    lower = {
        "forward_s": mf * x.t_f,
        "backward_s": mf * x.t_b,
        "recompute_s": mf * x.t_r,
        "bubble_s": pipeline_bubble_s(x, 0.0),
        "grad_accum_s": x.grad_accum_bytes / x.hbm_bytes_per_s,
        "optimizer_s": optimizer_s,
        "offload_s": offload_s,
    }
    return total(lower[t.key] for t in TIME_TERMS if t.key in lower)


def gemm_peak_flops_per_s(system: System, recipe: Recipe) -> float:
    """Dense peak of the recipe's GEMM dtype (fp32 recipes use TF32 where the device has it)."""
    acc = system.accelerator
    dtype = recipe.gemm_dtype
    if dtype == "tf32" and not acc.supports("tf32"):
        dtype = "fp32"
    return acc.peak_flops_per_s(dtype)


def step_time(
    system: System,
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    *,
    kappa: float | None = None,
    memory: MemoryBreakdown | None = None,
) -> TimeBreakdown:
    """Seconds per optimizer step (see the module docstring for the terms).

    ``kappa``: the training-stack factor (achieved / microbenchmark compute efficiency); None takes
    the calibrated value of the device's generation, or 1 (uncalibrated, noted) when there is none.
    """
    acc = system.accelerator
    if layout.ep_comm_overlap and recipe.recompute == "full":
        raise LayoutError(
            "ep_comm_overlap",
            "Megatron-Core refuses expert all-to-all overlap with full recompute "
            "(transformer_config.py: 'disable full recomputation when enabling "
            "overlap_moe_expert_parallel_comm'); use --recompute selective or none, or drop --ep-comm-overlap",
        )
    notes: list[str] = list(model.approximations)
    if kappa is None:
        cal = calibrated_kappa(acc.name, recipe.stack)
        if cal is None:
            kappa = 1.0
            notes.append(
                f"{acc.name}: no calibrated {recipe.stack} training-stack factor; microbenchmark "
                "efficiencies only (optimistic)"
            )
        else:
            kappa = cal
            source = kappa_source(acc.name, recipe.stack)
            if source == "ratio":
                notes.append(
                    f"{acc.name}: no {recipe.stack} calibration rows on its generation; κ is the Megatron κ "
                    f"times the {recipe.stack}/Megatron ratio of the generations fitted for both (its vendor's, where it has any)"
                )
            elif source == "native":
                native = NATIVE_STACK[GENERATION[acc.name]]
                notes.append(
                    f"{acc.name}: the {recipe.stack} stack has no runs on this device; κ = {kappa:.3f} of "
                    f"{native}, the stack its published runs use (--stack {native})"
                )
    if recipe.fp8_params and not recipe.is_peft and layout.dp * layout.cp == 1:
        notes.append(
            "--fp8-params with one data-parallel rank changes no modelled term: a trained FP8 weight and its "
            "transposed copy take the 2 bytes of a 16-bit weight and nothing is gathered (the FP8 weight cache "
            "of 16-bit weights it removes is not modelled)"
        )
    eff = get_efficiency(acc.name)
    pk = recipe_peaks(acc, recipe, eff)
    dtype, peak, peak_hp, peak_attn = pk.dtype, pk.peak, pk.peak_hp, pk.peak_attn
    attn = attention_etas(acc, recipe, eff, model, layout.cp)
    eta_af, eta_ab = attn.forward, attn.backward
    bw = acc.memory_bandwidth_bytes_per_s * eff.memory_bandwidth_efficiency
    notes.extend(attn.notes)

    stages: tuple[StageFlops, ...] = device_flops(model, recipe, layout, distinct=True)
    m = stages[0].micro_batches
    tokens = recipe.micro_batch * (recipe.seq_len // layout.cp)

    # η depends only on how many layers of each kind (dense, MoE) a stage holds: computed once
    # per distinct count (pipeline stages usually share one).
    etas: dict[tuple[tuple[bool, int], ...], float] = {}

    def stage_time(st: StageFlops) -> tuple[float, float, float, float]:
        kinds = stage_kind_counts(model, st.layers)
        eta = etas.get(kinds)
        if eta is None:
            eta = etas[kinds] = _stage_gemm_efficiency(
                model, st.layers, tokens, layout, eff, dtype, moe_gemm_routing(model, recipe)
            )
        f = _pass_time_s(st.forward, peak, eta, eta_af, bw, peak_hp, peak_attn) / kappa
        b = (
            _pass_time_s(st.backward, peak, eta, eta_ab, bw, peak_hp, peak_attn) + st.dequant_bytes / bw
        ) / kappa
        r = _pass_time_s(st.recompute, peak, eta, eta_af, bw, peak_hp, peak_attn) / kappa
        return f, b, r, eta

    timed = [(stage_time(st), st) for st in stages]  # each distinct stage once
    (t_f, t_b, t_r, eta), busiest = max(timed, key=lambda x: x[0][0] + x[0][1] + x[0][2])

    # Collectives of the busiest stage.
    network = system.network
    placements = group_placement(layout, system)
    counts = count_params(model)
    expert = counts.moe_experts
    dense = counts.total - expert
    trainable_dense: float | None = None
    trainable_expert: float | None = None
    if recipe.is_peft:
        from trainplan.sharding import device_params

        adapters = sum(
            device_params(model, Layout(pp=layout.pp), st, recipe.lora).lora_adapters
            for st in range(layout.pp)
        )
        trainable_dense, trainable_expert = float(adapters), 0.0
    colls = step_collectives(
        model,
        recipe,
        layout,
        network,
        placements,
        dense_params=float(dense),
        expert_params=float(expert),
        trainable_dense_params=trainable_dense,
        trainable_expert_params=trainable_expert,
        micro_batches=m,
        device_bytes_per_s=bw,
    )
    # Optimizer step on the device (memory-bound), or offloaded to the CPU.
    mem = memory if memory is not None else memory_breakdown(model, recipe, layout, num_microbatches=m)
    if recipe.offload != "none" and acc.host_link is None:
        notes.append("no host link in the catalog: offload transfer time not modelled")
    host = acc.host_link
    hp = busiest.forward.hp_gemm_flops, busiest.backward.hp_gemm_flops, busiest.recompute.hp_gemm_flops
    gemm = [
        ((c.gemm_flops - h) / peak + h / peak_hp) / eta / kappa
        for c, h in zip((busiest.forward, busiest.backward, busiest.recompute), hp, strict=True)
    ]
    x = StepInputs(
        micro_batches=m,
        t_f=t_f,
        t_b=t_b,
        t_r=t_r,
        gemm_f=gemm[0],
        gemm_b=gemm[1],
        gemm_r=gemm[2],
        attn_f=busiest.forward.attention_flops / (peak_attn * eta_af),
        attn_b=busiest.backward.attention_flops / (peak_attn * eta_ab),
        collectives=colls,
        pp=layout.pp,
        bubble_divisor=bubble_divisor(layout.pp_schedule, layout.virtual_stages),
        zero=layout.zero,
        shard=layout.shard_group,
        trainable_params_on_device=mem.trainable_params_on_device,
        params_on_device=mem.params_on_device,
        update_bytes_per_param=optimizer_update_bytes(1.0, recipe),
        hbm_bytes_per_s=bw,
        host_bytes_per_s=host.bandwidth_bytes_per_s if host is not None else 0.0,
        offload=OFFLOAD_CODES.index(recipe.offload),
        weight_refetches=3 if reruns_forward_hooks(recipe.recompute) else 2,
        grad_accum_bytes=grad_accumulation_bytes(mem.trainable_params_on_device, recipe, layout, m),
        tp_comm_overlap=layout.tp_comm_overlap,
        pp_comm_overlap=layout.pp_comm_overlap,
        overlap_grad_reduce=layout.overlap_grad_reduce,
        ep_comm_overlap=layout.ep_comm_overlap,
        ep_unpaired=ep_overlap_unpaired_fraction(layout.pp, layout.virtual_stages, m)
        if layout.ep_comm_overlap
        else 1.0,
    )
    terms = step_terms(x)
    return TimeBreakdown(
        **{t.key: float(terms[t.key]) for t in TIME_TERMS},
        compute_s=float(terms["compute_s"]),
        micro_batches=m,
        stage=busiest.stage,
        gemm_efficiency=eta,
        kappa=kappa,
        collectives=colls,
        notes=tuple(notes),
    )


@dataclass(frozen=True, kw_only=True)
class Throughput:
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    mfu: float
    hfu: float
    peak_flops_per_s: float

    def to_dict(self) -> dict[str, object]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": None,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "peak_flops_per_s": self.peak_flops_per_s,
            "mfu_definition": (
                "model FLOPs (6·N per token + causal attention, no recompute) / "
                "(devices × dense peak of the GEMM dtype × step time)"
            ),
        }


def throughput(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout, time: TimeBreakdown
) -> Throughput:
    """Tokens/s, MFU and HFU of a step (DESIGN convention; Chowdhery et al. 2022 App. B for MFU)."""
    sf = step_flops(model, recipe, layout)
    peak = gemm_peak_flops_per_s(system, recipe)
    step_s = time.step_s
    return Throughput(
        tokens_per_s=sf.tokens / step_s,
        model_flops_per_step=sf.model_flops,
        hardware_flops_per_step=sf.hardware_flops,
        mfu=float(flops_utilisation(sf.model_flops, system.num_devices, peak, step_s)),
        hfu=float(flops_utilisation(sf.hardware_flops, system.num_devices, peak, step_s)),
        peak_flops_per_s=peak,
    )


def flops_utilisation(flops_per_step: Num, devices: Int, peak_flops_per_s: Num, step_s: Num) -> Num:
    """FLOPs per step over (devices × dense peak × step time): MFU with model FLOPs, HFU with
    hardware FLOPs (Chowdhery et al. 2022 App. B)."""
    return flops_per_step / (devices * peak_flops_per_s * step_s)


__all__ = ["Throughput", "TimeBreakdown", "gemm_peak_flops_per_s", "step_time", "throughput"]
