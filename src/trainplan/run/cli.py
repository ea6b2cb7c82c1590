"""The ``run`` subcommand: ``trainplan run MODEL --hardware HW --devices N [layout/recipe flags] --steps K``.

:func:`register` adds it to the ``trainplan`` parser; ``python -m trainplan.run MODEL ...`` runs it
on its own. Exit status: 0 when the run finished with finite losses, 2 on bad input (one line,
nothing spawned), 1 when the distributed run failed (the end of its log follows).
"""

from __future__ import annotations

import argparse
import importlib.util
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
    from trainplan.cli import (
        _positive_int,
        add_hardware_file_argument,
        add_layout_arguments,
        add_recipe_arguments,
    )

    p: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="train the plan for real with torchrun (synthetic data) and compare with the estimate",
        description=(
            "Launch the plan with torchrun on this machine: one process per device, gloo on CPU, "
            "NCCL on CUDA; the reference model of the plan, synthetic tokens, AdamW. Prints measured "
            "step time, tokens/s and peak memory beside the prediction (see docs/run.md)."
        ),
    )
    p.add_argument("model", help="preset name (see `trainplan models`) or path to a Hugging Face config.json")
    p.add_argument(
        "--hardware", required=True, help="accelerator the prediction is for (see `trainplan hardware list`)"
    )
    add_hardware_file_argument(p)
    add_layout_arguments(p)
    add_recipe_arguments(p)
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=_positive_int, default=8, help="optimizer steps to train (default 8)")
    g.add_argument(
        "--warmup", type=int, default=1, help="first steps left out of the median step time (default 1)"
    )
    g.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cuda (NCCL) or cpu (gloo); auto picks cuda when PyTorch sees a GPU",
    )
    g.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    g.add_argument("--seed", type=int, default=0, help="seed of the weights and the synthetic data")
    g.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS", help="stop the run after this long"
    )
    g.add_argument("--verbose", action="store_true", help="stream torchrun's and the workers' output")
    p.add_argument("--json", action="store_true", help="print one JSON object with stable keys")
    p.set_defaults(func=cmd_run)
    return p


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
    if importlib.util.find_spec("torch") is None:
        from trainplan.run.launch import TORCH_INSTALL_HINT

        sys.stderr.write(f"trainplan: error: torch: `trainplan run` needs PyTorch: {TORCH_INSTALL_HINT}\n")
        return EXIT_BAD_INPUT

    from trainplan.cli import layout_from_args, recipe_from_args
    from trainplan.estimate import estimate
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.recipe import Recipe
    from trainplan.run.config import RunConfig, check_supported
    from trainplan.run.launch import RunFailed, RunReport, check_loss, render, require_steps, spawn

    model = load_model(args.model)
    acc = get_accelerator(args.hardware, args.hardware_file)
    recipe = recipe_from_args(args)
    layout = layout_from_args(args)
    assert isinstance(recipe, Recipe) and isinstance(layout, Layout)
    require_steps(args.steps, args.warmup)
    if args.lr <= 0:
        raise TrainplanError("lr", f"the learning rate must be positive, got {args.lr}")
    est = estimate(System(accelerator=acc, num_devices=args.devices), model, recipe, layout)
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
    from trainplan.cli import _Parser

    parser = _Parser(prog="trainplan", description="trainplan run: train a plan for real, compare.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
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
