"""Bulk evaluation of many candidate (accelerator, devices, layout, recipe) at once.

The scalar :func:`trainplan.estimate.estimate` costs a fraction of a millisecond; a planner that
searches every accelerator, device count and layout needs millions of evaluations per second.
This module evaluates whole arrays of candidates with numpy and gives the same numbers as the
scalar path (tests hold every reported field to 1e-9 relative).

How the work is split
---------------------
A candidate is ``(accelerator, devices, core, zero)`` where the *core* is every layout and recipe
choice that does not depend on the device count: ``tp, pp, cp, ep, sequence_parallel,
micro_batch, recompute, offload, precision, pipeline schedule, virtual stages``; ``dp =
devices / (tp·pp·cp)``. Quantities that depend only on the core are computed once per core by
calling the scalar functions themselves (no second copy of their formulas):

* model states per pipeline stage: ``memory._model_states`` (ZeRO, Rajbhandari et al. 2020,
  Sec. 5). Every term it returns is an affine function of ``1/dp``: ZeRO divides by the shard
  group ``dp·cp`` (routed experts by ``dp·cp/ep``, which ``ep`` divides), nothing else depends on
  ``dp``. It is therefore evaluated at two data-parallel degrees and interpolated exactly;
* saved activations of one in-flight micro-batch, logits and the largest transient:
  ``memory._stage_breakdown`` with one micro-batch (activations scale with the in-flight count,
  ``memory.inflight_microbatches``, Korthikanti et al. 2022 Eq. 5);
* per-micro-batch forward / backward / recompute time of every stage on each accelerator:
  ``flops.device_flops`` with ``timing._stage_gemm_efficiency`` and ``timing._pass_time_s``.

What depends on ``dp``, ``zero``, the number of micro-batches and the placement of the parallel
groups on the scale-up domains — the composition of the memory peak, the collectives (alpha-beta
on the two-level network, ``comm.py``), their overlap, the pipeline bubble, the optimizer step,
offload transfers, throughput, cost and energy — is computed here on arrays. Those formulas
mirror ``memory.py``, ``comm.py``, ``timing.py`` and ``cost.py`` term by term, use the same
constants (imported, never copied) and are tested for equality against the scalar path.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, replace
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

from trainplan.comm import network_from_system
from trainplan.cost import IDLE_POWER_FRACTION
from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.efficiency import get_efficiency
from trainplan.errors import TrainplanError
from trainplan.flops import StageFlops, device_flops, optimizer_update_bytes, step_flops
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout, PipelineSchedule
from trainplan.memory import (
    CUDA_CONTEXT_BYTES,
    FSDP_PHASES,
    MemoryBreakdown,
    _model_states,
    _stage_breakdown,
    _States,
    inflight_microbatches,
    logits_bytes,
)
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Offload, Precision, Recipe, Recompute
from trainplan.sharding import device_params
from trainplan.timing import (
    EAGER_ATTENTION_EFFICIENCY_FACTOR,
    HOST_MEMORY_BYTES_PER_S,
    _pass_time_s,
    _stage_gemm_efficiency,
    calibrated_kappa,
    flash_attention_efficiency,
)
from trainplan.units import SECONDS_PER_HOUR

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

ZERO_STAGES: Final = (0, 1, 2, 3)
PROBES_PER_GROUP: Final = 4
"""Candidates per (accelerator, devices) whose exact step time sets the pruning threshold."""
SLOWER_MARGIN: Final = 1e-9
"""Relative slack of the step-time pruning rule (the bound is exact; the slack only keeps more)."""


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

    def recipe(self, base: Recipe) -> Recipe:
        return _core_recipe(base, self.micro_batch, self.recompute, self.offload, self.precision)

    def layout(self, dp: int, zero: int) -> Layout:
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


@dataclass(frozen=True, kw_only=True)
class Candidates:
    """Parallel arrays, one entry per candidate. ``core`` indexes ``cores``; ``acc`` indexes
    ``accelerators``."""

    acc: IntArray
    devices: IntArray
    dp: IntArray
    zero: IntArray
    core: IntArray

    def __len__(self) -> int:
        return int(self.acc.shape[0])

    def take(self, idx: IntArray | BoolArray) -> Candidates:
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


@dataclass(frozen=True, kw_only=True)
class BulkResult:
    """Per-candidate results (NaN where a candidate is invalid or a figure is unknown)."""

    invalid: IntArray  # 0 = valid, else an INVALID_* code
    dominated: BoolArray  # fits, but a variant with less offload fits too and is no slower
    slower: BoolArray  # fits, but its step-time lower bound exceeds another's at the same hardware
    per_device_bytes: FloatArray
    capacity_bytes: FloatArray
    weights_bytes: FloatArray
    gradients_bytes: FloatArray
    optimizer_bytes: FloatArray
    activations_bytes: FloatArray
    micro_batches: IntArray
    compute_s: FloatArray
    forward_s: FloatArray
    backward_s: FloatArray
    recompute_s: FloatArray
    exposed_tp_s: FloatArray
    exposed_ep_s: FloatArray
    exposed_cp_s: FloatArray
    pp_p2p_s: FloatArray
    exposed_dp_s: FloatArray
    bubble_s: FloatArray
    optimizer_s: FloatArray
    offload_s: FloatArray
    step_s: FloatArray
    tokens_per_s: FloatArray
    mfu: FloatArray
    time_s: FloatArray
    device_hours: FloatArray
    cost_usd: FloatArray
    energy_kwh: FloatArray

    @property
    def valid(self) -> BoolArray:
        return np.asarray(self.invalid == VALID)

    @property
    def fits(self) -> BoolArray:
        return np.asarray(self.valid & (self.per_device_bytes <= self.capacity_bytes))

    @property
    def feasible(self) -> BoolArray:
        """Fits and is not dominated: these have step time, throughput and cost."""
        return np.asarray(self.fits & ~self.dominated & ~self.slower)

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
_FSDP_FIELDS: Final = tuple(f for f in _STATE_FIELDS if f.startswith("fsdp_"))


@dataclass(frozen=True, kw_only=True)
class _Accel:
    """Per-accelerator constants of the time model, derived exactly as ``timing.step_time`` does."""

    acc: Accelerator
    dtype: str
    peak: float
    bw: float
    eta_attn: float
    kappa: float
    up: tuple[float, float, float]  # bandwidth, latency, efficiency
    out: tuple[float, float, float] | None
    domain: int
    host_bw: float
    price: float | None
    tdp_w: float | None


def accel_constants(acc: Accelerator, recipe: Recipe, price: float | None) -> _Accel:
    """The preamble of ``timing.step_time`` for one accelerator and precision."""
    kappa = calibrated_kappa(acc.name)
    if kappa is None:
        kappa = 1.0
    eff = get_efficiency(acc.name)
    dtype = recipe.gemm_dtype if recipe.gemm_dtype != "tf32" or acc.supports("tf32") else "fp32"
    peak = acc.peak_flops_per_s(dtype)
    bw = acc.memory_bandwidth_bytes_per_s * eff.memory_bandwidth_efficiency
    if recipe.attention == "flash":
        eta_attn, _ = flash_attention_efficiency(acc.name)
    else:
        eta_attn = eff.gemm_max(dtype) * EAGER_ATTENTION_EFFICIENCY_FACTOR
    eta_attn = min(eta_attn, eff.gemm_max(dtype))
    # Two devices are enough to read the links; the domain size comes from the catalog.
    net = network_from_system(System(accelerator=acc, num_devices=max(2, acc.scale_up.domain_size)))
    up = (net.scale_up.bandwidth_bytes_per_s, net.scale_up.latency_s, net.scale_up.efficiency)
    out = (
        None
        if net.scale_out is None
        else (net.scale_out.bandwidth_bytes_per_s, net.scale_out.latency_s, net.scale_out.efficiency)
    )
    host = acc.host_link
    return _Accel(
        acc=acc,
        dtype=dtype,
        peak=peak,
        bw=bw,
        eta_attn=eta_attn,
        kappa=kappa,
        up=up,
        out=out,
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
    ) -> None:
        if base.global_batch is None:
            raise TrainplanError("global_batch", "the planner needs a fixed global batch")
        self.model = model
        self.base = base
        self.cores = cores
        self.accelerators = accelerators
        self.prices = prices
        self.pue = pue
        self._state_cache: dict[tuple[object, ...], tuple[float, ...] | None] = {}
        self._layout_cache: dict[tuple[object, ...], Layout] = {}
        self._stage_cache: dict[int, list[tuple[StageFlops, tuple[bool, ...]]]] = {}
        self._eta_cache: dict[int, FloatArray] = {}
        self._eta_index: dict[tuple[object, ...], int] = {}
        self._eta_keys: list[tuple[tuple[Any, ...], tuple[int, ...], Layout]] = []
        self._stage_recipes: dict[tuple[object, ...], Recipe] = {}
        self._kinds: dict[tuple[int, ...], tuple[bool, ...]] = {}
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
        self._time_tab = np.full((5, len(accelerators), len(self._fkeys)), np.nan)

    def _layout(self, dp: int, tp: int, pp: int, cp: int, ep: int, zero: int, *rest: object) -> Layout:
        """Layouts are validated on construction; the tables reuse them."""
        key = (dp, tp, pp, cp, ep, zero, *rest)
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
                )
            else:
                got = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero)
            self._layout_cache[key] = got
        return got

    def _core_layout(self, core: Core) -> Layout:
        """``core.layout(core.ep, 0)``: the smallest data-parallel degree ``ep`` allows."""
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
        )

    # ----- memory tables ------------------------------------------------------------------
    def _states(self, core: Core, zero: int, stage: int) -> tuple[float, ...] | None:
        """(A_f, B_f for each state field..., trainable, params_on_device): field = A + B/dp."""
        key = (core.tp, core.pp, core.cp, core.ep, core.precision, core.offload, zero, stage)
        if key in self._state_cache:
            return self._state_cache[key]
        recipe = core.recipe(self.base)
        dp1 = core.ep
        values: list[list[float]] = []
        trainable = params = 0.0
        try:
            for dp in (dp1, 2 * dp1):
                layout = self._layout(dp, core.tp, core.pp, core.cp, core.ep, zero)
                dev = device_params(self.model, layout, stage, recipe.lora)
                st = _model_states(self.model, recipe, layout, dev)
                values.append([float(getattr(st, f)) for f in _STATE_FIELDS])
                trainable, params = float(st.trainable), float(dev.total)
        except TrainplanError:
            self._state_cache[key] = None
            return None
        out: list[float] = []
        for f1, f2 in zip(values[0], values[1], strict=True):
            b = (f1 - f2) * 2.0 * dp1
            a = f1 - b / dp1
            out += [a, b]
        result = (*out, trainable, params)
        self._state_cache[key] = result
        return result

    def _build_core_tables(self) -> None:
        n = len(self.cores)
        nf = len(_STATE_FIELDS)
        big = 1 << 40
        model = self.model
        no_ib = replace(self.base, optimizer_in_backward=False)
        # Distinct keys: model states depend on (tp, pp, cp, ep, precision, offload); saved
        # activations on every layout and recipe choice but the offload. Each is computed once.
        skeys: dict[tuple[object, ...], int] = {}
        akeys: dict[tuple[object, ...], int] = {}
        s_of_core = np.empty(n, dtype=np.int64)
        a_of_core = np.empty(n, dtype=np.int64)
        s_rep: list[Core] = []
        a_rep: list[Core] = []
        for c, core in enumerate(self.cores):
            sk = (core.tp, core.pp, core.cp, core.ep, core.precision, core.offload)
            i = skeys.get(sk)
            if i is None:
                i = skeys[sk] = len(s_rep)
                s_rep.append(core)
            s_of_core[c] = i
            ak = (
                core.tp,
                core.pp,
                core.cp,
                core.ep,
                core.sequence_parallel,
                core.micro_batch,
                core.recompute,
                core.precision,
                core.pp_schedule,
                core.virtual_stages,
            )
            j = akeys.get(ak)
            if j is None:
                j = akeys[ak] = len(a_rep)
                a_rep.append(core)
            a_of_core[c] = j
        # states[key, zero, stage(0=first, 1=last), 2*nf + 2]
        s_tab = np.full((len(s_rep), 4, 2, 2 * nf + 2), np.nan)
        for i, core in enumerate(s_rep):
            for z in ZERO_STAGES:
                for k, stage in enumerate((0, core.pp - 1)):
                    s = self._states(core, z, stage)
                    if s is not None:
                        s_tab[i, z, k] = s
        # activations = a1 + slope·(inflight − 1): linear in the in-flight micro-batches
        a_tab = np.zeros((len(a_rep), 2, 7))
        recipes: dict[tuple[object, ...], Recipe] = {}
        for j, core in enumerate(a_rep):
            rkey = (core.micro_batch, core.recompute, core.precision)
            recipe = recipes.get(rkey)
            if recipe is None:
                recipe = recipes[rkey] = replace(core.recipe(no_ib), offload="none")
            layout = self._core_layout(core)
            done: dict[int, tuple[float, ...]] = {}
            for k, stage in enumerate((0, core.pp - 1)):
                got = done.get(stage)
                if got is None:
                    hd = float(inflight_microbatches(layout, stage, big))
                    one = _stage_breakdown(model, recipe, layout, stage, float("inf"), 1)
                    slope = 0.0
                    if hd > 1.0:
                        many = _stage_breakdown(model, recipe, layout, stage, float("inf"), big)
                        slope = (many.activations_bytes - one.activations_bytes) / (hd - 1.0)
                    loss_t = logits_bytes(model, recipe, layout)[1] if stage == core.pp - 1 else 0.0
                    got = (
                        one.activations_bytes,
                        slope,
                        hd,
                        one.logits_bytes,
                        one.transient_bytes,
                        loss_t,
                        one.last_layer_activations_bytes,
                    )
                    done[stage] = got
                a_tab[j, k] = got
        states = s_tab[s_of_core]
        acts = a_tab[a_of_core]
        act1, act_slope, held, logits, transient, loss_t_tab, last_layer = (
            np.ascontiguousarray(acts[:, :, q]) for q in range(7)
        )
        flat = states.reshape(n * 4, 2, 2 * nf + 2)
        self._states_bad = np.isnan(flat[:, 0, 0])
        flat = np.where(np.isnan(flat), 0.0, flat)
        self._sA = [[np.ascontiguousarray(flat[:, k, 2 * j]) for k in (0, 1)] for j in range(nf)]
        self._sB = [[np.ascontiguousarray(flat[:, k, 2 * j + 1]) for k in (0, 1)] for j in range(nf)]
        self._s_trainable = np.ascontiguousarray(flat[:, :, 2 * nf])
        self._s_params = np.ascontiguousarray(flat[:, :, 2 * nf + 1])
        # the same core one offload step lower (optimizer -> none, optimizer+params -> optimizer)
        index = {c: i for i, c in enumerate(self.cores)}
        lower: dict[str, Offload] = {"optimizer": "none", "optimizer+params": "optimizer"}
        self._c_twin = np.array(
            [
                index.get(replace(c, offload=lower[c.offload]), -1) if c.offload in lower else -1
                for c in self.cores
            ],
            dtype=np.int64,
        )
        self._act1 = act1
        self._loss_transient = loss_t_tab
        self._act_slope = act_slope
        self._held = held
        self._logits = logits
        self._transient = transient
        self._last_layer = last_layer
        ints = {
            name: np.array([getattr(c, name) for c in self.cores], dtype=np.int64)
            for name in ("tp", "pp", "cp", "ep", "micro_batch", "virtual_stages")
        }
        self._c_int = ints
        fkeys: dict[tuple[object, ...], int] = {}
        reps: list[Core] = []
        fk_of_core: list[int] = []
        fk_first: list[int] = []
        for co in self.cores:
            fkey: tuple[object, ...] = (
                co.tp,
                co.pp,
                co.cp,
                co.ep,
                co.sequence_parallel,
                co.micro_batch,
                co.recompute,
                co.precision,
                co.virtual_stages,
            )
            if fkey not in fkeys:
                fkeys[fkey] = len(reps)
                fk_first.append(len(fk_of_core))
                reps.append(
                    replace(
                        co, offload="none", pp_schedule="interleaved" if co.virtual_stages > 1 else "1f1b"
                    )
                )
            fk_of_core.append(fkeys[fkey])
        self._fkeys = reps
        self._fkey_core = np.array(fk_first, dtype=np.int64)  # a core of each compute key
        self._c_fkey = np.array(fk_of_core, dtype=np.int64)
        self._c_sp = np.array([co.sequence_parallel for co in self.cores], dtype=bool)
        self._c_full = np.array([co.recompute == "full" for co in self.cores], dtype=bool)
        self._c_rc_any = np.array([co.recompute != "none" for co in self.cores], dtype=bool)
        self._c_off = np.array(
            [("none", "optimizer", "optimizer+params").index(co.offload) for co in self.cores]
        )
        sched = {"1f1b": 0, "interleaved": 1, "zb": 2}
        self._c_sched = np.array([sched[co.pp_schedule] for co in self.cores], dtype=np.int64)
        wb = [float(BYTES_PER_ELEMENT[co.recipe(self.base).weight_dtype]) for co in self.cores]
        self._c_e = np.array(wb)
        self._c_update = np.array([optimizer_update_bytes(1.0, co.recipe(self.base)) for co in self.cores])
        # Trainable (PEFT: adapters over all stages, tp = 1 as step_time counts them) per pp.
        tdense = []
        adapters: dict[int, float] = {}
        for co in self.cores:
            if self.base.is_peft:
                if co.pp not in adapters:
                    adapters[co.pp] = float(
                        sum(
                            device_params(model, Layout(pp=co.pp), st, self.base.lora).lora_adapters
                            for st in range(co.pp)
                        )
                    )
                tdense.append(adapters[co.pp])
            else:
                tdense.append(self._dense)
        self._c_tdense = np.array(tdense)
        self._c_texpert = np.array([0.0 if self.base.is_peft else self._expert for _ in self.cores])
        # Model FLOPs and tokens per step (fixed global batch: same for every layout).
        mf_cache: dict[tuple[str, str, int], float] = {}
        mf = []
        for co in self.cores:
            mkey = (co.precision, co.recompute, co.micro_batch)
            if mkey not in mf_cache:
                mf_cache[mkey] = step_flops(model, co.recipe(self.base), None).model_flops
            mf.append(mf_cache[mkey])
        self._c_model_flops = np.array(mf)
        self._tokens_per_step = float(self.base.global_batch or 0) * self.base.seq_len

    # ----- time tables ----------------------------------------------------------------------
    def _accel(self, a: int, p: int) -> _Accel:
        key = (a, p)
        if key not in self._accel_cache:
            recipe = self.cores[self._prec_core[p]].recipe(self.base)
            self._accel_cache[key] = accel_constants(self.accelerators[a], recipe, self.prices[a])
        return self._accel_cache[key]

    def _accel_arrays(self, acc: IntArray, prec: IntArray) -> dict[str, FloatArray]:
        """Accelerator constants as (accelerator, precision) tables, filled for the pairs used."""
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
                ("domain", 1.0),
                ("host_bw", 0.0),
                ("price", np.nan),
                ("tdp", np.nan),
                ("done", 0.0),
            ):
                tabs[name] = np.full((na, npr), fill)
        mark = np.zeros(na * npr, dtype=bool)
        mark[acc * npr + prec] = True
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
            tabs["domain"][a, p] = ax.domain
            tabs["host_bw"][a, p] = ax.host_bw
            if ax.price is not None:
                tabs["price"][a, p] = ax.price
            if ax.tdp_w is not None:
                tabs["tdp"][a, p] = ax.tdp_w
            tabs["done"][a, p] = 1.0
        return tabs

    def _time_tables(self, acc: IntArray, fkey: IntArray) -> FloatArray:
        """Per-micro-batch times of the busiest stage (``timing.step_time``): ``[t_f, t_b, t_r,
        a_f, a_b]`` as (accelerator, compute key) tables, filled for the pairs used.

        Keyed by the compute key of each core (offload and the pipeline schedule do not change
        the work of a micro-batch; the number of virtual stages does). All stages of all compute
        keys are done at once on (stage, accelerator) arrays: ``timing._pass_time_s`` itself runs
        on them (the same IEEE operations as the scalar call, element by element), and the
        busiest stage is the first maximum, as ``max()`` in ``step_time``.
        """
        na, nk = len(self.accelerators), len(self._fkeys)
        tab = self._time_tab
        mark = np.zeros(nk * na, dtype=bool)
        mark[fkey * na + acc] = True
        pairs = np.flatnonzero(mark)
        pairs = pairs[np.isnan(tab[0].T.reshape(-1)[pairs])]
        if pairs.size == 0:
            return tab
        fks, accs = np.divmod(pairs, na)
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
        bw = np.array([ax.bw for ax in axs])[None, :]
        eta_attn = np.array([ax.eta_attn for ax in axs])[None, :]
        kappa = np.array([ax.kappa for ax in axs])[None, :]
        # one row per distinct stage of each compute key, in order
        rows: list[tuple[StageFlops, int]] = []
        starts: list[int] = []
        for fk in k_ids.tolist():
            starts.append(len(rows))
            core = self._fkeys[fk]
            for st, kinds in self._stages(fk):
                rows.append((st, self._eta_row(core, st.layers, kinds)))
        eta_rows = np.array([r for _, r in rows], dtype=np.int64)
        used = np.unique(eta_rows)
        eta = np.stack([self._eta_values(e, a_ids) for e in used.tolist()])[np.searchsorted(used, eta_rows)]

        def cost(name: str) -> _ArrayCost:
            passes = [getattr(st, name) for st, _ in rows]
            return _ArrayCost(
                gemm_flops=np.array([c.gemm_flops for c in passes])[:, None],
                attention_flops=np.array([c.attention_flops for c in passes])[:, None],
                memory_bytes=np.array([c.memory_bytes for c in passes])[:, None],
            )

        fwd, bwd, rec = cost("forward"), cost("backward"), cost("recompute")
        dequant = np.array([st.dequant_bytes for st, _ in rows])[:, None]
        f = _pass(fwd, peak, eta, eta_attn, bw) / kappa
        b = (_pass(bwd, peak, eta, eta_attn, bw) + dequant / bw) / kappa
        r = _pass(rec, peak, eta, eta_attn, bw) / kappa
        total = f + b + r
        a_f = fwd.attention_flops / (peak * eta_attn) + 0.0 * f
        a_b = bwd.attention_flops / (peak * eta_attn) + 0.0 * f
        st_idx = np.array(starts, dtype=np.int64)
        top = np.maximum.reduceat(total, st_idx, axis=0)
        seg = np.repeat(np.arange(st_idx.size), np.diff(np.r_[st_idx, len(rows)]))
        row_no = np.broadcast_to(np.arange(len(rows))[:, None], total.shape)
        first = np.minimum.reduceat(np.where(total == top[seg], row_no, len(rows)), st_idx, axis=0)
        cols = np.broadcast_to(np.arange(a_ids.size)[None, :], first.shape)
        for j, x in enumerate((f, b, r, a_f, a_b)):
            tab[j][np.ix_(a_ids, k_ids)] = x[first, cols].T

    def _eta_row(self, core: Core, layers: tuple[int, ...], kinds: tuple[bool, ...]) -> int:
        """Index of the (stage kinds, tokens, tp, ep, precision) key of ``_stage_gemm_efficiency``."""
        tokens = core.micro_batch * (self.base.seq_len // core.cp)
        key = (kinds, tokens, core.tp, core.ep, self._prec_index[core.precision])
        i = self._eta_index.get(key)
        if i is None:
            i = self._eta_index[key] = len(self._eta_keys)
            self._eta_keys.append((key, layers, self._core_layout(core)))
        return i

    def _eta_values(self, e: int, accs: IntArray) -> FloatArray:
        """``timing._stage_gemm_efficiency`` of eta key ``e`` on each accelerator of ``accs``."""
        (_, tokens, _, _, p), layers, layout = self._eta_keys[e]
        row = self._eta_cache.get(e)
        if row is None:
            row = self._eta_cache[e] = np.full(len(self.accelerators), np.nan)
        for a in accs[np.isnan(row[accs])].tolist():
            ax = self._accel(a, p)
            row[a] = _stage_gemm_efficiency(
                self.model, layers, tokens, layout, get_efficiency(ax.acc.name), ax.dtype
            )
        return np.asarray(row[accs])

    def _stages(self, fk: int) -> list[tuple[StageFlops, tuple[bool, ...]]]:
        """The distinct stages of a compute key (stages with the same work cost the same; the
        first of equal ones is kept, as ``max`` keeps the first maximum)."""
        cached = self._stage_cache.get(fk)
        if cached is None:
            core = self._fkeys[fk]
            rkey = (core.micro_batch, core.recompute, core.precision, core.ep)
            recipe = self._stage_recipes.get(rkey)
            if recipe is None:
                recipe = replace(core.recipe(self.base), global_batch=core.micro_batch * core.ep)
                recipe = self._stage_recipes[rkey] = replace(recipe, offload="none")
            seen: set[tuple[object, ...]] = set()
            cached = []
            for st in device_flops(self.model, recipe, self._core_layout(core)):
                kinds = self._kinds.get(st.layers)
                if kinds is None:
                    kinds = tuple(dict.fromkeys(self.model.is_moe_layer(i) for i in st.layers))
                    self._kinds[st.layers] = kinds
                key = (st.forward, st.backward, st.recompute, st.dequant_bytes, kinds)
                if key in seen:
                    continue
                seen.add(key)
                cached.append((st, kinds))
            self._stage_cache[fk] = cached
        return cached

    # ----- evaluation -----------------------------------------------------------------------
    def evaluate(self, cand: Candidates, *, prune_slower: bool = False) -> BulkResult:
        """Memory of every candidate; step time, throughput and cost of those that fit.

        ``prune_slower``: skip the time of candidates that provably cannot be the fastest at
        their (accelerator, device count) — their step-time lower bound exceeds the step time
        of another candidate there (``BulkResult.slower``, see ``_prune_slower``).
        """
        n = len(cand)
        devices = cand.devices
        acc = cand.acc

        # --- memory (memory._stage_breakdown / memory_breakdown) -------------------------
        # Memory depends on (core, ZeRO stage, dp) only, not on the accelerator: it is computed
        # once per distinct key and gathered (the catalog shares device counts, so most
        # candidates repeat a key).
        key, u_core, u_zero, u_dp, twin_key = self._memory_keys(cand)
        mem = self._memory(u_core, u_zero, u_dp)
        u_invalid, u_m = mem["invalid"], mem["m"]
        invalid = u_invalid[key]
        m = u_m[key]
        capacity = np.array([a.memory_bytes for a in self.accelerators])[acc]
        per_device = mem["per_device"][key]

        # --- validity that needs the network, and dominance (before any time is computed) -------
        dom_acc = np.array([ac.scale_up.domain_size for ac in self.accelerators], dtype=np.int64)[acc]
        no_out = np.array([ac.scale_out is None for ac in self.accelerators], dtype=bool)[acc]
        net_bad = (devices > np.minimum(dom_acc, devices)) & no_out
        invalid[net_bad & (invalid == VALID)] = INVALID_NETWORK
        fits = (invalid == VALID) & (per_device <= capacity)
        dominated = self._dominated(cand, fits, twin_key, u_invalid, mem["per_device"], capacity, net_bad)
        sub = np.nonzero(fits & ~dominated)[0]
        slower = np.zeros(n, dtype=bool)
        if prune_slower and sub.size:
            sub, cut = self._prune_slower(cand, sub, m, key, mem)
            slower[cut] = True
        tm = self._time(cand.take(sub), m[sub], mem["trainable"][key[sub]], mem["params_dev"][key[sub]])

        def full(x: FloatArray) -> FloatArray:
            out = np.full(n, np.nan)
            out[sub] = x
            return out

        bad = invalid != VALID

        def gather(name: str) -> FloatArray:
            x = np.array(mem[name][key], dtype=np.float64)
            x[bad] = np.nan
            return x

        return BulkResult(
            invalid=invalid,
            dominated=dominated,
            slower=slower,
            per_device_bytes=gather("per_device"),
            capacity_bytes=capacity,
            weights_bytes=gather("weights"),
            gradients_bytes=gather("gradients"),
            optimizer_bytes=gather("optimizer"),
            activations_bytes=gather("activations"),
            micro_batches=m,
            **{k: full(v) for k, v in tm.items()},
        )

    def _memory_keys(self, cand: Candidates) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray]:
        """Index of each candidate's (core, zero, dp) among the distinct ones, the distinct
        ones' columns, and the key of its one-offload-step-lower twin (-1: none)."""
        dpi = cand.dp
        if len(cand) == 0:
            e = np.zeros(0, dtype=np.int64)
            return e, e, e, e, e
        present = np.bincount(dpi)
        dps = np.flatnonzero(present)
        lut = np.zeros(present.size, dtype=np.int64)
        lut[dps] = np.arange(dps.size)
        ndp = dps.size
        full_key = (cand.core * 4 + cand.zero) * ndp + lut[dpi]
        mark = np.zeros(len(self.cores) * 4 * ndp, dtype=bool)
        mark[full_key] = True
        ukeys = np.flatnonzero(mark)
        pos = np.full(mark.size, -1, dtype=np.int64)
        pos[ukeys] = np.arange(ukeys.size)
        twin = self._c_twin[cand.core]
        twin_full = (np.maximum(twin, 0) * 4 + cand.zero) * ndp + lut[dpi]
        twin_key = np.where(twin >= 0, pos[twin_full], -1)
        return (
            pos[full_key],
            ukeys // (4 * ndp),
            (ukeys // ndp) % 4,
            dps[ukeys % ndp],
            twin_key,
        )

    def _memory(self, core: IntArray, zero: IntArray, dpi: IntArray) -> dict[str, Any]:
        """Memory peak and its terms of the worse of the first and the last pipeline stage,
        for (core, zero, dp) keys; ``invalid`` holds the reasons that do not need the network."""
        n = core.size
        dp = dpi.astype(np.float64)
        mb = self._c_int["micro_batch"][core]
        invalid = np.zeros(n, dtype=np.int64)

        gb = int(self.base.global_batch or 0)
        per_step = dpi * mb
        bad_batch = gb % np.maximum(per_step, 1) != 0
        invalid[bad_batch] = INVALID_BATCH
        m = np.where(bad_batch, 1, gb // np.maximum(per_step, 1))
        mf = m.astype(np.float64)
        if self.base.optimizer_in_backward:
            invalid[(m > 1) & (invalid == 0)] = INVALID_OPT_IN_BWD

        cz = core * 4 + zero
        invalid[self._states_bad[cz] & (invalid == 0)] = INVALID_STATES

        def field(k: int, name: str) -> FloatArray:
            j = _STATE_FIELDS.index(name)
            return np.asarray(self._sA[j][k][cz] + self._sB[j][k][cz] / dp)

        capacity = np.full(n, np.inf)  # the peak does not depend on the capacity
        grads_live = (m > 1) | self.base.optimizer_in_backward
        stage_vals = []
        for k in (0, 1):
            infl = np.minimum(self._held[core, k], mf)
            act = self._act1[core, k] + self._act_slope[core, k] * (infl - 1.0)
            # memory._stage_breakdown: max(loss backward, recomputed layer, step in backward); the
            # first two come from the ZeRO-0 breakdown. The FSDP2 moments are their own phases.
            transient = np.maximum(self._transient[core, k], field(k, "step_in_backward"))
            values = {
                "weights_bytes": field(k, "weights"),
                "gradients_bytes": field(k, "gradients"),
                "optimizer_bytes": field(k, "optimizer"),
                "master_weights_bytes": field(k, "master"),
                "quant_constants_bytes": field(k, "quant_constants"),
                "activations_bytes": act,
                "logits_bytes": self._logits[core, k],
                "transient_bytes": transient,
                "optimizer_temporaries_bytes": field(k, "optimizer_temp"),
                "host_bytes": field(k, "host"),
                "paged_optimizer_bytes": field(k, "paged"),
                "last_layer_activations_bytes": self._last_layer[core, k],
                "loss_forward_bytes": 0.75 * self._loss_transient[core, k],
            }
            values |= {f"{name}_bytes": field(k, name) for name in _FSDP_FIELDS}
            per_dev = np.where(
                grads_live,
                _array_memory(values, capacity, grads_live=True).per_device_bytes,
                _array_memory(values, capacity, grads_live=False).per_device_bytes,
            )
            stage_vals.append(
                (
                    per_dev,
                    values["weights_bytes"],
                    values["gradients_bytes"],
                    values["optimizer_bytes"],
                    act,
                    self._s_trainable[cz, k],
                    self._s_params[cz, k],
                )
            )
        last_worse = stage_vals[1][0] > stage_vals[0][0]
        pick = [np.where(last_worse, b, a) for a, b in zip(stage_vals[0], stage_vals[1], strict=True)]
        names = ("per_device", "weights", "gradients", "optimizer", "activations", "trainable", "params_dev")
        out: dict[str, Any] = dict(zip(names, pick, strict=True))
        out["invalid"] = invalid
        out["m"] = m
        return out

    def _dominated(
        self,
        cand: Candidates,
        fits: BoolArray,
        twin_key: IntArray,
        u_invalid: IntArray,
        u_per_device: FloatArray,
        capacity: FloatArray,
        net_bad: BoolArray,
    ) -> BoolArray:
        """Offload variants whose same layout one offload step lower fits: never faster.

        ``timing.step_time`` charges offload ``transfers + update / HOST_MEMORY_BYTES_PER_S`` in
        place of ``update / (HBM bandwidth)`` and adds the weight streaming of parameter offload;
        every other term is the same. Where the HBM bandwidth is at least HOST_MEMORY_BYTES_PER_S the
        lower variant is at least as fast at the same price, so the offload variant is dominated.
        The twin must be a candidate itself (same accelerator, devices, ZeRO stage) and fit.
        """
        n = len(cand)
        fast_hbm_acc = np.array(
            [
                ac.memory_bandwidth_bytes_per_s * get_efficiency(ac.name).memory_bandwidth_efficiency
                >= HOST_MEMORY_BYTES_PER_S
                for ac in self.accelerators
            ],
            dtype=bool,
        )
        sel = np.nonzero(fits & (twin_key >= 0) & fast_hbm_acc[cand.acc])[0]
        out = np.zeros(n, dtype=bool)
        if sel.size == 0:
            return out
        # is the twin a candidate? (accelerator, devices, zero, core) marked on a dense grid
        present = np.bincount(cand.devices)
        devs = np.flatnonzero(present)
        lut = np.zeros(present.size, dtype=np.int64)
        lut[devs] = np.arange(devs.size)
        nc = len(self.cores)
        group = (cand.acc * devs.size + lut[cand.devices]) * 4 + cand.zero
        grid = np.zeros(len(self.accelerators) * devs.size * 4 * nc, dtype=bool)
        grid[group * nc + cand.core] = True
        g = group[sel]
        tw = self._c_twin[cand.core[sel]]
        exists = grid[g * nc + tw]
        tk = twin_key[sel]
        twin_fits = exists & (u_invalid[tk] == VALID) & ~net_bad[sel] & (u_per_device[tk] <= capacity[sel])
        out[sel] = twin_fits
        return out

    def _prune_slower(
        self, cand: Candidates, sub: IntArray, m: IntArray, key: IntArray, mem: dict[str, Any]
    ) -> tuple[IntArray, IntArray]:
        """Split ``sub`` (candidates that fit, not dominated) into those that may be the fastest
        at their (accelerator, device count) and those that provably are not.

        Rule: ``bound_only`` gives a lower bound of each candidate's step time (compute, bubble,
        optimizer and offload terms; the exposed collectives are left out). The exact step time
        of the ``PROBES_PER_GROUP`` candidates with the smallest bounds at each (accelerator,
        devices) is computed; a candidate whose bound exceeds the best of them (by more than
        ``SLOWER_MARGIN``, relative) is slower than that probe on the same hardware, hence also
        dearer (cost is devices × time × price), and is never the plan chosen there. Ties are kept.
        """
        c = cand.take(sub)
        ms = m[sub]
        tr = mem["trainable"][key[sub]]
        pd = mem["params_dev"][key[sub]]
        bound = self._time(c, ms, tr, pd, bound_only=True)["bound"]
        k = sub.size
        group = c.acc * (int(c.devices.max()) + 1) + c.devices
        order = np.lexsort((np.arange(k), bound, group))
        gs = group[order]
        first = np.r_[True, gs[1:] != gs[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(k), 0))
        gid = np.empty(k, dtype=np.int64)
        gid[order] = np.cumsum(first) - 1
        probe = order[(np.arange(k) - start) < PROBES_PER_GROUP]
        step = self._time(c.take(probe), ms[probe], tr[probe], pd[probe])["step_s"]
        best = np.full(int(first.sum()), np.inf)
        np.fmin.at(best, gid[probe], step)
        keep = ~(bound > best[gid] * (1.0 + SLOWER_MARGIN))
        return sub[keep], sub[~keep]

    def _time(
        self,
        cand: Candidates,
        m: IntArray,
        trainable: FloatArray,
        params_dev: FloatArray,
        *,
        bound_only: bool = False,
    ) -> dict[str, FloatArray]:
        """Step time, throughput and run cost of valid candidates that fit.

        ``bound_only``: only ``{"bound": ...}``, the sum of the step's compute, bubble, optimizer
        and offload terms in the order ``step_s`` adds them; every term left out (exposed
        collectives) is non-negative, and rounded addition is monotone, so ``bound <= step_s``
        exactly.
        """
        n = len(cand)
        core = cand.core
        zero = cand.zero
        dpi = cand.dp
        devices = cand.devices
        acc = cand.acc
        tp = self._c_int["tp"][core]
        pp = self._c_int["pp"][core]
        cp = self._c_int["cp"][core]
        ep = self._c_int["ep"][core]
        mb = self._c_int["micro_batch"][core]
        v = self._c_int["virtual_stages"][core]
        mf = m.astype(np.float64)
        # --- accelerator constants and per-micro-batch compute --------------------------------
        fk = self._c_fkey[core]
        tt = self._time_tables(acc, fk)
        t_f, t_b, t_r = tt[0][acc, fk], tt[1][acc, fk], tt[2][acc, fk]
        ac = self._accel_arrays(acc, self._c_prec[core])
        pi = self._c_prec[core]

        def col(name: str) -> FloatArray:
            return np.asarray(ac[name][acc, pi])

        bw = col("bw")
        host_bw = col("host_bw")
        shard_size = dpi * cp
        full = self._c_full[core]

        # --- bubble, optimizer, offload (timing.step_time) --------------------------------------
        t_mb = t_f + t_b + t_r
        sched = self._c_sched[core]
        p1 = (pp - 1).astype(np.float64)
        # Lower bound of the bubble: compute only (the exact bubble below adds communication).
        bubble = np.where(sched == 1, p1 * t_mb / v, np.where(sched == 2, p1 * t_mb / 3.0, p1 * t_mb))
        bubble = np.where(pp == 1, 0.0, bubble)
        trained_shard = trainable / np.where(zero >= 1, shard_size, 1)
        update = trained_shard * self._c_update[core]
        off = self._c_off[core]
        optimizer_s = np.where(off == 0, update / bw, 0.0)
        shard_div = np.maximum(1, shard_size)
        grads_out = trainable * 2.0 / shard_div
        has_host = host_bw > 0
        safe_host = np.where(has_host, host_bw, 1.0)
        transfer = np.where(has_host, (grads_out + grads_out) / safe_host, 0.0)
        offload_s = transfer + update / HOST_MEMORY_BYTES_PER_S
        wts = params_dev * 2.0 / shard_div
        passes = np.where(full, 3, 2)
        extra = np.maximum(0.0, mf * passes * wts / safe_host - mf * (t_f + t_b))
        offload_s = np.where((off == 2) & has_host, offload_s + extra, offload_s)
        offload_s = np.where(off == 0, 0.0, offload_s)

        forward_s = mf * t_f
        backward_s = mf * t_b
        recompute_s = mf * t_r
        if bound_only:
            return {"bound": 0 + forward_s + backward_s + recompute_s + bubble + optimizer_s + offload_s}

        a_f, a_b = tt[3][acc, fk], tt[4][acc, fk]
        peak_fl = col("peak")
        dom_cap = col("domain").astype(np.int64)
        price = col("price")
        tdp = col("tdp")
        up_bw, up_lat, up_eff = col("up_bw"), col("up_lat"), col("up_eff")
        out_bw, out_lat, out_eff = col("out_bw"), col("out_lat"), col("out_eff")

        # --- collectives (comm.step_collectives on comm.group_placement) ----------------------
        d = np.minimum(dom_cap, devices)
        out_bw = np.where(np.isnan(out_bw), 1.0, out_bw)
        net = _Net(up_bw, up_lat, up_eff, out_bw, out_lat, out_eff)

        e = self._c_e[core]
        w_bytes = BYTES_PER_ELEMENT["nf4"] if self.base.method == "qlora" else e
        shard = _place(shard_size, tp, d)
        mi = m
        zero_f = zero
        t_dense = self._c_tdense[core]
        t_expert = self._c_texpert[core]
        dp_colls: list[tuple[FloatArray, str, BoolArray]] = []  # (time, overlap, per-micro-batch)

        def data_parallel(pl: _Placement, param_b: FloatArray, grad_b: FloatArray, active: BoolArray) -> None:
            on = active & (pl.size > 1)
            one = np.ones(n, dtype=np.int64)
            # zero 0: all-reduce of gradients once per step, behind backward
            z0 = on & (zero_f == 0)
            dp_colls.append((net.time("all_reduce", grad_b, pl) * 1 * z0, "backward", one >= mi))
            z12 = on & ((zero_f == 1) | (zero_f == 2))
            rs_calls = np.where(zero_f == 1, 1, mi)
            dp_colls.append(
                (net.time("reduce_scatter", grad_b, pl) * rs_calls * z12, "backward", rs_calls >= mi)
            )
            dp_colls.append((net.time("all_gather", param_b, pl) * 1 * z12, "none", one >= mi))
            z3 = on & (zero_f == 3)
            dp_colls.append((net.time("all_gather", param_b, pl) * mi * z3, "forward", mi >= mi))
            dp_colls.append((net.time("all_gather", param_b, pl) * mi * z3, "backward", mi >= mi))
            dp_colls.append((net.time("reduce_scatter", grad_b, pl) * mi * z3, "backward", mi >= mi))

        tpp = (tp * pp).astype(np.float64)
        data_parallel(
            shard,
            self._dense / tpp * w_bytes,
            t_dense / tpp * e,
            np.ones(n, dtype=bool),
        )
        if self._expert:
            xdp = _place(shard_size // ep, tp * ep, d)
            tppe = (tp * pp * ep).astype(np.float64)
            data_parallel(xdp, self._expert / tppe * w_bytes, t_expert / tppe * e, np.ones(n, dtype=bool))

        model = self.model
        b = mb.astype(np.float64)
        s = float(self.base.seq_len)
        h = float(model.hidden_size)
        act_b = b * (s / cp) * h * e
        layers = -(-model.num_layers // pp)
        tp_pl = _place(tp, np.ones(n, dtype=np.int64), d)
        per_pass = 2 * layers * mi
        sp = self._c_sp[core]
        tp_on = (tp > 1) & (layers > 0)
        ag = net.time("all_gather", act_b, tp_pl) * per_pass
        rs = net.time("reduce_scatter", act_b, tp_pl) * per_pass
        ar = net.time("all_reduce", act_b, tp_pl) * per_pass
        # forward, backward (+ re-gather with SP), recompute (full only); summed in that order
        tp_s = np.zeros(n)
        tp_s = tp_s + np.where(sp, ag, 0.0) + np.where(sp, rs, 0.0) + np.where(sp, 0.0, ar)
        tp_s = (
            tp_s
            + np.where(sp, ag, 0.0)
            + np.where(sp, rs, 0.0)
            + np.where(sp, ag, 0.0)
            + np.where(sp, 0.0, ar)
        )
        tp_s = (
            tp_s + np.where(full & sp, ag, 0.0) + np.where(full & sp, rs, 0.0) + np.where(full & ~sp, ar, 0.0)
        )
        tp_s = np.where(tp_on, tp_s, 0.0)

        pp_pl = _place(pp, tp * cp * dpi, d)
        pp_s = np.where(pp > 1, net.time("send_recv", act_b / tp, pp_pl) * (2 * v * mi), 0.0)

        ep_s = np.zeros(n)
        if model.moe is not None:
            moe_layers = -(-model.num_moe_layers // pp)
            local_tokens = b * s / cp / np.where(sp, tp, 1)
            routed = local_tokens * model.moe.top_k * h * e * 1.0
            ep_pl = _place(ep, tp, d)
            one_pass = net.time("all_to_all", routed, ep_pl) * (2 * moe_layers * mi)
            ep_s = np.where(full, one_pass + one_pass + one_pass, one_pass + one_pass)
            ep_s = np.where((ep > 1) & (moe_layers > 0), 0.0 + ep_s, 0.0)

        cp_pl = _place(cp, tp, d)
        kv_local = np.maximum(model.num_kv_heads / tp, 1.0)
        kv = 2 * b * (s / cp) * kv_local * model.head_dim * e
        steps = (cp - 1) * layers * mi
        cp_fwd = net.time("send_recv", kv, cp_pl) * steps
        cp_bwd = net.time("send_recv", 2 * kv, cp_pl) * steps
        cp_bwd = cp_bwd + np.where(self._c_rc_any[core], cp_fwd, 0.0)
        cp_on = (cp > 1) & (layers > 0)
        exposed_cp = np.maximum(0.0, cp_fwd - a_f * mf) + np.maximum(0.0, cp_bwd - a_b * mf)
        exposed_cp = np.where(cp_on, exposed_cp, 0.0)

        exposed_dp = np.zeros(n)
        for phase, window in (("forward", t_f + t_r), ("backward", t_b)):
            per_mb = np.zeros(n)
            per_step_t = np.zeros(n)
            for t, ov, many in dp_colls:
                if ov != phase:
                    continue
                is_mb = many & (mi > 1)
                per_mb = per_mb + np.where(is_mb, t, 0.0)
                per_step_t = per_step_t + np.where(is_mb, 0.0, t)
            exposed_dp = exposed_dp + (
                np.maximum(0.0, per_mb - mf * window) + np.maximum(0.0, per_step_t - window)
            )
        none_sum = np.zeros(n)
        for t, ov, _ in dp_colls:
            if ov == "none":
                none_sum = none_sum + t
        exposed_dp = exposed_dp + none_sum

        # The exact bubble: a pipeline slot holds the stage's compute and its critical-path
        # TP / EP / PP communication (timing.step_time); the bound above used compute alone.
        t_slot = t_mb + (tp_s + ep_s + pp_s) / mf
        bubble = np.where(sched == 1, p1 * t_slot / v, np.where(sched == 2, p1 * t_slot / 3.0, p1 * t_slot))
        bubble = np.where(pp == 1, 0.0, bubble)

        step_s = (
            0
            + forward_s
            + backward_s
            + recompute_s
            + tp_s
            + ep_s
            + exposed_cp
            + pp_s
            + exposed_dp
            + bubble
            + optimizer_s
            + offload_s
        )
        compute_s = mf * t_mb

        # --- throughput and run (timing.throughput, cost.run_cost) ------------------------------
        tokens_step = self._tokens_per_step
        tps = tokens_step / step_s
        denom = devices * peak_fl * step_s
        mfu = self._c_model_flops[core] / denom
        tokens = self.base.tokens
        time_s = np.full(n, np.nan) if tokens is None else tokens / tps
        dev_f = devices.astype(np.float64)
        device_hours = dev_f * time_s / SECONDS_PER_HOUR
        cost = device_hours * price
        busy = np.where(step_s > 0, compute_s / step_s, 0.0)
        idle = IDLE_POWER_FRACTION * tdp
        power = idle + (tdp - idle) * busy
        energy = dev_f * power * time_s / 3.6e6 * self.pue

        return {
            "compute_s": compute_s,
            "forward_s": forward_s,
            "backward_s": backward_s,
            "recompute_s": recompute_s,
            "exposed_tp_s": tp_s,
            "exposed_ep_s": ep_s,
            "exposed_cp_s": exposed_cp,
            "pp_p2p_s": pp_s,
            "exposed_dp_s": exposed_dp,
            "bubble_s": bubble,
            "optimizer_s": optimizer_s,
            "offload_s": offload_s,
            "step_s": step_s,
            "tokens_per_s": tps,
            "mfu": mfu,
            "time_s": time_s,
            "device_hours": device_hours,
            "cost_usd": cost,
            "energy_kwh": energy,
        }


def _pass(cost: Any, peak: FloatArray, eta: FloatArray, eta_attn: FloatArray, bw: FloatArray) -> FloatArray:
    """``timing._pass_time_s`` on arrays of accelerator constants (element-wise the same operations)."""
    return np.asarray(_pass_time_s(cost, cast(Any, peak), cast(Any, eta), cast(Any, eta_attn), cast(Any, bw)))


@dataclass(frozen=True, kw_only=True)
class _ArrayCost:
    """``flops.PassCost`` with array fields (one row per stage)."""

    gemm_flops: FloatArray
    attention_flops: FloatArray
    memory_bytes: FloatArray


class _ArrayMemory(MemoryBreakdown):
    """``MemoryBreakdown`` whose fields are arrays: its own ``phase_terms``, ``per_device_bytes``
    and ``fragmentation_bytes`` compose them; only the peak over the phases (``max`` with a key in
    the scalar class) is taken element-wise. Every FSDP2 moment is evaluated: without ZeRO-3 its
    FSDP terms are 0 and it is below the backward start, so the peak is the scalar one."""

    @property
    def peak_bytes(self) -> Any:
        out: Any = None
        for phase in FSDP_PHASES:
            v = self.phase_bytes(phase)
            out = v if out is None else np.maximum(out, v)
        return out


def _array_memory(values: dict[str, FloatArray], capacity: FloatArray, *, grads_live: bool) -> _ArrayMemory:
    fields = cast(dict[str, Any], dict(values))
    return _ArrayMemory(
        **fields,
        comm_buffers_bytes=0.0,
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        capacity_bytes=cast(Any, capacity),
        stage=0,
        grads_live_at_backward_start=grads_live,
        params_on_device=0,
        trainable_params_on_device=0,
    )


# --- vectorised placement and alpha-beta collectives (mirror comm.py) ------------------------
@dataclass(frozen=True, kw_only=True)
class _Placement:
    """``comm.place_group`` on arrays: level 0 none, 1 scale-up, 2 scale-out, 3 hierarchical."""

    size: IntArray
    n_local: IntArray  # ranks per domain used by Network.time_s (the group size on scale-up)
    level: IntArray


def _place(size: IntArray, stride: IntArray, d: IntArray) -> _Placement:
    """``comm.place_group``: ranks ``0, stride, ...`` on domains of ``d`` consecutive ranks.

    The number of the group's ranks in the first domain is ``min(size, ceil(d / stride))`` in all
    three branches of the scalar function (``stride >= d`` gives 1; ``stride | d`` gives ``d/stride``).
    """
    size = np.asarray(size, dtype=np.int64)
    local = np.minimum(size, -(-d // stride))
    domains = -(-size // local)
    level = np.where(size == 1, 0, np.where(domains == 1, 1, np.where(local == 1, 2, 3)))
    n_local = np.where(level == 1, size, local)
    return _Placement(size=size, n_local=n_local, level=level)


def _bus(kind: str, g: IntArray) -> FloatArray:
    gf = g.astype(np.float64)
    safe = np.maximum(gf, 1.0)
    f = 2.0 * (gf - 1) / safe if kind == "all_reduce" else (gf - 1) / safe
    return np.where(g <= 1, 0.0, f)


def _steps(kind: str, g: IntArray) -> IntArray:
    s = 2 * (g - 1) if kind == "all_reduce" else g - 1
    return np.where(g <= 1, 0, s)


def _flat(
    kind: str, nb: FloatArray, g: IntArray, bw: FloatArray, lat: FloatArray, eff: FloatArray
) -> FloatArray:
    """``comm._flat_s``: steps·α + bus_factor·n_bytes / (β·efficiency), 0 when nothing moves."""
    volume = _bus(kind, g) * nb
    return np.where(volume == 0.0, 0.0, _steps(kind, g) * lat + volume / (bw * eff))


class _Net:
    """``comm.Network.time_s`` on arrays (per-candidate link figures)."""

    def __init__(
        self,
        up_bw: FloatArray,
        up_lat: FloatArray,
        up_eff: FloatArray,
        out_bw: FloatArray,
        out_lat: FloatArray,
        out_eff: FloatArray,
    ) -> None:
        self.up = (up_bw, up_lat, up_eff)
        self.out = (out_bw, out_lat, out_eff)

    def time(self, kind: str, n_bytes: FloatArray, pl: _Placement) -> FloatArray:
        n_bytes = np.asarray(n_bytes, dtype=np.float64) * np.ones(pl.size.shape)
        on_up = pl.level == 1
        up = self.up
        out = tuple(np.where(on_up, u, o) for u, o in zip(self.up, self.out, strict=True))
        g = pl.size
        n_l = pl.n_local
        n_o = -(-g // n_l)
        if kind == "send_recv":
            lv = tuple(np.where(n_o == 1, u, o) for u, o in zip(up, out, strict=True))
            t = np.where(n_bytes == 0.0, 0.0, 1 * lv[1] + n_bytes / (lv[0] * lv[2]))
        elif kind == "all_to_all":
            lv = tuple(np.where(n_o == 1, u, o) for u, o in zip(up, out, strict=True))
            flat = _flat(kind, n_bytes, g, *lv)
            gf = g.astype(np.float64)
            intra = (n_l - 1) / gf * n_bytes / (up[0] * up[2])
            inter = (g - n_l) / gf * n_bytes / (out[0] * out[2])
            two = np.maximum(intra, inter) + (n_l - 1) * up[1] + (g - n_l) * out[1]
            t = np.where((n_o == 1) | (n_l == 1), flat, two)
        else:
            shard = n_bytes / n_l
            if kind == "reduce_scatter":
                t = _flat("reduce_scatter", n_bytes, n_l, *up) + _flat("reduce_scatter", shard, n_o, *out)
            elif kind == "all_gather":
                t = _flat("all_gather", shard, n_o, *out) + _flat("all_gather", n_bytes, n_l, *up)
            else:
                t = (
                    _flat("reduce_scatter", n_bytes, n_l, *up)
                    + _flat("all_reduce", shard, n_o, *out)
                    + _flat("all_gather", n_bytes, n_l, *up)
                )
        return np.asarray(np.where((pl.level == 0) | (n_bytes == 0.0), 0.0, t))


__all__ = [
    "INVALID_REASONS",
    "BulkEvaluator",
    "BulkResult",
    "Candidates",
    "Core",
    "accel_constants",
]
