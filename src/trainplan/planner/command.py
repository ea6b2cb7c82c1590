"""``trainplan plan`` and ``trainplan compare``: the request their fields build, human output.

The fields are :data:`trainplan.inputs.PLAN_FIELDS` / :data:`~trainplan.inputs.COMPARE_FIELDS`;
the functions here take their parsed values (a mapping by field name), whether they come from
the CLI, the web API or :func:`trainplan.plan` / :func:`trainplan.compare`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import Accelerator
from trainplan.inputs import (
    RECIPE_FIELDS,
    build_layout_options,
    build_recipe,
    build_reliability,
    build_rlhf,
    check_no_rlhf_fields,
    engine_settings,
    fill_defaults,
    host_memory_bytes,
    price_query,
)
from trainplan.limits import MAX_DEVICES, check_int
from trainplan.models.spec import ModelSpec
from trainplan.planner.search import (
    Plan,
    PlanResult,
    SearchSpace,
    check_objective_tokens,
    compare,
    plan,
)
from trainplan.recipe import OFFLOADS, PRECISIONS, RECOMPUTES, RLHF_METHODS, Recipe
from trainplan.units import fmt_bytes, fmt_duration

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def accelerators(hardware: str, hardware_file: Sequence[str] = ()) -> list[Accelerator]:
    """The accelerators ``--hardware`` names: ``any`` (the catalog) or comma-separated names."""
    from trainplan.hardware import get_accelerator, list_accelerators

    files = list(hardware_file)
    if hardware.strip().lower() == "any":
        return list(list_accelerators(files))
    names = _split(hardware)
    if not names:
        raise TrainplanError("hardware", "name at least one accelerator (or 'any')")
    out: list[Accelerator] = []
    for n in dict.fromkeys(names):
        acc = get_accelerator(n, files)
        if acc not in out:  # a name and its alias ("h100-sxm,h100") are one accelerator
            out.append(acc)
    return out


def _prices(values: Mapping[str, Any], accs: list[Accelerator]) -> dict[str, float]:
    out: dict[str, float] = {}
    if values["price"] is not None:
        out.update({a.name: float(values["price"]) for a in accs})
    for item in values["device_price"]:
        name, sep, value = item.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = -1.0
        if not sep or not name.strip() or not usd > 0:
            raise TrainplanError("device_price", f"expected NAME=USD with a positive price, got {item!r}")
        key = name.strip().lower()
        match = next((a.name for a in accs if key == a.name or key in a.aliases), None)
        if match is None:
            raise TrainplanError(
                "device_price",
                f"--device-price {item!r}: {name.strip()!r} is not among the accelerators searched "
                f"({', '.join(a.name for a in accs)}); name one of them, or add it to --hardware",
            )
        out[match] = usd
    return out


def request(values: Mapping[str, Any], *, compare_mode: bool) -> tuple[Recipe, SearchSpace]:
    """The fixed recipe and the search space the fields describe: a searchable field left open
    (``None``) is searched, the recipe holds its estimate default meanwhile."""
    if (values.get("recompute_every") or 1) > 1:
        raise TrainplanError(
            "recompute_every",
            "plan and compare search recompute modes that apply to every block (none, selective, full, "
            "sac); size layer-selective checkpointing with `trainplan estimate --recompute full "
            f"--recompute-every {values['recompute_every']}`",
        )
    if values.get("recompute_layers"):
        raise TrainplanError(
            "recompute_layers",
            "plan and compare search recompute modes that apply to every block (none, selective, full, "
            "sac); size Megatron's block recompute with `trainplan estimate --recompute full "
            f"--recompute-layers {values['recompute_layers']}`",
        )
    if values["precision"] is not None:
        precisions: tuple[str, ...] = (values["precision"],)
    else:
        precisions = tuple(dict.fromkeys(_split(values["precisions"])))
        for p in precisions:
            if p not in PRECISIONS:
                raise TrainplanError(
                    "precisions", f"unknown precision {p!r}; choose from {', '.join(PRECISIONS)}"
                )
        if not precisions:
            raise TrainplanError("precisions", "give at least one precision")
    # the fixed recipe holds the first searched precision the fixed switches allow (one they do not,
    # such as bf16 beside --fp8-attention, is left out by the search with its count); none: the
    # first one's error
    recipe: Recipe | None = None
    first_error: TrainplanError | None = None
    for p in precisions:
        try:
            recipe = build_recipe(fill_defaults({**values, "precision": p}, RECIPE_FIELDS))
            break
        except TrainplanError as err:
            first_error = first_error or err
    if recipe is None:
        assert first_error is not None
        raise first_error
    if recipe.method not in RLHF_METHODS:
        check_no_rlhf_fields(values, recipe.method)
    counts: tuple[int, ...] | None = None
    if compare_mode and values["devices"] is not None:
        counts = (values["devices"],)
    elif not compare_mode and values["devices"] is not None:
        try:
            counts = tuple(sorted({int(c) for c in _split(values["devices"])}))
        except ValueError:
            raise TrainplanError(
                "devices", f"expected comma-separated positive integers, got {values['devices']!r}"
            ) from None
        if not counts or min(counts) <= 0:
            raise TrainplanError(
                "devices", f"expected comma-separated positive integers, got {values['devices']!r}"
            )
    for n in counts or ():
        check_int("devices", n, high=MAX_DEVICES, what="devices")  # the limit first, as SearchSpace
    if counts and max(counts) > values["max_devices"]:
        raise TrainplanError(
            "devices",
            f"--devices {max(counts)} is above --max-devices {values['max_devices']}; "
            f"raise --max-devices to at least {max(counts)}, or ask for fewer devices",
        )
    max_devices = values["max_devices"]
    offloads = (values["offload"],) if values["offload"] is not None else OFFLOADS
    if recipe.paged_optimizer and values["offload"] is None:
        offloads = ("none",)
    space = SearchSpace(
        micro_batches=(values["micro_batch"],)
        if values["micro_batch"] is not None
        else DEFAULT_MICRO_BATCHES,
        recomputes=(values["recompute"],) if values["recompute"] is not None else engine_recomputes(values),
        zero_stages=engine_zero_stages(values),
        offloads=offloads,
        precisions=precisions,  # type: ignore[arg-type]
        max_devices=max_devices,
        device_counts=counts,
        layout_options=build_layout_options(values),
    )
    return replace(recipe), space


def rlhf_from_values(
    values: Mapping[str, Any],
    model: ModelSpec,
    accs: list[Accelerator],
    recipe: Recipe,
    space: SearchSpace,
    *,
    compare_mode: bool,
) -> PlanResult:
    """An RL job's plan (:mod:`trainplan.planner.rlhf`): the RL fields fix the job's models;
    placement, rollout TP and groups not given are searched."""
    from trainplan.planner.rlhf import plan_rlhf
    from trainplan.rlhf_groups import parse_groups

    if values.get("memory_margin"):
        raise TrainplanError(
            "memory_margin",
            f"{recipe.method}: the margin is not applied to the RL phases' memory (actor, critic, reward, "
            "reference, rollout), so it would be ignored there; plan RL jobs with --memory-margin 0",
        )
    check_objective_tokens(values["objective"], recipe.tokens)
    groups = parse_groups(values["groups"]) if values.get("groups") else ()
    if groups and values.get("placement") not in (None, "disaggregated"):
        raise TrainplanError(
            "groups", "device groups are for --placement disaggregated; add it or drop --groups"
        )
    spec = build_rlhf({**values, "placement": None, "groups": None}, model, recipe)
    assert spec is not None
    return plan_rlhf(
        values,
        model,
        recipe,
        spec,
        accs,
        space,
        groups=groups,
        objective=values["objective"],
        top=max(1, len(accs)) if compare_mode else values["top"],
        compare_mode=compare_mode,
        prices=_prices(values, accs),
        price_query=price_query(values),
        host_memory_bytes_per_node=host_memory_bytes(values),
        reliability=build_reliability(values),
    )


def engine_recomputes(values: Mapping[str, Any]) -> tuple[Any, ...]:
    """The recompute modes searched: every one, or those of the engine the request names."""
    applied = engine_settings(values)
    return (
        RECOMPUTES
        if applied.default
        else tuple(r for r in RECOMPUTES if r in applied.engine.recomputes.value)
    )


def engine_zero_stages(values: Mapping[str, Any]) -> tuple[int, ...]:
    """The ZeRO stages searched: all four, or those of the engine the request names."""
    applied = engine_settings(values)
    return (0, 1, 2, 3) if applied.default else tuple(applied.engine.zero_stages.value)


def plan_from_values(values: Mapping[str, Any], model: ModelSpec, accs: list[Accelerator]) -> PlanResult:
    """``plan(...)`` with the request the plan fields describe (the CLI, the web and Python APIs)."""
    recipe, space = request(values, compare_mode=False)
    if recipe.method in RLHF_METHODS:
        return rlhf_from_values(values, model, accs, recipe, space, compare_mode=False)
    result = plan(
        model,
        recipe,
        accs,
        space=space,
        objective=values["objective"],
        top=values["top"],
        budget_usd=values["budget"],
        deadline_h=values["deadline"],
        **_priced_options(values, accs),
    )
    return _with_engine(result, values)


def _priced_options(values: Mapping[str, Any], accs: list[Accelerator]) -> dict[str, Any]:
    """The keywords ``plan`` and ``compare`` both take from the request: prices, host memory,
    goodput and the memory margin."""
    return {
        "provider": values["provider"],
        "prices": _prices(values, accs),
        "pue": values["pue"],
        "host_memory_bytes_per_node": host_memory_bytes(values),
        "reliability": build_reliability(values),
        "memory_margin": values["memory_margin"],
        "price_query": price_query(values),
    }


def _with_engine(result: PlanResult, values: Mapping[str, Any]) -> PlanResult:
    """``result`` naming the engine that set the request's unset engine settings."""
    applied = engine_settings(values)
    return replace(result, engine=applied, notes=(f"engine: {applied.describe()}", *result.notes))


def compare_from_values(values: Mapping[str, Any], model: ModelSpec, accs: list[Accelerator]) -> PlanResult:
    """``compare(...)`` with the request the compare fields describe (the CLI, the web and Python APIs)."""
    recipe, space = request(values, compare_mode=True)
    if recipe.method in RLHF_METHODS:
        return rlhf_from_values(values, model, accs, recipe, space, compare_mode=True)
    result = compare(
        model,
        recipe,
        accs,
        space=space,
        objective=values["objective"],
        **_priced_options(values, accs),
    )
    return _with_engine(result, values)


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
        "ranking": list(result.ranking),
        **({"engine": result.engine.to_dict()} if result.engine is not None else {}),
    }


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """What :func:`trainplan.compare` returns: the search's result, whose ``per_accelerator``
    holds each accelerator's best plan (or why there is none); ``to_dict()`` is
    ``trainplan compare --json``."""

    result: PlanResult

    @property
    def per_accelerator(self) -> tuple[Any, ...]:
        """One entry per accelerator: its best plan, or the reason it has none."""
        return self.result.per_accelerator

    def to_dict(self) -> dict[str, object]:
        """The ``trainplan compare --json`` object."""
        return compare_to_dict(self.result)


# --- human output -----------------------------------------------------------------------------
_HEADER = (
    f"{'#':>2} {'hardware':16s} {'layout':34s} {'recipe':24s} {'mem/dev':>9s} {'step':>9s} "
    f"{'step band':>17s} {'tok/s':>10s} {'MFU':>5s} {'time':>10s} {'cost':>10s} {'kWh':>8s}  price (provider kind, date)"
)


def band_cell(p: Plan) -> str:
    """The step-time band of a row (time, tokens/s and cost carry the same): ``−25…+28%``,
    ``uncal −46…+152%`` for an uncalibrated class, ``−8…+9%*`` for a class with no validated run
    on this row's accelerator (the table's footnote says so)."""
    b = p.estimate.step_band
    text = f"{b.percent_text().replace(' … ', '…').replace('%…', '…')}"
    if not b.calibrated:
        return f"uncal {text}"
    return text if b.on_part else f"{text}*"


def layout_cell(p: Plan) -> str:
    """A plan's layout: the training layout, or an RL job's placement (:func:`trainplan.planner.rlhf.describe`)."""
    from trainplan.planner.rlhf import describe

    return p.estimate.layout.describe() if p.estimate.rlhf is None else describe(p.estimate)


def _row(p: Plan, tag: str = "") -> str:
    e = p.estimate
    r = e.recipe
    mem = e.memory.per_device_bytes if e.rlhf is None else e.rlhf.per_device_bytes
    recipe = f"mb{r.micro_batch} {r.precision} rc={r.recompute}" + (
        f" off={r.offload}" if r.offload != "none" else ""
    )
    run = e.run
    time_s = "-" if run.time_s is None else fmt_duration(run.time_s)
    cost = "no price" if run.cost_usd is None else f"${run.cost_usd:,.0f}"
    kwh = "-" if run.energy_kwh is None else f"{run.energy_kwh:,.0f}"
    rank = tag or str(p.rank)
    return (
        f"{rank:>2} {p.label:16s} {layout_cell(p):34s} {recipe:24s} "
        f"{fmt_bytes(mem):>9s} {fmt_duration(e.time.step_s):>9s} {band_cell(p):>17s} "
        f"{e.throughput.tokens_per_s:>10,.0f} {100 * e.throughput.mfu:>4.1f}% {time_s:>10s} {cost:>10s} {kwh:>8s}"
        f"  {run.price_label}"
    )


def _explain(p: Plan) -> list[str]:
    e = p.estimate
    lines = [
        f"  {p.label} — {layout_cell(p)}:",
        f"    band: step {e.step_band.label()}; memory {e.memory_band.label()}; {e.fit_verdict}"
        + ("; ties within error with the plan ranked above" if p.tie_within_error else ""),
    ]
    lines += [f"    binds: {b}" for b in p.explanation.binds]
    lines += [f"    vs {a}" for a in p.explanation.alternatives]
    return lines


def _ranking(result: PlanResult) -> list[str]:
    """The ranking's statements (ties within error, calibrated vs uncalibrated), if any."""
    if not result.ranking:
        return []
    return ["", "ranking:"] + [f"  {line}" for line in result.ranking]


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
        lines += _ranking(result)
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
    lines += _ranking(result)
    lines.append("")
    lines.append("why:")
    for b in result.per_accelerator:
        if b.plan is not None:
            lines += _explain(b.plan)
    lines.append("")
    lines += _stats(result)
    return "\n".join(lines)
