"""What every exporter needs from a plan: validated degrees, batch arithmetic and node shape.

All exporters start from :func:`plan_facts`, which runs the same checks as ``estimate`` (the
layout against the model, the batch against the layout, the device count against the system)
so an export never writes a configuration that trainplan itself would reject.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainplan.errors import TrainplanError
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe, fp8_options_set


@dataclass(frozen=True, kw_only=True)
class PlanFacts:
    """Numbers derived once from (system, model, recipe, layout) and shared by every target.

    ``micro_batches`` is the number of micro-batches each pipeline (or, without pipelining, each
    data-parallel rank) runs per optimizer step: ``global_batch / (dp · micro_batch)``.
    """

    num_devices: int
    num_nodes: int
    nproc_per_node: int
    micro_batch: int
    micro_batches: int
    global_batch: int


def plan_facts(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> PlanFacts:
    """Validate the plan and derive the launch shape; raise :class:`TrainplanError` naming the field."""
    if layout.num_devices != system.num_devices:
        raise TrainplanError(
            "devices",
            f"the layout uses dp·tp·pp·cp = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = "
            f"{layout.num_devices} devices but the system has {system.num_devices}",
        )
    layout.check_model(model)
    micro_batches = layout.check_batch(
        seq_len=recipe.seq_len, micro_batch=recipe.micro_batch, global_batch=recipe.global_batch
    )
    global_batch = layout.dp * recipe.micro_batch * micro_batches
    per_node = system.devices_per_node
    if system.num_devices <= per_node:
        nodes, nproc = 1, system.num_devices
    else:
        if system.num_devices % per_node != 0:
            raise TrainplanError(
                "devices",
                f"{system.num_devices} devices do not fill whole nodes of {per_node}; launchers start the "
                f"same number of processes on every node, so use a multiple of {per_node}",
            )
        nodes, nproc = system.num_devices // per_node, per_node
    return PlanFacts(
        num_devices=system.num_devices,
        num_nodes=nodes,
        nproc_per_node=nproc,
        micro_batch=recipe.micro_batch,
        micro_batches=micro_batches,
        global_batch=global_batch,
    )


class Unsupported(TrainplanError):
    """A plan setting a target cannot express: ``what`` it is and the ``hint`` of a way out."""

    def __init__(self, target: str, field: str, what: str, hint: str) -> None:
        self.target, self.what, self.hint = target, what, hint
        super().__init__(field, f"{target} cannot express {what}; {hint}")

    def without_other_targets(self) -> str:
        """The message with the hint's clauses that name another target left out (the caller
        names the targets that were checked to write the plan)."""
        clauses = [c for part in self.hint.split("; ") for c in part.split(", or ")]
        kept = [c for c in clauses if "export to" not in c and "export a" not in c]
        return f"{self.target} cannot express {self.what}" + (f"; {', or '.join(kept)}" if kept else "")


def unsupported(target: str, field: str, what: str, hint: str) -> TrainplanError:
    """The error for a plan setting a target cannot express: names the field, the target and a way out."""
    return Unsupported(target, field, what, hint)


def check_megatron_options(recipe: Recipe, target: str) -> None:
    """Refuse the Megatron-Core / Transformer Engine settings a PyTorch-engine target has no place
    for: the block recompute (``Recipe.recompute_layers``) and the FP8 switches
    (``Recipe.fp8_params``, ``fp8_activation_store``, ``fp8_attention``)."""
    if recipe.recompute_layers:
        raise unsupported(
            target,
            "recompute_layers",
            f"recomputing the first {recipe.recompute_layers} blocks of each stage (Megatron-LM's block method)",
            "export to megatron or nemo, or plan with plain --recompute full",
        )
    for name, flag in fp8_options_set(recipe):
        raise unsupported(
            target,
            name,
            f"Transformer Engine's {flag} (a Megatron-Core / TE setting)",
            f"export to megatron, or drop {flag}",
        )


def check_loss(recipe: Recipe, target: str) -> None:
    """Refuse flash-attn's fused cross-entropy (``Recipe.fused_cross_entropy``) on a target that
    writes the trainer's own loss (torchtitan's and Megatron's cross-entropy are not it)."""
    if recipe.fused_cross_entropy:
        raise unsupported(
            target,
            "fused_cross_entropy",
            "flash-attn's fused cross-entropy (the trainer computes its own loss)",
            "export to deepspeed or accelerate (the model's own loss), or drop --fused-cross-entropy",
        )


FUSED_LOSS_WARNING = (
    "--fused-cross-entropy: the estimate assumes the model's loss is flash-attn's fused CrossEntropyLoss; "
    "this config does not set the loss, the model code does"
)


def shell_command(argv: Sequence[str], breaks_before: Callable[[str], bool]) -> str:
    """``argv`` as one shell command over several lines: words quoted (``$MASTER_ADDR…`` left to
    the shell), a new line before each word ``breaks_before`` picks, joined by ``\\``."""
    quoted = [a if a.startswith("$MASTER_ADDR") else shlex.quote(a) for a in argv]
    lines: list[str] = []
    line = ""
    for word in quoted:
        if breaks_before(word) and line:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return " \\\n  ".join(lines) + "\n"
