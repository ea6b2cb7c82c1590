"""FLOPs and memory-bound bytes of a transformer training step.

Notation (as in ``models/spec.py``)::

    L  layers        h  hidden        a  query heads     k  key/value heads   d  head_dim
    f  dense FFN     V  vocab         E  experts         K  top-k             f_e expert FFN
    b  micro-batch (sequences)        s  sequence length T = b·s tokens

Conventions
-----------
* A matmul of an (m×k) by a (k×n) matrix costs ``2·m·n·k`` FLOPs (one multiply + one add per MAC).
* **Causal attention** (default): flash-style kernels skip the fully masked blocks, so the score
  (QKᵀ) and value (PV) matmuls count ``s²/2`` per head instead of ``s²``. The exact number of
  unmasked entries is ``s(s+1)/2``; kernels compute the diagonal blocks in full, so ``s²/2`` is the
  convention (Megatron-LM and NeMo halve the attention term the same way for causal masks; the
  FlashAttention benchmarks halve it too). ``causal=False`` gives the full ``s²`` count used by
  Megatron 2021 Eq. 3, Korthikanti 2022 Eq. 7 and PaLM App. B.
* Only GEMMs are FLOPs. Biases, norms, activation functions, softmax, rotary, residual adds,
  dropout, the MoE token permutation, the optimizer update and QLoRA dequantisation are
  **memory-bound** and are expressed as bytes moved through HBM (``LayerMemoryTraffic``), so the
  timing model can roofline them at memory bandwidth. Attention core FLOPs (QKᵀ, PV) are kept
  apart from the projection/MLP GEMMs because they run in a different kernel.
* Backward of a linear layer with trained weights costs 2× its forward (dX and dW); of a frozen
  linear (LoRA/QLoRA base, frozen LM head) 1× its forward (dX only). Backward of the attention core
  costs 2× its forward (dQ, dK from dS; dP, dV); FlashAttention's backward also recomputes
  ``S = QKᵀ`` (one more score matmul; Dao et al. 2022, Alg. 4), counted as hardware FLOPs only.
* **Model FLOPs** (the MFU numerator of DESIGN.md): forward + backward of the algorithm, no
  recompute, causal-halved attention: ``6·N·T + 3·attention_forward`` for full training, where
  ``N = gemm_params(spec)`` counts every weight that takes part in a GEMM per token (all linear
  weights of the transformer blocks with MoE experts counted as active, the router, and the LM head;
  not the embedding lookup, biases or norm weights). For LoRA: ``4·N_base·T + 6·N_adapter·T +
  3·attention_forward`` (frozen base: no weight gradients), less the input gradients of the first
  layer's q, k, v and their adapters' ``A``, which a frozen embedding does not need (so model
  FLOPs never exceed hardware FLOPs: MFU <= HFU).
* **Hardware FLOPs** (HFU numerator) add what the hardware really executes on top: the recompute
  forward (``full``: one more forward of every transformer layer, not of the LM head, as in
  Megatron 2021 Eq. 3; with ``recompute_early_stop``, PyTorch's non-reentrant checkpoint, that
  forward less the trailing ops no saved tensor depends on, :func:`early_stop_skip`;
  ``selective``: one more forward of the attention core, Korthikanti 2022 Sec. 5; ``sac``,
  torchtitan's per-op selective checkpointing: the GEMMs of the linears whose outputs it does not
  keep and the memory-bound forward ops, not the attention core, :func:`sac_recompute`) and
  FlashAttention's backward score recompute.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Final, Literal

from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.errors import LayoutError, RecipeError
from trainplan.layout import Layout
from trainplan.layout import stage_layers as stage_layers  # the one stage assignment (re-exported)
from trainplan.models.params import lora_modules
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LoRASpec, Recipe, block_recipe, recompute_module_set, recomputes_position
from trainplan.sac import block_linears, check_sac

Direction = Literal["forward", "backward"]

# Bytes of one FP32 value (cross-entropy works on FP32 logits; optimizer states are FP32).
_FP32_BYTES = 4.0


# --------------------------------------------------------------------------------------------
# Per-layer FLOPs
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LayerFlops:
    """GEMM FLOPs of one forward of one transformer layer over ``b·s`` tokens (all devices together).

    ``qkv_proj``    2·T·h·(a + 2k)·d               query/key/value projections (GQA: k ≤ a)
                    MLA: 2·T·(r_q·a·(d_n+d_r) + r_kv·a·(d_n+d_v))   the up projections q_b, kv_b
    ``latent_proj`` MLA: 2·T·h·(r_q + r_kv + d_r)  the down projections q_a, kv_a (not split by tp)
    ``attn_scores`` 2·b·a·s²·d · (1/2 if causal)   QKᵀ (MLA: d = d_n + d_r)
    ``attn_values`` 2·b·a·s²·d_v · (1/2 if causal) P·V (d_v = d without MLA)
    ``out_proj``    2·T·a·d_v·h                    attention output projection
    ``mlp``         2·T·h·f · (3 gated | 2)        dense MLP: gate, up, down (SwiGLU/GeGLU) or up, down
    ``moe_experts`` 2·T·h·(K·f_e + S·f_s) · (3|2)  routed experts (K per token) + S shared experts
    ``router``      2·T·h·E (+ 2·T·h shared gate)  MoE router logits (Qwen2-MoE: + shared-expert gate)
    """

    qkv_proj: float
    attn_scores: float
    attn_values: float
    out_proj: float
    mlp: float = 0.0
    moe_experts: float = 0.0
    router: float = 0.0
    latent_proj: float = 0.0

    @property
    def attention(self) -> float:
        """Attention-core FLOPs (QKᵀ + PV): run in the attention kernel, not as weight GEMMs."""
        return self.attn_scores + self.attn_values

    @property
    def gemm(self) -> float:
        """Weight-GEMM FLOPs: projections, MLP / experts and router."""
        return self.qkv_proj + self.out_proj + self.mlp + self.moe_experts + self.router + self.latent_proj

    @property
    def total(self) -> float:
        return self.gemm + self.attention


def _mlp_matrices(spec: ModelSpec) -> int:
    """Weight matrices of one MLP: 3 for gated (SwiGLU, GeGLU), 2 otherwise."""
    return 3 if spec.gated else 2


def _check_layer(spec: ModelSpec, layer_idx: int) -> None:
    if not 0 <= layer_idx < spec.num_layers:
        raise LayoutError("layer", f"layer index {layer_idx} outside 0..{spec.num_layers - 1}")


def causal_pairs(s: float, window: int = 0) -> float:
    """Query-key pairs one head of a causal layer scores over ``s`` tokens: s²/2, or s·w − w²/2
    with a sliding window of ``window`` = w < s keys (a local layer, ``ModelSpec.is_local_layer``;
    the kernels skip the blocks outside the band, FlashAttention-2's ``window_size``: query i sees
    min(i + 1, w) keys, the same continuous count as the causal half)."""
    if 0 < window < s:
        return s * window - window * window / 2.0
    return s * s / 2.0


def _attention_core_flops(
    spec: ModelSpec, b: float, s: float, causal: bool, width: int, window: int = 0
) -> float:
    """One of QKᵀ (``width`` = d) or PV (``width`` = d_v): 2·b·a·s²·width, halved for causal
    masks (module docstring), over the band of a sliding window (:func:`causal_pairs`)."""
    if causal:
        return 2.0 * b * spec.num_heads * causal_pairs(s, window) * width
    return 2.0 * b * spec.num_heads * s * s * width


def capacity_slots(seq_len: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Token slots C of each routed expert per sequence under a capacity factor cf:
    ``C = int(max(ceil(S·K/E)·cf, cf))`` (MaxText ``MaxText/layers/moe.py`` ``generate_masks``,
    14b5876e L630-642: the capacity of one expert for one sequence of a training batch; ``int``
    truncates after the product). Mixtral (E 8, K 2) at S 4096, cf 1.25: C = 1280."""
    return int(max(math.ceil(seq_len * top_k / num_experts) * capacity_factor, capacity_factor))


def expert_capacity(spec: ModelSpec, recipe: Recipe) -> int | None:
    """:func:`capacity_slots` of the recipe's capacity factor: each routed expert's slots per
    sequence; ``None`` for dropless routing or a dense model."""
    moe = spec.moe
    cf = recipe.moe_capacity_factor
    if moe is None or cf is None:
        return None
    return capacity_slots(recipe.seq_len, moe.top_k, moe.num_experts, cf)


def expert_slot_ratio(spec: ModelSpec, recipe: Recipe) -> float:
    """Expert token slots per routed token, ``E·C / (S·K)`` (:func:`capacity_slots`): the factor by
    which capacity padding (``Recipe.moe_capacity_factor``) grows the routed experts' executed
    GEMM FLOPs, their saved activations and the expert all-to-all buffers (each expert runs on all
    C slots, filled or not: MaxText ``moe.py`` L814-844). 1 for dropless routing or a dense model."""
    slots = expert_capacity(spec, recipe)
    if slots is None or spec.moe is None:
        return 1.0
    return spec.moe.num_experts * slots / (recipe.seq_len * spec.moe.top_k)


def moe_einsum_flops(spec: ModelSpec, recipe: Recipe, b: float) -> float:
    """Forward FLOPs of the one-hot dispatch and combine matmuls of one MoE layer over ``b``
    sequences (``Recipe.moe_dispatch = "einsum"``; 0 otherwise).

    GShard (Lepikhin et al. 2020, Sec. 2.2, Algorithm 2) and MaxText ``dense_matmul`` (``moe.py``
    14b5876e L773-775, L855-860) dispatch with ``BSM,BSEC -> EBCM`` and combine with
    ``EBCM,BSEC -> BSM``: dense matmuls against a (S, E·C) one-hot mask per sequence, each
    2·S·E·C·h FLOPs. With E·C ≈ cf·S·K per sequence they cost ≈ 2·cf·K·S·h per token each, so the
    cost per token grows with the sequence length. The backward runs three of them with full
    training (the input gradient of the dispatch, whose mask is boolean; the expert-output and
    the router-weight gradients of the combine) and two when the router is frozen (PEFT): see
    :func:`_layer_passes`."""
    slots = expert_capacity(spec, recipe)
    if slots is None or spec.moe is None or recipe.moe_dispatch != "einsum":
        return 0.0
    ec = spec.moe.num_experts * slots
    return 2.0 * (2.0 * b * recipe.seq_len * ec * spec.hidden_size)


MoEGemmRouting = tuple[float, tuple[int, int] | None]
"""(:func:`expert_slot_ratio`, (S, E·C) of the one-hot einsums or None): what :func:`layer_gemms`
needs of the recipe's MoE routing."""
DROPLESS: Final[MoEGemmRouting] = (1.0, None)


def moe_gemm_routing(spec: ModelSpec, recipe: Recipe) -> MoEGemmRouting:
    """The routing figures :func:`layer_gemms` shapes the expert and einsum GEMMs by."""
    slots = expert_capacity(spec, recipe)
    if slots is None or spec.moe is None:
        return DROPLESS
    shape = (recipe.seq_len, spec.moe.num_experts * slots) if recipe.moe_dispatch == "einsum" else None
    return expert_slot_ratio(spec, recipe), shape


def check_mla_layout(spec: ModelSpec, recipe: Recipe, layout: Layout) -> None:
    """Multi-head latent attention under tensor parallelism is modelled as Megatron-Core builds
    it (replicated down projections on the sequence shard, gathered latents:
    ``comm.tp_entry_fraction``; the saved latents as Transformer Engine keeps them); the PyTorch
    stacks' tensor-parallel plans for MLA differ by implementation and are refused."""
    if spec.mla is not None and layout.tp > 1 and recipe.stack != "megatron":
        raise LayoutError(
            "tp",
            f"tp={layout.tp} with multi-head latent attention ({spec.name}) is modelled on the megatron stack "
            f"(Megatron-Core MLASelfAttention), not {recipe.stack}; use --stack megatron, or --tp 1",
        )


def check_modelled(spec: ModelSpec, recipe: Recipe, layout: Layout | None) -> None:
    """Refuse the recipe and layout combinations the cost model does not cover: per-op selective
    checkpointing where :func:`trainplan.sac.check_sac` refuses it, :func:`check_layer_selective`,
    :func:`check_moe_routing` and :func:`check_mla_layout` (``None``: one device). The FLOP and
    memory entry points (:func:`step_flops`, :func:`device_flops`, ``memory_breakdown``) call it."""
    if recipe.recompute == "sac":
        check_sac(spec, layout)
    whole = layout if layout is not None else Layout()
    check_layer_selective(recipe, whole)
    if recipe.recompute_layers:
        most = max(map(len, whole.stage_layers(spec.num_layers)))
        if recipe.recompute_layers >= most:
            raise LayoutError(
                "recompute_layers",
                f"--recompute-layers {recipe.recompute_layers} recomputes the first N blocks of each pipeline "
                f"stage, and a stage holds at most {most}, so every block would be: use --recompute-layers "
                f"{most - 1} or less, or plain --recompute full",
            )
    if recipe.recompute_every > 1:
        most = max(map(len, whole.stage_layers(spec.num_layers)))
        if recipe.recompute_every > most:
            raise LayoutError(
                "recompute_every",
                f"--recompute-every {recipe.recompute_every} recomputes the n-th, 2n-th, … block of each "
                f"pipeline stage, and a stage holds at most {most}, so no block would be recomputed; "
                f"use --recompute-every {most} or less, or --recompute none",
            )
    check_moe_routing(recipe, whole)
    check_mla_layout(spec, recipe, whole)
    check_moe_tp(spec, recipe, whole)
    check_fp8_options(spec, recipe)
    check_fused_loss(recipe, whole)
    check_window_layout(spec, recipe, whole)


def check_window_layout(spec: ModelSpec, recipe: Recipe, layout: Layout) -> None:
    """Refuse context parallelism where a sliding window is shorter than the sequence: the ring
    attention of :func:`device_flops` splits the full causal pattern, not a band."""
    if layout.cp > 1 and 0 < spec.attention_window < recipe.seq_len:
        raise LayoutError(
            "cp",
            f"cp={layout.cp} with {spec.name}'s {spec.attention_window}-token sliding-window attention: the "
            "ring attention is modelled for the full causal pattern; use --cp 1",
        )


def check_fused_loss(recipe: Recipe, layout: Layout) -> None:
    """Refuse the fused cross-entropy (``Recipe.fused_cross_entropy``) under tensor parallelism:
    its vocabulary-parallel form is not modelled."""
    if recipe.fused_cross_entropy and layout.tp > 1:
        raise LayoutError(
            "fused_cross_entropy",
            f"--fused-cross-entropy with tp={layout.tp}: the vocabulary-parallel form of the fused kernel is not "
            "modelled; use --tp 1, or drop --fused-cross-entropy",
        )


def check_fp8_options(spec: ModelSpec, recipe: Recipe) -> None:
    """The model rule of the Transformer Engine FP8 switches (the recipe's own are checked when it
    is built): Megatron-Core stores the activation input in FP8 only for SwiGLU
    (transformer_config.py L2467-2469)."""
    if recipe.fp8_activation_store and spec.activation != "swiglu":
        raise RecipeError(
            "fp8_activation_store",
            f"Megatron-Core stores the activation input in FP8 only for SwiGLU; {spec.name} uses "
            f"{spec.activation}: drop --fp8-activation-store",
        )


def fp8_params_needs_sharding(recipe: Recipe) -> bool:
    """Whether ``recipe`` trains FP8 weights (``Recipe.fp8_params`` with trained base weights),
    which Megatron-LM accepts only with the distributed optimizer or an FSDP, ZeRO ≥ 1
    (megatron/training/arguments.py L1095-1097: "--fp8-param-gather only supported with
    distributed optimizer, torch fsdp2, megatron fsdp, or inference mode")."""
    return recipe.fp8_params and not recipe.is_peft


def check_fp8_layout(recipe: Recipe, layout: Layout) -> None:
    """Refuse trained FP8 weights without ZeRO (:func:`fp8_params_needs_sharding`)."""
    if fp8_params_needs_sharding(recipe) and layout.zero == 0:
        raise LayoutError(
            "fp8_params",
            "--fp8-params trains FP8 weights that Megatron-LM keeps only with the distributed optimizer or an "
            "FSDP ('--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp'); "
            "use --zero 1 or more",
        )


def check_moe_tp(spec: ModelSpec, recipe: Recipe, layout: Layout) -> None:
    """Refuse the MoE layouts with tensor parallelism that the megatron stack does not train or
    that are modelled on it only: Megatron-Core trains MoE with tp > 1 only under sequence
    parallelism (megatron/core/transformer/moe/moe_layer.py raises "MoE and tensor parallelism
    are enabled without also enabling sequence parallelism"; megatron/training/yaml_arguments.py
    asserts it), and parallel folding (``Layout.etp`` = 1) is Megatron-Core's expert rank order."""
    if spec.moe is None:
        return
    if layout.tp > 1 and recipe.stack == "megatron" and not layout.sequence_parallel:
        raise LayoutError(
            "sequence_parallel",
            f"tp={layout.tp} with mixture-of-experts layers on the megatron stack needs sequence "
            "parallelism (Megatron-Core refuses MoE with tensor parallelism without it); add "
            "--sequence-parallel, or name the engine you run (--engine)",
        )
    if layout.expert_tp != layout.tp and recipe.stack != "megatron":
        raise LayoutError(
            "etp",
            f"--etp {layout.expert_tp} is Megatron-Core's parallel folding, modelled with its expert "
            f"rank order; the {recipe.stack} stack is not modelled with it: use --stack megatron (or "
            "--engine megatron / nemo), or drop --etp",
        )


def check_moe_routing(recipe: Recipe, layout: Layout) -> None:
    """Refuse the layouts under which capacity-padded or einsum-dispatched routing is not
    modelled: the capacity is per whole sequence (MaxText's training groups), which context
    parallelism splits; the einsums run on the whole hidden width of a sequence, which tensor
    parallelism would replicate or split in ways no published implementation fixes."""
    if recipe.moe_capacity_factor is not None and layout.cp > 1:
        raise LayoutError(
            "cp",
            f"--moe-capacity-factor with context parallelism (cp={layout.cp}): the capacity is counted per "
            "whole sequence, which cp splits across devices; use --cp 1, or dropless routing",
        )
    if recipe.moe_dispatch == "einsum" and layout.tp > 1:
        raise LayoutError(
            "tp",
            f"--moe-dispatch einsum with tensor parallelism (tp={layout.tp}) is not modelled (GShard and "
            "MaxText run the one-hot einsums on whole hidden vectors); use --tp 1, or --moe-dispatch gather",
        )


def layer_forward_flops(
    spec: ModelSpec, layer_idx: int, b: float, s: float, causal: bool = True
) -> LayerFlops:
    """GEMM FLOPs of one forward of layer ``layer_idx`` over ``b`` sequences of ``s`` tokens.

    Derivation: each linear ``n_in → n_out`` applied to T tokens is a (T×n_in)·(n_in×n_out) matmul,
    2·T·n_in·n_out FLOPs; the attention core is two batched matmuls per head of s×d by d×s and
    s×s by s×d (Shoeybi et al. 2019; Narayanan et al. 2021, Sec. 5.1 and App.; GQA: Ainslie et al.
    2023 changes only the K/V projection widths; MLA, DeepSeek-V2 Eqs. 9-19, projects through the
    latents of :class:`~trainplan.models.spec.MLASpec`). MoE layers (``spec.is_moe_layer``) replace the
    dense MLP by K routed experts per token plus the shared experts (Fedus et al. 2021; DeepSeekMoE,
    Dai et al. 2024), and add the router ``h → E``.
    """
    _check_layer(spec, layer_idx)
    t = b * s
    h = spec.hidden_size
    qkv = 2.0 * t * spec.attention_weights("column")
    latent = 2.0 * t * spec.attention_weights("replicated")
    out = 2.0 * t * spec.attention_weights("row")
    window = spec.attention_window if spec.is_local_layer(layer_idx) else 0
    scores = _attention_core_flops(spec, b, s, causal, spec.head_dim, window)
    values = _attention_core_flops(spec, b, s, causal, spec.v_head_dim, window)
    attn = {
        "qkv_proj": qkv,
        "attn_scores": scores,
        "attn_values": values,
        "out_proj": out,
        "latent_proj": latent,
    }
    m = _mlp_matrices(spec)
    moe = spec.moe
    if moe is not None and spec.is_moe_layer(layer_idx):
        widths = moe.top_k * moe.expert_ffn_hidden + moe.num_shared_experts * moe.shared_width
        experts = 2.0 * t * h * widths * m
        router = 2.0 * t * h * moe.num_experts
        if moe.shared_expert_gate and moe.num_shared_experts:
            router += 2.0 * t * h
        return LayerFlops(**attn, moe_experts=experts, router=router)
    mlp = 2.0 * t * h * spec.ffn_hidden * m
    return LayerFlops(**attn, mlp=mlp)


def logits_forward_flops(spec: ModelSpec, b: float, s: float) -> float:
    """LM head (output projection to the vocabulary): 2·b·s·h·V (Narayanan et al. 2021, App.).

    With a projected embedding (``spec.embed_projected``, OPT-350M) the head is e wide, 2·b·s·e·V,
    and ``project_out`` (h→e) before it and ``project_in`` (e→h) after the embedding add 2·b·s·e·h
    each (transformers ``modeling_opt.py`` ``OPTDecoder``); both are counted here, with the head."""
    e = spec.embed_width
    proj = 2.0 * 2.0 * b * s * e * spec.hidden_size if spec.embed_projected else 0.0
    return 2.0 * b * s * e * spec.vocab_size + proj


def gemm_params(spec: ModelSpec, *, active: bool = True) -> int:
    """Weights that take part in a GEMM for each token: the ``N`` of the ``6·N·T`` rule.

    Per layer: ``h·(a + 2k)·d + a·d·h`` (attention; MLA: its five matrices,
    :attr:`~trainplan.models.spec.ModelSpec.attention_projections`) + ``m·h·f`` (dense MLP, m = 3 gated / 2) or
    ``m·h·(K·f_e + S·f_s) + h·E`` (MoE with ``active=True``: the K routed experts a token uses, the S
    shared experts and the router; ``active=False`` counts all E experts). Plus the LM head ``V·e``
    (a GEMM whether or not it is tied to the embedding; e = h unless projected) and OPT-350M's
    ``project_in`` / ``project_out`` (2·e·h). Excluded: the embedding lookup (a gather,
    no FLOPs), biases, norm weights, learned position tables. Computed here from the spec so the
    FLOP count does not depend on the parameter-count module.
    """
    h = spec.hidden_size
    m = _mlp_matrices(spec)
    attn = spec.attention_weights()
    e = spec.embed_width
    total = spec.vocab_size * e + (2 * e * h if spec.embed_projected else 0)
    moe = spec.moe
    for i in range(spec.num_layers):
        total += attn
        if moe is not None and spec.is_moe_layer(i):
            routed = moe.top_k if active else moe.num_experts
            total += m * h * (routed * moe.expert_ffn_hidden + moe.num_shared_experts * moe.shared_width)
            total += h * moe.num_experts
            if moe.shared_expert_gate and moe.num_shared_experts:
                total += h
        else:
            total += m * h * spec.ffn_hidden
    return total


# --------------------------------------------------------------------------------------------
# GEMM shapes (for shape-dependent efficiency in the timing model)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Gemm:
    """``count`` matmuls of (m×k)·(k×n) on one device, forward; FLOPs = count·2·m·n·k."""

    name: str
    m: float
    n: float
    k: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return self.count * 2.0 * self.m * self.n * self.k


def layer_gemms(
    spec: ModelSpec,
    layer_idx: int,
    tokens: float,
    *,
    tp: int = 1,
    ep: int = 1,
    slot_ratio: float = 1.0,
    einsum: tuple[int, int] | None = None,
    etp: int | None = None,
) -> tuple[Gemm, ...]:
    """Forward weight GEMMs of one layer on one device that holds ``tokens`` tokens.

    Megatron tensor parallelism (Shoeybi et al. 2019, Sec. 3) splits the output dimension of the
    column-parallel layers (QKV, gate/up) and the input dimension of the row-parallel ones (out,
    down) by ``tp``. Routed experts under balanced routing: each of the ``E/ep`` local experts sees
    ``tokens·K·ep/E`` tokens (the ep group's tokens spread evenly; Fedus et al. 2021, Sec. 2.2 with
    capacity factor 1). The router is not split by tp. The experts' linears split over ``etp``
    (None: tp): with etp = 1 (parallel folding, ``Layout.etp``) each rank runs whole experts on
    the rows of its own sequence-parallel shard, 1/tp of the ``tokens`` the tp group gathers.

    ``slot_ratio`` (:func:`expert_slot_ratio`): each expert runs on its padded capacity, ratio
    times the balanced rows. ``einsum`` = (S, E·C): the one-hot dispatch ``BSM,BSEC -> EBCM`` is
    one (E·C × S)·(S × h) matmul per sequence and the combine ``EBCM,BSEC -> BSM`` one
    (S × E·C)·(E·C × h) (:func:`moe_einsum_flops`). The down projections of MLA are replicated
    over tp (:class:`~trainplan.models.spec.Projection`).
    """
    _check_layer(spec, layer_idx)
    h = spec.hidden_size
    if spec.mla is None:
        gemms = [
            Gemm(name="qkv_proj", m=tokens, n=(spec.q_dim + 2 * spec.kv_dim) / tp, k=h),
            Gemm(name="out_proj", m=tokens, n=h, k=spec.q_dim / tp),
        ]
    else:  # MLA: each projection its own GEMM (the down projections not split by tp)
        gemms = [
            Gemm(
                name=p.name + "_proj",
                m=tokens,
                n=p.n_out / (tp if p.split == "column" else 1),
                k=p.n_in / (tp if p.split == "row" else 1),
            )
            for p in spec.attention_projections
        ]
    up_count = 2.0 if spec.gated else 1.0
    moe = spec.moe
    if moe is not None and spec.is_moe_layer(layer_idx):
        et = tp if etp is None else etp
        local = moe.num_experts / ep
        per_expert = tokens * moe.top_k * ep / moe.num_experts * slot_ratio * et / tp
        fe = moe.expert_ffn_hidden / et
        gemms += [
            Gemm(name="router", m=tokens, n=moe.num_experts, k=h),
            Gemm(name="expert_up", m=per_expert, n=fe, k=h, count=local * up_count),
            Gemm(name="expert_down", m=per_expert, n=h, k=fe, count=local),
        ]
        if einsum is not None:
            seq, ec = einsum
            sequences = tokens / seq
            gemms += [
                Gemm(name="moe_dispatch", m=ec, n=h, k=seq, count=sequences),
                Gemm(name="moe_combine", m=seq, n=h, k=ec, count=sequences),
            ]
        if moe.num_shared_experts:
            fs = moe.shared_width / tp
            gemms += [
                Gemm(name="shared_up", m=tokens, n=fs, k=h, count=moe.num_shared_experts * up_count),
                Gemm(name="shared_down", m=tokens, n=h, k=fs, count=moe.num_shared_experts),
            ]
    else:
        f = spec.ffn_hidden / tp
        gemms += [
            Gemm(name="mlp_up", m=tokens, n=f, k=h, count=up_count),
            Gemm(name="mlp_down", m=tokens, n=h, k=f),
        ]
    return tuple(gemms)


# --------------------------------------------------------------------------------------------
# LoRA adapters
# --------------------------------------------------------------------------------------------
def _lora_linear_dims(spec: ModelSpec, layer_idx: int, target: str) -> list[tuple[int, int, float, int]]:
    """(n_in, n_out, uses per token, adapter copies) of the linears one LoRA module name
    (:func:`trainplan.models.params.lora_modules`) names in one layer: an attention projection
    of ``spec.attention_projections``, or an MLP matrix (every expert on MoE layers)."""
    h = spec.hidden_size
    for p in spec.attention_projections:
        if p.name == target:
            return [(p.n_in, p.n_out, 1.0, 1)]
    if target == "gate" and not spec.gated:
        return []
    moe = spec.moe
    widths: list[tuple[int, float, int]]
    if moe is not None and spec.is_moe_layer(layer_idx):
        widths = [(moe.expert_ffn_hidden, float(moe.top_k), moe.num_experts)]
        if moe.num_shared_experts:
            widths.append((moe.shared_width, float(moe.num_shared_experts), moe.num_shared_experts))
    else:
        widths = [(spec.ffn_hidden, 1.0, 1)]
    if target in ("gate", "up"):
        return [(h, w, uses, copies) for w, uses, copies in widths]
    return [(w, h, uses, copies) for w, uses, copies in widths]  # down


def lora_adapter_flops_per_token(spec: ModelSpec, layer_idx: int, lora: LoRASpec) -> float:
    """Forward FLOPs per token of the LoRA adapters of one layer: Σ 2·r·(n_in + n_out).

    Each adapted linear ``n_in → n_out`` adds ``x·A`` (n_in → r) and ``(xA)·B`` (r → n_out)
    (Hu et al. 2021, Sec. 4.1). MLP targets on MoE layers adapt the experts a token uses (K routed +
    shared), as PEFT does when the target names match the expert projections.
    """
    total = 0.0
    for module in lora_modules(spec, lora.targets):
        for n_in, n_out, uses, _ in _lora_linear_dims(spec, layer_idx, module):
            total += 2.0 * lora.rank * (n_in + n_out) * uses
    return total


def lora_adapter_params(spec: ModelSpec, lora: LoRASpec) -> int:
    """Trainable adapter weights: Σ r·(n_in + n_out) over adapted linears (every expert on MoE layers)."""
    total = 0
    for i in range(spec.num_layers):
        for module in lora_modules(spec, lora.targets):
            for n_in, n_out, _, copies in _lora_linear_dims(spec, i, module):
                total += copies * lora.rank * (n_in + n_out)
    return total


# --------------------------------------------------------------------------------------------
# Memory-bound work (bytes)
# --------------------------------------------------------------------------------------------
EAGER_RMSNORM_TRAFFIC: Final = 9.0
"""Bytes an eager (uncompiled) RMSNorm moves per byte of the fused kernel's read + write.

PyTorch's eager RMSNorm is a chain of kernels — torchtitan's ``RMSNorm.forward``
(pytorch/torchtitan@9dec370 torchtitan/models/norms.py lines 96-101: ``x.float()``, ``pow(2)``,
``mean``, ``x * rsqrt(...)``, ``type_as(x)``, ``* weight``), Hugging Face's ``LlamaRMSNorm`` (the
same chain), ATen's composite ``rms_norm`` — each reading and writing the whole tensor, FP32 in
between: per element e + 4 (upcast), 8 (pow), 4 (mean), 8 (normalise), 4 + e (downcast), 2e (weight)
= 28 + 4e bytes, against 2e for one fused kernel: 9 at e = 2. LayerNorm is one native kernel in
eager mode (``native_layer_norm``): no such factor. The backward is assumed to scale alike."""
EAGER_ROTARY_TRAFFIC: Final = 5.0
"""The same for eager rotary embeddings: torchtitan ``apply_rotary_emb`` (9dec370
torchtitan/models/llama/model.py lines 108-113: ``float()``, complex multiply, ``type_as``)
moves e + 4, 8 and 4 + e bytes per element of q and k, 16 + 2e = 20 against 2e = 4 fused."""
EAGER_GATED_ACTIVATION_TRAFFIC: Final = 5.0 / 3.0
"""The same for an eager gated MLP activation, ``silu(gate) * up`` (torchtitan ``FeedForward``,
transformers ``LlamaMLP``): ``silu`` reads and writes (2e), the product reads two and writes one
(3e), 5e against the fused kernel's 3e. A GELU MLP is one native kernel: no factor."""


def eager_kernels(recipe: Recipe) -> bool:
    """Whether a step's memory-bound ops run as PyTorch's eager chains of kernels
    (:data:`EAGER_RMSNORM_TRAFFIC` and the two after it): the pytorch stack without
    ``torch.compile`` (``Recipe.torch_compile``). The megatron stack runs Transformer Engine's
    fused kernels, maxtext and neuron are compiled by XLA / the Neuron compiler, and the
    deepspeed stack's κ is fitted on runs of eager Hugging Face modules (it holds their cost)."""
    return recipe.stack == "pytorch" and not recipe.torch_compile


@dataclass(frozen=True, kw_only=True)
class LayerMemoryTraffic:
    """HBM bytes read + written by the memory-bound ops of one pass of one layer (all devices).

    Each term counts whole-tensor reads and writes of unfused elementwise / reduction kernels, with
    ``e`` bytes per activation element, T = b·s tokens (forward / backward tensors touched):

    ``norms``       pre-attention + pre-MLP norm (+2 post-norms, + q/k norms):   x→y (2) / x,dy→dx (3)
    ``rotary``      RoPE on q and k, T·(a+k)·d elements (MLA: T·(a+1)·d_r):       2 / 2
    ``activation``  GELU on T·f: 2 / 3;  SwiGLU/GeGLU (gate, up → y):            3 / 5
    ``softmax``     eager attention only, b·a·s² elements (full matrix; the mask is applied by
                    value, not skipped):                                        2 / 3
    ``attention_io`` flash attention kernel I/O: reads Q, K, V, writes O:         (2a+2k)·d·T
                    backward reads Q, K, V, O, dO and writes dQ, dK, dV:          (4a+4k)·d·T
                    (MLA: Q, K a·(d_n+d_r) and V, O a·d_v wide)
    ``norms`` with MLA also count the latent norms over r_q and r_kv: (r_q+r_kv)·T, 2 / 3
    ``residual``    two residual adds, T·h each:                                 3 / 3
                    (+ a 1-byte dropout mask per add when dropout > 0: 1 / 1)
    ``softmax`` with dropout > 0 also moves the attention-dropout output and mask: (2e+1) both ways
    ``moe_permute`` token dispatch (gather T·K rows) and combine (weighted scatter back):
                    T·K·h·2 + T·K·h + T·h  both ways
    ``router``      softmax + top-k over T·E router logits:                      2 / 2

    Sources: the tensor lists follow Korthikanti et al. 2022, Sec. 4.1 (which tensors each op reads
    and stores); the read/write counts are the minimal traffic of an unfused kernel (an assumption
    about fusion, not a measurement). GEMM operand traffic is not included: the GEMM roofline owns it.
    """

    norms: float
    rotary: float
    activation: float
    softmax: float
    attention_io: float
    residual: float
    moe_permute: float = 0.0
    router: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.norms
            + self.rotary
            + self.activation
            + self.softmax
            + self.attention_io
            + self.residual
            + self.moe_permute
            + self.router
        )


def layer_memory_traffic(
    spec: ModelSpec,
    layer_idx: int,
    b: float,
    s: float,
    *,
    dtype_bytes: float = 2.0,
    attention: Literal["flash", "eager"] = "flash",
    direction: Direction = "forward",
    dropout: bool = False,
    eager: bool = False,
    slot_ratio: float = 1.0,
    einsum_dispatch: bool = False,
) -> LayerMemoryTraffic:
    """Bytes moved by the memory-bound ops of one forward or backward of one layer (see the class).

    ``eager``: RMSNorms, rotary embeddings and gated activations as PyTorch's eager chains of
    kernels (:func:`eager_kernels`), their traffic scaled by :data:`EAGER_RMSNORM_TRAFFIC`,
    :data:`EAGER_ROTARY_TRAFFIC` and :data:`EAGER_GATED_ACTIVATION_TRAFFIC`.

    ``slot_ratio``: routed-expert slots per routed token (:func:`expert_slot_ratio`): the expert
    activation runs on the padded slots. ``einsum_dispatch``: tokens reach the experts by the
    one-hot matmuls of :func:`moe_einsum_flops`, whose operands the GEMM roofline owns, so there is
    no gather/scatter traffic (``moe_permute`` 0); building the one-hot masks (integer and 1- or
    2-byte elements, S·E·C per sequence) is not counted: against the 2·h FLOPs per mask element of
    each einsum it is a few bytes."""
    _check_layer(spec, layer_idx)
    bwd = direction == "backward"
    t = b * s
    h = spec.hidden_size
    e = dtype_bytes
    norm_count = 2 + (2 if spec.post_norms else 0)
    norms = norm_count * t * h * e * (3 if bwd else 2)
    if spec.qk_norm:
        norms += t * (spec.num_heads + spec.num_kv_heads) * spec.head_dim * e * (3 if bwd else 2)
    mla = spec.mla
    if mla is not None:
        # the latent norms over r_q and r_kv; RoPE on the a query heads' d_r part and the one
        # shared rotary key (DeepSeek-V2 Eq. 14-15)
        norms += t * (mla.q_lora_rank + mla.kv_lora_rank) * e * (3 if bwd else 2)
        qk_elems = t * (spec.num_heads + 1) * mla.qk_rope_head_dim
    else:
        qk_elems = t * (spec.num_heads + spec.num_kv_heads) * spec.head_dim
    rotary = 2.0 * qk_elems * e if spec.position == "rope" else 0.0
    moe = spec.moe
    is_moe = moe is not None and spec.is_moe_layer(layer_idx)
    if moe is not None and is_moe:
        act_width = slot_ratio * moe.top_k * moe.expert_ffn_hidden + moe.num_shared_experts * moe.shared_width
    else:
        act_width = spec.ffn_hidden
    if spec.gated:
        activation = t * act_width * e * (5 if bwd else 3)
    else:
        activation = t * act_width * e * (3 if bwd else 2)
    if attention == "eager":
        softmax = b * spec.num_heads * s * s * e * (3 if bwd else 2)
        if dropout:
            # attention-probability dropout: forward reads P, writes P' and a 1-byte mask; backward
            # reads dP' and the mask, writes dP (Korthikanti et al. 2022 Sec. 4.1 lists the mask)
            softmax += b * spec.num_heads * s * s * (2 * e + 1)
        attention_io = 0.0
    else:
        softmax = 0.0
        # Q, K, V in and O out (a·d + k·d + k·d + a·d; MLA a·(d_n+d_r) twice and a·d_v twice)
        qkvo = spec.q_dim + spec.kv_dim + spec.v_dim + spec.attn_out_dim
        attention_io = t * (2 if bwd else 1) * qkvo * e
    if eager:
        if spec.norm == "rmsnorm":
            norms *= EAGER_RMSNORM_TRAFFIC
        rotary *= EAGER_ROTARY_TRAFFIC
        if spec.gated:
            activation *= EAGER_GATED_ACTIVATION_TRAFFIC
    residual = 2 * 3.0 * t * h * e
    if dropout:
        residual += 2 * 1.0 * t * h  # two hidden dropouts fused with the residual add: 1-byte mask each
    moe_permute = 0.0
    router = 0.0
    if moe is not None and is_moe:
        moe_permute = 0.0 if einsum_dispatch else (3.0 * t * moe.top_k * h * slot_ratio + t * h) * e
        router = 2.0 * t * moe.num_experts * e
    return LayerMemoryTraffic(
        norms=norms,
        rotary=rotary,
        activation=activation,
        softmax=softmax,
        attention_io=attention_io,
        residual=residual,
        moe_permute=moe_permute,
        router=router,
    )


def embedding_memory_bytes(spec: ModelSpec, b: float, s: float, *, dtype_bytes: float = 2.0) -> float:
    """Embedding gather (forward) or scatter-add of its gradient (backward): read + write T·e
    (e = ``embed_width``: the hidden size unless projected)."""
    return 2.0 * b * s * spec.embed_width * dtype_bytes


def logits_memory_bytes(
    spec: ModelSpec,
    b: float,
    s: float,
    *,
    dtype_bytes: float = 2.0,
    fused: bool = False,
    backward: bool = False,
) -> float:
    """Cross-entropy over the logits, one direction: read T·V logits (e bytes), write T·V FP32.

    Forward reads the logits and writes FP32 probabilities (or their log-sum-exp); backward reads
    those and writes the logit gradient. Both directions move ``T·V·(e + 4)`` bytes (assumption:
    an unfused FP32 cross-entropy, the PyTorch default). ``fused`` (``Recipe.fused_cross_entropy``,
    flash-attn's kernel): the forward reads the logits once (``T·V·e``; the per-token loss and
    log-sum-exp are T values), the backward reads them and writes their gradient (``2·T·V·e``).
    """
    if fused:
        return (2.0 if backward else 1.0) * b * s * spec.vocab_size * dtype_bytes
    return b * s * spec.vocab_size * (dtype_bytes + _FP32_BYTES)


def qlora_dequant_bytes_per_param(lora: LoRASpec) -> float:
    """Bytes moved to dequantise one NF4 weight to BF16: read 0.5 B + its constants, write 2 B.

    Quantisation constants (Dettmers et al. 2023, Sec. 3, "Double Quantization"): one FP32 absmax
    per ``quant_block`` weights, or with double quantisation one 8-bit constant per block plus one
    FP32 per ``double_quant_block`` blocks. bitsandbytes dequantises each weight before every GEMM
    that uses it, so this is paid per pass (forward, backward dX, recompute) per micro-batch.
    """
    if lora.double_quant:
        constants = 1.0 / lora.quant_block + _FP32_BYTES / (lora.quant_block * lora.double_quant_block)
    else:
        constants = _FP32_BYTES / lora.quant_block
    return BYTES_PER_ELEMENT["nf4"] + constants + BYTES_PER_ELEMENT["bf16"]


def _quantised_layer_params(spec: ModelSpec, layer_idx: int) -> float:
    """Linear weights of one block that QLoRA stores in NF4 (all experts; router and LM head stay BF16)."""
    h = spec.hidden_size
    m = _mlp_matrices(spec)
    attn = spec.attention_weights()
    moe = spec.moe
    if moe is not None and spec.is_moe_layer(layer_idx):
        widths = moe.num_experts * moe.expert_ffn_hidden + moe.num_shared_experts * moe.shared_width
        return float(attn + m * h * widths)
    return float(attn + m * h * spec.ffn_hidden)


# Optimizer update traffic per trained parameter, bytes excluding the gradient read and the
# compute-copy write (added from the recipe's dtypes): reads + writes of the FP32 master weight and
# the optimizer states. adamw: master 4+4, m 4+4, v 4+4; adamw-8bit: master 4+4, m 1+1, v 1+1
# (Dettmers et al. 2022, 8-bit optimizers; block constants ignored); sgd: master 4+4;
# sgd-momentum / lion: + one FP32 state 4+4; adafactor: master 4+4 + factored second moment (≈0)
# + one more read of the gradient for its row/column statistics (counted as 4).
_OPTIMIZER_STATE_BYTES: dict[str, float] = {
    "adamw": 24.0,
    "adamw-8bit": 12.0,
    "sgd": 8.0,
    "sgd-momentum": 16.0,
    "lion": 16.0,
    "adafactor": 12.0,
}


def optimizer_update_bytes(trained_params: float, recipe: Recipe) -> float:
    """HBM bytes of one optimizer step over ``trained_params`` parameters on one device.

    Per parameter: the optimizer's state traffic (table above; ZeRO Sec. 3.1 for the FP32 master +
    Adam moments layout), one read of the gradient for the global-norm clip and one for the update
    (gradient dtype = the recipe's weight dtype), and the write of the low-precision compute copy
    when master weights are kept (``recipe.py`` precision table). With ``precision=fp32`` there is no
    separate master copy: the FP32 weight itself is read and written (same 8 bytes).
    """
    grad_b = BYTES_PER_ELEMENT[recipe.weight_dtype]
    per_param = _OPTIMIZER_STATE_BYTES[recipe.optimizer] + 2.0 * grad_b
    if recipe.keeps_master_weights:
        per_param += BYTES_PER_ELEMENT[recipe.weight_dtype]
    return trained_params * per_param


# --------------------------------------------------------------------------------------------
# Full recompute with early stop
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RecomputeSkip:
    """Forward work of one layer (all devices) that full recompute with early stop does not redo.

    ``gemm_flops`` splits like the MLP GEMMs (tp, cp); ``memory_bytes`` (residual adds, the MoE
    combine) like the residual traffic (cp, and tp only with sequence parallelism).
    """

    gemm_flops: float = 0.0
    memory_bytes: float = 0.0


def early_stop_skip(spec: ModelSpec, layer_idx: int, recipe: Recipe, b: float, s: float) -> RecomputeSkip:
    """What PyTorch's non-reentrant checkpoint with early stop leaves out of a block's recompute.

    ``torch.utils.checkpoint`` (``use_reentrant=False``, ``early_stop=True`` by default,
    ``set_checkpoint_early_stop``) counts the tensors the recomputation saves for backward and
    raises ``_StopRecomputationError`` from the saved-tensor pack hook once it has saved as many as
    the original forward did (``torch/utils/checkpoint.py``, ``_recomputation_hook``). The ops
    after the block's last save are therefore not re-run. Where that last save falls, in the
    op order of the reference blocks (``trainplan.trace.models``; Hugging Face and torchtitan
    blocks have the same order):

    * A built-in autograd op saves its inputs *before* it runs, so a plain ``nn.Linear`` down
      projection, whose input (trained weight) or weight (frozen base, LoRA) is saved, is the last
      save of a dense block, and its forward GEMM ``2·T·f·h`` is skipped. With LoRA on ``down``
      the adapter's ``B`` (``r → h``) runs last: its GEMM ``2·T·r·h`` is skipped, the base GEMM is
      redone.
    * A custom ``torch.autograd.Function`` saves when it returns, after its matmul: bitsandbytes'
      ``MatMul4Bit`` (the QLoRA NF4 base; the down GEMM is redone unless LoRA ``B`` follows it)
      and the FP8 / FP4 linears (torchao ``Float8Linear``'s ``matmul_with_hp_or_float8_args``,
      ``MXLinear``'s ``mx_mm``): no GEMM is skipped with ``precision`` fp8 or fp4.
    * A post-MLP norm (Gemma 2) saves the MLP output, a hidden dropout after the MLP its mask,
      both after the down projection has run: no GEMM is skipped.
    * MoE blocks: the routed experts end with ``index_add`` (the combine), which saves its index
      and source before it runs, so without shared experts the combine scatter is skipped. Shared
      experts run after it: with a sigmoid gate the gate product saves the shared output (nothing
      skipped); ungated, the last shared expert's down projection is skipped as above.
    * The residual add after the MLP saves nothing and is always skipped (both adds of a
      parallel attention/MLP block, ``x + a + m``).

    Memory-bound bytes of the skipped ops follow :class:`LayerMemoryTraffic` (a residual add
    moves ``3·T·h·e`` bytes; the combine ``(T·K·h + T·h)·e``). GEMM output traffic is owned by
    the GEMM roofline and needs no separate term.
    """
    _check_layer(spec, layer_idx)
    t = b * s
    h = spec.hidden_size
    e = BYTES_PER_ELEMENT[recipe.weight_dtype]
    adds = 2.0 if spec.parallel_attn_mlp else 1.0
    memory = adds * 3.0 * t * h * e
    moe = spec.moe
    last_width = 0  # width of the down projection that runs after the block's last save, if any
    saved_after_mlp = (spec.post_norms and not spec.parallel_attn_mlp) or recipe.dropout > 0.0
    if saved_after_mlp:
        last_width = 0  # the post-MLP norm / hidden dropout saves after the down projection ran
    elif moe is not None and spec.is_moe_layer(layer_idx):
        if not moe.num_shared_experts:
            memory += (t * moe.top_k * h + t * h) * e
        elif not moe.shared_expert_gate:
            last_width = moe.shared_width
    else:
        last_width = spec.ffn_hidden
    gemm = 0.0
    lora = recipe.lora if recipe.is_peft else None
    if last_width and recipe.precision not in ("fp8", "fp4"):
        if lora is not None and "down" in lora.targets:
            gemm = 2.0 * t * lora.rank * h
        elif recipe.method != "qlora":
            gemm = 2.0 * t * last_width * h
    return RecomputeSkip(gemm_flops=gemm, memory_bytes=memory)


# --------------------------------------------------------------------------------------------
# Per-op selective checkpointing
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SacRecompute:
    """Forward work of one layer (all devices) that ``recompute="sac"`` re-runs in the backward.

    ``gemm_flops``: the recomputed linear layers; ``skipped_memory_bytes``: the memory-bound
    forward traffic early stop leaves out (the trailing residual adds), to subtract from the
    block's memory-bound forward bytes less the attention kernel's I/O.
    """

    gemm_flops: float = 0.0
    skipped_memory_bytes: float = 0.0


def sac_recompute(spec: ModelSpec, layer_idx: int, recipe: Recipe, b: float, s: float) -> SacRecompute:
    """What torchtitan's per-op selective checkpointing recomputes of one block (:mod:`trainplan.sac`).

    The policy keeps the outputs of the odd-numbered bias-free matmuls and of the attention
    kernel and recomputes every other op from the block input, so the recompute pass is:

    * GEMMs: every linear whose output is not kept (:func:`trainplan.sac.block_linears`), its
      forward ``2·T·n_in·n_out``: k, o and up of a Llama block, ``2·T·h·(k·d + a·d + f)``; every
      projection of a block whose linears have biases (``aten.addmm`` is recomputed);
    * not the attention core: the kernel's output is kept (no attention FLOPs, no attention I/O);
    * the memory-bound forward ops — norms, rotary, the activation function, residual adds —
      as :class:`LayerMemoryTraffic` counts them.

    With ``recompute_early_stop`` the recomputation stops at the block's last saved tensor
    (:func:`early_stop_skip`): the residual add after the MLP is skipped, and the down
    projection's GEMM when it is recomputed (a kept matmul costs nothing to skip).
    """
    t = b * s
    linears = block_linears(spec)
    gemm = sum(2.0 * t * lin.n_in * lin.n_out for lin in linears if not lin.saved)
    skipped = 0.0
    if recipe.recompute_early_stop:
        skip = early_stop_skip(spec, layer_idx, recipe, b, s)
        down_kept = linears[-1].saved
        gemm -= 0.0 if down_kept else skip.gemm_flops
        skipped = skip.memory_bytes
    return SacRecompute(gemm_flops=gemm, skipped_memory_bytes=skipped)


# --------------------------------------------------------------------------------------------
# Passes and steps
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PassCost:
    """One pass (forward, backward or recompute): GEMM FLOPs, attention-core FLOPs, memory-bound bytes.

    ``hp_gemm_flops`` is the part of ``gemm_flops`` that an FP8 / FP4 recipe still runs at the
    activation precision (BF16): the LM head. Megatron-Core's output layer is a plain
    ``ColumnParallelLinear``, not a Transformer Engine FP8 module (Megatron Bridge's performance
    guide: FP8 "exclusively to the linear layers within the Transformer block"), and torchtitan's
    float8 converter skips ``output`` (``torchtitan/components/quantization/float8.py``).
    """

    gemm_flops: float = 0.0
    attention_flops: float = 0.0
    memory_bytes: float = 0.0
    hp_gemm_flops: float = 0.0

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attention_flops

    def __add__(self, other: PassCost) -> PassCost:
        return PassCost(
            gemm_flops=self.gemm_flops + other.gemm_flops,
            attention_flops=self.attention_flops + other.attention_flops,
            memory_bytes=self.memory_bytes + other.memory_bytes,
            hp_gemm_flops=self.hp_gemm_flops + other.hp_gemm_flops,
        )

    def scaled(self, factor: float) -> PassCost:
        return PassCost(
            gemm_flops=self.gemm_flops * factor,
            attention_flops=self.attention_flops * factor,
            memory_bytes=self.memory_bytes * factor,
            hp_gemm_flops=self.hp_gemm_flops * factor,
        )


_NO_PASS: Final = PassCost()
"""The empty sum of passes (a stage without layers)."""


@dataclass(frozen=True, kw_only=True)
class _Split:
    """Per-device divisors of the layer terms (1 = replicated)."""

    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False

    @property
    def sharded(self) -> float:
        """Tensor-parallel ops (projections, MLP, attention heads): split by tp and by cp (tokens)."""
        return float(self.tp * self.cp)

    @property
    def replicated_unless_sp(self) -> float:
        """Norms, residuals, router: split over the sequence by cp; over tp only with SP."""
        return float(self.cp * (self.tp if self.sequence_parallel else 1))


@dataclass(frozen=True, kw_only=True)
class _LayerPasses:
    forward: PassCost
    backward: PassCost
    recompute: PassCost
    model_flops: float
    dequant_bytes: float


def _selective_recompute(
    spec: ModelSpec,
    recipe: Recipe,
    fl: LayerFlops,
    fwd_mem: LayerMemoryTraffic,
    attn_fwd: float,
    moe_layer: bool,
    split: _Split,
    b: float,
) -> PassCost:
    """The forward work selective recompute repeats in one layer's backward, module by module
    (:attr:`trainplan.recipe.Recipe.recompute_modules`; Megatron-Core
    ``TransformerConfig.recompute_modules``):

    * ``core_attn``: the attention core, QKᵀ and PV, and its kernel I/O (or eager softmax)
      (Korthikanti et al. 2022, Sec. 5);
    * ``mla_up_proj``: MLA's up projections q_b and kv_b (the column-parallel q/k/v GEMMs) and
      the rotary embedding they feed (``MLASelfAttention``: ``qkv_up_checkpoint``);
    * ``mlp``: a dense layer's MLP, its GEMMs, activation function and pre-MLP norm
      (``TransformerLayer.recompute_mlp``; MoE layers excepted);
    * ``moe_act``: the routed experts' activation function (memory-bound; the shared experts'
      share of the activation traffic is left out).
    """
    mods = recompute_module_set(recipe)
    tpcp, rep = split.sharded, split.replicated_unless_sp
    gemm = attention = nbytes = 0.0
    if "core_attn" in mods:
        attention += attn_fwd
        nbytes += (fwd_mem.softmax + fwd_mem.attention_io) / tpcp
    if "mla_up_proj" in mods and spec.mla is not None:
        gemm += fl.qkv_proj / tpcp
        nbytes += fwd_mem.rotary / tpcp
    if "mlp" in mods and not moe_layer:
        gemm += fl.mlp / tpcp
        # its activation and its pre-MLP norm (read and write of T·h: LayerMemoryTraffic.norms)
        pre_mlp_norm = 2.0 * b * recipe.seq_len * spec.hidden_size * BYTES_PER_ELEMENT[recipe.weight_dtype]
        if eager_kernels(recipe) and spec.norm == "rmsnorm":
            pre_mlp_norm *= EAGER_RMSNORM_TRAFFIC
        nbytes += fwd_mem.activation / tpcp + pre_mlp_norm / rep
    if "moe_act" in mods and moe_layer and spec.moe is not None:
        moe = spec.moe
        routed = expert_slot_ratio(spec, recipe) * moe.top_k * moe.expert_ffn_hidden
        width = routed + moe.num_shared_experts * moe.shared_width
        nbytes += fwd_mem.activation * routed / width / tpcp
    return PassCost(gemm_flops=gemm, attention_flops=attention, memory_bytes=nbytes)


_READS_BLOCK_INPUT: Final = frozenset({"q", "k", "v", "q_a", "kv_a"})
"""The attention projections that read the block's (normalised) input."""


def _layer_passes(
    spec: ModelSpec, i: int, recipe: Recipe, b: float, causal: bool, split: _Split
) -> _LayerPasses:
    s = float(recipe.seq_len)
    fl = layer_forward_flops(spec, i, b, s, causal)
    e = BYTES_PER_ELEMENT[recipe.weight_dtype]
    drop = recipe.dropout > 0.0
    eager = eager_kernels(recipe)
    moe_layer = spec.moe is not None and spec.is_moe_layer(i)
    ratio = expert_slot_ratio(spec, recipe) if moe_layer else 1.0
    einsum = moe_layer and recipe.moe_dispatch == "einsum"
    fwd_mem, bwd_mem = (
        layer_memory_traffic(
            spec,
            i,
            b,
            s,
            dtype_bytes=e,
            attention=recipe.attention,
            direction=direction,
            dropout=drop,
            eager=eager,
            slot_ratio=ratio,
            einsum_dispatch=einsum,
        )
        for direction in ("forward", "backward")
    )
    tpcp = split.sharded
    rep = split.replicated_unless_sp

    def mem(m: LayerMemoryTraffic) -> float:
        sharded = m.rotary + m.activation + m.softmax + m.attention_io
        replicated = m.norms + m.residual + m.moe_permute + m.router
        return sharded / tpcp + replicated / rep

    # MLA's down projections are replicated over tp, and run on the local shard under SP
    weights_fwd = (fl.qkv_proj + fl.out_proj + fl.mlp + fl.moe_experts) / tpcp + (
        fl.router + fl.latent_proj
    ) / rep
    attn_fwd = fl.attention / tpcp
    adapter_fwd = 0.0
    lora = recipe.lora if recipe.is_peft else None
    if lora is not None:
        adapter_fwd = lora_adapter_flops_per_token(spec, i, lora) * b * s / tpcp
    # Capacity padding and einsum dispatch (Recipe.moe_capacity_factor, moe_dispatch): executed,
    # never model FLOPs. The padded slots of the routed experts cost (ratio − 1) of their GEMMs;
    # the dispatch and combine einsums are replicated work outside the experts.
    padding_fwd = einsum_fwd = 0.0
    if moe_layer and spec.moe is not None:
        routed_fwd = 2.0 * b * s * spec.hidden_size * spec.moe.top_k * spec.moe.expert_ffn_hidden
        padding_fwd = (ratio - 1.0) * routed_fwd * _mlp_matrices(spec) / tpcp
        einsum_fwd = moe_einsum_flops(spec, recipe, b) / tpcp
    fwd_gemm = weights_fwd + adapter_fwd + padding_fwd + einsum_fwd
    forward = PassCost(gemm_flops=fwd_gemm, attention_flops=attn_fwd, memory_bytes=mem(fwd_mem))

    base_bwd_factor = 1.0 if lora is not None else 2.0  # frozen base: dX only
    # einsum backward: dX of the dispatch; d(expert output) and, with a trained router, d(weights)
    # of the combine (moe_einsum_flops)
    einsum_bwd = (1.0 if lora is not None else 1.5) * einsum_fwd
    # With a frozen embedding the first layer's input needs no gradient: autograd skips the input
    # gradients of the linears that read it (q, k, v and their adapters' A matrices), as traced.
    skipped_dx = 0.0
    if lora is not None and i == 0:
        adapted = lora_modules(spec, lora.targets)
        for p in spec.attention_projections:
            if p.name in _READS_BLOCK_INPUT:
                div = rep if p.split == "replicated" else tpcp
                skipped_dx += 2.0 * b * s * p.n_in * p.n_out / div
                if p.name in adapted:
                    skipped_dx += 2.0 * b * s * lora.rank * p.n_in / div
    flash_recompute = fl.attn_scores / tpcp if recipe.attention == "flash" else 0.0
    backward = PassCost(
        gemm_flops=base_bwd_factor * (weights_fwd + padding_fwd)
        + einsum_bwd
        + 2.0 * adapter_fwd
        - skipped_dx,
        attention_flops=2.0 * attn_fwd + flash_recompute,
        memory_bytes=mem(bwd_mem),
    )
    # The skipped input gradients are no part of the algorithm either (the embedding is frozen):
    # counting them as model FLOPs put MFU above HFU under LoRA with eager attention.
    model = (1.0 + base_bwd_factor) * weights_fwd + 3.0 * adapter_fwd + 3.0 * attn_fwd - skipped_dx

    if recipe.recompute == "full" and recipe.recompute_early_stop:
        skip = early_stop_skip(spec, i, recipe, b, s)
        recompute = PassCost(
            gemm_flops=forward.gemm_flops - skip.gemm_flops / tpcp,
            attention_flops=forward.attention_flops,
            memory_bytes=forward.memory_bytes - skip.memory_bytes / rep,
        )
    elif recipe.recompute == "full":
        recompute = forward
    elif recipe.recompute == "selective":
        recompute = _selective_recompute(spec, recipe, fl, fwd_mem, attn_fwd, moe_layer, split, b)
    elif recipe.recompute == "sac":
        sac = sac_recompute(spec, i, recipe, b, s)
        recompute = PassCost(
            gemm_flops=sac.gemm_flops / tpcp,
            memory_bytes=mem(fwd_mem) - fwd_mem.attention_io / tpcp - sac.skipped_memory_bytes / rep,
        )
    else:
        recompute = PassCost()

    dequant = 0.0
    if recipe.method == "qlora" and lora is not None:
        passes = 2.0 + (1.0 if recipe.recompute == "full" else 0.0)
        dequant = passes * _quantised_layer_params(spec, i) * qlora_dequant_bytes_per_param(lora) / split.tp
    return _LayerPasses(
        forward=forward, backward=backward, recompute=recompute, model_flops=model, dequant_bytes=dequant
    )


@functools.lru_cache(maxsize=4096)
def _kind_counts(
    spec: ModelSpec,
    layers: range | tuple[int, ...],
    peft: bool,
    recompute_every: int = 1,
    recompute_layers: int = 0,
) -> dict[tuple[bool, bool, bool, bool], tuple[int, int, int]]:
    """{(MoE?, first layer under PEFT?, recomputed?, sliding-window?): (representative layer, its
    position in the stage, count)} over ``layers``.

    The first layer under PEFT is its own kind: its input needs no gradient (see _layer_passes).
    Under layer-selective checkpointing (``recompute_every`` n > 1: the stage's n-th, 2n-th, …
    blocks; ``recompute_layers`` N > 0: its first N) the named blocks are recomputed and the
    others are not (:func:`trainplan.recipe.recomputes_block`).
    """
    counts: dict[tuple[bool, bool, bool, bool], tuple[int, int, int]] = {}
    dense = spec.moe is None
    for j, i in enumerate(layers):
        kind = (
            False if dense else spec.is_moe_layer(i),
            peft and i == 0,
            recomputes_position(j, recompute_every, recompute_layers),
            spec.is_local_layer(i),
        )
        first, pos, n = counts.get(kind, (i, j, 0))
        counts[kind] = (first, pos, n + 1)
    return counts


def _sum_layers(
    spec: ModelSpec,
    layers: range | tuple[int, ...],
    recipe: Recipe,
    b: float,
    causal: bool,
    split: _Split,
    cache: dict[object, _LayerPasses] | None = None,
) -> _LayerPasses:
    """Sum of :func:`_layer_passes` over ``layers``: every dense layer costs the same, so does every MoE
    layer; each kind is computed once and multiplied by its count (keeps an estimate well under 1 ms).
    """
    # a range hashes in constant time (the whole model's layers); a stage's layers are a tuple
    counts = _kind_counts(spec, layers, recipe.is_peft, recipe.recompute_every, recipe.recompute_layers)
    cache = {} if cache is None else cache
    key = tuple(sorted((kind, n) for kind, (_, _, n) in counts.items()))
    if key in cache:
        return cache[key]
    forward = backward = recompute = _NO_PASS
    model = dequant = 0.0
    for kind, (first, pos, n) in counts.items():
        if kind not in cache:
            cache[kind] = _layer_passes(spec, first, block_recipe(recipe, pos), b, causal, split)
        lp = cache[kind]
        # the first kind starts the sums (0 + x is x: the sums are non-negative)
        forward = lp.forward.scaled(n) if forward is _NO_PASS else forward + lp.forward.scaled(n)
        backward = lp.backward.scaled(n) if backward is _NO_PASS else backward + lp.backward.scaled(n)
        recompute = lp.recompute.scaled(n) if recompute is _NO_PASS else recompute + lp.recompute.scaled(n)
        model += lp.model_flops * n
        dequant += lp.dequant_bytes * n
    total = _LayerPasses(
        forward=forward, backward=backward, recompute=recompute, model_flops=model, dequant_bytes=dequant
    )
    cache[key] = total
    return total


def _head_passes(
    spec: ModelSpec, recipe: Recipe, b: float, split: _Split
) -> tuple[PassCost, PassCost, float]:
    """LM head + cross-entropy (last stage): forward, backward, model FLOPs. Vocab-parallel over tp.

    With multi-token prediction (``Recipe.mtp_layers`` D; the D blocks themselves are layers of
    :meth:`~trainplan.models.spec.ModelSpec.with_mtp`) every module adds one more pass of the
    shared head and its loss, its ``eh_proj`` GEMM 2·T·2h·h (column-parallel, in the GEMM dtype)
    and the embedding gather of the shifted tokens (:func:`mtp_head_flops`)."""
    check_mtp(spec, recipe)
    s = float(recipe.seq_len)
    e = BYTES_PER_ELEMENT[recipe.weight_dtype]
    tpcp = split.sharded
    logits = logits_forward_flops(spec, b, s) / tpcp
    fused = recipe.fused_cross_entropy
    ce = logits_memory_bytes(spec, b, s, dtype_bytes=e, fused=fused) / tpcp
    ce_b = logits_memory_bytes(spec, b, s, dtype_bytes=e, fused=fused, backward=True) / tpcp
    eh = 0.0
    if recipe.mtp_layers:
        heads = 1.0 + recipe.mtp_layers
        extra = recipe.mtp_layers * _embedding_bytes(spec, recipe, b, split)
        logits, ce, ce_b = heads * logits, heads * ce + extra, heads * ce_b + extra
        eh = mtp_head_flops(spec, recipe, b) / tpcp
    bwd_factor = 1.0 if recipe.is_peft else 2.0  # PEFT: the LM head is frozen
    forward = PassCost(gemm_flops=logits + eh, memory_bytes=ce, hp_gemm_flops=logits)
    backward = PassCost(
        gemm_flops=bwd_factor * (logits + eh), memory_bytes=ce_b, hp_gemm_flops=bwd_factor * logits
    )
    return forward, backward, (1.0 + bwd_factor) * (logits + eh)


def mtp_head_flops(spec: ModelSpec, recipe: Recipe, b: float) -> float:
    """Forward FLOPs of the ``eh_proj`` projections of ``Recipe.mtp_layers`` MTP modules over
    ``b`` sequences: each maps [norm(h); norm(emb)] (2h) to h, 2·T·2h·h (DeepSeek-V3 Eq. 21,
    ``M_k ∈ R^{d×2d}``; Megatron-Core ``MultiTokenPredictionLayer.eh_proj``)."""
    h = spec.hidden_size
    return recipe.mtp_layers * 2.0 * b * recipe.seq_len * 2 * h * h


def check_mtp(spec: ModelSpec, recipe: Recipe) -> None:
    """The model must carry the recipe's MTP modules as its last layers
    (:meth:`~trainplan.models.spec.ModelSpec.with_mtp`, which ``estimate`` and ``plan`` apply)."""
    if spec.mtp_layers != recipe.mtp_layers:
        raise RecipeError(
            "mtp_layers",
            f"the recipe trains {recipe.mtp_layers} MTP module(s) but {spec.name} carries {spec.mtp_layers}; "
            f"cost model.with_mtp({recipe.mtp_layers}) (trainplan.estimate and plan do)",
        )


def _embedding_bytes(spec: ModelSpec, recipe: Recipe, b: float, split: _Split) -> float:
    e = BYTES_PER_ELEMENT[recipe.weight_dtype]
    return embedding_memory_bytes(spec, b, float(recipe.seq_len), dtype_bytes=e) / split.replicated_unless_sp


@dataclass(frozen=True, kw_only=True)
class StepFlops:
    """FLOPs and memory-bound bytes of one training step over ``sequences`` sequences (whole model).

    Each pass is split into weight-GEMM FLOPs, attention-core FLOPs and memory-bound bytes.
    ``model_flops`` is the MFU numerator (module docstring); ``hardware_flops`` adds recompute and
    FlashAttention's backward score recompute (the HFU numerator). Work that tensor parallelism
    replicates (norms, router without SP) is counted once here; see :func:`device_flops` for the
    per-device view.
    """

    sequences: float
    seq_len: int
    causal: bool
    forward: PassCost
    backward: PassCost
    recompute: PassCost
    model_flops: float
    dequant_bytes: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tokens(self) -> float:
        return self.sequences * self.seq_len

    @property
    def hardware_flops(self) -> float:
        return self.forward.flops + self.backward.flops + self.recompute.flops

    @property
    def gemm_flops(self) -> float:
        return self.forward.gemm_flops + self.backward.gemm_flops + self.recompute.gemm_flops

    @property
    def attention_flops(self) -> float:
        return self.forward.attention_flops + self.backward.attention_flops + self.recompute.attention_flops

    @property
    def memory_bytes(self) -> float:
        """Memory-bound bytes of the passes and of QLoRA dequantisation (optimizer step: separate)."""
        passes = self.forward.memory_bytes + self.backward.memory_bytes + self.recompute.memory_bytes
        return passes + self.dequant_bytes

    def per_device(self, layout: Layout) -> StepFlops:
        """The ideal, balanced share of one device: every term divided by the device count.

        This is the MFU view (model FLOPs / devices). It ignores replication and pipeline-stage
        imbalance; :func:`device_flops` gives the exact per-stage, per-device numbers.
        """
        n = float(layout.num_devices)
        return StepFlops(
            sequences=self.sequences / n,
            seq_len=self.seq_len,
            causal=self.causal,
            forward=self.forward.scaled(1.0 / n),
            backward=self.backward.scaled(1.0 / n),
            recompute=self.recompute.scaled(1.0 / n),
            model_flops=self.model_flops / n,
            dequant_bytes=self.dequant_bytes / n,
            notes=(*self.notes, f"balanced share of {layout.num_devices} devices"),
        )


def _step_notes(recipe: Recipe) -> tuple[str, ...]:
    notes: list[str] = []
    if recipe.method in ("dpo", "ppo", "grpo"):
        notes.append(
            f"{recipe.method}: FLOPs of training the policy on the given sequences only; reference, "
            "reward/critic passes and generation are not included"
        )
    return tuple(notes)


def mfu_definition(recipe: Recipe) -> str:
    """What the MFU of ``recipe`` divides (module docstring, "Model FLOPs"), in words: full
    training counts weight gradients of every weight, LoRA / QLoRA of the adapters only."""
    peak = f"dense {recipe.gemm_dtype} peak"
    if recipe.is_peft:
        extra = "; NF4 dequantisation not counted" if recipe.method == "qlora" else ""
        return (
            f"model FLOPs / {peak}; {recipe.method} model FLOPs = 4·N_base·T + 6·N_adapter·T + "
            f"3·attention forward (frozen base: no weight gradients{extra})"
        )
    return f"model FLOPs / {peak}; model FLOPs = 6·N·T + 3·attention forward"


def step_sequences(recipe: Recipe, layout: Layout | None = None) -> int:
    """Sequences per optimizer step: ``global_batch``, or dp × micro_batch when it is not set."""
    if recipe.global_batch is not None:
        return recipe.global_batch
    dp = layout.dp if layout is not None else 1
    return dp * recipe.micro_batch


def step_flops(
    spec: ModelSpec, recipe: Recipe, layout: Layout | None = None, *, causal: bool = True
) -> StepFlops:
    """FLOPs of one optimizer step of the whole model over ``step_sequences(recipe, layout)`` sequences.

    Sums :func:`layer_forward_flops` over all layers plus the LM head, applies the backward factors
    and the recompute rule of the module docstring, and adds the memory-bound bytes of norms,
    activations, attention I/O, residuals, MoE permutation, embedding and cross-entropy. QLoRA
    dequantisation bytes are per micro-batch pass, so they scale with the number of micro-batches
    ``sequences / micro_batch`` (one copy of the weights; data-parallel replicas each pay it too).
    """
    check_modelled(spec, recipe, layout)
    whole = layout if layout is not None else Layout()
    sequences = step_sequences(recipe, layout)
    b = float(sequences)
    split = _Split()
    # Layer-selective checkpointing counts blocks per pipeline stage (recipe.recomputes_block).
    groups = whole.stage_layers(spec.num_layers) if recipe.layer_selective else (range(spec.num_layers),)
    forward = backward = recompute = PassCost()
    model = dequant = 0.0
    for layers in groups:
        lp = _sum_layers(spec, layers, recipe, b, causal, split)
        forward, backward, recompute = forward + lp.forward, backward + lp.backward, recompute + lp.recompute
        model, dequant = model + lp.model_flops, dequant + lp.dequant_bytes
    hf, hb, hm = _head_passes(spec, recipe, b, split)
    emb = _embedding_bytes(spec, recipe, b, split)
    forward += hf + PassCost(memory_bytes=emb)
    backward += hb + PassCost(memory_bytes=emb)
    model += hm
    micro_batches = sequences / recipe.micro_batch
    return StepFlops(
        sequences=b,
        seq_len=recipe.seq_len,
        causal=causal,
        forward=forward,
        backward=backward,
        recompute=recompute,
        model_flops=model,
        dequant_bytes=dequant * micro_batches,
        notes=_step_notes(recipe),
    )


# --------------------------------------------------------------------------------------------
# Per device, per pipeline stage
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class StageFlops:
    """Work of ONE device of pipeline stage ``stage`` for ONE micro-batch, and per step.

    Split rules (Megatron-LM; Shoeybi et al. 2019 Sec. 3, Korthikanti et al. 2022 Sec. 4.2):
    projections, MLP/experts, attention heads, activation functions, rotary and the LM head
    (vocab-parallel) divide by ``tp``; everything divides by ``cp`` (each rank holds ``s/cp``
    tokens; ring attention with a load-balanced causal split gives each rank ``1/cp`` of the score
    work); norms, residual adds, router and MoE permutation divide by ``tp`` only with sequence
    parallelism (otherwise every tp rank repeats them). Expert parallelism moves tokens, not work:
    under balanced routing each device still computes ``K`` experts' worth per local token, so ep
    does not change FLOPs (it changes GEMM shapes, see :func:`layer_gemms`, and traffic).
    """

    stage: int
    layers: tuple[int, ...]
    micro_batches: int
    forward: PassCost
    backward: PassCost
    recompute: PassCost
    dequant_bytes: float = 0.0  # per micro-batch

    @property
    def micro_batch_flops(self) -> float:
        return self.forward.flops + self.backward.flops + self.recompute.flops

    @property
    def step_hardware_flops(self) -> float:
        return self.micro_batch_flops * self.micro_batches

    @property
    def step_memory_bytes(self) -> float:
        per_mb = (
            self.forward.memory_bytes
            + self.backward.memory_bytes
            + self.recompute.memory_bytes
            + self.dequant_bytes
        )
        return per_mb * self.micro_batches


@functools.lru_cache(maxsize=1024)
def _distinct_dense_stages(
    num_layers: int, pp: int, virtual_stages: int, split_embedding: bool, split_head: bool, peft: bool
) -> tuple[int, ...]:
    """The first, the last, and the first middle stage of each (length, holds layer 0 under PEFT)
    signature among the stages of :func:`stage_layers`: the stages of a dense model that do
    different work, in order (keyed by the split's integers, which hash in constant time)."""
    stages = stage_layers(num_layers, pp, virtual_stages, split_embedding, split_head)
    seen: set[tuple[int, bool]] = set()
    out = []
    for r, layers in enumerate(stages):
        sig = (len(layers), peft and 0 in layers[:1])
        if 0 < r < pp - 1:
            if sig in seen:
                continue
            seen.add(sig)
        out.append(r)
    return tuple(out)


def check_layer_selective(recipe: Recipe, layout: Layout) -> None:
    """Refuse the layouts under which layer-selective checkpointing (``recompute_every`` > 1,
    ``recompute_layers`` > 0) is not modelled: the communication that a recomputed block repeats
    (the tensor-parallel collectives of its forward, the context-parallel ring, expert
    all-to-alls, per-parameter ZeRO-3 gathers, streamed weights) is counted for every block of the
    stage or none; Megatron's block method counts the first blocks of each virtual chunk, which
    trainplan's stages do not separate."""
    if not recipe.layer_selective:
        return
    flag = "recompute_layers" if recipe.recompute_layers else "recompute_every"
    given = (
        f"--recompute-layers {recipe.recompute_layers}"
        if recipe.recompute_layers
        else (f"--recompute-every {recipe.recompute_every}")
    )
    undo = "plain --recompute full" if recipe.recompute_layers else "--recompute-every 1"
    if recipe.recompute_layers and layout.virtual_stages > 1:
        raise LayoutError(
            flag,
            f"{given} with {layout.virtual_stages} virtual stages: Megatron's block method recomputes the "
            "first N blocks of every virtual chunk, which is not modelled; use --virtual-stages 1, or "
            + undo,
        )
    blocked = [
        (layout.tp > 1, "tensor parallelism (--tp 1)"),
        (layout.cp > 1, "context parallelism (--cp 1)"),
        (layout.ep > 1, "expert parallelism (--ep 1)"),
        (layout.zero3_granularity == "parameter", "per-parameter ZeRO-3 gathers (--zero3-granularity block)"),
        (recipe.offload == "optimizer+params", "streamed parameters (--offload optimizer or none)"),
    ]
    for bad, fix in blocked:
        if bad:
            raise LayoutError(
                flag,
                f"{given} with {fix.split(' (')[0]}: the collectives a recomputed block repeats are "
                "counted for all blocks or none, so checkpointing some blocks of a stage is not modelled "
                f"there; use {fix.split(' (')[1][:-1]}, or {undo}",
            )


def device_flops(
    spec: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    *,
    causal: bool = True,
    distinct: bool = False,
    layer_cache: dict[object, _LayerPasses] | None = None,
) -> tuple[StageFlops, ...]:
    """Per-device, per-micro-batch work of every pipeline stage (the busiest one bounds step time).

    ``micro_batches`` = step sequences / (dp · micro_batch) (gradient accumulation steps; Narayanan
    et al. 2021 Sec. 3). The embedding lives on the first stage, the LM head and loss on the last.

    ``distinct``: only the first of the stages that do the same work (dense stages of one length
    between the first and the last; MoE stages are all kept), in stage order — what a caller that
    wants the busiest stage needs (``max`` keeps the first of equal ones).

    ``layer_cache``: the per-layer work, and the work of a dense stage by its length and place
    (first, last), of an earlier call with the same recipe figures, micro-batch, tp, cp and
    sequence parallelism (neither depends on pp or the schedule); the planner shares it between
    the pipeline layouts of one such key.
    """
    check_modelled(spec, recipe, layout)
    sequences = step_sequences(recipe, layout)
    per_step = layout.dp * recipe.micro_batch
    if sequences % per_step != 0:
        raise LayoutError(
            "global_batch",
            f"global batch {sequences} is not a multiple of dp·micro_batch = {layout.dp}·{recipe.micro_batch}",
        )
    micro_batches = sequences // per_step
    b = float(recipe.micro_batch)
    split = _Split(tp=layout.tp, cp=layout.cp, sequence_parallel=layout.sequence_parallel)
    result: list[StageFlops] = []
    cache: dict[object, _LayerPasses] = {} if layer_cache is None else layer_cache
    stages = layout.stage_layers(spec.num_layers)
    keep = (
        _distinct_dense_stages(
            spec.num_layers,
            layout.pp,
            layout.virtual_stages,
            layout.pp_split_embedding,
            layout.pp_split_head,
            recipe.is_peft,
        )
        if distinct and spec.moe is None
        else range(layout.pp)
    )
    for r in keep:
        layers = stages[r]
        first, last = r == 0, r == layout.pp - 1
        # Dense stages of equal length and place (first, last) do the same work, whatever pp is
        # (PEFT: the first layer is its own kind); an MoE stage's work depends on its layers.
        sig = (
            ("stage", len(layers), recipe.is_peft and 0 in layers[:1], first, last)
            if spec.moe is None
            else ("stage", layers, first, last)
        )
        got = cache.get(sig)
        if got is None:
            lkey = ("layers", *sig[1:-2])  # the stage's layers, wherever it sits
            lp = cache.get(lkey) or _sum_layers(spec, layers, recipe, b, causal, split, cache)
            cache[lkey] = lp
            forward, backward = lp.forward, lp.backward
            if first:
                emb = PassCost(memory_bytes=_embedding_bytes(spec, recipe, b, split))
                forward += emb
                backward += emb
            if last:
                hf, hb, _ = _head_passes(spec, recipe, b, split)
                forward += hf
                backward += hb
            got = cache[sig] = _LayerPasses(
                forward=forward,
                backward=backward,
                recompute=lp.recompute,
                model_flops=lp.model_flops,
                dequant_bytes=lp.dequant_bytes,
            )
        result.append(
            StageFlops(
                stage=r,
                layers=layers,
                micro_batches=micro_batches,
                forward=got.forward,
                backward=got.backward,
                recompute=got.recompute,
                dequant_bytes=got.dequant_bytes,
            )
        )
    return tuple(result)


# --------------------------------------------------------------------------------------------
# Published closed forms (for checking)
# --------------------------------------------------------------------------------------------
def megatron2021_eq3_flops(batch: float, seq_len: float, layers: float, hidden: float, vocab: float) -> float:
    """Narayanan et al. 2021, Eq. 3: ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` per iteration.

    GPT layers (f = 4h, a·d = h, no GQA), full activation recompute (one extra forward of every
    layer, not of the LM head), non-causal attention (s² per head), biases/norms/softmax omitted.
    """
    b, s, l_, h, v = batch, seq_len, layers, hidden, vocab
    return 96.0 * b * s * l_ * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l_ * h))


def korthikanti2022_eq7_model_flops(
    batch: float, seq_len: float, layers: float, hidden: float, vocab: float
) -> float:
    """Korthikanti et al. 2022, Eq. 7 (App. A): ``72·B·L·s·h²·(1 + s/(6h) + v/(12·h·L))``.

    Model FLOPs (no recompute) of GPT layers; non-causal attention.
    """
    b, s, l_, h, v = batch, seq_len, layers, hidden, vocab
    return 72.0 * b * l_ * s * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l_))


def korthikanti2022_eq8_hardware_flops(
    batch: float, seq_len: float, layers: float, hidden: float, vocab: float
) -> float:
    """Korthikanti et al. 2022, Eq. 8: ``72·B·L·s·h²·(1 + s/(3h) + v/(12·h·L))`` with selective recompute.

    Eq. 8 doubles the whole s² term of Eq. 7, i.e. it charges the recompute ``12·B·L·s²·h`` — the
    forward + backward attention core — while re-running the attention-core forward costs
    ``4·B·L·s²·h`` (QKᵀ + PV, non-causal). :func:`step_flops` counts the latter; the paper's HFU
    column (Table 5) and its "2.7 % FLOPs" for GPT-3 (Sec. 5) use Eq. 8 / Eq. 9.
    """
    b, s, l_, h, v = batch, seq_len, layers, hidden, vocab
    return 72.0 * b * l_ * s * h * h * (1.0 + s / (3.0 * h) + v / (12.0 * h * l_))


def palm_flops_per_token(
    n_params: float, layers: float, heads: float, head_dim: float, seq_len: float
) -> float:
    """Chowdhery et al. 2022 (PaLM), Sec. 4.1 / App. B: ``6·N + 12·L·H·Q·T`` training FLOPs per token.

    ``12·L·H·Q·T`` is 3 × (QKᵀ + PV = 2·2·H·Q·T per token per layer): non-causal.
    """
    return 6.0 * n_params + 12.0 * layers * heads * head_dim * seq_len


def six_n_flops(n_params: float, tokens: float) -> float:
    """Kaplan et al. 2020 Sec. 2.1 / Hoffmann et al. 2022: ``C ≈ 6·N·D`` training FLOPs, no attention."""
    return 6.0 * n_params * tokens


def attention_fraction(spec: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """Share of forward FLOPs in the attention core at ``seq_len`` (a quick sanity number)."""
    total = 0.0
    attn = 0.0
    for i in range(spec.num_layers):
        fl = layer_forward_flops(spec, i, 1.0, float(seq_len), causal)
        total += fl.total
        attn += fl.attention
    total += logits_forward_flops(spec, 1.0, float(seq_len))
    return attn / total if total else math.nan
