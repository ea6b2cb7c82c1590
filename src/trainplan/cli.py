"""Command line: thin wrappers around the library. Exit 0 on success, 2 on bad input (one line)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainplan.cli_args import EXIT_BAD_INPUT, Parser, add_command
from trainplan.errors import TrainplanError
from trainplan.units import GB, GiB, fmt_count, fmt_duration

if TYPE_CHECKING:
    from trainplan.predict import Estimate
    from trainplan.recipe import Recipe

__all__ = ["EXIT_BAD_INPUT", "build_parser", "main", "render_estimate"]


def _kernel_note(recipe: Recipe) -> str:
    """How the model's elementwise ops run and the Hugging Face memory terms, where they apply."""
    notes = []
    if recipe.stack == "pytorch":
        notes.append("torch.compile" if recipe.torch_compile else "eager kernels (no torch.compile)")
    if recipe.kbit_fp32_upcast:
        notes.append("PEFT k-bit FP32 upcast")
    if recipe.logits_shift_copy:
        notes.append("shifted-logits copy")
    if recipe.moe_capacity_factor is not None:
        notes.append(
            f"MoE capacity factor {recipe.moe_capacity_factor:g} (padded expert buffers, "
            f"{recipe.moe_dispatch} dispatch)"
        )
    return "".join(", " + n for n in notes)


def _fmt_size(n_bytes: float, binary: bool) -> str:
    return f"{n_bytes / (GiB if binary else GB):10.2f}"


# --- commands -------------------------------------------------------------------------------
def cmd_estimate(args: argparse.Namespace) -> int:
    from trainplan.api import estimate_from_values

    if args.plot:
        from trainplan.web.plots import check_plot_path

        check_plot_path(args.plot)  # before the estimate, not after its output
    est = estimate_from_values(vars(args))
    if args.json:
        print(json.dumps(est.to_dict(), indent=2, sort_keys=True))
    else:
        print(render_estimate(est, binary=args.gib))
    if args.plot:
        from trainplan.web.plots import save_plot

        save_plot("estimate", est, args.plot)
    return 0


def render_estimate(est: Estimate, *, binary: bool = False) -> str:
    """The human-readable ``trainplan estimate`` report."""
    from trainplan.flops import mfu_definition

    unit = "GiB" if binary else "GB"
    mem = est.memory
    lines = [
        f"{est.model.name} ({fmt_count(est.summary.params)} params, {fmt_count(est.summary.trainable_params)} "
        f"trained) on {est.system.num_devices} × {est.system.accelerator.name}",
        f"recipe: {est.recipe.method}, {est.recipe.precision}, {est.recipe.optimizer}, seq {est.recipe.seq_len}, "
        f"micro-batch {est.recipe.micro_batch}, {est.num_microbatches} micro-batch(es)/step, "
        f"recompute {est.recipe.recompute}"
        f"{' (early stop)' if est.recipe.recompute in ('full', 'sac') and est.recipe.recompute_early_stop else ''}, "
        f"attention {est.recipe.attention}, offload {est.recipe.offload}" + _kernel_note(est.recipe),
        f"layout: {est.layout.describe()}"
        + (
            "; groups: " + ", ".join(f"{g.label} {g.devices} ({g.layout})" for g in est.rlhf.groups)
            if est.rlhf is not None and est.rlhf.groups
            else ""
        ),
        *([f"engine: {est.engine.describe()}"] if est.engine is not None else []),
        "",
        f"memory per device (pipeline stage {mem.stage}, peak in the {mem.peak_phase} phase), {unit} "
        f"(1 {unit} = {'2^30' if binary else '10^9'} bytes):",
    ]
    for name, value in mem.terms():
        if value:
            share = 100.0 * value / mem.capacity_bytes
            lines.append(f"  {name:34s}{_fmt_size(value, binary)}  {share:5.1f}% of capacity")
    lines.append(f"  {'total':34s}{_fmt_size(mem.per_device_bytes, binary)}  {est.memory_band.label()}")
    lines.append(f"  {'capacity':34s}{_fmt_size(mem.capacity_bytes, binary)}")
    if mem.host_bytes:
        lines.append(f"  {'offloaded to host memory':34s}{_fmt_size(mem.host_bytes, binary)}")
        cap = mem.host_capacity_bytes_per_node
        lines.append(
            f"  {'host memory per server':34s}{_fmt_size(mem.host_bytes_per_node, binary)}"
            f"  ({mem.devices_on_node} device(s)) of "
            + (f"{_fmt_size(cap, binary).strip()} {unit}" if cap is not None else "unknown capacity")
        )
    for note in mem.notes():
        lines.append(f"  note: {note}")
    if mem.paged_optimizer_bytes:
        lines.append(
            f"  {'paged optimizer (unified memory)':34s}{_fmt_size(mem.paged_optimizer_bytes, binary)}"
        )
    lines.append("")
    if est.rlhf is not None:
        lines += render_rlhf_memory(est, binary=binary)
    t = est.time
    lines.append(f"step time (busiest device, pipeline stage {t.stage}, {t.micro_batches} micro-batch(es)):")
    for name, value in t.terms():
        if value:
            lines.append(f"  {name:38s}{fmt_duration(value):>12s}  {100 * value / t.step_s:5.1f}%")
    lines.append(f"  {'step':38s}{fmt_duration(t.step_s):>12s}  {est.step_band.label()}")
    if est.rlhf is not None:
        split = est.rlhf.split_s(t)
        lines.append(
            f"  RL step split: {', '.join(f'{k} {fmt_duration(v)}' for k, v in split.items())}; "
            f"{est.rlhf.tokens_per_step / t.step_s:,.0f} tokens/s (prompt + response tokens of the step's "
            f"{est.rlhf.sequences} sequences per second)"
        )
    thr = est.throughput
    lines.append(
        f"throughput: {thr.tokens_per_s:,.0f} tokens/s {est.step_band.label(inverse=True)} "
        f"({thr.tokens_per_s / est.system.num_devices:,.0f} per device), "
        f"MFU {100 * thr.mfu:.1f}% ({mfu_definition(est.recipe)}), HFU {100 * thr.hfu:.1f}%"
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
            + f"; time{' and cost' if run.cost_usd is not None else ''} {est.step_band.percent_text()}"
        )
        g = run.goodput
        if g is not None:
            lines.append(
                f"  goodput {100 * g.compute_s / g.wall_s:.1f}%: steps {fmt_duration(float(g.compute_s))} + "
                f"checkpoint writes {fmt_duration(float(g.checkpoint_s))} + redone work and restarts "
                f"{fmt_duration(float(g.lost_s))}; {float(g.interruptions):.3g} expected interruption(s) "
                f"(one per {fmt_duration(float(g.job_mtbf_s))}), a checkpoint every "
                f"{fmt_duration(float(g.checkpoint_interval_s))} of steps ({fmt_duration(float(g.checkpoint_write_s))} "
                f"each)"
            )
            if run.reliability is not None:
                lines.append(
                    f"  assumed: {run.reliability.describe()} (trainplan.goodput; --no-goodput for steps only)"
                )
    else:
        lines.append("run: give --tokens for time-to-train, device-hours, cost and energy")
    if run.price_source:
        lines.append(f"  price: {run.price_source}")
    for what, b in (("step-time", est.step_band), ("memory", est.memory_band)):
        if not b.calibrated:
            lines.append(
                f"  uncalibrated {what} band: no validated {what} runs in {b.class_name} or the classes "
                "it pools into; the band is the spread between the calibrated families (docs/validation.md)"
            )
        elif not b.on_part:
            lines.append(f"  no validated run on {b.part}: the {what} band is {b.family_error_text()}")

    lines.append("")
    if est.rlhf is not None:
        rl = est.rlhf
        if rl.fits:
            free = rl.capacity_bytes - rl.per_device_bytes
            lines.append(
                f"FITS ({rl.placement}, peak "
                + (f"on the {rl.peak_phase}" if rl.groups else f"in the {rl.peak_phase} phase")
                + "): "
                f"{100 * rl.per_device_bytes / rl.capacity_bytes:.0f}% of device memory, "
                f"{free / (GiB if binary else GB):.2f} {unit} free"
            )
        else:
            lines.append("DOES NOT FIT: " + "; ".join(rl.reasons()))
    elif mem.fits:
        free = mem.capacity_bytes - mem.per_device_bytes
        lines.append(
            f"FITS: {100 * mem.per_device_bytes / mem.capacity_bytes:.0f}% of device memory, "
            f"{free / (GiB if binary else GB):.2f} {unit} free"
            + (
                f" (--memory-margin {mem.memory_margin:g} keeps at least {100 * mem.memory_margin:g}%)"
                if mem.memory_margin
                else ""
            )
        )
    else:
        lines.append("DOES NOT FIT: " + "; ".join(mem.reasons()))
    lines.append(f"  within the memory band: {_verdict_text(est)}")
    return "\n".join(lines)


def _verdict_text(est: Estimate) -> str:
    """``memory.fit_verdict`` with the band's ends against the usable memory (the capacity less
    the margin, when one is asked for)."""
    low, high = est.memory_band.around(est.memory.per_device_bytes)
    cap = est.memory.usable_bytes
    of = "of usable memory" if est.memory.memory_margin else "of device capacity"
    host = "; the offloaded states exceed the host memory" if est.memory.host_fits is False else ""
    return f"{est.fit_verdict} ({100 * low / cap:.0f}% … {100 * high / cap:.0f}% {of}{host})"


def render_rlhf_memory(est: Estimate, *, binary: bool) -> list[str]:
    """The RL job's memory per device and per phase, every term named (``Estimate.rlhf``)."""
    rl = est.rlhf
    assert rl is not None
    unit = "GiB" if binary else "GB"
    per = "per device group, each at its fullest phase" if rl.groups else "per phase"
    lines = [
        f"{rl.spec.method} memory per device, {per} ({rl.placement}; the table above is the "
        f"actor's training step alone), {unit}:"
    ]
    groups = {f"{g.label} group": g for g in rl.groups}
    for phase, terms in rl.phases.items():
        mark = "  <- peak" if phase == rl.peak_phase else ""
        g = groups.get(phase)
        title = (
            f"{phase} phase" if g is None else f"{phase} ({g.devices} devices, {g.layout}; {g.phase} phase)"
        )
        lines.append(f"  {title}: {_fmt_size(rl.phase_bytes(phase), binary).strip()}{mark}")
        for name, value in terms:
            if value:
                lines.append(f"    {name:46s}{_fmt_size(value, binary)}")
    lines.append(
        f"  {'total at the peak (+ CUDA context, fragmentation)':48s}{_fmt_size(rl.per_device_bytes, binary)}"
    )
    if rl.host_bytes:
        lines.append(f"  {'host memory (offloaded)':48s}{_fmt_size(rl.host_bytes, binary)}")
        if rl.groups:
            lines.append(
                f"  {'host memory of the fullest server':48s}{_fmt_size(rl.host_bytes_per_node, binary)}"
            )
    ro = rl.rollout
    if ro is not None:
        lines.append(
            f"  rollout ({rl.spec.rollout_engine}): {ro.engines} engine(s), {ro.sequences_per_engine} sequences "
            f"each, {ro.concurrent_sequences} at once ({ro.waves} wave(s)), KV budget "
            f"{_fmt_size(ro.kv_budget_bytes, binary).strip()} {unit}, decode {ro.decode_bound}-bound "
            f"({fmt_duration(ro.decode_step_s)} per token step"
            + (f", {fmt_duration(ro.tp_allreduce_s)} of it TP all-reduce" if ro.tp_allreduce_s else "")
            + f"; {ro.decode_steps:,.0f} steps"
            + (
                f", responses {rl.spec.response_len_mean} tokens on average of {rl.spec.gen_len} at most"
                if rl.spec.response_len_mean is not None
                else ""
            )
            + ")"
        )
    lines.append("")
    return lines


def cmd_hardware(args: argparse.Namespace) -> int:
    from trainplan.hardware import get_accelerator, list_accelerators
    from trainplan.hardware.render import render_show, render_systems, render_table

    if args.hardware_command == "systems":
        from trainplan.hardware.systems import builtin_systems

        specs = builtin_systems()
        if args.json:
            print(json.dumps([s.to_dict() for s in specs], indent=2, sort_keys=True))
        else:
            print(render_systems(specs))
        return 0
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
        print(render_text(results, rows=args.rows, history=not args.dataset))
    if args.markdown:
        from trainplan.export import write_text

        write_text(args.markdown, render_markdown(results, history=not args.dataset), field="markdown")
    if args.bands:
        from trainplan.validate.bands import render_bands_text, write_table

        target = write_table()
        print()
        print(render_bands_text())
        sys.stderr.write(f"trainplan: wrote the band table to {target}\n")
    return 0 if all(r.passed for r in results) else 1


def _engine_target(engine: Any) -> str:
    """The export target of ``engine`` (a ``trainplan.engines.Engine``), or an error naming the
    targets to choose from when the engine has none."""
    from trainplan.export import TARGETS

    if engine.export_target is None:
        raise TrainplanError(
            "to",
            f"the {engine.name} engine has no export target ({engine.export_note}); "
            f"give --to one of {', '.join(TARGETS)}",
        )
    return str(engine.export_target)


def _write_export(result: Any, output: str | None, what: str) -> None:
    import os

    from trainplan.export import write_text

    if result.files and not output:
        names = ", ".join(name for name, _ in result.files)
        raise TrainplanError(
            "output",
            f"the {result.target} config needs {names} beside it, so it is written to files: give --output FILE",
        )
    if output:
        write_text(output, result.text)
        sys.stderr.write(f"trainplan: wrote {what} to {output}\n")
        for name, text in result.files:
            path = os.path.join(os.path.dirname(output), name)
            write_text(path, text)
            sys.stderr.write(f"trainplan: wrote {path} (the config names it)\n")
    else:
        sys.stdout.write(result.text)
        sys.stdout.flush()
    for warning in result.warnings:
        sys.stderr.write(f"trainplan: note: {warning}\n")


def cmd_export(args: argparse.Namespace) -> int:
    from trainplan.api import estimate_inputs
    from trainplan.export.saved import export_or_explain
    from trainplan.inputs import engine_settings

    values = vars(args)
    if args.plan is not None:
        return _export_saved(args)
    if args.rank is not None:
        raise TrainplanError("rank", "--rank picks a plan of a saved --plan FILE; add --plan")
    if args.model is None or args.hardware is None:
        raise TrainplanError("model", "give a model and --hardware (and the plan's flags), or --plan FILE")
    system, model, recipe, layout = estimate_inputs(values)
    target = args.to or _engine_target(engine_settings(values).engine)
    result = export_or_explain(target, system, model, recipe, layout)
    _write_export(result, args.output, f"{target} config")
    return 0


def _export_saved(args: argparse.Namespace) -> int:
    """``trainplan export --plan FILE``: the saved plan's first ranked plan the target can write
    (or plan ``--rank N``), its settings all from the file."""
    from trainplan.engines import get_engine
    from trainplan.export.saved import export_or_explain, first_exportable, load_plan_file, read_plan
    from trainplan.inputs import COMMANDS
    from trainplan.models import load_model

    if args.hardware is not None:
        raise TrainplanError("hardware", "--plan takes the hardware of the saved plan; drop --hardware")
    given = [
        f.option
        for f in COMMANDS["export"]
        if f.group in ("layout", "recipe") and getattr(args, f.name) != f.default
    ]
    if given:
        raise TrainplanError(
            given[0].lstrip("-").replace("-", "_"),
            f"--plan takes every setting from the saved plan; drop {', '.join(given)} (or plan again with them)",
        )
    data = load_plan_file(args.plan)
    model = load_model(args.model) if args.model is not None else None
    saved_engine = data.get("engine", {}).get("name") if isinstance(data.get("engine"), dict) else None
    target = args.to or _engine_target(get_engine(saved_engine))
    if args.rank is not None:
        p = read_plan(data, rank=args.rank, model=model)
        result = export_or_explain(target, p.system, p.model, p.recipe, p.layout)
        _write_export(result, args.output, f"plan #{args.rank} as {target} config")
        return 0
    ranks = [e.get("rank") for e in data.get("plans", []) if isinstance(e, dict)] or [None]
    saved = [read_plan(data, rank=r, model=model) for r in ranks]
    choice = first_exportable(target, [(p.label, p.system, p.model, p.recipe, p.layout) for p in saved])
    for why in choice.skipped:
        sys.stderr.write(f"trainplan: note: not exported, {target} cannot run it: {why}\n")
    chosen = saved[choice.index]
    what = f"plan #{chosen.rank} ({chosen.label} {chosen.layout.describe()}) as {target} config"
    _write_export(choice.result, args.output, what)
    return 0


def _export_plan_result(args: argparse.Namespace, result: Any) -> None:
    """``plan --export TARGET``: the best ranked plan the target can run, written to a file."""
    from trainplan.export.saved import first_exportable

    target = _engine_target(result.engine.engine) if args.export == "engine" else args.export
    plans = list(result.plans) or ([result.closest] if result.closest is not None else [])
    if not plans:
        raise TrainplanError("export", "no plan was found, so none can be exported")
    choice = first_exportable(
        target,
        [(p.label, p.estimate.system, p.estimate.model, p.estimate.recipe, p.estimate.layout) for p in plans],
    )
    for why in choice.skipped:
        sys.stderr.write(f"trainplan: note: not exported, {target} cannot run it: {why}\n")
    chosen = plans[choice.index]
    output = args.export_file or choice.result.filename
    what = f"plan #{chosen.rank} ({chosen.label} {chosen.estimate.layout.describe()}) as {target} config"
    _write_export(choice.result, output, what)


def cmd_plan(args: argparse.Namespace) -> int:
    from trainplan.models import load_model
    from trainplan.planner.command import accelerators, plan_from_values, render_plan

    if args.plot:
        from trainplan.web.plots import check_plot_path

        check_plot_path(args.plot)
    accs = accelerators(args.hardware, args.hardware_file)
    if args.export is None and args.export_file is not None:
        raise TrainplanError("export_file", "--export-file names where --export writes; add --export TARGET")
    result = plan_from_values(vars(args), load_model(args.model), accs)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(render_plan(result))
    if args.export is not None:
        sys.stdout.flush()
        _export_plan_result(args, result)
    if args.plot:
        from trainplan.web.plots import save_plot

        save_plot("plan", result, args.plot)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from trainplan.models import load_model
    from trainplan.planner.command import accelerators, compare_from_values, compare_to_dict, render_compare

    if args.plot:
        from trainplan.web.plots import check_plot_path

        check_plot_path(args.plot)
    accs = accelerators(args.hardware, args.hardware_file)
    result = compare_from_values(vars(args), load_model(args.model), accs)
    if args.json:
        print(json.dumps(compare_to_dict(result), indent=2, sort_keys=True))
    else:
        print(render_compare(result))
    if args.plot:
        from trainplan.web.plots import save_plot

        save_plot("compare", result, args.plot)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from trainplan.inputs import build_layout, build_recipe
    from trainplan.models import load_model

    model = load_model(args.model)
    recipe = build_recipe(vars(args))
    layout = build_layout(vars(args))
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


def cmd_choose(args: argparse.Namespace) -> int:
    from trainplan.models import load_model
    from trainplan.planner.choose import choose
    from trainplan.planner.command import accelerators, compare_from_values

    if args.tokens is None:
        raise TrainplanError("tokens", "choosing needs --tokens (the length of the run)")
    accs = accelerators(args.hardware, args.hardware_file)
    model = load_model(args.model)
    values = vars(args)
    by_time = compare_from_values({**values, "objective": "time"}, model, accs)
    by_cost = compare_from_values({**values, "objective": "cost"}, model, accs)
    result = choose(by_time, by_cost, deadline_h=args.deadline, budget_usd=args.budget)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(result.render())
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from trainplan.cost import choose_offering
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.ownership import Ownership, default_node_price

    acc = get_accelerator(args.hardware, args.hardware_file)
    devices = args.devices if args.devices is not None else acc.devices_per_node
    if args.node_price is not None:
        node_price, node_source = args.node_price, "given (--node-price)"
    else:
        node_price, node_source = default_node_price(acc)
    if args.price is not None:
        rent, rent_source = args.price, "given (--price)"
    else:
        from trainplan.inputs import price_query

        # --provider, --price-kind and --max-price-age pick the offering, as in estimate and plan
        offer = choose_offering(System(accelerator=acc, num_devices=devices), None, price_query(vars(args)))
        if offer is None:
            raise TrainplanError(
                "price",
                f"{acc.name} has no dated rental price in the catalog; give --price USD_PER_DEVICE_HOUR",
            )
        rent = offer.usd_per_device_hour
        rent_source = f"{offer.provider} {offer.kind} {offer.instance} ({offer.date})"
    own = Ownership(
        accelerator=acc,
        devices=devices,
        node_price_usd=node_price,
        node_price_source=node_source,
        rent_usd_per_device_hour=rent,
        rent_source=rent_source,
        years=args.years,
        utilisation=args.utilisation,
        usd_per_kwh=args.usd_per_kwh,
        usd_per_kw_month=args.usd_per_kw_month,
        network_fraction=args.network_fraction,
        pue=args.pue,
    )
    if args.json:
        print(json.dumps(own.to_dict(), indent=2, sort_keys=True))
    else:
        print(own.render())
    return 0


def _add_hardware(sub: Any) -> None:
    from trainplan.inputs import HARDWARE_FILE, add_arguments

    p = sub.add_parser("hardware", help="the accelerator catalog")
    hw = p.add_subparsers(dest="hardware_command", required=True, parser_class=Parser)
    q = hw.add_parser("list", help="one table of every accelerator")
    add_arguments(q, (HARDWARE_FILE,))
    q.add_argument("--json", action="store_true")
    q = hw.add_parser("show", help="every figure of one accelerator, with its source")
    q.add_argument("name")
    add_arguments(q, (HARDWARE_FILE,))
    q.add_argument("--json", action="store_true")
    q = hw.add_parser("systems", help="rack and pod systems: scale-up domain, totals, scale-out network")
    q.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_hardware)


def _add_validate(sub: Any) -> None:
    p = sub.add_parser(
        "validate", help="predicted vs published measurements; exit 1 when a dataset misses its bound"
    )
    p.add_argument("--dataset", action="append", default=[], help="only this dataset (repeatable)")
    p.add_argument("--rows", action="store_true", help="print every row's error")
    p.add_argument("--markdown", metavar="FILE", help="also write the markdown report (docs/validation.md)")
    p.add_argument(
        "--bands",
        action="store_true",
        help="derive the prediction bands from the validation rows and store them in the package",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)


def _add_models(sub: Any) -> None:
    p = sub.add_parser("models", help="the model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)


def _add_serve(sub: Any) -> None:
    from trainplan.web.cli import register

    register(sub)


def _add_run(sub: Any) -> None:
    from trainplan.run.cli import register

    register(sub)


def _schema_command(name: str, func: Callable[[argparse.Namespace], int], help: str) -> Callable[[Any], None]:
    def add(sub: Any) -> None:
        add_command(sub, name, func, help=help)

    return add


SUBCOMMANDS: dict[str, Callable[[Any], None]] = {
    "estimate": _schema_command("estimate", cmd_estimate, "memory, time and cost of one configuration"),
    "hardware": _add_hardware,
    "validate": _add_validate,
    "verify": _schema_command(
        "verify", cmd_verify, "trace a real PyTorch step under fake tensors; analytic vs traced"
    ),
    "models": _add_models,
    "export": _schema_command("export", cmd_export, "write the plan as a training engine's config"),
    "plan": _schema_command(
        "plan", cmd_plan, "search accelerators, device counts and layouts; rank and explain"
    ),
    "compare": _schema_command(
        "compare", cmd_compare, "the same job on several accelerators, each at its best layout"
    ),
    "choose": _schema_command(
        "choose", cmd_choose, "how to choose a training accelerator: fastest, cheapest to rent, best to buy"
    ),
    "cost": _schema_command("cost", cmd_cost, "buy or rent: owning accelerators against renting them"),
    "serve": _add_serve,
    "run": _add_run,
}
"""Each subcommand and the function that adds it to the ``add_subparsers()`` object, in
``--help`` order."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``trainplan`` parser with every subcommand, or, when ``only`` names one (the
    subcommand about to be parsed), with that one alone: a command's start-up then builds and
    imports nothing for the others."""
    parser = Parser(
        prog="trainplan",
        description="Will a training job fit, on which accelerator, with which layout — how long, at what cost.",
    )
    parser.add_argument(
        "--version", action="version", version="trainplan " + __import__("trainplan").__version__
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, add in SUBCOMMANDS.items():
        if only is None or only not in SUBCOMMANDS or only == name:
            add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``trainplan ...``: exit status 0, 2 on bad input (one line on stderr), or the command's."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(only=command)
    args = parser.parse_args(words)
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
