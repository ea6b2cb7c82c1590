"""The benchmarks keep running against the current API (one short pass of each; the numbers
themselves are reported by running them, docs/plan.md and docs/timing.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(*argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, *argv], cwd=BENCH, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_plan_benchmark_runs() -> None:
    out = _run("bench_plan.py", "--case", "llama-2-7b qlora", "--repeat", "1")
    assert "cand/s" in out and "llama-2-7b qlora" in out


def test_estimate_benchmarks_run() -> None:
    out = _run("bench_vs_llm_analysis.py")
    assert "trainplan" in out and " ms" in out
    out = _run("bench_cli.py", "--repeat", "2")
    assert "vs baseline" in out


def test_ab_benchmark_runs() -> None:
    src = BENCH.parent / "src"
    out = _run("bench_ab.py", "--baseline", str(src), "--rounds", "1", "--repeat", "1")
    assert "estimate_wall_s" in out and "plan_wall_s" in out and "ratio" in out
