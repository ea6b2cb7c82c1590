"""Built-in model presets (``models/data/presets.toml``) and :func:`load_model`.

A preset is one TOML table of :class:`~trainplan.models.spec.ModelSpec` fields with a ``source``
(the Hugging Face config.json or paper table it was copied from). Names are lowercase-hyphenated
and matched case-insensitively.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from trainplan.data_files import data_text
from trainplan.errors import ModelError
from trainplan.models.spec import MLASpec, ModelSpec, MoESpec

__all__ = ["get_preset", "list_presets", "load_model", "preset_names", "spec_from_mapping"]

_DATA_PACKAGE = "trainplan.models.data"
_PRESET_FILE = "presets.toml"

_SPEC_FIELDS = {f.name for f in dataclasses.fields(ModelSpec)}
_Sub = TypeVar("_Sub", MoESpec, MLASpec)


def _sub_spec(entry: dict[str, Any], key: str, cls: type[_Sub], where: str) -> _Sub | None:
    """The ``key`` sub-table of a preset (``moe``, ``mla``) as ``cls``; an unknown or a missing
    required key is an error naming it."""
    raw = entry.pop(key, None)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ModelError(key, f"{where}: '{key}' must be a table of {cls.__name__} fields")
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    bad, missing = sorted(set(raw) - names), sorted(required - set(raw))
    if bad or missing:
        what = (bad or missing)[0]
        raise ModelError(
            f"{key}.{what}",
            f"{where}: {'unknown' if bad else 'missing'} key '{what}'; {cls.__name__} fields are "
            f"{', '.join(sorted(names))}",
        )
    return cls(**raw)


def spec_from_mapping(name: str, entry: dict[str, Any], *, where: str) -> ModelSpec:
    """Build a ModelSpec from a TOML-style mapping; unknown keys are errors naming the key.

    ``where`` says where the mapping came from (for messages), e.g. ``presets.toml [gpt2]``.
    """
    entry = dict(entry)
    unknown = sorted(set(entry) - (_SPEC_FIELDS - {"name"}))
    if unknown:
        raise ModelError(
            unknown[0],
            f"{where}: unknown key '{unknown[0]}'; ModelSpec fields are {', '.join(sorted(_SPEC_FIELDS))}",
        )
    moe = _sub_spec(entry, "moe", MoESpec, where)
    mla = _sub_spec(entry, "mla", MLASpec, where)
    for key in ("notes", "approximations"):
        if key in entry:
            if not isinstance(entry[key], list):
                raise ModelError(key, f"{where}: '{key}' must be a list of strings")
            entry[key] = tuple(entry[key])
    try:
        return ModelSpec(name=name, moe=moe, mla=mla, **entry)
    except TypeError as exc:  # a required field is missing
        raise ModelError("model", f"{where}: {exc}") from exc


_TABLE_START = re.compile(r'^(?=\["[^"]+"\][ \t]*$)', re.MULTILINE)
_TABLE_NAME = re.compile(r'^\["([^"]+)"\]')


@cache
def _preset_texts() -> dict[str, str]:
    """The preset file's top-level tables as text by name, in file order: a table's sub-tables
    (``["name".moe]``) follow it up to the next top-level table. A preset is parsed when first
    asked for (the whole file takes milliseconds to parse; one table, microseconds)."""
    text = data_text(_DATA_PACKAGE, _PRESET_FILE)
    out: dict[str, str] = {}
    for part in _TABLE_START.split(text):
        m = _TABLE_NAME.match(part)
        if m is None:
            continue  # the header comments
        name = m.group(1)
        if name != name.lower():
            raise ModelError("model", f"preset name '{name}' must be lowercase")
        if name in out:
            raise ModelError("model", f"preset '{name}' is defined twice in {_PRESET_FILE}")
        out[name] = part
    return out


@cache
def _preset_entry(name: str) -> dict[str, Any]:
    entry: dict[str, Any] = tomllib.loads(_preset_texts()[name])[name]
    return entry


def _preset_table() -> dict[str, Any]:
    """Every preset's table by name (parses them all: for listings)."""
    return {name: _preset_entry(name) for name in _preset_texts()}


@cache
def _preset(name: str) -> ModelSpec:
    return spec_from_mapping(name, _preset_entry(name), where=f"{_PRESET_FILE} [{name}]")


@cache
def _presets() -> dict[str, ModelSpec]:
    return {name: _preset(name) for name in _preset_table()}


def preset_names() -> list[str]:
    """Preset names in file order."""
    return list(_preset_texts())


def list_presets() -> list[ModelSpec]:
    """Every built-in preset, in file order."""
    return list(_presets().values())


def get_preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive); unknown names suggest the nearest one."""
    key = name.strip().lower()
    if key in _preset_texts():
        return _preset(key)
    close = difflib.get_close_matches(key, preset_names(), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ModelError(
        "model",
        f"unknown model '{name}'; {hint}`trainplan models` lists presets, "
        "or pass the path of a Hugging Face config.json",
    )


def _exists(name: str) -> bool:
    """Whether ``name`` names a file system entry; a name the file system cannot hold (too long,
    a NUL byte) names none."""
    try:
        return Path(name).exists()
    except (OSError, ValueError):
        return False


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".json") or "/" in name_or_path or "\\" in name_or_path


def load_model(name_or_path: str, *, strict: bool = True) -> ModelSpec:
    """A preset name (case-insensitive) or a path to a Hugging Face ``config.json``.

    A path is anything ending in ``.json``, containing a path separator, or naming an existing
    file or directory (a directory must hold ``config.json``). ``strict`` applies to config files:
    see :func:`trainplan.models.hf.from_hf_config`.
    """
    from trainplan.models.hf import load_hf_config

    if not isinstance(name_or_path, str):
        raise ModelError(
            "model",
            f"expected a preset name or a config.json path (a string), got {name_or_path!r}; "
            "`trainplan models` lists presets",
        )
    key = name_or_path.strip()
    if not key:
        raise ModelError("model", "empty model name; `trainplan models` lists presets")
    if key.lower() in _preset_texts():
        return _preset(key.lower())  # parses this preset only
    if _looks_like_path(key) or _exists(key):
        return load_hf_config(key, strict=strict)
    return get_preset(key)
