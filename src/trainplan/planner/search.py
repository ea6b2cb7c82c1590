"""Search, ranking and explanation: which accelerator, how many, which layout — and why.

Method (docs/plan.md):

1. Enumerate the search space: every accelerator × device counts (1, 2, 4 below one node, then
   node and scale-up-domain multiples up to ``max_devices``) × layouts (tp within the scale-up
   domain, pp, cp for long sequences, ep for MoE, ZeRO 0–3, sequence parallelism) × the recipe
   choices the user left open (micro-batch, recompute, offload, precision).
2. Drop only what is invalid (the scalar ``estimate`` would raise) or an exact duplicate (ZeRO 1/2
   with nothing to shard); every drop is counted by reason.
3. Evaluate all candidates in bulk (``bulk.py``), keep those that fit in memory.
4. Within one (accelerator, device count) cost is proportional to time, so the fastest layout
   dominates the others in both; it represents that pair. Rank the representatives by the
   objective; report the fastest, the cheapest and the time–cost Pareto front.
5. Re-evaluate every reported plan with the scalar ``estimate`` (it must agree and be feasible)
   and explain what binds it and why the nearest alternatives lose.
"""

from __future__ import annotations

import itertools
import math
import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from trainplan.cost import DEFAULT_PUE
from trainplan.errors import TrainplanError
from trainplan.flops import (
    check_fused_loss,
    check_mla_layout,
    check_moe_routing,
    check_moe_tp,
    check_window_layout,
    fp8_params_needs_sharding,
)
from trainplan.goodput import DEFAULT_RELIABILITY, Reliability
from trainplan.hardware.accelerator import Accelerator, CloudOffering
from trainplan.hardware.prices import (
    DEFAULT_RULE,
    OPEN,
    PriceError,
    PriceQuery,
    check_provider,
    refusal,
    select_offering,
)
from trainplan.hardware.system import System
from trainplan.inputs import DEFAULT_MAX_DEVICES, OBJECTIVES
from trainplan.layout import DEFAULT_LAYOUT_OPTIONS, Layout, LayoutOptions, nearest_micro_batches
from trainplan.limits import MAX_DEVICES, check_int
from trainplan.models.spec import ModelSpec
from trainplan.planner.bulk import (
    INVALID_REASONS,
    VALID,
    BulkEvaluator,
    BulkResult,
    Candidates,
    Core,
    Segments,
)
from trainplan.predict import Estimate, estimate, hardware_refusal
from trainplan.recipe import (
    OFFLOADS,
    PRECISIONS,
    RECOMPUTES,
    Offload,
    Precision,
    Recipe,
    Recompute,
    fp8_options_set,
)
from trainplan.terms import TERM_GROUPS, TIME_TERMS
from trainplan.units import fmt_bytes, fmt_duration

Objective = Literal["time", "cost", "balanced"]
DEFAULT_PRETRAIN_BATCH_TOKENS: Final = 4 * 2**20
"""Default global batch of pre-training, ~4M tokens (Llama 2: 4M tokens, Touvron et al. 2023 Sec. 2.2)."""
DEFAULT_FINETUNE_BATCH: Final = 128
"""Default global batch (sequences) of fine-tuning methods; set ``--global-batch`` to override."""
MIN_CP_TOKENS: Final = 4096
"""Context parallelism is searched only while each rank keeps at least this many tokens."""
MEMORY_BOUND_FRACTION: Final = 0.85
"""A plan using more than this share of device memory is reported as memory-bound."""


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Values searched for each open choice; a choice the user fixed has one value."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recomputes: tuple[Recompute, ...] = RECOMPUTES
    offloads: tuple[Offload, ...] = OFFLOADS
    precisions: tuple[Precision, ...] = ("bf16",)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    pp_schedules: tuple[str, ...] = ("1f1b", "interleaved")
    max_devices: int = DEFAULT_MAX_DEVICES
    device_counts: tuple[int, ...] | None = None  # explicit counts instead of the default ladder
    max_tp: int = 16
    max_pp: int = 16
    layout_options: LayoutOptions = DEFAULT_LAYOUT_OPTIONS
    """Engine options applied to every candidate where they mean something, not searched
    (``LayoutOptions.for_candidate``); the plan's notes name them."""

    def __post_init__(self) -> None:
        if not self.micro_batches or any(b <= 0 for b in self.micro_batches):
            raise TrainplanError("micro_batch", "search at least one positive micro-batch")
        for p in self.precisions:
            if p not in PRECISIONS:
                raise TrainplanError("precision", f"unknown precision {p!r}; choose {', '.join(PRECISIONS)}")
        for n in self.device_counts or ():
            check_int("devices", n, high=MAX_DEVICES, what="devices")
        check_int("max_devices", self.max_devices, high=MAX_DEVICES, what="devices")
        for name in ("max_tp", "max_pp"):
            check_int(name, getattr(self, name), high=MAX_DEVICES, what="devices")
        for z in self.zero_stages:
            if z not in (0, 1, 2, 3):
                raise TrainplanError("zero", f"ZeRO stage must be 0-3, got {z}")


COST_TABLE_NOTE = (
    "objective cost: one row per accelerator, its cheapest plan, ranked by cost "
    "(the time–cost Pareto front lists the alternatives)"
)
"""What a cost-objective comparison says of its own table (a caller that builds another table drops it)."""


def check_objective_tokens(objective: str, tokens: float | None) -> None:
    """A cost (or balanced) ranking needs the run's length: refused without ``--tokens`` rather
    than ranked by time while saying cost."""
    if objective != "time" and tokens is None:
        raise TrainplanError(
            "tokens",
            f"--objective {objective} ranks by the run's cost, which needs --tokens (the length of the "
            "run); give --tokens, or rank by time",
        )


def default_global_batch(recipe: Recipe) -> int:
    """~4M tokens for pre-training (a power of two of sequences), 128 sequences otherwise."""
    if recipe.method == "pretrain":
        exponent: int = round(math.log2(max(1.0, DEFAULT_PRETRAIN_BATCH_TOKENS / recipe.seq_len)))
        return int(max(1, 2**exponent))
    return DEFAULT_FINETUNE_BATCH


def device_ladder(acc: Accelerator, max_devices: int) -> tuple[int, ...]:
    """1, 2, 4 below one node, then node and scale-up-domain multiples (×2^k) up to ``max_devices``."""
    node = acc.devices_per_node
    dom = acc.scale_up.domain_size
    counts = {n for n in (1, 2, 4) if n < node}
    for base in (node, dom):
        n = base
        while n <= max_devices:
            counts.add(n)
            n *= 2
    return tuple(sorted(c for c in counts if c <= max_devices))


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


@dataclass(frozen=True, kw_only=True)
class Explanation:
    binds: tuple[str, ...]
    alternatives: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"binds": list(self.binds), "alternatives": list(self.alternatives)}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One recommended configuration: the scalar estimate plus why it is chosen."""

    rank: int
    estimate: Estimate
    explanation: Explanation
    tie_within_error: bool = False  # its objective band overlaps that of the plan ranked just above

    @property
    def label(self) -> str:
        return f"{self.estimate.system.num_devices}×{self.estimate.system.accelerator.name}"

    def to_dict(self) -> dict[str, object]:
        d = self.estimate.to_dict()
        d["rank"] = self.rank
        d["label"] = self.label
        d["explanation"] = self.explanation.to_dict()
        run = self.estimate.run
        d["priced"] = run.cost_usd is not None
        d["tie_within_error"] = self.tie_within_error
        d["offering"] = None if run.offering is None else run.offering.to_dict()
        d["usd_per_device_hour"] = run.usd_per_device_hour
        d["price_date"] = None if run.offering is None else run.offering.date
        return d


@dataclass(frozen=True, kw_only=True)
class SearchStats:
    candidates: int
    valid: int
    feasible: int
    does_not_fit: int
    pruned: dict[str, int]
    invalid: dict[str, int]
    skipped_accelerators: dict[str, str]
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return {
            "candidates": self.candidates,
            "valid": self.valid,
            "feasible": self.feasible,
            "does_not_fit": self.does_not_fit,
            "pruned": dict(self.pruned),
            "invalid": dict(self.invalid),
            "skipped_accelerators": dict(self.skipped_accelerators),
            "seconds": self.seconds,
        }


@dataclass(frozen=True, kw_only=True)
class AcceleratorBest:
    """The best plan on one accelerator (``compare``), or why there is none."""

    hardware: str
    plan: Plan | None
    reason: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "hardware": self.hardware,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    model: str
    objective: Objective
    global_batch: int
    tokens: float | None
    budget_usd: float | None
    deadline_h: float | None
    fastest: Plan | None
    cheapest: Plan | None
    pareto: tuple[Plan, ...]
    plans: tuple[Plan, ...]
    constraints_met: bool
    constraint_failures: tuple[str, ...]
    closest: Plan | None
    min_devices: dict[str, int | None]
    unpriced: tuple[str, ...]
    stats: SearchStats
    per_accelerator: tuple[AcceleratorBest, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    ranking: tuple[str, ...] = ()  # what the bands allow the ranking to say (:func:`ranking_statements`)
    engine: Any = None
    """The ``trainplan.engines.Applied`` that filled the request's unset engine settings (plans
    built from input fields); ``None`` otherwise."""

    def to_dict(self) -> dict[str, object]:
        def one(p: Plan | None) -> object:
            return None if p is None else p.to_dict()

        return {
            "model": self.model,
            "objective": self.objective,
            "global_batch": self.global_batch,
            "tokens": self.tokens,
            "constraints": {
                "budget_usd": self.budget_usd,
                "deadline_h": self.deadline_h,
                "met": self.constraints_met,
                "failures": list(self.constraint_failures),
                "closest": one(self.closest),
            },
            "fastest": one(self.fastest),
            "cheapest": one(self.cheapest),
            "pareto": [p.to_dict() for p in self.pareto],
            "plans": [p.to_dict() for p in self.plans],
            "min_devices": dict(self.min_devices),
            "unpriced": list(self.unpriced),
            "search": self.stats.to_dict(),
            "per_accelerator": [b.to_dict() for b in self.per_accelerator],
            "notes": list(self.notes),
            "ranking": list(self.ranking),
            **({"engine": self.engine.to_dict()} if self.engine is not None else {}),
        }


# --- what the bands allow a ranking to say ------------------------------------------------------
def objective_band(e: Estimate, objective: Objective) -> tuple[float, float] | None:
    """[low, high] of a plan's objective value: run time (step time without --tokens), cost, or
    their geometric mean; all scale with step time, so each takes the step-time band
    (``bands.Band.around``). None for a cost objective without a price."""
    t = e.run.time_s if e.run.time_s is not None else e.time.step_s
    c = e.run.cost_usd
    if objective == "cost":
        return None if c is None else e.step_band.around(c)
    if objective == "balanced" and c is not None:
        return e.step_band.around(math.sqrt(t * c))
    return e.step_band.around(t)


def _fmt_objective(value: float, objective: Objective) -> str:
    return _fmt_usd(value) if objective == "cost" else fmt_duration(value)


def mark_ties(plans: Sequence[Plan], objective: Objective) -> tuple[Plan, ...]:
    """Each plan flagged when its objective band overlaps that of the plan ranked just above."""
    out: list[Plan] = []
    prev: tuple[float, float] | None = None
    for p in sorted(plans, key=lambda p: p.rank):
        band = objective_band(p.estimate, objective)
        tie = prev is not None and band is not None and band[0] <= prev[1] and prev[0] <= band[1]
        out.append(replace(p, tie_within_error=tie))
        prev = band
    return tuple(out)


def ranking_statements(plans: Sequence[Plan], objective: Objective) -> tuple[str, ...]:
    """In words: which neighbouring ranks tie within error, and whether the ranking mixes
    calibrated and uncalibrated accelerators. ``plans`` as :func:`mark_ties` returns them."""
    ordered = sorted(plans, key=lambda p: p.rank)
    out: list[str] = []
    what = {"time": "time", "cost": "cost", "balanced": "time·cost"}[objective]
    unit: Objective = "cost" if objective == "cost" else "time"
    for above, p in itertools.pairwise(ordered):
        a, b = objective_band(above.estimate, objective), objective_band(p.estimate, objective)
        if not p.tie_within_error or a is None or b is None:
            continue
        spans = (
            ""
            if objective == "balanced"
            else f" ({_fmt_objective(a[0], unit)} … {_fmt_objective(a[1], unit)} vs "
            f"{_fmt_objective(b[0], unit)} … {_fmt_objective(b[1], unit)})"
        )
        out.append(
            f"#{above.rank} {above.label} and #{p.rank} {p.label} tie within error: their {what} bands overlap{spans}"
        )
    cal = sorted({p.estimate.system.accelerator.name for p in ordered if p.estimate.step_band.calibrated})
    unc = sorted({p.estimate.system.accelerator.name for p in ordered if not p.estimate.step_band.calibrated})
    if cal and unc:
        out.append(
            f"this ranking mixes calibrated accelerators ({', '.join(cal)}) with uncalibrated ones "
            f"({', '.join(unc)}): no validated run supports the uncalibrated figures, so where they "
            "rank against the calibrated ones is not established"
        )
    elif unc and len(ordered) > 1:
        out.append(
            f"every accelerator in this ranking is uncalibrated ({', '.join(unc)}): no validated run "
            "supports the order"
        )
    other = {
        p.estimate.system.accelerator.name: p.estimate.step_band
        for p in ordered
        if p.estimate.step_band.calibrated and not p.estimate.step_band.on_part
    }
    for name, band in sorted(other.items()):
        out.append(
            f"{name} has no validated run of its own (* in the band column): its band is {band.family_error_text()}"
        )
    return tuple(out)


# --- the search space -------------------------------------------------------------------------
def enumerate_cores(
    model: ModelSpec, base: Recipe, space: SearchSpace, max_domain: int
) -> tuple[list[Core], dict[str, int]]:
    """Every valid core (layout and recipe choices independent of the device count), sorted."""
    cores: list[Core] = []
    invalid: dict[str, int] = {}
    seq = base.seq_len
    tps = [t for t in _pow2_upto(min(space.max_tp, max_domain))]
    pps = [p for p in _pow2_upto(min(space.max_pp, model.num_layers))]
    cps = [c for c in _pow2_upto(seq) if seq % c == 0 and (c == 1 or seq // c >= MIN_CP_TOKENS)]
    eps = [1]
    if model.moe is not None:
        eps = [e for e in _pow2_upto(min(64, model.moe.num_experts)) if model.moe.num_experts % e == 0]
    # The recipe choices are valid or not whatever the layout: checked once each.
    choices: list[dict[str, object]] = []
    recipe_invalid: dict[str, int] = {}
    for mb in space.micro_batches:
        for rc in space.recomputes:
            for off in space.offloads:
                for prec in space.precisions:
                    try:
                        replace(base, micro_batch=mb, recompute=rc, offload=off, precision=prec)
                    except TrainplanError as err:
                        k = f"recipe: {err.field}"
                        recipe_invalid[k] = recipe_invalid.get(k, 0) + 1
                        continue
                    choices.append({"micro_batch": mb, "recompute": rc, "offload": off, "precision": prec})
    for tp in tps:
        # (ep, sequence parallelism, etp): parallel folding (Layout.etp = 1) where it differs
        # from the default split, experts spread over ep ranks with tp > 1 and sequence
        # parallelism, on the stack it is modelled for (flops.check_moe_tp)
        folds = (0, 1) if base.stack == "megatron" else (0,)
        splits = [
            (e, s, f)
            for e in eps
            for s in ((False, True) if tp > 1 else (False,))
            for f in (folds if e > 1 and s else (0,))
        ]
        for pp in pps:
            for cp in cps:
                for ep, sp, etp in splits:
                    scheds: list[tuple[str, int]] = [("1f1b", 1)]
                    if pp > 1:
                        if "interleaved" in space.pp_schedules and 2 * pp <= model.num_layers:
                            scheds.append(("interleaved", 2))
                        if "zb" in space.pp_schedules:
                            scheds.append(("zb", 1))
                        if "1f1b" not in space.pp_schedules:
                            scheds = scheds[1:] or scheds
                    for sched, v in scheds:
                        try:
                            lay = Layout(
                                dp=ep,
                                tp=tp,
                                pp=pp,
                                cp=cp,
                                ep=ep,
                                sequence_parallel=sp,
                                pp_schedule=sched,  # type: ignore[arg-type]
                                virtual_stages=v,
                                etp=etp or None,
                            )
                            lay.check_model(model)
                            lay.check_batch(seq_len=seq, micro_batch=1, global_batch=None)
                            check_moe_routing(base, lay)  # the scalar estimate raises it too
                            check_mla_layout(model, base, lay)
                            check_moe_tp(model, base, lay)
                            check_fused_loss(base, lay)
                            check_window_layout(model, base, lay)
                        except TrainplanError as err:
                            invalid[f"layout: {err.field}"] = invalid.get(f"layout: {err.field}", 0) + 1
                            continue
                        for k, count in recipe_invalid.items():
                            invalid[k] = invalid.get(k, 0) + count
                        shared: dict[str, object] = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
                        shared |= {"sequence_parallel": sp, "pp_schedule": sched, "virtual_stages": v}
                        if etp:
                            shared["etp"] = etp
                        # Per-op selective checkpointing is modelled for dense blocks without
                        # tensor or context parallelism (sac.check_sac, which the scalar
                        # estimate raises): its cores elsewhere are invalid, not searched.
                        sac_ok = not model.num_moe_layers and tp == 1 and cp == 1
                        valid = [c for c in choices if sac_ok or c["recompute"] != "sac"]
                        if len(valid) < len(choices):
                            invalid["recompute: sac"] = (
                                invalid.get("recompute: sac", 0) + len(choices) - len(valid)
                            )
                        cores += [Core.of_valid(shared | choice) for choice in valid]
    # the order of Core's comparison (its fields in turn), by key rather than by comparisons
    cores.sort(key=operator.attrgetter(*(f.name for f in fields(Core))))
    return cores, invalid


def _precision_ok(acc: Accelerator, prec: str) -> bool:
    from trainplan.recipe import GEMM_DTYPE

    dtype = GEMM_DTYPE[prec]
    if prec == "fp32" and not acc.supports("tf32"):
        dtype = "fp32"
    return acc.supports(dtype)


def enumerate_candidates(
    cores: list[Core],
    accelerators: Sequence[Accelerator],
    space: SearchSpace,
    pruned: dict[str, int],
    skipped: dict[str, str],
    global_batch: int | None = None,
) -> Candidates:
    """Cartesian product accelerator × device count × core × ZeRO stage, built with numpy.

    The candidates of one device count depend on the accelerator only through its scale-up
    domain (tp <= domain) and the precisions it supports: each such block of (dp, zero, core) rows
    is built once and shared by the accelerators that have it (``Segments``), in order; domains
    at least as large as the largest tp searched give the same block.
    """
    precs = sorted({c.precision for c in cores})
    prec_code = {p: i for i, p in enumerate(precs)}
    off_code = {o: i for i, o in enumerate(OFFLOADS)}
    tab = np.array(
        [
            (
                c.tp,
                c.tp * c.pp * c.cp,
                c.cp,
                c.ep,
                off_code[c.offload],
                prec_code[c.precision],
                c.micro_batch,
                c.tp if c.etp else 1,  # the expert groups fold into tp·cp·dp ranks, else dp·cp
            )
            for c in cores
        ],
        dtype=np.int64,
    ).reshape(len(cores), 8)
    tp, mp, cp, ep, off, prec, _mbs, fold = (np.ascontiguousarray(tab[:, j]) for j in range(8))
    folding = bool((fold > 1).any())  # folded cores: their ep divides tp·cp·dp
    tp_max = int(tp.max(initial=1))
    off_none, off_params = off_code["none"], off_code["optimizer+params"]
    zeros = np.array(space.zero_stages, dtype=np.int64)
    blocks: list[tuple[npt.NDArray[np.int64], ...]] = []
    # block id (-1: empty) and drop counts per (device count, domain, supported precisions)
    built: dict[tuple[int, int, tuple[str, ...]], tuple[int, dict[str, int]]] = {}

    def _count_block(
        n: int, dom: int, allowed: set[str]
    ) -> tuple[tuple[npt.NDArray[np.int64], ...], dict[str, int]]:
        drops: dict[str, int] = {}
        ok_prec = np.array([p in allowed for p in precs], dtype=bool)
        sel = (tp <= dom) & (n % mp == 0) & ok_prec[prec]
        idx = np.nonzero(sel)[0]
        if idx.size == 0:
            e = np.zeros(0, dtype=np.int64)
            return (e, e, e), drops
        dp = n // mp[idx]
        ci = np.repeat(idx, zeros.size)
        dpi = np.repeat(dp, zeros.size)
        zi = np.tile(zeros, idx.size)
        shard = dpi * cp[ci]
        keep = ((shard * fold[ci]) if folding else shard) % ep[ci] == 0
        drops["ep does not divide dp·cp"] = int((~keep).sum())
        offz = off[ci]
        need_zero = ((offz != off_none) & (zi == 0)) | ((offz == off_params) & (zi != 3))
        drops["invalid: CPU offload needs ZeRO >= 1 (parameters: ZeRO 3)"] = int((keep & need_zero).sum())
        keep &= ~need_zero
        dup2 = (shard == 1) & (zi == 2)
        dup1 = (shard == 1) & (zi == 1) & (offz == off_none)
        k = "duplicate: ZeRO 1/2 with dp·cp = 1 equal ZeRO 1/0 (nothing to shard)"
        drops[k] = int((keep & (dup1 | dup2)).sum())
        keep &= ~(dup1 | dup2)
        return (dpi[keep], zi[keep], ci[keep]), drops

    seg_acc: list[int] = []
    seg_devices: list[int] = []
    seg_block: list[int] = []
    seg_len: list[int] = []
    for a, acc in enumerate(accelerators):
        if acc.name in skipped:  # refused before the search (predict.hardware_refusal)
            continue
        allowed: set[str] = {p for p in precs if _precision_ok(acc, p)}
        if not allowed:
            skipped[acc.name] = (
                f"supports none of the precisions searched ({', '.join(precs)}); "
                f"it has {', '.join(acc.supported_dtypes)}"
            )
            continue
        counts = space.device_counts or device_ladder(acc, space.max_devices)
        for n in counts:
            # only tp <= domain depends on the domain: domains above the largest tp give one block
            dom = min(acc.scale_up.domain_size, n, tp_max)
            ck = (n, dom, tuple(sorted(allowed)))
            if ck not in built:
                blk, drops = _count_block(n, dom, allowed)
                built[ck] = (len(blocks) if blk[0].size else -1, drops)
                if blk[0].size:
                    blocks.append(blk)
            b, drops = built[ck]
            for k, v in drops.items():
                pruned[k] = pruned.get(k, 0) + v
            if b < 0:
                continue
            seg_acc.append(a)
            seg_devices.append(n)
            seg_block.append(b)
            seg_len.append(int(blocks[b][0].size))
    e = np.zeros(0, dtype=np.int64)
    rows = [np.concatenate([blk[i] for blk in blocks]) if blocks else e for i in range(3)]
    block_start = np.cumsum([0, *(int(blk[0].size) for blk in blocks)], dtype=np.int64)
    return Candidates(
        segments=Segments(
            acc=np.array(seg_acc, dtype=np.int64),
            devices=np.array(seg_devices, dtype=np.int64),
            start=np.cumsum([0, *seg_len[:-1]], dtype=np.int64) if seg_len else e,
            block=np.array(seg_block, dtype=np.int64),
            block_start=block_start,
            dp=rows[0],
            zero=rows[1],
            core=rows[2],
        )
    )


# --- the planner ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Price:
    """One accelerator's price in a search: a user price, a catalog offering, or none (why)."""

    usd_per_device_hour: float | None
    offering: CloudOffering | None
    missing: str | None = None


def _price(acc: Accelerator, query: PriceQuery, prices: Mapping[str, float]) -> _Price:
    """``prices`` (``--price``, ``--device-price``) first, else the catalog offering ``query``
    picks (:func:`~trainplan.hardware.prices.select_offering`); a filter that leaves this
    accelerator nothing makes it unpriced, with the refusal's text as the reason."""
    if acc.name in prices:
        return _Price(usd_per_device_hour=prices[acc.name], offering=None)
    try:
        offer = select_offering(acc.name, acc.cloud, query)
    except PriceError as err:
        return _Price(usd_per_device_hour=None, offering=None, missing=err.message)
    if offer is None:
        return _Price(
            usd_per_device_hour=None, offering=None, missing=f"the catalog has no dated price for {acc.name}"
        )
    return _Price(usd_per_device_hour=offer.usd_per_device_hour, offering=offer)


def _price_notes(accs: Sequence[Accelerator], priced: Sequence[_Price], query: PriceQuery) -> list[str]:
    """The rule that priced the plan and, when providers differ, which priced what."""
    offers = [(a, p.offering) for a, p in zip(accs, priced, strict=True) if p.offering is not None]
    if not offers:
        return []
    notes = [DEFAULT_RULE if query.is_open else f"prices: {_describe_query(query)}"]
    providers = {o.provider for _, o in offers}
    if len(providers) > 1:
        notes.append(
            "prices come from different providers: "
            + ", ".join(f"{a.name} {o.provider} {o.kind} ({o.date})" for a, o in offers)
            + "; hold one provider with --provider"
        )
    return notes


def _unpriced_note(accs: Sequence[Accelerator], prices: Sequence[float | None], query: PriceQuery) -> str:
    """Which accelerators have no price: none in the catalog, or none the filters keep."""
    none = [a.name for a, p in zip(accs, prices, strict=True) if p is None and not a.cloud]
    filtered = [a.name for a, p in zip(accs, prices, strict=True) if p is None and a.cloud]
    parts = []
    if none:
        parts.append(", ".join(none) + " (no dated price in the catalog)")
    if filtered:
        parts.append(", ".join(filtered) + f" (none with {_describe_filters(query)})")
    return (
        "no price for " + "; ".join(parts) + ": planned for time; cost shown as 'no price' "
        "(give --device-price NAME=USD; `trainplan hardware show NAME` lists each offering)"
    )


def _describe_filters(query: PriceQuery) -> str:
    parts = []
    if query.provider is not None:
        parts.append(f"provider {query.provider}")
    if query.kind is not None:
        parts.append(f"kind {query.kind}")
    if query.max_age_days is not None:
        parts.append(f"a date at most {query.max_age_days} days old")
    return ", ".join(parts)


def _describe_query(query: PriceQuery) -> str:
    parts = []
    if query.provider is not None:
        parts.append(f"provider {query.provider}")
    parts.append(f"kind {query.kind}" if query.kind is not None else "on-demand first")
    if query.max_age_days is not None:
        parts.append(f"at most {query.max_age_days} days old")
    return ", ".join(parts) + ", the cheapest such offering of each accelerator"


@dataclass(frozen=True, kw_only=True)
class _Context:
    model: ModelSpec
    base: Recipe
    cores: list[Core]
    accs: list[Accelerator]
    prices: list[float | None]
    provider: str | None
    pue: float
    offerings: tuple[CloudOffering | None, ...] = ()
    cand: Candidates
    res: BulkResult
    options: LayoutOptions = DEFAULT_LAYOUT_OPTIONS
    host_memory: float | None = None
    reliability: Reliability | None = DEFAULT_RELIABILITY
    memory_margin: float = 0.0


def _scalar(ctx: _Context, i: int) -> Estimate:
    """The scalar estimate of candidate ``i`` (the planner's answer is always this one)."""
    a, n, dp, zero, c = ctx.cand.at(i)
    core = ctx.cores[c]
    recipe = core.recipe(ctx.base)
    per_step = dp * core.micro_batch
    gb = int(nearest_micro_batches(int(ctx.base.global_batch or 0), per_step)) * per_step
    offering = ctx.offerings[a] if ctx.offerings else None
    return estimate(
        System(
            accelerator=ctx.accs[a],
            num_devices=n,
            host_memory_bytes_per_node=ctx.host_memory,
            offering=offering,
        ),
        ctx.model,
        recipe if gb == recipe.global_batch else replace(recipe, global_batch=gb),
        core.layout(dp, zero, ctx.options),
        price_usd_per_device_hour=None if offering is not None else ctx.prices[a],
        provider=None,
        pue=ctx.pue,
        reliability=ctx.reliability,
        memory_margin=ctx.memory_margin,
    )


def _no_candidate_message(
    skipped: Mapping[str, str], pruned: Mapping[str, int], invalid: Mapping[str, int], space: SearchSpace
) -> str:
    """Why no layout was left to evaluate: skipped accelerators, then the filters that removed
    candidates (largest first); never an empty reason."""
    reasons = [f"{k}: {v}" for k, v in skipped.items()]
    drops = sorted(((v, k) for k, v in {**pruned, **invalid}.items() if v), reverse=True)
    reasons += [f"{k} ({v:,} layouts)" for v, k in drops]
    if not reasons:
        counts = space.device_counts or f"the device ladder up to --max-devices {space.max_devices}"
        reasons = [f"no layout of the model divides the device counts searched ({counts})"]
    return "no candidate layout: " + "; ".join(reasons)


def _rounded_batch_notes(global_batch: int, plans: Sequence[Plan]) -> list[str]:
    """Say which plans train with another global batch than the one requested (the nearest
    multiple of their dp·micro_batch, ``layout.nearest_micro_batches``)."""
    rounded = {
        f"{p.label} {p.estimate.layout.describe()}: {p.estimate.recipe.global_batch}"
        for p in plans
        if p.estimate.recipe.global_batch != global_batch
    }
    if not rounded:
        return []
    return [
        f"global batch {global_batch} is not a multiple of dp·micro-batch everywhere: those plans train "
        "with the nearest multiple (" + "; ".join(sorted(rounded)) + ")"
    ]


def candidate_estimate(ctx: _Context, i: int) -> Estimate:
    return _scalar(ctx, i)


def _objective_values(
    time_s: npt.NDArray[np.float64],
    step_s: npt.NDArray[np.float64],
    c: npt.NDArray[np.float64],
    objective: Objective,
) -> npt.NDArray[np.float64]:
    t = time_s if not np.all(np.isnan(time_s)) else step_s
    if objective == "time":
        return np.asarray(t)
    if objective == "cost":
        return np.asarray(np.where(np.isnan(c), np.inf, c))
    t0 = np.nanmin(t) if t.size else 1.0
    c0 = np.nanmin(c) if np.any(~np.isnan(c)) else 1.0
    return np.asarray(np.where(np.isnan(c), np.inf, np.sqrt((t / t0) * (c / c0))))


def _fmt_usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _binds(est: Estimate) -> list[str]:
    """What limits a plan, from the estimate's named terms."""
    out: list[str] = []
    mem = est.memory
    frac = mem.per_device_bytes / mem.capacity_bytes
    top = sorted(((n, v) for n, v in mem.terms() if v > 0), key=lambda kv: -kv[1])[:2]
    terms = ", ".join(f"{n} {fmt_bytes(v)}" for n, v in top)
    if frac >= MEMORY_BOUND_FRACTION:
        out.append(
            f"memory: {fmt_bytes(mem.per_device_bytes)} of {fmt_bytes(mem.capacity_bytes)} per device "
            f"({100 * frac:.0f}%; {terms}) — little headroom"
        )
    else:
        out.append(f"memory: {100 * frac:.0f}% of {fmt_bytes(mem.capacity_bytes)} per device ({terms})")
    t = est.time
    step = t.step_s
    # the registry's groups (trainplan.terms), not a second list of the terms
    by_group = dict.fromkeys(TERM_GROUPS, 0.0)
    for term in TIME_TERMS:
        by_group[term.group] += getattr(t, term.key)
    comm = {
        term.label.removesuffix(" (exposed)"): getattr(t, term.key)
        for term in TIME_TERMS
        if term.group == "communication"
    }
    groups = {
        "compute": by_group["compute"],
        "interconnect": by_group["communication"],
        "pipeline bubble": by_group["bubble"],
        "gradient accumulation / optimizer step / offload": by_group["optimizer"] + by_group["offload"],
    }
    name, val = max(groups.items(), key=lambda kv: kv[1])
    if name == "compute":
        out.append(
            f"compute-bound: compute is {100 * val / step:.0f}% of the {fmt_duration(step)} step "
            f"(MFU {100 * est.throughput.mfu:.1f}%)"
        )
    else:
        detail = ""
        if name == "interconnect":
            cname, cval = max(comm.items(), key=lambda kv: kv[1])
            detail = f", mostly {cname} {100 * cval / step:.0f}%"
        out.append(
            f"{name}-bound: {name} is {100 * val / step:.0f}% of the {fmt_duration(step)} step{detail}"
        )
    others = [(k, v) for k, v in groups.items() if k != name and v / step >= 0.05]
    if others:
        out.append("also: " + ", ".join(f"{k} {100 * v / step:.0f}%" for k, v in others))
    return out


@dataclass(frozen=True, kw_only=True)
class _Figures:
    """Bulk figures of the representatives, by candidate index."""

    acc: dict[int, int]
    devices: dict[int, int]
    step_s: dict[int, float]
    time_s: dict[int, float]
    cost_usd: dict[int, float]


class _Planner:
    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        res, cand = ctx.res, ctx.cand
        # representatives: fastest feasible layout per (accelerator, devices), ties broken toward
        # the simpler plan — less offload, a lower ZeRO stage, less model parallelism — then by
        # memory, core and index (the first of a sort by step time and those keys)
        idx = res.timed
        step = res.times["step_s"]
        fc = cand.take(idx)
        group = fc.acc * (1 << 32) + fc.devices
        _, gid = np.unique(group, return_inverse=True)
        best = np.full(int(gid.max(initial=-1)) + 1, np.inf)
        np.fmin.at(best, gid, step)
        tied = np.flatnonzero(step == best[gid])
        per_device = res.memory_at("per_device", idx[tied])
        offload_rank = np.array([OFFLOADS.index(c.offload) for c in ctx.cores], dtype=np.int64)
        model_parallel = np.array([c.tp * c.pp * c.cp * c.ep for c in ctx.cores], dtype=np.int64)
        tc = fc.core[tied]
        order = np.lexsort(
            (idx[tied], tc, per_device, model_parallel[tc], fc.zero[tied], offload_rank[tc], step[tied])
        )
        tied = tied[order]
        _, first = np.unique(group[tied], return_index=True)
        pos = tied[np.sort(first)]
        reps = idx[pos].tolist()
        self.reps = np.array(reps, dtype=np.int64)
        self.fig = _Figures(
            acc=dict(zip(reps, fc.acc[pos].tolist(), strict=True)),
            devices=dict(zip(reps, fc.devices[pos].tolist(), strict=True)),
            step_s=dict(zip(reps, step[pos].tolist(), strict=True)),
            time_s=dict(zip(reps, res.times["time_s"][pos].tolist(), strict=True)),
            cost_usd=dict(zip(reps, res.times["cost_usd"][pos].tolist(), strict=True)),
        )
        self.rep_of = {(self.fig.acc[i], self.fig.devices[i]): i for i in reps}
        self._est: dict[int, Estimate] = {}
        self._counts: dict[int, list[int]] = {}

    def est(self, i: int) -> Estimate:
        if i not in self._est:
            e = _scalar(self.ctx, i)
            self._est[i] = e
        return self._est[i]

    def label(self, i: int) -> str:
        a, n, *_ = self.ctx.cand.at(i)
        return f"{n}×{self.ctx.accs[a].name}"

    def sort_key(self, i: int, objective: Objective, values: Mapping[int, float]) -> tuple[object, ...]:
        r = self.fig
        cost = r.cost_usd[i]
        return (
            values[i],
            r.step_s[i] if math.isnan(r.time_s[i]) else r.time_s[i],
            math.inf if math.isnan(cost) else cost,
            self.ctx.accs[r.acc[i]].name,
            r.devices[i],
        )

    def counts_of(self, a: int) -> list[int]:
        got = self._counts.get(a)
        if got is None:
            seg = self.ctx.cand.segments
            got = np.unique(seg.devices[seg.acc == a]).tolist()
            self._counts[a] = got
        return got

    def leanest(self, a: int, n: int) -> int | None:
        """The valid candidate with the least memory per device at (accelerator, devices)."""
        return self.ctx.res.leanest(a, n)

    def why_not_fit(self, a: int, n: int) -> str | None:
        i = self.leanest(a, n)
        acc = self.ctx.accs[a]
        if i is None:
            return None
        e = self.est(i)
        mem = e.memory
        top = sorted(((k, v) for k, v in mem.terms() if v > 0), key=lambda kv: -kv[1])[:2]
        terms = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in top)
        return (
            f"{n}×{acc.name} does not fit: even the leanest layout ({e.layout.describe()}, "
            f"{e.recipe.recompute} recompute, offload {e.recipe.offload}) needs "
            f"{fmt_bytes(mem.per_device_bytes)} per device > {fmt_bytes(mem.capacity_bytes)} ({terms})"
        )

    def compare_line(self, i: int, j: int) -> str:
        """Why plan j loses against plan i (or what it trades): "dominated" when it takes longer
        and costs no less; the same cost (within half a percent or $0.50) is said once as such."""
        r = self.fig
        ti, tj = r.time_s[i], r.time_s[j]
        if math.isnan(ti):
            ti, tj = r.step_s[i], r.step_s[j]
        ci, cj = r.cost_usd[i], r.cost_usd[j]
        speed = f"{tj / ti:.2f}× the time" if tj >= ti else f"{ti / tj:.2f}× faster"
        priced = not (math.isnan(ci) or math.isnan(cj))
        same_cost = priced and abs(cj - ci) <= max(0.5, 0.005 * abs(ci))
        if math.isnan(cj):
            money = "no price known"
        elif math.isnan(ci):
            money = f"costs {_fmt_usd(cj)}"
        elif same_cost:
            money = f"the same cost ({_fmt_usd(cj)})"
        elif cj > ci:
            money = f"{_fmt_usd(cj - ci)} more ({_fmt_usd(cj)})"
        else:
            money = f"{_fmt_usd(ci - cj)} cheaper ({_fmt_usd(cj)})"
        dominated = tj > ti and priced and (same_cost or cj > ci)
        verdict = "dominated: " if dominated else ("trade-off: " if priced and tj < ti and cj > ci else "")
        return f"{self.label(j)} ({self.est_layout(j)}): {verdict}{speed}, {money}"

    def est_layout(self, j: int) -> str:
        *_, dp, zero, c = self.ctx.cand.at(j)
        return self.ctx.cores[c].layout(dp, zero, self.ctx.options).describe()

    def alternatives(self, i: int, ranked: Sequence[int]) -> list[str]:
        a, n = self.fig.acc[i], self.fig.devices[i]
        acc = self.ctx.accs[a]
        out: list[str] = []
        counts = self.counts_of(a)
        smaller = [k for k in counts if k < n]
        larger = [k for k in counts if k > n]
        if smaller:
            k = smaller[-1]
            j = self.rep_of.get((a, k))
            if j is None:
                line = self.why_not_fit(a, k)
                if line is None:
                    line = f"{k}×{acc.name}: no valid layout (see search.invalid)"
                out.append("fewer devices — " + line)
            else:
                out.append("fewer devices — " + self.compare_line(i, j))
        if larger:
            j = self.rep_of.get((a, larger[0]))
            if j is not None:
                out.append("more devices — " + self.compare_line(i, j))
        for j in ranked:
            if self.fig.acc[j] != a:
                out.append("other hardware — " + self.compare_line(i, j))
                break
        return out

    def plan(self, i: int, rank: int, ranked: Sequence[int]) -> Plan:
        e = self.est(i)
        if not e.feasible:
            raise AssertionError(
                f"planner bug: {self.label(i)} was ranked but estimate() says it does not fit"
            )
        return Plan(
            rank=rank,
            estimate=e,
            explanation=Explanation(binds=tuple(_binds(e)), alternatives=tuple(self.alternatives(i, ranked))),
        )


def plan(
    model: ModelSpec,
    recipe: Recipe,
    accelerators: Sequence[Accelerator],
    *,
    space: SearchSpace | None = None,
    objective: Objective = "time",
    top: int = 5,
    budget_usd: float | None = None,
    deadline_h: float | None = None,
    provider: str | None = None,
    prices: Mapping[str, float] | None = None,
    pue: float = DEFAULT_PUE,
    with_per_accelerator: bool = False,
    host_memory_bytes_per_node: float | None = None,
    reliability: Reliability | None = DEFAULT_RELIABILITY,
    memory_margin: float = 0.0,
    price_query: PriceQuery = OPEN,
) -> PlanResult:
    """Search accelerators × device counts × layouts for ``model`` trained with ``recipe``.

    ``recipe`` carries the fixed choices (method, optimizer, sequence length, tokens, ...); the
    fields listed in ``space`` (micro-batch, recompute, offload, precision) are searched over the
    values given there. ``prices`` overrides the catalog price per accelerator name ($/device-hour);
    the others are priced by ``price_query`` and ``provider`` (:mod:`trainplan.hardware.prices`).
    With ``objective="cost"`` the ranked plans are the cheapest plan of each accelerator.
    ``host_memory_bytes_per_node`` overrides the catalog's server CPU memory, against which
    offloaded states are checked (``memory.host_fits``). ``memory_margin``: the fraction of device
    memory every plan leaves free (``memory.usable_bytes``, as estimate's ``fits``).
    """
    model = model.with_mtp(recipe.mtp_layers)  # the MTP modules are layers of the trained model
    t0 = time.perf_counter()
    space = space or SearchSpace()
    if objective not in OBJECTIVES:
        raise TrainplanError("objective", f"unknown objective {objective!r}; choose {', '.join(OBJECTIVES)}")
    if top <= 0:
        raise TrainplanError("top", f"must be a positive integer, got {top}")
    if budget_usd is not None and not budget_usd > 0:
        raise TrainplanError("budget", f"must be a positive number of USD, got {budget_usd}")
    if deadline_h is not None and not deadline_h > 0:
        raise TrainplanError("deadline", f"must be a positive number of hours, got {deadline_h}")
    if (budget_usd is not None or deadline_h is not None) and recipe.tokens is None:
        raise TrainplanError("tokens", "a budget or a deadline needs --tokens (the length of the run)")
    check_objective_tokens(objective, recipe.tokens)
    if not accelerators:
        raise TrainplanError("hardware", "name at least one accelerator")
    if pue < 1.0:
        raise TrainplanError("pue", f"PUE is at least 1.0, got {pue}")
    prices = dict(prices or {})
    notes: list[str] = []
    base = recipe
    if base.global_batch is None:
        gb = default_global_batch(base)
        base = replace(base, global_batch=gb)
        notes.append(
            f"global batch {gb} sequences ({gb * base.seq_len:,} tokens) "
            f"per step, the default for {base.method}; fix it with --global-batch"
        )
    accs = sorted(accelerators, key=lambda a: a.name)
    if provider is not None:
        price_query = replace(price_query, provider=provider)
    check_provider(price_query.provider, [a.cloud for a in accs if a.name not in prices])
    acc_price_info = [_price(a, price_query, prices) for a in accs]
    if not price_query.is_open and all(p.usd_per_device_hour is None for p in acc_price_info):
        first = accs[0]
        raise refusal(first.name, first.cloud, price_query)
    acc_prices = [p.usd_per_device_hour for p in acc_price_info]
    unpriced = tuple(a.name for a, p in zip(accs, acc_prices, strict=True) if p is None)
    notes += _price_notes(accs, acc_price_info, price_query)
    if fp8_params_needs_sharding(base) and 0 in space.zero_stages:
        space = replace(space, zero_stages=tuple(z for z in space.zero_stages if z > 0) or (1,))
        notes.append(
            "ZeRO 0 left out: Megatron-LM keeps trained FP8 weights (--fp8-params) only with ZeRO 1 or more"
        )
    max_domain = max(a.scale_up.domain_size for a in accs)
    cores, invalid_cores = enumerate_cores(model, base, space, max_domain)
    pruned: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for acc in accs:
        not_modelled = hardware_refusal(System(accelerator=acc, num_devices=1), base)
        if not_modelled is not None:
            skipped[acc.name] = not_modelled.message
    cand = enumerate_candidates(cores, accs, space, pruned, skipped, base.global_batch)
    ev = BulkEvaluator(
        model,
        base,
        cores,
        accs,
        acc_prices,
        pue=pue,
        options=space.layout_options,
        host_memory_bytes_per_node=host_memory_bytes_per_node,
        reliability=reliability,
        memory_margin=memory_margin,
    )
    unchecked = [a.name for a in accs if a.host_memory_bytes_per_node is None]
    if host_memory_bytes_per_node is None and unchecked and any(o != "none" for o in space.offloads):
        notes.append(
            f"host memory unchecked on {', '.join(unchecked)} (no reference server in the catalog): "
            "their offload plans assume the server holds the offloaded states; give --host-memory"
        )
    notes.append(
        "not searched, applied to every candidate where it applies: overlap_grad_reduce, "
        "tp_comm_overlap, pp_comm_overlap, ep_comm_overlap, zero3_granularity, grad_accumulation "
        f"({space.layout_options.describe()})"
    )
    if base.moe_capacity_factor is not None:
        # the routing is the user's (Recipe.moe_capacity_factor, moe_dispatch), not a search axis
        left_out = sum(invalid_cores.get(f"layout: {f}", 0) for f in ("tp", "cp"))
        notes.append(
            f"not searched, as given: MoE capacity factor {base.moe_capacity_factor:g} with {base.moe_dispatch} "
            f"dispatch; {left_out:,} layout(s) left out where it is not modelled "
            "(einsum dispatch with tp > 1, a capacity factor with cp > 1)"
        )
    given = [flag for _, flag in fp8_options_set(base)] + (
        ["--fused-cross-entropy"] if base.fused_cross_entropy else []
    )
    if given:
        notes.append(f"not searched, as given: {', '.join(given)} (every candidate)")
    if base.recompute_modules is not None:
        notes.append(
            f"not searched, as given: selective recompute of {', '.join(base.recompute_modules)} "
            "(other recompute choices left out)"
        )
    res = ev.evaluate(cand, prune_slower=True) if len(cand) else None
    if res is None:
        raise TrainplanError("hardware", _no_candidate_message(skipped, pruned, invalid_cores, space))
    ctx = _Context(
        model=model,
        base=base,
        cores=cores,
        accs=accs,
        prices=acc_prices,
        provider=provider,
        pue=pue,
        offerings=tuple(p.offering for p in acc_price_info),
        cand=cand,
        res=res,
        options=space.layout_options,
        host_memory=host_memory_bytes_per_node,
        reliability=reliability,
        memory_margin=memory_margin,
    )
    k_dom = "dominated: offload where the same layout fits with less offload (never faster)"
    pruned[k_dom] = int(res.dominated.sum())
    k_slow = (
        "dominated: step-time lower bound above the exact step time of another layout on the "
        "same accelerator and device count (slower and dearer)"
    )
    pruned[k_slow] = int(res.slower.sum())
    invalid: dict[str, int] = dict(invalid_cores)
    counts = res.counts()
    for code, text in INVALID_REASONS.items():
        k = counts[code]
        if k:
            invalid[text] = k
    pl = _Planner(ctx)
    reps = pl.reps
    fig = pl.fig
    # minimum devices per accelerator
    min_devices: dict[str, int | None] = {}
    for a, acc in enumerate(accs):
        if acc.name in skipped:
            continue
        ns = [fig.devices[i] for i in reps.tolist() if fig.acc[i] == a]
        min_devices[acc.name] = min(ns) if ns else None

    rep_list = reps.tolist()
    rep_values = _objective_values(
        np.array([fig.time_s[i] for i in rep_list]),
        np.array([fig.step_s[i] for i in rep_list]),
        np.array([fig.cost_usd[i] for i in rep_list]),
        objective,
    )
    values = dict(zip(rep_list, rep_values.tolist(), strict=True))

    def ranked_of(ids: Sequence[int]) -> list[int]:
        return sorted(ids, key=lambda i: pl.sort_key(i, objective, values))

    ranked_all = ranked_of(rep_list)
    # constraints
    failures: list[str] = []
    ok = list(ranked_all)
    if budget_usd is not None:
        ok = [i for i in ok if not math.isnan(fig.cost_usd[i]) and fig.cost_usd[i] <= budget_usd]
    if deadline_h is not None:
        ok = [i for i in ok if fig.time_s[i] <= deadline_h * 3600.0]
    met = bool(ok) or (budget_usd is None and deadline_h is None)
    closest_i: int | None = None
    if not met:
        priced = [i for i in ranked_all if not math.isnan(fig.cost_usd[i])]
        if budget_usd is not None:
            if priced:
                j = min(priced, key=lambda i: (float(fig.cost_usd[i]), float(fig.time_s[i]), i))
                over = float(fig.cost_usd[j]) - budget_usd
                if over > 0:
                    failures.append(
                        f"budget {_fmt_usd(budget_usd)} cannot be met: the cheapest feasible plan, {pl.label(j)}, "
                        f"costs {_fmt_usd(float(fig.cost_usd[j]))} — {_fmt_usd(over)} ({100 * over / budget_usd:.0f}%) over"
                    )
            else:
                failures.append(
                    f"budget {_fmt_usd(budget_usd)}: no feasible plan has a known price (use --price)"
                )
        if deadline_h is not None and ranked_all:
            j = min(ranked_all, key=lambda i: (float(fig.time_s[i]), i))
            over_h = float(fig.time_s[j]) / 3600.0 - deadline_h
            if over_h > 0:
                failures.append(
                    f"deadline {deadline_h:g} h cannot be met: the fastest feasible plan, {pl.label(j)}, takes "
                    f"{float(fig.time_s[j]) / 3600.0:,.1f} h — {over_h:,.1f} h ({100 * over_h / deadline_h:.0f}%) over"
                )
        if budget_usd is not None and deadline_h is not None and not failures:
            # each alone can be met, not both together
            j1 = min(priced, key=lambda i: (float(fig.cost_usd[i]), i)) if priced else None
            failures.append(
                "budget and deadline cannot both be met: every plan within the deadline costs more than "
                f"{_fmt_usd(budget_usd)} and every plan within budget takes longer than {deadline_h:g} h"
                + (f" (cheapest: {pl.label(j1)})" if j1 is not None else "")
            )

        def violation(i: int) -> float:
            v = 0.0
            if budget_usd is not None:
                c = float(fig.cost_usd[i])
                v = max(v, math.inf if math.isnan(c) else c / budget_usd)
            if deadline_h is not None:
                v = max(v, float(fig.time_s[i]) / (deadline_h * 3600.0))
            return v

        if ranked_all:
            closest_i = min(ranked_all, key=lambda i: (violation(i), ranked_all.index(i)))
    chosen = ok if met else []
    rows = _one_per_accelerator(chosen, fig.acc) if objective == "cost" else chosen
    top_ids = rows[:top]
    plans = mark_ties([pl.plan(i, r + 1, ranked_all) for r, i in enumerate(top_ids)], objective)
    pool = chosen if met else []
    fastest = cheapest = None
    pareto: list[Plan] = []
    if pool:
        fi = min(
            pool,
            key=lambda i: (
                float(fig.step_s[i]) if np.isnan(fig.time_s[i]) else float(fig.time_s[i]),
                pl.sort_key(i, "time", values),
            ),
        )
        fastest = pl.plan(fi, ranked_all.index(fi) + 1, ranked_all)
        priced = [i for i in pool if not math.isnan(fig.cost_usd[i])]
        if priced:
            ci = min(priced, key=lambda i: (float(fig.cost_usd[i]), pl.sort_key(i, "cost", values)))
            cheapest = pl.plan(ci, ranked_all.index(ci) + 1, ranked_all)
            front: list[int] = []
            best_cost = math.inf
            for i in sorted(
                priced,
                key=lambda i: (float(fig.time_s[i]), float(fig.cost_usd[i]), pl.sort_key(i, "time", values)),
            ):
                if float(fig.cost_usd[i]) < best_cost:
                    front.append(i)
                    best_cost = float(fig.cost_usd[i])
            pareto = [pl.plan(i, ranked_all.index(i) + 1, ranked_all) for i in front]
    closest = None if closest_i is None else pl.plan(closest_i, ranked_all.index(closest_i) + 1, ranked_all)
    per_acc: list[AcceleratorBest] = []
    ranking = ranking_statements(plans, objective)
    if with_per_accelerator:
        for a, acc in enumerate(accs):
            if acc.name in skipped:
                per_acc.append(AcceleratorBest(hardware=acc.name, plan=None, reason=skipped[acc.name]))
                continue
            mine = [i for i in ranked_all if fig.acc[i] == a]
            if mine:
                i = mine[0]
                per_acc.append(
                    AcceleratorBest(
                        hardware=acc.name, plan=pl.plan(i, ranked_all.index(i) + 1, ranked_all), reason=None
                    )
                )
                continue
            ladder = pl.counts_of(a)
            why = pl.why_not_fit(a, ladder[-1]) if ladder else None
            per_acc.append(
                AcceleratorBest(
                    hardware=acc.name,
                    plan=None,
                    reason=why or f"no valid layout up to {space.max_devices} devices",
                )
            )
    if with_per_accelerator:
        best = mark_ties([b.plan for b in per_acc if b.plan is not None], objective)
        by_rank = {p.rank: p for p in best}
        per_acc = [b if b.plan is None else replace(b, plan=by_rank[b.plan.rank]) for b in per_acc]
        ranking = ranking_statements(best, objective)
    if unpriced:
        notes.append(_unpriced_note(accs, acc_prices, price_query))
    if objective == "cost":
        notes.append(COST_TABLE_NOTE)
    notes.extend(_rounded_batch_notes(int(base.global_batch or 0), [*plans, *([closest] if closest else [])]))
    stats = SearchStats(
        candidates=len(cand),
        valid=counts[VALID],
        feasible=int(res.timed.size),
        does_not_fit=counts[VALID] - int(res.fits.sum()),
        pruned={k: v for k, v in sorted(pruned.items()) if v},
        invalid=dict(sorted(invalid.items())),
        skipped_accelerators=skipped,
        seconds=time.perf_counter() - t0,
    )
    return PlanResult(
        model=model.name,
        objective=objective,
        global_batch=int(base.global_batch or 0),
        tokens=base.tokens,
        budget_usd=budget_usd,
        deadline_h=deadline_h,
        fastest=fastest,
        cheapest=cheapest,
        pareto=tuple(pareto),
        plans=plans,
        constraints_met=met,
        constraint_failures=tuple(failures),
        closest=closest,
        min_devices=min_devices,
        unpriced=unpriced,
        stats=stats,
        per_accelerator=tuple(per_acc),
        notes=tuple(notes),
        ranking=ranking,
    )


def _one_per_accelerator(ranked: Sequence[int], acc_of: Mapping[int, int]) -> list[int]:
    """The first (best-ranked) candidate of each accelerator, in rank order."""
    seen: set[int] = set()
    out: list[int] = []
    for i in ranked:
        a = int(acc_of[i])
        if a not in seen:
            seen.add(a)
            out.append(i)
    return out


def compare(
    model: ModelSpec,
    recipe: Recipe,
    accelerators: Sequence[Accelerator],
    *,
    space: SearchSpace | None = None,
    objective: Objective = "time",
    provider: str | None = None,
    prices: Mapping[str, float] | None = None,
    pue: float = DEFAULT_PUE,
    host_memory_bytes_per_node: float | None = None,
    reliability: Reliability | None = DEFAULT_RELIABILITY,
    memory_margin: float = 0.0,
    price_query: PriceQuery = OPEN,
) -> PlanResult:
    """The same job on each accelerator at its best layout and device count (``per_accelerator``)."""
    return plan(
        model,
        recipe,
        accelerators,
        space=space,
        objective=objective,
        top=max(1, len(accelerators)),
        provider=provider,
        prices=prices,
        pue=pue,
        with_per_accelerator=True,
        host_memory_bytes_per_node=host_memory_bytes_per_node,
        reliability=reliability,
        memory_margin=memory_margin,
        price_query=price_query,
    )
