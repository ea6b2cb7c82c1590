"""trainplan: memory, step time and cost of transformer training on any accelerator.

The Python API (docs/api.md)::

    import trainplan

    est = trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", devices=8, zero=3, tokens=1e9)
    best = trainplan.plan("llama-3.1-70b", method="full", tokens=1e10, hardware=["h100-sxm", "h200"])

:func:`estimate`, :func:`plan` and :func:`compare` are loaded on first use (:mod:`trainplan.api`),
so ``import trainplan`` imports nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "compare", "estimate", "plan"]

if TYPE_CHECKING:
    from trainplan.api import compare, estimate, plan

_API = frozenset({"compare", "estimate", "plan"})


def __getattr__(name: str) -> Any:
    """``trainplan.estimate`` / ``plan`` / ``compare``: the functions of :mod:`trainplan.api`."""
    if name in _API:
        from trainplan import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainplan' has no attribute {name!r}")
