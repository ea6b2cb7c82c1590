"""``POST /api/plan`` and ``POST /api/compare``: the planner behind the page.

The request fields are the fields of ``trainplan plan`` / ``trainplan compare``
(:data:`trainplan.inputs.PLAN_FIELDS`, :data:`~trainplan.inputs.COMPARE_FIELDS`) under their names,
and the request is turned into a recipe and a search space by the same
:func:`trainplan.planner.command.request`,
so the answers are what ``trainplan plan --json`` and ``trainplan compare --json`` print.
Differences, all for a server: ``hardware`` may be a JSON list (or the CLI's comma-separated
text), ``devices`` of ``plan`` may be a list of counts, ``device_price`` a list of ``NAME=USD``,
the model may be an uploaded config.json (``config``), and ``--hardware-file`` does not exist
(a server does not read files named by a request).
"""

from __future__ import annotations

from typing import Any, Final

from trainplan import inputs
from trainplan.errors import TrainplanError
from trainplan.web import api

MAX_PLAN_DEVICES: Final = 4096
"""Largest ``max_devices`` a request may ask for (the search grows with it)."""
SERVER_ONLY_EXCLUDED: Final = ("hardware_file", "json", "hardware", "devices")


def all_flags(compare_mode: bool) -> tuple[inputs.Field, ...]:
    """Every field of ``plan`` (or ``compare``) but the model, as the CLI reads them."""
    return inputs.COMPARE_FIELDS if compare_mode else inputs.PLAN_FIELDS


def plan_flags(compare_mode: bool = False) -> tuple[inputs.Field, ...]:
    """The request fields read as the CLI reads them (``hardware`` and ``devices`` are read
    separately). ``plot`` is accepted and ignored, as it always was (a server writes no files)."""
    fields = (*all_flags(compare_mode), inputs.PLOT)
    return tuple(f for f in fields if f.name not in SERVER_ONLY_EXCLUDED)


def _names(value: object, field: str) -> list[str]:
    try:
        return inputs.names(value, field)
    except TrainplanError as err:
        raise api.ApiError(err.field, err.message) from None


def _args(body: object, *, compare_mode: bool) -> tuple[dict[str, Any], Any, list[Any]]:
    obj = api._lora_targets(api._require_object(body))
    values = api.read_fields(obj, plan_flags(compare_mode), (*api.MODEL_FIELDS, "hardware", "devices"))
    if values["max_devices"] > MAX_PLAN_DEVICES:
        raise api.ApiError(
            "max_devices", f"at most {MAX_PLAN_DEVICES} in one request, got {values['max_devices']}"
        )
    model = api.model_from_body(obj)
    hardware = obj.get("hardware")
    if compare_mode and hardware is None:
        raise api.ApiError("hardware", 'compare needs accelerator names, e.g. ["h100", "mi300x"]')
    names = ["any"] if hardware is None else _names(hardware, "hardware")
    if not names:
        raise api.ApiError("hardware", "name at least one accelerator (or 'any')")
    if names == ["any"] and not compare_mode:
        from trainplan.hardware import list_accelerators

        accs: list[Any] = list(list_accelerators())
    else:
        accs = []
        for name in names:
            acc = api._accelerator(name)
            if acc not in accs:
                accs.append(acc)
        if compare_mode and len(accs) > api.MAX_COMPARE:
            raise api.ApiError("hardware", f"compare at most {api.MAX_COMPARE} accelerators at once")
    devices = obj.get("devices")
    dev_field = inputs.COMPARE_DEVICES if compare_mode else inputs.PLAN_DEVICES
    if isinstance(devices, list) and not compare_mode:
        devices = ",".join(_names(devices, "devices"))
    try:
        values["devices"] = dev_field.parse(devices)
    except TrainplanError as err:
        raise api.ApiError(err.field, err.message) from None
    values["hardware"] = ",".join(a.name for a in accs)
    return values, model, accs


def plan(body: object) -> dict[str, object]:
    """``trainplan plan --json``."""
    from trainplan.planner.command import plan_from_values

    values, model, accs = _args(body, compare_mode=False)
    out: dict[str, object] = plan_from_values(values, model, accs).to_dict()
    return out


def compare(body: object) -> dict[str, object]:
    """``trainplan compare --json``: each accelerator at its best layout (and device count)."""
    from trainplan.planner.command import compare_from_values, compare_to_dict

    values, model, accs = _args(body, compare_mode=True)
    return compare_to_dict(compare_from_values(values, model, accs))
