"""The planner: search accelerators, device counts and layouts; rank, explain (docs/plan.md)."""

from __future__ import annotations

from trainplan.inputs import OBJECTIVES
from trainplan.planner.bulk import BulkEvaluator, BulkResult, Candidates, Core
from trainplan.planner.search import (
    AcceleratorBest,
    Explanation,
    Plan,
    PlanResult,
    SearchSpace,
    SearchStats,
    compare,
    default_global_batch,
    device_ladder,
    enumerate_candidates,
    enumerate_cores,
    plan,
)

__all__ = [
    "OBJECTIVES",
    "AcceleratorBest",
    "BulkEvaluator",
    "BulkResult",
    "Candidates",
    "Core",
    "Explanation",
    "Plan",
    "PlanResult",
    "SearchSpace",
    "SearchStats",
    "compare",
    "default_global_batch",
    "device_ladder",
    "enumerate_candidates",
    "enumerate_cores",
    "plan",
]
