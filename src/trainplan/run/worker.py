"""One rank of ``trainplan run``: build the reference model, apply the layout, train, measure.

Started by ``torch.distributed.run`` (``torchrun``), which sets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. The order of the parallelisms is
torchtitan's (``torchtitan/models/llama3/infra/parallelize.py``): tensor parallel → activation
checkpointing → data parallel. How each layout field maps to a PyTorch API:

* ``tp > 1`` — DTensor ``torch.distributed.tensor.parallel.parallelize_module`` with the
  Megatron plan of :func:`trainplan.trace.step.apply_tp` (column-parallel q/k/v/gate/up,
  row-parallel o/down, vocabulary-parallel head and ``loss_parallel``); ``sequence_parallel``
  adds ``SequenceParallel`` norms.
* ``recompute full`` — ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper`` (non-reentrant)
  around every block, with early stop as ``recompute_early_stop`` says
  (:func:`trainplan.trace.step.apply_checkpointing`).
* ``recompute sac`` — the same wrapper with torchtitan's per-op selective checkpointing policy
  (:func:`trainplan.trace.step.apply_sac`: every other bias-free matmul and the SDPA output kept).
* ``zero 0`` (dp > 1) — ``torch.nn.parallel.DistributedDataParallel``; with tp > 1 (DTensor
  parameters, which DDP does not take) the local gradient shards are averaged over the dp group
  with ``all_reduce`` after the backward.
* ``zero 1`` — DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer`` (AdamW states sharded,
  gradients all-reduced whole): ZeRO stage 1 exactly.
* ``zero 2`` — FSDP2 ``torch.distributed.fsdp.fully_shard(reshard_after_forward=False)`` per
  block and on the root: parameters stay gathered from forward to backward (FSDP's
  ``SHARD_GRAD_OP``), gradients and optimizer states sharded — the memory of ZeRO-2.
* ``zero 3`` — FSDP2 ``fully_shard`` per block then the root, the last block not resharded after
  forward (torchtitan).

Precision: fp32 trains fp32 everywhere. bf16 under FSDP2 uses
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` (sharded FP32 parameters are
the master copy); without FSDP2 the FP32 parameters are kept and the forward runs under
``torch.autocast(dtype=bfloat16)`` — the same 16 bytes of model state per parameter as the
recipe's 2 + 2 + 12, arranged as 4 (weights) + 4 (gradients) + 8 (moments).

Weights are created on the meta device, parallelised, materialised with ``Module.to_empty`` and
initialised from the run's seed (normal, std 0.02; norms 1; biases 0), so a model larger than
one device can be run sharded. The optimizer is ``torch.optim.AdamW`` (foreach).

Data: sequences ``x_t = (x_0 + t·stride) mod V`` with a random start and a stride from
``{1, 2, 3}`` per sequence, seeded per (dp rank, micro-batch) and repeated every step (torchtitan's
"overfit one batch" check): every tensor-parallel rank of a replica sees the same batch, and the
loss falls from ``ln V`` within a few steps, which shows the steps really trained. Shapes, and so
time and memory, are those of real data.

Measured per step: the loss (mean over micro-batches and dp replicas), the wall time of the step
(zero_grad, forward and backward of every micro-batch, optimizer step; ``cuda.synchronize``
before each clock read on CUDA). Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA (the
same quantity as the estimate's ``memory.peak_bytes``); on CPU the process's resident-set
high-water mark from ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (it includes the Python
interpreter, torch's libraries and allocator caches: not comparable to device memory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainplan.run.config import RunConfig
from trainplan.trace.models import Norm, ReferenceLM, build_model, retie
from trainplan.trace.step import apply_checkpointing, apply_sac, apply_tp, split_dtensor_groups

INIT_STD = 0.02
STRIDES = (1, 2, 3)


# -- model ------------------------------------------------------------------------------------
@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """Normal(0, 0.02) linears and embeddings, zero biases, unit norm weights (GPT-2 / Llama init).

    Works on plain tensors and on DTensor shards (``torch.distributed.tensor`` runs the in-place
    random ops on each local shard).
    """
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=INIT_STD)
            bias = getattr(m, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)
        elif isinstance(m, Norm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def apply_fsdp(model: ReferenceLM, mesh: Any, *, precision: str, zero: int) -> None:
    """FSDP2 ``fully_shard`` per block, then the root (``torch/distributed/fsdp/_fully_shard``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    n = len(model.layers)
    for i, block in enumerate(model.layers):
        reshard = zero == 3 and i < n - 1
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


# -- data -------------------------------------------------------------------------------------
def synthetic_batch(
    cfg: RunConfig, *, dp_rank: int, step: int, micro: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Arithmetic token sequences (see the module docstring): ``(tokens, labels)``, each ``[b, s]``."""
    del step  # the same batches every step: a repeating pattern the loss can fall on
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + dp_rank * 10_007 + micro)
    b, s, v = cfg.micro_batch, cfg.seq_len, cfg.model.vocab_size
    start = torch.randint(0, v, (b, 1), generator=g)
    stride = torch.tensor(STRIDES)[torch.randint(0, len(STRIDES), (b, 1), generator=g)]
    seq = (start + stride * torch.arange(s + 1).unsqueeze(0)) % v
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


# -- measurement ------------------------------------------------------------------------------
def peak_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    # Linux reports ru_maxrss in KiB (getrusage(2)); macOS in bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale, "cpu_rss_high_water_mark"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor()
    return t


# -- the run ----------------------------------------------------------------------------------
def train(cfg: RunConfig) -> dict[str, Any]:
    """Train ``cfg.steps`` steps on this rank; return the measurements (identical on every rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    layout = cfg.layout
    if world != layout.dp * layout.tp:
        raise RuntimeError(f"WORLD_SIZE={world} but the layout needs dp·tp = {layout.dp}·{layout.tp}")
    if cfg.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    mesh = init_device_mesh(device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh["dp"].get_local_rank()

    fsdp = layout.zero >= 2 and layout.dp > 1
    model = build_model(cfg.model, dtype=torch.float32, device="meta")
    if layout.tp > 1:
        apply_tp(model, mesh["tp"], sequence_parallel=layout.sequence_parallel)
    if cfg.recompute == "full":
        apply_checkpointing(model, early_stop=cfg.recompute_early_stop)
    elif cfg.recompute == "sac":
        apply_sac(model, early_stop=cfg.recompute_early_stop)
    if fsdp:
        apply_fsdp(model, mesh["dp"], precision=cfg.precision, zero=layout.zero)
    model.to_empty(device=device)
    if layout.tp == 1 and not fsdp:
        retie(model)
    init_weights(model, cfg.seed)

    net: nn.Module = model
    manual_grad_sync = False
    if layout.dp > 1 and layout.zero in (0, 1):
        if layout.tp == 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(
                model,
                device_ids=[local_rank] if device.type == "cuda" else None,
                process_group=mesh["dp"].get_group(),
            )
        else:
            manual_grad_sync = True

    params = [p for p in model.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer
    if layout.zero == 1 and layout.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(
            params,
            optimizer_class=torch.optim.AdamW,
            process_group=mesh["dp"].get_group(),
            lr=cfg.lr,
            betas=(0.9, 0.95),
            weight_decay=0.0,
        )
    else:
        opt = torch.optim.AdamW(
            split_dtensor_groups(params), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=True
        )

    autocast: Callable[[], Any] = contextlib.nullcontext
    if cfg.precision == "bf16" and not fsdp:

        def autocast() -> Any:
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    loss_ctx: Callable[[], Any] = contextlib.nullcontext
    if layout.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        loss_ctx = loss_parallel

    def grad_sync(last: bool) -> Any:
        if last:
            return contextlib.nullcontext()
        if isinstance(net, nn.parallel.DistributedDataParallel):
            return net.no_sync()
        return _fsdp_no_sync(model) if fsdp else contextlib.nullcontext()

    dp_group = mesh["dp"].get_group()
    losses: list[float] = []
    times: list[float] = []
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(cfg.steps):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device, dtype=torch.float32)
        for micro in range(cfg.grad_accum):
            tokens, labels = synthetic_batch(cfg, dp_rank=dp_rank, step=step, micro=micro, device=device)
            with grad_sync(micro == cfg.grad_accum - 1), loss_ctx():
                with autocast():
                    loss = net(tokens, labels) / cfg.grad_accum
                loss.backward()
            total += _local(loss.detach()).float()
        if manual_grad_sync:
            _all_reduce_grads(params, dp_group, layout.dp)
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if layout.dp > 1:
            dist.all_reduce(total, group=dp_group)
            total /= layout.dp
        losses.append(float(total.item()))

    peak, kind = peak_bytes(device)
    peaks: list[Any] = [None] * world
    dist.all_gather_object(peaks, peak)
    # The caching allocator's high-water mark of reserved segments: allocated + fragmentation.
    reserved = int(torch.cuda.max_memory_reserved(device)) if device.type == "cuda" else None
    reserveds: list[Any] = [None] * world
    dist.all_gather_object(reserveds, reserved)
    step_times: list[Any] = [None] * world
    dist.all_gather_object(step_times, times)
    # A step ends when its slowest rank ends: per step, the maximum over ranks.
    per_step = [max(float(t[i]) for t in step_times) for i in range(cfg.steps)]
    timed = per_step[cfg.warmup :] or per_step
    step_s = statistics.median(timed)
    result = {
        "rank": rank,
        "world_size": world,
        "losses": losses,
        "step_times_s": per_step,
        "step_s": step_s,
        "tokens_per_step": cfg.tokens_per_step,
        "tokens_per_s": cfg.tokens_per_step / step_s,
        "peak_bytes": max(int(p) for p in peaks),
        "peak_bytes_per_rank": [int(p) for p in peaks],
        "peak_kind": kind,
        "peak_reserved_bytes": None if reserved is None else max(int(r) for r in reserveds),
        "backend": dist.get_backend(),
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "params": sum(_numel(p) for p in model.parameters()),
    }
    dist.barrier()
    dist.destroy_process_group()
    return result


def _numel(p: torch.Tensor) -> int:
    """Global element count (a DTensor's ``numel`` is already the global one)."""
    return int(p.numel())


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    """Accumulate gradients without reduce-scatter (FSDP2 ``set_requires_gradient_sync``)."""
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _all_reduce_grads(params: list[nn.Parameter], group: Any, dp: int) -> None:
    """Average gradients over the dp group, shard by shard (data parallel for DTensor parameters)."""
    from torch.distributed.tensor import DTensor

    for p in params:
        if p.grad is None:
            continue
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(g, group=group)
        g /= dp


def main(argv: Sequence[str] | None = None) -> int:
    # DTensor warns that its random ops are incomplete on CPU meshes; the init needs none of it.
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
    parser = argparse.ArgumentParser(prog="python -m trainplan.run.worker")
    parser.add_argument("--config", required=True, help="RunConfig JSON written by the launcher")
    parser.add_argument("--result", required=True, help="where rank 0 writes the measurements (JSON)")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as fh:
        cfg = RunConfig.from_json(fh.read())
    result = train(cfg)
    if result["rank"] == 0:
        tmp = args.result + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        os.replace(tmp, args.result)
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: at interpreter shutdown a c10d/gloo background
    # thread can still be joinable, and destroying it aborts the process ("terminate called
    # without an active exception", SIGABRT) after the run has finished and its result is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
