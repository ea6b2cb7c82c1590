"""Live-storage memory tracer and FLOP counter for one training step under fake tensors.

Memory is the sum of the bytes of every tensor *storage* that is alive, sampled after every
aten operator: a storage is born when an operator returns a tensor on a storage not seen before
and dies when its last Python or autograd reference goes (a weak-reference callback), or when it
is resized (FSDP2 frees its all-gather buffers with ``untyped_storage().resize_(0)``). Views share
their base's storage and therefore cost nothing, exactly as in the CUDA caching allocator's
``memory_allocated`` (which counts storages, not tensors) minus the allocator's 512-byte rounding.

Each storage carries a category, decided once the step is over:

``parameters``       storages of module parameters (sharded DTensor locals under FSDP2/TP)
``quant_constants``  QLoRA NF4 absmax / double-quantization constants (module buffers)
``gradients``        storages that end up as ``param.grad``
``optimizer``        optimizer state tensors (moments, FP32 master weights; the ``step`` counters are host tensors)
``gather_buffers``   FSDP2 all-gather outputs / unsharded parameters (transient per block)
``activations``      storages saved for backward by autograd (``saved_tensors_hooks``) in the blocks,
                     and the op outputs a selective-checkpoint policy keeps (``mark_saved``)
``logits``           storages saved by the output layer: final norm, head, fp32 logits, loss
``temporaries``      everything else alive at the peak (an operator's output not yet consumed,
                     foreach buffers in the optimizer step, gradients of activations)

The peak is the largest total; its breakdown is the snapshot taken at that moment, classified
with the categories known at the end of the step.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CATEGORIES = (
    "parameters",
    "quant_constants",
    "gradients",
    "optimizer",
    "gather_buffers",
    "activations",
    "logits",
    "temporaries",
)


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """Storages behind a tensor; DTensors are unwrapped to their local shard."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return _storages(t._local_tensor)
    try:
        return [t.untyped_storage()]
    except (NotImplementedError, RuntimeError):  # sparse / opaque tensors
        return []


@dataclass
class MemoryTrace:
    """Result of one traced step: peak live bytes per device and its breakdown by category."""

    peak_bytes: int
    peak_breakdown_bytes: dict[str, int]
    peak_phase: str  # "forward", "backward" or "optimizer"
    phase_peaks_bytes: dict[str, int] = field(default_factory=dict)
    end_of_forward_bytes: int = 0
    end_of_forward_breakdown_bytes: dict[str, int] = field(default_factory=dict)
    flops_total: int = 0
    flops_by_op: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_breakdown_bytes": dict(self.peak_breakdown_bytes),
            "peak_phase": self.peak_phase,
            "phase_peaks_bytes": dict(self.phase_peaks_bytes),
            "end_of_forward_bytes": self.end_of_forward_bytes,
            "end_of_forward_breakdown_bytes": dict(self.end_of_forward_breakdown_bytes),
            "flops_total": self.flops_total,
            "flops_by_op": dict(self.flops_by_op),
        }


class LiveStorageTracker(TorchDispatchMode):
    """Tracks the bytes of live storages after every aten operator (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count()
        self._key_of: weakref.WeakKeyDictionary[Any, int] | None = None
        self._by_storage: dict[int, int] = {}  # id(storage) -> key (cleared on death)
        self.live: dict[int, int] = {}  # key -> bytes
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.total_bytes = 0
        self.peak_bytes = 0
        self.phase = "setup"
        self.peak_phase = "setup"
        self.phase_peaks_bytes: dict[str, int] = {}
        self.phase_snapshots: dict[str, dict[int, int]] = {}
        self._dirty: str | None = None
        self.saved_keys: set[int] = set()
        self.saved_region: dict[int, str] = {}
        self.region = "layers"
        self._orig_resize: Callable[..., Any] | None = None
        self._ignored: set[int] = set()  # id() of host storages (kept alive by their owner)
        self._ignored_refs: list[torch.UntypedStorage] = []

    # -- storage bookkeeping ----------------------------------------------------------------
    def key(self, st: torch.UntypedStorage) -> int | None:
        return self._by_storage.get(id(st))

    def ignore(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never count these tensors' storages: they live in host memory on a GPU run."""
        for t in tensors:
            for st in _storages(t):
                self._ignored.add(id(st))
                self._ignored_refs.append(st)  # keeps the id from being reused

    def track(self, t: torch.Tensor) -> list[int]:
        keys = []
        for st in _storages(t):
            sid = id(st)
            if sid in self._ignored:
                continue
            k = self._by_storage.get(sid)
            if k is None:
                k = next(self._ids)
                self._by_storage[sid] = k
                nbytes = int(st.nbytes())
                self.live[k] = nbytes
                self._refs[k] = weakref.ref(st, self._make_cb(k, sid))
                self._add(nbytes)
            keys.append(k)
        return keys

    def _make_cb(self, k: int, sid: int) -> Callable[[Any], None]:
        def cb(_ref: Any) -> None:
            self._free(k, sid)

        return cb

    def _free(self, k: int, sid: int) -> None:
        if self.live.get(k):
            self._before_decrease()
        nbytes = self.live.pop(k, None)
        self._refs.pop(k, None)
        if self._by_storage.get(sid) == k:
            del self._by_storage[sid]
        if nbytes:
            self.total_bytes -= nbytes

    def _before_decrease(self) -> None:
        if self._dirty is not None:
            self.phase_snapshots[self._dirty] = dict(self.live)
            self._dirty = None

    def set_phase(self, phase: str) -> None:
        """Start a new phase (``forward``, ``backward``, ``optimizer``); each has its own peak."""
        self._before_decrease()
        self.phase = phase

    def _add(self, nbytes: int) -> None:
        self.total_bytes += nbytes
        if self.total_bytes > self.phase_peaks_bytes.get(self.phase, -1):
            self.phase_peaks_bytes[self.phase] = self.total_bytes
            self._dirty = self.phase
        if self.total_bytes > self.peak_bytes:
            self.peak_bytes = self.total_bytes
            self.peak_phase = self.phase

    def _resize(self, st: torch.UntypedStorage, new_bytes: int) -> None:
        k = self._by_storage.get(id(st))
        if k is None:
            return
        old = self.live[k]
        if new_bytes < old:
            self._before_decrease()
            self.total_bytes -= old - new_bytes
            self.live[k] = new_bytes
        elif new_bytes > old:
            self.live[k] = new_bytes
            self._add(new_bytes - old)

    def snapshot_at_peak(self, phase: str | None = None) -> dict[int, int]:
        """Live storages at the peak of ``phase`` (of the whole step when None)."""
        self._before_decrease()
        return self.phase_snapshots.get(self.peak_phase if phase is None else phase, {})

    # -- dispatch -------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.resize_.default or func is torch.ops.aten.set_.source_Storage:
            for t in tree_flatten(args)[0]:
                if isinstance(t, torch.Tensor):
                    for st in _storages(t):
                        self._resize(st, int(st.nbytes()))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out

    def __enter__(self) -> LiveStorageTracker:
        tracker = self
        orig = torch.UntypedStorage.resize_
        self._orig_resize = orig

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            r = orig(st, size)
            tracker._resize(st, int(size))
            return r

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]

    def mark_saved(self, t: torch.Tensor) -> None:
        """Count a tensor's storages as saved for backward (in the current region)."""
        for k in self.track(t):
            if k not in self.saved_keys:
                self.saved_keys.add(k)
                self.saved_region[k] = self.region

    @contextlib.contextmanager
    def recording_saved_tensors(self) -> Iterator[None]:
        """Mark every storage autograd saves for backward as an activation."""

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.mark_saved(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield


def classify(
    tracker: LiveStorageTracker,
    snapshot: dict[int, int],
    groups: list[tuple[str, Iterable[torch.Tensor]]],
) -> dict[str, int]:
    """Bytes per category of the storages in ``snapshot``.

    ``groups`` are tried in order (first match wins); then storages saved for backward count as
    ``logits`` when saved by the output layer (final norm, head, loss) and ``activations``
    otherwise; the rest are ``temporaries``.
    """
    keyed: list[tuple[str, set[int]]] = []
    for name, tensors in groups:
        keys: set[int] = set()
        for t in tensors:
            for st in _storages(t):
                k = tracker.key(st)
                if k is not None:
                    keys.add(k)
        keyed.append((name, keys))
    out = dict.fromkeys(CATEGORIES, 0)
    for k, nbytes in snapshot.items():
        for name, keys in keyed:
            if k in keys:
                out[name] += nbytes
                break
        else:
            if k in tracker.saved_keys:
                out["logits" if tracker.saved_region.get(k) == "output" else "activations"] += nbytes
            else:
                out["temporaries"] += nbytes
    return out


# -- FLOPs ---------------------------------------------------------------------------------
_REGISTERED = False


def register_causal_attention_flops() -> None:
    """Register FLOP formulas for the CPU flash-attention kernels under our causal convention.

    Convention (docs/verify.md, and ``trainplan.flops``): a causal attention over a sequence of
    length s counts half of the s×s matmuls. Forward: QKᵀ and PV, ``2 · 2·b·a·s²·d / 2``.
    Backward: the five matmuls of torch's ``sdpa_backward_flop_count`` (the score recompute QKᵀ
    that flash attention does, dV, dP, dQ, dK), halved: ``5 · 2·b·a·s²·d / 2``. These are
    hardware FLOPs; model FLOPs leave out the score recompute (backward = 2 × forward).
    Non-causal attention counts in full. Sources: FlashAttention-2 (Dao 2023, Sec. 3.1 and 4.1:
    causal masking skips about half of the blocks) and ``torch.utils.flop_counter``.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from torch.utils.flop_counter import register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu, get_raw=True)
    def _cpu_flash_fwd(query, key, value, dropout_p=0.0, is_causal=False, *args, out_val=None, **kwargs):  # type: ignore[no-untyped-def]
        n = sdpa_flop_count(query.shape, key.shape, value.shape)
        return n // 2 if is_causal else n

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward, get_raw=True)
    def _cpu_flash_bwd(
        grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *args, out_val=None, **kwargs
    ):  # type: ignore[no-untyped-def]
        n = sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
        return n // 2 if is_causal else n

    _REGISTERED = True


class _GlobalScope:
    """Stands in for ``FlopCounterMode.mod_tracker``: every FLOP is counted under "Global" only.

    ``torch.utils.module_tracker.ModuleTracker`` (what ``FlopCounterMode`` uses for its
    per-module table) registers ``register_multi_grad_hook`` callbacks on module inputs and
    outputs that keep the autograd graph reachable after ``backward()``; under activation
    checkpointing that graph holds the checkpoint frames, their saved block inputs and every
    recomputed tensor that backward did not unpack, so they would stay alive through the
    optimizer step — memory a training step without the counter frees after backward.
    """

    parents: frozenset[str] = frozenset({"Global"})

    def __enter__(self) -> _GlobalScope:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def flop_counter() -> Any:
    """``FlopCounterMode`` counting whole-step FLOPs, without per-module tracking (see _GlobalScope)."""
    from torch.utils.flop_counter import FlopCounterMode

    register_causal_attention_flops()
    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _GlobalScope()
    return counter


def flops_by_op(counter: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        out[str(op).split(".")[-1] if "." in str(op) else str(op)] = int(n)
    return out
