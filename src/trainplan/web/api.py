"""The JSON API behind the page: request bodies in, the CLI's JSON out.

Every request field is a field of the input schema (:mod:`trainplan.inputs`) under its name, the
CLI flag's ``dest`` (``--seq-len`` is ``"seq_len"``, ``--no-master-weights`` is
``"no_master_weights"``): the schema is the single source of names, types, choices and defaults,
checked by the same :meth:`~trainplan.inputs.Field.parse` and turned into inputs by the same
:func:`~trainplan.inputs.build_recipe` / :func:`~trainplan.inputs.build_layout` as the CLI's, so
``POST /api/estimate`` answers exactly what ``trainplan estimate --json`` prints for the same inputs.

The model is a preset name (``"model"``) or an uploaded Hugging Face ``config.json`` object
(``"config"``). Uploaded configs are data only: a JSON object, at most
:data:`~trainplan.models.hf.MAX_CONFIG_BYTES` bytes once serialised, read by
:func:`~trainplan.models.hf.from_hf_config`; a model name is never taken as a path on the server.

Bad input raises :class:`ApiError` (HTTP 400) whose ``field`` names the request field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from trainplan import inputs
from trainplan.errors import TrainplanError
from trainplan.terms import TIME_TERMS

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


# --- the fields ---------------------------------------------------------------------------------
def estimate_flags() -> tuple[inputs.Field, ...]:
    """The request fields of ``POST /api/estimate`` besides the model and the hardware: the layout,
    recipe and cost fields of ``trainplan estimate`` (CLI order)."""
    return inputs.ESTIMATE_FIELDS


def read_fields(
    body: Mapping[str, object], fields: Sequence[inputs.Field], known: Sequence[str]
) -> dict[str, Any]:
    """Defaults overlaid with the body's fields; an unknown field is an error (400) naming it."""
    try:
        return inputs.read(body, fields, also=known)
    except TrainplanError as err:
        raise ApiError(err.field, err.message) from None


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
    ``memory.per_device_bytes``), each term with its ``color`` (:func:`trainplan.palette.memory_colors`:
    distinct within the bar); ``terms.time`` is ``TimeBreakdown.terms()`` (adds up to
    ``time.step_s``), each term tagged with its plot group.
    """
    from trainplan.palette import memory_colors

    out = dict(est.to_dict())
    mem = memory_terms(est)
    colors = memory_colors([n for n, _ in mem])
    out["terms"] = {
        "memory": [{"name": n, "bytes": float(v), "color": c} for (n, v), c in zip(mem, colors, strict=True)],
        "time": [
            {"name": t.label, "key": t.key, "s": float(getattr(est.time, t.key)), "group": t.group}
            for t in TIME_TERMS
        ],
    }
    return out


def memory_terms(est: Any) -> list[tuple[str, float]]:
    """The visible sum of ``memory.per_device_bytes``: the training step's terms, or for an RLHF
    method the peak phase's terms (every model named) with the CUDA context and fragmentation."""
    rl = est.rlhf
    if rl is None:
        return list(est.memory.terms())
    from trainplan.memory import CUDA_CONTEXT_BYTES, FRAGMENTATION_FRACTION

    return [
        *((f"{rl.peak_phase}: {n}", v) for n, v in rl.phases[rl.peak_phase]),
        ("CUDA context / runtime", CUDA_CONTEXT_BYTES),
        ("allocator fragmentation", FRAGMENTATION_FRACTION * rl.peak_bytes),
    ]


@dataclass(frozen=True, kw_only=True)
class EstimateInputs:
    system: Any
    model: Any
    recipe: Any
    layout: Any
    price: float | None
    provider: str | None
    pue: float
    reliability: Any = None
    rlhf: Any = None
    engine: Any = None  # trainplan.engines.Applied: what the engine set
    memory_margin: float = 0.0  # fraction of device memory a fitting plan leaves free
    price_query: Any = None


def estimate_inputs(body: object, *, accelerator: Any = None) -> EstimateInputs:
    """Parse an estimate request body into the four typed inputs and the cost options."""
    from trainplan.hardware.system import System

    obj = _lora_targets(_require_object(body))
    values = read_fields(obj, estimate_flags(), (*MODEL_FIELDS, *HARDWARE_FIELDS))
    model = model_from_body(obj)
    acc = accelerator if accelerator is not None else _accelerator(obj.get("hardware"))
    from trainplan.api import rlhf_spec

    recipe = inputs.build_recipe(values)
    return EstimateInputs(
        system=System(
            accelerator=acc,
            num_devices=values["devices"],
            host_memory_bytes_per_node=inputs.host_memory_bytes(values),
        ),
        model=model,
        recipe=recipe,
        layout=inputs.build_layout(values),
        price=values["price"],
        provider=values["provider"],
        pue=values["pue"],
        reliability=inputs.build_reliability(values),
        rlhf=rlhf_spec(values, model, recipe),
        engine=inputs.engine_settings(values),
        memory_margin=values["memory_margin"],
        price_query=inputs.price_query(values),
    )


def _run_estimate(inp: EstimateInputs) -> Any:
    from dataclasses import replace

    from trainplan.predict import estimate

    est = estimate(
        inp.system,
        inp.model,
        inp.recipe,
        inp.layout,
        price_usd_per_device_hour=inp.price,
        pue=inp.pue,
        reliability=inp.reliability,
        rlhf=inp.rlhf,
        memory_margin=inp.memory_margin,
        price_query=inp.price_query if inp.price_query is not None else inputs.price_query({}),
    )
    return replace(est, engine=inp.engine)


def estimate(body: object) -> dict[str, object]:
    """``POST /api/estimate``: the CLI's ``estimate --json`` object plus ``terms``."""
    return estimate_payload(_run_estimate(estimate_inputs(body)))
