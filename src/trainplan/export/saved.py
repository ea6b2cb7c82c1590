"""Plans to exports: a saved plan (``trainplan plan --json``) read back, and the ranked plan a
target can run.

:func:`read_plan` turns one plan of a ``plan --json`` object (its ``plans`` list, or the
``fastest`` / ``cheapest`` / ``closest`` entries) into the four typed inputs of an export: the
``recipe`` and ``layout`` objects the JSON holds (``predict.recipe_to_dict`` /
``predict.layout_to_dict``), the accelerator by name, the model by its preset name.

:func:`first_exportable` walks ranked plans in order and returns the first one a target can
write, with the reason each better-ranked plan could not be written — the "nearest exportable
plan" the planner's output and ``plan --export`` name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.export import TARGETS, ExportResult, export_plan
from trainplan.export._common import Unsupported
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LoRASpec, Recipe

_RECIPE_KEYS = (
    "method",
    "precision",
    "optimizer",
    "seq_len",
    "micro_batch",
    "global_batch",
    "tokens",
    "recompute",
    "recompute_early_stop",
    "stack",
    "attention",
    "offload",
    "dropout",
    "master_weights",
    "loss_chunks",
    "optimizer_in_backward",
    "paged_optimizer",
)


_OPTIONAL_RECIPE_KEYS = (
    "recompute_every",
    "recompute_layers",
    "recompute_modules",
    "mtp_layers",
    "torch_compile",
    "kbit_fp32_upcast",
    "logits_shift_copy",
    "softmax_fp32",
    "moe_capacity_factor",
    "moe_dispatch",
    "triton_attention",
    "fused_cross_entropy",
    "fp8_params",
    "fp8_activation_store",
    "fp8_attention",
)
"""Recipe fields a saved plan carries when its version wrote them (``predict.recipe_to_dict``)."""


def _field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise TrainplanError("plan", f"{where} has no {key!r}: not the output of `trainplan plan --json`")
    return obj[key]


def recipe_from_dict(d: Mapping[str, Any]) -> Recipe:
    """The :class:`Recipe` a ``recipe`` JSON object describes (validated as any recipe)."""
    lora = d.get("lora")
    spec = None
    if isinstance(lora, Mapping):
        spec = LoRASpec(
            rank=int(lora["rank"]),
            alpha=float(lora["alpha"]),
            targets=tuple(lora["targets"]),
            double_quant=bool(lora["double_quant"]),
        )
    # written by later versions than some saved plans: absent, the recipe's default (what those
    # plans were estimated with)
    optional = {k: d[k] for k in _OPTIONAL_RECIPE_KEYS if k in d}
    if isinstance(optional.get("recompute_modules"), list):
        optional["recompute_modules"] = tuple(optional["recompute_modules"])
    return Recipe(**{k: _field(d, k, "the plan's recipe") for k in _RECIPE_KEYS}, lora=spec, **optional)


def layout_from_dict(d: Mapping[str, Any]) -> Layout:
    """The :class:`Layout` a ``layout`` JSON object describes (validated as any layout)."""
    from dataclasses import fields

    # The pipeline-split flags are newer than some saved plans; absent, the plan split evenly.
    optional = {"pp_split_embedding", "pp_split_head", "etp"}  # etp: absent in plans before it, = tp
    return Layout(
        **{
            f.name: d[f.name]
            if f.name in optional and f.name in d
            else _field(d, f.name, "the plan's layout")
            for f in fields(Layout)
            if f.name not in optional or f.name in d
        }
    )


@dataclass(frozen=True, kw_only=True)
class SavedPlan:
    """One plan of a saved ``plan --json`` object, as export inputs."""

    rank: int | None
    label: str
    system: System
    model: ModelSpec
    recipe: Recipe
    layout: Layout


def _plan_entry(data: Mapping[str, Any], rank: int | None) -> Mapping[str, Any]:
    plans = data.get("plans")
    if not isinstance(plans, list):
        raise TrainplanError("plan", "no 'plans' list: not the output of `trainplan plan --json`")
    if rank is None:
        if not plans:
            closest = data.get("constraints", {}).get("closest")
            if isinstance(closest, dict):
                return closest
            raise TrainplanError("plan", "the saved plan ranks no plan (nothing fitted); plan again")
        entry: dict[str, Any] = plans[0]
        return entry
    for p in plans:
        if isinstance(p, dict) and p.get("rank") == rank:
            return p
    raise TrainplanError(
        "rank", f"the saved plan has no rank {rank}; it ranks {', '.join(str(p.get('rank')) for p in plans)}"
    )


def read_plan(
    data: Mapping[str, Any], *, rank: int | None = None, model: ModelSpec | None = None
) -> SavedPlan:
    """Plan ``rank`` (default: the first ranked) of a ``trainplan plan --json`` object.

    ``model``: the model when the plan's is not a preset (a config.json the plan was made from)."""
    from trainplan.hardware import get_accelerator

    entry = _plan_entry(data, rank)
    if model is None:
        from trainplan.models import load_model

        name = _field(_field(entry, "model", "the plan"), "name", "the plan's model")
        try:
            model = load_model(name)
        except TrainplanError:
            raise TrainplanError(
                "model",
                f"the plan's model {name!r} is not a preset; give its config.json: "
                "trainplan export CONFIG.json --plan FILE",
            ) from None
    system = System(
        accelerator=get_accelerator(_field(entry, "hardware", "the plan")),
        num_devices=int(_field(entry, "devices", "the plan")),
    )
    return SavedPlan(
        rank=entry.get("rank"),
        label=str(entry.get("label", "")),
        system=system,
        model=model,
        recipe=recipe_from_dict(_field(entry, "recipe", "the plan")),
        layout=layout_from_dict(_field(entry, "layout", "the plan")),
    )


def load_plan_file(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a ``plan --json`` output)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise TrainplanError("plan", f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TrainplanError("plan", f"{path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise TrainplanError(
            "plan", f"{path} holds no JSON object: not the output of `trainplan plan --json`"
        )
    return data


def targets_for(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, ...]:
    """The export targets that can write this plan."""
    out = []
    for target in TARGETS:
        try:
            export_plan(target, system, model, recipe, layout)
        except TrainplanError:
            continue
        out.append(target)
    return tuple(out)


def export_or_explain(
    target: str, system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> ExportResult:
    """``export_plan``; its refusal names the targets that can write this plan (or says none can),
    so the way out it names is one that works."""
    try:
        return export_plan(target, system, model, recipe, layout)
    except TrainplanError as err:
        if err.field == "to":
            raise
        others = [t for t in targets_for(system, model, recipe, layout) if t != target]
        where = (
            f"targets that can export this plan: {', '.join(others)}"
            if others
            else "no export target can write this plan as it is"
        )
        raise TrainplanError(err.field, f"{_reason(err)}; {where}") from None


def _reason(err: TrainplanError) -> str:
    return err.without_other_targets() if isinstance(err, Unsupported) else err.message


@dataclass(frozen=True, kw_only=True)
class Choice:
    """The plan a target writes: its position among the ranked plans and why those ahead failed."""

    index: int
    result: ExportResult
    skipped: tuple[str, ...]


def first_exportable(target: str, plans: Sequence[tuple[str, System, ModelSpec, Recipe, Layout]]) -> Choice:
    """The first of ``plans`` (label, system, model, recipe, layout; best first) that ``target``
    writes; an error naming why the first could not be written when none can."""
    skipped: list[str] = []
    for i, (label, system, model, recipe, layout) in enumerate(plans):
        try:
            return Choice(
                index=i, result=export_plan(target, system, model, recipe, layout), skipped=tuple(skipped)
            )
        except TrainplanError as err:
            if err.field == "to":
                raise
            skipped.append(f"{label} {layout.describe()}: {_reason(err)}")
    if not plans:
        raise TrainplanError("export", "no ranked plan to export")
    _, system, model, recipe, layout = plans[0]
    others = targets_for(system, model, recipe, layout)
    where = (
        f"the targets that can export it: {', '.join(others)}" if others else "no export target can write it"
    )
    raise TrainplanError(
        "export",
        f"none of the {len(plans)} ranked plans can be exported to {target}; the best, {skipped[0]}; {where}",
    )
