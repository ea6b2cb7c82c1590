"""Trace one training step of a reference model under fake tensors on a fake process group.

What is built, in torchtitan's order (``torchtitan/models/llama3/infra/parallelize.py``):
tensor parallelism (DTensor ``parallelize_module``) → activation checkpointing (full, or
torchtitan's per-op selective policy: :func:`apply_sac`) → FSDP2
(``fully_shard`` per block, then the root) → parameters materialised as fake CPU tensors.

Precision (what each configuration keeps, per trained parameter):

* ``fp32``: fp32 weights, fp32 gradients, fp32 AdamW moments (4 + 4 + 8).
* 16-bit without FSDP: 16-bit weights and gradients, FP32 master weights and moments kept by
  :class:`MasterWeightAdamW` (2 + 2 + 4 + 8, the recipe convention); ``master_weights=False``
  trains "pure" 16-bit (2 + 2 + 2·2).
* 16-bit with FSDP2: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, the
  torchtitan default: the sharded parameters *are* the FP32 master, gradients are FP32 shards
  (4 + 4 + 8 per parameter, divided by the shard group); 16-bit copies exist only while a block
  is all-gathered.

The optimizer is AdamW with ``foreach=True`` (the CUDA default), its state created before the
step (steady state: the traced step is not the first one, whose ``step()`` allocates the moments).
Gradients are ``None`` at the start (``zero_grad(set_to_none=True)``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe, fp8_options_set
from trainplan.trace.lora import apply_lora, quant_buffers
from trainplan.trace.models import MLP, Block, MoE, ReferenceLM, build_model, num_params, retie
from trainplan.trace.tracer import CATEGORIES, LiveStorageTracker, classify, flop_counter, flops_by_op

LOW_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16, "fp4": torch.bfloat16}
GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")
ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
)


class UnsupportedConfig(ValueError):
    """A configuration the tracer cannot build; the message says why."""


@dataclass
class StepTrace:
    """One traced training step on one device (rank 0)."""

    peak_bytes: int
    peak_phase: str
    breakdown_bytes: dict[str, int]
    phase_peaks_bytes: dict[str, int]
    end_of_forward_bytes: int
    end_of_forward_breakdown_bytes: dict[str, int]
    layer_saved_bytes: list[int]
    flops_by_op: dict[str, int]
    params: int
    trace_s: float
    phase_breakdowns_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def gemm_flops(self) -> int:
        return sum(v for k, v in self.flops_by_op.items() if k in GEMM_OPS)

    @property
    def attention_flops(self) -> int:
        return sum(v for k, v in self.flops_by_op.items() if k in ATTENTION_OPS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "breakdown_bytes": dict(self.breakdown_bytes),
            "phase_peaks_bytes": dict(self.phase_peaks_bytes),
            "end_of_forward_bytes": self.end_of_forward_bytes,
            "end_of_forward_breakdown_bytes": dict(self.end_of_forward_breakdown_bytes),
            "layer_saved_bytes": list(self.layer_saved_bytes),
            "phase_breakdowns_bytes": {k: dict(v) for k, v in self.phase_breakdowns_bytes.items()},
            "state_bytes": dict(self.state_bytes),
            "flops_by_op": dict(self.flops_by_op),
            "gemm_flops": self.gemm_flops,
            "attention_flops": self.attention_flops,
            "params": self.params,
            "trace_s": self.trace_s,
            "notes": list(self.notes),
        }


class MasterWeightAdamW:
    """AdamW on FP32 master copies of 16-bit parameters (Micikevicius et al. 2018, Sec. 3.1).

    State per parameter: FP32 master, FP32 ``exp_avg`` and ``exp_avg_sq`` (12 bytes; ZeRO Sec. 3.1
    K = 12). ``step()``: the 16-bit gradients are cast to FP32 (a temporary of 4 bytes per
    parameter, as DeepSpeed's and Megatron-LM's FP32 gradient copies), a foreach AdamW updates
    the masters (one more FP32 temporary the size of the parameters: ``_foreach_sqrt`` of the
    second moment, ``torch/optim/adam.py``), and the masters are copied back into the 16-bit
    parameters.
    """

    def __init__(self, params: list[nn.Parameter], **kw: Any) -> None:
        self.params = params
        self.masters = [p.detach().float() for p in params]
        for m in self.masters:
            m.requires_grad_(True)
        self.inner = torch.optim.AdamW(split_dtensor_groups(self.masters), foreach=True, **kw)
        init_adam_state(self.inner)

    @property
    def state_tensors(self) -> list[torch.Tensor]:
        return [*self.masters, *state_tensors(self.inner)]

    @property
    def host_state_tensors(self) -> list[torch.Tensor]:
        return host_state_tensors(self.inner)

    def step(self) -> None:
        for m, p in zip(self.masters, self.params, strict=True):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for m in self.masters:
            m.grad = None
        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=True):
                p.copy_(m)


def split_dtensor_groups(params: list[Any]) -> list[dict[str, Any]]:
    """One optimizer group of DTensor parameters, one of plain ones (foreach ops cannot mix them)."""
    from torch.distributed.tensor import DTensor

    dt = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": g} for g in (dt, plain) if g]


def init_adam_state(opt: torch.optim.Optimizer) -> None:
    """Create AdamW's moments as ``torch.optim.Adam._init_group`` does on the first step."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                opt.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }


def state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer state that lives on the device: moments (and masters), not ``step``."""
    return [
        v for st in opt.state.values() for k, v in st.items() if isinstance(v, torch.Tensor) and k != "step"
    ]


def host_state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """AdamW's ``step`` counters: host tensors on a GPU run.

    ``torch.optim.Adam._init_group`` (torch/optim/adam.py) creates ``state["step"]`` with
    ``device="cpu"`` unless ``capturable`` or ``fused`` is set (neither is for the foreach
    default), so they take no device memory; the tracer, whose tensors are all fake CPU tensors,
    is told to ignore them.
    """
    return [st["step"] for st in opt.state.values() if isinstance(st.get("step"), torch.Tensor)]


# -- fake process group ------------------------------------------------------------------------
def init_fake_process_group(world_size: int) -> None:
    """(Re)initialise the default process group as torch's ``fake`` backend, rank 0 of ``world_size``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world_size:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


@contextlib.contextmanager
def _dtensor_prop_without_outer_fake_mode() -> Any:
    """Keep DTensor's sharding propagation in a private fake mode.

    ``ShardingPropagator._propagate_tensor_meta_non_cached`` runs each op on full-size (global
    shape) fake tensors in ``detect_fake_mode()``; under an outer fake mode that is the tracing
    mode, so the global-size helper tensors would be counted as live memory of the rank. A CUDA
    run never allocates them (they exist only to derive output shapes).
    """
    from torch.distributed.tensor import _sharding_prop

    orig = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = orig


# -- parallelisation ---------------------------------------------------------------------------
def apply_tp(model: ReferenceLM, mesh: Any, *, sequence_parallel: bool) -> None:
    """Megatron tensor parallelism with DTensor, as torchtitan's ``apply_tp`` (Llama 3).

    Column-parallel q/k/v/gate/up, row-parallel o/down. With sequence parallelism the norms run on
    sequence shards (``SequenceParallel``) and each block's input is all-gathered at the
    attention/MLP entry; without it the residual stream stays replicated. The LM head is
    column-parallel with vocabulary-parallel cross-entropy (``loss_parallel``), so logits are
    ``b·s·V/t`` per rank; the embedding is row-parallel (vocabulary-sharded).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    resid = Shard(1) if sp else Replicate()
    parallelize_module(
        model,
        mesh,
        {
            "embed": RowwiseParallel(
                input_layouts=Replicate(), output_layouts=resid, use_local_output=not sp
            ),
            **({"norm": SequenceParallel()} if sp else {}),
            "head": ColwiseParallel(input_layouts=resid, output_layouts=Shard(-1), use_local_output=False),
        },
    )
    for block in model.layers:
        blk = _unwrap(block)
        plan: dict[str, Any] = {}
        attn_prefix = "attn"
        plan[f"{attn_prefix}.q"] = ColwiseParallel()
        plan[f"{attn_prefix}.k"] = ColwiseParallel()
        plan[f"{attn_prefix}.v"] = ColwiseParallel()
        plan[f"{attn_prefix}.o"] = RowwiseParallel(output_layouts=resid, use_local_output=not sp)
        if sp:
            plan["attn_norm"] = SequenceParallel()
            plan["mlp_norm"] = SequenceParallel()
            plan[attn_prefix] = PrepareModuleInput(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            )
            plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        mlp = blk.mlp
        if isinstance(mlp, MLP):
            mlp_plans = {"mlp": mlp}
        else:
            assert isinstance(mlp, MoE)
            if sp:
                raise UnsupportedConfig(
                    "MoE with sequence parallelism is not traced (the MoE block runs replicated)"
                )
            mlp_plans = {f"mlp.experts.{i}": e for i, e in enumerate(mlp.experts)}
            mlp_plans.update({f"mlp.shared.{i}": e for i, e in enumerate(mlp.shared)})
        for prefix, m in mlp_plans.items():
            if m.gate is not None:
                plan[f"{prefix}.gate"] = ColwiseParallel()
            plan[f"{prefix}.up"] = ColwiseParallel()
            down_out = resid if prefix == "mlp" else Replicate()
            plan[f"{prefix}.down"] = RowwiseParallel(
                output_layouts=down_out, use_local_output=not (sp and prefix == "mlp")
            )
        parallelize_module(blk, mesh, plan)


def _unwrap(block: nn.Module) -> Block:
    inner = getattr(block, "_checkpoint_wrapped_module", block)
    assert isinstance(inner, Block)
    return inner


def apply_checkpointing(model: ReferenceLM, *, early_stop: bool, every: int = 1) -> None:
    """Full activation checkpointing of every block (non-reentrant ``checkpoint_wrapper``), or
    of every ``every``-th one (``Recipe.recompute_every``: torchtitan's ``_apply_layer_sac``
    wraps block k, 1-based, when ``k % every == 0``).

    ``early_stop`` (``Recipe.recompute_early_stop``) is PyTorch's default: the recomputation
    stops once every tensor the block saved has been saved again. ``False`` recomputes the whole
    block, as a reentrant checkpoint (Megatron-LM, DeepSpeed) does. It is set with
    ``torch.utils.checkpoint.set_checkpoint_early_stop`` around each checkpointed forward (the
    flag is read when the forward runs; the ``early_stop`` argument of ``checkpoint`` is newer
    than the oldest supported torch).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    def checkpoint_fn(function: Any, *args: Any, **kwargs: Any) -> Any:
        with set_checkpoint_early_stop(early_stop):
            return checkpoint(function, *args, use_reentrant=False, **kwargs)

    for i, block in enumerate(model.layers):
        if (i + 1) % every == 0:
            model.layers[i] = checkpoint_wrapper(block, checkpoint_fn=checkpoint_fn, preserve_rng_state=False)


def sac_save_ops() -> frozenset[Any]:
    """The ops whose outputs torchtitan's per-op selective checkpointing keeps, as ops of this torch.

    torchtitan 0.2.2 ``_op_sac_save_list`` (torchtitan/models/llama3/infra/parallelize.py):
    ``aten.mm``, the SDPA kernels (``_scaled_dot_product_efficient_attention``,
    ``_scaled_dot_product_flash_attention``, ``_scaled_dot_product_cudnn_attention``,
    ``_scaled_dot_product_attention_math``, ``_scaled_dot_product_fused_attention_overrideable``),
    ``_c10d_functional.reduce_scatter_tensor`` and ``aten.max`` (the FP8 amax); the flex, varlen
    and compiled-region entries are not reachable from the reference blocks. The CPU flash kernel
    ``_scaled_dot_product_flash_attention_for_cpu``, which SDPA dispatches to under fake CPU
    tensors, stands in for the CUDA ``_scaled_dot_product_flash_attention`` (both return the
    output and the FP32 log-sum-exp). ``aten.addmm`` (a linear layer with a bias) and
    ``aten.bmm`` are not in the list: their outputs are recomputed.
    """
    aten = torch.ops.aten
    names = (
        "mm",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
        "max",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    ops: set[Any] = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return frozenset(ops)


def apply_sac(model: ReferenceLM, *, early_stop: bool, on_save: Any = None) -> None:
    """Per-op selective activation checkpointing of every block, as torchtitan's ``selective_ac_option = "op"``.

    The policy of ``_apply_op_sac`` in torchtitan/distributed/activation_checkpoint.py (0.2.2;
    the same at pytorch/torchtitan@9dec370, torchtitan/parallelisms/parallelize_llama.py), on
    ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` under a non-reentrant
    ``checkpoint_wrapper``: within one checkpointed block call, the outputs of the ops of
    :func:`sac_save_ops` are kept (``MUST_SAVE``) except every second ``aten.mm`` (the count
    starts at each block call, separately for the forward and the recomputation), and every
    other op is recomputed (``PREFER_RECOMPUTE``). ``early_stop`` as for :func:`apply_checkpointing`
    (torchtitan 0.2's ``[activation_checkpoint] early_stop``, default false). ``on_save`` is called
    with each kept output during the forward (the tracer counts them as activations), where the
    torch version hands the policy the op's output (``SelectiveCheckpointContext.op_output``, as
    2.13 does; without it the kept outputs still count in the live bytes, as temporaries).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils._pytree import tree_flatten
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
        set_checkpoint_early_stop,
    )

    save_ops = sac_save_ops()
    mm = torch.ops.aten.mm.default

    def context_fn() -> Any:
        counts = {False: 0, True: 0}  # aten.mm calls in the forward / in the recomputation

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            if func == mm:
                counts[ctx.is_recompute] += 1
                if counts[ctx.is_recompute] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            if func not in save_ops:
                return CheckpointPolicy.PREFER_RECOMPUTE
            if on_save is not None and not ctx.is_recompute:
                for t in tree_flatten(getattr(ctx, "op_output", None))[0]:
                    if isinstance(t, torch.Tensor):
                        on_save(t)
            return CheckpointPolicy.MUST_SAVE

        return create_selective_checkpoint_contexts(policy)

    def checkpoint_fn(function: Any, *args: Any, **kwargs: Any) -> Any:
        with set_checkpoint_early_stop(early_stop):
            return checkpoint(function, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block, checkpoint_fn=checkpoint_fn, preserve_rng_state=False)


def apply_fsdp(model: ReferenceLM, mesh: Any, recipe: Recipe) -> None:
    """FSDP2 ``fully_shard`` on every block, then the root (embedding, final norm, head), as torchtitan.

    Mixed precision: ``param_dtype`` = the compute dtype, ``reduce_dtype`` = fp32; the last block
    is not resharded after forward (its backward runs next), as torchtitan does.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if recipe.precision != "fp32":
        mp = MixedPrecisionPolicy(param_dtype=LOW_DTYPE[recipe.precision], reduce_dtype=torch.float32)
    n = len(model.layers)
    for i, block in enumerate(model.layers):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < n - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def _fsdp_params(model: nn.Module) -> Iterator[Any]:
    """Every ``FSDPParam`` of the modules ``fully_shard`` wrapped, module by module."""
    for m in model.modules():
        get_state = getattr(m, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = get_state()._fsdp_param_group
        if group is None:
            continue
        yield from group.fsdp_params


def fsdp_gather_tensors(model: nn.Module) -> list[torch.Tensor]:
    """All-gather outputs and unsharded parameters FSDP2 keeps for each parameter (storages persist)."""
    out: list[torch.Tensor] = []
    for fp in _fsdp_params(model):
        out.extend(t for t in getattr(fp, "all_gather_outputs", []) if isinstance(t, torch.Tensor))
        up = getattr(fp, "_unsharded_param", None)
        if isinstance(up, torch.Tensor):
            out.append(up)
    return out


def fsdp_uneven_shard_bytes(model: nn.Module, opt: Any) -> int:
    """Model-state bytes rank 0 holds beyond an even split, from FSDP2's dim-0 chunks.

    ``fully_shard`` splits each parameter along dim 0 into N chunks of ceil(d0/N) rows
    (``torch.chunk``; ``FSDPParam._init_sharded_param`` pads every rank's shard to that size), so
    when d0 is not a multiple of N rank 0 holds ``ceil(d0/N)·rest`` elements instead of
    ``numel/N`` — for the parameter, its gradient shard and each optimizer moment. The analytic
    model divides evenly; this is the difference, per traced rank 0.
    """
    from torch.distributed.tensor import DTensor

    states = opt.inner.state if isinstance(opt, MasterWeightAdamW) else opt.state
    extra_bytes = 0.0
    for fp in _fsdp_params(model):
        p = fp.sharded_param
        if not isinstance(p, DTensor):
            continue
        shards = 1
        for i, pl in enumerate(p.placements):
            if pl.is_shard():
                shards *= p.device_mesh.size(i)
        extra = p._local_tensor.numel() - p.numel() / shards
        if extra <= 0:
            continue
        tensors = [p, *([p.grad] if p.grad is not None else [])]
        tensors += [v for k, v in states.get(p, {}).items() if k != "step" and isinstance(v, torch.Tensor)]
        extra_bytes += sum(extra * t.element_size() for t in tensors)
    return round(extra_bytes)


# -- the traced step ---------------------------------------------------------------------------
def check_supported(model: ModelSpec, recipe: Recipe, layout: Layout) -> None:
    if recipe.mtp_layers:
        raise UnsupportedConfig(
            "multi-token prediction modules are not traced (the reference models have none)"
        )
    if model.mla is not None:
        raise UnsupportedConfig(
            "multi-head latent attention is not traced (the reference blocks build q, k, v, o projections)"
        )
    if recipe.fused_cross_entropy:
        raise UnsupportedConfig(
            "flash-attn's fused cross-entropy is not traced (the reference loss is PyTorch's)"
        )
    if 0 < model.attention_window < recipe.seq_len:
        raise UnsupportedConfig(
            f"sliding-window attention ({model.attention_window} tokens, shorter than the sequence) is not traced "
            "(the reference attention is full causal)"
        )
    if model.attention_sinks:
        raise UnsupportedConfig(
            "attention sinks (gpt-oss) are not traced (the reference attention is PyTorch's SDPA, which has none)"
        )
    if recipe.recompute_layers:
        raise UnsupportedConfig(
            "Megatron's block recompute (--recompute-layers) is not traced (the reference checkpointing wraps "
            "every block or every n-th)"
        )
    for _, flag in fp8_options_set(recipe):
        raise UnsupportedConfig(
            f"{flag} is a Transformer Engine setting; the reference modules are PyTorch's"
        )
    if layout.pp > 1:
        raise UnsupportedConfig("pipeline parallelism is not traced (fake-PG P2P schedules need real ranks)")
    if layout.cp > 1:
        raise UnsupportedConfig("context parallelism is not traced")
    if layout.ep > 1:
        raise UnsupportedConfig("expert parallelism is not traced")
    if layout.expert_tp != layout.tp:
        raise UnsupportedConfig("expert tensor parallelism other than tp (--etp) is not traced")
    if layout.zero in (1, 2):
        raise UnsupportedConfig("ZeRO-1/2 are not traced (FSDP2 implements ZeRO-3 only)")
    if recipe.moe_capacity_factor is not None or recipe.moe_dispatch != "gather":
        raise UnsupportedConfig(
            "capacity-padded or einsum-dispatched MoE routing is not traced (the reference MoE layers "
            "route dropless by index)"
        )
    if recipe.recompute == "selective":
        raise UnsupportedConfig("selective (attention-core) recompute is not traced (none, full and sac are)")
    if recipe.recompute == "sac":
        from trainplan.errors import TrainplanError
        from trainplan.sac import check_sac

        try:
            check_sac(model, layout)
        except TrainplanError as err:
            raise UnsupportedConfig(f"sac is not traced where it is not modelled: {err.message}") from err
    if recipe.optimizer != "adamw":
        raise UnsupportedConfig(f"optimizer {recipe.optimizer!r} is not traced (AdamW only)")
    if recipe.attention != "flash":
        raise UnsupportedConfig("only flash attention is traced (eager SDPA would use the math kernel)")
    if recipe.dropout > 0:
        raise UnsupportedConfig("dropout is not traced (the reference models have none)")
    if recipe.method not in ("pretrain", "full", "lora", "qlora"):
        raise UnsupportedConfig(f"method {recipe.method!r} is not traced")
    if recipe.method == "qlora" and layout.zero == 3:
        raise UnsupportedConfig("QLoRA with FSDP is not traced (NF4 storage is not an FSDP parameter)")
    if model.tied_embeddings and layout.tp > 1:
        raise UnsupportedConfig(
            "tied embeddings with tensor parallelism are not traced (torchtitan forbids them too)"
        )
    if recipe.offload != "none":
        raise UnsupportedConfig("offloading is not traced")


def reduced_model(model: ModelSpec, depth: int | None) -> ModelSpec:
    """The model with ``depth`` layers (MoE layer pattern kept), or the model itself."""
    if depth is None or depth >= model.num_layers:
        return model
    moe = model.moe
    if moe is not None and moe.first_dense_layers > depth:
        moe = replace(moe, first_dense_layers=depth)
    return replace(model, num_layers=depth, moe=moe)


def trace_step(model: ModelSpec, recipe: Recipe, layout: Layout, *, depth: int | None = None) -> StepTrace:
    """Trace forward + backward + optimizer step of one micro-batch on rank 0 of ``layout``."""
    check_supported(model, recipe, layout)
    spec = reduced_model(model, depth)
    layout.check_model(spec)
    t0 = time.perf_counter()
    fsdp = layout.zero == 3 and layout.shard_group > 1
    low = recipe.precision != "fp32"
    compute_dtype = LOW_DTYPE[recipe.precision] if low else torch.float32
    notes: list[str] = []
    # Parameter storage dtype: FP32 under FSDP2 mixed precision (the sharded FP32 copy is the master).
    module_dtype = compute_dtype if recipe.is_peft else torch.float32 if fsdp or not low else compute_dtype
    net = build_model(spec, dtype=module_dtype)
    if recipe.is_peft:
        assert recipe.lora is not None
        apply_lora(net, recipe.lora, quantize=recipe.method == "qlora", dtype=module_dtype)
        if fsdp and recipe.keeps_master_weights:
            # As for full training under FSDP2: the trained (adapter) parameters are stored in
            # FP32 and are the master; MixedPrecisionPolicy(param_dtype) all-gathers them in the
            # compute dtype with the frozen 16-bit base, and their gradient shards and AdamW
            # moments are FP32 (4 + 4 + 8 bytes per adapter parameter).
            for p in net.parameters():
                if p.requires_grad:
                    p.data = p.data.float()

    world = layout.dp * layout.tp
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        init_fake_process_group(world)
        mesh = init_device_mesh("cpu", (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    if layout.tp > 1:
        assert mesh is not None
        apply_tp(net, mesh["tp"], sequence_parallel=layout.sequence_parallel)
    sac_sink: list[Any] = []  # the tracker, once it exists: it counts what the policy keeps
    if recipe.recompute == "full":
        apply_checkpointing(net, early_stop=recipe.recompute_early_stop, every=recipe.recompute_every)
    elif recipe.recompute == "sac":
        apply_sac(
            net,
            early_stop=recipe.recompute_early_stop,
            on_save=lambda t: sac_sink[0].mark_saved(t) if sac_sink else None,
        )
    if fsdp:
        assert mesh is not None
        apply_fsdp(net, mesh["dp"], recipe)

    from torch._subclasses.fake_tensor import FakeTensorMode

    tp_ctx: Any = contextlib.nullcontext()
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        tp_ctx = loss_parallel()

    with FakeTensorMode(allow_non_fake_inputs=True), _dtensor_prop_without_outer_fake_mode():
        net.to_empty(device="cpu")
        if not fsdp and layout.tp == 1:
            retie(net)
        trainable = [p for p in net.parameters() if p.requires_grad]
        use_master = low and not fsdp and recipe.master_weights
        opt: Any
        if use_master:
            opt = MasterWeightAdamW(trainable, lr=1e-4)
            opt_state = opt.state_tensors
            host_state = opt.host_state_tensors
        else:
            opt = torch.optim.AdamW(split_dtensor_groups(trainable), lr=1e-4, foreach=True)
            init_adam_state(opt)
            opt_state = state_tensors(opt)
            host_state = host_state_tensors(opt)
        b, s = recipe.micro_batch, recipe.seq_len
        tokens = torch.zeros((b, s), dtype=torch.int64)
        labels = torch.zeros((b, s), dtype=torch.int64)

        tracker = LiveStorageTracker()
        sac_sink.append(tracker)
        layer_saved: list[int] = []
        hooks = _region_hooks(net, tracker, layer_saved)
        counter = flop_counter()
        tracker.ignore(host_state)
        # The tracker is entered last, so it is the first mode to see each op, as the device runs
        # it: the FLOP counter runs the CompositeImplicitAutograd decomposition of an op it has no
        # formula for (``FlopCounterMode.__torch_dispatch__``: ``func.decompose``; e.g.
        # ``silu_backward`` into sigmoid, sub, mul, add, mul, mul), whose temporaries a CUDA step,
        # running the op's own kernel, never allocates.
        with counter, tracker:
            for t in [*net.parameters(), *net.buffers(), *opt_state, tokens, labels]:
                tracker.track(t)
            tracker.set_phase("forward")
            with tp_ctx:
                with tracker.recording_saved_tensors():
                    loss = net(tokens, labels)
                eof_bytes = tracker.total_bytes
                eof_snapshot = dict(tracker.live)
                tracker.set_phase("backward")
                loss.backward()
            del loss
            tracker.set_phase("optimizer")
            opt.step()
        for h in hooks:
            h.remove()
        snapshot = tracker.snapshot_at_peak()
        packed, consts = quant_buffers(net)
        params = [*net.parameters(), *packed]
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        groups_ = [
            ("parameters", params),
            ("quant_constants", consts),
            ("gradients", grads),
            ("optimizer", opt_state),
            ("gather_buffers", fsdp_gather_tensors(net)),
        ]
        breakdown = classify(tracker, snapshot, groups_)
        eof_breakdown = classify(tracker, eof_snapshot, groups_)
        phase_breakdowns = {
            ph: classify(tracker, tracker.snapshot_at_peak(ph), groups_)
            for ph in ("forward", "backward", "optimizer")
        }
        state_bytes = {
            "parameters": _unique_bytes(params),
            "quant_constants": _unique_bytes(consts),
            "gradients": _unique_bytes(grads),
            "optimizer": _unique_bytes(opt_state),
        }
        if fsdp:
            uneven = fsdp_uneven_shard_bytes(net, opt)
            state_bytes["fsdp_uneven_shards"] = uneven
            if uneven:
                notes.append(
                    f"FSDP2 uneven dim-0 shards: rank 0 holds {uneven} bytes of model states beyond "
                    "numel/N (not modelled)"
                )
        total_params = num_params(_plain(net))
    return StepTrace(
        peak_bytes=tracker.peak_bytes,
        peak_phase=tracker.peak_phase,
        breakdown_bytes={k: breakdown[k] for k in CATEGORIES},
        phase_peaks_bytes=dict(tracker.phase_peaks_bytes),
        end_of_forward_bytes=eof_bytes,
        end_of_forward_breakdown_bytes={k: eof_breakdown[k] for k in CATEGORIES},
        layer_saved_bytes=layer_saved,
        phase_breakdowns_bytes=phase_breakdowns,
        state_bytes=state_bytes,
        flops_by_op=flops_by_op(counter),
        params=total_params,
        trace_s=time.perf_counter() - t0,
        notes=notes,
    )


def _plain(net: nn.Module) -> nn.Module:
    return net


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (local shards for DTensors)."""
    from trainplan.trace.tracer import _storages

    seen: dict[int, int] = {}
    for t in tensors:
        for st in _storages(t):
            seen[id(st)] = int(st.nbytes())
    return sum(seen.values())


def _region_hooks(net: ReferenceLM, tracker: LiveStorageTracker, layer_saved: list[int]) -> list[Any]:
    """Mark saved tensors of the output layer as ``logits`` and record bytes saved per block."""
    hooks = []

    def enter_output(*_: Any) -> None:
        tracker.region = "output"

    first_output = net.norm or net.project_out or net.head  # the first module after the blocks
    hooks.append(first_output.register_forward_pre_hook(enter_output))
    start: dict[str, int] = {}

    param_keys: set[int] = set()

    def saved_total() -> int:
        if not param_keys:
            for t in [*net.parameters(), *net.buffers()]:
                param_keys.update(k for k in tracker.track(t))
        return sum(tracker.live.get(k, 0) for k in tracker.saved_keys if k not in param_keys)

    for block in net.layers:

        def pre(_m: Any, _a: Any) -> None:
            if tracker.phase == "forward":
                start["n"] = saved_total()

        def post(_m: Any, _a: Any, _o: Any) -> None:
            if tracker.phase == "forward":
                layer_saved.append(saved_total() - start["n"])

        hooks.append(block.register_forward_pre_hook(pre))
        hooks.append(block.register_forward_hook(post))
    return hooks


__all__ = [
    "MasterWeightAdamW",
    "StepTrace",
    "UnsupportedConfig",
    "apply_checkpointing",
    "apply_fsdp",
    "apply_sac",
    "apply_tp",
    "init_fake_process_group",
    "trace_step",
]
