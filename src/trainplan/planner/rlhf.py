"""``plan`` and ``compare`` for RL and preference training (PPO, GRPO, DPO, reward models).

An RL candidate is a placement of the job's models, not only a training layout: colocated (every
model on every device), offload-between-phases, or disaggregated (a device group per model and
for the rollout engine, :mod:`trainplan.rlhf_groups`), with the rollout engines' TP size and, when
disaggregated, the group sizes. Each candidate is the scalar estimate
(:func:`trainplan.predict.estimate` with its :class:`~trainplan.rlhf.RLHFSpec`), so a plan's
numbers are those of ``trainplan estimate`` with the same flags — the RL terms (rollout, scoring,
critic, sync) and the memory per phase or group come from the same functions.

Searched: accelerators × device counts (the ladder of ``trainplan plan``, up to
:data:`MAX_RL_DEVICES` unless ``--devices`` names counts) × placement × rollout TP (powers of two
up to a node) × group sizes (powers of two, the reference and reward groups of one size, the
critic's the actor's or half of it) × precision × recompute × offload × micro-batch (the largest
that fits for each of the others: a smaller one is not evaluated). Fixed, as the RL trainers
run them: the trained models shard with ZeRO-3 over their devices (OpenRLHF and DeepSpeed-Chat
DeepSpeed ZeRO-3, verl and TRL FSDP), tp = pp = 1; the rollout engine's memory fraction is the
given one, else 0.3 colocated (TRL) and 0.9 on its own devices (vLLM's ``gpu_memory_utilization``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, cast

from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.prices import OPEN, PriceQuery, check_provider
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.planner.search import (
    AcceleratorBest,
    Explanation,
    Objective,
    Plan,
    PlanResult,
    SearchSpace,
    SearchStats,
    _precision_ok,
    _price,
    _price_notes,
    default_global_batch,
    device_ladder,
    mark_ties,
    ranking_statements,
)
from trainplan.predict import Estimate, estimate
from trainplan.recipe import Recipe, RLHFPlacement
from trainplan.rlhf import ROLLOUT_METHODS, RLHFSpec
from trainplan.rlhf_groups import DEDICATED_ENGINE_MEM_FRACTION, DeviceGroup

MAX_RL_DEVICES: Final = 64
"""The default ladder's top for RL jobs (each candidate is a scalar estimate); ``--devices``
names larger counts."""


def _pow2(upto: int) -> list[int]:
    return [2**k for k in range(int(math.log2(upto)) + 1)] if upto >= 1 else []


def group_splits(spec: RLHFSpec, devices: int) -> Iterator[tuple[DeviceGroup, ...]]:
    """Disaggregated placements of ``devices``: actor, critic (PPO: the actor's size or half),
    reference and reward (one size), rollout — powers of two that add up to ``devices``."""
    roles = spec.group_roles
    frozen = [r for r in roles if r in ("ref", "reward")]
    sizes = _pow2(devices)
    for actor, rollout in itertools.product(sizes, sizes):
        critics = sorted({actor, actor // 2} - {0}) if "critic" in roles else [0]
        for critic, frozen_n in itertools.product(critics, sizes if frozen else [0]):
            if actor + critic + frozen_n * len(frozen) + rollout != devices:
                continue
            groups = [DeviceGroup(roles=("actor",), devices=actor)]
            if critic:
                groups.append(DeviceGroup(roles=("critic",), devices=critic))
            groups += [DeviceGroup(roles=(r,), devices=frozen_n) for r in frozen]
            groups.append(DeviceGroup(roles=("rollout",), devices=rollout))
            yield tuple(groups)


def placements(
    spec: RLHFSpec, devices: int, node: int, values: Mapping[str, Any], groups: tuple[DeviceGroup, ...] = ()
) -> Iterator[RLHFSpec]:
    """The RL placements of ``spec`` on ``devices``: the given placement, rollout TP and
    ``groups`` stay; the others are searched."""
    given_placement = values.get("placement")
    given_tp = values.get("rollout_tp")
    given_frac = values.get("rollout_engine_mem_fraction")
    if spec.method not in ROLLOUT_METHODS:
        pair_choices: list[RLHFPlacement] = (
            [given_placement] if given_placement else ["colocated", "offload-between-phases"]
        )
        for p in pair_choices:
            if spec.method == "rm" and p != "colocated":
                continue
            yield dataclasses.replace(spec, placement=p)
        return
    choices: list[RLHFPlacement] = (
        [given_placement] if given_placement else ["colocated", "offload-between-phases", "disaggregated"]
    )
    if groups:
        choices = ["disaggregated"]
    tps = [given_tp] if given_tp else [t for t in _pow2(min(devices, node))]
    for p in choices:
        if p != "disaggregated":
            for tp in tps:
                if devices % tp == 0:
                    yield dataclasses.replace(spec, placement=p, groups=(), rollout_tp=tp)
            continue
        splits = [groups] if groups else list(group_splits(spec, devices))
        if groups and sum(g.devices for g in groups) != devices:
            continue
        frac = given_frac if given_frac is not None else DEDICATED_ENGINE_MEM_FRACTION
        for groups in splits:
            rollout_n = next((g.devices for g in groups if "rollout" in g.roles), 0)
            for tp in tps:
                if rollout_n and rollout_n % tp == 0:
                    yield dataclasses.replace(
                        spec,
                        placement="disaggregated",
                        groups=groups,
                        rollout_tp=tp,
                        rollout_engine_mem_fraction=frac,
                    )


def _objective(e: Estimate, objective: Objective) -> float:
    t = e.run.time_s if e.run.time_s is not None else e.time.step_s
    if objective == "time":
        return t
    c = e.run.cost_usd
    if objective == "cost":
        return math.inf if c is None else c
    return math.inf if c is None else math.sqrt(t * c)


def _binds(e: Estimate) -> tuple[str, ...]:
    rl = e.rlhf
    assert rl is not None
    split = rl.split_s(e.time)
    longest = max(split, key=lambda k: split[k])
    where = f"{rl.peak_phase}" if rl.groups else f"the {rl.peak_phase} phase"
    return (
        f"memory: {100 * rl.per_device_bytes / rl.capacity_bytes:.0f}% of the device at the peak ({where})",
        f"time: {longest} takes {100 * split[longest] / e.time.step_s:.0f}% of the RL step "
        f"({', '.join(f'{k} {v:,.1f} s' for k, v in split.items())})",
    )


def describe(e: Estimate) -> str:
    """The layout cell of an RL plan: placement, groups or data-parallel size, engines' TP."""
    rl = e.rlhf
    assert rl is not None
    s = rl.spec
    tp = f" rtp{s.rollout_tp}" if s.method in ROLLOUT_METHODS else ""
    if rl.groups:
        return "disagg " + ",".join(f"{g.label}{g.devices}" for g in rl.groups) + tp
    short = {"colocated": "coloc", "offload-between-phases": "offload"}[s.placement]
    return f"{short} dp{e.layout.dp} z{e.layout.zero}{tp}"


def plan_rlhf(
    values: Mapping[str, Any],
    model: ModelSpec,
    recipe: Recipe,
    spec: RLHFSpec,
    accelerators: Sequence[Accelerator],
    space: SearchSpace,
    *,
    groups: tuple[DeviceGroup, ...] = (),
    objective: Objective,
    top: int,
    compare_mode: bool,
    prices: Mapping[str, float],
    price_query: PriceQuery = OPEN,
    host_memory_bytes_per_node: float | None,
    reliability: Any,
) -> PlanResult:
    """Search placements × devices for one RL job; every candidate a scalar estimate."""
    t0 = time.perf_counter()
    notes: list[str] = []
    budget, deadline = values.get("budget"), values.get("deadline")
    if (budget is not None or deadline is not None) and recipe.tokens is None:
        raise TrainplanError("tokens", "a budget or a deadline needs --tokens (the length of the run)")
    base = recipe
    if base.global_batch is None:
        gb = default_global_batch(base)
        base = dataclasses.replace(base, global_batch=gb)
        notes.append(
            f"global batch {gb} prompts / pairs per step, the default for {base.method}; fix it with --global-batch"
        )
    notes.append(
        "RL candidates: placement, rollout TP and device groups searched; the trained models shard with "
        "ZeRO-3 over their devices, tp = pp = 1 (OpenRLHF, DeepSpeed-Chat, verl, TRL), not searched"
    )
    recomputes = space.recomputes if values.get("recompute") is not None else ("full", "none")
    offloads = space.offloads if values.get("offload") is not None else ("none", "optimizer")
    if values.get("recompute") is None or values.get("offload") is None:
        notes.append(
            f"RL candidates search recompute {', '.join(recomputes)} and offload {', '.join(offloads)} "
            "(give --recompute / --offload to fix or widen them)"
        )
    accs = sorted(accelerators, key=lambda a: a.name)
    if values.get("provider") is not None:
        price_query = dataclasses.replace(price_query, provider=values["provider"])
    check_provider(price_query.provider, [a.cloud for a in accs if a.name not in prices])
    price_of = {a.name: _price(a, price_query, prices) for a in accs}
    notes += _price_notes(accs, list(price_of.values()), price_query)
    counted = 0
    fits_no = 0
    invalid: dict[str, int] = {}
    pruned: dict[str, int] = {}
    skipped: dict[str, str] = {}
    feasible: list[Estimate] = []
    per_acc_best: dict[str, Estimate] = {}
    min_devices: dict[str, int | None] = {}
    top_devices = space.max_devices if space.device_counts else min(space.max_devices, MAX_RL_DEVICES)
    if not space.device_counts and space.max_devices > MAX_RL_DEVICES:
        notes.append(f"RL plans search up to {MAX_RL_DEVICES} devices; name larger counts with --devices")
    key_mb = "smaller micro-batch than one that fits (not evaluated)"
    for acc in accs:
        precisions = [p for p in space.precisions if _precision_ok(acc, p)]
        if not precisions:
            skipped[acc.name] = f"none of the precisions {', '.join(space.precisions)} is supported"
            continue
        offering = price_of[acc.name].offering
        price = None if offering is not None else price_of[acc.name].usd_per_device_hour
        counts = space.device_counts or device_ladder(acc, top_devices)
        min_devices[acc.name] = None
        for n in counts:
            system = System(
                accelerator=acc,
                num_devices=n,
                host_memory_bytes_per_node=host_memory_bytes_per_node,
                offering=offering,
            )
            options = cast(Any, space.layout_options.for_candidate(sequence_parallel=False, pp=1, zero=3))
            layout = Layout(dp=n, zero=3, **options)
            for cand_spec in placements(spec, n, acc.devices_per_node, values, groups):
                for prec, rc, off in itertools.product(precisions, recomputes, offloads):
                    mbs = sorted(space.micro_batches, reverse=True)
                    for k, mb in enumerate(mbs):
                        rec = dataclasses.replace(
                            base, precision=prec, recompute=rc, offload=off, micro_batch=mb
                        )
                        counted += 1
                        try:
                            est = estimate(
                                system,
                                model,
                                rec,
                                layout,
                                price_usd_per_device_hour=price,
                                pue=values.get("pue", 1.0) or 1.0,
                                reliability=reliability,
                                rlhf=cand_spec,
                            )
                        except TrainplanError as err:
                            reason = f"{err.field}: {str(err).split(': ', 1)[-1][:90]}"
                            invalid[reason] = invalid.get(reason, 0) + 1
                            continue
                        if not est.feasible:
                            fits_no += 1
                            continue
                        feasible.append(est)
                        if min_devices[acc.name] is None:
                            min_devices[acc.name] = n
                        pruned[key_mb] = pruned.get(key_mb, 0) + len(mbs) - k - 1
                        best = per_acc_best.get(acc.name)
                        if best is None or _objective(est, objective) < _objective(best, objective):
                            per_acc_best[acc.name] = est
                        break
    if counted == 0:
        raise TrainplanError(
            "hardware", "no candidate: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())
        )
    ranked = sorted(feasible, key=lambda e: (_objective(e, objective), e.system.num_devices))
    failures: list[str] = []
    ok = ranked
    if budget is not None:
        ok = [e for e in ok if e.run.cost_usd is not None and e.run.cost_usd <= budget]
        if not ok:
            failures.append(f"budget ${budget:,.0f} cannot be met by any RL placement searched")
    if deadline is not None:
        ok = [e for e in ok if e.run.time_s is not None and e.run.time_s <= deadline * 3600.0]
        if not ok and not failures:
            failures.append(f"deadline {deadline:g} h cannot be met by any RL placement searched")
    met = not failures

    def as_plan(e: Estimate, rank: int) -> Plan:
        alternatives = tuple(
            f"{describe(o)} on {o.system.num_devices}×{o.system.accelerator.name}: "
            f"{_objective(o, objective) / _objective(e, objective):.2f}× the {objective}"
            for o in ranked[:4]
            if o is not e
        )[:2]
        return Plan(
            rank=rank, estimate=e, explanation=Explanation(binds=_binds(e), alternatives=alternatives)
        )

    plans = mark_ties([as_plan(e, r + 1) for r, e in enumerate(ok[:top])], objective) if met else ()
    fastest = cheapest = None
    pareto: list[Plan] = []
    if met and ok:
        f = min(ok, key=lambda e: _objective(e, "time"))
        fastest = as_plan(f, ranked.index(f) + 1)
        priced = [e for e in ok if e.run.cost_usd is not None]
        if priced:
            c = min(priced, key=lambda e: (e.run.cost_usd or 0.0, _objective(e, "time")))
            cheapest = as_plan(c, ranked.index(c) + 1)
            best_cost = math.inf
            for e in sorted(priced, key=lambda e: (_objective(e, "time"), e.run.cost_usd or 0.0)):
                if (e.run.cost_usd or 0.0) < best_cost:
                    pareto.append(as_plan(e, ranked.index(e) + 1))
                    best_cost = e.run.cost_usd or 0.0
    per_acc: list[AcceleratorBest] = []
    if compare_mode:
        bests = [per_acc_best[a.name] for a in accs if a.name in per_acc_best]
        bests.sort(key=lambda e: _objective(e, objective))
        marked = {
            p.estimate.system.accelerator.name: p
            for p in mark_ties([as_plan(e, r + 1) for r, e in enumerate(bests)], objective)
        }
        for a in accs:
            if a.name in skipped:
                per_acc.append(AcceleratorBest(hardware=a.name, plan=None, reason=skipped[a.name]))
            elif a.name in marked:
                per_acc.append(AcceleratorBest(hardware=a.name, plan=marked[a.name], reason=None))
            else:
                per_acc.append(
                    AcceleratorBest(
                        hardware=a.name, plan=None, reason="no RL placement searched fits these devices"
                    )
                )
        plans = tuple(p for p in (b.plan for b in per_acc) if p is not None)
    ranking = ranking_statements(list(plans), objective)
    unpriced = tuple(a.name for a in accs if price_of[a.name].usd_per_device_hour is None)
    stats = SearchStats(
        candidates=counted,
        valid=counted - sum(invalid.values()),
        feasible=len(feasible),
        does_not_fit=fits_no,
        pruned={k: v for k, v in pruned.items() if v},
        invalid=dict(sorted(invalid.items())),
        skipped_accelerators=skipped,
        seconds=time.perf_counter() - t0,
    )
    return PlanResult(
        model=model.name,
        objective=objective,
        global_batch=int(base.global_batch or 0),
        tokens=base.tokens,
        budget_usd=budget,
        deadline_h=deadline,
        fastest=fastest,
        cheapest=cheapest,
        pareto=tuple(pareto),
        plans=tuple(plans),
        constraints_met=met,
        constraint_failures=tuple(failures),
        closest=as_plan(ranked[0], 1) if not met and ranked else None,
        min_devices=min_devices,
        unpriced=unpriced,
        stats=stats,
        per_accelerator=tuple(per_acc),
        notes=tuple(notes),
        ranking=ranking,
    )


__all__ = [
    "DEDICATED_ENGINE_MEM_FRACTION",
    "MAX_RL_DEVICES",
    "describe",
    "group_splits",
    "placements",
    "plan_rlhf",
]
