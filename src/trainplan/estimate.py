"""The former name of :mod:`trainplan.predict`, kept while :mod:`trainplan.planner.search` imports it.

Import :mod:`trainplan.predict` instead. ``import trainplan.estimate as m`` does not give this
module: the package keeps ``trainplan.estimate`` bound to the function :func:`trainplan.estimate`.
"""

from __future__ import annotations

from trainplan.predict import (
    Estimate,
    ModelSummary,
    check_precision,
    estimate,
    layout_to_dict,
    recipe_to_dict,
    trainable_params,
)

__all__ = [
    "Estimate",
    "ModelSummary",
    "check_precision",
    "estimate",
    "layout_to_dict",
    "recipe_to_dict",
    "trainable_params",
]
