"""Published training measurements (step time, throughput, MFU, memory) and their loaders.

``datasets()`` returns every packaged dataset as typed rows; ``REGISTRY`` states what each
measures and the error bound it is judged against. Sources, conventions and the
calibration/validation split: ``docs/datasets.md``.
"""

from __future__ import annotations

from trainplan.validate.datasets import (
    REGISTRY,
    DatasetError,
    DatasetInfo,
    MemoryRow,
    ModelDims,
    Row,
    TimingRow,
    datasets,
    load,
    memory_rows,
    scheme_pairs,
    targets,
    timing_rows,
)

__all__ = [
    "REGISTRY",
    "DatasetError",
    "DatasetInfo",
    "MemoryRow",
    "ModelDims",
    "Row",
    "TimingRow",
    "datasets",
    "load",
    "memory_rows",
    "scheme_pairs",
    "targets",
    "timing_rows",
]
