"""Exports: a plan written as a real training engine's own configuration.

``export_plan(target, system, model, recipe, layout)`` returns the text of the target's file.
A plan setting that the target cannot express raises :class:`trainplan.errors.TrainplanError`
naming the field; settings that live outside the file (in the training script) come back as
warnings. Targets and pinned schemas:

========== ============================================ =================================
target     what is written                              schema
========== ============================================ =================================
torchtitan TOML job config; LoRA: Python config module  torchtitan 0.2.2; LoRA 0.3.0
deepspeed  ``ds_config.json``                           DeepSpeed 0.19.8
accelerate ``accelerate launch --config_file`` YAML     Accelerate 1.15.0
torchrun   shell command: torchrun + torchtitan flags   torch 2.13, torchtitan 0.2.2
megatron   shell command: torchrun + pretrain_gpt.py    Megatron-LM core_r0.14.0
nemo       Python recipe: Megatron Bridge ConfigContainer Megatron Bridge 0.3.1
========== ============================================ =================================

``--tokens`` becomes the number of optimizer steps, ⌈tokens / (global batch · sequence length)⌉
(:func:`trainplan.export.megatron.train_steps`): torchtitan's ``training.steps`` (its learning-rate
schedule's length), Megatron-LM's ``--train-iters`` and ``--lr-decay-iters``, Megatron Bridge's
``train.train_iters`` and ``scheduler.lr_decay_iters``; a target whose file
has no step count says the number in a warning.
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

__all__ = ["TARGETS", "ExportResult", "export_plan", "write_text"]


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """The exported file: its ``text``, a suggested ``filename``, and ``warnings`` about settings
    that the training script must supply (never settings that were dropped)."""

    target: str
    text: str
    filename: str
    warnings: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    """Files the main one needs beside it, ``(file name, text)``: the torchtitan job config of a
    model outside torchtitan's flavor tables names the module that registers it."""


def write_text(path: str, text: str, *, field: str = "output") -> None:
    """Write ``text`` to the file ``path`` (UTF-8), or raise a :class:`TrainplanError` naming
    ``field``: a directory, a missing directory, a full disk, no permission, a name too long."""
    import errno
    import os

    if os.path.isdir(path):
        raise TrainplanError(
            field, f"'{path}' is a directory; give a file name, e.g. {os.path.join(path, 'config')}"
        )
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise TrainplanError(
            field, f"directory '{parent}' does not exist; create it first or write elsewhere"
        )
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
    except OSError as exc:
        why = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise TrainplanError(field, f"cannot write '{path}': {why}; free space or write elsewhere") from None


Renderer = Callable[[System, ModelSpec, Recipe, Layout], tuple[str, tuple[str, ...]]]


def _renderers() -> dict[str, tuple[Renderer, str]]:
    from trainplan.export import accelerate, deepspeed, megatron, nemo, torchrun, torchtitan

    return {
        "torchtitan": (torchtitan.render, "torchtitan.toml"),
        "deepspeed": (deepspeed.render, "ds_config.json"),
        "accelerate": (accelerate.render, "accelerate_config.yaml"),
        "torchrun": (torchrun.render, "launch.sh"),
        "megatron": (megatron.render, "megatron_launch.sh"),
        "nemo": (nemo.render, "megatron_bridge_recipe.py"),
    }


TARGETS: Final = ("torchtitan", "deepspeed", "accelerate", "torchrun", "megatron", "nemo")
STACK_OF: Final = {target: "megatron" if target in ("megatron", "nemo") else "pytorch" for target in TARGETS}
"""The stack each target's engine runs: Megatron-LM's and Megatron Bridge's Megatron-Core modules,
else PyTorch's own."""
CAPACITY_TARGETS: Final = ("megatron", "nemo")
HF_MODEL_TARGETS: Final = ("deepspeed", "accelerate")
"""Targets that configure the launch around the user's own (Hugging Face) model rather than build
the model from the plan's dimensions."""
"""The targets whose MoE layers pad experts to a capacity (Megatron-Core
``moe_expert_capacity_factor`` with ``moe_pad_expert_input_to_capacity``)."""
NO_EXPORT_VENDORS: Final = {
    "Google": "TPUs train through XLA: MaxText, JAX or PyTorch/XLA",
    "AWS": "Trainium trains through the Neuron SDK: NxD Training or optimum-neuron",
    "Cerebras": "the wafer-scale engine trains through the Cerebras Model Zoo",
}
"""Vendors none of the targets runs on (every target launches CUDA/ROCm PyTorch), with the stack
their accelerators train with; export refuses them."""
STEPS_IN_FILE: Final = ("torchtitan", "torchrun", "megatron", "nemo")
"""The targets whose output carries the step count that ``--tokens`` gives."""


def export_plan(
    target: str, system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> ExportResult:
    """Write the plan as ``target``'s configuration; raise :class:`TrainplanError` naming the field
    the target cannot express."""
    renderers = _renderers()
    if target not in renderers:
        raise TrainplanError("to", f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")
    acc = system.accelerator
    if acc.vendor in NO_EXPORT_VENDORS:
        raise TrainplanError(
            "hardware",
            f"{target} launches a PyTorch job on CUDA or ROCm GPUs, and {acc.name} is {acc.vendor}'s "
            f"accelerator ({NO_EXPORT_VENDORS[acc.vendor]}), so the launch would not run there; trainplan "
            "has no export for that stack: export a plan on a GPU, or size the job with `trainplan estimate`",
        )
    if recipe.method in RLHF_METHODS:
        raise TrainplanError(
            "method",
            f"{target} runs the training step of one model; {recipe.method} also needs "
            "its reference, reward or critic models (and for ppo / grpo a rollout engine): run it with TRL, OpenRLHF or verl "
            f"(`trainplan estimate --method {recipe.method}` sizes its memory and step)",
        )
    if recipe.moe_dispatch == "einsum":
        raise TrainplanError(
            "moe_dispatch",
            f"{target} cannot express one-hot einsum dispatch (GShard, MaxText sparse_matmul=False): its MoE "
            "layers permute tokens by index; plan with --moe-dispatch gather",
        )
    if recipe.moe_capacity_factor is not None and target not in CAPACITY_TARGETS:
        raise TrainplanError(
            "moe_capacity_factor",
            f"{target} cannot express capacity-padded experts (its MoE layers are dropless); export to "
            f"{' or '.join(CAPACITY_TARGETS)} (--moe-expert-capacity-factor with "
            "--moe-pad-expert-input-to-capacity), or plan dropless (no --moe-capacity-factor)",
        )
    if model.attention_sinks and target not in HF_MODEL_TARGETS:
        raise TrainplanError(
            "model",
            f"{target} builds its own model and {model.name}'s attention sinks (one learned logit per head, "
            "gpt-oss) are not among the options this export writes; export to "
            f"{' or '.join(HF_MODEL_TARGETS)}, which wrap the Hugging Face model as it is",
        )
    if recipe.mtp_layers and target != "megatron":
        raise TrainplanError(
            "mtp_layers",
            f"{target} cannot express multi-token prediction modules; export to megatron (--mtp-num-layers), "
            "or plan without --mtp-layers",
        )
    if layout.ep_comm_overlap and target not in ("megatron", "nemo"):
        raise TrainplanError(
            "ep_comm_overlap",
            f"{target} cannot express Megatron-Core's expert all-to-all overlap; export to megatron or nemo, "
            "or plan without --ep-comm-overlap",
        )
    if layout.expert_tp != layout.tp and target not in ("megatron", "nemo"):
        raise TrainplanError(
            "etp",
            f"{target} is not written with expert tensor parallelism other than tp: export to megatron "
            "(--expert-tensor-parallel-size) or nemo (expert_tensor_parallel_size), or plan without --etp",
        )
    if recipe.recompute_modules is not None and target not in ("megatron", "nemo"):
        raise TrainplanError(
            "recompute_modules",
            f"{target} cannot express Megatron-Core's recompute modules; export to megatron or nemo",
        )
    # the launch describes the decoder and its MTP depth, not the costed model with MTP layers
    model = model.decoder()
    render, filename = renderers[target]
    text, warnings = render(system, model, recipe, layout)
    stack = STACK_OF[target]
    if recipe.stack != stack:
        modules = "Megatron-Core modules" if stack == "megatron" else "PyTorch modules"
        warnings = (
            *warnings,
            f"the plan's times use the {recipe.stack} stack's calibrated efficiency; {target} runs "
            f"{modules}, whose speed differs (estimate or plan with --stack {stack} for it)",
        )
    if target not in STEPS_IN_FILE and recipe.tokens is not None:
        from trainplan.export._common import plan_facts
        from trainplan.export.megatron import train_steps

        steps = train_steps(recipe, plan_facts(system, model, recipe, layout).global_batch)
        warnings = (
            *warnings,
            f"--tokens {recipe.tokens:.3g} is {steps} optimizer steps: set them in the training script",
        )
    files: tuple[tuple[str, str], ...] = ()
    if target == "torchtitan":
        from trainplan.export.torchtitan import companion_files, writes_0_3

        files = companion_files(system, model, recipe, layout)
        if writes_0_3(recipe):
            from trainplan.export.torchtitan03 import MODULE

            filename = f"{MODULE}.py"
    return ExportResult(target=target, text=text, filename=filename, warnings=warnings, files=files)
