"""Per-device memory of one training step: every term named, every term derived.

Notation (as in the docs): b micro-batch, s sequence length (s/cp per rank), h hidden, a heads,
t = tp, q = a·d query width, g = k·d key/value width, f MLP width, V vocabulary, e bytes of an
activation element (2 for 16-bit and FP8/FP4 recipes, whose saved activations stay 16-bit; 4
for fp32).

The peak of a training step is the larger of two phases::

    peak = model states + comm buffers + max(backward phase, optimizer phase)
    backward phase  = max(backward start, backward end)
    backward start  = saved activations (all in-flight micro-batches) + logits/loss buffers
                      + the largest transient (loss backward or a recomputed layer)
    backward end    = gradients + the stage input's gradient or a tied weight's gradient sum
    optimizer phase = optimizer-step temporaries (a foreach AdamW keeps one FP32 temporary the
                      size of the local parameter shard)

    per device = peak + CUDA context + allocator fragmentation      (named overhead terms)

Under ZeRO-3 (FSDP2) nine moments compete instead, each with its unsharded copies and reduce
buffers (:class:`MemoryBreakdown`, docs/memory.md).

Sources: model states — Rajbhandari et al. 2020 (ZeRO), Sec. 3.1 and 5; activations —
Korthikanti et al. 2022, Sec. 4 and Table 2, generalised below to GQA, gated MLPs, any MLP
width, FlashAttention (Dao et al. 2022: saves the output and the log-sum-exp, no s² terms) and
MoE; pipeline in-flight micro-batches — Korthikanti 2022 Eq. 5 and Narayanan et al. 2021
Sec. 2.2; QLoRA — Dettmers et al. 2023 Sec. 2-3; tensor and sequence parallelism as PyTorch
DTensor runs them (torch/distributed/tensor, torchtitan's plan), which differs from Megatron-LM
in two named terms (:func:`tp_embedding_grad_extra_params`, :func:`sp_saves_gathered_input`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.errors import RecipeError, TrainplanError
from trainplan.flops import check_modelled, expert_capacity, expert_slot_ratio
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.num import Bool, Int, Num, as_float, maximum, minimum, where
from trainplan.recipe import LORA_TARGETS, Recipe, block_recipe, recompute_module_set, without_recompute
from trainplan.sac import block_linears, check_sac
from trainplan.sharding import DeviceParams, Linear, device_params, layer_kinds, stage_layers
from trainplan.units import GiB, fmt_bytes

# --- named assumptions of the overhead terms ----------------------------------------------
CUDA_CONTEXT_BYTES: Final = 1.0 * GiB
"""CUDA context, cuBLAS/cuDNN workspaces and NCCL channel buffers, outside PyTorch's allocator.

Assumption, not a measurement: the CUDA context alone takes a few hundred MiB (PyTorch "CUDA
semantics" notes: it is not counted by ``memory_allocated``), cuBLAS keeps up to a few MiB of
workspace per stream and NCCL ``NCCL_BUFFSIZE`` = 4 MiB per channel and peer. Calibrate with
measurements (``trainplan verify --device cuda``)."""

FRAGMENTATION_FRACTION: Final = 0.05
"""Caching-allocator fragmentation, as a fraction of the peak of live tensors (reserved minus
allocated). Assumption; ZeRO (Sec. 3.2) reports extreme cases with 30% of memory unusable."""

ADAM8BIT_BLOCK: Final = 2048
"""Block size of 8-bit optimizer states (Dettmers et al. 2022, "8-bit Optimizers via Block-wise
Quantization", Sec. 2.1): one FP32 absmax per 2048 values."""


@dataclass(frozen=True, kw_only=True)
class LayerActivations:
    """Bytes saved for backward by one transformer layer for one micro-batch, by term."""

    terms: dict[str, float]

    @property
    def total_bytes(self) -> float:
        return sum(self.terms.values())


PHASES: Final = ("backward start", "forward (loss)", "backward end", "optimizer step")
"""Moments of a step without ZeRO-3. The loss forward (the saved activations and loss tensors
with the loss's forward transient, :func:`loss_forward_bytes`) is below the backward start
unless the loss keeps extra copies (``Recipe.logits_shift_copy``); it is listed after the
backward start so that a tie names the backward start."""
FSDP_PHASES: Final = (
    "forward (first block)",
    "forward (last block)",
    "forward (loss)",
    "backward start",
    "backward (blocks)",
    "backward (in a block)",
    "backward (root)",
    "backward end",
    "optimizer step",
)
"""Moments of a ZeRO-3 (FSDP2) step, in order; without FSDP only :data:`PHASES` can be the peak."""


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Per-device memory of the worst pipeline stage, at the peak of a training step.

    Three moments compete for the peak (the live tensors traced in ``trainplan verify`` show each):

    * **backward start** — every saved activation of the in-flight micro-batches, the saved loss
      tensors and the loss-backward transient; gradients only if they already exist (gradient
      accumulation over several micro-batches: from the second one on);
    * **backward end** — all gradients, and the larger of the gradient of the stage's input
      (:func:`input_grad_bytes`, alive while the embedding's backward runs) and, for a weight tied between
      embedding and LM head, its two gradients and their sum (:attr:`tied_grad_bytes`);
    * **optimizer step** — all model states plus the step's temporaries.

    Under ZeRO-3 (FSDP2 ``fully_shard`` per block, then the root unit = embedding + final norm +
    LM head, ``reshard_after_forward=False`` for the root and the last block, as in
    ``trace/step.py`` ``apply_fsdp``) the unsharded copies and reduce buffers move from moment to
    moment, and six more moments compete (see :meth:`phase_terms` and docs/memory.md). With
    c = compute bytes per element, r = reduce-scatter bytes, g = sharded-gradient bytes, N = dp·cp,
    P_R = root unit, P_H = final norm + LM head, P_L = largest block, A_l = one block's
    activations, ℓ = 8·b·s·V/t the loss-backward transient:

    * forward (first block): x + c·P_R + c·P_R + c·P_L + c·P_L (the embedding output x, the
      root unit and the first block, each unsharded and its all-gather output);
    * forward (last block): A − A_l + x + c·P_R + 3·c·P_L (x: the last block's input, the
      previous block's output, alive before the block saves it);
    * forward (loss): A + logits + c·P_R + 2·c·P_L + ¾·ℓ;
    * backward start: A + logits + c·P_R + c·P_L + ℓ (the root and the last block stay unsharded);
    * backward (blocks): A − A_l + x (the gradient of the block's input, in the compute dtype)
      + c·P_R + c·P_H (the head's unsharded gradient waits for the root's reduce-scatter) +
      2·c·P_L (block in use and the prefetched one) + r·P_L (the reduce-scatter input) + g·P_L/N
      (its output shard);
    * backward (in a block): A − A_l + x + c·P_R + c·P_H + c·P_L + B_l (:func:`block_backward_bytes`)
      + the larger of A_l + c·P_L (the first block of the backward: every activation alive, the
      next block prefetched) and c·P_L + r·P_L + g·P_L/N (the block before it: an earlier block
      prefetched when there is one, the later block's reduce-scatter input and shard);
    * backward (root): gradients − g·P_R/N + c·P_R (the root still unsharded) + c·P_R (its
      unsharded gradients) + r·P_L (the last block's reduce-scatter input: FSDP2 keeps
      ``reduce_scatter_max_input_buffers`` = 1 input in flight until the next group reduces) and,
      under tensor parallelism, c·V·h (the embedding's replicated V × h gradient beyond its
      shard, and the Shard(0) copy FSDP2 redistributes it into) — the moment in the root's
      ``post_backward`` before it reshards;
    * backward end: gradients − g·P_R/N + (c + r)·P_R (the root's unsharded gradient and its
      reduce-scatter input, before its shard exists).

    Sources: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (``pre_forward`` /
    ``post_forward`` / ``pre_backward`` / ``post_backward``: unshard, reshard and the
    ``reshard_after_forward`` rule), _fsdp_state.py (``_root_pre_forward``, the root's
    ``_root_post_backward_final_callback`` that reduces the root last) and _fsdp_collectives.py
    (``foreach_all_gather``: the all-gather output buffer; ``foreach_reduce``: the
    reduce-scatter input in ``reduce_dtype`` and the sharded output).

    ``gradients_bytes`` etc. are the sizes of the states; :meth:`terms` lists what is alive at the
    peak moment, and those terms add up to ``per_device_bytes``.
    """

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float  # optimizer states incl. FP32 master weights where kept
    master_weights_bytes: float  # the part of optimizer_bytes that is a separate FP32 master copy
    quant_constants_bytes: float  # QLoRA absmax constants
    activations_bytes: float  # saved for backward, all in-flight micro-batches
    logits_bytes: float  # saved by the output layer and the loss (last stage)
    transient_bytes: float  # largest short-lived tensors at the start of backward
    optimizer_temporaries_bytes: float  # optimizer-step temporaries
    comm_buffers_bytes: float
    cuda_context_bytes: float
    capacity_bytes: float
    host_bytes: float  # offloaded to CPU memory, per device
    stage: int  # the pipeline stage this breakdown describes (the worst one)
    grads_live_at_backward_start: bool
    params_on_device: int
    trainable_params_on_device: int
    activation_terms: dict[str, float] = field(default_factory=dict)
    host_capacity_bytes_per_node: float | None = None  # the server's CPU memory; None = unknown
    devices_on_node: int = 1  # this job's devices on one server (they share its CPU memory)
    paged_optimizer_bytes: float = 0.0
    """Optimizer states of a paged (bitsandbytes) optimizer, in CUDA unified memory: outside
    PyTorch's allocator (not in ``peak_bytes``, as ``max_memory_allocated`` does not see them)
    and evictable to host memory by the driver, so not in ``per_device_bytes`` either."""
    last_layer_activations_bytes: float = 0.0  # A_l: the last block's saved activations, one micro-batch
    block_input_bytes: float = 0.0  # x: a block's input, one micro-batch (e·b·s·h, /t with SP)
    input_grad_bytes: float = 0.0  # the stage input's gradient at the end of backward (input_grad_bytes())
    loss_forward_bytes: float = 0.0  # loss-forward transient: ¾ of the loss-backward one (6·b·s·V/t)
    # ZeRO-3 / FSDP2 (all 0 otherwise): see the class docstring.
    fsdp: bool = False
    memory_margin: float = 0.0  # fraction of capacity kept free: fits means <= usable_bytes
    fsdp_root_bytes: float = 0.0  # c·P_R: the root unit unsharded
    fsdp_block_bytes: float = 0.0  # c·P_L: one block unsharded (QLoRA: NF4 bytes + constants)
    fsdp_block_backward_bytes: float = 0.0  # B_l: inside the last block's backward (block_backward_bytes())
    fsdp_block_backward_later_bytes: float = (
        0.0  # the same for a block before it, less the activations freed since
    )
    fsdp_inflight_reduce_bytes: float = (
        0.0  # r·P_L when a later block's reduce-scatter can be in flight (≥ 2 blocks)
    )
    fsdp_mid_prefetch_bytes: float = (
        0.0  # c·P_L when the block before the last has an earlier one (≥ 3 blocks)
    )
    fsdp_next_block_bytes: float = 0.0  # c·P_L when the stage has a second block to prefetch, else 0
    fsdp_head_grad_bytes: float = 0.0  # c·P_H: the head's unsharded gradient (full training)
    fsdp_block_reduce_bytes: float = 0.0  # r·P_L: one block's reduce-scatter input
    fsdp_block_grad_shard_bytes: float = 0.0  # g·P_L/N: its reduced shard (stages of ≥ 2 blocks)
    fsdp_root_grad_bytes: float = 0.0  # (c + r)·P_R: root unsharded gradient + reduce-scatter input
    fsdp_root_grad_shard_bytes: float = 0.0  # g·P_R/N: the root's gradient shard (written last)
    fsdp_root_unsharded_grad_bytes: float = 0.0  # c·P_R: the root's unsharded gradients (full training)
    fsdp_embedding_grad_bytes: float = 0.0  # c·V·h: TP embedding gradient, replicated + its Shard(0) copy
    fsdp_tied_grad_bytes: float = 0.0  # c·V/t·h: as tied_grad_bytes, for the root's post-backward
    tied_grad_bytes: float = 0.0
    """Without FSDP, wb·V/t·h: one gradient of a weight tied between embedding and LM head. Its two gradients
    are summed out of place before the weight's gradient is stored, so at the end of backward
    two more copies than ``gradients_bytes`` counts are alive (three when a gradient from an
    earlier micro-batch is being accumulated into)."""
    tp_embedding_grad_bytes: float = 0.0
    """Part of ``gradients_bytes`` without FSDP: the vocabulary-parallel embedding's replicated
    gradient beyond its shard, wb·(V·h − V/t·h) (:func:`tp_embedding_grad_extra_params`)."""

    @property
    def gather_buffers_bytes(self) -> float:
        """ZeRO-3: unsharded weights alive at the start of backward (the root unit and the last block)."""
        return self.fsdp_root_bytes + self.fsdp_block_bytes

    @property
    def phases(self) -> tuple[str, ...]:
        return FSDP_PHASES if self.fsdp else PHASES

    @property
    def model_states_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.quant_constants_bytes

    def phase_terms(self, phase: str) -> list[tuple[str, float]]:
        """Live tensors at one moment of the step (see the class docstring)."""
        # a bool for one estimate, a bool array (one per candidate) in the planner
        live: Bool = self.grads_live_at_backward_start
        grads: float
        if phase in ("backward (root)", "backward end"):
            grads = self.gradients_bytes - cast(float, where(live, 0.0, self.fsdp_root_grad_shard_bytes))
        elif phase == "optimizer step":
            grads = self.gradients_bytes
        else:
            grads = cast(float, where(live, self.gradients_bytes, 0.0))
        terms = [
            ("weights", self.weights_bytes),
            ("gradients", grads),
            ("optimizer states (incl. master)", self.optimizer_bytes),
            ("quantization constants", self.quant_constants_bytes),
            ("communication buffers", self.comm_buffers_bytes),
        ]
        root = ("FSDP root unit (unsharded)", self.fsdp_root_bytes)
        block = ("FSDP block (unsharded)", self.fsdp_block_bytes)
        earlier = (
            "activations (all but the last block)",
            self.activations_bytes - self.last_layer_activations_bytes,
        )
        if phase == "forward (first block)":
            terms += [
                ("first block input", self.block_input_bytes),
                root,
                ("FSDP root all-gather output", self.fsdp_root_bytes),
                block,
                ("FSDP block all-gather output", self.fsdp_block_bytes),
            ]
        elif phase == "forward (last block)":
            terms += [
                earlier,
                ("last block input", self.block_input_bytes),
                root,
                block,
                ("FSDP two more block copies", 2 * self.fsdp_next_block_bytes),
            ]
        elif phase == "forward (loss)":
            terms += [
                ("activations", self.activations_bytes),
                ("logits / loss", self.logits_bytes),
                root,
                block,
                ("FSDP block all-gather output", self.fsdp_block_bytes),
                ("transient (loss forward)", self.loss_forward_bytes),
            ]
        elif phase == "backward start":
            terms += [
                ("activations", self.activations_bytes),
                ("logits / loss", self.logits_bytes),
                root,
                block,
                ("transient (backward)", self.transient_bytes),
            ]
        elif phase == "backward (blocks)":
            terms += [
                earlier,
                ("gradient of the block input", self.block_input_bytes),
                root,
                ("FSDP LM-head gradient (unsharded)", self.fsdp_head_grad_bytes),
                block,
                ("FSDP prefetched block", self.fsdp_next_block_bytes),
                ("FSDP block reduce-scatter input", self.fsdp_block_reduce_bytes),
                (
                    "FSDP reduced block-gradient shard",
                    cast(float, where(live, 0.0, self.fsdp_block_grad_shard_bytes)),
                ),
            ]
        elif phase == "backward (in a block)":
            # The larger of the first block of the backward (all activations alive, the next
            # block prefetched, no reduce-scatter yet) and a block before it (its own and the
            # earlier blocks' activations; the later block's reduce-scatter input in flight and
            # its output shard; an earlier block prefetched when there is one).
            first = (
                self.last_layer_activations_bytes
                + self.fsdp_next_block_bytes
                + self.fsdp_block_backward_bytes
            )
            later = (
                self.fsdp_mid_prefetch_bytes
                + self.fsdp_inflight_reduce_bytes
                + cast(float, where(live, 0.0, self.fsdp_block_grad_shard_bytes))
                + self.fsdp_block_backward_later_bytes
            )
            terms += [
                earlier,
                # (a moment of FSDP2 blocks only: 0 where no block is gathered, as in the
                # planner's rows without ZeRO-3, which evaluate every moment)
                (
                    "gradient of the block output",
                    cast(float, where(self.fsdp_block_bytes > 0.0, self.block_input_bytes, 0.0)),
                ),
                root,
                ("FSDP LM-head gradient (unsharded)", self.fsdp_head_grad_bytes),
                block,
                (
                    "inside a block's backward (rebuilt set, gradients, prefetch or reduce in flight)",
                    cast(float, maximum(first, later)),
                ),
            ]
        elif phase == "backward (root)":
            terms += [
                ("tied embedding: both gradients before their sum is stored", 2 * self.fsdp_tied_grad_bytes),
                root,
                ("FSDP root gradients (unsharded)", self.fsdp_root_unsharded_grad_bytes),
                ("FSDP embedding gradient (replicated, redistributed)", self.fsdp_embedding_grad_bytes),
                ("FSDP last block reduce-scatter input", self.fsdp_block_reduce_bytes),
            ]
        elif phase == "backward end":
            # Without FSDP: the embedding's backward runs with the gradient of the first block's
            # input alive; a tied weight's gradient sum comes after it is freed (the larger
            # counts). Both are 0 under ZeRO-3, whose end of backward is the root's reduce.
            tied = cast(float, where(live, 3, 2)) * self.tied_grad_bytes
            x = self.input_grad_bytes
            terms += [
                ("FSDP root gradient + reduce-scatter input", self.fsdp_root_grad_bytes),
                (
                    "gradient of the first block's input, or a tied weight's two gradients and their sum",
                    0.5 * (x + tied + abs(x - tied)),
                ),
            ]
        else:
            terms += [("optimizer-step temporaries", self.optimizer_temporaries_bytes)]
        return terms

    def phase_bytes(self, phase: str) -> float:
        return sum(v for _, v in self.phase_terms(phase))

    @functools.cached_property
    def _phase_sums(self) -> tuple[Num, ...]:
        """:meth:`phase_bytes` of every phase, in order, summed once for the peak and its phase."""
        return tuple(self.phase_bytes(phase) for phase in self.phases)

    @functools.cached_property
    def peak_phase(self) -> str:
        sums = self._phase_sums
        return self.phases[max(range(len(sums)), key=sums.__getitem__)]  # ties: the earlier moment

    @functools.cached_property
    def peak_bytes(self) -> float:
        """Peak of live tensors (what ``torch.cuda.max_memory_allocated`` measures): the largest
        of the phases' sums (element-wise for the planner's array breakdowns)."""
        out: Num | None = None
        for v in self._phase_sums:
            out = v if out is None else maximum(out, v)
        return cast(float, out)

    @property
    def fragmentation_bytes(self) -> float:
        return FRAGMENTATION_FRACTION * self.peak_bytes

    @property
    def per_device_bytes(self) -> float:
        return self.peak_bytes + self.cuda_context_bytes + self.fragmentation_bytes

    @property
    def usable_bytes(self) -> float:
        """The capacity less the requested headroom (:func:`usable_bytes`)."""
        return float(usable_bytes(self.capacity_bytes, self.memory_margin))

    @property
    def device_fits(self) -> bool:
        return self.per_device_bytes <= self.usable_bytes

    @property
    def host_bytes_per_node(self) -> float:
        """Offloaded states on one server (:func:`host_bytes_per_node`)."""
        return cast(float, host_bytes_per_node(self.host_bytes, self.devices_on_node))

    @property
    def host_fits(self) -> bool | None:
        """The offloaded states fit the server's CPU memory; ``None`` when something is offloaded
        and the host memory is unknown (unchecked: the estimate says so)."""
        if not self.host_bytes:
            return True
        if self.host_capacity_bytes_per_node is None:
            return None
        return bool(host_fits(self.host_bytes, self.devices_on_node, self.host_capacity_bytes_per_node))

    @property
    def fits(self) -> bool:
        """Fits device memory, and the host memory where states are offloaded and it is known."""
        return self.device_fits and self.host_fits is not False

    def notes(self) -> list[str]:
        """What the memory verdict could not check."""
        if self.host_fits is None:
            return [
                f"host memory unchecked: {fmt_bytes(self.host_bytes_per_node)} offloaded per server, "
                "and the catalog has no reference server for this accelerator; give --host-memory"
            ]
        return []

    def terms(self) -> list[tuple[str, float]]:
        """The visible sum at the peak moment: these terms add up to ``per_device_bytes``."""
        return [
            *self.phase_terms(self.peak_phase),
            ("CUDA context / runtime", self.cuda_context_bytes),
            ("allocator fragmentation", self.fragmentation_bytes),
        ]

    def reasons(self) -> list[str]:
        """Why it does not fit: the excess and the largest terms that cause it."""
        out = []
        if not self.device_fits:
            excess = self.per_device_bytes - self.usable_bytes
            top = sorted(self.terms(), key=lambda kv: kv[1], reverse=True)[:3]
            named = ", ".join(f"{name} {fmt_bytes(v)}" for name, v in top if v > 0)
            limit = (
                f"{fmt_bytes(self.capacity_bytes)} capacity"
                if not self.memory_margin
                else f"{fmt_bytes(self.usable_bytes)} usable ({fmt_bytes(self.capacity_bytes)} capacity less the "
                f"{100 * self.memory_margin:g}% --memory-margin)"
            )
            out.append(
                f"needs {fmt_bytes(self.per_device_bytes)} per device > {limit} "
                f"(over by {fmt_bytes(excess)}) at the {self.peak_phase}; largest terms: {named}"
            )
        if self.host_fits is False:
            assert self.host_capacity_bytes_per_node is not None
            out.append(
                f"offloads {fmt_bytes(self.host_bytes_per_node)} per server ({self.devices_on_node} device(s) × "
                f"{fmt_bytes(self.host_bytes)}) > {fmt_bytes(self.host_capacity_bytes_per_node)} host memory; "
                "offload less, shard over more devices, or give the server's --host-memory"
            )
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "per_device_bytes": self.per_device_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "memory_margin": self.memory_margin,
            "usable_bytes": self.usable_bytes,
            "device_fits": self.device_fits,
            "host_fits": self.host_fits,
            "host_bytes_per_node": self.host_bytes_per_node,
            "host_capacity_bytes_per_node": self.host_capacity_bytes_per_node,
            "devices_on_node": self.devices_on_node,
            "notes": self.notes(),
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "phase_bytes": {p: self.phase_bytes(p) for p in self.phases},
            "stage": self.stage,
            "weights_bytes": self.weights_bytes,
            "gradients_bytes": self.gradients_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "master_weights_bytes": self.master_weights_bytes,
            "quant_constants_bytes": self.quant_constants_bytes,
            "activations_bytes": self.activations_bytes,
            "logits_bytes": self.logits_bytes,
            "gather_buffers_bytes": self.gather_buffers_bytes,
            "transient_bytes": self.transient_bytes,
            "last_layer_activations_bytes": self.last_layer_activations_bytes,
            "block_input_bytes": self.block_input_bytes,
            "input_grad_bytes": self.input_grad_bytes,
            "loss_forward_bytes": self.loss_forward_bytes,
            "fsdp_root_bytes": self.fsdp_root_bytes,
            "fsdp_block_bytes": self.fsdp_block_bytes,
            "fsdp_next_block_bytes": self.fsdp_next_block_bytes,
            "fsdp_head_grad_bytes": self.fsdp_head_grad_bytes,
            "fsdp_block_reduce_bytes": self.fsdp_block_reduce_bytes,
            "fsdp_block_grad_shard_bytes": self.fsdp_block_grad_shard_bytes,
            "fsdp_root_grad_bytes": self.fsdp_root_grad_bytes,
            "fsdp_root_grad_shard_bytes": self.fsdp_root_grad_shard_bytes,
            "fsdp_root_unsharded_grad_bytes": self.fsdp_root_unsharded_grad_bytes,
            "fsdp_embedding_grad_bytes": self.fsdp_embedding_grad_bytes,
            "tp_embedding_grad_bytes": self.tp_embedding_grad_bytes,
            "tied_grad_bytes": self.tied_grad_bytes,
            "fsdp_tied_grad_bytes": self.fsdp_tied_grad_bytes,
            "optimizer_temporaries_bytes": self.optimizer_temporaries_bytes,
            "comm_buffers_bytes": self.comm_buffers_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "fragmentation_bytes": self.fragmentation_bytes,
            "host_bytes": self.host_bytes,
            "paged_optimizer_bytes": self.paged_optimizer_bytes,
            "params_on_device": self.params_on_device,
            "trainable_params_on_device": self.trainable_params_on_device,
            "activation_terms_bytes": dict(self.activation_terms),
        }


# --- activations ------------------------------------------------------------------------------
def activation_bytes_per_element(recipe: Recipe) -> float:
    """e: saved activations are fp32 under fp32 training, 16-bit otherwise (FP8/FP4 casts are transient)."""
    return 4.0 if recipe.precision == "fp32" else 2.0


def residual_bytes_per_element(recipe: Recipe) -> float:
    """Bytes per element of the residual stream — the block inputs and the norm outputs: 4 when
    PEFT's ``prepare_model_for_kbit_training`` has cast the embedding and the norms to FP32
    (``Recipe.kbit_fp32_upcast``, where the FP32 embedding output and FP32 norm weights promote
    every residual add and norm output to FP32), else :func:`activation_bytes_per_element`."""
    return 4.0 if recipe.kbit_fp32_upcast else activation_bytes_per_element(recipe)


MXFP8_SAVED_BYTES_PER_ELEMENT: Final = 1.0 + 1.0 / 32.0
"""A linear input Transformer Engine saves under FP8: the one quantized copy the weight-gradient
GEMM reads, 1 byte per element, plus MXFP8's E8M0 scale, one byte per 32 elements (per-tensor
FP8 keeps one FP32 scale per tensor: 1 byte; the MXFP8 figure bounds both). TransformerEngine
v2.8 (40c69e75) ``transformer_engine/pytorch/module/linear.py`` L371-390 (``inputmat.update_usage(
rowwise_usage=False, columnwise_usage=True)`` before ``prepare_for_saving``), ``layernorm_linear.py``
L405-414 (``ln_out``), ``grouped_linear.py`` L197-218 (each expert's input);
``tensor/mxfp8_tensor.py`` L102-119 (the scale shapes)."""


def te_saved_set(recipe: Recipe) -> bool:
    """Whether the blocks save what Megatron-Core's Transformer Engine modules save (the
    ``megatron`` stack: Megatron-LM / Megatron-Core, NeMo, Megatron Bridge) rather than what eager
    PyTorch modules save (:func:`layer_activations`)."""
    return recipe.stack == "megatron"


def linear_input_bytes_per_element(recipe: Recipe) -> float:
    """Bytes per element of the input a trained linear layer saves for its weight gradient: under
    the megatron stack with FP8 GEMMs, Transformer Engine's quantized copy
    (:data:`MXFP8_SAVED_BYTES_PER_ELEMENT`); else the activation dtype
    (:func:`activation_bytes_per_element`). FP4 recipes keep the activation dtype here (what
    NVFP4 saves for the weight gradient is not in the sources read)."""
    if te_saved_set(recipe) and recipe.precision == "fp8":
        return MXFP8_SAVED_BYTES_PER_ELEMENT
    return activation_bytes_per_element(recipe)


def activation_input_bytes_per_element(recipe: Recipe) -> float:
    """Bytes per element of the input a Megatron-Core SwiGLU saves: FP8 under
    ``Recipe.fp8_activation_store`` (``activation_func_fp8_input_store``), else the activation dtype."""
    return BYTES_PER_ELEMENT["fp8"] if recipe.fp8_activation_store else activation_bytes_per_element(recipe)


def _te_mlp_terms(
    model: ModelSpec,
    tokens: float,
    width_local: float,
    e: float,
    lin: float,
    prefix: str,
    *,
    down_trained: bool = True,
    act_in: float | None = None,
) -> dict[str, float]:
    """Tensors one Megatron-Core MLP saves (fc1 ``TELayerNormColumnParallelLinear`` or
    ``TEGroupedLinear``, Megatron's activation, fc2 ``TERowParallelLinear``): the activation
    function saves its input, the fc1 output, in the activation dtype — 2·f wide for a gated MLP
    (Megatron-LM ``megatron/core/fusions/fused_bias_swiglu.py`` L180-184, ``SwiGLUFunction`` /
    ``WeightedSwiGLUFunction``: ``ctx.save_for_backward(input_for_backward, ...)``), or at
    ``act_in`` bytes per element (:func:`activation_input_bytes_per_element`: FP8 under
    ``activation_func_fp8_input_store``) — and fc2 saves its input, the activation output, at
    :func:`linear_input_bytes_per_element` (none when fc2 is frozen). 3·e·f for a BF16 SwiGLU MLP
    where eager PyTorch saves 4·e·f (:func:`_mlp_terms`)."""
    fc1_out = (2.0 if model.gated else 1.0) * (e if act_in is None else act_in) * tokens * width_local
    fc2_in = lin * tokens * width_local if down_trained else 0.0
    return {prefix + "mlp_intermediate": fc1_out + fc2_in}


def _mlp_terms(
    model: ModelSpec, tokens: float, width_local: float, e: float, prefix: str, *, down_trained: bool = True
) -> dict[str, float]:
    """Tensors one MLP saves for backward (eager PyTorch; Korthikanti 2022 Sec. 4.1 for GeLU).

    GeLU/ReLU MLP: the activation input (f) and the down-projection input (f): 2·e·tokens·f.
    Gated MLP (SwiGLU/GeGLU, ``down(act(gate(x)) * up(x))``): the activation input (gate output),
    the activation output and the up output (both saved by the product), and the product (input
    of down): 4·e·tokens·f. A frozen down projection (LoRA without an adapter on it) does not
    save its input (see :func:`frozen_linear_saves_input`), which removes one e·tokens·f.
    """
    n = (4 if model.gated else 2) - (0 if down_trained else 1)
    return {prefix + "mlp_intermediate": n * e * tokens * width_local}


def frozen_linear_saves_input() -> bool:
    """Whether a linear layer whose weight needs no gradient saves its input for backward: no.

    ``y = x·Wᵀ`` needs x only for the weight gradient (dW = dyᵀ·x); the input gradient needs W.
    PyTorch's autograd saves an input of a differentiable op only when a gradient that uses it
    will be computed (the ``should_compute_output`` guards that ``tools/autograd`` generates for
    ``mm``/``addmm``/``linear``), so the frozen base linears of LoRA/QLoRA keep their inputs only
    when another op (the adapter's A, a norm, attention) saves the same tensor.
    """
    return False


def sp_saves_gathered_input() -> bool:
    """Whether sequence parallelism saves the all-gathered input of a column-parallel linear: yes,
    on the PyTorch stacks (the megatron stack saves the local shard, :func:`te_saved_set`).

    PyTorch's DTensor tensor parallelism (torchtitan's plan: ``SequenceParallel`` norms, then
    ``PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`` before the
    attention and the MLP, or ``ColwiseParallel(input_layouts=Shard(1))`` before the LM head;
    torch/distributed/tensor/parallel/style.py) all-gathers the sequence-sharded activations
    into a replicated DTensor, and the column-parallel matmul saves that full-sequence tensor
    for its weight gradient: e·b·s·h per gathered input instead of e·b·s·h/t. Megatron-LM saves
    the local shard and all-gathers it again in backward (Korthikanti et al. 2022, Sec. 4.2.2),
    which is what Korthikanti's Table 2 counts; the difference, e·b·s·h·(1 − 1/t) per gathered
    input, is the ``sp_gathered_inputs`` term of :func:`layer_activations` (q/k/v and MLP
    inputs) and part of the LM-head input in :func:`logits_bytes`.
    """
    return True


def layer_activations(
    model: ModelSpec, recipe: Recipe, layout: Layout, layer: int, *, micro_batch: int | None = None
) -> LayerActivations:
    """Bytes saved for backward by one layer for one micro-batch on one device.

    Generalises Korthikanti et al. 2022 Sec. 4.1 / Table 2. Without parallelism, GPT-3 shapes
    (q = g = h, f = 4h, GeLU, dropout, eager attention, e = 2) give ``sbh(34 + 5as/h)``; with
    tensor parallelism the terms inside the tp region divide by t, the rest (norm inputs, the
    inputs of the first linear of each block, dropout masks) divides by t only with sequence
    parallelism. Selective recompute drops the attention-core terms (s² per head); full recompute
    stores only the layer input; per-op selective checkpointing (``sac``) stores what
    :func:`sac_layer_terms` lists. Flash attention (Dao et al. 2022) saves the output O and the
    FP32 log-sum-exp (4·b·a·s bytes) instead of the s² score tensors. Norm statistics (FP32 rstd,
    and the mean for LayerNorm, per token: what the fused CUDA kernels save) are a separate
    ``norm_stats`` term that Korthikanti's count omits (16 bytes per token per layer at most).
    The per-layer sum equals the bytes the reference PyTorch layers of ``trainplan.trace`` keep
    alive for backward (tests/test_trace.py checks the derivation).
    """
    b = recipe.micro_batch if micro_batch is None else micro_batch
    t, cp = layout.tp, layout.cp
    s = recipe.seq_len // cp  # local sequence per cp rank
    s_kv = recipe.seq_len  # keys a local query attends to (all of them under ring attention)
    h = model.hidden_size
    e = activation_bytes_per_element(recipe)
    er = residual_bytes_per_element(recipe)
    sp_div = t if layout.sequence_parallel else 1
    tokens = b * s
    dropout = recipe.dropout > 0.0
    a_local = model.num_heads / t
    q_local = model.q_dim / t
    g_local = model.kv_dim / t if model.num_kv_heads % t == 0 else float(model.head_dim)
    v_local = g_local * model.v_head_dim / model.head_dim  # value width per rank (d_v per head with MLA)
    o_local = model.attn_out_dim / t  # attention output: the output projection's input

    if recipe.recompute == "full":
        return LayerActivations(terms={"layer_input": er * tokens * h / sp_div})
    if recipe.recompute == "sac":
        return LayerActivations(terms=sac_layer_terms(model, recipe, layout, layer, micro_batch=b))

    trained = _trained_linears(recipe)
    terms: dict[str, float] = {}
    # Transformer Engine (megatron stack): the norm fused into the next linear saves its BF16
    # input and the linear's input (the norm output) at linear_input_bytes_per_element, the
    # local sequence shard under sequence parallelism (TransformerEngine v2.8 linear.py L164-165,
    # L329-331: the gathered copy is freed after the GEMM); eager PyTorch saves the norm output
    # in the activation dtype, all-gathered under DTensor sequence parallelism.
    te = te_saved_set(recipe)
    lin = linear_input_bytes_per_element(recipe)
    act_in = activation_input_bytes_per_element(recipe)
    # Outside the tp region (divided by t only with sequence parallelism).
    # (er: the residual stream and the norm outputs, FP32 under kbit_fp32_upcast)
    terms["attn_norm_input"] = er * tokens * h / sp_div
    if trained & {"q", "k", "v"}:
        # MLA under TE FP8: q_a and kv_a are two TELinear modules, each saving its own quantized copy
        copies = 2 if model.mla is not None and te and lin < e else 1
        terms["qkv_input"] = copies * (lin if te else er) * tokens * h / sp_div
    mla = model.mla
    if mla is not None:
        # The latents: each latent norm saves its input (the down projection's output, e) and
        # its FP32 rstd, and the up projection its input (the norm output; TE's
        # LayerNormColumnParallelLinear: the quantized copy), local shards under SP.
        latents = mla.q_lora_rank + mla.kv_lora_rank
        n_norms = 2 if mla.q_lora_rank else 1
        up_saves = (
            (lin if te else e) if trained & {"q", "k", "v"} else 0.0
        )  # a frozen up projection keeps none
        terms["mla_latents"] = (e + up_saves) * tokens * latents / sp_div
        terms["norm_stats_latent"] = n_norms * 4.0 * tokens / sp_div
    if not model.parallel_attn_mlp:
        # With parallel attention and MLP (GPT-J, GPT-NeoX) both norms read the block input,
        # which is stored once (attn_norm_input).
        terms["mlp_norm_input"] = er * tokens * h / sp_div
    if trained & {"gate", "up"} or model.is_moe_layer(layer):
        # an MoE layer's norm output (the router's and the shared experts' BF16 input) stays
        # in the activation dtype; a dense fc1 saves the quantized copy under TE
        dense_te = te and not model.is_moe_layer(layer)
        terms["mlp_input"] = (lin if dense_te else er) * tokens * h / sp_div
    if layout.sequence_parallel and not te:
        # The column-parallel linears keep the all-gathered input (see sp_saves_gathered_input).
        gathered = ("qkv_input" in terms) + ("mlp_input" in terms)
        if gathered and sp_saves_gathered_input():
            terms["sp_gathered_inputs"] = gathered * e * tokens * h * (1.0 - 1.0 / t)
    if dropout:
        terms["dropout_masks"] = 2 * 1.0 * tokens * h / sp_div
    if model.post_norms:
        # Gemma 2: the post-attention and post-MLP norms save their inputs too.
        terms["post_norm_inputs"] = 2 * e * tokens * h / sp_div
    norms = 2 * (2 if model.post_norms else 1)
    stat_bytes = 4.0 if model.norm == "rmsnorm" else 8.0  # FP32 rstd (+ mean for LayerNorm) per token
    terms["norm_stats"] = norms * stat_bytes * tokens / sp_div
    # Inside the tp region.
    # FP8 attention (Recipe.fp8_attention) saves q, k and v quantized, the output O in 16 bits;
    # under selective recompute of the attention core the checkpoint keeps its 16-bit inputs
    # (Megatron-Core _checkpointed_attention_forward checkpoints query, key, value)
    fp8_qkv = recipe.fp8_attention and "core_attn" not in recompute_module_set(recipe)
    qkv_b = BYTES_PER_ELEMENT["fp8"] if fp8_qkv else e
    terms["q_k_v"] = qkv_b * tokens * (q_local + g_local + v_local)
    if model.qk_norm:
        # Qwen3/OLMo 2: q and k norms save their inputs and an FP32 rstd per head (or per token).
        per_token_stats = 2 if model.qk_norm_full_width else (a_local + g_local / model.head_dim)
        terms["qk_norm"] = e * tokens * (q_local + g_local) + 4.0 * tokens * per_token_stats
    core_s2 = 0.0
    if recipe.attention == "eager":
        # softmax output (Hugging Face's FP32 softmax: its FP32 output and the 16-bit copy)
        core_s2 = (e + (4.0 if recipe.softmax_fp32 else 0.0)) * b * a_local * s * s_kv
        if dropout:
            core_s2 += 1.0 * b * a_local * s * s_kv + e * b * a_local * s * s_kv  # mask + dropout output
        if "o" in trained:
            terms["attn_out_proj_input"] = e * tokens * o_local
    else:
        terms["attn_output_and_lse"] = e * tokens * o_local + 4.0 * b * a_local * s
    down = "down" in trained
    modules = recompute_module_set(recipe)
    if "core_attn" not in modules and core_s2:
        terms["attn_scores"] = core_s2
    if "mla_up_proj" in modules and model.mla is not None:
        # discarded after the attention forward, rebuilt for its backward (MLASelfAttention
        # qkv_up_checkpoint.discard_output_and_register_recompute)
        del terms["q_k_v"]

    if model.is_moe_layer(layer):
        assert model.moe is not None
        moe = model.moe
        k = moe.top_k
        # balanced routing: each rank processes b·s·K token-expert pairs of the tokens its expert
        # tensor-parallel group gathers, at 1/etp of the expert width: with etp = t all the tp
        # group's tokens, with etp = 1 (parallel folding) its own sequence-parallel shard
        et = layout.expert_tp
        routed_tokens = tokens * k * et / t
        # capacity padding (Recipe.moe_capacity_factor): each expert runs on all its C slots
        slots = routed_tokens * expert_slot_ratio(model, recipe)
        # the router runs on each rank's own tokens: the sequence-parallel shard under SP
        # (Megatron-Core router.py gathers nothing)
        terms["router_probs"] = 4.0 * tokens * moe.num_experts / sp_div
        capacity = expert_capacity(model, recipe)
        width = moe.expert_ffn_hidden / et
        if recipe.moe_dispatch == "einsum" and capacity is not None:
            # GShard / MaxText dense_matmul (moe.py 14b5876e L677-689): the boolean dispatch mask
            # (saved for the input gradient of ``BSM,BSEC -> EBCM``) and the 16-bit combine mask,
            # router weights times the one-hot slot positions (saved for the gradients of
            # ``EBCM,BSEC -> BSM``), each b·S·E·C elements; no index tensors. The combine's
            # einsum saves the experts' outputs.
            masks = b * recipe.seq_len * moe.num_experts * capacity
            terms["dispatch_mask"] = 1.0 * masks
            terms["combine_mask"] = e * masks
            terms["expert_inputs"] = e * slots * h
            terms.update(_mlp_terms(model, slots, width, e, "expert_", down_trained=down))
            terms["expert_outputs"] = e * slots * h
        elif te:
            # TEGroupedMLP (Megatron-LM megatron/core/transformer/moe/experts.py): Megatron-Core's
            # fused permutation keeps an int32 row map per routed row and the weighted SwiGLU the
            # routing probability (FP32) it multiplies by; fc1 TEGroupedLinear saves each expert's
            # input (grouped_linear.py L197-218); the fused unpermute needs no saved outputs
            terms["routing_indices"] = 8.0 * routed_tokens
            terms["expert_inputs"] = lin * slots * h
            # moe_act: the activation output (fc2's input) is discarded and recomputed
            fc2_in = down and "moe_act" not in modules
            terms.update(
                _te_mlp_terms(model, slots, width, e, lin, "expert_", down_trained=fc2_in, act_in=act_in)
            )
        else:
            # int64 top-k indices (saved by ``topk``), the dispatch sort order (saved by the
            # ``index_select`` that gathers the scores) and the token index of each routed row
            # (saved by the ``index_select`` that gathers the tokens and by ``index_add``), and the
            # selected scores cast to the compute dtype (saved by the product with the outputs)
            terms["routing_indices"] = (8.0 + 8.0 + 8.0 + e) * routed_tokens
            terms["expert_inputs"] = e * slots * h
            terms.update(_mlp_terms(model, slots, width, e, "expert_", down_trained=down))
            terms["expert_outputs"] = e * slots * h
            # The score-weighted expert outputs are added back with ``index_add`` (Hugging Face
            # ``MixtralSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock``: ``final_hidden_states.index_add_``),
            # whose derivative ``source: grad.index_select(dim, index).expand_as(source)``
            # (tools/autograd/derivatives.yaml) saves the whole source tensor (the routed rows;
            # padded slots are dropped before it).
            terms["expert_weighted_outputs"] = e * routed_tokens * h
        if moe.num_shared_experts:
            shared = moe.num_shared_experts * moe.shared_width / t
            terms.update(
                _te_mlp_terms(model, tokens, shared, e, lin, "shared_", down_trained=down, act_in=act_in)
                if te
                else _mlp_terms(model, tokens, shared, e, "shared_", down_trained=down)
            )
            if moe.shared_expert_gate:
                # Qwen2-MoE ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``: the product
                # saves the shared expert's output (e·T·h) and the sigmoid output (e·T), which
                # is also what ``sigmoid`` saves for its own backward.
                terms["shared_gate"] = moe.num_shared_experts * e * tokens * (h + 1)
    else:
        # Under kbit_fp32_upcast the 4-bit gate and up projections return their FP32 input's dtype
        # (bitsandbytes Linear4bit.forward: ``out.to(inp_dtype)``), so the activation's input and
        # output, the up output and their product are FP32 too: er bytes each.
        if "mlp" in modules:
            # TransformerLayer.recompute_mlp: the MLP is checkpointed from its normalised input,
            # kept in the activation dtype; nothing inside it is saved
            terms["mlp_input"] = e * tokens * h / sp_div
        elif te:
            terms.update(
                _te_mlp_terms(
                    model, tokens, model.ffn_hidden / t, e, lin, "", down_trained=down, act_in=act_in
                )
            )
        else:
            terms.update(_mlp_terms(model, tokens, model.ffn_hidden / t, er, "", down_trained=down))
    return LayerActivations(terms=terms)


def sac_layer_terms(
    model: ModelSpec, recipe: Recipe, layout: Layout, layer: int, *, micro_batch: int | None = None
) -> dict[str, float]:
    """What one block keeps under per-op selective checkpointing (``recompute="sac"``), one micro-batch.

    The policy (:mod:`trainplan.sac`; torchtitan's ``selective_ac_option = "op"``) runs the block
    forward with autograd's saved tensors replaced by placeholders (the non-reentrant
    checkpoint's pack hook) and keeps the outputs of the ops it marks ``MUST_SAVE``:

    * ``layer_input`` e·b·s·h: the block input, kept by the checkpoint for the recomputation
      (its ``_NoopSaveInputs``; the shared RoPE cos/sin tables are the stage's ``inputs``);
    * ``sac_matmul_outputs`` e·b·s·Σ n_out: the outputs of the kept linear layers — the
      odd-numbered ``aten.mm`` calls of the block (:func:`trainplan.sac.block_linears`): q (a·d),
      v (k·d), gate (f) and down (h) in a Llama block, e·b·s·(q + g + f + h); none in a block whose
      linears all have biases (``aten.addmm`` is neither kept nor counted);
    * ``attn_output_and_lse`` e·b·s·q + 4·b·a·s: the flash kernel's outputs, the attention output
      and the FP32 log-sum-exp (as without recompute; the CUDA kernel's RNG seed and offset
      are a few bytes).

    A Llama block keeps e·b·s·(2h + 2q + g + f) + 4·b·a·s. Checked against the tracer, which runs
    the same policy (``trace/step.py`` ``apply_sac``), to the byte. Combinations the policy is
    not modelled for (MoE layers, tensor or context parallelism) raise (:func:`trainplan.sac.check_sac`).
    """
    if model.is_moe_layer(layer) or model.mla is not None or layout.tp > 1 or layout.cp > 1:
        check_sac(model, layout)
    b = recipe.micro_batch if micro_batch is None else micro_batch
    tokens = b * recipe.seq_len
    e = activation_bytes_per_element(recipe)
    kept = sum(lin.n_out for lin in block_linears(model) if lin.saved)
    return {
        "layer_input": e * tokens * model.hidden_size,
        "sac_matmul_outputs": e * tokens * kept,
        "attn_output_and_lse": e * tokens * model.q_dim + 4.0 * b * model.num_heads * recipe.seq_len,
    }


def sac_recompute_transient_bytes(model: ModelSpec, recipe: Recipe, layout: Layout, layer: int) -> float:
    """Bytes the backward of one block adds under ``recompute="sac"`` beyond what the block keeps.

    The recomputation rebuilds the block's whole saved set (:func:`layer_activations` without
    recompute), taking the kept outputs from the cache (``_CachedTorchDispatchMode`` releases each
    cache entry as the recomputation consumes it); of the kept set only what autograd saves
    stays. Counted as for full recompute — the rebuilt set in full, its copy of the block input
    standing for the gradient of the block output, of the same size — the transient beyond the
    activations counted for the block is the saved set without recompute less the kept set other
    than the block input.

    With early stop (``recompute_early_stop``) the recomputation ends when the down
    projection's input is saved, before the down matmul asks the cache for its kept output: that
    output (e·b·s·h) is never consumed and stays alive with the checkpoint until the block's
    backward is over (traced). Not with a post-MLP norm (Gemma 2), whose saved input is that output.
    """
    none = layer_activations(model, without_recompute(recipe), layout, layer).total_bytes
    kept = sac_layer_terms(model, recipe, layout, layer)
    transient = none - (sum(kept.values()) - kept["layer_input"])
    down = block_linears(model)[-1]
    down_is_last_save = not model.post_norms or model.parallel_attn_mlp
    if recipe.recompute_early_stop and down.saved and down_is_last_save:
        transient += activation_bytes_per_element(recipe) * recipe.micro_batch * recipe.seq_len * down.n_out
    return transient


_ALL_LINEARS: Final = frozenset(LORA_TARGETS)


def _trained_linears(recipe: Recipe) -> frozenset[str]:
    """Linear layers whose weight (or adapter) gets a gradient: all of them, or the LoRA targets."""
    if recipe.is_peft and recipe.lora is not None and not frozen_linear_saves_input():
        return frozenset(recipe.lora.targets)
    return _ALL_LINEARS


def korthikanti_table2_bytes(*, s: int, b: int, h: int, a: int, t: int, mode: str) -> float:
    """Korthikanti et al. 2022 Table 2, verbatim: activation bytes per transformer layer.

    ``mode``: "none", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "full".
    """
    sbh = s * b * h
    formulas = {
        "none": sbh * (34 + 5 * a * s / h),
        "tp": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp+sp": sbh * (34 / t + 5 * a * s / (h * t)),
        "tp+selective": sbh * (10 + 24 / t),
        "tp+sp+selective": sbh * (34 / t),
        "full": sbh * 2,
    }
    return formulas[mode]


def block_input_bytes(model: ModelSpec, recipe: Recipe, layout: Layout) -> float:
    """x: a block's input for one micro-batch, e·b·s·h (s/cp per rank, /t with sequence
    parallelism): the embedding output or the previous block's output, alive while FSDP2
    gathers the block that will read it (and saved by that block once it runs)."""
    s = recipe.seq_len // layout.cp
    sp_div = layout.tp if layout.sequence_parallel else 1
    return residual_bytes_per_element(recipe) * recipe.micro_batch * s * model.hidden_size / sp_div


def input_grad_bytes(model: ModelSpec, recipe: Recipe, layout: Layout, stage: int) -> float:
    """The gradient of a stage's input (one micro-batch), alive at the end of its backward.

    On stage 0 it is the gradient of the embedding output, which the embedding's backward reads:
    e·b·s·h in full, also under sequence parallelism, where the vocabulary-parallel embedding
    (``RowwiseParallel(output_layouts=Shard(1))``) all-gathers the sequence-sharded gradient back
    to its replicated output layout. On later pipeline stages it is the gradient sent to the
    previous stage, x (:func:`block_input_bytes`).
    """
    if stage > 0:
        return block_input_bytes(model, recipe, layout)
    s = recipe.seq_len // layout.cp
    return residual_bytes_per_element(recipe) * recipe.micro_batch * s * model.hidden_size


def inflight_microbatches(layout: Layout, stage: int, num_microbatches: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak.

    1F1B (Narayanan et al. 2021 Sec. 2.2.1): stage i warms up with ``pp - i`` forwards before its
    first backward, so stage 0 holds ``pp`` micro-batches of its ``L/pp`` layers (Korthikanti
    Eq. 5: L layers' worth). Interleaved with v chunks: stage 0 holds ``pp·(1 + (pp-1)/(pp·v))``
    micro-batches' worth (Korthikanti Sec. 4.2.3). Zero-bubble ZB-H1 (Qi et al. 2023) keeps the
    1F1B peak. Never more than the micro-batches in the step.
    """
    return float(capped_inflight(held_microbatches(layout, stage), num_microbatches))


def held_microbatches(layout: Layout, stage: int) -> float:
    """The schedule's peak count of :func:`inflight_microbatches` before the cap by the step's
    micro-batches: 1 without a pipeline, ``pp − i`` (1F1B, ZB-H1), ``(pp − i)·(1 + (pp−1)/(pp·v))``
    (interleaved). With EP overlap (``Layout.ep_comm_overlap``) the combined 1F1B schedule runs one
    more forward before its first backward (a whole micro-batch without a pipeline, one model
    chunk, 1/v of one, with the interleaved schedule: Megatron-Core schedules.py at core_r0.14.0
    L735-739), whose activations are held too."""
    pp = layout.pp
    extra = ep_overlap_extra_microbatches(pp, layout.virtual_stages) if layout.ep_comm_overlap else 0.0
    if pp == 1:
        return 1.0 + extra
    if layout.pp_schedule == "interleaved":
        return (pp - stage) * (1 + (pp - 1) / (pp * layout.virtual_stages)) + extra
    return float(pp - stage)


def ep_overlap_extra_microbatches(pp: int, virtual_stages: int) -> float:
    """Micro-batches' worth of activations EP overlap's extra warmup forward holds
    (:func:`held_microbatches`): one micro-batch without a pipeline, one chunk (1/v) with the
    interleaved schedule."""
    return 1.0 if pp == 1 else 1.0 / virtual_stages


def capped_inflight(held: Num, num_microbatches: Int) -> Num:
    """Never more in flight than the micro-batches in the step (over ``Num``)."""
    return minimum(held, as_float(num_microbatches))


def logits_bytes(model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[float, float]:
    """(saved, transient) bytes of the output layer for one micro-batch on the last stage.

    Saved: the final-norm input (e·b·s·h, /t with sequence parallelism) and the LM-head input
    (e·b·s·h; all-gathered under sequence parallelism, :func:`sp_saves_gathered_input`), the final
    norm's FP32 rstd (and mean for LayerNorm) and the int64 labels (4 or 8, + 8 bytes per
    token), and the FP32
    log-softmax output that cross-entropy saves (4·b·s·V/t; Megatron-LM's vocab-parallel
    cross-entropy likewise keeps an FP32 softmax, Korthikanti Sec. 4.3: 4·s·b·v/t). The 16-bit
    logits are not saved (the FP32 cast reads them and they are freed). Transient: at the start of
    backward the FP32 gradients of nll_loss and of log_softmax are alive together (8·b·s·V/t),
    as the live-tensor trace of ``trainplan verify`` shows.

    ``recipe.loss_chunks = C > 1`` (torchtune ``CEWithChunkedOutputLoss``,
    ``torchtune/modules/loss/ce_chunked_output_loss.py`` at pytorch/torchtune@30b8519e8, with its
    ``compute_cross_entropy`` compiled as the class docstring asks): the LM head runs per sequence
    chunk and each chunk is upcast and reduced inside one fused kernel, so what the loss keeps for
    backward is the logits themselves (e·b·s·V/t, all chunks, held by the recipe until the loss is
    computed) and one FP32 log-sum-exp per token (4·b·s); no FP32 log-softmax is stored. The
    transient is the FP32 logits gradient of one chunk (4·b·s·V/(t·C)). In eager mode the FP32
    log-softmax of every chunk would still be saved: chunking then only shrinks the transient.
    """
    t = layout.tp
    s = recipe.seq_len // layout.cp
    tokens = recipe.micro_batch * s
    e = activation_bytes_per_element(recipe)
    sp_div = t if layout.sequence_parallel else 1
    v_local = model.vocab_size / t
    # The final norm saves its input; the LM head saves its input only when its weight is trained
    # (a frozen head under LoRA/QLoRA needs only its weight for the input gradient). Under
    # sequence parallelism the head's input is the all-gathered sequence (sp_saves_gathered_input);
    # Megatron-Core's output layer (ColumnParallelLinear) saves the local shard and gathers it
    # again in backward (Korthikanti et al. 2022 Sec. 4.2.2).
    h = model.hidden_size
    gathered = layout.sequence_parallel and sp_saves_gathered_input() and not te_saved_set(recipe)
    head_div = 1 if gathered else sp_div
    head_inputs = residual_bytes_per_element(recipe) * tokens * h / sp_div + (
        0.0 if recipe.is_peft else e * tokens * h / head_div
    )
    # The final norm's FP32 statistics: rstd, and the mean for LayerNorm (CUDA kernels).
    stats = (4.0 if model.norm == "rmsnorm" else 8.0) * tokens / sp_div
    if recipe.loss_chunks > 1:
        saved = head_inputs + stats + e * tokens * v_local + 4.0 * tokens
        return saved, 4.0 * tokens * v_local / recipe.loss_chunks
    if recipe.fused_cross_entropy:
        # flash-attn's fused cross-entropy (Recipe.fused_cross_entropy): it saves the 16-bit
        # logits, the FP32 log-sum-exp and the int64 labels; its backward writes one 16-bit
        # logit gradient
        saved = head_inputs + stats + e * tokens * v_local + 4.0 * tokens + 8.0 * tokens
        return saved, e * tokens * v_local
    # Eager cross-entropy on the FP32 logits: log_softmax saves its FP32 output; the 16-bit logits
    # and their FP32 copy are forward transients. The backward starts with two FP32 b·s·V/t
    # tensors alive at once (nll_loss's gradient, then log_softmax's), as traced.
    # + int64 labels, + nll_loss's FP32 ``total_weight`` scalar
    saved = head_inputs + stats + 4.0 * tokens * v_local + 8.0 * tokens + 4.0
    transient = 8.0 * tokens * v_local
    # Multi-token prediction (Recipe.mtp_layers): each module's head and loss save the same set
    # again until the backward (its norm and eh_proj inputs, 3·e·b·s·h, are left out)
    return (1 + recipe.mtp_layers) * saved, transient


# --- model states -------------------------------------------------------------------------
def optimizer_state_bytes_per_param(recipe: Recipe) -> float:
    """Optimizer state bytes per trained parameter, excluding the FP32 master copy.

    AdamW: two moments (Loshchilov & Hutter 2019) in FP32 = 8 B (ZeRO Sec. 3.1: K = 12 with the
    master); in pure 16-bit training both moments are in the weight dtype. 8-bit AdamW: two int8
    moments + one FP32 absmax per 2048 values each (Dettmers et al. 2022 Sec. 2.1). SGD: none;
    SGD with momentum and Lion (Chen et al. 2023): one moment. Adafactor: handled per matrix in
    :func:`adafactor_state_params`.
    """
    sb = BYTES_PER_ELEMENT[recipe.optimizer_state_dtype]
    table = {
        "adamw": 2 * sb,
        "adamw-8bit": 2 * (1.0 + 4.0 / ADAM8BIT_BLOCK),
        "sgd": 0.0,
        "sgd-momentum": sb,
        "lion": sb,
        "adafactor": 0.0,
    }
    return table[recipe.optimizer]


def adafactor_state_params(linears: tuple[tuple[Linear, int], ...], other_params: int) -> float:
    """Adafactor (Shazeer & Stern 2018, Alg. 4, beta1 = 0): factored second moment, one row and one
    column vector per matrix (r + c values); a full second moment for vectors (norms, biases,
    embeddings counted as matrices of V × h)."""
    n = 0.0
    for lin, n_layers in linears:
        rows = lin.out_features // (lin.tp if lin.split == "column" else 1)
        cols = lin.in_features // (lin.tp if lin.split == "row" else 1)
        n += n_layers * lin.count * (rows + cols)
    return n + other_params


@dataclass(frozen=True, kw_only=True)
class _States:
    weights: float
    gradients: float
    optimizer: float
    master: float
    quant_constants: float
    host: float
    optimizer_temp: float
    trainable: int
    paged: float = 0.0
    step_in_backward: float = 0.0  # per-parameter optimizer-step temporary inside the backward phase
    # ZeRO-3 / FSDP2 buffers (MemoryBreakdown.fsdp_*); constant or ∝ 1/dp, so affine in 1/dp
    fsdp_root: float = 0.0
    fsdp_block: float = 0.0
    fsdp_next_block: float = 0.0
    fsdp_head_grad: float = 0.0
    fsdp_block_reduce: float = 0.0
    fsdp_inflight_reduce: float = 0.0
    fsdp_mid_prefetch: float = 0.0
    fsdp_block_grad_shard: float = 0.0
    fsdp_root_grad: float = 0.0
    fsdp_root_grad_shard: float = 0.0
    fsdp_root_unsharded_grad: float = 0.0
    fsdp_embedding_grad: float = 0.0
    tied_grad: float = 0.0  # wb·V/t·h: one gradient of a tied embedding / LM-head weight (no FSDP)
    fsdp_tied_grad: float = 0.0  # the same under ZeRO-3 (the root's unsharded gradient, c = wb)
    tp_embedding_grad: float = 0.0  # part of ``gradients``: the replicated embedding gradient's excess


def _model_states(model: ModelSpec, recipe: Recipe, layout: Layout, dev: DeviceParams) -> _States:
    """Model-state bytes on one device (ZeRO Sec. 5: stage 1 shards optimizer states, 2 also
    gradients, 3 also parameters, each over the dp·cp group; routed experts over dp·cp/ep)."""
    z = layout.zero
    g_dense = layout.shard_group
    g_exp = layout.expert_dp
    wb = BYTES_PER_ELEMENT[recipe.weight_dtype]
    master_b = 4.0 if recipe.keeps_master_weights else 0.0
    opt_b = optimizer_state_bytes_per_param(recipe)

    def shard(n_dense: float, n_exp: float, stage_from: int) -> float:
        return (n_dense / g_dense if z >= stage_from else n_dense) + (
            n_exp / g_exp if z >= stage_from else n_exp
        )

    quant = 0.0
    if recipe.is_peft:
        assert recipe.lora is not None
        trained_dense, trained_exp = float(dev.lora_adapters), 0.0
        adapter_wb = wb
        if recipe.method == "qlora":
            lora = recipe.lora
            n_lin = dev.dense_linear + dev.expert_linear
            # the parameters left 16-bit, FP32 after prepare_model_for_kbit_training
            other_b = 4.0 if recipe.kbit_fp32_upcast else wb
            base = 0.5 * n_lin + other_b * (dev.dense_other + dev.expert_other)
            # Per quantized weight tensor (bitsandbytes ``QuantState``): one absmax per quant_block
            # weights, FP32; with double quantization uint8, plus one FP32 scale per
            # double_quant_block absmax values and one FP32 offset.
            for lin, n_layers in dev.linears:
                blocks = -(-(lin.local_weight_params // lin.count) // lora.quant_block)
                if lora.double_quant:
                    per_tensor = blocks + 4 * -(-blocks // lora.double_quant_block) + 4
                else:
                    per_tensor = 4 * blocks
                quant += float(per_tensor * lin.count * n_layers)
        elif recipe.fp8_params:
            # TE fp8_model_init: the frozen linears are their FP8 data alone (Recipe.fp8_params);
            # embeddings, norms and the LM head stay 16-bit
            base = BYTES_PER_ELEMENT["fp8"] * (dev.dense_linear + dev.expert_linear) + wb * (
                dev.dense_other + dev.expert_other
            )
        else:
            base = wb * dev.total
        frozen = base / g_dense if z >= 3 else base
        quant = quant / g_dense if z >= 3 else quant
        weights = frozen + adapter_wb * shard(trained_dense, trained_exp, 3)
        trainable = dev.lora_adapters
    else:
        trained_dense, trained_exp = float(dev.dense), float(dev.expert)
        weights = wb * shard(trained_dense, trained_exp, 3)
        trainable = dev.total

    grads = wb * shard(trained_dense, trained_exp, 2)
    # ZeRO-3 as FSDP2 ``fully_shard`` with MixedPrecisionPolicy(param_dtype=bf16,
    # reduce_dtype=fp32): the sharded parameters are FP32 and are the master copy, gradients are
    # reduce-scattered into FP32 shards — 4 + 4 + 8 bytes per parameter instead of ZeRO's
    # 2 + 2 + 12 (same 16 in total; torch/distributed/fsdp/_fully_shard/_fsdp_param.py).
    # Under CPU offload the ZeRO-Offload layout applies instead (16-bit weights on the device,
    # the FP32 master on the host).
    fsdp2_master = z == 3 and recipe.keeps_master_weights and recipe.offload == "none"
    if fsdp2_master:
        trained_shard = shard(trained_dense, trained_exp, 3)
        weights += (4.0 - wb) * trained_shard
        grads = 4.0 * trained_shard
    largest = float(_largest_trained_param(model, recipe, layout, dev))
    if z >= 2:
        largest /= g_dense
    if recipe.optimizer_in_backward:
        # Each parameter's step runs in its post-accumulate-grad hook and its gradient is freed
        # right after (torchtune optimizer_in_bwd): one parameter's gradient is alive at a time.
        grads = wb * largest
    n_opt = shard(trained_dense, trained_exp, 1)
    if recipe.optimizer == "adafactor":
        factored = (
            adafactor_state_params(dev.linears, dev.dense_other) if not recipe.is_peft else trained_dense
        )
        opt_states = BYTES_PER_ELEMENT[recipe.optimizer_state_dtype] * (factored / (g_dense if z >= 1 else 1))
    else:
        opt_states = opt_b * n_opt
    master = 0.0 if fsdp2_master else master_b * n_opt
    optimizer = opt_states + master
    # Step temporaries (traced): a foreach AdamW/Lion/SGD-momentum step allocates one buffer of the
    # local shard in the state dtype (``torch._foreach_sqrt`` of the second moment in
    # torch/optim/adamw.py); with a separate FP32 master the 16-bit gradients are also cast to an
    # FP32 copy first: 8 bytes per parameter. bitsandbytes' 8-bit kernels update in place.
    state_b = BYTES_PER_ELEMENT[recipe.optimizer_state_dtype]
    if recipe.optimizer in ("sgd", "adamw-8bit"):
        optimizer_temp = 0.0
    elif master > 0.0:
        optimizer_temp = 8.0 * n_opt
    else:
        optimizer_temp = state_b * n_opt
    tp_embedding_grad = 0.0
    emb_extra = tp_embedding_grad_extra_params(model, layout, dev)
    if emb_extra and not recipe.is_peft and z <= 1 and not recipe.optimizer_in_backward:
        # Without FSDP the vocabulary-parallel embedding keeps its gradient at full vocabulary
        # size (see tp_embedding_grad_extra_params); a separate FP32 master casts that gradient
        # in full before the step (4 bytes per element, sharded like the step under ZeRO-1).
        tp_embedding_grad = wb * emb_extra
        grads += tp_embedding_grad
        if master > 0.0 and recipe.optimizer not in ("sgd", "adamw-8bit"):
            optimizer_temp += 4.0 * emb_extra / (g_dense if z >= 1 else 1)
    paged = 0.0
    if recipe.paged_optimizer:
        # bitsandbytes allocates paged states with cudaMallocManaged (unified memory) and updates
        # them in place in its fused step kernels: nothing in PyTorch's allocator, no temporaries.
        paged, optimizer, optimizer_temp = opt_states, master, 0.0
    step_in_backward = 0.0
    if recipe.optimizer_in_backward:
        # The per-parameter step happens during backward: its temporary is one parameter's worth.
        step_in_backward = optimizer_temp * (largest / n_opt) if n_opt else 0.0
        optimizer_temp = 0.0

    host = 0.0
    if recipe.offload != "none":
        if z == 0:
            raise RecipeError(
                "offload", "CPU offload of optimizer states needs ZeRO (--zero 1, 2 or 3), as in ZeRO-Offload"
            )
        # ZeRO-Offload (Ren et al. 2021, Sec. 4.1): optimizer states, master weights and the
        # reduced gradient shard live in CPU memory; the optimizer step runs on the CPU. The
        # megatron stack's distributed optimizer (ZeRO-1) keeps its DDP gradient buffer on the
        # device (persistent_grad_buffer): --optimizer-cpu-offload's HybridDeviceOptimizer copies
        # the shard to pinned host memory for the CPU step
        # (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py).
        host += optimizer + grads
        optimizer, master, optimizer_temp = 0.0, 0.0, 0.0
        if not (persistent_grad_buffer(recipe) and z <= 1):
            grads = 0.0
        if recipe.offload == "optimizer+params":
            if z != 3:
                raise RecipeError("offload", "offloading parameters needs --zero 3 (ZeRO-Infinity)")
            host += weights
            weights = 0.0

    # A weight shared by the embedding and the LM head (tied, one stage) receives two gradients:
    # autograd's engine sums them in the InputBuffer of the weight's AccumulateGrad node before
    # the grad is stored (torch/csrc/autograd/input_buffer.cpp ``InputBuffer::accumulate``). The
    # head's gradient arrives first as a transposed view, which cannot be accumulated into in
    # place, so the sum is a new tensor: both gradients and their sum are alive at once (traced).
    tied_grad = 0.0
    if model.tied_embeddings and layout.pp == 1 and not recipe.is_peft and not recipe.optimizer_in_backward:
        tied_grad = wb * float(-(-model.vocab_size // layout.tp) * model.embed_width)
    fsdp: dict[str, float] = {}
    if z == 3:
        fsdp["fsdp_tied_grad"], tied_grad = tied_grad, 0.0
        # FSDP2 (trace/step.py ``apply_fsdp``: ``fully_shard`` per block, then the root unit with
        # the embedding, final norm and LM head). c: the all-gathered (compute) dtype; r: the
        # reduce-scatter dtype (``MixedPrecisionPolicy.reduce_dtype``: FP32 with an FP32 master,
        # else the gradient dtype; ``foreach_reduce`` in _fsdp_collectives.py always copies the
        # unsharded gradients into one reduce-scatter input of that dtype); g: bytes per element
        # of the sharded gradient (0 when gradients live on the host).
        c = wb
        r = 4.0 if recipe.keeps_master_weights else wb
        g = 0.0 if recipe.offload != "none" else (4.0 if fsdp2_master else wb)
        layer = float(dev.largest_layer_unsharded)
        block = c * layer
        if recipe.method == "qlora":
            # The sharded NF4 base is all-gathered as NF4: torchao's NF4Tensor implements FSDP2's
            # fsdp_pre_all_gather/fsdp_post_all_gather on its quantized data and constants
            # (torchao/dtypes/nf4tensor.py), so a gathered block costs the NF4 bytes and its
            # constants, not bf16 (layer norms, a few h per layer, are counted as NF4 too).
            n_lin = dev.dense_linear + dev.expert_linear
            quant_per_param = quant * g_dense / n_lin if n_lin else 0.0
            block = (0.5 + quant_per_param) * layer
        elif recipe.is_peft and recipe.fp8_params:
            # the frozen FP8 base is gathered as FP8 (Recipe.gathered_weight_bytes); norms counted alike
            block = BYTES_PER_ELEMENT["fp8"] * layer
        # LoRA adapters are parameters of the block too, all-gathered in the compute dtype.
        block += c * dev.largest_layer_adapters
        several = len(dev.layers) >= 2
        fsdp = {
            "fsdp_root": c * dev.root_params,
            "fsdp_block": block,
            "fsdp_next_block": block if several else 0.0,
        }
        if not recipe.is_peft:
            # The root's post-backward (below): its unsharded gradients beside its unsharded
            # weights; under tensor parallelism the embedding's gradient is a replicated V × h
            # tensor that FSDP2 redistributes to the weight's Shard(0) placement
            # (``FSDPParam._get_grad_inner_tensor``: ``grad.redistribute(...)``, a V/t × h copy)
            # before the reduce-scatter: c·(V·h − V/t·h) + c·V/t·h = c·V·h beyond the shard.
            full_embedding = float(emb_extra + dev.input_embedding_params) if emb_extra else 0.0
            fsdp |= {
                "fsdp_root_unsharded_grad": c * dev.root_params,
                "fsdp_embedding_grad": c * full_embedding,
                "fsdp_head_grad": c * dev.head_params,
                "fsdp_block_reduce": r * layer,
                # inside a block's backward: the later block's reduce-scatter input still in
                # flight (a stage of ≥ 2 blocks) and, for a block with an earlier one (≥ 3 blocks
                # for the block before the last), that earlier block prefetched
                "fsdp_inflight_reduce": r * layer if several else 0.0,
                "fsdp_mid_prefetch": block if len(dev.layers) >= 3 else 0.0,
                "fsdp_block_grad_shard": g * layer / g_dense if several else 0.0,
                "fsdp_root_grad": (c + r) * dev.root_params,
                "fsdp_root_grad_shard": g * dev.root_params / g_dense,
            }
    return _States(
        weights=weights,
        gradients=grads,
        optimizer=optimizer,
        master=master,
        quant_constants=quant,
        host=host,
        optimizer_temp=optimizer_temp,
        trainable=trainable,
        paged=paged,
        step_in_backward=step_in_backward,
        tp_embedding_grad=tp_embedding_grad,
        tied_grad=tied_grad,
        **fsdp,
    )


def tp_embedding_grad_extra_params(model: ModelSpec, layout: Layout, dev: DeviceParams) -> int:
    """Elements by which the vocabulary-parallel embedding's gradient exceeds its shard (V·h − V/t·h).

    Tensor parallelism as DTensor (``torch.distributed.tensor.parallel``, torchtitan's plan: the
    embedding ``RowwiseParallel``, its weight ``Shard(0)``): the embedding backward has no
    row-wise strategy (``embedding_dense_backward_strategy`` in
    torch/distributed/tensor/_ops/_embedding_ops.py offers Shard(1), batch-sharded Partial and
    Partial-from-Partial only), so the replicated gradient of the embedding output gives a
    *replicated* V × h weight gradient, which autograd stores as ``.grad`` without converting it
    to the weight's placement. Non-zero on the device that holds the embedding as a parameter of
    its own (``DeviceParams.input_embedding_params``) when t > 1; a weight tied to the
    column-parallel head is counted with the head's sharded gradient (not traced: torchtitan
    forbids tied embeddings with tensor parallelism). Megatron-LM's ``VocabParallelEmbedding``
    looks up its local rows and so has a sharded gradient (Shoeybi et al. 2019, Sec. 3).
    """
    if layout.tp == 1 or not dev.input_embedding_params:
        return 0
    return model.vocab_size * model.embed_width - dev.input_embedding_params


def _largest_trained_param(model: ModelSpec, recipe: Recipe, layout: Layout, dev: DeviceParams) -> int:
    """Elements of the largest trained parameter tensor on the device (before ZeRO sharding).

    Full training: the largest linear weight or the vocab-parallel embedding / LM head (V/t × h)
    on the stages that hold them. LoRA: the largest adapter matrix (r × in or out × r).
    """
    largest = 0
    for lin, _ in dev.linears:
        per = lin.local_weight_params // lin.count
        if recipe.is_peft:
            assert recipe.lora is not None
            if lin.name.split(".")[-1] not in recipe.lora.targets:
                continue
            rows = lin.out_features // (lin.tp if lin.split == "column" else 1)
            cols = lin.in_features // (lin.tp if lin.split == "row" else 1)
            per = recipe.lora.rank * max(rows, cols)
        largest = max(largest, per)
    if not recipe.is_peft:
        vocab_local = -(-model.vocab_size // layout.tp) * model.embed_width
        holds_head = dev.stage == layout.pp - 1 and (not model.tied_embeddings or layout.pp > 1)
        if dev.stage == 0 or holds_head:
            largest = max(largest, vocab_local)
    return largest


STATE_FIELD_NAMES: Final = {
    "weights": "weights_bytes",
    "gradients": "gradients_bytes",
    "optimizer": "optimizer_bytes",
    "master": "master_weights_bytes",
    "quant_constants": "quant_constants_bytes",
    "host": "host_bytes",
    "optimizer_temp": "optimizer_temporaries_bytes",
    "paged": "paged_optimizer_bytes",
    "fsdp_root": "fsdp_root_bytes",
    "fsdp_block": "fsdp_block_bytes",
    "fsdp_next_block": "fsdp_next_block_bytes",
    "fsdp_head_grad": "fsdp_head_grad_bytes",
    "fsdp_block_reduce": "fsdp_block_reduce_bytes",
    "fsdp_inflight_reduce": "fsdp_inflight_reduce_bytes",
    "fsdp_mid_prefetch": "fsdp_mid_prefetch_bytes",
    "fsdp_block_grad_shard": "fsdp_block_grad_shard_bytes",
    "fsdp_root_grad": "fsdp_root_grad_bytes",
    "fsdp_root_grad_shard": "fsdp_root_grad_shard_bytes",
    "fsdp_root_unsharded_grad": "fsdp_root_unsharded_grad_bytes",
    "fsdp_embedding_grad": "fsdp_embedding_grad_bytes",
    "tp_embedding_grad": "tp_embedding_grad_bytes",
    "tied_grad": "tied_grad_bytes",
    "fsdp_tied_grad": "fsdp_tied_grad_bytes",
}
"""``_States`` field -> the ``MemoryBreakdown`` field it fills."""

LOSS_FORWARD_FRACTION: Final = 0.75
"""Forward of the unchunked loss: 6·b·s·V/t of FP32 logits / log-softmax buffers are alive
(traced, ``trace/``), ¾ of the loss-backward transient; the same fraction is assumed for chunked
losses."""


def loss_forward_bytes(model: ModelSpec, recipe: Recipe, layout: Layout) -> float:
    """The loss-forward transient beyond the saved loss tensors (:func:`logits_bytes`), one
    micro-batch on the last stage.

    Default: :data:`LOSS_FORWARD_FRACTION` of the loss-backward transient — the 16-bit logits
    and their FP32 upcast (6·b·s·V/t, traced); none under ``recipe.fused_cross_entropy``. Under ``recipe.logits_shift_copy`` (Hugging Face
    transformers 4.46-4.49 ``ForCausalLMLoss``: ``logits.float()`` then
    ``logits[..., :-1, :].contiguous()``) the FP32 copy of the shifted logits is alive with
    them: (e + 4 + 4)·b·s·V/t, e the 16-bit logits' bytes — 10·b·s·V/t in BF16, above the
    8·b·s·V/t of the loss backward, so the loss forward becomes the peak moment."""
    _, transient = logits_bytes(model, recipe, layout)
    if recipe.fused_cross_entropy:
        return 0.0  # the kernel reads the saved logits and writes one loss per token
    if not recipe.logits_shift_copy:
        return LOSS_FORWARD_FRACTION * transient
    tokens = recipe.micro_batch * (recipe.seq_len // layout.cp)
    e = activation_bytes_per_element(recipe)
    return (e + 4.0 + 4.0) * tokens * model.vocab_size / layout.tp


def host_bytes_per_node(host_bytes_per_device: Num, devices_on_node: Int) -> Num:
    """CPU memory the offloaded states take on one server.

    Under ZeRO-Offload each data-parallel rank keeps its own partition of the optimizer states,
    FP32 master weights and reduced gradients in the memory of its host (Ren et al. 2021,
    "ZeRO-Offload", Sec. 4.1 and Fig. 3), and ZeRO-Infinity adds the parameter partition
    (Rajbhandari et al. 2021, Sec. 5): the server holds the partitions of all its devices. The
    worst pipeline stage's partition stands for every device on the server (stages differ only
    by embedding and head)."""
    return host_bytes_per_device * devices_on_node


def host_fits(host_bytes_per_device: Num, devices_on_node: Int, host_capacity_bytes_per_node: Num) -> Bool:
    """The offloaded states of one server fit its CPU memory (:func:`host_bytes_per_node`);
    the operating system, data loaders and pinned staging buffers also use host memory and are
    not counted, so a plan at the edge is optimistic."""
    return host_bytes_per_node(host_bytes_per_device, devices_on_node) <= host_capacity_bytes_per_node


def stage_memory_fields(
    states: Mapping[str, Num],
    *,
    activations: Num,
    logits_saved: Num,
    logits_transient: Num,
    logits_forward: Num,
    recompute_transient: Num,
    last_layer: Num,
    block_input: Num,
    block_backward: Num = 0.0,
    block_backward_later: Num = 0.0,
    input_grad: Num,
    zero: Int,
) -> dict[str, Num]:
    """The ``MemoryBreakdown`` byte fields of one pipeline stage from its parts, over ``Num``
    (``_stage_breakdown`` on floats, the planner on arrays):

    * model states (``_model_states``: ``states`` keyed by ``_States`` field names);
    * the transient at the start of backward: the largest of the loss backward, the recomputed
      layer (full / sac recompute) and the optimizer step inside the backward;
    * the loss-forward transient (:func:`loss_forward_bytes`);
    * the stage input's gradient at the end of backward, none under ZeRO-3 (FSDP2 frees it with
      the root's reduce, traced);
    * under ZeRO-3 the working set inside one block's backward (:func:`block_backward_bytes`).
    """
    out: dict[str, Num] = {STATE_FIELD_NAMES[k]: v for k, v in states.items() if k in STATE_FIELD_NAMES}
    out |= {
        "activations_bytes": activations,
        "logits_bytes": logits_saved,
        "transient_bytes": maximum(
            maximum(logits_transient, recompute_transient), states["step_in_backward"]
        ),
        "last_layer_activations_bytes": last_layer,
        "block_input_bytes": block_input,
        "fsdp_block_backward_bytes": where(zero == 3, block_backward, 0.0),
        "fsdp_block_backward_later_bytes": where(zero == 3, block_backward_later, 0.0),
        "input_grad_bytes": where(zero == 3, 0.0, input_grad),
        "loss_forward_bytes": logits_forward,
    }
    return out


def persistent_grad_buffer(recipe: Recipe) -> bool:
    """Whether the step's gradients sit in buffers allocated once for the whole run: the megatron
    stack's do (see :func:`grads_live_at_backward_start`). DistributedDataParallel (ZeRO 0-1)
    allocates the full buffer (megatron/core/distributed/param_and_grad_buffer.py, ``grad_data``
    of full numel even under the distributed optimizer); Megatron-FSDP (ZeRO 2-3) allocates and
    zeroes its sharded ``main_grad_buffer`` once when the model is wrapped
    (megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py ``init_data``),
    only its unsharded buckets being temporary."""
    return recipe.stack == "megatron"


def grads_live_at_backward_start(
    micro_batches: Int, optimizer_in_backward: bool, persistent_buffer: Bool = False
) -> Bool:
    """Gradients accumulate across micro-batches: from the second one on they are alive when a
    backward starts (1F1B stages run backwards while later forwards are in flight); a step inside
    the backward keeps its gradients' buffers live as well. ``persistent_buffer`` (the megatron
    stack): Megatron-Core's DistributedDataParallel allocates every gradient once, as views
    (``param.main_grad``) into contiguous buffers made when the model is wrapped, and never frees
    them (megatron/core/distributed/param_and_grad_buffer.py ``_ParamAndGradBuffer``): they are
    alive through the whole step, one micro-batch or many."""
    return (micro_batches > 1) | optimizer_in_backward | persistent_buffer


@dataclass(frozen=True, kw_only=True)
class StageActivations:
    """What one pipeline stage saves for backward and its short-lived tensors.

    ``terms`` are the saved activations of every in-flight micro-batch; ``per_microbatch_bytes``
    is what each more in-flight micro-batch adds (every term but the RoPE tables, which all
    micro-batches share), so the saved bytes at ``k`` in flight are
    ``total_bytes + per_microbatch_bytes · (k − inflight)``.
    """

    terms: dict[str, float]
    per_microbatch_bytes: float
    recompute_transient_bytes: float  # the recomputed layer (full) or the sac working set
    last_layer_bytes: float  # A_l: the last block's saved activations, one micro-batch
    logits_saved_bytes: float  # last stage: saved by the output layer and the loss
    logits_transient_bytes: float  # last stage: the loss backward
    logits_forward_bytes: float = 0.0  # last stage: the loss forward (loss_forward_bytes())
    block_backward_bytes: float = 0.0  # inside the last block's backward (block_backward_bytes())
    block_backward_later_bytes: float = 0.0  # the same for the blocks before it (_block_backward_pair)

    @property
    def total_bytes(self) -> float:
        return sum(self.terms.values())


def block_backward_bytes(model: ModelSpec, recipe: Recipe, layout: Layout, layer: int) -> float:
    """Bytes that exist only inside one block's backward, at its MLP's activation-function
    gradient — the peak of a ZeRO-3 (FSDP2) block backward that the traced steps show (entries
    62–65 of the verify matrix, docs/verify-matrix.md): on top of the saved activations of the
    other blocks, the gathered blocks and the reduce-scatter buffers of the "backward (in a
    block)" moment, the block keeps

    * its rebuilt saved set under full recompute: the layer's activations without recompute,
      less the block input, which the checkpoint already holds (e·b·s·h, /t with sequence
      parallelism); under sac the working set of :func:`sac_recompute_transient_bytes`, less the
      block input as well;
    * the down projection's unsharded weight gradient, c·f·h/t (``MmBackward``: the first
      weight gradient of the block, alive until FSDP2's post-backward copies the block's
      gradients into the reduce-scatter input);
    * the gradient of the down projection's input (e·b·s·f/t), which replaced the saved
      activation product that the down projection's backward released, and the gradients of
      the activation function's inputs: two products (gate and up) for a gated MLP
      (``MulBackward0``), one (``GeluBackward0``) otherwise — (1 + gated)·e·b·s·f/t more.

    Dense full training only (a frozen base has no weight gradient; MoE blocks route tokens to
    several experts): 0 otherwise. Sources: the order of autograd's backward through
    ``down(act(gate(x))·up(x))`` (torch/csrc/autograd/generated: ``MmBackward0``,
    ``MulBackward0``, ``SiluBackward0`` release their saved tensors once run) and FSDP2's
    post-backward (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``:
    the unsharded gradients live until ``foreach_reduce`` copies them)."""
    if recipe.is_peft or model.is_moe_layer(layer) or not model.ffn_hidden:
        return 0.0
    e = activation_bytes_per_element(recipe)
    c = BYTES_PER_ELEMENT[recipe.weight_dtype]
    t = layout.tp
    tokens = recipe.micro_batch * (recipe.seq_len // layout.cp)
    f_local = model.ffn_hidden / t
    rebuilt = 0.0
    if recipe.recompute == "full":
        full = layer_activations(model, without_recompute(recipe), layout, layer).total_bytes
        rebuilt = full - block_input_bytes(model, recipe, layout)
    elif recipe.recompute == "sac":
        rebuilt = sac_recompute_transient_bytes(model, recipe, layout, layer) - block_input_bytes(
            model, recipe, layout
        )
    working = e * tokens * f_local * (2.0 if model.gated else 1.0)
    return rebuilt + c * f_local * model.hidden_size + working


def block_kinds(model: ModelSpec, recipe: Recipe, layers: tuple[int, ...]) -> list[tuple[int, int, Recipe]]:
    """(representative layer, count, the recipe its blocks run under) for each kind of block
    among a stage's ``layers``: dense or MoE (:func:`trainplan.sharding.layer_kinds`), and under
    layer-selective checkpointing recomputed or not (:func:`trainplan.recipe.block_recipe`)."""
    if not recipe.layer_selective:
        return [(i, n, recipe) for i, n in layer_kinds(model, layers)]
    groups: dict[tuple[bool, bool], tuple[int, int, Recipe]] = {}
    for j, i in enumerate(layers):
        rb = block_recipe(recipe, j)
        key = (model.is_moe_layer(i), rb is recipe)
        first, n, _ = groups.get(key, (i, 0, rb))
        groups[key] = (first, n + 1, rb)
    return list(groups.values())


def _block_backward_pair(
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    layers: tuple[int, ...],
    saved: Callable[[Recipe, int], float] | None = None,
) -> tuple[float, float]:
    """(B of the stage's last block — the first of the backward —, the largest of B_i less the
    activations of the blocks between block i and the last, over the blocks before the last):
    what the two variants of the "backward (in a block)" moment add to the activations alive
    there (:func:`block_backward_bytes`; the blocks after block i have freed theirs). Equal
    blocks give (B, B). ``saved(recipe, layer)``: a block's saved bytes (default
    :func:`layer_activations`' total)."""
    if not layers:
        return 0.0, 0.0
    cache: dict[tuple[bool, bool], tuple[float, float]] = {}

    def at(j: int) -> tuple[float, float]:
        i = layers[j]
        rb = block_recipe(recipe, j)
        key = (model.is_moe_layer(i), rb is recipe)
        if key not in cache:
            cache[key] = (
                saved(rb, i) if saved is not None else layer_activations(model, rb, layout, i).total_bytes,
                block_backward_bytes(model, rb, layout, i),
            )
        return cache[key]

    n = len(layers)
    first = at(n - 1)[1]
    later, freed = 0.0, 0.0
    for j in range(n - 2, -1, -1):
        a_j, b_j = at(j)
        later = b_j - freed if j == n - 2 else max(later, b_j - freed)
        freed += a_j
        if not recipe.layer_selective and model.moe is None:
            break  # equal blocks: the block before the last holds the most
    return first, later


def stage_activations(
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    stage: int,
    num_microbatches: int,
    *,
    block_backward: bool = True,
    blocks: dict[tuple[int, bool], tuple[Recipe, LayerActivations]] | None = None,
) -> StageActivations:
    """Saved activations (Korthikanti et al. 2022 Table 2, generalised: :func:`layer_activations`)
    of the stage's layers times the in-flight micro-batches (:func:`inflight_microbatches`), the
    first stage's inputs, and the transients that compete for the peak.

    ``block_backward=False`` leaves the ZeRO-3 block-backward bytes 0 (a layout without ZeRO-3,
    whose moments do not read them: :func:`stage_memory_fields`). ``blocks``: one layer's saved
    set per (block recipe, layer kind), shared by the stages of one ``recipe`` and ``layout``
    (a layer of one kind saves the same on every stage)."""
    layers = stage_layers(model, layout, stage)
    inflight = inflight_microbatches(layout, stage, num_microbatches)
    act_terms: dict[str, float] = {}
    largest_layer_full = 0.0
    fixed = 0.0  # bytes that do not grow with the in-flight micro-batches
    kinds = block_kinds(model, recipe, layers)
    # A stage's blocks of one kind are equal: each (block recipe, kind) is computed once; the
    # recipe is kept beside its result so that its id names it while the table lives.
    per_block = {} if blocks is None else blocks

    def block(rb: Recipe, i: int) -> LayerActivations:
        key = (id(rb), model.is_moe_layer(i))
        got = per_block.get(key)
        if got is None:
            got = per_block[key] = (rb, layer_activations(model, rb, layout, i))
        return got[1]

    for i, n_layers, rb in kinds:
        la = block(rb, i)
        for k, v in la.terms.items():
            act_terms[k] = act_terms.get(k, 0.0) + v * inflight * n_layers
        if rb.recompute == "full":
            full = block(without_recompute(rb), i)
            largest_layer_full = max(largest_layer_full, full.total_bytes)
        elif rb.recompute == "selective" and recompute_module_set(rb) - {"core_attn"}:
            # the recomputed modules' saved tensors, rebuilt for one layer's backward
            full = block(without_recompute(rb), i)
            largest_layer_full = max(largest_layer_full, full.total_bytes - la.total_bytes)
        elif rb.recompute == "sac":
            largest_layer_full = max(largest_layer_full, sac_recompute_transient_bytes(model, rb, layout, i))
    if stage == 0:
        # int64 token ids of every in-flight micro-batch, and the RoPE cos/sin tables (s × d each,
        # shared by all layers and micro-batches). The embedding output is layer 0's norm input.
        # The int64 token ids are saved by the embedding for its weight gradient (not when it is
        # frozen: LoRA/QLoRA), and learned positions save their int64 position ids (s, shared by
        # the micro-batch).
        s_local = recipe.seq_len // layout.cp
        inputs = 0.0 if recipe.is_peft else inflight * 8.0 * recipe.micro_batch * s_local
        if model.position == "rope":
            rope_dim = model.mla.qk_rope_head_dim if model.mla is not None else model.head_dim
            fixed = 2 * activation_bytes_per_element(recipe) * s_local * rope_dim
            inputs += fixed
        elif model.position == "learned" and not recipe.is_peft:
            inputs += inflight * 8.0 * s_local
        act_terms["inputs"] = inputs
        first_recipe = block_recipe(recipe, 0)
        if recipe.is_peft and first_recipe.recompute != "full" and layers:
            # Frozen embedding and frozen first norm: nothing upstream of layer 0's attention norm
            # needs a gradient, so that norm (autograd records no node) saves neither its input
            # (the embedding output) nor its statistics (traced).
            first = block(first_recipe, layers[0]).terms
            stats = first["norm_stats"] / (2 * (2 if model.post_norms else 1))
            # Taken out of the terms that counted them for every layer: no term is negative.
            act_terms["attn_norm_input"] -= inflight * first["attn_norm_input"]
            act_terms["norm_stats"] -= inflight * stats
    logits_saved, logits_transient, logits_forward = (0.0, 0.0, 0.0)
    if stage == layout.pp - 1:
        logits_saved, logits_transient = logits_bytes(model, recipe, layout)
        logits_forward = loss_forward_bytes(model, recipe, layout)
    return StageActivations(
        terms=act_terms,
        per_microbatch_bytes=(sum(act_terms.values()) - fixed) / inflight,
        recompute_transient_bytes=largest_layer_full,
        last_layer_bytes=block(block_recipe(recipe, len(layers) - 1), layers[-1]).total_bytes
        if layers
        else 0.0,
        logits_saved_bytes=logits_saved,
        logits_transient_bytes=logits_transient,
        logits_forward_bytes=logits_forward,
        # what the block's backward adds; a moment of ZeRO-3 only (stage_memory_fields)
        **dict(
            zip(
                ("block_backward_bytes", "block_backward_later_bytes"),
                _block_backward_pair(model, recipe, layout, layers, lambda rb, i: block(rb, i).total_bytes)
                if block_backward
                else (0.0, 0.0),
                strict=True,
            )
        ),
    )


DEFAULT_MEMORY_MARGIN: Final = 0.0
"""Headroom kept free by default: none beyond what the peak already counts (the CUDA context and
the caching allocator's fragmentation, ``memory_breakdown``)."""


def check_memory_margin(margin: float) -> None:
    """A margin is a fraction of the capacity in [0, 1)."""
    if not 0.0 <= margin < 1.0:
        raise TrainplanError(
            "memory_margin",
            f"is the fraction of device memory kept free, in [0, 1); got {margin!r} (e.g. 0.1)",
        )


def usable_bytes(capacity_bytes: Num, memory_margin: float) -> Num:
    """Device memory a plan may fill: capacity · (1 − margin). Estimate's ``fits`` and the
    planner's fit (``planner/bulk.py``) both compare the per-device peak with this."""
    return capacity_bytes * (1.0 - memory_margin)


def _stage_breakdown(
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    stage: int,
    capacity_bytes: float,
    num_microbatches: int,
    host: tuple[float | None, int],
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    blocks: dict[tuple[int, bool], tuple[Recipe, LayerActivations]] | None = None,
) -> MemoryBreakdown:
    dev = device_params(model, layout, stage, recipe.lora)
    st = _model_states(model, recipe, layout, dev)
    acts = stage_activations(
        model, recipe, layout, stage, num_microbatches, block_backward=layout.zero == 3, blocks=blocks
    )
    fields = stage_memory_fields(
        vars(st),
        activations=acts.total_bytes,
        logits_saved=acts.logits_saved_bytes,
        logits_transient=acts.logits_transient_bytes,
        logits_forward=acts.logits_forward_bytes,
        recompute_transient=acts.recompute_transient_bytes,
        last_layer=acts.last_layer_bytes,
        block_backward=acts.block_backward_bytes,
        block_backward_later=acts.block_backward_later_bytes,
        block_input=block_input_bytes(model, recipe, layout) if dev.layers else 0.0,
        input_grad=input_grad_bytes(model, recipe, layout, stage),
        zero=layout.zero,
    )
    return MemoryBreakdown(
        **cast(dict[str, Any], fields),
        comm_buffers_bytes=0.0,
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        capacity_bytes=capacity_bytes,
        host_capacity_bytes_per_node=host[0],
        devices_on_node=host[1],
        stage=stage,
        grads_live_at_backward_start=bool(
            grads_live_at_backward_start(
                num_microbatches, recipe.optimizer_in_backward, persistent_grad_buffer(recipe)
            )
        ),
        params_on_device=dev.total,
        trainable_params_on_device=st.trainable,
        activation_terms=acts.terms,
        fsdp=layout.zero == 3,
        memory_margin=memory_margin,
    )


def candidate_stages(model: ModelSpec, layout: Layout) -> list[int]:
    """The pipeline stages that can hold the peak: the first (embedding, the most in-flight
    micro-batches), the last (LM head, logits) and the first stage of each layer count between
    them (later stages of one count hold fewer micro-batches in flight, Korthikanti 2022 Eq. 5).
    Under an uneven split (``pp_split_embedding`` / ``pp_split_head``) a middle stage holds more
    layers than the first or the last."""
    stages = {0, layout.pp - 1}
    seen: set[int] = set()
    for r, n in enumerate(map(len, layout.stage_layers(model.num_layers))):
        if n not in seen:
            seen.add(n)
            stages.add(r)
    return sorted(stages)


def memory_breakdown(
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    *,
    capacity_bytes: float = float("inf"),
    num_microbatches: int | None = None,
    host_capacity_bytes_per_node: float | None = None,
    devices_on_node: int = 1,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
) -> MemoryBreakdown:
    """Per-device memory of the worst pipeline stage (of :func:`candidate_stages`: stage 0 holds the
    most in-flight activations, the last stage the logits and LM head).
    ``host_capacity_bytes_per_node`` and ``devices_on_node`` check offloaded states against the
    server's CPU memory (:func:`host_fits`)."""
    layout.check_model(model)
    nmb = num_microbatches
    if nmb is None:
        nmb = layout.check_batch(
            seq_len=recipe.seq_len, micro_batch=recipe.micro_batch, global_batch=recipe.global_batch
        )
    if recipe.optimizer_in_backward and nmb > 1:
        raise RecipeError(
            "optimizer_in_backward",
            f"the step runs inside each backward and frees the gradient, so gradients cannot "
            f"accumulate over {nmb} micro-batches; set the global batch to dp·micro-batch",
        )
    check_modelled(model, recipe, layout)
    stages = candidate_stages(model, layout)
    host = (host_capacity_bytes_per_node, devices_on_node)
    check_memory_margin(memory_margin)
    blocks: dict[tuple[int, bool], tuple[Recipe, LayerActivations]] = {}  # shared by the stages
    results = [
        _stage_breakdown(model, recipe, layout, st, capacity_bytes, nmb, host, memory_margin, blocks)
        for st in stages
    ]
    return max(results, key=lambda m: m.per_device_bytes)


__all__ = [
    "CUDA_CONTEXT_BYTES",
    "FRAGMENTATION_FRACTION",
    "LayerActivations",
    "MemoryBreakdown",
    "inflight_microbatches",
    "korthikanti_table2_bytes",
    "layer_activations",
    "logits_bytes",
    "memory_breakdown",
    "stage_layers",
]
