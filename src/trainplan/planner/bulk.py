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
    PHASES,
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
        return np.asarray(self.fits & ~self.dominated)

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
        self._stage_cache: dict[int, list[tuple[StageFlops, tuple[bool, ...]]]] = {}
        self._eta_cache: dict[tuple[object, ...], float] = {}
        self._accel_cache: dict[tuple[int, str], _Accel] = {}
        counts = count_params(model)
        self._expert = float(counts.moe_experts)
        self._dense = float(counts.total - counts.moe_experts)
        self._build_core_tables()
        self._time_tables: dict[int, dict[str, FloatArray]] = {}

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
                layout = Layout(dp=dp, tp=core.tp, pp=core.pp, cp=core.cp, ep=core.ep, zero=zero)
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
        # states[core, zero, stage(0=first, 1=last), 2*nf + 2]
        states = np.full((n, 4, 2, 2 * nf + 2), np.nan)
        act1 = np.zeros((n, 2))
        act_slope = np.zeros((n, 2))
        held = np.ones((n, 2))
        logits = np.zeros((n, 2))
        transient = np.zeros((n, 2))
        big = 1 << 40
        model = self.model
        no_ib = replace(self.base, optimizer_in_backward=False)
        act_cache: dict[tuple[object, ...], tuple[float, float, float, float, float, float]] = {}
        loss_t_tab = np.zeros((n, 2))
        for c, core in enumerate(self.cores):
            stages = (0, core.pp - 1)
            for z in ZERO_STAGES:
                for k, stage in enumerate(stages):
                    s = self._states(core, z, stage)
                    if s is not None:
                        states[c, z, k] = s
            for k, stage in enumerate(stages):
                key = (
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
                    stage,
                )
                got = act_cache.get(key)
                if got is None:
                    layout = core.layout(core.ep, 0)
                    recipe = replace(core.recipe(no_ib), offload="none")
                    hd = float(inflight_microbatches(layout, stage, big))
                    one = _stage_breakdown(model, recipe, layout, stage, float("inf"), 1)
                    slope = 0.0
                    if hd > 1.0:
                        many = _stage_breakdown(model, recipe, layout, stage, float("inf"), big)
                        slope = (many.activations_bytes - one.activations_bytes) / (hd - 1.0)
                    # activations = a1 + slope·(inflight − 1): linear in the in-flight micro-batches
                    loss_t = logits_bytes(model, recipe, layout)[1] if stage == core.pp - 1 else 0.0
                    got = (one.activations_bytes, slope, hd, one.logits_bytes, one.transient_bytes, loss_t)
                    act_cache[key] = got
                act1[c, k], act_slope[c, k], held[c, k], logits[c, k], transient[c, k], loss_t_tab[c, k] = got
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
        ints = {
            name: np.array([getattr(c, name) for c in self.cores], dtype=np.int64)
            for name in ("tp", "pp", "cp", "ep", "micro_batch", "virtual_stages")
        }
        self._c_int = ints
        fkeys: dict[tuple[object, ...], int] = {}
        reps: list[Core] = []
        fk_of_core = []
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
                reps.append(
                    replace(
                        co, offload="none", pp_schedule="interleaved" if co.virtual_stages > 1 else "1f1b"
                    )
                )
            fk_of_core.append(fkeys[fkey])
        self._fkeys = reps
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
    def _accel(self, a: int, core: Core) -> _Accel:
        key = (a, core.precision)
        if key not in self._accel_cache:
            self._accel_cache[key] = accel_constants(
                self.accelerators[a], core.recipe(self.base), self.prices[a]
            )
        return self._accel_cache[key]

    def _eta(self, a: int, core: Core, layers: tuple[int, ...], kinds: tuple[bool, ...], ax: _Accel) -> float:
        tokens = core.micro_batch * (self.base.seq_len // core.cp)
        key = (a, kinds, tokens, core.tp, core.ep, ax.dtype)
        got = self._eta_cache.get(key)
        if got is None:
            layout = core.layout(core.ep, 0)
            got = _stage_gemm_efficiency(
                self.model, layers, tokens, layout, get_efficiency(ax.acc.name), ax.dtype
            )
            self._eta_cache[key] = got
        return got

    def _time_table(self, a: int, core_ids: IntArray) -> dict[str, FloatArray]:
        """Per-micro-batch times of the busiest stage (``timing.step_time``) on accelerator ``a``.

        Keyed by the compute key of each core (offload and the pipeline schedule do not change
        the work of a micro-batch; the number of virtual stages does)."""
        nk = len(self._fkeys)
        tab = self._time_tables.get(a)
        if tab is None:
            tab = {k: np.full(nk, np.nan) for k in ("t_f", "t_b", "t_r", "a_f", "a_b")}
            self._time_tables[a] = tab
        keys = np.unique(self._c_fkey[core_ids])
        for fk in keys[np.isnan(tab["t_f"][keys])]:
            core = self._fkeys[int(fk)]
            ax = self._accel(a, core)
            best: tuple[float, float, float, float, float] | None = None
            best_total = -1.0
            for st, kinds in self._stages(int(fk)):
                eta = self._eta(a, core, st.layers, kinds, ax)
                f = _pass_time_s(st.forward, ax.peak, eta, ax.eta_attn, ax.bw) / ax.kappa
                b = (
                    _pass_time_s(st.backward, ax.peak, eta, ax.eta_attn, ax.bw) + st.dequant_bytes / ax.bw
                ) / ax.kappa
                r = _pass_time_s(st.recompute, ax.peak, eta, ax.eta_attn, ax.bw) / ax.kappa
                total = f + b + r
                if total > best_total:  # first maximum, as max() in step_time
                    best_total = total
                    best = (
                        f,
                        b,
                        r,
                        st.forward.attention_flops / (ax.peak * ax.eta_attn),
                        st.backward.attention_flops / (ax.peak * ax.eta_attn),
                    )
            assert best is not None
            tab["t_f"][fk], tab["t_b"][fk], tab["t_r"][fk], tab["a_f"][fk], tab["a_b"][fk] = best
        return tab

    def _stages(self, fk: int) -> list[tuple[StageFlops, tuple[bool, ...]]]:
        """The distinct stages of a compute key (stages with the same work cost the same; the
        first of equal ones is kept, as ``max`` keeps the first maximum)."""
        cached = self._stage_cache.get(fk)
        if cached is None:
            core = self._fkeys[fk]
            recipe = replace(core.recipe(self.base), global_batch=core.micro_batch * core.ep)
            recipe = replace(recipe, offload="none")
            seen: set[tuple[object, ...]] = set()
            cached = []
            for st in device_flops(self.model, recipe, core.layout(core.ep, 0)):
                kinds = tuple(dict.fromkeys(self.model.is_moe_layer(i) for i in st.layers))
                key = (st.forward, st.backward, st.recompute, st.dequant_bytes, kinds)
                if key in seen:
                    continue
                seen.add(key)
                cached.append((st, kinds))
            self._stage_cache[fk] = cached
        return cached

    # ----- evaluation -----------------------------------------------------------------------
    def evaluate(self, cand: Candidates) -> BulkResult:
        n = len(cand)
        core = cand.core
        zero = cand.zero
        dp = cand.dp.astype(np.float64)
        dpi = cand.dp
        devices = cand.devices
        mb = self._c_int["micro_batch"][core]
        invalid = np.zeros(n, dtype=np.int64)

        gb = int(self.base.global_batch or 0)
        per_step = dpi * mb
        bad_batch = gb % per_step != 0
        invalid[bad_batch] = INVALID_BATCH
        m = np.where(bad_batch, 1, gb // np.maximum(per_step, 1))
        mf = m.astype(np.float64)
        if self.base.optimizer_in_backward:
            invalid[(m > 1) & (invalid == 0)] = INVALID_OPT_IN_BWD

        # --- memory (memory._stage_breakdown / memory_breakdown) -------------------------
        cz = core * 4 + zero
        invalid[self._states_bad[cz] & (invalid == 0)] = INVALID_STATES

        def field(k: int, name: str) -> FloatArray:
            j = _STATE_FIELDS.index(name)
            return np.asarray(self._sA[j][k][cz] + self._sB[j][k][cz] / dp)

        acc = cand.acc
        capacity = np.array([a.memory_bytes for a in self.accelerators])[acc]
        grads_live = (m > 1) | self.base.optimizer_in_backward
        stage_vals = []
        for k in (0, 1):
            infl = np.minimum(self._held[core, k], mf)
            act = self._act1[core, k] + self._act_slope[core, k] * (infl - 1.0)
            # memory._stage_breakdown: max(loss, loss/2 + head reduce, recomputed layer, step in
            # backward, layer reduce); the first and third come from the ZeRO-0 breakdown.
            transient = np.maximum(
                np.maximum(
                    np.maximum(
                        self._transient[core, k], self._loss_transient[core, k] / 2 + field(k, "reduce_head")
                    ),
                    field(k, "step_in_backward"),
                ),
                field(k, "reduce"),
            )
            values = {
                "weights_bytes": field(k, "weights"),
                "gradients_bytes": field(k, "gradients"),
                "optimizer_bytes": field(k, "optimizer"),
                "master_weights_bytes": field(k, "master"),
                "quant_constants_bytes": field(k, "quant_constants"),
                "activations_bytes": act,
                "logits_bytes": self._logits[core, k],
                "gather_buffers_bytes": field(k, "gather"),
                "transient_bytes": transient,
                "reduce_buffers_bytes": field(k, "reduce"),
                "optimizer_temporaries_bytes": field(k, "optimizer_temp"),
                "host_bytes": field(k, "host"),
                "paged_optimizer_bytes": field(k, "paged"),
            }
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
        per_device, weights, grads, optimizer, activations, trainable, params_dev = pick

        # --- validity that needs the network, and dominance (before any time is computed) -------
        dom_acc = np.array([ac.scale_up.domain_size for ac in self.accelerators], dtype=np.int64)[acc]
        no_out = np.array([ac.scale_out is None for ac in self.accelerators], dtype=bool)[acc]
        invalid[(devices > np.minimum(dom_acc, devices)) & no_out & (invalid == VALID)] = INVALID_NETWORK
        fits = (invalid == VALID) & (per_device <= capacity)
        dominated = self._dominated(cand, fits)
        sub = np.nonzero(fits & ~dominated)[0]
        tm = self._time(cand.take(sub), m[sub], trainable[sub], params_dev[sub])

        def full(x: FloatArray) -> FloatArray:
            out = np.full(n, np.nan)
            out[sub] = x
            return out

        nanf = np.where(invalid != VALID, np.nan, 1.0)
        return BulkResult(
            invalid=invalid,
            dominated=dominated,
            per_device_bytes=per_device * nanf,
            capacity_bytes=capacity,
            weights_bytes=weights * nanf,
            gradients_bytes=grads * nanf,
            optimizer_bytes=optimizer * nanf,
            activations_bytes=activations * nanf,
            micro_batches=m,
            **{k: full(v) for k, v in tm.items()},
        )

    def _dominated(self, cand: Candidates, fits: BoolArray) -> BoolArray:
        """Offload variants whose same layout one offload step lower fits: never faster.

        ``timing.step_time`` charges offload ``transfers + update / HOST_MEMORY_BYTES_PER_S`` in
        place of ``update / (HBM bandwidth)`` and adds the weight streaming of parameter offload;
        every other term is the same. Where the HBM bandwidth is at least HOST_MEMORY_BYTES_PER_S the
        lower variant is at least as fast at the same price, so the offload variant is dominated.
        """
        n = len(cand)
        twin = self._c_twin[cand.core]
        has = twin >= 0
        if not has.any():
            return np.zeros(n, dtype=bool)
        nc = len(self.cores)
        key = ((cand.acc * (1 << 24) + cand.devices) * 4 + cand.zero) * nc + cand.core
        order = np.argsort(key, kind="stable")
        sk = key[order]
        tkey = ((cand.acc * (1 << 24) + cand.devices) * 4 + cand.zero) * nc + np.maximum(twin, 0)
        pos = np.minimum(np.searchsorted(sk, tkey), n - 1)
        found = has & (sk[pos] == tkey)
        twin_fits = found & fits[order[pos]]
        fast_hbm = np.array(
            [
                ac.memory_bandwidth_bytes_per_s * get_efficiency(ac.name).memory_bandwidth_efficiency
                >= HOST_MEMORY_BYTES_PER_S
                for ac in self.accelerators
            ],
            dtype=bool,
        )[cand.acc]
        return np.asarray(twin_fits & fast_hbm & fits)

    def _time(
        self, cand: Candidates, m: IntArray, trainable: FloatArray, params_dev: FloatArray
    ) -> dict[str, FloatArray]:
        """Step time, throughput and run cost of valid candidates that fit."""
        n = len(cand)
        core = cand.core
        zero = cand.zero
        dp = cand.dp.astype(np.float64)
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
        del dp
        # --- accelerator constants and per-micro-batch compute --------------------------------
        t_f = np.zeros(n)
        t_b = np.zeros(n)
        t_r = np.zeros(n)
        a_f = np.zeros(n)
        a_b = np.zeros(n)
        peak_fl = np.zeros(n)
        bw = np.zeros(n)
        up_bw = np.ones(n)
        up_lat = np.zeros(n)
        up_eff = np.ones(n)
        out_bw = np.full(n, np.nan)
        out_lat = np.zeros(n)
        out_eff = np.ones(n)
        dom_cap = np.ones(n, dtype=np.int64)
        host_bw = np.zeros(n)
        price = np.full(n, np.nan)
        tdp = np.full(n, np.nan)
        prec_names = np.array([c.precision for c in self.cores])
        for a in np.unique(acc):
            sel = np.nonzero(acc == a)[0]
            cores_a = core[sel]
            tt = self._time_table(int(a), np.unique(cores_a))
            fk = self._c_fkey[cores_a]
            t_f[sel] = tt["t_f"][fk]
            t_b[sel] = tt["t_b"][fk]
            t_r[sel] = tt["t_r"][fk]
            a_f[sel] = tt["a_f"][fk]
            a_b[sel] = tt["a_b"][fk]
            for prec in np.unique(prec_names[cores_a]):
                sub = sel[prec_names[cores_a] == prec]
                ax = self._accel(int(a), self.cores[int(cores_a[prec_names[cores_a] == prec][0])])
                peak_fl[sub] = ax.peak
                bw[sub] = ax.bw
                up_bw[sub], up_lat[sub], up_eff[sub] = ax.up
                if ax.out is not None:
                    out_bw[sub], out_lat[sub], out_eff[sub] = ax.out
                dom_cap[sub] = ax.domain
                host_bw[sub] = ax.host_bw
                if ax.price is not None:
                    price[sub] = ax.price
                if ax.tdp_w is not None:
                    tdp[sub] = ax.tdp_w

        # --- collectives (comm.step_collectives on comm.group_placement) ----------------------
        d = np.minimum(dom_cap, devices)
        out_bw = np.where(np.isnan(out_bw), 1.0, out_bw)
        net = _Net(up_bw, up_lat, up_eff, out_bw, out_lat, out_eff)

        e = self._c_e[core]
        w_bytes = BYTES_PER_ELEMENT["nf4"] if self.base.method == "qlora" else e
        shard_size = dpi * cp
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
        full = self._c_full[core]
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

        # --- bubble, optimizer, offload (timing.step_time) --------------------------------------
        t_mb = t_f + t_b + t_r
        sched = self._c_sched[core]
        p1 = (pp - 1).astype(np.float64)
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


class _ArrayMemory(MemoryBreakdown):
    """``MemoryBreakdown`` whose fields are arrays: its own ``phase_terms``, ``per_device_bytes``
    and ``fragmentation_bytes`` compose them; only the peak over the phases (``max`` with a key in
    the scalar class) is taken element-wise."""

    @property
    def peak_bytes(self) -> Any:
        out: Any = None
        for phase in PHASES:
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
