"""Median wall time of one in-process ``estimate`` (target: <= 1 ms).

Run: ``python benchmarks/bench_estimate.py``. Prints the median over repeated calls for a few
configurations, and the ratio against a baseline measured in the same process (building the
inputs only, i.e. the fixed cost every call pays before any modelling).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.predict import estimate
from trainplan.recipe import Recipe

CASES = {
    "llama-3.1-8b fsdp 8xh100": (
        "llama-3.1-8b",
        "h100-sxm",
        8,
        Layout(dp=8, zero=3),
        Recipe(method="full", global_batch=64),
    ),
    "llama-3.1-70b tp8 pp4 64xh100": (
        "llama-3.1-70b",
        "h100-sxm",
        64,
        Layout(dp=2, tp=8, pp=4, zero=1, sequence_parallel=True),
        Recipe(global_batch=256, recompute="selective"),
    ),
    "mixtral-8x7b ep8 8xh200": (
        "mixtral-8x7b",
        "h200",
        8,
        Layout(dp=8, ep=8, zero=3),
        Recipe(global_batch=64),
    ),
    "llama-2-7b qlora 4090": ("llama-2-7b", "rtx-4090", 1, Layout(), Recipe(method="qlora", seq_len=2048)),
}


def median_s(fn: Callable[[], object], repeat: int = 300) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    print(f"{'case':34s} {'median':>10s} {'vs baseline':>12s}")
    for name, (model_name, hw, n, layout, recipe) in CASES.items():
        model = load_model(model_name)
        system = System(accelerator=get_accelerator(hw), num_devices=n)
        base = median_s(
            lambda lay=layout, rec=recipe: (Layout(dp=lay.dp, tp=lay.tp), Recipe(seq_len=rec.seq_len))
        )
        t = median_s(lambda s=system, m=model, r=recipe, lay=layout: estimate(s, m, r, lay))
        print(f"{name:34s} {t * 1e3:8.3f} ms {t / base:10.1f}x")


if __name__ == "__main__":
    main()
