"""Planner speed: bulk candidates per second vs the scalar ``estimate``, and a whole-catalog plan.

Run: ``python benchmarks/bench_plan.py``. Targets (docs/plan.md): >= 1e5 candidates evaluated per
second on one core, a full plan over the whole catalog in <= 2 s. Prints medians:

* ``scalar``: one ``estimate()`` call (per candidate);
* ``bulk (warm)``: ``BulkEvaluator.evaluate`` over every candidate of a search, per-core tables
  already built (memory for all candidates, time for those that fit and are not dominated);
* ``bulk (cold)``: the same including the per-core tables (scalar calls per distinct core);
* ``plan``: ``plan()`` end to end over the whole catalog, cold (nothing cached between runs); it
  evaluates with ``prune_slower=True``, so it computes step times only for candidates that can
  still be the fastest at their (accelerator, device count) (docs/plan.md, pruning).

The bulk columns evaluate every candidate (no step-time pruning), as the equality tests do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from trainplan.estimate import Estimate, estimate
from trainplan.hardware import list_accelerators
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.planner import (
    BulkEvaluator,
    BulkResult,
    Candidates,
    Core,
    PlanResult,
    SearchSpace,
    enumerate_candidates,
    enumerate_cores,
    plan,
)
from trainplan.planner.search import _price, default_global_batch
from trainplan.recipe import Recipe

CASES = {
    "llama-3.1-70b full": ("llama-3.1-70b", Recipe(method="full", tokens=1e10)),
    "llama-2-7b qlora": ("llama-2-7b", Recipe(method="qlora", tokens=1e9)),
    "mixtral-8x7b pretrain": ("mixtral-8x7b", Recipe(method="pretrain", tokens=1e11)),
}


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    accs = sorted(list_accelerators(), key=lambda a: a.name)
    space = SearchSpace()
    print(
        f"{'case':24s} {'candidates':>10s} {'scalar':>9s} {'bulk warm':>11s} {'cand/s':>10s} "
        f"{'vs scalar':>9s} {'bulk cold':>10s} {'plan':>8s}"
    )
    for name, (model_name, recipe) in CASES.items():
        model = load_model(model_name)
        base = Recipe(**{**recipe.__dict__, "global_batch": default_global_batch(recipe)})
        cores, _ = enumerate_cores(model, base, space, max(a.scale_up.domain_size for a in accs))
        cand = enumerate_candidates(cores, accs, space, {}, {}, base.global_batch)
        prices = [_price(a, None, {}) for a in accs]

        def cold_run(
            model: ModelSpec = model,
            base: Recipe = base,
            cores: list[Core] = cores,
            prices: list[float | None] = prices,
            cand: Candidates = cand,
        ) -> BulkResult:
            return BulkEvaluator(model, base, cores, accs, prices, pue=1.2).evaluate(cand)

        ev = BulkEvaluator(model, base, cores, accs, prices, pue=1.2)
        res = ev.evaluate(cand)  # warms the per-accelerator time tables

        def warm_run(ev: BulkEvaluator = ev, cand: Candidates = cand) -> BulkResult:
            return ev.evaluate(cand)

        warm = median_s(warm_run, 5)
        cold = median_s(cold_run, 1)
        i = int(res.feasible.nonzero()[0][0])
        core = cores[int(cand.core[i])]
        system = System(accelerator=accs[int(cand.acc[i])], num_devices=int(cand.devices[i]))
        rec, lay = core.recipe(base), core.layout(int(cand.dp[i]), int(cand.zero[i]))

        def scalar_run(
            system: System = system, model: ModelSpec = model, rec: Recipe = rec, lay: Layout = lay
        ) -> Estimate:
            return estimate(system, model, rec, lay)

        scalar = median_s(scalar_run, 200)

        def plan_run(model: ModelSpec = model, recipe: Recipe = recipe) -> PlanResult:
            return plan(model, recipe, accs, space=space)

        full = median_s(plan_run, 3)
        per_s = len(cand) / warm
        print(
            f"{name:24s} {len(cand):>10,d} {scalar * 1e3:7.3f}ms {warm:9.3f} s {per_s:>10,.0f} "
            f"{per_s * scalar:8.0f}x {cold:8.2f} s {full:6.2f} s"
        )


if __name__ == "__main__":
    main()
