"""``POST /api/plan`` and ``POST /api/compare``: the planner behind the page.

The request fields are the flags of ``trainplan plan`` / ``trainplan compare``
(:func:`trainplan.planner.command.configure_parser`) under their ``dest`` names, and the request
is turned into a recipe and a search space by the same :func:`trainplan.planner.command.request`,
so the answers are what ``trainplan plan --json`` and ``trainplan compare --json`` print.
Differences, all for a server: ``hardware`` may be a JSON list (or the CLI's comma-separated
text), ``devices`` of ``plan`` may be a list of counts, ``device_price`` a list of ``NAME=USD``,
the model may be an uploaded config.json (``config``), and ``--hardware-file`` does not exist
(a server does not read files named by a request).
"""

from __future__ import annotations

import argparse
from functools import cache
from typing import Any, Final

from trainplan.web import api

MAX_PLAN_DEVICES: Final = 4096
"""Largest ``max_devices`` a request may ask for (the search grows with it)."""
SERVER_ONLY_EXCLUDED: Final = ("hardware_file", "json", "hardware", "devices")


def _configure(compare_mode: bool) -> Any:
    from trainplan.cli import (
        _positive_float,
        _positive_int,
        add_cost_arguments,
        add_hardware_file_argument,
        add_recipe_arguments,
    )
    from trainplan.planner.command import configure_parser

    def add(p: argparse.ArgumentParser) -> None:
        configure_parser(
            p,
            compare_mode=compare_mode,
            add_recipe=add_recipe_arguments,
            add_cost=add_cost_arguments,
            add_hardware_file=add_hardware_file_argument,
            positive_int=_positive_int,
            positive_float=_positive_float,
        )

    return add


@cache
def all_flags(compare_mode: bool) -> tuple[api.Flag, ...]:
    """Every flag of ``plan`` (or ``compare``) as the CLI defines it."""
    return api._flags(_configure(compare_mode))


@cache
def plan_flags(compare_mode: bool = False) -> tuple[api.Flag, ...]:
    """The request fields taken as flags (``hardware`` and ``devices`` are read separately)."""
    return tuple(f for f in all_flags(compare_mode) if f.dest not in SERVER_ONLY_EXCLUDED)


def _names(value: object, field: str) -> list[str]:
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, list) and all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
        return [str(v).strip() for v in value if str(v).strip()]
    raise api.ApiError(field, "expected a list of names (or comma-separated text)")


def _args(body: object, *, compare_mode: bool) -> tuple[argparse.Namespace, Any, list[Any]]:
    obj = api._lora_targets(api._require_object(body))
    ns = api._namespace(obj, plan_flags(compare_mode), (*api.MODEL_FIELDS, "hardware", "devices"))
    if ns.max_devices > MAX_PLAN_DEVICES:
        raise api.ApiError("max_devices", f"at most {MAX_PLAN_DEVICES} in one request, got {ns.max_devices}")
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
    dev_flag = next(f for f in all_flags(compare_mode) if f.dest == "devices")
    if devices is None:
        ns.devices = None
    elif compare_mode:
        ns.devices = dev_flag.parse(devices)
    else:
        ns.devices = (
            ",".join(_names(devices, "devices")) if isinstance(devices, list) else dev_flag.parse(devices)
        )
    ns.hardware = ",".join(a.name for a in accs)
    ns.hardware_file = []
    ns.json = True
    if isinstance(ns.device_price, str):
        ns.device_price = [ns.device_price]
    return ns, model, accs


def plan(body: object) -> dict[str, object]:
    """``trainplan plan --json``."""
    from trainplan.planner.command import plan_from_args

    ns, model, accs = _args(body, compare_mode=False)
    out: dict[str, object] = plan_from_args(ns, model, accs).to_dict()
    return out


def compare(body: object) -> dict[str, object]:
    """``trainplan compare --json``: each accelerator at its best layout (and device count)."""
    from trainplan.planner.command import compare_from_args, compare_to_dict

    ns, model, accs = _args(body, compare_mode=True)
    return compare_to_dict(compare_from_args(ns, model, accs))
