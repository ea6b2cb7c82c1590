"""The Python API: :func:`estimate`, :func:`plan` and :func:`compare` (docs/api.md).

The keywords are the fields of :mod:`trainplan.inputs` — the ``dest`` names of the CLI flags
(``seq_len=2048`` is ``--seq-len 2048``, ``no_master_weights=True`` is ``--no-master-weights``) —
checked as the CLI checks the flags, so each function's result has ``to_dict()`` equal to the
``--json`` output of the same command. Typed inputs are accepted too: a
:class:`~trainplan.models.spec.ModelSpec` for the model, an
:class:`~trainplan.hardware.accelerator.Accelerator` or :class:`~trainplan.hardware.system.System`
for the hardware, a :class:`~trainplan.recipe.Recipe` and a :class:`~trainplan.layout.Layout`.
An unknown keyword is a :class:`~trainplan.errors.TrainplanError` naming it.

The CLI's ``estimate``, ``export`` and ``run`` build their inputs with :func:`estimate_inputs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainplan import inputs
from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.predict import Estimate
from trainplan.predict import estimate as predict
from trainplan.recipe import Recipe

if TYPE_CHECKING:
    from trainplan.planner.command import Comparison
    from trainplan.planner.search import PlanResult
    from trainplan.rlhf import RLHFSpec

__all__ = ["compare", "estimate", "estimate_inputs", "plan"]

Hardware = str | Accelerator | System
HardwareList = str | Accelerator | Sequence[str | Accelerator]


def _model(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, str):
        raise TrainplanError(
            "model", f"expected a preset name, a config.json path or a ModelSpec, got {model!r}"
        )
    from trainplan.models import load_model

    return load_model(model)


def _accelerator(hardware: str | Accelerator, hardware_file: Sequence[str]) -> Accelerator:
    if isinstance(hardware, Accelerator):
        return hardware
    if not isinstance(hardware, str):
        raise TrainplanError("hardware", f"expected an accelerator name or an Accelerator, got {hardware!r}")
    from trainplan.hardware import get_accelerator

    return get_accelerator(hardware, _paths(hardware_file))


def _paths(hardware_file: object) -> list[str]:
    """``hardware_file`` as a list of paths: one path given alone is a list of one."""
    if isinstance(hardware_file, str):
        return [hardware_file]
    if not isinstance(hardware_file, list | tuple) or not all(isinstance(p, str) for p in hardware_file):
        raise TrainplanError("hardware_file", f"expected a path or a list of paths, got {hardware_file!r}")
    return list(hardware_file)


def _not_with(typed: str, given: Mapping[str, object], fields: Sequence[inputs.Field]) -> None:
    clash = [f.name for f in fields if f.name in given and f.name != "devices"]
    if clash:
        raise TrainplanError(
            clash[0],
            f"{clash[0]}= and {typed}= both given; set it in the {typed.capitalize()} or drop {typed}=",
        )


def estimate_inputs(values: Mapping[str, Any]) -> tuple[System, ModelSpec, Recipe, Layout]:
    """The four typed inputs of an estimate from parsed field values (``model``, ``hardware``,
    ``hardware_file`` and the layout and recipe fields), as ``trainplan estimate`` reads them."""
    model = _model(values["model"])
    acc = _accelerator(values["hardware"], values.get("hardware_file") or ())
    recipe = inputs.build_recipe(values)
    layout = inputs.build_layout(values)
    system = System(
        accelerator=acc,
        num_devices=values["devices"],
        host_memory_bytes_per_node=inputs.host_memory_bytes(values),
    )
    return system, model, recipe, layout


def estimate_from_values(values: Mapping[str, Any]) -> Estimate:
    """``trainplan estimate`` on parsed field values (the CLI's path)."""
    system, model, recipe, layout = estimate_inputs(values)
    return _predict(system, model, recipe, layout, values)


def _predict(
    system: System,
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    values: Mapping[str, Any],
    *,
    from_fields: bool = True,
) -> Estimate:
    est = predict(
        system,
        model,
        recipe,
        layout,
        price_usd_per_device_hour=values["price"],
        pue=values["pue"],
        price_query=inputs.price_query(values),
        reliability=inputs.build_reliability(values),
        rlhf=rlhf_spec(values, model, recipe),
        memory_margin=values.get("memory_margin", 0.0),
    )
    return replace(est, engine=inputs.engine_settings(values)) if from_fields else est


def rlhf_spec(values: Mapping[str, Any], policy: ModelSpec, recipe: Recipe) -> RLHFSpec | None:
    """The :class:`~trainplan.rlhf.RLHFSpec` the RLHF fields describe (:func:`trainplan.inputs.build_rlhf`)."""
    return inputs.build_rlhf(values, policy, recipe)


def estimate(
    model: str | ModelSpec,
    *,
    hardware: Hardware,
    recipe: Recipe | None = None,
    layout: Layout | None = None,
    hardware_file: Sequence[str] = (),
    **fields: object,
) -> Estimate:
    """Memory, step time, throughput and cost of one configuration (``trainplan estimate``).

    ``model``: a preset name, a Hugging Face config.json path or a ``ModelSpec``. ``hardware``: an
    accelerator name, an ``Accelerator``, or a ``System`` (which also gives the device count).
    ``fields``: the layout, recipe and cost fields (docs/api.md), e.g. ``devices=8, zero=3,
    tokens=1e9``; instead of the layout or recipe fields a ``Layout`` / ``Recipe`` may be given.
    ``estimate(...).to_dict()`` is what ``trainplan estimate --json`` prints for the same inputs.
    """
    values = inputs.read(fields, inputs.ESTIMATE_FIELDS)
    if recipe is not None:
        _not_with("recipe", fields, inputs.RECIPE_FIELDS)
    if layout is not None:
        _not_with("layout", fields, inputs.LAYOUT_FIELDS)
    if "devices" not in fields:
        if isinstance(hardware, System):
            values["devices"] = hardware.num_devices
        elif layout is not None:
            values["devices"] = layout.num_devices
    if isinstance(hardware, System):
        given = (
            "host_memory"
            if fields.get("host_memory") is not None
            else "hardware_file"
            if hardware_file
            else None
        )
        if given is not None:
            raise TrainplanError(
                given,
                f"{given}= and a System both given: the System fixes its accelerator and host memory; "
                "set it in the System (System(..., host_memory_bytes_per_node=...)) or pass the "
                "accelerator's name instead",
            )
        system = hardware
    else:
        system = System(
            accelerator=_accelerator(hardware, hardware_file),
            num_devices=values["devices"],
            host_memory_bytes_per_node=inputs.host_memory_bytes(values),
        )
    return _predict(
        system,
        _model(model),
        recipe if recipe is not None else inputs.build_recipe(values),
        layout if layout is not None else inputs.build_layout(values),
        values,
        from_fields=recipe is None and layout is None,
    )


def _accelerators(hardware: HardwareList, hardware_file: Sequence[str]) -> list[Accelerator]:
    from trainplan.planner.command import accelerators

    if isinstance(hardware, str):
        return accelerators(hardware, _paths(hardware_file))
    items = [hardware] if isinstance(hardware, Accelerator) else list(hardware)
    out: list[Accelerator] = []
    for item in items:
        acc = _accelerator(item, hardware_file)
        if acc not in out:
            out.append(acc)
    if not out:
        raise TrainplanError("hardware", "name at least one accelerator (or 'any')")
    return out


def _plan_values(fields: Mapping[str, object], schema: Sequence[inputs.Field]) -> dict[str, Any]:
    given = dict(fields)
    if isinstance(given.get("devices"), list | tuple):
        given["devices"] = ",".join(inputs.names(given["devices"], "devices"))
    return inputs.read(given, [f for f in schema if f.name not in ("hardware", "hardware_file")])


def plan(
    model: str | ModelSpec,
    *,
    hardware: HardwareList = "any",
    hardware_file: Sequence[str] = (),
    **fields: object,
) -> PlanResult:
    """Search accelerators, device counts and layouts; rank them (``trainplan plan``).

    ``hardware``: ``"any"`` (the catalog), comma-separated names, or a list of names or
    ``Accelerator`` objects. ``fields``: the plan fields (docs/api.md), e.g. ``method="full",
    tokens=1e10, max_devices=64``; a searchable recipe field that is given is fixed, else searched.
    ``devices`` may be a list of counts. ``plan(...).to_dict()`` is ``trainplan plan --json``.
    """
    from trainplan.planner.command import plan_from_values

    values = _plan_values(fields, inputs.PLAN_FIELDS)
    return plan_from_values(values, _model(model), _accelerators(hardware, hardware_file))


def compare(
    model: str | ModelSpec,
    *,
    hardware: HardwareList,
    hardware_file: Sequence[str] = (),
    **fields: object,
) -> Comparison:
    """The same job on each accelerator at its best layout and device count (``trainplan compare``).

    ``hardware``: comma-separated names or a list of names or ``Accelerator`` objects; ``fields``:
    the compare fields (docs/api.md). ``compare(...).to_dict()`` is ``trainplan compare --json``.
    """
    from trainplan.planner.command import Comparison, compare_from_values

    values = _plan_values(fields, inputs.COMPARE_FIELDS)
    return Comparison(
        result=compare_from_values(values, _model(model), _accelerators(hardware, hardware_file))
    )
