"""Numbers that are floats for one estimate and numpy arrays for a million planner candidates.

Every cost term is written once, over ``Num``: :func:`trainplan.predict.estimate` calls it with
Python floats (and ints and bools), the planner (``planner/bulk.py``) with arrays of one element per
candidate. The few operations a term needs that Python spells differently for the two — a
conditional, an element-wise maximum — are here; the arithmetic operators (``+ - * / //``,
comparisons, ``&`` ``|`` on bools) already mean the same on both.

This module never imports numpy at import time: a float-only caller (``trainplan estimate``) does
not load it; an array argument means numpy is loaded already.

Rules for a term written over ``Num``:

* no ``if`` on a value that may be an array: use :func:`where` (both branches are evaluated, so
  neither may raise: guard a division by selecting a safe divisor first);
* ``max``/``min`` of two values: :func:`maximum` / :func:`minimum`;
* ``⌈a / b⌉`` of integers: :func:`ceil_div`;
* a condition of a scalar caller is a Python ``bool``, of an array caller a bool array.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias, cast

if TYPE_CHECKING:
    import numpy.typing as npt

    Num: TypeAlias = float | npt.NDArray[Any]
    """A float (one candidate) or a float array (one element per candidate)."""
    Int: TypeAlias = int | npt.NDArray[Any]
    Bool: TypeAlias = bool | npt.NDArray[Any]
else:
    Num = Any
    Int = Any
    Bool = Any


def _np() -> Any:
    return sys.modules["numpy"] if "numpy" in sys.modules else __import__("numpy")


_SCALAR_TYPES: frozenset[type] = frozenset((int, float, bool))


def is_scalar(*values: object) -> bool:
    """True when none of ``values`` is an array (the scalar ``estimate`` path)."""
    return all(v.__class__ in _SCALAR_TYPES or isinstance(v, int | float) for v in values)


def where(cond: Bool, a: Num, b: Num) -> Num:
    """``a if cond else b`` element by element (``numpy.where`` on arrays)."""
    if cond is True:
        return a
    if cond is False:
        return b
    return cast("Num", _np().where(cond, a, b))


def all_true(cond: Bool) -> bool:
    """Whether every element of ``cond`` holds (``cond`` itself for a scalar): lets a term skip a
    branch that no candidate takes."""
    if isinstance(cond, bool):
        return cond
    return bool(_np().all(cond))


def logical_not(x: Bool) -> Bool:
    """``not x`` element by element (``~`` on a Python bool is the integer −2, never use it)."""
    if isinstance(x, bool):
        return not x
    return cast("Bool", _np().logical_not(x))


def maximum(a: Num, b: Num) -> Num:
    """Element-wise maximum (``max`` on scalars, ``numpy.maximum`` on arrays)."""
    if (a.__class__ in _SCALAR_TYPES or isinstance(a, int | float)) and (
        b.__class__ in _SCALAR_TYPES or isinstance(b, int | float)
    ):
        return a if a >= b else b
    return cast("Num", _np().maximum(a, b))


def minimum(a: Num, b: Num) -> Num:
    """Element-wise minimum (``min`` on scalars, ``numpy.minimum`` on arrays)."""
    if (a.__class__ in _SCALAR_TYPES or isinstance(a, int | float)) and (
        b.__class__ in _SCALAR_TYPES or isinstance(b, int | float)
    ):
        return a if a <= b else b
    return cast("Num", _np().minimum(a, b))


def ceil_div(a: Int, b: Int) -> Int:
    """``⌈a / b⌉`` of positive integers, exact (``-(-a // b)``) on ints and int arrays alike."""
    return -(-a // b)


def as_float(x: Num) -> Num:
    """``float(x)`` for a scalar, a float64 array otherwise."""
    if x.__class__ in _SCALAR_TYPES or isinstance(x, int | float):
        return float(x)
    return cast("Num", _np().asarray(x, dtype=_np().float64))


def total(values: Iterable[Num]) -> Num:
    """Left-to-right sum of an iterable of ``Num`` starting at ``0.0`` (the order ``sum`` uses)."""
    out: Num = 0.0
    for v in values:
        out = out + v
    return out


__all__ = [
    "Bool",
    "Int",
    "Num",
    "all_true",
    "as_float",
    "ceil_div",
    "is_scalar",
    "logical_not",
    "maximum",
    "minimum",
    "total",
    "where",
]
