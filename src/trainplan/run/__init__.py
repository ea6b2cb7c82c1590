"""``trainplan run``: train a plan for real with ``torchrun`` and compare it with the estimate.

The launcher (:mod:`trainplan.run.launch`) validates the plan and computes the prediction with
:func:`trainplan.predict.estimate` without importing torch, then starts
``python -m torch.distributed.run --standalone --nproc-per-node N -m trainplan.run.worker``.
Each worker (:mod:`trainplan.run.worker`) builds the reference model of
:mod:`trainplan.trace.models` with real weights, applies the layout with PyTorch's own APIs
(DDP, ZeroRedundancyOptimizer, FSDP2 ``fully_shard``, DTensor ``parallelize_module``,
``checkpoint_wrapper``), trains a few steps on synthetic tokens and rank 0 writes what it
measured. Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainplan.run.config import RunConfig, check_supported

__all__ = ["RunConfig", "check_supported"]


def __getattr__(name: str) -> Any:
    """:class:`RunConfig` and :func:`check_supported`, imported on first use (``trainplan run``
    registers its flags without them)."""
    if name in __all__:
        from trainplan.run import config

        return getattr(config, name)
    raise AttributeError(f"module 'trainplan.run' has no attribute {name!r}")
