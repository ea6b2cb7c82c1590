"""The OpenAPI 3.1 document of the web API (``GET /api/openapi.json``).

The paths and response shapes are written out here; the request fields of estimate, compare and
plan are listed from the input schema the CLI's flags are built from (:mod:`trainplan.inputs`),
so their names, types, choices and defaults cannot drift from ``trainplan estimate``.
"""

from __future__ import annotations

from typing import Any

from trainplan import inputs
from trainplan.web import api

ERROR = {"$ref": "#/components/schemas/Error"}


_BAND_PROPERTIES: dict[str, Any] = {
    "class": {"type": "string", "description": "validation class: family/stack/method/parallelism"},
    "rows": {"type": "integer", "description": "validation rows behind the band (0: uncalibrated)"},
    "calibrated": {"type": "boolean"},
    "low": {"type": "number", "description": "true / predicted − 1 at the band's low end (5%)"},
    "high": {"type": "number", "description": "true / predicted − 1 at the band's high end (95%)"},
    "quantity": {"type": "string"},
    "family": {"type": "string"},
    "part": {"type": "string", "description": "the catalog accelerator estimated"},
    "parts": {
        "type": "array",
        "items": {"type": "string"},
        "description": "the accelerators the family's validation rows ran on (its widest class)",
    },
    "on_part": {
        "type": "boolean",
        "description": "false: calibrated on other parts of the family only, none on this one",
    },
    "arch": {
        "type": "string",
        "description": "the model's architecture class: dense or moe (an MoE model never takes a dense band)",
    },
}
_CALIBRATION: dict[str, Any] = {
    "type": "object",
    "description": "the step-time band's class (also that of tokens/s, run time and cost) and, under "
    "memory, the peak-memory band's class (trainplan/bands.py); the absolute bands are "
    "time.step_s_band, throughput.tokens_per_s_band, memory.per_device_bytes_band",
    "properties": {**_BAND_PROPERTIES, "memory": {"type": "object", "properties": _BAND_PROPERTIES}},
}
_RANKING: dict[str, Any] = {
    "type": "array",
    "items": {"type": "string"},
    "description": "what the bands allow the ranking to say: ties within error, calibrated vs uncalibrated",
}


def _flag_properties(fields: tuple[inputs.Field, ...]) -> dict[str, Any]:
    return {f.name: f.json_schema() for f in fields}


def _model_properties() -> dict[str, Any]:
    return {
        "model": {"type": "string", "description": "a preset name from GET /api/models"},
        "config": {
            "type": "object",
            "description": "an uploaded Hugging Face config.json (JSON object, at most 1,000,000 bytes); "
            "read as data only. Give either model or config.",
        },
        "config_name": {"type": "string", "default": "uploaded", "description": "name of the uploaded model"},
        "strict": {
            "type": "boolean",
            "default": True,
            "description": "reject unknown config.json keys (false: ignore them, with a note)",
        },
    }


def openapi_document() -> dict[str, Any]:
    from trainplan import __version__
    from trainplan.web import plan_api

    est_props = {
        **_model_properties(),
        "hardware": {"type": "string", "description": "accelerator name or alias from GET /api/hardware"},
        **_flag_properties(api.estimate_flags()),
    }
    cmp_props = {
        **_model_properties(),
        "hardware": {
            "type": ["array", "string"],
            "items": {"type": "string"},
            "maxItems": api.MAX_COMPARE,
            "description": "accelerators to compare (a list, or the CLI's comma-separated text)",
        },
        "devices": {
            "type": ["integer", "null"],
            "minimum": 1,
            "description": "CLI --devices: fixed device count (default: searched)",
        },
        **_flag_properties(plan_api.plan_flags(True)),
    }
    plan_props = {
        **_model_properties(),
        "hardware": {
            "type": ["array", "string"],
            "items": {"type": "string"},
            "default": "any",
            "description": "CLI --hardware: accelerators to search, or 'any' (the whole catalog)",
        },
        "devices": {
            "type": ["array", "string", "null"],
            "items": {"type": "integer", "minimum": 1},
            "description": "CLI --devices: device counts to consider (default: 1,2,4 and node/domain multiples)",
        },
        **_flag_properties(plan_api.plan_flags(False)),
    }

    def body(schema: str) -> dict[str, Any]:
        return {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }

    def ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    errors = {
        "400": ok("bad input: the field named and how to fix it", ERROR),
        "413": ok("request body over 2,000,000 bytes", ERROR),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "trainplan",
            "version": __version__,
            "description": "Memory, step time and cost of transformer training. The JSON keys are those of the "
            "CLI's --json output (docs/cli.md); requests use the CLI's flag names with underscores.",
        },
        "servers": [{"url": "/"}],
        "paths": {
            "/": {
                "get": {
                    "summary": "the page",
                    "operationId": "page",
                    "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
                }
            },
            "/api/models": {
                "get": {
                    "summary": "model presets (trainplan models --json)",
                    "operationId": "models",
                    "responses": {
                        "200": ok(
                            "presets", {"type": "array", "items": {"$ref": "#/components/schemas/ModelRow"}}
                        )
                    },
                }
            },
            "/api/hardware": {
                "get": {
                    "summary": "accelerator catalog (trainplan hardware list --json)",
                    "operationId": "hardware",
                    "responses": {"200": ok("accelerators", {"type": "array", "items": {"type": "object"}})},
                }
            },
            "/api/estimate": {
                "post": {
                    "summary": "memory, step time and cost of one configuration (trainplan estimate --json)",
                    "operationId": "estimate",
                    "requestBody": body("EstimateRequest"),
                    "responses": {
                        "200": ok("the estimate", {"$ref": "#/components/schemas/Estimate"}),
                        **errors,
                    },
                }
            },
            "/api/compare": {
                "post": {
                    "summary": "the same model, recipe and layout on several accelerators",
                    "operationId": "compare",
                    "requestBody": body("CompareRequest"),
                    "responses": {
                        "200": ok("one result per accelerator", {"$ref": "#/components/schemas/Compare"}),
                        **errors,
                    },
                }
            },
            "/api/plan": {
                "post": {
                    "summary": "search accelerators, device counts and layouts (trainplan plan --json)",
                    "operationId": "plan",
                    "requestBody": body("PlanRequest"),
                    "responses": {
                        "200": ok(
                            "fastest, cheapest, Pareto front and ranked plans",
                            {"$ref": "#/components/schemas/Plan"},
                        ),
                        **errors,
                    },
                }
            },
            "/api/openapi.json": {
                "get": {
                    "summary": "this document",
                    "operationId": "openapi",
                    "responses": {"200": ok("OpenAPI 3.1", {"type": "object"})},
                }
            },
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["field", "message"],
                            "properties": {
                                "field": {"type": ["string", "null"], "description": "the bad request field"},
                                "message": {"type": "string"},
                            },
                        }
                    },
                },
                "ModelRow": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "family": {"type": "string"},
                        "params": {"type": "integer"},
                        "active_params": {"type": "integer"},
                        "source": {"type": "string"},
                    },
                },
                "EstimateRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["hardware"],
                    "properties": est_props,
                },
                "CompareRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["hardware"],
                    "properties": cmp_props,
                },
                "PlanRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": plan_props,
                },
                "Estimate": {
                    "type": "object",
                    "description": "trainplan estimate --json (stable keys: model.params, memory.per_device_bytes, "
                    "time.step_s, throughput.tokens_per_s, run.cost_usd, ...) plus terms",
                    "required": [
                        "model",
                        "memory",
                        "time",
                        "throughput",
                        "run",
                        "feasible",
                        "terms",
                        "calibration",
                    ],
                    "properties": {
                        "calibration": _CALIBRATION,
                        "terms": {
                            "type": "object",
                            "description": "named parts: memory at the peak (adds up to memory.per_device_bytes), "
                            "step time (adds up to time.step_s)",
                            "properties": {
                                "memory": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "name": {"type": "string"},
                                            "bytes": {"type": "number"},
                                        },
                                    },
                                },
                                "time": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "name": {"type": "string"},
                                            "s": {"type": "number"},
                                            "group": {
                                                "enum": [
                                                    "compute",
                                                    "communication",
                                                    "bubble",
                                                    "optimizer",
                                                    "offload",
                                                ]
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
                "Compare": {
                    "type": "object",
                    "description": "trainplan compare --json: the best plan per accelerator, or why there is none",
                    "properties": {
                        "model": {"type": "string"},
                        "objective": {"type": "string"},
                        "global_batch": {"type": "integer"},
                        "tokens": {"type": ["number", "null"]},
                        "hardware": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "hardware": {"type": "string"},
                                    "plan": {
                                        "type": ["object", "null"],
                                        "description": "an estimate plus rank, label, explanation",
                                    },
                                    "reason": {"type": ["string", "null"]},
                                },
                            },
                        },
                        "search": {"type": "object"},
                        "notes": {"type": "array", "items": {"type": "string"}},
                        "ranking": _RANKING,
                    },
                },
                "Plan": {
                    "type": "object",
                    "description": "trainplan plan --json",
                    "properties": {
                        "fastest": {"type": ["object", "null"]},
                        "cheapest": {"type": ["object", "null"]},
                        "pareto": {"type": "array", "items": {"type": "object"}},
                        "plans": {"type": "array", "items": {"type": "object"}},
                        "ranking": _RANKING,
                    },
                },
            }
        },
    }
