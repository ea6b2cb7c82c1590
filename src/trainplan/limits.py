"""Bounds on every size trainplan accepts, and the one check that applies them.

A size outside these bounds is refused with a typed error naming the field, the bound and the
fix, instead of being computed (a layer loop over 2³¹ layers does not end; a batch of 10²³
sequences gives step times of 10¹¹ days). Each bound is far above the largest published value,
so no real configuration meets it:

* devices and each parallel degree: 2²⁰ (about a million accelerators; the largest announced
  training clusters are of the order of 10⁵);
* sequence length: 2²⁴ tokens (the longest published training contexts are about 10⁷ tokens);
* sequences per micro-batch and per step: 2²⁴;
* tokens of a run: 1 to 10¹⁸ (the largest published pre-training runs are about 4·10¹³ tokens);
* layers: 2¹⁴ (published decoders have at most a few hundred);
* widths (hidden size, head dim, MLP and expert widths): 2²⁰; heads: 2¹⁶; vocabulary: 2²⁴;
  experts: 2¹⁶.

Importing this module imports nothing else of trainplan but the errors.
"""

from __future__ import annotations

import math
from typing import Final

from trainplan.errors import TrainplanError

MAX_DEVICES: Final = 2**20
MAX_SEQ_LEN: Final = 2**24
MAX_SEQUENCES: Final = 2**24
MIN_TOKENS: Final = 1.0
MAX_TOKENS: Final = 1e18
MAX_LAYERS: Final = 2**14
MAX_WIDTH: Final = 2**20
MAX_HEADS: Final = 2**16
MAX_VOCAB: Final = 2**24
MAX_EXPERTS: Final = 2**16


def check_int(
    field: str,
    value: object,
    *,
    low: int = 1,
    high: int,
    error: type[TrainplanError] = TrainplanError,
    what: str = "",
) -> int:
    """``value`` as an int in ``[low, high]``, else ``error(field, ...)`` saying which bound it broke.

    A bool or a float is refused (``True`` is not a layer count, ``inf`` is not a batch size).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a positive integer" if low >= 1 else f"an integer >= {low}"
        raise error(field, f"must be {kind}, got {value!r}")
    shown = str(value) if value.bit_length() < 128 else f"an integer of {value.bit_length()} bits"
    if value < low:
        kind = "a positive integer" if low == 1 else f"at least {low}"
        raise error(field, f"must be {kind}, got {shown}")
    if value > high:
        raise error(
            field,
            f"{shown} is above trainplan's limit of {high:,}{' ' + what if what else ''}; "
            "give a realistic size (the limits are listed in trainplan.limits)",
        )
    return value


def check_real(
    field: str,
    value: object,
    *,
    low: float,
    high: float,
    error: type[TrainplanError] = TrainplanError,
    what: str = "",
) -> float:
    """``value`` as a finite real in ``[low, high]``, else ``error(field, ...)``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise error(field, f"must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise error(
            field,
            f"{value!r} is outside trainplan's limits [{low:g}, {high:g}]{' ' + what if what else ''}; "
            "give a value in that range",
        )
    return float(value)
