"""``trainplan plan`` and ``trainplan compare``: flags, the request they build, human output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace

from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import Accelerator
from trainplan.models.spec import ModelSpec
from trainplan.planner.search import (
    DEFAULT_MAX_DEVICES,
    OBJECTIVES,
    Plan,
    PlanResult,
    SearchSpace,
    compare,
    plan,
)
from trainplan.recipe import OFFLOADS, PRECISIONS, RECOMPUTES, Recipe
from trainplan.units import fmt_bytes, fmt_duration

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)


def configure_parser(
    p: argparse.ArgumentParser,
    *,
    compare_mode: bool,
    add_recipe: Callable[..., None],
    add_cost: Callable[[argparse.ArgumentParser], None],
    add_hardware_file: Callable[[argparse.ArgumentParser], None],
    positive_int: Callable[[str], int],
    positive_float: Callable[[str], float],
) -> None:
    """Flags of ``plan`` (``compare_mode`` False) or ``compare``; recipe flags are fixed choices
    when given, searched when absent (micro-batch, recompute, offload, precision)."""
    p.add_argument("model", help="preset name (see `trainplan models`) or path to a Hugging Face config.json")
    if compare_mode:
        p.add_argument("--hardware", required=True, help="comma-separated accelerators to compare")
        p.add_argument(
            "--devices", type=positive_int, default=None, help="fixed device count (default: searched)"
        )
    else:
        p.add_argument(
            "--hardware", default="any", help="'any' (the whole catalog) or comma-separated accelerator names"
        )
        p.add_argument(
            "--devices",
            default=None,
            help="comma-separated device counts to consider (default: 1,2,4 and node/domain multiples)",
        )
        p.add_argument("--budget", type=positive_float, default=None, help="maximum cost of the run, USD")
        p.add_argument("--deadline", type=positive_float, default=None, help="maximum time to train, hours")
        p.add_argument("--top", type=positive_int, default=5, help="how many ranked plans to show")
    add_hardware_file(p)
    p.add_argument(
        "--max-devices",
        type=positive_int,
        default=DEFAULT_MAX_DEVICES,
        help=f"largest device count searched (default {DEFAULT_MAX_DEVICES})",
    )
    p.add_argument("--objective", choices=OBJECTIVES, default="time", help="rank by time, cost or both")
    p.add_argument(
        "--precisions",
        default="bf16",
        help="precisions the search may use when --precision is not given (comma-separated, default bf16)",
    )
    p.add_argument(
        "--device-price",
        action="append",
        default=[],
        metavar="NAME=USD",
        help="price of one accelerator in USD per device-hour (repeatable; overrides the catalog)",
    )
    add_recipe(p, defaults=False)
    add_cost(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with stable keys")
    p.add_argument(
        "--plot", metavar="FILE", default=None, help="also save a plot (.png or .svg; needs trainplan[plot])"
    )


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _accelerators(args: argparse.Namespace) -> list[Accelerator]:
    from trainplan.hardware import get_accelerator, list_accelerators

    if args.hardware.strip().lower() == "any":
        return list(list_accelerators(args.hardware_file))
    names = _split(args.hardware)
    if not names:
        raise TrainplanError("hardware", "name at least one accelerator (or 'any')")
    return [get_accelerator(n, args.hardware_file) for n in dict.fromkeys(names)]


def _prices(args: argparse.Namespace, accs: list[Accelerator]) -> dict[str, float]:
    out: dict[str, float] = {}
    if args.price is not None:
        out.update({a.name: float(args.price) for a in accs})
    for item in args.device_price:
        name, sep, value = item.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = -1.0
        if not sep or not name.strip() or not usd > 0:
            raise TrainplanError("device_price", f"expected NAME=USD with a positive price, got {item!r}")
        out[name.strip().lower()] = usd
    return out


def request(args: argparse.Namespace, *, compare_mode: bool) -> tuple[Recipe, SearchSpace]:
    """The fixed recipe and the search space the flags describe."""
    from trainplan.cli import recipe_from_args

    filled = argparse.Namespace(**vars(args))
    for key, default in (
        ("method", "pretrain"),
        ("precision", "bf16"),
        ("optimizer", "adamw"),
        ("seq_len", 4096),
        ("micro_batch", 1),
        ("recompute", "none"),
        ("attention", "flash"),
        ("offload", "none"),
        ("stack", "megatron"),
    ):
        if getattr(filled, key) is None:
            setattr(filled, key, default)
    recipe = recipe_from_args(filled)
    assert isinstance(recipe, Recipe)
    if args.precision is not None:
        precisions: tuple[str, ...] = (args.precision,)
    else:
        precisions = tuple(dict.fromkeys(_split(args.precisions)))
        for p in precisions:
            if p not in PRECISIONS:
                raise TrainplanError(
                    "precisions", f"unknown precision {p!r}; choose from {', '.join(PRECISIONS)}"
                )
        if not precisions:
            raise TrainplanError("precisions", "give at least one precision")
    counts: tuple[int, ...] | None = None
    if compare_mode and args.devices is not None:
        counts = (args.devices,)
    elif not compare_mode and args.devices is not None:
        try:
            counts = tuple(sorted({int(c) for c in _split(args.devices)}))
        except ValueError:
            raise TrainplanError(
                "devices", f"expected comma-separated positive integers, got {args.devices!r}"
            ) from None
        if not counts or min(counts) <= 0:
            raise TrainplanError(
                "devices", f"expected comma-separated positive integers, got {args.devices!r}"
            )
    max_devices = max(args.max_devices, max(counts) if counts else 0)
    offloads = (args.offload,) if args.offload is not None else OFFLOADS
    if recipe.paged_optimizer and args.offload is None:
        offloads = ("none",)
    space = SearchSpace(
        micro_batches=(args.micro_batch,) if args.micro_batch is not None else DEFAULT_MICRO_BATCHES,
        recomputes=(args.recompute,) if args.recompute is not None else RECOMPUTES,
        offloads=offloads,
        precisions=precisions,  # type: ignore[arg-type]
        max_devices=max_devices,
        device_counts=counts,
    )
    return replace(recipe), space


def plan_from_args(args: argparse.Namespace, model: ModelSpec, accs: list[Accelerator]) -> PlanResult:
    """``plan(...)`` with the request the plan flags describe (shared by the CLI and the web API)."""
    recipe, space = request(args, compare_mode=False)
    return plan(
        model,
        recipe,
        accs,
        space=space,
        objective=args.objective,
        top=args.top,
        budget_usd=args.budget,
        deadline_h=args.deadline,
        provider=args.provider,
        prices=_prices(args, accs),
        pue=args.pue,
    )


def compare_from_args(args: argparse.Namespace, model: ModelSpec, accs: list[Accelerator]) -> PlanResult:
    """``compare(...)`` with the request the compare flags describe (shared by the CLI and the web API)."""
    recipe, space = request(args, compare_mode=True)
    return compare(
        model,
        recipe,
        accs,
        space=space,
        objective=args.objective,
        provider=args.provider,
        prices=_prices(args, accs),
        pue=args.pue,
    )


def compare_to_dict(result: PlanResult) -> dict[str, object]:
    """The ``trainplan compare --json`` object."""
    return {
        "model": result.model,
        "objective": result.objective,
        "global_batch": result.global_batch,
        "tokens": result.tokens,
        "hardware": [b.to_dict() for b in result.per_accelerator],
        "search": result.stats.to_dict(),
        "notes": list(result.notes),
    }


def run_plan(args: argparse.Namespace) -> int:
    from trainplan.models import load_model

    result = plan_from_args(args, load_model(args.model), _accelerators(args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(render_plan(result))
    if args.plot:
        from trainplan.web.plots import save_plot

        save_plot("plan", result, args.plot)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from trainplan.models import load_model

    result = compare_from_args(args, load_model(args.model), _accelerators(args))
    if args.json:
        print(json.dumps(compare_to_dict(result), indent=2, sort_keys=True))
    else:
        print(render_compare(result))
    if args.plot:
        from trainplan.web.plots import save_plot

        save_plot("compare", result, args.plot)
    return 0


# --- human output -----------------------------------------------------------------------------
_HEADER = (
    f"{'#':>2} {'hardware':16s} {'layout':34s} {'recipe':24s} {'mem/dev':>9s} {'step':>9s} "
    f"{'tok/s':>10s} {'MFU':>5s} {'time':>10s} {'cost':>10s} {'kWh':>8s}"
)


def _row(p: Plan, tag: str = "") -> str:
    e = p.estimate
    r = e.recipe
    recipe = f"mb{r.micro_batch} {r.precision} rc={r.recompute}" + (
        f" off={r.offload}" if r.offload != "none" else ""
    )
    run = e.run
    time_s = "-" if run.time_s is None else fmt_duration(run.time_s)
    cost = "no price" if run.cost_usd is None else f"${run.cost_usd:,.0f}"
    kwh = "-" if run.energy_kwh is None else f"{run.energy_kwh:,.0f}"
    rank = tag or str(p.rank)
    return (
        f"{rank:>2} {p.label:16s} {e.layout.describe():34s} {recipe:24s} "
        f"{fmt_bytes(e.memory.per_device_bytes):>9s} {fmt_duration(e.time.step_s):>9s} "
        f"{e.throughput.tokens_per_s:>10,.0f} {100 * e.throughput.mfu:>4.1f}% {time_s:>10s} {cost:>10s} {kwh:>8s}"
    )


def _explain(p: Plan) -> list[str]:
    lines = [f"  {p.label} — {p.estimate.layout.describe()}:"]
    lines += [f"    binds: {b}" for b in p.explanation.binds]
    lines += [f"    vs {a}" for a in p.explanation.alternatives]
    return lines


def _stats(result: PlanResult) -> list[str]:
    s = result.stats
    lines = [
        f"searched {s.candidates:,} candidates in {s.seconds:.2f} s: {s.valid:,} valid, "
        f"{s.does_not_fit:,} do not fit, {s.feasible:,} feasible and not dominated",
    ]
    for k, v in {**s.pruned, **s.invalid}.items():
        lines.append(f"  not evaluated / not kept — {k}: {v:,}")
    for name, why in s.skipped_accelerators.items():
        lines.append(f"  skipped {name}: {why}")
    return lines


def render_plan(result: PlanResult) -> str:
    lines = [
        f"plan for {result.model} (objective: {result.objective}; tokens: {f'{result.tokens:.3g}' if result.tokens else 'not given'})"
    ]
    for n in result.notes:
        lines.append(f"note: {n}")
    if not result.constraints_met:
        lines.append("")
        for f in result.constraint_failures:
            lines.append(f"CONSTRAINT NOT MET: {f}")
        if result.closest is not None:
            lines.append("closest plan:")
            lines.append(_HEADER)
            lines.append(_row(result.closest, "~"))
            lines += _explain(result.closest)
    if result.plans:
        lines += ["", _HEADER]
        lines += [_row(p) for p in result.plans]
        lines.append("")
        if result.fastest is not None:
            lines.append(f"fastest:  {_row(result.fastest, 'F').strip()}")
        if result.cheapest is not None:
            lines.append(f"cheapest: {_row(result.cheapest, 'C').strip()}")
        if result.pareto:
            lines.append(
                "time–cost Pareto front: "
                + ", ".join(
                    f"{p.label} ({fmt_duration(p.estimate.run.time_s or 0.0)}, ${p.estimate.run.cost_usd or 0.0:,.0f})"
                    for p in result.pareto
                )
            )
        lines.append("")
        lines.append("why:")
        for p in result.plans:
            lines += _explain(p)
    if result.min_devices:
        lines.append("")
        lines.append(
            "fewest devices that fit: "
            + ", ".join(f"{k} {v if v is not None else '—'}" for k, v in result.min_devices.items())
        )
    lines.append("")
    lines += _stats(result)
    return "\n".join(lines)


def render_compare(result: PlanResult) -> str:
    lines = [
        f"compare {result.model} (objective: {result.objective}; tokens: {f'{result.tokens:.3g}' if result.tokens else 'not given'})"
    ]
    for n in result.notes:
        lines.append(f"note: {n}")
    lines += ["", _HEADER]
    for b in result.per_accelerator:
        if b.plan is not None:
            lines.append(_row(b.plan, "-"))
        else:
            lines.append(f" - {b.hardware:16s} {b.reason}")
    lines.append("")
    lines.append("why:")
    for b in result.per_accelerator:
        if b.plan is not None:
            lines += _explain(b.plan)
    lines.append("")
    lines += _stats(result)
    return "\n".join(lines)
