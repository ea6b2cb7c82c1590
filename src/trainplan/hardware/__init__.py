"""Accelerator catalog: typed accelerators, systems, and the built-in data files.

``get_accelerator("h100")`` returns the H100 SXM entry; ``list_accelerators()`` returns every
entry; user files of the same TOML schema are validated exactly like the built-ins
(:func:`load_hardware_file`, or ``extra_files=`` on the look-ups). Conventions and per-entry
sources: ``docs/hardware.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainplan.hardware.accelerator import Accelerator, CloudOffering, Link
from trainplan.hardware.catalog import all_accelerators, find, find_builtin, load_hardware_file
from trainplan.hardware.render import render_show, render_table
from trainplan.hardware.system import System

__all__ = [
    "Accelerator",
    "CloudOffering",
    "Link",
    "System",
    "get_accelerator",
    "list_accelerators",
    "load_hardware_file",
    "render_show",
    "render_table",
]


def get_accelerator(name: str, extra_files: Sequence[str | Path] = ()) -> Accelerator:
    """Accelerator by name or alias (case-insensitive); :class:`CatalogError` with suggestions.

    A built-in name without ``extra_files`` reads only the vendor files up to its own."""
    if not extra_files:
        acc = find_builtin(name)
        if acc is not None:
            return acc
    return find(name, all_accelerators(extra_files))


def list_accelerators(extra_files: Sequence[str | Path] = ()) -> list[Accelerator]:
    """Every built-in entry (vendor file order), then the entries of ``extra_files``."""
    return list(all_accelerators(extra_files))
