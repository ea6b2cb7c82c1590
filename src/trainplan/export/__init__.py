"""Exports: a plan written as a real training engine's own configuration.

``export_plan(target, system, model, recipe, layout)`` returns the text of the target's file.
A plan setting that the target cannot express raises :class:`trainplan.errors.TrainplanError`
naming the field; settings that live outside the file (in the training script) come back as
warnings. Targets and pinned schemas:

========== ============================================ =================================
target     what is written                              schema
========== ============================================ =================================
torchtitan job config TOML                              torchtitan 0.2.2
deepspeed  ``ds_config.json``                           DeepSpeed 0.19.8
accelerate ``accelerate launch --config_file`` YAML     Accelerate 1.15.0
torchrun   shell command: torchrun + torchtitan flags   torch 2.13, torchtitan 0.2.2
========== ============================================ =================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from trainplan.errors import TrainplanError
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import RLHF_METHODS, Recipe

__all__ = ["TARGETS", "ExportResult", "export_plan"]


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """The exported file: its ``text``, a suggested ``filename``, and ``warnings`` about settings
    that the training script must supply (never settings that were dropped)."""

    target: str
    text: str
    filename: str
    warnings: tuple[str, ...] = ()


Renderer = Callable[[System, ModelSpec, Recipe, Layout], tuple[str, tuple[str, ...]]]


def _renderers() -> dict[str, tuple[Renderer, str]]:
    from trainplan.export import accelerate, deepspeed, torchrun, torchtitan

    return {
        "torchtitan": (torchtitan.render, "torchtitan.toml"),
        "deepspeed": (deepspeed.render, "ds_config.json"),
        "accelerate": (accelerate.render, "accelerate_config.yaml"),
        "torchrun": (torchrun.render, "launch.sh"),
    }


TARGETS: Final = ("torchtitan", "deepspeed", "accelerate", "torchrun")


def export_plan(
    target: str, system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> ExportResult:
    """Write the plan as ``target``'s configuration; raise :class:`TrainplanError` naming the field
    the target cannot express."""
    renderers = _renderers()
    if target not in renderers:
        raise TrainplanError("to", f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")
    if recipe.method in RLHF_METHODS:
        raise TrainplanError(
            "method",
            f"{target} runs the training step of one model; {recipe.method} also needs "
            "its reference, reward or critic models (and for ppo / grpo a rollout engine): run it with TRL, OpenRLHF or verl "
            f"(`trainplan estimate --method {recipe.method}` sizes its memory and step)",
        )
    render, filename = renderers[target]
    text, warnings = render(system, model, recipe, layout)
    if recipe.stack != "pytorch":
        # Every target runs PyTorch's own modules: its compute speed is the pytorch stack's κ.
        warnings = (
            *warnings,
            f"the plan's times use the {recipe.stack} stack's calibrated efficiency; {target} runs "
            "PyTorch modules, which reach less (estimate or plan with --stack pytorch for its speed)",
        )
    return ExportResult(target=target, text=text, filename=filename, warnings=warnings)
