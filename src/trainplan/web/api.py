"""The JSON API behind the page: request bodies in, the CLI's JSON out.

Every request field is one of the CLI's estimate flags with its ``dest`` name (``--seq-len`` is
``"seq_len"``, ``--no-master-weights`` is ``"no_master_weights"``): the flag definitions in
:mod:`trainplan.cli` are the single source of names, types, choices and defaults, and the same
``recipe_from_args`` / ``layout_from_args`` build the inputs, so ``POST /api/estimate`` answers
exactly what ``trainplan estimate --json`` prints for the same inputs.

The model is a preset name (``"model"``) or an uploaded Hugging Face ``config.json`` object
(``"config"``). Uploaded configs are data only: a JSON object, at most
:data:`~trainplan.models.hf.MAX_CONFIG_BYTES` bytes once serialised, read by
:func:`~trainplan.models.hf.from_hf_config`; a model name is never taken as a path on the server.

Bad input raises :class:`ApiError` (HTTP 400) whose ``field`` names the request field.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from trainplan.errors import TrainplanError

MAX_BODY_BYTES: Final = 2_000_000
"""Largest request body read (a 1 MB config.json plus the other fields, with room to spare)."""
MAX_COMPARE: Final = 32
"""Most accelerators in one compare request."""
MODEL_FIELDS: Final = ("model", "config", "config_name", "strict")
HARDWARE_FIELDS: Final = ("hardware",)


class ApiError(TrainplanError):
    """Bad request: HTTP ``status`` (400 unless said), ``field`` names the request field."""

    def __init__(self, field: str, message: str, *, status: int = 400) -> None:
        super().__init__(field, message)
        self.status = status


def error_body(err: TrainplanError) -> dict[str, object]:
    """``{"error": {"field": ..., "message": ...}}`` for any trainplan error."""
    return {"error": {"field": err.field, "message": err.message}}


# --- the flag table -----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Flag:
    """One CLI flag as a JSON field: ``kind`` is ``"bool"`` (a store_true flag), ``"list"`` (a
    repeatable flag) or ``"value"``."""

    dest: str
    option: str
    kind: str
    default: object
    choices: tuple[object, ...] | None
    convert: Callable[[str], object] | None
    help: str

    def parse(self, value: object) -> object:
        """Validate and convert one JSON value exactly as argparse would the flag's text."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ApiError(self.dest, f"expected true or false, got {json.dumps(value)}")
            return value
        if self.kind == "list":  # a repeatable flag: a list of values (or one)
            items = value if isinstance(value, list) else [value]
            return [Flag(**{**self.__dict__, "kind": "value"}).parse(v) for v in items]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ApiError(self.dest, f"expected a string or a number, got {json.dumps(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ApiError(self.dest, f"expected a finite number, got {value}")
        text = str(value)
        converted: object = text
        if self.convert is not None:
            try:
                converted = self.convert(text)
            except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
                raise ApiError(self.dest, f"{self.option}: {exc}") from None
        if self.choices is not None and converted not in self.choices:
            choices = ", ".join(str(c) for c in self.choices)
            raise ApiError(self.dest, f"{self.option}: {text!r} is not one of {choices}")
        return converted


def _flags(add: Callable[[argparse.ArgumentParser], None]) -> tuple[Flag, ...]:
    parser = argparse.ArgumentParser(add_help=False)
    add(parser)
    out: list[Flag] = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        kind = "value"
        if isinstance(action, argparse._StoreTrueAction):
            kind = "bool"
        elif isinstance(action, argparse._AppendAction):
            kind = "list"
        convert = action.type if callable(action.type) else None
        out.append(
            Flag(
                dest=action.dest,
                option=action.option_strings[0],
                kind=kind,
                default=action.default,
                choices=tuple(action.choices) if action.choices is not None else None,
                convert=convert,
                help=action.help or "",
            )
        )
    return tuple(out)


@cache
def estimate_flags() -> tuple[Flag, ...]:
    """The layout, recipe and cost flags of ``trainplan estimate`` (CLI order)."""
    from trainplan.cli import add_cost_arguments, add_layout_arguments, add_recipe_arguments

    def add(p: argparse.ArgumentParser) -> None:
        add_layout_arguments(p)
        add_recipe_arguments(p)
        add_cost_arguments(p)

    return _flags(add)


def _namespace(body: Mapping[str, object], flags: Sequence[Flag], known: Sequence[str]) -> argparse.Namespace:
    """Defaults overlaid with the body's fields; an unknown field is an error naming it."""
    by_dest = {f.dest: f for f in flags}
    for key in body:
        if key not in by_dest and key not in known:
            raise ApiError(key, f"unknown field {key!r}; see GET /api/openapi.json for the fields")
    ns = argparse.Namespace()
    for f in flags:
        value = body.get(f.dest)
        default = list(f.default) if isinstance(f.default, list) else f.default
        setattr(ns, f.dest, default if value is None else f.parse(value))
    return ns


def _lora_targets(body: dict[str, object]) -> dict[str, object]:
    """``lora_targets`` may be a list of module names (the CLI's comma-separated text)."""
    targets = body.get("lora_targets")
    if isinstance(targets, list):
        if not all(isinstance(t, str) for t in targets):
            raise ApiError("lora_targets", 'expected module names, e.g. ["q", "v"]')
        body = {**body, "lora_targets": ",".join(str(t) for t in targets)}
    return body


# --- the model ----------------------------------------------------------------------------------
def model_from_body(body: Mapping[str, object]) -> Any:
    """A preset (``model``) or an uploaded config.json object (``config``), never a server path."""
    from trainplan.models import from_hf_config, load_model, preset_names
    from trainplan.models.hf import MAX_CONFIG_BYTES

    name = body.get("model")
    config = body.get("config")
    if config is not None:
        if name is not None:
            raise ApiError("model", "give either a preset name (model) or an uploaded config.json (config)")
        if not isinstance(config, dict):
            raise ApiError("config", f"config.json must be a JSON object, got a JSON {_json_type(config)}")
        size = len(json.dumps(config).encode("utf-8"))
        if size > MAX_CONFIG_BYTES:
            raise ApiError(
                "config",
                f"config.json is {size:,} bytes, over the {MAX_CONFIG_BYTES:,}-byte limit; "
                "upload the model's config.json, not a weights or tokenizer file",
            )
        label = body.get("config_name", "uploaded")
        if not isinstance(label, str) or not label.strip() or len(label) > 200:
            raise ApiError("config_name", "expected a short model name (1-200 characters)")
        strict = body.get("strict", True)
        if not isinstance(strict, bool):
            raise ApiError("strict", f"expected true or false, got {json.dumps(strict)}")
        return from_hf_config(config, label.strip(), strict=strict, source="uploaded config.json")
    if name is None:
        raise ApiError("model", "give a preset name (GET /api/models) or upload a config.json (config)")
    if not isinstance(name, str):
        raise ApiError("model", f"expected a preset name, got {json.dumps(name)}")
    if name.strip().lower() not in {n.lower() for n in preset_names()}:
        raise ApiError(
            "model",
            f"unknown preset {name!r}; GET /api/models lists them, or upload a config.json as 'config'",
        )
    return load_model(name)


def _json_type(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _accelerator(name: object, field: str = "hardware") -> Any:
    from trainplan.hardware import get_accelerator

    if not isinstance(name, str) or not name.strip():
        raise ApiError(field, f"expected an accelerator name (GET /api/hardware), got {json.dumps(name)}")
    try:
        return get_accelerator(name)
    except TrainplanError as err:
        raise ApiError(field, err.message) from None


def _require_object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise ApiError("body", f"expected a JSON object, got a JSON {_json_type(body)}")
    return body


# --- the endpoints ------------------------------------------------------------------------------
def models() -> list[dict[str, object]]:
    """``trainplan models --json``."""
    from trainplan.models import count_params, list_presets

    rows: list[dict[str, object]] = []
    for m in list_presets():
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
    return rows


def hardware() -> list[dict[str, object]]:
    """``trainplan hardware list --json``."""
    from trainplan.hardware import list_accelerators

    return [a.to_dict() for a in list_accelerators()]


def estimate_payload(est: Any) -> dict[str, object]:
    """``Estimate.to_dict()`` (the CLI's JSON) plus ``terms``: the named parts that add up.

    ``terms.memory`` is the visible sum at the peak (``MemoryBreakdown.terms()``, adds up to
    ``memory.per_device_bytes``); ``terms.time`` is ``TimeBreakdown.terms()`` (adds up to
    ``time.step_s``), each term tagged with its plot group.
    """
    out = dict(est.to_dict())
    out["terms"] = {
        "memory": [{"name": n, "bytes": float(v)} for n, v in est.memory.terms()],
        "time": [{"name": n, "s": float(v), "group": time_group(n)} for n, v in est.time.terms()],
    }
    return out


def time_group(term: str) -> str:
    """The step-time plot group of a ``TimeBreakdown`` term: compute, communication, bubble, ..."""
    if term.startswith("compute"):
        return "compute"
    if term == "pipeline bubble":
        return "bubble"
    if term in ("optimizer step", "gradient accumulation"):
        return "optimizer"
    if term.startswith("offload"):
        return "offload"
    return "communication"


@dataclass(frozen=True, kw_only=True)
class EstimateInputs:
    system: Any
    model: Any
    recipe: Any
    layout: Any
    price: float | None
    provider: str | None
    pue: float


def estimate_inputs(body: object, *, accelerator: Any = None) -> EstimateInputs:
    """Parse an estimate request body into the four typed inputs and the cost options."""
    from trainplan.cli import layout_from_args, recipe_from_args
    from trainplan.hardware.system import System

    obj = _lora_targets(_require_object(body))
    ns = _namespace(obj, estimate_flags(), (*MODEL_FIELDS, *HARDWARE_FIELDS))
    model = model_from_body(obj)
    acc = accelerator if accelerator is not None else _accelerator(obj.get("hardware"))
    recipe = recipe_from_args(ns)
    layout = layout_from_args(ns)
    return EstimateInputs(
        system=System(accelerator=acc, num_devices=ns.devices),
        model=model,
        recipe=recipe,
        layout=layout,
        price=ns.price,
        provider=ns.provider,
        pue=ns.pue,
    )


def _run_estimate(inp: EstimateInputs) -> Any:
    from trainplan.estimate import estimate

    return estimate(
        inp.system,
        inp.model,
        inp.recipe,
        inp.layout,
        price_usd_per_device_hour=inp.price,
        provider=inp.provider,
        pue=inp.pue,
    )


def estimate(body: object) -> dict[str, object]:
    """``POST /api/estimate``: the CLI's ``estimate --json`` object plus ``terms``."""
    return estimate_payload(_run_estimate(estimate_inputs(body)))
