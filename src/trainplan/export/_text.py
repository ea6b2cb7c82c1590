"""Minimal writers for the TOML and YAML subsets the exporters emit.

The configurations are nested tables of strings, integers, floats, booleans and lists of
strings, so a small writer suffices and trainplan needs no TOML/YAML library at run time. The
tests read every file back with ``tomllib`` / the engines' own loaders.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

Scalar = str | int | float | bool
Value = Scalar | Sequence[str] | Mapping[str, "Value"]


def _toml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_toml(data: Mapping[str, object], *, header: Sequence[str] = ()) -> str:
    """Tables (nested mappings) become ``[a.b]`` sections; scalars and lists become ``key = value``."""
    lines = [f"# {h}" if h else "#" for h in header]

    def emit(table: Mapping[str, object], path: tuple[str, ...]) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
        if path and scalars:
            if lines:
                lines.append("")
            lines.append("[" + ".".join(path) + "]")
        for key, value in scalars:
            lines.append(f"{key} = {_toml_scalar(value)}")
        for key, sub in tables:
            assert isinstance(sub, Mapping)
            emit(sub, (*path, key))

    emit(data, ())
    return "\n".join(lines) + "\n"


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar
    if value is None:
        return "null"
    raise TypeError(f"cannot write {type(value).__name__} to YAML")


def to_yaml(data: Mapping[str, object], *, header: Sequence[str] = ()) -> str:
    """Block-style YAML: nested mappings indented by two spaces, scalars JSON-quoted."""
    lines = [f"# {h}" if h else "#" for h in header]

    def emit(table: Mapping[str, object], indent: int) -> None:
        pad = " " * indent
        for key, value in table.items():
            if isinstance(value, Mapping) and not value:
                lines.append(f"{pad}{key}: {{}}")
            elif isinstance(value, Mapping):
                lines.append(f"{pad}{key}:")
                emit(value, indent + 2)
            else:
                lines.append(f"{pad}{key}: {_yaml_scalar(value)}")

    emit(data, 0)
    return "\n".join(lines) + "\n"
