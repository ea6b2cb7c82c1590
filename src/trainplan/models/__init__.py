"""Transformer architectures: the spec type, presets, Hugging Face import, parameter counts."""

from __future__ import annotations

from trainplan.models.hf import SUPPORTED_MODEL_TYPES, from_hf_config, load_hf_config, read_config_json
from trainplan.models.params import (
    LinearShape,
    ParamCounts,
    count_params,
    layer_params,
    linear_shapes,
    lora_params,
)
from trainplan.models.presets import get_preset, list_presets, load_model, preset_names
from trainplan.models.spec import ModelSpec, MoESpec

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "LinearShape",
    "MoESpec",
    "ModelSpec",
    "ParamCounts",
    "count_params",
    "from_hf_config",
    "get_preset",
    "layer_params",
    "linear_shapes",
    "list_presets",
    "load_hf_config",
    "load_model",
    "lora_params",
    "preset_names",
    "read_config_json",
]
