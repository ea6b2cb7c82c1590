"""The ``run`` subcommand: ``trainplan run MODEL --hardware HW --devices N [layout/recipe flags] --steps K``.

:func:`register` adds it to the ``trainplan`` parser; ``python -m trainplan.run MODEL ...`` runs it
on its own. Exit status: 0 when the run finished with finite losses, 2 on bad input (one line,
nothing spawned), 1 when the distributed run failed (the end of its log follows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trainplan.errors import TrainplanError

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
# Device nodes of the NVIDIA driver and of ROCm (which PyTorch also exposes as "cuda").
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to ``subparsers`` (the object ``ArgumentParser.add_subparsers`` returned)."""
    from trainplan.cli_args import add_command

    return add_command(
        subparsers,
        "run",
        cmd_run,
        help="train the plan for real with torchrun (synthetic data) and compare with the estimate",
        description=(
            "Launch the plan with torchrun on this machine: one process per device, gloo on CPU, "
            "NCCL on CUDA; the reference model of the plan, synthetic tokens, AdamW. Prints measured "
            "step time, tokens/s and peak memory beside the prediction (see docs/run.md)."
        ),
    )


def _resolve_device(choice: str, devices: int) -> str:
    if choice == "cpu":
        return "cpu"
    if choice == "auto" and not any(os.path.exists(p) for p in GPU_DEVICE_NODES):
        return "cpu"  # no GPU driver node: skip importing torch (seconds) in the launcher
    import torch

    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise TrainplanError("device", "--device cuda but PyTorch sees no CUDA device; use --device cpu")
        have = torch.cuda.device_count()
        if have < devices:
            raise TrainplanError(
                "devices",
                f"--devices {devices} but this machine has {have} CUDA device(s); run takes one node",
            )
    return choice


def cmd_run(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        from trainplan.run.launch import TORCH_INSTALL_HINT

        sys.stderr.write(f"trainplan: error: torch: `trainplan run` needs PyTorch: {TORCH_INSTALL_HINT}\n")
        return EXIT_BAD_INPUT

    from trainplan.api import estimate_inputs
    from trainplan.predict import estimate
    from trainplan.run.config import RunConfig, check_supported
    from trainplan.run.launch import RunFailed, RunReport, check_loss, render, require_steps, spawn

    system, model, recipe, layout = estimate_inputs(vars(args))
    acc = system.accelerator
    require_steps(args.steps, args.warmup)
    if args.lr <= 0:
        raise TrainplanError("lr", f"the learning rate must be positive, got {args.lr}")
    est = estimate(system, model, recipe, layout)
    check_supported(model, recipe, layout)
    device = _resolve_device(args.device, layout.num_devices)
    cfg = RunConfig(
        model=model,
        layout=layout,
        precision=recipe.precision,
        recompute=recipe.recompute,
        recompute_early_stop=recipe.recompute_early_stop,
        seq_len=recipe.seq_len,
        micro_batch=recipe.micro_batch,
        grad_accum=est.num_microbatches,
        steps=args.steps,
        warmup=args.warmup,
        lr=args.lr,
        seed=args.seed,
        device="cuda" if device == "cuda" else "cpu",
    )
    try:
        measured = spawn(cfg, verbose=args.verbose, timeout_s=args.timeout)
        check_loss([float(x) for x in measured["losses"]])
    except RunFailed as err:
        sys.stderr.write(f"trainplan: error: run failed: {err}\n")
        return EXIT_RUN_FAILED
    report = RunReport(config=cfg, estimate=est, hardware=acc.name, measured=measured)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        print(render(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """A ``trainplan`` parser with only the ``run`` subcommand (``python -m trainplan.run``)."""
    from trainplan.cli_args import Parser

    parser = Parser(prog="trainplan", description="trainplan run: train a plan for real, compare.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainplan.run MODEL ...``: the same as ``trainplan run MODEL ...``."""
    rest = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(["run", *rest])
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except TrainplanError as err:
        sys.stderr.write(f"trainplan: error: {err}\n")
        return EXIT_BAD_INPUT


__all__ = ["build_parser", "cmd_run", "main", "register"]
