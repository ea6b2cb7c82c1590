"""One in-process estimate against llm-analysis's estimate of the same published run, in one run.

Run: ``python benchmarks/bench_vs_llm_analysis.py``. The row is Megatron-LM 2021 Table 1's
1008B model (128 layers, hidden 25,600, 160 heads, sequence 2,048, TP8·PP64 on 3,072 A100-80GB,
global batch 3,072, full recompute), taken from the package's validation data. Both tools get
the documented configuration. The two calls alternate in every round (``interleaved_medians_s``):
the median of each tool's calls is printed, and the median of the per-round ratio
(target: trainplan / llm-analysis <= 1).

llm-analysis is not a dependency: install it beside trainplan with
``pip install --no-deps llm-analysis==0.2.2 'fire<0.6'`` (its declared dependencies pull in
transformers, which its estimate does not need). Without it only trainplan's median is printed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

from trainplan.predict import estimate
from trainplan.validate.datasets import timing_rows
from trainplan.validate.timing import row_inputs

ROW = "megatron2021-1008.0b"


def llm_analysis_call() -> Callable[[], object] | None:
    """llm-analysis's training estimate of the same row, or None when it is not installed."""
    try:
        from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
        from llm_analysis.config import (
            ModelConfig,
            ParallelismConfig,
            get_dtype_config_by_name,
            get_gpu_config_by_name,
        )
        from llm_analysis.logger import logger
    except ImportError:
        return None
    logger.setLevel(logging.ERROR)
    model = ModelConfig(
        name="gpt-1008b",
        max_seq_len=2048,
        num_layers=128,
        n_head=160,
        hidden_dim=25600,
        vocab_size=51200,
        ffn_embed_dim=4 * 25600,
    )
    gpu = get_gpu_config_by_name("a100-sxm-80gb")
    dtype = get_dtype_config_by_name("w16a16e16")
    par = ParallelismConfig(tp_size=8, pp_size=64, dp_size=6)

    def call() -> object:
        analysis = LLMAnalysis(model, gpu, dtype, par, flops_efficiency=0.5, hbm_memory_efficiency=0.9)
        return analysis.training(
            batch_size_per_gpu=1,
            global_batch_size=3072,
            seq_len=2048,
            activation_recomputation=ActivationRecomputation.FULL,
        )

    return call


def interleaved_medians_s(fns: list[Callable[[], object]], rounds: int = 1500) -> tuple[list[float], float]:
    """Median seconds per call of each function and the median of the per-round ratio
    fns[0] / fns[-1]: the calls alternate in every round, so a change of clock speed or a
    neighbour's load during the run reaches every function alike."""
    for fn in fns:
        for _ in range(30):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(times[0], times[-1], strict=True)]
    return [statistics.median(t) for t in times], statistics.median(ratios)


def main() -> None:
    row = next(r for r in timing_rows("megatron2021_table1") if r.name == ROW)
    system, model, recipe, layout, _ = row_inputs(row)

    def ours_fn() -> object:
        return estimate(system, model, recipe, layout)

    theirs_fn = llm_analysis_call()
    print(f"{ROW}: {layout.describe()}, {system.num_devices} × {system.accelerator.name}")
    print(f"{'tool':16s} {'median':>10s}")
    if theirs_fn is None:
        (ours,), _ = interleaved_medians_s([ours_fn])
        print(f"{'trainplan':16s} {ours * 1e3:8.3f} ms")
        print("llm-analysis not installed: pip install --no-deps llm-analysis==0.2.2 'fire<0.6'")
        return
    (ours, theirs), ratio = interleaved_medians_s([ours_fn, theirs_fn])
    print(f"{'trainplan':16s} {ours * 1e3:8.3f} ms")
    print(f"{'llm-analysis':16s} {theirs * 1e3:8.3f} ms")
    print(f"ratio trainplan / llm-analysis (median of interleaved rounds): {ratio:.2f}")
    print(f"target <= 1: {'met' if ratio <= 1.0 else 'not met'}")


if __name__ == "__main__":
    main()
