"""Bulk evaluation of many candidate (accelerator, devices, layout, recipe) at once.

The scalar :func:`trainplan.predict.estimate` costs a fraction of a millisecond; a planner that
searches every accelerator, device count and layout needs millions of evaluations per second.
This module evaluates whole arrays of candidates with numpy and gives the same numbers as the
scalar path (tests hold every reported field to 1e-9 relative).

How the work is split
---------------------
A candidate is ``(accelerator, devices, core, zero)`` where the *core* is every layout and recipe
choice that does not depend on the device count: ``tp, pp, cp, ep, sequence_parallel,
micro_batch, recompute, offload, precision, pipeline schedule, virtual stages``; ``dp =
devices / (tp·pp·cp)``. Quantities that depend only on the core are computed by calling the
scalar functions themselves (no second copy of their formulas), once per distinct value of the
inputs each function reads — many cores differ only in fields a function ignores:

* model states per pipeline stage: ``memory._model_states`` (ZeRO, Rajbhandari et al. 2020,
  Sec. 5), per (tp, pp, cp, ep, precision, offload). Every term it returns is an affine function
  of ``1/dp``: ZeRO divides by the shard group ``dp·cp`` (routed experts by ``dp·cp/ep``, which
  ``ep`` divides), nothing else depends on ``dp``. It is therefore evaluated at two
  data-parallel degrees and interpolated exactly;
* saved activations of one in-flight micro-batch, logits and the largest transient:
  ``memory.stage_activations`` with one micro-batch, per (tp, pp, cp, sequence parallelism,
  micro-batch, recompute, precision, stage) — not ep, ZeRO, offload or the schedule; activations
  scale with the in-flight count (``memory.inflight_microbatches``, Korthikanti et al. 2022
  Eq. 5) by the call's own ``per_microbatch_bytes``;
* per-micro-batch forward / backward / recompute work of every stage: ``flops.device_flops``
  per compute key without ep (balanced routing: ep does not change the work), its GEMM
  efficiency ``timing._stage_gemm_efficiency`` per (stage kinds, tokens, tp, ep, precision) and
  accelerators with equal efficiency figures, and the time of all stages of all compute keys on
  all accelerators from one call of ``timing._pass_time_s`` on (stage × accelerator) arrays.

The candidates of one device count depend on the accelerator only through its scale-up domain
and its precisions, so ``enumerate_candidates`` builds each such *block* of (dp, zero, core) rows
once and lays the candidates out as *segments* (one accelerator and device count each) that
point at their block (``Segments``). Memory does not depend on the accelerator: it is computed
once per distinct (core, ZeRO stage, dp) of the block rows, and fit and offload dominance per
block row and accelerator capacity. The per-call times of the collectives depend on the
accelerator, dp and the core's tp, pp, cp, ep, sequence parallelism, micro-batch and precision
only: computed once per such key and gathered.

What depends on ``dp``, ``zero``, the number of micro-batches and the placement of the parallel
groups on the scale-up domains — the composition of the memory peak, the collectives (alpha-beta
on the two-level network, ``comm.py``), their overlap, the pipeline bubble, the optimizer step,
offload transfers, throughput, cost and energy — is computed here on arrays. Those formulas
mirror ``memory.py``, ``comm.py``, ``timing.py`` and ``cost.py`` term by term, in the scalar
order of operations, use the same constants (imported, never copied) and are tested for equality
against the scalar path. Results are kept in that compact form (``BulkResult``); per-candidate
arrays are built when read.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

from trainplan.comm import (
    Traffic,
    TrafficInputs,
    call_time_s,
    collective_time_s,
    group_shapes,
    moe_layer_dispatches,
    network_from_system,
    ranks_per_domain,
    recompute_skipped_tp_reductions,
    step_traffic,
    traffic_time_s,
)
from trainplan.cost import average_power_w, run_totals
from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.efficiency import DeviceEfficiency, get_efficiency
from trainplan.errors import TrainplanError
from trainplan.flops import (
    device_flops,
    moe_gemm_routing,
    optimizer_update_bytes,
    step_flops,
)
from trainplan.goodput import DEFAULT_RELIABILITY, Reliability, checkpoint_bytes
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.system import System
from trainplan.layout import (
    DEFAULT_LAYOUT_OPTIONS,
    PIPELINE_SCHEDULES,
    Layout,
    LayoutOptions,
    PipelineSchedule,
    nearest_micro_batches,
)
from trainplan.memory import (
    CUDA_CONTEXT_BYTES,
    MemoryBreakdown,
    StageActivations,
    _model_states,
    _States,
    block_input_bytes,
    capped_inflight,
    check_memory_margin,
    ep_overlap_extra_microbatches,
    grads_live_at_backward_start,
    held_microbatches,
    host_fits,
    input_grad_bytes,
    persistent_grad_buffer,
    stage_activations,
    stage_memory_fields,
    usable_bytes,
)
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.num import Bool, Num
from trainplan.predict import trainable_params
from trainplan.recipe import (
    RECOMPUTES,
    Offload,
    Precision,
    Recipe,
    Recompute,
    fp32_main_grad,
    repeats_attention,
    reruns_forward_hooks,
)
from trainplan.sharding import device_params
from trainplan.timing import (
    HOST_MEMORY_BYTES_PER_S,
    OFFLOAD_CODES,
    StepInputs,
    _pass_time_s,
    _stage_gemm_efficiency,
    attention_etas,
    bubble_divisor,
    calibrated_kappa,
    ep_overlap_unpaired_fraction,
    flops_utilisation,
    grad_accumulation_bytes_n,
    recipe_peaks,
    stage_kind_counts,
    step_lower_bound_s,
    step_terms,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

ZERO_STAGES: Final = (0, 1, 2, 3)
PROBES_PER_GROUP: Final = 4
"""Candidates per (accelerator, devices) whose exact step time sets the pruning threshold."""
SLOWER_MARGIN: Final = 1e-9
"""Relative slack of the step-time pruning rule (the bound is exact; the slack only keeps more)."""
CHUNK: Final = 1 << 18
"""Candidates (memory keys) per pass of the array formulas: the few hundred temporaries of the
step time and of the memory peak then stay in the processor cache. Element-wise formulas give
the same result in any chunking."""
_RECOMPUTES: Final = RECOMPUTES  # codes 0.. in the core table (none, selective, full, sac)
_OFFLOADS: Final = OFFLOAD_CODES  # codes 0, 1, 2 in the time model
_SCHEDULES: Final = PIPELINE_SCHEDULES  # codes 0, 1, 2 in the core table


@dataclass(frozen=True, kw_only=True, order=True)
class Core:
    """Layout and recipe choices that do not depend on the device count or the ZeRO stage."""

    tp: int
    pp: int
    cp: int
    ep: int
    sequence_parallel: bool
    micro_batch: int
    recompute: Recompute
    offload: Offload
    precision: Precision
    pp_schedule: PipelineSchedule
    virtual_stages: int
    etp: int = 0
    """Expert tensor parallelism: 0 is the default, tp (``Layout.etp`` None); 1 is parallel
    folding (``Layout.etp`` = 1)."""

    @classmethod
    def of_valid(cls, fields: Mapping[str, object]) -> Core:
        """A core from field values already checked (``enumerate_cores`` builds thousands): the
        same object as ``Core(**fields)``, without the per-field setattr of a frozen dataclass."""
        core = object.__new__(cls)
        core.__dict__.update(fields)
        return core

    def recipe(self, base: Recipe) -> Recipe:
        return _core_recipe(base, self.micro_batch, self.recompute, self.offload, self.precision)

    def layout(self, dp: int, zero: int, options: LayoutOptions = DEFAULT_LAYOUT_OPTIONS) -> Layout:
        return Layout(
            dp=dp,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            zero=zero,
            sequence_parallel=self.sequence_parallel,
            pp_schedule=self.pp_schedule,
            virtual_stages=self.virtual_stages,
            etp=self.etp or None,
            **cast(
                Any,
                options.for_candidate(
                    sequence_parallel=self.sequence_parallel,
                    pp=self.pp,
                    zero=zero,
                    pp_schedule=self.pp_schedule,
                    ep=self.ep,
                    recompute=self.recompute,
                ),
            ),
        )


@functools.lru_cache(maxsize=4096)
def _core_recipe(base: Recipe, micro_batch: int, recompute: str, offload: str, precision: str) -> Recipe:
    return replace(
        base,
        micro_batch=micro_batch,
        recompute=cast(Recompute, recompute),
        offload=cast(Offload, offload),
        precision=cast(Precision, precision),
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class Segments:
    """Candidates as runs ("segments") of one accelerator and device count.

    The (dp, zero, core) rows of a segment are those of its *block*. The candidates of one device
    count depend on the accelerator only through its scale-up domain and its precisions, so one
    block serves every accelerator that shares them: memory (which does not depend on the
    accelerator) and offload dominance are worked out once per block row and compared with each
    accelerator's capacity. Blocks are stored one after the other in ``dp``, ``zero``, ``core``.
    """

    acc: IntArray  # per segment
    devices: IntArray  # per segment
    start: IntArray  # per segment: its first candidate (segments are in candidate order)
    block: IntArray  # per segment: its block
    block_start: IntArray  # per block, and one past the end: its first row
    dp: IntArray  # per row
    zero: IntArray  # per row
    core: IntArray  # per row

    @property
    def length(self) -> IntArray:
        """Candidates in each segment (the size of its block)."""
        return np.asarray(self.block_start[self.block + 1] - self.block_start[self.block])

    def rows_of(self, idx: IntArray) -> tuple[IntArray, IntArray]:
        """(segment, row) of each candidate index in ``idx``."""
        s = np.searchsorted(self.start, idx, side="right") - 1
        return s, np.asarray(self.block_start[self.block[s]] + (idx - self.start[s]))


class Candidates:
    """Parallel arrays, one entry per candidate. ``core`` indexes ``cores``; ``acc`` indexes
    ``accelerators``.

    Given either as flat arrays or as ``Segments`` (``enumerate_candidates``); the other form is
    built on first use. Flat arrays make one segment (and one block) per run of equal
    (accelerator, device count)."""

    def __init__(
        self,
        *,
        acc: IntArray | None = None,
        devices: IntArray | None = None,
        dp: IntArray | None = None,
        zero: IntArray | None = None,
        core: IntArray | None = None,
        segments: Segments | None = None,
    ) -> None:
        if segments is not None:
            self.__dict__["segments"] = segments
            self._n = int(segments.length.sum())
            return
        if acc is None or devices is None or dp is None or zero is None or core is None:
            raise TypeError("Candidates needs the five arrays or segments")
        self.__dict__.update(acc=acc, devices=devices, dp=dp, zero=zero, core=core)
        self._n = int(acc.shape[0])

    def __len__(self) -> int:
        return self._n

    @functools.cached_property
    def segments(self) -> Segments:
        """Of flat arrays: one segment per run of equal (accelerator, device count), each its
        own block."""
        n = self._n
        group = self.acc * (int(self.devices.max(initial=0)) + 1) + self.devices
        start = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if n else np.zeros(0, dtype=np.int64)
        return Segments(
            acc=self.acc[start],
            devices=self.devices[start],
            start=start,
            block=np.arange(start.size, dtype=np.int64),
            block_start=np.r_[start, n].astype(np.int64),
            dp=self.dp,
            zero=self.zero,
            core=self.core,
        )

    @functools.cached_property
    def _rows(self) -> IntArray:
        """Row (in ``segments``) of every candidate."""
        seg = self.segments
        shift = np.repeat(seg.block_start[seg.block] - seg.start, seg.length)
        return np.asarray(shift + np.arange(self._n, dtype=np.int64))

    @functools.cached_property
    def acc(self) -> IntArray:
        return np.repeat(self.segments.acc, self.segments.length)

    @functools.cached_property
    def devices(self) -> IntArray:
        return np.repeat(self.segments.devices, self.segments.length)

    @functools.cached_property
    def dp(self) -> IntArray:
        return np.asarray(self.segments.dp[self._rows])

    @functools.cached_property
    def zero(self) -> IntArray:
        return np.asarray(self.segments.zero[self._rows])

    @functools.cached_property
    def core(self) -> IntArray:
        return np.asarray(self.segments.core[self._rows])

    def at(self, i: int) -> tuple[int, int, int, int, int]:
        """(acc, devices, dp, zero, core) of candidate ``i``."""
        seg = self.segments
        s, r = seg.rows_of(np.array([i], dtype=np.int64))
        k, row = int(s[0]), int(r[0])
        return int(seg.acc[k]), int(seg.devices[k]), int(seg.dp[row]), int(seg.zero[row]), int(seg.core[row])

    def take(self, idx: IntArray | BoolArray | slice) -> Candidates:
        """The candidates ``idx`` (indices, a mask or a slice), as flat arrays."""
        if "acc" not in self.__dict__:  # built from segments: index them without the flat arrays
            if isinstance(idx, slice):
                sel = np.arange(self._n, dtype=np.int64)[idx]
            elif np.asarray(idx).dtype == np.bool_:
                sel = np.flatnonzero(idx)
            else:
                sel = np.asarray(idx, dtype=np.int64)
            s, r = self.segments.rows_of(sel)
            seg = self.segments
            return Candidates(
                acc=seg.acc[s], devices=seg.devices[s], dp=seg.dp[r], zero=seg.zero[r], core=seg.core[r]
            )
        return Candidates(
            acc=self.acc[idx],
            devices=self.devices[idx],
            dp=self.dp[idx],
            zero=self.zero[idx],
            core=self.core[idx],
        )


# Reasons a candidate is invalid (the scalar path raises for each of them).
VALID: Final = 0
INVALID_STATES: Final = 1  # offload needs ZeRO (1-3; parameters: 3)
INVALID_BATCH: Final = 2  # global batch not a multiple of dp·micro_batch
INVALID_NETWORK: Final = 3  # group spans scale-up domains but the accelerator has no scale-out link
INVALID_OPT_IN_BWD: Final = 4  # optimizer-in-backward with gradient accumulation
INVALID_REASONS: Final[dict[int, str]] = {
    INVALID_STATES: "CPU offload needs ZeRO >= 1 (parameters: ZeRO 3)",
    INVALID_BATCH: "global batch is not a multiple of dp·micro_batch",
    INVALID_NETWORK: "spans scale-up domains but the accelerator has no scale-out network",
    INVALID_OPT_IN_BWD: "optimizer-in-backward cannot accumulate gradients over micro-batches",
}


TIME_FIELDS: Final = (
    "compute_s",
    "forward_s",
    "backward_s",
    "recompute_s",
    "exposed_tp_s",
    "exposed_ep_s",
    "exposed_cp_s",
    "pp_p2p_s",
    "exposed_dp_s",
    "bubble_s",
    "grad_accum_s",
    "optimizer_s",
    "offload_s",
    "step_s",
    "tokens_per_s",
    "mfu",
    "time_s",
    "device_hours",
    "cost_usd",
    "energy_kwh",
)
"""Figures of a candidate with a step time (``BulkEvaluator._time``)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class BulkResult:
    """Results of ``BulkEvaluator.evaluate``.

    Stored as computed: memory per distinct (core, ZeRO stage, dp) key and the key of every block
    row of ``segments``, capacity and network validity per segment, flags per candidate, and the
    figures of the candidates that have a step time (``timed``). The per-candidate arrays below
    (NaN where a candidate is invalid or a figure is unknown) are built on first use: a
    whole-catalog search has millions of candidates, and the planner reads the compact form
    (``counts``, ``leanest``, ``memory_at``, ``times``).
    """

    segments: Segments
    row_key: IntArray  # per block row: its memory key
    key_memory: dict[str, Any]  # per memory key (BulkEvaluator._memory): invalid, m, per_device, ...
    segment_capacity: FloatArray
    segment_network_bad: BoolArray  # spans scale-up domains, and the accelerator has no scale-out
    fits: BoolArray  # valid and fits in memory
    dominated: BoolArray  # fits, but a variant with less offload fits too and is no slower
    slower: BoolArray  # fits, but its step-time lower bound exceeds another's at the same hardware
    timed: IntArray  # candidates with a step time (fit, not dominated, not slower), ascending
    times: dict[str, FloatArray]  # their TIME_FIELDS, in the order of ``timed``

    @property
    def valid(self) -> BoolArray:
        return np.asarray(self.invalid == VALID)

    @property
    def feasible(self) -> BoolArray:
        """Fits and is not dominated: these have step time, throughput and cost."""
        return np.asarray(self.fits & ~self.dominated & ~self.slower)

    # --- compact reads --------------------------------------------------------------------
    def counts(self) -> dict[int, int]:
        """Candidates per validity code (VALID and the INVALID_* reasons)."""
        seg = self.segments
        codes = np.asarray(self.key_memory["invalid"][self.row_key], dtype=np.int64)
        nb = seg.block_start.size - 1
        block_of_row = np.repeat(np.arange(nb), np.diff(seg.block_start))
        width = max(INVALID_REASONS) + 1
        per_block = np.bincount(block_of_row * width + codes, minlength=nb * width).reshape(nb, width)
        per_seg = per_block[seg.block]
        net = self.segment_network_bad
        per_seg[net, INVALID_NETWORK] += per_seg[net, VALID]
        per_seg[net, VALID] = 0
        total = per_seg.sum(axis=0)
        return {code: int(total[code]) for code in range(width)}

    def memory_at(self, name: str, idx: IntArray) -> FloatArray:
        """Memory figure ``name`` (``per_device``, ``weights``, …) of the valid candidates ``idx``."""
        _, r = self.segments.rows_of(np.asarray(idx, dtype=np.int64))
        return np.asarray(self.key_memory[name][self.row_key[r]], dtype=np.float64)

    def leanest(self, acc: int, devices: int) -> int | None:
        """The valid candidate with the least memory per device at (accelerator, device count);
        ties go to the first."""
        seg = self.segments
        best: tuple[float, int] | None = None
        for s in np.flatnonzero((seg.acc == acc) & (seg.devices == devices)).tolist():
            if self.segment_network_bad[s]:
                continue
            b = int(seg.block[s])
            keys = self.row_key[seg.block_start[b] : seg.block_start[b + 1]]
            ok = np.flatnonzero(self.key_memory["invalid"][keys] == VALID)
            if ok.size == 0:
                continue
            pd = self.key_memory["per_device"][keys[ok]]
            j = int(np.argmin(pd))
            here = (float(pd[j]), int(seg.start[s]) + int(ok[j]))
            if best is None or here < best:
                best = here
        return None if best is None else best[1]

    # --- per-candidate arrays (built on first use) ----------------------------------------
    @functools.cached_property
    def _keys(self) -> IntArray:
        seg = self.segments
        shift = np.repeat(seg.block_start[seg.block] - seg.start, seg.length)
        return np.asarray(self.row_key[shift + np.arange(shift.size, dtype=np.int64)])

    def _spread(self, per_segment: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.repeat(per_segment, self.segments.length)

    def _memory_array(self, name: str) -> FloatArray:
        x = np.array(self.key_memory[name][self._keys], dtype=np.float64)
        x[~self.valid] = np.nan
        return x

    def _time_array(self, name: str) -> FloatArray:
        x = np.full(self.fits.size, np.nan)
        x[self.timed] = self.times[name]
        return x

    @functools.cached_property
    def invalid(self) -> IntArray:
        """0 = valid, else an INVALID_* code."""
        x = np.array(self.key_memory["invalid"][self._keys], dtype=np.int64)
        x[self._spread(self.segment_network_bad) & (x == VALID)] = INVALID_NETWORK
        return x

    @functools.cached_property
    def micro_batches(self) -> IntArray:
        return np.asarray(self.key_memory["m"][self._keys])

    @functools.cached_property
    def capacity_bytes(self) -> FloatArray:
        return np.asarray(self._spread(self.segment_capacity), dtype=np.float64)

    @functools.cached_property
    def per_device_bytes(self) -> FloatArray:
        return self._memory_array("per_device")

    @functools.cached_property
    def weights_bytes(self) -> FloatArray:
        return self._memory_array("weights")

    @functools.cached_property
    def gradients_bytes(self) -> FloatArray:
        return self._memory_array("gradients")

    @functools.cached_property
    def optimizer_bytes(self) -> FloatArray:
        return self._memory_array("optimizer")

    @functools.cached_property
    def activations_bytes(self) -> FloatArray:
        return self._memory_array("activations")

    @functools.cached_property
    def compute_s(self) -> FloatArray:
        return self._time_array("compute_s")

    @functools.cached_property
    def forward_s(self) -> FloatArray:
        return self._time_array("forward_s")

    @functools.cached_property
    def backward_s(self) -> FloatArray:
        return self._time_array("backward_s")

    @functools.cached_property
    def recompute_s(self) -> FloatArray:
        return self._time_array("recompute_s")

    @functools.cached_property
    def exposed_tp_s(self) -> FloatArray:
        return self._time_array("exposed_tp_s")

    @functools.cached_property
    def exposed_ep_s(self) -> FloatArray:
        return self._time_array("exposed_ep_s")

    @functools.cached_property
    def exposed_cp_s(self) -> FloatArray:
        return self._time_array("exposed_cp_s")

    @functools.cached_property
    def pp_p2p_s(self) -> FloatArray:
        return self._time_array("pp_p2p_s")

    @functools.cached_property
    def exposed_dp_s(self) -> FloatArray:
        return self._time_array("exposed_dp_s")

    @functools.cached_property
    def bubble_s(self) -> FloatArray:
        return self._time_array("bubble_s")

    @functools.cached_property
    def optimizer_s(self) -> FloatArray:
        return self._time_array("optimizer_s")

    @functools.cached_property
    def offload_s(self) -> FloatArray:
        return self._time_array("offload_s")

    @functools.cached_property
    def grad_accum_s(self) -> FloatArray:
        return self._time_array("grad_accum_s")

    @functools.cached_property
    def step_s(self) -> FloatArray:
        return self._time_array("step_s")

    @functools.cached_property
    def tokens_per_s(self) -> FloatArray:
        return self._time_array("tokens_per_s")

    @functools.cached_property
    def mfu(self) -> FloatArray:
        return self._time_array("mfu")

    @functools.cached_property
    def time_s(self) -> FloatArray:
        return self._time_array("time_s")

    @functools.cached_property
    def device_hours(self) -> FloatArray:
        return self._time_array("device_hours")

    @functools.cached_property
    def cost_usd(self) -> FloatArray:
        return self._time_array("cost_usd")

    @functools.cached_property
    def energy_kwh(self) -> FloatArray:
        return self._time_array("energy_kwh")

    def row(self, i: int) -> dict[str, float]:
        """One candidate's figures, keyed like ``Estimate.to_dict()`` (dotted)."""
        return {
            "memory.per_device_bytes": float(self.per_device_bytes[i]),
            "memory.capacity_bytes": float(self.capacity_bytes[i]),
            "memory.weights_bytes": float(self.weights_bytes[i]),
            "memory.gradients_bytes": float(self.gradients_bytes[i]),
            "memory.optimizer_bytes": float(self.optimizer_bytes[i]),
            "memory.activations_bytes": float(self.activations_bytes[i]),
            "time.step_s": float(self.step_s[i]),
            "time.compute_s": float(self.compute_s[i]),
            "time.forward_s": float(self.forward_s[i]),
            "time.backward_s": float(self.backward_s[i]),
            "time.recompute_s": float(self.recompute_s[i]),
            "time.exposed_tp_s": float(self.exposed_tp_s[i]),
            "time.exposed_ep_s": float(self.exposed_ep_s[i]),
            "time.exposed_cp_s": float(self.exposed_cp_s[i]),
            "time.pp_p2p_s": float(self.pp_p2p_s[i]),
            "time.exposed_dp_s": float(self.exposed_dp_s[i]),
            "time.bubble_s": float(self.bubble_s[i]),
            "time.grad_accum_s": float(self.grad_accum_s[i]),
            "time.optimizer_s": float(self.optimizer_s[i]),
            "time.offload_s": float(self.offload_s[i]),
            "throughput.tokens_per_s": float(self.tokens_per_s[i]),
            "throughput.mfu": float(self.mfu[i]),
            "run.time_s": float(self.time_s[i]),
            "run.device_hours": float(self.device_hours[i]),
            "run.cost_usd": float(self.cost_usd[i]),
            "run.energy_kwh": float(self.energy_kwh[i]),
        }


# --- per-core tables (scalar functions, cached) ----------------------------------------------
_STATE_FIELDS: Final = tuple(
    f.name for f in dataclasses.fields(_States) if f.name != "trainable"
)  # every float field of memory._States


@dataclass(frozen=True, kw_only=True)
class _Accel:
    """Per-accelerator constants of the time model, derived exactly as ``timing.step_time`` does."""

    acc: Accelerator
    eff: DeviceEfficiency
    eff_key: tuple[object, ...]  # its figures (_efficiency_key)
    dtype: str
    peak: float
    peak_hp: float  # timing.Peaks: the LM head under FP8/FP4 recipes
    peak_attn: float  # timing.Peaks: attention at the activation dtype
    bw: float
    kappa: float
    up: tuple[float, float, float]  # bandwidth, latency, efficiency
    out: tuple[float, float, float] | None
    protocols: bool  # comm.Network.protocols: NCCL's per-size protocol choice
    domain: int
    host_bw: float
    price: float | None
    tdp_w: float | None


_EFFICIENCY_LABELS: Final = ("name", "sources", "notes", "assumed")
"""Descriptive fields of ``DeviceEfficiency``: they do not enter any efficiency figure."""


def _efficiency_key(eff: DeviceEfficiency) -> tuple[object, ...]:
    """The figures of ``eff`` (every field but the descriptive ones), comparable across devices."""
    out: list[object] = []
    for f in dataclasses.fields(eff):
        if f.name in _EFFICIENCY_LABELS:
            continue
        value = getattr(eff, f.name)
        out.append(tuple(sorted(value.items())) if isinstance(value, Mapping) else value)
    return tuple(out)


def accel_constants(acc: Accelerator, recipe: Recipe, price: float | None) -> _Accel:
    """The preamble of ``timing.step_time`` for one accelerator and precision."""
    kappa = calibrated_kappa(acc.name, recipe.stack)
    if kappa is None:
        kappa = 1.0
    eff = get_efficiency(acc.name)
    pk = recipe_peaks(acc, recipe, eff)
    bw = acc.memory_bandwidth_bytes_per_s * eff.memory_bandwidth_efficiency
    # Two devices are enough to read the links; the domain size comes from the catalog.
    net = network_from_system(System(accelerator=acc, num_devices=max(2, acc.scale_up.domain_size)))
    up = cast(tuple[float, float, float], net.scale_up.link)
    out = None if net.scale_out is None else cast(tuple[float, float, float], net.scale_out.link)
    host = acc.host_link
    return _Accel(
        acc=acc,
        eff=eff,
        eff_key=_efficiency_key(eff),
        dtype=pk.dtype,
        peak=pk.peak,
        peak_hp=pk.peak_hp,
        peak_attn=pk.peak_attn,
        bw=bw,
        kappa=kappa,
        up=up,
        out=out,
        protocols=net.protocols,
        domain=acc.scale_up.domain_size,
        host_bw=host.bandwidth_bytes_per_s if host is not None else 0.0,
        price=price,
        tdp_w=acc.tdp_w,
    )


class BulkEvaluator:
    """Evaluate candidate arrays for one model and one base recipe (fixed global batch)."""

    def __init__(
        self,
        model: ModelSpec,
        base: Recipe,
        cores: list[Core],
        accelerators: list[Accelerator],
        prices: list[float | None],
        *,
        pue: float,
        options: LayoutOptions = DEFAULT_LAYOUT_OPTIONS,
        host_memory_bytes_per_node: float | None = None,
        reliability: Reliability | None = DEFAULT_RELIABILITY,
        memory_margin: float = 0.0,
    ) -> None:
        check_memory_margin(memory_margin)
        self.memory_margin = memory_margin
        if base.global_batch is None:
            raise TrainplanError("global_batch", "the planner needs a fixed global batch")
        self.model = model
        self.base = base
        # the recipe's MoE routing, fixed for the whole search (flops.moe_gemm_routing)
        self._routing = moe_gemm_routing(model, base)
        self.cores = cores
        self.accelerators = accelerators
        self.prices = prices
        self.pue = pue
        self.options = options
        self.reliability = reliability
        self._layout_cache: dict[tuple[object, ...], Layout] = {}
        # the stage store: 10 figures per distinct stage (see _stage_rows), its layers and kinds
        self._stage_work: list[float] = []
        self._stage_layers: list[tuple[tuple[int, ...], tuple[tuple[bool, int], ...]]] = []
        self._flop_rows: dict[int, tuple[int, int]] = {}
        self._eta_of_row: dict[tuple[int, int, int], int] = {}
        self._eta_cache: dict[int, FloatArray] = {}
        self._eta_index: dict[tuple[object, ...], int] = {}
        self._eta_keys: list[tuple[tuple[Any, ...], tuple[int, ...], Layout]] = []
        self._stage_recipes: dict[tuple[object, ...], Recipe] = {}
        self._layer_caches: dict[tuple[object, ...], dict[object, Any]] = {}
        self._kinds: dict[tuple[int, ...], tuple[tuple[bool, int], ...]] = {}
        self._accel_cache: dict[tuple[int, int], _Accel] = {}
        self._accel_tabs: dict[str, FloatArray] = {}
        self._precs: list[str] = sorted({c.precision for c in cores})
        self._prec_index = {p: i for i, p in enumerate(self._precs)}
        self._c_prec = np.array([self._prec_index[c.precision] for c in cores], dtype=np.int64)
        self._prec_core = [next(i for i, c in enumerate(cores) if c.precision == p) for p in self._precs]
        counts = count_params(model)
        self._expert = float(counts.moe_experts)
        self._dense = float(counts.total - counts.moe_experts)
        self._build_core_tables()
        accs = accelerators
        self._acc_capacity = np.array([ac.capacity_bytes for ac in accs], dtype=np.float64)
        # CPU memory per server for offloaded states (memory.host_fits); unknown: unchecked (inf)
        self._acc_host_capacity = np.array(
            [host_memory_bytes_per_node or ac.host_memory_bytes_per_node or np.inf for ac in accs],
            dtype=np.float64,
        )
        self._acc_per_node = np.array([ac.devices_per_node for ac in accs], dtype=np.int64)
        self._acc_domain = np.array([ac.scale_up.domain_size for ac in accs], dtype=np.int64)
        self._acc_no_out = np.array([ac.scale_out is None for ac in accs], dtype=bool)
        self._acc_fast_hbm = np.array(
            [
                ac.memory_bandwidth_bytes_per_s * get_efficiency(ac.name).memory_bandwidth_efficiency
                >= HOST_MEMORY_BYTES_PER_S
                for ac in accs
            ],
            dtype=bool,
        )
        self._time_tab = np.full((8, len(accelerators), len(self._fkeys)), np.nan)

    def _layout(
        self, dp: int, tp: int, pp: int, cp: int, ep: int, zero: int, *rest: object, etp: int = 0
    ) -> Layout:
        """Layouts are validated on construction; the tables reuse them. ``etp``: as
        :attr:`Core.etp` (folding needs sequence parallelism: give the ``rest``)."""
        key = (dp, tp, pp, cp, ep, zero, etp, *rest)
        got = self._layout_cache.get(key)
        if got is None:
            if rest:
                sp, sched, v = rest
                got = Layout(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    ep=ep,
                    zero=zero,
                    sequence_parallel=cast(bool, sp),
                    pp_schedule=cast(PipelineSchedule, sched),
                    virtual_stages=cast(int, v),
                    etp=etp or None,
                )
            else:
                got = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero)
            self._layout_cache[key] = got
        return got

    def _core_layout(self, core: Core) -> Layout:
        """``core.layout(core.ep, 0)``: the smallest data-parallel degree ``ep`` allows (with
        parallel folding too: tp·cp·ep is a multiple of ep)."""
        return self._layout(
            core.ep,
            core.tp,
            core.pp,
            core.cp,
            core.ep,
            0,
            core.sequence_parallel,
            core.pp_schedule,
            core.virtual_stages,
            etp=core.etp,
        )

    # ----- memory tables ------------------------------------------------------------------
    def _state_tables(self, reps: list[Core]) -> FloatArray:
        """Model states of each core of ``reps`` per ZeRO stage and per first / last pipeline
        stage: ``[rep, zero, stage, (A_f, B_f for each state field)..., trainable,
        params_on_device]`` with field = A + B/dp; NaN where ``memory._model_states`` rejects it.

        Every term is affine in 1/dp (ZeRO divides by dp·cp, routed experts by dp·cp/ep), so two
        data-parallel degrees give A and B. ``device_params`` reads tp, ep and pp only: one call
        per pipeline stage serves every dp and ZeRO stage.
        """
        nf = len(_STATE_FIELDS)
        out = np.full((len(reps), 4, 2, 2 * nf + 2), np.nan)
        fields = operator.attrgetter(*_STATE_FIELDS)
        first: list[tuple[float, ...]] = []
        second: list[tuple[float, ...]] = []
        at: list[tuple[int, int, int]] = []
        extra: list[tuple[float, float, float]] = []
        for i, core in enumerate(reps):
            recipe = core.recipe(self.base)
            dp1 = core.ep
            # parallel folding needs sequence parallelism: those layouts carry the core's schedule
            rest = (core.sequence_parallel, core.pp_schedule, core.virtual_stages) if core.etp else ()
            canonical = self._layout(dp1, core.tp, core.pp, core.cp, core.ep, 0, *rest, etp=core.etp)
            for k, stage in enumerate(sorted({0, core.pp - 1})):
                dev = device_params(self.model, canonical, stage, recipe.lora)
                for z in ZERO_STAGES:
                    try:
                        lay1 = self._layout(dp1, core.tp, core.pp, core.cp, core.ep, z, *rest, etp=core.etp)
                        st1 = _model_states(self.model, recipe, lay1, dev)
                        lay2 = self._layout(
                            2 * dp1, core.tp, core.pp, core.cp, core.ep, z, *rest, etp=core.etp
                        )
                        st2 = _model_states(self.model, recipe, lay2, dev)
                    except TrainplanError:
                        continue
                    first.append(fields(st1))
                    second.append(fields(st2))
                    at.append((i, z, k))
                    extra.append((float(st2.trainable), float(dev.total), float(dp1)))
        if at:
            f1 = np.array(first, dtype=np.float64)
            f2 = np.array(second, dtype=np.float64)
            ex = np.array(extra, dtype=np.float64)
            dp1s = ex[:, 2:3]
            b = (f1 - f2) * 2.0 * dp1s
            a = f1 - b / dp1s
            i, z, k = np.array(at, dtype=np.int64).T
            out[i, z, k, : 2 * nf] = np.stack((a, b), axis=2).reshape(len(at), 2 * nf)
            out[i, z, k, 2 * nf] = ex[:, 0]
            out[i, z, k, 2 * nf + 1] = ex[:, 1]
        single = np.array([core.pp == 1 for core in reps], dtype=bool)  # the last stage is the first
        out[single, :, 1] = out[single, :, 0]
        return out

    def _build_core_tables(self) -> None:
        """Everything that depends only on the core: the scalar tables (model states,
        activations), the compute, collective and recipe keys, and per-core constants."""
        n = len(self.cores)
        nf = len(_STATE_FIELDS)
        model = self.model
        no_ib = replace(self.base, optimizer_in_backward=False)
        cores = self.cores
        # One row of small integers per core: tp, pp, cp, ep, sp, micro-batch, recompute,
        # offload, precision, schedule, virtual stages (the keys below are tuples of its columns).
        rc_code = {r: i for i, r in enumerate(_RECOMPUTES)}
        off_code = {o: i for i, o in enumerate(_OFFLOADS)}
        sched_code = {s: i for i, s in enumerate(_SCHEDULES)}
        prec_code = self._prec_index
        rows = [
            (
                c.tp,
                c.pp,
                c.cp,
                c.ep,
                int(c.sequence_parallel),
                c.micro_batch,
                rc_code[c.recompute],
                off_code[c.offload],
                prec_code[c.precision],
                sched_code[c.pp_schedule],
                c.virtual_stages,
                c.etp,
            )
            for c in cores
        ]
        tab = np.array(rows, dtype=np.int64).reshape(n, 12)
        span = tab.max(axis=0, initial=0) + 1

        def code(columns: tuple[int, ...]) -> IntArray:
            """One integer per core for the values of the given columns (mixed radix)."""
            cols = list(columns)
            return np.asarray(np.ravel_multi_index(tuple(tab[:, cols].T), tuple(span[cols])), dtype=np.int64)

        def keyed(columns: tuple[int, ...]) -> tuple[IntArray, list[int]]:
            """Index of each core's key (the given columns) and the first core of each key."""
            _, first, of_core = np.unique(code(columns), return_index=True, return_inverse=True)
            return np.asarray(of_core, dtype=np.int64).reshape(n), first.tolist()

        # Model states (memory._model_states) read the layout degrees, the precision and the
        # offload of the recipe; not the micro-batch, recompute, sequence parallelism or schedule.
        s_of_core, s_first = keyed((0, 1, 2, 3, 8, 7, 11))
        # states[key, zero, stage(0=first, 1=last), 2*nf + 2]
        s_tab = self._state_tables([cores[c] for c in s_first])
        # Saved activations, logits and transients (memory.stage_activations with one in-flight
        # micro-batch; the saved bytes grow by its per_microbatch_bytes with each more) read tp,
        # cp, sequence parallelism, the stage's layers (pp) and the recipe's micro-batch,
        # recompute and precision; the schedule only through the in-flight count; not ep, dp,
        # ZeRO or offload. Each distinct call is made once: keyed by those inputs.
        a_of_core, a_first = keyed((0, 1, 2, 4, 5, 6, 8, 9, 10, 11))
        a_tab = np.zeros((len(a_first), 2, 10))
        # memory._stage_breakdown: a block's input x (FSDP2 moments) and the gradient of each
        # stage's input at the end of backward (first, last stage); they read the same inputs
        io_tab = np.zeros((len(a_first), 3))
        recipes: dict[tuple[int, ...], Recipe] = {}
        ones: dict[tuple[int, ...], StageActivations] = {}
        for j, c in enumerate(a_first):
            core = cores[c]
            row = rows[c]
            rkey = (row[5], row[6], row[8])
            recipe = recipes.get(rkey)
            if recipe is None:
                recipe = recipes[rkey] = replace(core.recipe(no_ib), offload="none")
            layout = self._core_layout(core)
            io_tab[j] = (
                block_input_bytes(model, recipe, layout),
                input_grad_bytes(model, recipe, layout, 0),
                input_grad_bytes(model, recipe, layout, core.pp - 1),
            )
            blocks: dict[tuple[int, bool], Any] = {}  # a layer's saved set, shared by both stages
            for k, stage in enumerate((0, core.pp - 1)):
                okey = (row[0], row[1], row[2], row[4], row[11], *rkey, stage)
                one = ones.get(okey)
                if one is None:
                    one = ones[okey] = stage_activations(model, recipe, layout, stage, 1, blocks=blocks)
                hd = held_microbatches(layout, stage)
                # saved bytes are affine in the in-flight count: one micro-batch plus the slope
                # (EP overlap can hold one more micro-batch than the schedule: the slope is kept)
                slope = one.per_microbatch_bytes
                a_tab[j, k] = (
                    one.total_bytes,
                    slope,
                    hd,
                    one.logits_saved_bytes,
                    one.recompute_transient_bytes,
                    one.logits_transient_bytes,
                    one.last_layer_bytes,
                    one.block_backward_bytes,
                    one.block_backward_later_bytes,
                    one.logits_forward_bytes,
                )
        acts = a_tab[a_of_core]
        self._core_input_bytes = io_tab[a_of_core]
        (
            act1,
            act_slope,
            held,
            logits,
            transient,
            loss_t_tab,
            last_layer,
            block_backward,
            block_later,
            loss_f_tab,
        ) = (np.ascontiguousarray(acts[:, :, q]) for q in range(10))
        # where EP overlap applies (LayoutOptions.for_candidate, as Core.layout builds it), and the
        # micro-batch (chunk) more it holds (memory.held_microbatches)
        self._c_ep_overlap = np.zeros(len(cores), dtype=bool)
        if self.options.ep_comm_overlap:
            self._c_ep_overlap[:] = [c.layout(c.ep, 0, self.options).ep_comm_overlap for c in cores]
        if self._c_ep_overlap.any():
            extra = np.array([ep_overlap_extra_microbatches(c.pp, c.virtual_stages) for c in cores])
            held = held + np.where(self._c_ep_overlap, extra, 0.0)[:, None]
        # per (core, ZeRO stage) = core·4 + zero: its row of the state table
        cz = (s_of_core[:, None] * 4 + np.arange(4)).reshape(-1)
        flat = s_tab.reshape(-1, 2, 2 * nf + 2)
        self._states_bad = np.isnan(flat[:, 0, 0])[cz]
        flat = np.where(np.isnan(flat), 0.0, flat)
        # [stage (first, last), field, core·4 + zero]: A and B of field = A + B/dp; per (stage,
        # field) whether B is 0 everywhere (no dp term) and whether A is too (the field is 0)
        self._sA = np.ascontiguousarray(flat[cz][:, :, 0 : 2 * nf : 2].transpose(1, 2, 0))
        self._sB = np.ascontiguousarray(flat[cz][:, :, 1 : 2 * nf : 2].transpose(1, 2, 0))
        self._s_has_b = cast(list[list[bool]], self._sB.any(axis=2).tolist())
        self._s_has_a = cast(list[list[bool]], self._sA.any(axis=2).tolist())
        self._s_trainable = flat[cz, :, 2 * nf]
        self._s_params = flat[cz, :, 2 * nf + 1]
        # the same core one offload step lower (optimizer -> none, optimizer+params -> optimizer)
        full_code = code(tuple(range(12)))
        order = np.argsort(full_code)
        lower = full_code - int(np.prod(span[8:]))  # offload (column 7) one lower
        at = np.minimum(np.searchsorted(full_code, lower, sorter=order), n - 1)
        found = (tab[:, 7] > 0) & (full_code[order[at]] == lower)
        self._c_twin = np.where(found, order[at], -1).astype(np.int64)
        self._act1 = act1
        self._loss_transient = loss_t_tab
        self._loss_forward = loss_f_tab
        self._act_slope = act_slope
        self._held = held
        self._logits = logits
        self._transient = transient
        self._last_layer = last_layer
        self._block_backward = block_backward
        self._block_backward_later = block_later
        columns = {"tp": 0, "pp": 1, "cp": 2, "ep": 3, "micro_batch": 5, "virtual_stages": 10}
        self._c_int = {name: np.ascontiguousarray(tab[:, j]) for name, j in columns.items()}
        # the ranks each routed expert is split over (Layout.expert_tp): tp, or 1 when folded
        self._c_int["etp"] = np.where(tab[:, 11] > 0, tab[:, 11], tab[:, 0])
        self._folding = bool((tab[:, 11] > 0).any())
        # Compute keys: the work of a micro-batch does not depend on offload or on the schedule
        # beyond its virtual stages. Their stage work (flops.device_flops) does not depend on ep
        # either (balanced routing), so it is shared by the compute keys that differ only in ep.
        fk_of_core, fk_first = keyed((0, 1, 2, 3, 4, 5, 6, 8, 10, 11))
        self._fkeys = [cores[c] for c in fk_first]  # their offload and schedule are not read
        self._fkey_core = np.array(fk_first, dtype=np.int64)  # a core of each compute key
        self._c_fkey = fk_of_core
        flop_of_core, _ = keyed((0, 1, 2, 4, 5, 6, 8, 10))
        # Collective sizes and groups: tp, pp, cp, ep, sequence parallelism, micro-batch, precision.
        self._c_comm, comm_first = keyed((0, 1, 2, 3, 4, 5, 8, 11))
        self._n_comm = len(comm_first)
        self._fkey_flops = flop_of_core[self._fkey_core]
        self._c_sp = tab[:, 4] == 1
        # LayoutOptions.for_candidate: the schedules on which pipeline overlap applies
        self._c_pp_overlap_sched = np.isin(
            tab[:, 9], [sched_code[s] for s in self.options.pp_comm_overlap_schedules]
        )
        self._c_full = tab[:, 6] == rc_code["full"]
        rc_tab = tab[:, 6]
        # recipe.reruns_forward_hooks / repeats_attention: the recompute modes that rerun the
        # modules' forward (gathers and weight streams again) and the attention (the cp ring)
        self._c_refetch = np.array([reruns_forward_hooks(r) for r in _RECOMPUTES])[rc_tab]
        self._c_rc_any = np.array([repeats_attention(r) for r in _RECOMPUTES])[rc_tab]
        self._c_off = np.ascontiguousarray(tab[:, 7])
        self._c_bubble_div = np.array(
            [float(bubble_divisor(_SCHEDULES[s], int(v))) for s, v in tab[:, (9, 10)].tolist()]
        )
        # Recipe figures per distinct (micro-batch, recompute, offload, precision).
        r_of_core, r_first = keyed((5, 6, 7, 8))
        r_recipes = [cores[c].recipe(self.base) for c in r_first]
        self._c_e = np.array([float(BYTES_PER_ELEMENT[r.weight_dtype]) for r in r_recipes])[r_of_core]
        self._c_gathered = np.array([r.gathered_weight_bytes for r in r_recipes])[r_of_core]
        self._c_fp32_main = np.array([fp32_main_grad(r.weight_dtype) for r in r_recipes])[r_of_core]
        self._c_update = np.array([optimizer_update_bytes(1.0, r) for r in r_recipes])[r_of_core]
        # What a resumable checkpoint holds (goodput.checkpoint_bytes; predict.estimate's figure).
        self._c_ckpt = np.array(
            [checkpoint_bytes(trainable_params(model, r, Layout()), r) for r in r_recipes], dtype=np.float64
        )[r_of_core]
        # Trainable (PEFT: adapters over all stages, tp = 1 as step_time counts them) per pp.
        if self.base.is_peft:
            pps = np.unique(tab[:, 1])
            adapters = [
                float(
                    sum(
                        device_params(model, Layout(pp=int(pp)), st, self.base.lora).lora_adapters
                        for st in range(int(pp))
                    )
                )
                for pp in pps.tolist()
            ]
            self._c_tdense = np.array(adapters)[np.searchsorted(pps, tab[:, 1])]
            self._c_texpert = np.zeros(n)
        else:
            self._c_tdense = np.full(n, self._dense)
            self._c_texpert = np.full(n, self._expert)
        # Model FLOPs and tokens per step (fixed global batch: same for every layout).
        m_of_core, m_first = keyed((8, 6, 5))
        mf = [step_flops(model, cores[c].recipe(self.base), None).model_flops for c in m_first]
        self._c_model_flops = np.array(mf)[m_of_core]
        self._tokens_per_step = float(self.base.global_batch or 0) * self.base.seq_len

    # ----- time tables ----------------------------------------------------------------------
    def _accel(self, a: int, p: int) -> _Accel:
        key = (a, p)
        if key not in self._accel_cache:
            recipe = self.cores[self._prec_core[p]].recipe(self.base)
            self._accel_cache[key] = accel_constants(self.accelerators[a], recipe, self.prices[a])
        return self._accel_cache[key]

    def _attention_etas(self, a_ids: IntArray, p: int, cp: int) -> tuple[FloatArray, FloatArray]:
        """``timing.attention_etas`` (forward, backward) of each accelerator of ``a_ids`` at
        precision ``p`` and context-parallel degree ``cp``."""
        recipe = self.cores[self._prec_core[p]].recipe(self.base)
        got = [
            attention_etas(self.accelerators[a], recipe, self._accel(a, p).eff, self.model, cp)
            for a in a_ids.tolist()
        ]
        return np.array([g.forward for g in got]), np.array([g.backward for g in got])

    def _accel_arrays(self, api: IntArray) -> dict[str, FloatArray]:
        """Accelerator constants as (accelerator, precision) tables, filled for the pairs used
        (``api`` = accelerator · number of precisions + precision)."""
        na, npr = len(self.accelerators), len(self._precs)
        tabs = self._accel_tabs
        if not tabs:
            for name, fill in (
                ("peak", 0.0),
                ("bw", 0.0),
                ("up_bw", 1.0),
                ("up_lat", 0.0),
                ("up_eff", 1.0),
                ("out_bw", np.nan),
                ("out_lat", 0.0),
                ("out_eff", 1.0),
                ("protocols", 0.0),
                ("domain", 1.0),
                ("host_bw", 0.0),
                ("price", np.nan),
                ("tdp", np.nan),
                ("done", 0.0),
            ):
                tabs[name] = np.full((na, npr), fill)
        mark = np.zeros(na * npr, dtype=bool)
        mark[api] = True
        for pair in np.flatnonzero(mark).tolist():
            a, p = divmod(pair, npr)
            if tabs["done"][a, p]:
                continue
            ax = self._accel(a, p)
            tabs["peak"][a, p] = ax.peak
            tabs["bw"][a, p] = ax.bw
            tabs["up_bw"][a, p], tabs["up_lat"][a, p], tabs["up_eff"][a, p] = ax.up
            if ax.out is not None:
                tabs["out_bw"][a, p], tabs["out_lat"][a, p], tabs["out_eff"][a, p] = ax.out
            tabs["protocols"][a, p] = float(ax.protocols)
            tabs["domain"][a, p] = ax.domain
            tabs["host_bw"][a, p] = ax.host_bw
            if ax.price is not None:
                tabs["price"][a, p] = ax.price
            if ax.tdp_w is not None:
                tabs["tdp"][a, p] = ax.tdp_w
            tabs["done"][a, p] = 1.0
        return tabs

    def _time_tables(self, afk: IntArray) -> FloatArray:
        """Per-micro-batch times of the busiest stage (``timing.step_time``): ``[t_f, t_b, t_r,
        a_f, a_b, g_f, g_b, g_r]`` (passes, attention, GEMMs) as (accelerator, compute key) tables, filled for the pairs used (``afk`` =
        accelerator · number of compute keys + compute key).

        Keyed by the compute key of each core (offload and the pipeline schedule do not change
        the work of a micro-batch; the number of virtual stages does). All stages of all compute
        keys are done at once on (stage, accelerator) arrays: ``timing._pass_time_s`` itself runs
        on them (the same IEEE operations as the scalar call, element by element), and the
        busiest stage is the first maximum, as ``max()`` in ``step_time``.
        """
        na, nk = len(self.accelerators), len(self._fkeys)
        tab = self._time_tab
        mark = np.zeros(na * nk, dtype=bool)
        mark[afk] = True
        pairs = np.flatnonzero(mark)
        pairs = pairs[np.isnan(tab[0].reshape(-1)[pairs])]
        if pairs.size == 0:
            return tab
        accs, fks = np.divmod(pairs, nk)
        fk_prec = self._c_prec[self._fkey_core]
        for p in np.unique(fk_prec[fks]).tolist():
            on = fk_prec[fks] == p
            a_ids = np.unique(accs[on])
            k_ids = np.unique(fks[on])
            self._fill_time_block(tab, int(p), a_ids, k_ids)
        return tab

    def _fill_time_block(self, tab: FloatArray, p: int, a_ids: IntArray, k_ids: IntArray) -> None:
        axs = [self._accel(a, p) for a in a_ids.tolist()]
        peak = np.array([ax.peak for ax in axs])[None, :]
        peak_hp = np.array([ax.peak_hp for ax in axs])[None, :]
        peak_attn = np.array([ax.peak_attn for ax in axs])[None, :]
        bw = np.array([ax.bw for ax in axs])[None, :]
        kappa = np.array([ax.kappa for ax in axs])[None, :]
        # one row per distinct stage of each compute key, in order
        spans = [self._stage_rows(fk) for fk in k_ids.tolist()]
        lens = np.array([hi - lo for lo, hi in spans], dtype=np.int64)
        n_rows = int(lens.sum())
        starts = np.cumsum(lens) - lens
        rows = np.repeat(np.array([lo for lo, _ in spans], dtype=np.int64) - starts, lens) + np.arange(n_rows)
        eta_rows = np.array(
            [
                self._eta_row(self._fkeys[fk], r)
                for fk, (lo, hi) in zip(k_ids.tolist(), spans, strict=True)
                for r in range(lo, hi)
            ],
            dtype=np.int64,
        )
        used = np.unique(eta_rows)
        eta = np.stack([self._eta_values(e, a_ids) for e in used.tolist()])[np.searchsorted(used, eta_rows)]
        work = np.array(self._stage_work, dtype=np.float64).reshape(-1, 13)[rows]
        # timing.attention_etas per (accelerator, cp) of each row's compute key
        row_cp = np.repeat(np.array([self._fkeys[fk].cp for fk in k_ids.tolist()], dtype=np.int64), lens)
        by_cp = {cp: self._attention_etas(a_ids, p, cp) for cp in np.unique(row_cp).tolist()}
        eta_af = np.stack([by_cp[cp][0] for cp in row_cp.tolist()])
        eta_ab = np.stack([by_cp[cp][1] for cp in row_cp.tolist()])

        def cost(j: int) -> _ArrayCost:
            return _ArrayCost(
                gemm_flops=work[:, j : j + 1],
                attention_flops=work[:, j + 1 : j + 2],
                memory_bytes=work[:, j + 2 : j + 3],
                hp_gemm_flops=work[:, j + 3 : j + 4],
            )

        fwd, bwd, rec = cost(0), cost(4), cost(8)
        dequant = work[:, 12:13]
        f = _pass(fwd, peak, eta, eta_af, bw, peak_hp, peak_attn) / kappa
        b = (_pass(bwd, peak, eta, eta_ab, bw, peak_hp, peak_attn) + dequant / bw) / kappa
        r = _pass(rec, peak, eta, eta_af, bw, peak_hp, peak_attn) / kappa
        total = f + b + r
        a_f = fwd.attention_flops / (peak_attn * eta_af) + 0.0 * f
        a_b = bwd.attention_flops / (peak_attn * eta_ab) + 0.0 * f
        g_f, g_b, g_r = (
            ((c.gemm_flops - c.hp_gemm_flops) / peak + c.hp_gemm_flops / peak_hp) / eta / kappa
            for c in (fwd, bwd, rec)
        )
        top = np.maximum.reduceat(total, starts, axis=0)
        seg = np.repeat(np.arange(starts.size), lens)
        row_no = np.broadcast_to(np.arange(n_rows)[:, None], total.shape)
        first = np.minimum.reduceat(np.where(total == top[seg], row_no, n_rows), starts, axis=0)
        cols = np.broadcast_to(np.arange(a_ids.size)[None, :], first.shape)
        for j, x in enumerate((f, b, r, a_f, a_b, g_f, g_b, g_r)):
            tab[j][np.ix_(a_ids, k_ids)] = x[first, cols].T

    def _eta_row(self, core: Core, row: int) -> int:
        """Index of the (stage kinds, tokens, tp, ep, precision) key of ``_stage_gemm_efficiency``
        for stage ``row`` of the stage store run by ``core``."""
        got = self._eta_of_row.get((row, core.ep, core.etp))
        if got is not None:
            return got
        layers, kinds = self._stage_layers[row]
        tokens = core.micro_batch * (self.base.seq_len // core.cp)
        key = (kinds, tokens, core.tp, core.ep, self._prec_index[core.precision], core.etp)
        i = self._eta_index.get(key)
        if i is None:
            i = self._eta_index[key] = len(self._eta_keys)
            self._eta_keys.append((key, layers, self._core_layout(core)))
        self._eta_of_row[(row, core.ep, core.etp)] = i
        return i

    def _eta_values(self, e: int, accs: IntArray) -> FloatArray:
        """``timing._stage_gemm_efficiency`` of eta key ``e`` on each accelerator of ``accs``.

        Accelerators whose efficiency figures are equal (their descriptive fields aside) and
        that compute in the same dtype get the same value: it is computed once for them.
        """
        (_, tokens, _, _, p, _), layers, layout = self._eta_keys[e]
        row = self._eta_cache.get(e)
        if row is None:
            row = self._eta_cache[e] = np.full(len(self.accelerators), np.nan)
        done: dict[tuple[object, ...], float] = {}
        for a in accs[np.isnan(row[accs])].tolist():
            ax = self._accel(a, p)
            key = (ax.eff_key, ax.dtype)
            got = done.get(key)
            if got is None:
                got = done[key] = _stage_gemm_efficiency(
                    self.model,
                    layers,
                    tokens,
                    layout,
                    ax.eff,
                    ax.dtype,
                    self._routing,
                )
            row[a] = got
        return np.asarray(row[accs])

    def _stage_rows(self, fk: int) -> tuple[int, int]:
        """Rows [lo, hi) of the stage store (``_stage_work``, ``_stage_layers``) that hold the
        distinct stages of compute key ``fk``: its per-micro-batch forward, backward and recompute
        work (``flops.device_flops``) and dequantization bytes. Stages with the same work cost the
        same; the first of equal ones is kept, as ``max`` keeps the first maximum. The compute
        keys that differ only in ep share the rows (``device_flops`` does not read ep)."""
        flop = int(self._fkey_flops[fk])
        span = self._flop_rows.get(flop)
        if span is None:
            core = self._fkeys[fk]
            rkey = (core.micro_batch, core.recompute, core.precision, core.ep)
            recipe = self._stage_recipes.get(rkey)
            if recipe is None:
                recipe = replace(core.recipe(self.base), global_batch=core.micro_batch * core.ep)
                recipe = self._stage_recipes[rkey] = replace(recipe, offload="none")
            seen: set[tuple[object, ...]] = set()
            lo = len(self._stage_layers)
            # the per-layer work does not depend on pp or the schedule: shared between them
            lkey = (
                core.micro_batch,
                core.recompute,
                core.precision,
                core.tp,
                core.cp,
                core.sequence_parallel,
            )
            layer_cache = self._layer_caches.setdefault(lkey, {})
            for st in device_flops(
                self.model, recipe, self._core_layout(core), distinct=True, layer_cache=layer_cache
            ):
                kinds = self._kinds.get(st.layers)
                if kinds is None:
                    kinds = stage_kind_counts(self.model, st.layers)
                    self._kinds[st.layers] = kinds
                key = (st.forward, st.backward, st.recompute, st.dequant_bytes, kinds)
                if key in seen:
                    continue
                seen.add(key)
                for c in (st.forward, st.backward, st.recompute):
                    self._stage_work += (c.gemm_flops, c.attention_flops, c.memory_bytes, c.hp_gemm_flops)
                self._stage_work.append(st.dequant_bytes)
                self._stage_layers.append((st.layers, kinds))
            span = self._flop_rows[flop] = (lo, len(self._stage_layers))
        return span

    # ----- evaluation -----------------------------------------------------------------------
    def evaluate(self, cand: Candidates, *, prune_slower: bool = False) -> BulkResult:
        """Memory of every candidate; step time, throughput and cost of those that fit.

        ``prune_slower``: skip the time of candidates that provably cannot be the fastest at
        their (accelerator, device count) — their step-time lower bound exceeds the step time
        of another candidate there (``BulkResult.slower``, see ``_prune_slower``).
        """
        n = len(cand)
        seg = cand.segments
        nseg = seg.start.size

        # --- memory (memory._stage_breakdown / memory_breakdown) -------------------------
        # Memory depends on (core, ZeRO stage, dp) only, not on the accelerator: it is computed
        # once per distinct key of the block rows; a block serves every accelerator that shares
        # its device count, scale-up domain and precisions.
        key, u_core, u_zero, u_dp = self._memory_keys(seg.dp, seg.zero, seg.core)
        parts = [
            self._memory(u_core[lo : lo + CHUNK], u_zero[lo : lo + CHUNK], u_dp[lo : lo + CHUNK])
            for lo in range(0, max(1, u_core.size), CHUNK)
        ]
        mem = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        r_ok = mem["invalid"][key] == VALID
        r_pd = mem["per_device"][key]
        r_host = mem["host"][key]
        r_twin = self._twin_rows(seg)

        # --- per segment: capacity, network validity, fit and dominance ----------------------
        s_cap = self._acc_capacity[seg.acc]
        s_bad = (seg.devices > np.minimum(self._acc_domain[seg.acc], seg.devices)) & self._acc_no_out[seg.acc]
        s_fast = self._acc_fast_hbm[seg.acc]
        s_host_cap = self._acc_host_capacity[seg.acc]
        s_on_node = np.minimum(seg.devices, self._acc_per_node[seg.acc])
        fits = np.zeros(n, dtype=bool)
        dominated = np.zeros(n, dtype=bool)
        empty = np.zeros(0, dtype=np.int64)
        pieces: list[tuple[IntArray, IntArray]] = [(empty, empty)] * nseg
        by_block = np.argsort(seg.block, kind="stable")
        cuts = np.flatnonzero(np.diff(seg.block[by_block])) + 1
        for ss in np.split(by_block, cuts) if nseg else []:
            b = int(seg.block[ss[0]])
            lo, hi = int(seg.block_start[b]), int(seg.block_start[b + 1])
            f = (
                r_ok[lo:hi]
                & ~s_bad[ss, None]
                & (r_pd[lo:hi] <= usable_bytes(s_cap[ss, None], self.memory_margin))
                & host_fits(r_host[lo:hi], s_on_node[ss, None], s_host_cap[ss, None])
            )
            tw = r_twin[lo:hi]
            has = tw >= 0
            d = f & s_fast[ss, None] & has & f[:, np.where(has, tw - lo, 0)]
            keep = f & ~d
            for j, s in enumerate(ss.tolist()):
                st = int(seg.start[s])
                fits[st : st + hi - lo] = f[j]
                dominated[st : st + hi - lo] = d[j]
                loc = np.flatnonzero(keep[j])
                pieces[s] = (st + loc, lo + loc)
        sub = np.concatenate([p[0] for p in pieces]) if nseg else empty
        rows = np.concatenate([p[1] for p in pieces]) if nseg else empty
        s_of = np.repeat(np.arange(nseg, dtype=np.int64), [p[0].size for p in pieces])
        c = Candidates(
            acc=seg.acc[s_of],
            devices=seg.devices[s_of],
            dp=seg.dp[rows],
            zero=seg.zero[rows],
            core=seg.core[rows],
        )
        k = key[rows]
        m, trainable, params_dev = mem["m"][k], mem["trainable"][k], mem["params_dev"][k]
        slower = np.zeros(n, dtype=bool)
        if prune_slower and sub.size:
            fast = self._prune_slower(c, m, trainable, params_dev)
            slower[sub[~fast]] = True
            sub, c, m, trainable, params_dev = (
                sub[fast],
                c.take(fast),
                m[fast],
                trainable[fast],
                params_dev[fast],
            )
        times = self._time(c, m, trainable, params_dev)
        return BulkResult(
            segments=seg,
            row_key=key,
            key_memory=mem,
            segment_capacity=s_cap,
            segment_network_bad=s_bad,
            fits=fits,
            dominated=dominated,
            slower=slower,
            timed=sub,
            times=times,
        )

    def _memory_keys(
        self, dpi: IntArray, zero: IntArray, core: IntArray
    ) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Index of each (core, zero, dp) among the distinct ones, and the distinct ones' columns."""
        if dpi.size == 0:
            e = np.zeros(0, dtype=np.int64)
            return e, e, e, e
        present = np.bincount(dpi)
        dps = np.flatnonzero(present)
        lut = np.zeros(present.size, dtype=np.int64)
        lut[dps] = np.arange(dps.size)
        ndp = dps.size
        full_key = (core * 4 + zero) * ndp + lut[dpi]
        mark = np.zeros(len(self.cores) * 4 * ndp, dtype=bool)
        mark[full_key] = True
        ukeys = np.flatnonzero(mark)
        pos = np.full(mark.size, -1, dtype=np.int64)
        pos[ukeys] = np.arange(ukeys.size)
        return pos[full_key], ukeys // (4 * ndp), (ukeys // ndp) % 4, dps[ukeys % ndp]

    def _memory(self, core: IntArray, zero: IntArray, dpi: IntArray) -> dict[str, Any]:
        """Memory peak and its terms of the worse of the first and the last pipeline stage,
        for (core, zero, dp) keys; ``invalid`` holds the reasons that do not need the network."""
        n = core.size
        dp = dpi.astype(np.float64)
        mb = self._c_int["micro_batch"][core]
        invalid = np.zeros(n, dtype=np.int64)

        gb = int(self.base.global_batch or 0)
        per_step = np.maximum(dpi * mb, 1)
        # a global batch dp·micro_batch does not divide trains as the nearest one it does
        m = np.asarray(nearest_micro_batches(gb, per_step), dtype=np.int64)
        mf = m.astype(np.float64)
        if self.base.optimizer_in_backward:
            invalid[(m > 1) & (invalid == 0)] = INVALID_OPT_IN_BWD

        cz = core * 4 + zero
        invalid[self._states_bad[cz] & (invalid == 0)] = INVALID_STATES

        def state(k: int, j: int) -> Num:
            """State field j of stage k: A + B/dp (see _state_tables); 0 where the table is."""
            has_a, has_b = self._s_has_a[k][j], self._s_has_b[k][j]
            if not has_b:
                return np.take(self._sA[k, j], cz) if has_a else 0.0
            return np.take(self._sA[k, j], cz) + np.take(self._sB[k, j], cz) / dp

        capacity = np.full(n, np.inf)  # the peak does not depend on the capacity
        grads_live = grads_live_at_backward_start(
            m, self.base.optimizer_in_backward, persistent_grad_buffer(self.base)
        )
        # a block's input and each stage's input gradient (0 under ZeRO-3: stage_memory_fields)
        io = self._core_input_bytes
        stage_vals = []
        for k in (0, 1):
            infl = capped_inflight(self._held[core, k], mf)
            act = self._act1[core, k] + self._act_slope[core, k] * (infl - 1.0)
            # memory.stage_memory_fields composes the stage (its transient: the loss backward,
            # the recomputed layer or the step inside the backward; the FSDP2 moments are phases)
            values = stage_memory_fields(
                {name: state(k, j) for j, name in enumerate(_STATE_FIELDS)},
                activations=act,
                logits_saved=self._logits[core, k],
                logits_transient=self._loss_transient[core, k],
                logits_forward=self._loss_forward[core, k],
                recompute_transient=self._transient[core, k],
                last_layer=self._last_layer[core, k],
                block_backward=self._block_backward[core, k],
                block_backward_later=self._block_backward_later[core, k],
                block_input=io[core, 0],
                input_grad=io[core, 1 + k],
                zero=zero,
            )
            per_dev = _array_memory(values, capacity, grads_live=grads_live).per_device_bytes
            stage_vals.append(
                (
                    per_dev,
                    values["weights_bytes"],
                    values["gradients_bytes"],
                    values["optimizer_bytes"],
                    values["host_bytes"],
                    act,
                    self._s_trainable[cz, k],
                    self._s_params[cz, k],
                )
            )
        last_worse = stage_vals[1][0] > stage_vals[0][0]
        pick = [np.where(last_worse, b, a) for a, b in zip(stage_vals[0], stage_vals[1], strict=True)]
        names = (
            "per_device",
            "weights",
            "gradients",
            "optimizer",
            "host",
            "activations",
            "trainable",
            "params_dev",
        )
        out: dict[str, Any] = dict(zip(names, pick, strict=True))
        out["invalid"] = invalid
        out["m"] = m
        return out

    @functools.cached_property
    def _c_tp_skips(self) -> IntArray:
        """``comm.recompute_skipped_tp_reductions`` per core (its recipe, ⌈L/pp⌉ layers)."""
        model = self.model
        memo: dict[tuple[object, ...], int] = {}
        out = np.zeros(len(self.cores), dtype=np.int64)
        for i, c in enumerate(self.cores):
            if c.tp == 1 or c.recompute != "full" or not self.base.recompute_early_stop:
                continue  # no tensor-parallel recompute collectives, or nothing skipped
            recipe = c.recipe(self.base)
            key = (recipe.precision, recipe.method, recipe.dropout, c.pp)  # what the count reads
            if key not in memo:
                memo[key] = recompute_skipped_tp_reductions(model, recipe, -(-model.num_layers // c.pp))
            out[i] = memo[key]
        return out

    def _traffic(
        self, core: IntArray, dpi: IntArray, zero: IntArray, m: IntArray, *, with_buffers: bool = True
    ) -> tuple[Traffic, ...]:
        """``comm.step_traffic`` of key representatives (their buffers; calls unused) or of
        candidates (``with_buffers=False``: their calls; the buffers are the keys')."""
        ci = self._c_int
        e = self._c_e[core]
        return step_traffic(
            self.model,
            self.base.seq_len,
            TrafficInputs(
                tp=ci["tp"][core],
                pp=ci["pp"][core],
                cp=ci["cp"][core],
                ep=ci["ep"][core],
                dp=dpi,
                zero=zero,
                micro_batches=m,
                micro_batch=ci["micro_batch"][core],
                sequence_parallel=self._c_sp[core],
                recompute_full=self._c_full[core],
                recompute_repeats_ring=self._c_rc_any[core],
                regather_for_recompute=self._c_refetch[core],
                skipped_reductions=self._c_tp_skips[core],
                virtual_stages=ci["virtual_stages"][core],
                weight_bytes=e,
                stored_weight_bytes=self._c_gathered[core],
                dense_params=self._dense,
                expert_params=self._expert,
                trainable_dense_params=self._c_tdense[core],
                trainable_expert_params=self._c_texpert[core],
                granularity=self.options.zero3_granularity,
                capacity_factor=self._routing[0],
                etp=self._c_int["etp"][core] if self._folding else None,
                moe_tp_dispatch=moe_layer_dispatches(self.base),
            ),
            with_buffers=with_buffers,
        )

    def _collectives(
        self, acc: IntArray, dpi: IntArray, core: IntArray
    ) -> tuple[dict[str, FloatArray], IntArray]:
        """Per-call network times of the step's collectives for each candidate
        (``comm.collective_time_s`` of ``comm.step_traffic`` on the groups of ``comm.group_shapes``).

        They depend on the accelerator, dp and the core's tp, pp, cp, ep, sequence parallelism,
        micro-batch and precision (the device count is dp·tp·pp·cp), not on ZeRO, recompute,
        offload or the schedule: each is computed once per distinct such key. Returns the
        per-key times by traffic name (only the collectives that take time on some key) and each
        candidate's key.
        """
        present = np.bincount(dpi)
        dps = np.flatnonzero(present)
        lut = np.zeros(present.size, dtype=np.int64)
        lut[dps] = np.arange(dps.size)
        key = (acc * dps.size + lut[dpi]) * self._n_comm + self._c_comm[core]
        mark = np.zeros(len(self.accelerators) * dps.size * self._n_comm, dtype=bool)
        mark[key] = True
        ukeys = np.flatnonzero(mark)
        pos = np.zeros(mark.size, dtype=np.int64)
        pos[ukeys] = np.arange(ukeys.size)
        of = pos[key]
        rep = np.empty(ukeys.size, dtype=np.int64)
        rep[of] = np.arange(of.size)  # a candidate of each key
        a, dp, c = acc[rep], dpi[rep], core[rep]
        n = a.size
        tp, pp, cp, ep = (self._c_int[name][c] for name in ("tp", "pp", "cp", "ep"))
        api = a * len(self._precs) + self._c_prec[c]
        ac = self._accel_arrays(api)

        def col(name: str) -> FloatArray:
            return np.asarray(ac[name].reshape(-1)[api])

        d = np.minimum(col("domain").astype(np.int64), dp * tp * pp * cp)
        up = (col("up_bw"), col("up_lat"), col("up_eff"))
        # No scale-out link: a group that spans domains is an invalid candidate; its time is unused.
        none = np.isnan(col("out_bw"))
        out_link = tuple(
            np.where(none, u, o)
            for u, o in zip(up, (col("out_bw"), col("out_lat"), col("out_eff")), strict=True)
        )
        protocols = col("protocols") > 0.0
        shapes = group_shapes(tp, cp, dp, ep, pp, self._c_int["etp"][c] if self._folding else None)
        placed: dict[str, tuple[IntArray, IntArray]] = {}
        out: dict[str, FloatArray] = {}
        zeros = np.zeros(n, dtype=np.int64)
        for t in self._traffic(c, dp, zeros, zeros + 1):
            if t.group not in placed:
                g_size, g_stride = (np.asarray(v, dtype=np.int64) for v in shapes[t.group])
                placed[t.group] = (g_size, np.asarray(ranks_per_domain(g_size, g_stride, d), dtype=np.int64))
            size, local = placed[t.group]
            if not bool((size > 1).any()):
                continue  # every group of this kind is one rank: nothing moves
            nbytes = np.broadcast_to(np.asarray(t.buffer_bytes, dtype=np.float64), (n,))
            per_call = np.asarray(
                call_time_s(
                    t,
                    collective_time_s(t.kind, nbytes, size, local, up, cast(Any, out_link), protocols),
                    nbytes,
                    col("bw"),
                )
            )
            if per_call.any():
                out[t.name] = per_call
        return out, of

    def _twin_rows(self, seg: Segments) -> IntArray:
        """For every block row, the row of the same block whose core is one offload step lower
        (same ZeRO stage, hence the same dp), or -1.

        Offload dominance: ``timing.step_time`` charges offload ``transfers + update /
        HOST_MEMORY_BYTES_PER_S`` in place of ``update / (HBM bandwidth)`` and adds the weight
        streaming of parameter offload; every other term is the same. Where the HBM bandwidth is
        at least HOST_MEMORY_BYTES_PER_S the lower variant is at least as fast at the same price,
        so an offload variant whose twin fits is dominated. The twin must be a candidate itself:
        a row of the same block, hence of the same accelerator and device count
        (``enumerate_candidates`` gives each (accelerator, device count) one segment).
        """
        out = np.full(seg.dp.size, -1, dtype=np.int64)
        where = np.full(len(self.cores) * 4, -1, dtype=np.int64)  # (core, zero) -> row, per block
        for b in range(seg.block_start.size - 1):
            lo, hi = int(seg.block_start[b]), int(seg.block_start[b + 1])
            code = seg.core[lo:hi] * 4 + seg.zero[lo:hi]
            where[code[::-1]] = np.arange(hi - 1, lo - 1, -1)  # the first row of a repeated pair
            tw = self._c_twin[seg.core[lo:hi]]
            has = tw >= 0
            out[lo:hi][has] = where[tw[has] * 4 + seg.zero[lo:hi][has]]
            where[code] = -1
        return out

    def _prune_slower(
        self, c: Candidates, m: IntArray, trainable: FloatArray, params_dev: FloatArray
    ) -> BoolArray:
        """Which of the candidates ``c`` (that fit, not dominated) may be the fastest at their
        (accelerator, device count); False for those that provably are not.

        Rule: ``bound_only`` gives a lower bound of each candidate's step time (compute, bubble,
        optimizer and offload terms; the exposed collectives are left out). The exact step time
        of the ``PROBES_PER_GROUP`` candidates with the smallest bounds at each (accelerator,
        devices) is computed; a candidate whose bound exceeds the best of them (by more than
        ``SLOWER_MARGIN``, relative) is slower than that probe on the same hardware, hence also
        dearer (cost is devices × time × price), and is never the plan chosen there. Ties are kept.
        """
        bound = self._time(c, m, trainable, params_dev, bound_only=True)["bound"]
        k = len(c)
        group = c.acc * (int(c.devices.max()) + 1) + c.devices
        perm = np.argsort(group, kind="stable")  # linear when the groups are already contiguous
        gs = group[perm]
        first = np.r_[True, gs[1:] != gs[:-1]]
        starts = np.flatnonzero(first)
        sizes = np.diff(np.r_[starts, k])
        gid = np.empty(k, dtype=np.int64)
        gid[perm] = np.cumsum(first) - 1
        # The probes: the smallest bounds of each group, ties to the earlier candidate (the order
        # of a sort by group, bound, position), one round per probe; a taken one becomes NaN.
        b = np.where(np.isnan(bound), np.inf, bound)[perm]
        pos = np.arange(k)
        probes = []
        for _ in range(PROBES_PER_GROUP):
            low = np.repeat(np.fmin.reduceat(b, starts), sizes)
            at = np.minimum.reduceat(np.where(b == low, pos, k), starts)
            at = at[at < k]
            probes.append(at)
            b[at] = np.nan
        probe = perm[np.concatenate(probes)]
        step = self._time(c.take(probe), m[probe], trainable[probe], params_dev[probe])["step_s"]
        best = np.full(starts.size, np.inf)
        np.fmin.at(best, gid[probe], step)
        return np.asarray(~(bound > best[gid] * (1.0 + SLOWER_MARGIN)))

    def _time(
        self,
        cand: Candidates,
        m: IntArray,
        trainable: FloatArray,
        params_dev: FloatArray,
        *,
        bound_only: bool = False,
        calls: tuple[dict[str, FloatArray], IntArray] | None = None,
    ) -> dict[str, FloatArray]:
        """Step time, throughput and run cost of valid candidates that fit.

        ``bound_only``: only ``{"bound": ...}``, the sum of the step's compute, bubble, optimizer
        and offload terms in the order ``step_s`` adds them; every term left out (exposed
        collectives) is non-negative, and rounded addition is monotone, so ``bound <= step_s``
        exactly.

        ``calls``: the per-call collective times of :meth:`_collectives` and each candidate's key,
        computed once for all chunks.

        Computed ``CHUNK`` candidates at a time.
        """
        n = len(cand)
        if n > CHUNK:
            self._time_tables(cand.acc * len(self._fkeys) + self._c_fkey[cand.core])  # all at once
            per_key, of = calls or (
                ({}, cand.acc) if bound_only else self._collectives(cand.acc, cand.dp, cand.core)
            )
            parts = [
                self._time(
                    cand.take(slice(lo, lo + CHUNK)),
                    m[lo : lo + CHUNK],
                    trainable[lo : lo + CHUNK],
                    params_dev[lo : lo + CHUNK],
                    bound_only=bound_only,
                    calls=(per_key, of[lo : lo + CHUNK]),
                )
                for lo in range(0, n, CHUNK)
            ]
            return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        core = cand.core
        zero = cand.zero
        dpi = cand.dp
        devices = cand.devices
        acc = cand.acc
        cp = self._c_int["cp"][core]
        pp = self._c_int["pp"][core]
        # --- accelerator constants and per-micro-batch compute --------------------------------
        afk = acc * len(self._fkeys) + self._c_fkey[core]  # (accelerator, compute key), flattened
        tt = self._time_tables(afk)
        # the bound reads the passes only; the attention and GEMM parts are the overlap windows
        # of the collectives (timing.step_terms)
        t_f, t_b, t_r, a_f, a_b, g_f, g_b, g_r = (
            tt[j].reshape(-1)[afk] if j < 3 or not bound_only else 0.0 for j in range(8)
        )
        api = acc * len(self._precs) + self._c_prec[core]  # (accelerator, precision), flattened
        ac = self._accel_arrays(api)

        def col(name: str) -> FloatArray:
            return np.asarray(ac[name].reshape(-1)[api])

        bw = col("bw")
        opts = self.options
        shard = dpi * cp
        grad_accum = grad_accumulation_bytes_n(
            opts.grad_accumulation,
            trainable,
            self._c_e[core],
            self._c_fp32_main[core],
            zero,
            shard,
            m,
        )
        timed: list[_Timed] = []
        if not bound_only:
            per_key, of = calls or self._collectives(acc, dpi, core)  # per-call times
            for t in self._traffic(core, dpi, zero, m, with_buffers=False):
                if t.name not in per_key or (t.calls.__class__ is int and t.calls == 0):
                    continue  # takes no time on any candidate, or no candidate issues it
                if not np.asarray(t.calls).any():
                    continue
                timed.append(
                    _Timed(
                        group=t.group,
                        kind=t.kind,
                        phase=t.phase,
                        overlappable_with=t.overlap,
                        calls=t.calls,
                        time_s=traffic_time_s(t, per_key[t.name][of]),
                    )
                )
        x = StepInputs(
            micro_batches=m,
            t_f=t_f,
            t_b=t_b,
            t_r=t_r,
            gemm_f=g_f,
            gemm_b=g_b,
            gemm_r=g_r,
            attn_f=a_f,
            attn_b=a_b,
            collectives=timed,
            pp=pp,
            bubble_divisor=self._c_bubble_div[core],
            zero=zero,
            shard=shard,
            trainable_params_on_device=trainable,
            params_on_device=params_dev,
            update_bytes_per_param=self._c_update[core],
            hbm_bytes_per_s=bw,
            host_bytes_per_s=col("host_bw"),
            offload=self._c_off[core],
            weight_refetches=np.where(self._c_refetch[core], 3, 2),
            grad_accum_bytes=grad_accum,
            tp_comm_overlap=opts.tp_comm_overlap and self._c_sp[core],
            pp_comm_overlap=opts.pp_comm_overlap & self._c_pp_overlap_sched[core],
            overlap_grad_reduce=opts.overlap_grad_reduce,
            ep_comm_overlap=self._c_ep_overlap[core] if opts.ep_comm_overlap else False,
            ep_unpaired=ep_overlap_unpaired_fraction(pp, self._c_int["virtual_stages"][core], m)
            if opts.ep_comm_overlap
            else 1.0,
        )
        if bound_only:
            return {"bound": np.asarray(step_lower_bound_s(x))}
        terms = step_terms(x)
        step_s = terms["step_s"]

        # --- throughput and run (timing.throughput, cost.run_cost) ------------------------------
        # tokens per step of each candidate's global batch (dp·micro_batch·m sequences)
        tps = (dpi * self._c_int["micro_batch"][core] * m).astype(np.float64) * self.base.seq_len / step_s
        mfu = flops_utilisation(self._c_model_flops[core], devices, col("peak"), step_s)
        tokens = self.base.tokens
        power = average_power_w(col("tdp"), terms["compute_s"], step_s)
        time_s, device_hours, cost, energy, _ = run_totals(
            np.nan if tokens is None else tokens,
            tps,
            devices,
            price=col("price"),
            power_w=power,
            pue=self.pue,
            checkpoint_bytes=self._c_ckpt[core],
            reliability=self.reliability,
        )
        out = {name: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)) for name, v in terms.items()}
        run = {
            "tokens_per_s": tps,
            "mfu": mfu,
            "time_s": time_s,
            "device_hours": device_hours,
            "cost_usd": cost,
            "energy_kwh": energy,
        }
        return out | {name: np.asarray(v, dtype=np.float64) for name, v in run.items()}


@dataclass(frozen=True, slots=True)
class _Timed:
    """A collective of ``comm.step_traffic`` with its seconds per step (``timing.TimedCollective``)."""

    group: str
    kind: str
    phase: str | None
    overlappable_with: str
    calls: Any
    time_s: Any


def _pass(
    cost: Any,
    peak: FloatArray,
    eta: FloatArray,
    eta_attn: FloatArray,
    bw: FloatArray,
    peak_hp: FloatArray,
    peak_attn: FloatArray,
) -> FloatArray:
    """``timing._pass_time_s`` on arrays of accelerator constants (element-wise the same operations)."""
    return np.asarray(
        _pass_time_s(
            cost,
            cast(Any, peak),
            cast(Any, eta),
            cast(Any, eta_attn),
            cast(Any, bw),
            cast(Any, peak_hp),
            cast(Any, peak_attn),
        )
    )


@dataclass(frozen=True, kw_only=True)
class _ArrayCost:
    """``flops.PassCost`` with array fields (one row per stage)."""

    gemm_flops: FloatArray
    attention_flops: FloatArray
    memory_bytes: FloatArray
    hp_gemm_flops: FloatArray


class _ArrayMemory(MemoryBreakdown):
    """``MemoryBreakdown`` whose fields are arrays: its own ``phase_terms``, ``peak_bytes``,
    ``per_device_bytes`` and ``fragmentation_bytes`` compose them element-wise. Every FSDP2 moment
    is evaluated (``fsdp=True``): without ZeRO-3 its FSDP terms are 0 and it is below the backward
    start, so the peak is the scalar one."""


def _array_memory(values: Mapping[str, Any], capacity: FloatArray, *, grads_live: Bool) -> _ArrayMemory:
    fields = cast(dict[str, Any], dict(values))
    return _ArrayMemory(
        **fields,
        comm_buffers_bytes=0.0,
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        capacity_bytes=cast(Any, capacity),
        stage=0,
        grads_live_at_backward_start=cast(Any, grads_live),
        params_on_device=0,
        trainable_params_on_device=0,
        fsdp=True,
    )


__all__ = [
    "INVALID_REASONS",
    "TIME_FIELDS",
    "BulkEvaluator",
    "BulkResult",
    "Candidates",
    "Core",
    "Segments",
    "accel_constants",
]
