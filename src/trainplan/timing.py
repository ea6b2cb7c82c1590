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
    attention  flops / (peak[act] · η_attn)                η_attn: FlashAttention kernel fraction;
                                                           act = the activation dtype (BF16 under
                                                           FP8/FP4 recipes)
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

import functools
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Final

from trainplan.comm import Collective, group_placement, network_from_system, step_collectives
from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.efficiency import DeviceEfficiency, gemm_efficiency, get_efficiency
from trainplan.flops import (
    PassCost,
    StageFlops,
    device_flops,
    layer_gemms,
    optimizer_update_bytes,
    step_flops,
)
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import MemoryBreakdown, memory_breakdown
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

FLASH_ATTENTION_EFFICIENCY: Final[dict[str, float]] = {
    "ampere": 0.60,
    "hopper": 0.35,
}
"""Fraction of the dense peak reached by the fused (FlashAttention-2 class) attention kernel.

Ampere: FlashAttention-2 (Dao 2023, abstract and Sec. 4.1) reaches 50–73% of the A100 peak in the
forward pass and less in the backward; 0.60 is the middle of that range. Hopper: the same kernel
"achieves only 35% utilization on the H100" (Shah et al. 2024, FlashAttention-3, abstract) —
FlashAttention-3 reaches up to 75%, but PyTorch SDPA and most training stacks measured here ran
FlashAttention-2 class kernels. Other generations: no published figure; the Hopper value is used
and flagged as an assumption in the estimate's notes."""

GENERATION: Final[dict[str, str]] = {
    "a100-40gb": "ampere",
    "a100-80gb": "ampere",
    "rtx-4090": "ada",
    "l40s": "ada",
    "h100-sxm": "hopper",
    "h100-pcie": "hopper",
    "h200": "hopper",
    "b200": "blackwell",
    "b300": "blackwell",
    "gb200": "blackwell",
    "gb300": "blackwell",
}
"""NVIDIA GPU generations (the unit of the calibrated κ and of the attention-kernel efficiency)."""

ATTENTION_BY_GENERATION: Final[dict[str, str]] = {"ampere": "ampere", "ada": "ampere", "hopper": "hopper"}


def flash_attention_efficiency(accelerator_name: str) -> tuple[float, bool]:
    """(η_attn, assumed): the kernel's fraction of peak for this device's generation.

    Ada (RTX 4090, L40S) runs the same FlashAttention-2 sm80 code path as Ampere."""
    gen = ATTENTION_BY_GENERATION.get(GENERATION.get(accelerator_name, ""))
    if gen is None:
        return FLASH_ATTENTION_EFFICIENCY["hopper"], True
    return FLASH_ATTENTION_EFFICIENCY[gen], False


@functools.cache
def _calibration() -> dict[tuple[str, str], float]:
    """(stack, generation) -> κ from ``calibration.toml`` (entries without a stack: Megatron)."""
    text = (
        resources.files("trainplan.hardware").joinpath("data", "calibration.toml").read_text(encoding="utf-8")
    )
    doc = tomllib.loads(text)
    return {
        (str(g.get("stack", "megatron")), str(g["name"])): float(g["kappa"])
        for g in doc.get("generation", [])
    }


def stack_ratio(stack: str) -> float | None:
    """Geometric mean of κ[stack] / κ[megatron] over the generations where both are fitted."""
    cal = _calibration()
    ratios = [
        k / cal[("megatron", g)] for (st, g), k in cal.items() if st == stack and ("megatron", g) in cal
    ]
    if not ratios:
        return None
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def kappa_source(accelerator_name: str, stack: str = "megatron") -> str:
    """How :func:`calibrated_kappa` got its value: "fitted", "ratio" or "none"."""
    gen = GENERATION.get(accelerator_name, "")
    cal = _calibration()
    if (stack, gen) in cal:
        return "fitted"
    if ("megatron", gen) in cal and stack_ratio(stack) is not None:
        return "ratio"
    return "none"


def calibrated_kappa(accelerator_name: str, stack: str = "megatron") -> float | None:
    """κ of the device's generation for the training stack (``validate/calibrate.py``), or None.

    Fitted where the stack has calibration rows on that generation; otherwise the Megatron κ of
    the generation times the stack's mean ratio to Megatron over the generations fitted for both
    (:func:`stack_ratio`); None when the generation has no Megatron κ either.
    """
    gen = GENERATION.get(accelerator_name, "")
    cal = _calibration()
    if (stack, gen) in cal:
        return cal[(stack, gen)]
    base = cal.get(("megatron", gen))
    ratio = stack_ratio(stack)
    if base is None or ratio is None:
        return None
    return base * ratio


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
    collectives: tuple[Collective, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def terms(self) -> list[tuple[str, float]]:
        return [
            ("compute (forward)", self.forward_s),
            ("compute (backward)", self.backward_s),
            ("compute (recompute)", self.recompute_s),
            ("tensor-parallel comm (exposed)", self.exposed_tp_s),
            ("expert-parallel all-to-all (exposed)", self.exposed_ep_s),
            ("context-parallel comm (exposed)", self.exposed_cp_s),
            ("pipeline send/recv", self.pp_p2p_s),
            ("data-parallel / ZeRO comm (exposed)", self.exposed_dp_s),
            ("pipeline bubble", self.bubble_s),
            ("gradient accumulation", self.grad_accum_s),
            ("optimizer step", self.optimizer_s),
            ("offload transfers + CPU step", self.offload_s),
        ]

    @property
    def step_s(self) -> float:
        return sum(v for _, v in self.terms())

    def to_dict(self) -> dict[str, object]:
        return {
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "recompute_s": self.recompute_s,
            "exposed_tp_s": self.exposed_tp_s,
            "exposed_ep_s": self.exposed_ep_s,
            "exposed_cp_s": self.exposed_cp_s,
            "pp_p2p_s": self.pp_p2p_s,
            "exposed_dp_s": self.exposed_dp_s,
            "bubble_s": self.bubble_s,
            "grad_accum_s": self.grad_accum_s,
            "optimizer_s": self.optimizer_s,
            "offload_s": self.offload_s,
            "micro_batches": self.micro_batches,
            "stage": self.stage,
            "gemm_efficiency": self.gemm_efficiency,
            "kappa": self.kappa,
            "notes": list(self.notes),
        }


def _stage_gemm_efficiency(
    model: ModelSpec, layers: tuple[int, ...], tokens: int, layout: Layout, eff: DeviceEfficiency, dtype: str
) -> float:
    """FLOP-weighted harmonic mean of η_gemm over the stage's forward GEMM shapes.

    Time = Σ flops_i / (peak·η_i) = (Σ flops_i) / (peak·η) with η = Σ flops_i / Σ (flops_i/η_i).
    Backward GEMMs (dX, dW) have the same FLOPs with permuted shapes; they are charged the
    forward shape's efficiency (the measured maximum is shape-agnostic beyond quantization).
    """
    flops = slow = 0.0
    seen: set[bool] = set()
    for i in layers:
        kind = model.is_moe_layer(i)
        if kind in seen:
            continue
        seen.add(kind)
        for g in layer_gemms(model, i, tokens, tp=layout.tp, ep=layout.ep):
            m, n, k = max(1, round(g.m)), max(1, round(g.n)), max(1, round(g.k))
            e = gemm_efficiency(eff, m, n, k, dtype)
            flops += g.flops
            slow += g.flops / e
    return flops / slow if slow else eff.gemm_max(dtype)


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
    eta_attn: float
    attn_assumed: bool


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
    assumed = False
    if recipe.attention == "flash":
        eta_attn, assumed = flash_attention_efficiency(acc.name)
    else:
        eta_attn = eff.gemm_max(act) * EAGER_ATTENTION_EFFICIENCY_FACTOR
    eta_attn = min(eta_attn, eff.gemm_max(act))
    return Peaks(
        dtype=dtype,
        activation_dtype=act,
        peak=peak,
        peak_hp=peak_hp,
        peak_attn=peak_attn,
        eta_attn=eta_attn,
        attn_assumed=assumed,
    )


def _pass_time_s(
    cost: PassCost, peak: float, eta_gemm: float, eta_attn: float, bw: float, peak_hp: float, peak_attn: float
) -> float:
    """Roofline of one pass: low-precision GEMMs, activation-precision GEMMs, attention, memory."""
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


def overlapped_tp_s(colls: tuple[Collective, ...], gemm_s: dict[str, float]) -> float:
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
    exposed = 0.0
    for name, g in gemm_s.items():
        # The backward's collectives include the weight-gradient input re-gather (tp_backward_input_regather).
        c = sum(x.time_s for x in colls if x.group == "tp" and x.name.startswith(f"tp_{name}_"))
        exposed += max(0.0, c - g)
        if name != "backward":
            c_rs = sum(
                x.time_s
                for x in colls
                if x.group == "tp" and x.name.startswith(f"tp_{name}_") and x.kind == "reduce_scatter"
            )
            exposed += c_rs / TP_OVERLAP_PIPELINE_SPLITS
    return exposed


def grad_accumulation_bytes(
    trainable_params_on_device: float, recipe: Recipe, layout: Layout, micro_batches: int
) -> float:
    """HBM bytes one device moves per step to sum its micro-batches' gradients outside the GEMMs.

    With e the gradient dtype's bytes (the recipe's weight dtype) and P the device's trained
    parameters, per ``layout.grad_accumulation``:

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
      BF16) and for FP32 training, else e.

    Example: 1.65 B parameters per device in FP16, 16 micro-batches, ``autograd``:
    15 · 6 B · 1.65e9 = 149 GB, 87 ms at 1.7 TB/s.
    """
    m = micro_batches
    e = float(BYTES_PER_ELEMENT[recipe.weight_dtype])
    p = trainable_params_on_device
    if layout.grad_accumulation == "autograd":
        shard = layout.shard_group if layout.zero >= 2 else 1
        return (m - 1) * 3.0 * e * p / shard
    if layout.grad_accumulation == "main_grad":
        e_main = 4.0 if recipe.weight_dtype in ("bf16", "fp32") else e
        return m * (e + 2.0 * e_main) * p
    return 0.0


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
    notes: list[str] = []
    if kappa is None:
        cal = calibrated_kappa(acc.name, recipe.stack)
        if cal is None:
            kappa = 1.0
            notes.append(
                f"{acc.name}: no calibrated training-stack factor; microbenchmark efficiencies only (optimistic)"
            )
        else:
            kappa = cal
            if kappa_source(acc.name, recipe.stack) == "ratio":
                notes.append(
                    f"{acc.name}: no {recipe.stack} calibration rows on its generation; κ is the Megatron κ "
                    f"times the {recipe.stack}/Megatron ratio of the generations fitted for both"
                )
    eff = get_efficiency(acc.name)
    pk = recipe_peaks(acc, recipe, eff)
    dtype, peak, peak_hp, peak_attn, eta_attn = pk.dtype, pk.peak, pk.peak_hp, pk.peak_attn, pk.eta_attn
    bw = acc.memory_bandwidth_bytes_per_s * eff.memory_bandwidth_efficiency
    if pk.attn_assumed:
        notes.append(f"no published attention-kernel efficiency for {acc.name}: the Hopper figure is used")

    stages: tuple[StageFlops, ...] = device_flops(model, recipe, layout)
    m = stages[0].micro_batches
    tokens = recipe.micro_batch * (recipe.seq_len // layout.cp)

    # η depends only on the layer kinds (dense, MoE) a stage holds, in order of first appearance:
    # computed once per distinct sequence of kinds (pipeline stages usually share one).
    etas: dict[tuple[bool, ...], float] = {}

    def stage_time(st: StageFlops) -> tuple[float, float, float, float]:
        kinds = tuple(dict.fromkeys(model.is_moe_layer(i) for i in st.layers))
        eta = etas.get(kinds)
        if eta is None:
            eta = etas[kinds] = _stage_gemm_efficiency(model, st.layers, tokens, layout, eff, dtype)
        f = _pass_time_s(st.forward, peak, eta, eta_attn, bw, peak_hp, peak_attn) / kappa
        b = (
            _pass_time_s(st.backward, peak, eta, eta_attn, bw, peak_hp, peak_attn) + st.dequant_bytes / bw
        ) / kappa
        r = _pass_time_s(st.recompute, peak, eta, eta_attn, bw, peak_hp, peak_attn) / kappa
        return f, b, r, eta

    timed = [(stage_time(st), st) for st in stages]
    (t_f, t_b, t_r, eta), busiest = max(timed, key=lambda x: x[0][0] + x[0][1] + x[0][2])
    t_mb = t_f + t_b + t_r

    # Collectives of the busiest stage.
    network = network_from_system(system)
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
    )
    tp_s = sum(c.time_s for c in colls if c.group == "tp")
    if layout.tp_comm_overlap:
        gemm_s = {
            name: m
            * ((cost.gemm_flops - cost.hp_gemm_flops) / peak + cost.hp_gemm_flops / peak_hp)
            / eta
            / kappa
            for name, cost in (
                ("forward", busiest.forward),
                ("backward", busiest.backward),
                ("recompute", busiest.recompute),
            )
        }
        tp_s = overlapped_tp_s(colls, gemm_s)
    ep_s = sum(c.time_s for c in colls if c.group == "ep")
    pp_s = sum(c.time_s for c in colls if c.group == "pp")
    if layout.pp_comm_overlap:
        # Sends of one micro-batch run while the stage computes another (Megatron-Core
        # ``overlap_p2p_comm``): only what exceeds the stage's compute is exposed.
        pp_s = max(0.0, pp_s - m * t_mb)
    cp_fwd = sum(c.time_s for c in colls if c.group == "cp" and c.overlappable_with == "forward")
    cp_bwd = sum(c.time_s for c in colls if c.group == "cp" and c.overlappable_with == "backward")
    attn_f = busiest.forward.attention_flops / (peak_attn * eta_attn) * m
    attn_b = busiest.backward.attention_flops / (peak_attn * eta_attn) * m
    exposed_cp = max(0.0, cp_fwd - attn_f) + max(0.0, cp_bwd - attn_b)

    # Data-parallel / ZeRO traffic: per-micro-batch collectives hide behind that pass of every
    # micro-batch; once-per-step gradient reductions hide only behind the last backward (bucketed
    # overlap, Li et al. 2020 "PyTorch Distributed", Sec. 3.2.3); "none" is exposed.
    dp_groups = ("dp", "shard", "expert_dp")
    exposed_dp = 0.0
    # Without overlap the reduction starts after the last backward: nothing hides it.
    t_b_window = t_b if layout.overlap_grad_reduce else 0.0
    for phase, window_per_mb in (("forward", t_f + t_r), ("backward", t_b_window)):
        per_mb = sum(
            c.time_s
            for c in colls
            if c.group in dp_groups and c.overlappable_with == phase and c.calls >= m > 1
        )
        per_step = sum(
            c.time_s
            for c in colls
            if c.group in dp_groups and c.overlappable_with == phase and not c.calls >= m > 1
        )
        exposed_dp += max(0.0, per_mb - m * window_per_mb) + max(0.0, per_step - window_per_mb)
    exposed_dp += sum(c.time_s for c in colls if c.group in dp_groups and c.overlappable_with == "none")

    # Pipeline bubble: every stage idles for (p − 1) micro-batch slots during fill and drain, and a
    # slot is everything a micro-batch costs on the critical path of a stage — its compute and its
    # blocking tensor / expert-parallel collectives and pipeline sends (Narayanan et al. 2021
    # Sec. 2.2.1: bubble = (p − 1)·(t_f + t_b) with t_f, t_b the per-micro-batch stage times).
    p = layout.pp
    t_slot = t_mb + (tp_s + ep_s + pp_s) / m
    if p == 1:
        bubble = 0.0
    elif layout.pp_schedule == "interleaved":
        bubble = (p - 1) * t_slot / layout.virtual_stages
    elif layout.pp_schedule == "zb":
        bubble = (p - 1) * t_slot / 3.0
    else:
        bubble = (p - 1) * t_slot

    # Optimizer step on the device (memory-bound), or offloaded to the CPU.
    mem = memory if memory is not None else memory_breakdown(model, recipe, layout, num_microbatches=m)
    trained_shard = mem.trainable_params_on_device / (layout.shard_group if layout.zero >= 1 else 1)
    update_bytes = optimizer_update_bytes(trained_shard, recipe)
    optimizer_s = 0.0
    offload_s = 0.0
    if recipe.offload == "none":
        optimizer_s = update_bytes / bw
    else:
        host = acc.host_link
        host_bw = host.bandwidth_bytes_per_s if host is not None else 0.0
        if host_bw <= 0:
            notes.append("no host link in the catalog: offload transfer time not modelled")
        grads_out = mem.trainable_params_on_device * 2.0 / max(1, layout.shard_group)
        params_in = grads_out
        transfer = (grads_out + params_in) / host_bw if host_bw > 0 else 0.0
        cpu_step = update_bytes / HOST_MEMORY_BYTES_PER_S
        offload_s = transfer + cpu_step
        if recipe.offload == "optimizer+params" and host_bw > 0:
            # ZeRO-Infinity streams every layer's weights in for forward, recompute and backward
            # (a per-op selective recomputation re-runs every module's forward hook too).
            weights = mem.params_on_device * 2.0 / max(1, layout.shard_group)
            passes = 3 if recipe.recompute in ("full", "sac") else 2
            offload_s += max(0.0, m * passes * weights / host_bw - m * (t_f + t_b))

    grad_accum_s = grad_accumulation_bytes(mem.trainable_params_on_device, recipe, layout, m) / bw

    return TimeBreakdown(
        compute_s=m * t_mb,
        forward_s=m * t_f,
        backward_s=m * t_b,
        recompute_s=m * t_r,
        exposed_tp_s=tp_s,
        exposed_ep_s=ep_s,
        exposed_cp_s=exposed_cp,
        pp_p2p_s=pp_s,
        exposed_dp_s=exposed_dp,
        bubble_s=bubble,
        optimizer_s=optimizer_s,
        offload_s=offload_s,
        grad_accum_s=grad_accum_s,
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
    tokens = sf.tokens
    denom = system.num_devices * peak * step_s
    return Throughput(
        tokens_per_s=tokens / step_s,
        model_flops_per_step=sf.model_flops,
        hardware_flops_per_step=sf.hardware_flops,
        mfu=sf.model_flops / denom,
        hfu=sf.hardware_flops / denom,
        peak_flops_per_s=peak,
    )


__all__ = ["Throughput", "TimeBreakdown", "gemm_peak_flops_per_s", "step_time", "throughput"]
