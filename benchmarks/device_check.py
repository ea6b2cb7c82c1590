"""Real training steps on one CUDA GPU beside their predictions, written as data.

Run on a machine with one NVIDIA GPU and the torch extra installed::

    python benchmarks/device_check.py --out OUT_DIR [--hardware h200] [--quick]

Each case is one ``trainplan run ... --device cuda --json`` (the plan built in PyTorch, a few
AdamW steps on synthetic tokens, see docs/run.md). Every result is appended as one JSON object
per line to ``OUT_DIR/device_measurements.jsonl`` with the date, the GPU name, the torch version,
the exact command, the measured step time and ``torch.cuda.max_memory_allocated`` peak, and the
prediction for the same plan. Cases run smallest first, each under its own timeout, so a short
loan of a GPU still returns the small ones. Without CUDA the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _case(model: str, seq: int, micro: int, *extra: str) -> tuple[str, list[str]]:
    """One BF16 single-GPU plan: (name, the flags after ``trainplan run``)."""
    name = "-".join([model, "bf16", f"s{seq}", f"b{micro}", *(e.lstrip("-") for e in extra)])
    flags = [model, "--precision", "bf16", "--seq-len", str(seq), "--micro-batch", str(micro), *extra]
    return name, flags


# Smallest first. An 8B full fine-tune does not fit one 141 GB H200 with FP32 states.
CASES: tuple[tuple[str, list[str]], ...] = (
    _case("gpt2", 1024, 8),
    _case("llama-3.2-1b", 2048, 4),
    _case("llama-3.2-1b", 2048, 4, "--recompute", "full"),
    _case("llama-3.2-1b", 2048, 4, "--recompute", "sac"),
    _case("llama-3.2-1b", 2048, 2, "--global-batch", "8", "--grad-accumulation", "autograd"),
    _case("llama-3.2-3b", 2048, 2, "--recompute", "full"),
    _case("llama-3.2-3b", 4096, 1, "--recompute", "full"),
    _case("llama-3.2-3b", 8192, 1, "--recompute", "full"),
)


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (pip install torch==2.13.0 -e '.[torch]')"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, torch.cuda.get_device_name(0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for device_measurements.jsonl")
    p.add_argument("--hardware", default="h200", help="catalog accelerator the prediction is for")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per case")
    p.add_argument("--quick", action="store_true", help="only the first two cases")
    args = p.parse_args(argv)
    ok, gpu = _cuda()
    if not ok:
        print(f"device_check: {gpu}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "device_measurements.jsonl"
    cases = CASES[:2] if args.quick else CASES
    failures = 0
    for name, flags in cases:
        cmd = [sys.executable, "-m", "trainplan.run", *flags, "--hardware", args.hardware, "--devices", "1"]
        cmd += ["--device", "cuda", "--steps", str(args.steps), "--warmup", str(args.warmup), "--json"]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out after {args.timeout:.0f} s", file=sys.stderr)
            failures += 1
            continue
        record: dict[str, object] = {
            "case": name,
            "date": datetime.date.today().isoformat(),
            "gpu": gpu,
            "command": shlex.join(["trainplan", "run", *cmd[3:]]),
            "wall_s": time.perf_counter() - t0,
            "returncode": proc.returncode,
        }
        if proc.returncode == 0:
            record["result"] = json.loads(proc.stdout)
        else:
            record["stderr"] = proc.stderr[-2000:]
            failures += 1
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        summary = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        print(f"{name}: {summary} ({record['wall_s']:.0f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
