"""Typed errors. Every error names the bad field and says how to fix it.

The CLI turns any :class:`TrainplanError` into one line on stderr and exit status 2;
a traceback reaching a user is a bug.
"""

from __future__ import annotations


class TrainplanError(ValueError):
    """Bad input: ``field`` names what is wrong, the message says how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class CatalogError(TrainplanError):
    """An accelerator entry (built-in or user file) is malformed or unknown."""


class ModelError(TrainplanError):
    """A model preset or a Hugging Face config.json cannot be turned into an architecture."""


class RecipeError(TrainplanError):
    """A training recipe (method, precision, optimizer, batch) is invalid."""


class LayoutError(TrainplanError):
    """A parallel layout does not divide the devices, heads, layers or experts."""
