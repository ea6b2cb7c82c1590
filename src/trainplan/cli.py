"""Command line: thin wrappers around the library. Exit 0 on success, 2 on bad input (one line)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from trainplan.errors import TrainplanError
from trainplan.units import GB, GiB, fmt_count, fmt_duration

if TYPE_CHECKING:
    from trainplan.hardware.system import System
    from trainplan.layout import Layout
    from trainplan.models.spec import ModelSpec
    from trainplan.recipe import Recipe

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags as one line and exit status 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"trainplan: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_hardware_file_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hardware-file",
        action="append",
        default=[],
        metavar="PATH",
        help="extra accelerator catalog file (TOML, same schema as the built-ins); repeatable",
    )


def add_recipe_arguments(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """Recipe flags shared by estimate, plan, compare, verify and export."""
    from trainplan import recipe as r

    g = p.add_argument_group("recipe")
    g.add_argument("--method", choices=r.METHODS, default="pretrain" if defaults else None)
    g.add_argument("--precision", choices=r.PRECISIONS, default="bf16" if defaults else None)
    g.add_argument("--optimizer", choices=r.OPTIMIZERS, default="adamw" if defaults else None)
    g.add_argument(
        "--seq-len", type=_positive_int, default=4096 if defaults else None, help="tokens per sequence"
    )
    g.add_argument(
        "--micro-batch", type=_positive_int, default=1 if defaults else None, help="sequences per device"
    )
    g.add_argument(
        "--global-batch",
        type=_positive_int,
        default=None,
        help="sequences per optimizer step (default dp·micro)",
    )
    g.add_argument(
        "--tokens", type=_positive_float, default=None, help="tokens to train for (time, cost, energy)"
    )
    g.add_argument(
        "--recompute",
        choices=r.RECOMPUTES,
        default="none" if defaults else None,
        help="activation recompute: none; selective (the attention core, Korthikanti et al. 2022); full "
        "(each block again); sac (torchtitan's per-op selective checkpointing: every other matmul "
        "output and the attention output kept, the rest recomputed)",
    )
    g.add_argument(
        "--stack",
        choices=r.STACKS,
        default="megatron" if defaults else None,
        help="training software, for the calibrated compute efficiency: megatron (Megatron-Core, NeMo, "
        "Megatron Bridge) or pytorch (torchtitan, torchtune, FSDP/FSDP2, llm-foundry, Accelerate)",
    )
    g.add_argument(
        "--recompute-early-stop",
        action="store_true",
        help="full (or sac) recompute by PyTorch's non-reentrant checkpoint with early stop (FSDP2, "
        "torchtune, Accelerate): the trailing GEMM no saved tensor needs is not recomputed",
    )
    g.add_argument("--attention", choices=r.ATTENTIONS, default="flash" if defaults else None)
    g.add_argument("--offload", choices=r.OFFLOADS, default="none" if defaults else None)
    g.add_argument("--lora-rank", type=_positive_int, default=None)
    g.add_argument(
        "--lora-targets", default=None, help="comma-separated modules among " + ",".join(r.LORA_TARGETS)
    )
    g.add_argument("--no-double-quant", action="store_true", help="QLoRA without double quantization")
    g.add_argument("--dropout", type=float, default=0.0, help="dropout probability (stores 1-byte masks)")
    g.add_argument(
        "--no-master-weights",
        action="store_true",
        help="pure 16-bit training: no FP32 master copy, optimizer states in the weight dtype",
    )
    g.add_argument(
        "--loss-chunks",
        type=_positive_int,
        default=1,
        help="chunked cross-entropy: LM head and FP32 upcast per sequence chunk (torchtune: 8)",
    )
    g.add_argument(
        "--optimizer-in-backward",
        action="store_true",
        help="step each parameter during backward and free its gradient (torchtune optimizer_in_bwd)",
    )
    g.add_argument(
        "--paged-optimizer",
        action="store_true",
        help="optimizer states in CUDA unified memory (bitsandbytes Paged*), outside the allocator",
    )


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cost")
    g.add_argument(
        "--price", type=_positive_float, default=None, help="USD per device-hour (overrides the catalog)"
    )
    g.add_argument(
        "--provider", default=None, help="use this provider's dated catalog offering (e.g. aws, gcp)"
    )
    g.add_argument(
        "--pue", type=float, default=1.2, help="data-centre power usage effectiveness for energy (>= 1)"
    )


def add_layout_arguments(p: argparse.ArgumentParser) -> None:
    from trainplan.layout import PIPELINE_SCHEDULES

    g = p.add_argument_group("layout")
    g.add_argument(
        "--devices", type=_positive_int, default=1, help="number of accelerators (dp = devices/(tp·pp·cp))"
    )
    g.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree")
    g.add_argument("--pp", type=_positive_int, default=1, help="pipeline stages")
    g.add_argument("--cp", type=_positive_int, default=1, help="context-parallel degree")
    g.add_argument("--ep", type=_positive_int, default=1, help="expert-parallel degree")
    g.add_argument(
        "--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage (FSDP full shard = 3)"
    )
    g.add_argument(
        "--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs tp > 1)"
    )
    g.add_argument("--pp-schedule", choices=PIPELINE_SCHEDULES, default="1f1b")
    g.add_argument(
        "--virtual-stages", type=_positive_int, default=1, help="interleaved pipeline chunks per device"
    )
    g.add_argument(
        "--no-overlap-grad-reduce",
        action="store_true",
        help="reduce gradients after the backward instead of overlapping it (older Megatron-LM)",
    )
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="overlap the sequence-parallel collectives with the GEMMs (Megatron-Core --tp-comm-overlap, "
        "torchtitan async TP; needs --sequence-parallel)",
    )
    g.add_argument(
        "--pp-comm-overlap",
        action="store_true",
        help="overlap pipeline sends with other micro-batches' compute (Megatron-Core overlap_p2p_comm)",
    )
    g.add_argument(
        "--zero3-granularity",
        choices=("block", "parameter"),
        default="block",
        help="ZeRO-3 collectives: one per block, prefetched (FSDP/FSDP2, default) or one blocking "
        "gather per parameter tensor (DeepSpeed ZeRO-3 as of 2021)",
    )
    g.add_argument(
        "--grad-accumulation",
        choices=("fused", "autograd", "main_grad"),
        default="fused",
        help="how micro-batch gradients are summed: inside the weight-gradient GEMM (Megatron-LM "
        "--gradient-accumulation-fusion; default), by PyTorch autograd into .grad, or by a hook into "
        "a main-gradient buffer (Megatron-LM LocalDDP 2021-2022)",
    )


def recipe_from_args(args: argparse.Namespace) -> object:
    from trainplan.recipe import LORA_TARGETS, LoRASpec, Recipe

    lora = None
    if args.method in ("lora", "qlora"):
        targets = (
            tuple(t.strip() for t in args.lora_targets.split(",")) if args.lora_targets else LORA_TARGETS
        )
        lora = LoRASpec(
            rank=args.lora_rank or 16,
            alpha=2.0 * (args.lora_rank or 16),
            targets=targets,
            double_quant=not args.no_double_quant,
        )
    elif args.lora_rank is not None or args.lora_targets:
        raise TrainplanError(
            "lora_rank", f"--lora-rank/--lora-targets need --method lora or qlora, not {args.method}"
        )
    return Recipe(
        method=args.method,
        precision=args.precision,
        optimizer=args.optimizer,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        global_batch=args.global_batch,
        tokens=args.tokens,
        recompute=args.recompute,
        attention=args.attention,
        offload=args.offload,
        lora=lora,
        dropout=args.dropout,
        master_weights=not args.no_master_weights,
        loss_chunks=args.loss_chunks,
        optimizer_in_backward=args.optimizer_in_backward,
        paged_optimizer=args.paged_optimizer,
        recompute_early_stop=args.recompute_early_stop,
        stack=args.stack,
    )


def layout_from_args(args: argparse.Namespace) -> object:
    from trainplan.layout import Layout

    return Layout.for_devices(
        args.devices,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        ep=args.ep,
        zero=args.zero,
        sequence_parallel=args.sequence_parallel,
        pp_schedule=args.pp_schedule,
        virtual_stages=args.virtual_stages,
        overlap_grad_reduce=not args.no_overlap_grad_reduce,
        tp_comm_overlap=args.tp_comm_overlap,
        pp_comm_overlap=args.pp_comm_overlap,
        zero3_granularity=args.zero3_granularity,
        grad_accumulation=args.grad_accumulation,
    )


def _fmt_size(n_bytes: float, binary: bool) -> str:
    return f"{n_bytes / (GiB if binary else GB):10.2f}"


def inputs_from_args(args: argparse.Namespace) -> tuple[System, ModelSpec, Recipe, Layout]:
    """The four typed inputs of ``estimate`` from the shared model / hardware / layout / recipe flags."""
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.recipe import Recipe

    model = load_model(args.model)
    acc = get_accelerator(args.hardware, args.hardware_file)
    recipe = recipe_from_args(args)
    layout = layout_from_args(args)
    assert isinstance(recipe, Recipe) and isinstance(layout, Layout)
    return System(accelerator=acc, num_devices=args.devices), model, recipe, layout


# --- commands -------------------------------------------------------------------------------
def cmd_estimate(args: argparse.Namespace) -> int:
    from trainplan.estimate import estimate

    system, model, recipe, layout = inputs_from_args(args)
    est = estimate(
        system,
        model,
        recipe,
        layout,
        price_usd_per_device_hour=args.price,
        provider=args.provider,
        pue=args.pue,
    )
    if args.json:
        print(json.dumps(est.to_dict(), indent=2, sort_keys=True))
    else:
        print(render_estimate(est, binary=args.gib))
    if args.plot:
        from trainplan.web.plots import save_plot

        save_plot("estimate", est, args.plot)
    return 0


def render_estimate(est: object, *, binary: bool = False) -> str:
    from trainplan.estimate import Estimate

    assert isinstance(est, Estimate)
    unit = "GiB" if binary else "GB"
    mem = est.memory
    lines = [
        f"{est.model.name} ({fmt_count(est.summary.params)} params, {fmt_count(est.summary.trainable_params)} "
        f"trained) on {est.system.num_devices} × {est.system.accelerator.name}",
        f"recipe: {est.recipe.method}, {est.recipe.precision}, {est.recipe.optimizer}, seq {est.recipe.seq_len}, "
        f"micro-batch {est.recipe.micro_batch}, {est.num_microbatches} micro-batch(es)/step, "
        f"recompute {est.recipe.recompute}"
        f"{' (early stop)' if est.recipe.recompute in ('full', 'sac') and est.recipe.recompute_early_stop else ''}, "
        f"attention {est.recipe.attention}, offload {est.recipe.offload}",
        f"layout: {est.layout.describe()}",
        "",
        f"memory per device (pipeline stage {mem.stage}, peak in the {mem.peak_phase} phase), {unit} "
        f"(1 {unit} = {'2^30' if binary else '10^9'} bytes):",
    ]
    for name, value in mem.terms():
        if value:
            share = 100.0 * value / mem.capacity_bytes
            lines.append(f"  {name:34s}{_fmt_size(value, binary)}  {share:5.1f}% of capacity")
    lines.append(f"  {'total':34s}{_fmt_size(mem.per_device_bytes, binary)}")
    lines.append(f"  {'capacity':34s}{_fmt_size(mem.capacity_bytes, binary)}")
    if mem.host_bytes:
        lines.append(f"  {'offloaded to host memory':34s}{_fmt_size(mem.host_bytes, binary)}")
    if mem.paged_optimizer_bytes:
        lines.append(
            f"  {'paged optimizer (unified memory)':34s}{_fmt_size(mem.paged_optimizer_bytes, binary)}"
        )
    lines.append("")
    t = est.time
    lines.append(f"step time (busiest device, pipeline stage {t.stage}, {t.micro_batches} micro-batch(es)):")
    for name, value in t.terms():
        if value:
            lines.append(f"  {name:38s}{fmt_duration(value):>12s}  {100 * value / t.step_s:5.1f}%")
    lines.append(f"  {'step':38s}{fmt_duration(t.step_s):>12s}")
    thr = est.throughput
    lines.append(
        f"throughput: {thr.tokens_per_s:,.0f} tokens/s ({thr.tokens_per_s / est.system.num_devices:,.0f} per device), "
        f"MFU {100 * thr.mfu:.1f}% (model FLOPs / dense {est.recipe.gemm_dtype} peak), HFU {100 * thr.hfu:.1f}%"
    )
    if t.kappa != 1.0:
        lines.append(
            f"  (compute efficiency calibrated: κ = {t.kappa:.3f} for this accelerator generation "
            f"and the {est.recipe.stack} stack)"
        )
    for note in t.notes:
        lines.append(f"  note: {note}")
    run = est.run
    if run.time_s is not None and run.device_hours is not None:
        lines.append(
            f"run: {run.tokens:.3g} tokens in {fmt_duration(run.time_s)}, {run.device_hours:,.0f} device-hours"
            + (
                f", ${run.cost_usd:,.0f} at ${run.usd_per_device_hour:.2f}/device-hour"
                if run.cost_usd is not None
                else ", cost unknown (no price: use --price)"
            )
            + (f", {run.energy_kwh:,.0f} kWh (PUE {run.pue})" if run.energy_kwh is not None else "")
        )
        if run.price_source:
            lines.append(f"  price: {run.price_source}")
    else:
        lines.append("run: give --tokens for time-to-train, device-hours, cost and energy")
    lines.append("")
    if mem.fits:
        free = mem.capacity_bytes - mem.per_device_bytes
        lines.append(
            f"FITS: {100 * mem.per_device_bytes / mem.capacity_bytes:.0f}% of device memory, "
            f"{free / (GiB if binary else GB):.2f} {unit} free"
        )
    else:
        lines.append("DOES NOT FIT: " + "; ".join(mem.reasons()))
    return "\n".join(lines)


def cmd_hardware(args: argparse.Namespace) -> int:
    from trainplan.hardware import get_accelerator, list_accelerators
    from trainplan.hardware.render import render_show, render_table

    if args.hardware_command == "show":
        acc = get_accelerator(args.name, args.hardware_file)
        if args.json:
            print(json.dumps(acc.to_dict(), indent=2, sort_keys=True))
        else:
            print(render_show(acc))
        return 0
    accs = list_accelerators(args.hardware_file)
    if args.json:
        print(json.dumps([a.to_dict() for a in accs], indent=2, sort_keys=True))
    else:
        print(render_table(accs))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from trainplan.models import list_presets
    from trainplan.models.params import count_params

    presets = list_presets()
    if args.json:
        rows = []
        for m in presets:
            c = count_params(m)
            rows.append(
                {
                    "name": m.name,
                    "family": m.family,
                    "params": c.total,
                    "active_params": c.active,
                    "source": m.source,
                }
            )
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'name':18s} {'family':10s} {'params':>10s} {'active':>10s} {'layers':>6s} {'hidden':>6s} "
        f"{'heads':>5s} {'kv':>3s} {'vocab':>7s}"
    )
    for m in presets:
        c = count_params(m)
        print(
            f"{m.name:18s} {m.family:10s} {fmt_count(c.total):>10s} {fmt_count(c.active):>10s} "
            f"{m.num_layers:6d} {m.hidden_size:6d} {m.num_heads:5d} {m.num_kv_heads:3d} {m.vocab_size:7d}"
        )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from trainplan.validate.report import render_markdown, render_text, run_all

    results = run_all(args.dataset or None)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print(render_text(results, rows=args.rows))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(render_markdown(results))
    return 0 if all(r.passed for r in results) else 1


def cmd_export(args: argparse.Namespace) -> int:
    from trainplan.export import export_plan

    system, model, recipe, layout = inputs_from_args(args)
    result = export_plan(args.to, system, model, recipe, layout)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(result.text)
        sys.stderr.write(f"trainplan: wrote {args.to} config to {args.output}\n")
    else:
        sys.stdout.write(result.text)
        sys.stdout.flush()
    for warning in result.warnings:
        sys.stderr.write(f"trainplan: note: {warning}\n")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from trainplan.planner.command import run_plan

    return run_plan(args)


def cmd_compare(args: argparse.Namespace) -> int:
    from trainplan.planner.command import run_compare

    return run_compare(args)


def cmd_verify(args: argparse.Namespace) -> int:
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.recipe import Recipe

    model = load_model(args.model)
    recipe = recipe_from_args(args)
    layout = layout_from_args(args)
    assert isinstance(recipe, Recipe) and isinstance(layout, Layout)
    if args.device != "fake":
        raise TrainplanError(
            "device",
            f"--device {args.device}: on-device measurement runs real steps; use `trainplan run` "
            "(it reports measured peak memory and step time beside the prediction)",
        )
    try:
        from trainplan.trace.step import UnsupportedConfig
        from trainplan.trace.verify import run_verify
    except ImportError:
        raise TrainplanError(
            "verify", "tracing needs PyTorch: pip install torch==2.13.0 -e '.[torch]'"
        ) from None
    try:
        result = run_verify(model, recipe, layout, world_size=layout.num_devices, depth=args.depth)
    except UnsupportedConfig as err:
        raise TrainplanError("layout", f"the tracer cannot build this configuration: {err}") from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(result.render())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trainplan",
        description="Will a training job fit, on which accelerator, with which layout — how long, at what cost.",
    )
    parser.add_argument(
        "--version", action="version", version="trainplan " + __import__("trainplan").__version__
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("estimate", help="memory, time and cost of one configuration")
    p.add_argument("model", help="preset name (see `trainplan models`) or path to a Hugging Face config.json")
    p.add_argument("--hardware", required=True, help="accelerator name (see `trainplan hardware list`)")
    add_hardware_file_argument(p)
    add_layout_arguments(p)
    add_recipe_arguments(p)
    add_cost_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with stable keys")
    p.add_argument("--gib", action="store_true", help="print sizes in GiB (2^30) instead of GB (10^9)")
    p.add_argument(
        "--plot", metavar="FILE", default=None, help="also save a plot (.png or .svg; needs trainplan[plot])"
    )
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser("hardware", help="the accelerator catalog")
    hw = p.add_subparsers(dest="hardware_command", required=True, parser_class=_Parser)
    q = hw.add_parser("list", help="one table of every accelerator")
    add_hardware_file_argument(q)
    q.add_argument("--json", action="store_true")
    q = hw.add_parser("show", help="every figure of one accelerator, with its source")
    q.add_argument("name")
    add_hardware_file_argument(q)
    q.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_hardware)

    p = sub.add_parser(
        "validate", help="predicted vs published measurements; exit 1 when a dataset misses its bound"
    )
    p.add_argument("--dataset", action="append", default=[], help="only this dataset (repeatable)")
    p.add_argument("--rows", action="store_true", help="print every row's error")
    p.add_argument("--markdown", metavar="FILE", help="also write the markdown report (docs/validation.md)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("verify", help="trace a real PyTorch step under fake tensors; analytic vs traced")
    p.add_argument("model", help="preset name or path to a Hugging Face config.json")
    add_layout_arguments(p)
    add_recipe_arguments(p)
    p.add_argument("--depth", type=_positive_int, default=None, help="trace this many layers (default: all)")
    p.add_argument(
        "--device",
        choices=("fake", "cuda"),
        default="fake",
        help="fake: FakeTensorMode on CPU (exact, no memory)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("models", help="the model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("export", help="write the plan as a training engine's config")
    p.add_argument("model", help="preset name (see `trainplan models`) or path to a Hugging Face config.json")
    p.add_argument("--hardware", required=True, help="accelerator name (see `trainplan hardware list`)")
    add_hardware_file_argument(p)
    add_layout_arguments(p)
    add_recipe_arguments(p)
    p.add_argument(
        "--to",
        required=True,
        choices=("torchtitan", "deepspeed", "accelerate", "torchrun"),
        help="target engine (see docs/export.md)",
    )
    p.add_argument("--output", metavar="FILE", default=None, help="write here instead of stdout")
    p.set_defaults(func=cmd_export)
    from trainplan.planner.command import configure_parser as _configure_plan

    for _name, _compare, _func, _help in (
        ("plan", False, cmd_plan, "search accelerators, device counts and layouts; rank and explain"),
        ("compare", True, cmd_compare, "the same job on several accelerators, each at its best layout"),
    ):
        p = sub.add_parser(_name, help=_help)
        _configure_plan(
            p,
            compare_mode=_compare,
            add_recipe=add_recipe_arguments,
            add_cost=add_cost_arguments,
            add_hardware_file=add_hardware_file_argument,
            positive_int=_positive_int,
            positive_float=_positive_float,
        )
        p.set_defaults(func=_func)
    from trainplan.web.cli import register as register_serve

    register_serve(sub)
    from trainplan.run.cli import register as register_run

    register_run(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except TrainplanError as err:
        sys.stderr.write(f"trainplan: error: {err}\n")
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
