"""What the launcher hands to every worker, and which plans ``trainplan run`` can execute.

Nothing here imports torch: the checks run in the launcher, before any process is spawned, so a
plan that cannot run is a one-line error (exit 2) rather than a traceback from N ranks.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from trainplan.errors import LayoutError, ModelError, RecipeError, TrainplanError
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec, MoESpec
from trainplan.recipe import Recipe
from trainplan.sac import check_sac

Device = Literal["cpu", "cuda"]
DEVICES: Final = ("cpu", "cuda")
RUN_PRECISIONS: Final = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run: the model, the layout, the parts of the recipe the worker uses, and the loop settings."""

    model: ModelSpec
    layout: Layout
    precision: str
    recompute: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    steps: int
    warmup: int
    lr: float
    seed: int
    device: Device
    recompute_early_stop: bool = False  # Recipe.recompute_early_stop (full and sac recompute)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all data-parallel replicas (dp·micro·accum·seq)."""
        return self.layout.dp * self.micro_batch * self.grad_accum * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["model"] = dataclasses.asdict(self.model)
        out["layout"] = dataclasses.asdict(self.layout)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        spec = dict(data["model"])
        if spec.get("moe") is not None:
            spec["moe"] = MoESpec(**spec["moe"])
        spec["notes"] = tuple(spec.get("notes", ()))
        kw = dict(data)
        kw["model"] = ModelSpec(**spec)
        kw["layout"] = Layout(**data["layout"])
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TrainplanError("config", "the run configuration must be a JSON object")
        return cls.from_dict(data)


def check_supported(model: ModelSpec, recipe: Recipe, layout: Layout) -> None:
    """Raise a :class:`TrainplanError` naming the field when ``run`` cannot execute the plan.

    What runs: pretrain/full training with AdamW in fp32 or bf16, data parallel (DDP, ZeRO-1
    through ``ZeroRedundancyOptimizer``, ZeRO-2/3 through FSDP2), tensor parallel with or without
    sequence parallelism, full activation checkpointing, gradient accumulation.
    """
    if layout.pp > 1:
        raise LayoutError("pp", f"pp={layout.pp}: run does not execute pipeline parallelism; use pp=1")
    if layout.cp > 1:
        raise LayoutError("cp", f"cp={layout.cp}: run does not execute context parallelism; use cp=1")
    if layout.ep > 1:
        raise LayoutError("ep", f"ep={layout.ep}: run does not execute expert parallelism; use ep=1")
    if layout.zero3_granularity != "block":
        raise LayoutError(
            "zero3_granularity",
            "run shards with FSDP2, one unit per block; drop --zero3-granularity parameter",
        )
    if layout.zero == 1 and layout.tp > 1 and layout.dp > 1:
        raise LayoutError(
            "zero",
            "zero=1 with tp > 1 is not run (ZeroRedundancyOptimizer takes no DTensor parameters); "
            "use zero 2 or 3 (FSDP2)",
        )
    if model.tied_embeddings and layout.tp > 1:
        raise LayoutError(
            "tp", f"{model.name} ties its embeddings; run applies tensor parallelism to untied ones"
        )
    if model.moe is not None and layout.tp > 1 and layout.sequence_parallel:
        raise LayoutError("sequence_parallel", "MoE layers with sequence parallelism are not run")
    if model.position == "learned" and layout.tp > 1:
        raise LayoutError(
            "tp", f"{model.name} has learned positions; run applies tensor parallelism to RoPE models"
        )
    if model.position in ("alibi",):
        raise TrainplanError("model", f"{model.name}: ALiBi positions are not in the reference models")
    if recipe.method not in ("pretrain", "full"):
        raise RecipeError("method", f"run trains all weights (pretrain or full), not {recipe.method}")
    if recipe.precision not in RUN_PRECISIONS:
        raise RecipeError(
            "precision",
            f"run trains in {' or '.join(RUN_PRECISIONS)}, not {recipe.precision} "
            "(fp16 needs loss scaling, fp8/fp4 need extra kernels)",
        )
    if not recipe.master_weights and recipe.precision != "fp32":
        raise RecipeError("master_weights", "run keeps FP32 master weights; drop --no-master-weights")
    if recipe.optimizer != "adamw":
        raise RecipeError("optimizer", f"run uses AdamW, not {recipe.optimizer}")
    if recipe.recompute == "selective":
        raise RecipeError(
            "recompute", "run checkpoints whole blocks or per op: use --recompute none, full or sac"
        )
    if recipe.recompute_every > 1:
        raise RecipeError(
            "recompute_every",
            "run checkpoints every block or none: use --recompute-every 1 (size every n-th block with estimate)",
        )
    if recipe.recompute_layers:
        raise RecipeError(
            "recompute_layers",
            "run checkpoints every block or none (PyTorch checkpoint per block), not Megatron-LM's first N: "
            "drop --recompute-layers (size the block method with estimate)",
        )
    if recipe.recompute == "sac":
        check_sac(model, layout)
    if recipe.attention != "flash":
        raise RecipeError(
            "attention", "run uses scaled_dot_product_attention (flash); drop --attention eager"
        )
    if recipe.offload != "none":
        raise RecipeError("offload", "run does not offload; use --offload none")
    if recipe.dropout > 0:
        raise RecipeError("dropout", "the reference models have no dropout; use --dropout 0")
    if recipe.loss_chunks != 1:
        raise RecipeError("loss_chunks", "run computes the loss in one piece; drop --loss-chunks")
    if recipe.fused_cross_entropy:
        raise RecipeError(
            "fused_cross_entropy", "run computes PyTorch's cross-entropy; drop --fused-cross-entropy"
        )
    if recipe.optimizer_in_backward:
        raise RecipeError("optimizer_in_backward", "run steps the optimizer after the backward")
    if recipe.paged_optimizer:
        raise RecipeError("paged_optimizer", "run keeps optimizer states in device memory")
    if recipe.moe_capacity_factor is not None or recipe.moe_dispatch != "gather":
        raise RecipeError(
            "moe_capacity_factor" if recipe.moe_capacity_factor is not None else "moe_dispatch",
            "the reference MoE layers route dropless by index (no capacity, no einsum dispatch); "
            "drop --moe-capacity-factor and --moe-dispatch",
        )
    if recipe.mtp_layers:
        raise RecipeError(
            "mtp_layers", "the reference models have no multi-token prediction modules; drop --mtp-layers"
        )
    if layout.expert_tp != layout.tp:
        raise LayoutError("etp", "run splits routed experts like the other linears (over tp); drop --etp")
    if model.mla is not None:
        raise ModelError(
            "model",
            f"{model.name} uses multi-head latent attention, which the reference blocks do not build "
            "(they have q, k, v, o projections); run a multi/grouped-query model",
        )


__all__ = ["DEVICES", "RUN_PRECISIONS", "Device", "RunConfig", "check_supported"]
