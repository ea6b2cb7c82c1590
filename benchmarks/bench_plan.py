"""Planner speed: bulk candidates per second vs the scalar ``estimate``, and a whole-catalog plan.

Run: ``python benchmarks/bench_plan.py [--case NAME] [--repeat N] [--plan-only]``. Targets
(docs/plan.md): >= 1e5 candidates evaluated per second on one core, a full plan over the whole
catalog in <= 2 s. Prints medians:

* ``scalar``: one ``estimate()`` call (per candidate);
* ``bulk (warm)``: ``BulkEvaluator.evaluate`` over every candidate of a search, per-core tables
  already built (memory for all candidates, time for those that fit and are not dominated);
* ``bulk (cold)``: the same including the per-core tables (scalar calls per distinct core);
* ``plan``: ``plan()`` end to end over the whole catalog, cold (nothing cached between runs); it
  evaluates with ``prune_slower=True``, so it computes step times only for candidates that can
  still be the fastest at their (accelerator, device count) (docs/plan.md, pruning).

The bulk columns evaluate every candidate (no step-time pruning), as the equality tests do.
``--plan-only`` prints the median, fastest and slowest of ``--repeat`` ``plan()`` runs only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from trainplan.hardware import list_accelerators
from trainplan.hardware.prices import OPEN
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
from trainplan.predict import Estimate, estimate
from trainplan.recipe import Recipe

CASES = {
    "llama-3.1-70b full": ("llama-3.1-70b", Recipe(method="full", tokens=1e10)),
    "llama-2-7b qlora": ("llama-2-7b", Recipe(method="qlora", tokens=1e9)),
    "mixtral-8x7b pretrain": ("mixtral-8x7b", Recipe(method="pretrain", tokens=1e11)),
}


def run_times(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall-clock seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--case", action="append", choices=sorted(CASES), help="run only this case (repeatable); default all"
    )
    parser.add_argument("--repeat", type=int, default=5, help="plan() runs per case (median); default 5")
    parser.add_argument(
        "--plan-only", action="store_true", help="time plan() only (skip the scalar and bulk columns)"
    )
    args = parser.parse_args(argv)
    accs = sorted(list_accelerators(), key=lambda a: a.name)
    space = SearchSpace()
    if args.plan_only:
        print(f"{'case':24s} {'candidates':>10s} {'plan':>8s} {'min':>8s} {'max':>8s}")
    else:
        print(
            f"{'case':24s} {'candidates':>10s} {'scalar':>9s} {'bulk warm':>11s} {'cand/s':>10s} "
            f"{'vs scalar':>9s} {'bulk cold':>10s} {'plan':>8s}"
        )
    for name in args.case or list(CASES):
        model_name, recipe = CASES[name]
        model = load_model(model_name)
        base = Recipe(**{**recipe.__dict__, "global_batch": default_global_batch(recipe)})
        cores, _ = enumerate_cores(model, base, space, max(a.scale_up.domain_size for a in accs))
        cand = enumerate_candidates(cores, accs, space, {}, {}, base.global_batch)

        def plan_run(model: ModelSpec = model, recipe: Recipe = recipe) -> PlanResult:
            return plan(model, recipe, accs, space=space)

        if args.plan_only:
            times = run_times(plan_run, args.repeat)
            print(
                f"{name:24s} {len(cand):>10,d} {statistics.median(times):6.2f} s {min(times):6.2f} s "
                f"{max(times):6.2f} s"
            )
            continue
        prices = [_price(a, OPEN, {}).usd_per_device_hour for a in accs]

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

        warm = statistics.median(run_times(warm_run, 5))
        cold = statistics.median(run_times(cold_run, 1))
        i = int(res.timed[0])
        acc, devices, dp, zero, c = cand.at(i)
        core = cores[c]
        system = System(accelerator=accs[acc], num_devices=devices)
        rec, lay = core.recipe(base), core.layout(dp, zero)

        def scalar_run(
            system: System = system, model: ModelSpec = model, rec: Recipe = rec, lay: Layout = lay
        ) -> Estimate:
            return estimate(system, model, rec, lay)

        scalar = statistics.median(run_times(scalar_run, 200))
        full = statistics.median(run_times(plan_run, args.repeat))
        per_s = len(cand) / warm
        print(
            f"{name:24s} {len(cand):>10,d} {scalar * 1e3:7.3f}ms {warm:9.3f} s {per_s:>10,.0f} "
            f"{per_s * scalar:8.0f}x {cold:8.2f} s {full:6.2f} s"
        )


if __name__ == "__main__":
    main()
