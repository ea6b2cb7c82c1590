"""This checkout against another one (a baseline), run alternately: medians and ratios in one run.

Run: ``python benchmarks/bench_ab.py --baseline PATH [--rounds N] [--repeat N]``, where ``PATH``
is the ``src`` folder of the other checkout (e.g. a ``git worktree`` of the commit to compare
with). Each round starts one process per side, baseline first, with ``PYTHONPATH`` set to its
``src``; a process times, in one run, the in-process ``estimate`` of Megatron-LM 2021's 1008B row
(TP8·PP64 on 3,072 A100-80GB; the row of ``bench_vs_llm_analysis.py``) and ``plan()`` of
llama-3.1-70b full training over the whole catalog (the first case of ``bench_plan.py``), and
prints the medians. The report is, per side, the median over the rounds of those medians, and the
ratio this checkout / baseline. On a shared machine the two sides see the same load (they
alternate), so the ratio is steadier than either time; the process CPU time is reported beside
the wall time for the same reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ROW = "megatron2021-1008.0b"


def _medians(fn: Callable[[], object], repeat: int, warm: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeat`` calls of ``fn`` after ``warm`` calls."""
    for _ in range(warm):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def child(repeat: int) -> None:
    """One side's timings, as JSON on stdout (runs under the side's ``PYTHONPATH``)."""
    from trainplan.hardware import list_accelerators
    from trainplan.models import load_model
    from trainplan.planner import SearchSpace, plan
    from trainplan.predict import estimate
    from trainplan.recipe import Recipe
    from trainplan.validate.datasets import timing_rows
    from trainplan.validate.timing import row_inputs

    row = next(r for r in timing_rows("megatron2021_table1") if r.name == ROW)
    system, model, recipe, layout, _ = row_inputs(row)
    batch = 50  # estimates per timed call: one is shorter than the clock's resolution

    def estimates() -> None:
        for _ in range(batch):
            estimate(system, model, recipe, layout)

    est_wall, est_cpu = _medians(estimates, 10 * repeat, 2)
    accs = sorted(list_accelerators(), key=lambda a: a.name)
    m70, r70, space = load_model("llama-3.1-70b"), Recipe(method="full", tokens=1e10), SearchSpace()
    plan_wall, plan_cpu = _medians(lambda: plan(m70, r70, accs, space=space), repeat, 1)
    out = {
        "estimate_wall_s": est_wall / batch,
        "estimate_cpu_s": est_cpu / batch,
        "plan_wall_s": plan_wall,
        "plan_cpu_s": plan_cpu,
    }
    print(json.dumps(out))


def run_side(src: Path, repeat: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--repeat", str(repeat)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="the src folder of the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="processes per side (median); default 5")
    parser.add_argument("--repeat", type=int, default=5, help="plan() calls per process; default 5")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.repeat)
        return
    if args.baseline is None:
        parser.error("--baseline PATH (the src folder of the other checkout) is required")
    sides = {"baseline": args.baseline.resolve(), "this": SRC}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, src in sides.items():
            runs[name].append(run_side(src, args.repeat))
    print(f"baseline: {sides['baseline']}  ({args.rounds} rounds, medians)")
    print(f"{'measure':22s} {'baseline':>12s} {'this':>12s} {'ratio':>7s}")
    for key, unit, scale in (
        ("estimate_wall_s", "ms", 1e3),
        ("estimate_cpu_s", "ms", 1e3),
        ("plan_wall_s", "s", 1.0),
        ("plan_cpu_s", "s", 1.0),
    ):
        base = statistics.median(r[key] for r in runs["baseline"])
        this = statistics.median(r[key] for r in runs["this"])
        print(f"{key:22s} {base * scale:9.3f} {unit:2s} {this * scale:9.3f} {unit:2s} {this / base:7.2f}")


if __name__ == "__main__":
    main()
