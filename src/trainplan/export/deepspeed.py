"""DeepSpeed JSON configuration for a plan.

Schema: DeepSpeed 0.19.8 (PyPI ``deepspeed==0.19.8``), read by
``deepspeed/runtime/config.py::DeepSpeedConfig``, which also checks
``train_batch_size == train_micro_batch_size_per_gpu · gradient_accumulation_steps · dp``.
The keys and where DeepSpeed reads them:

``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``
    ``deepspeed/runtime/config.py`` (``get_train_batch_size`` and neighbours, ``_batch_assertion``).
``zero_optimization.stage``, ``.offload_optimizer.device``, ``.offload_param.device``
    ``deepspeed/runtime/zero/config.py::DeepSpeedZeroConfig`` and
    ``deepspeed/runtime/zero/offload_config.py`` (``DeepSpeedZeroOffloadOptimizerConfig``,
    ``DeepSpeedZeroOffloadParamConfig``).
``bf16.enabled``, ``bf16.bf16_master_weights_and_grads``, ``bf16.bf16_optimizer_states``,
``fp16.enabled``, ``fp16.loss_scale``
    ``deepspeed/runtime/precision_config.py`` (``DeepSpeedBF16Config``, ``DeepSpeedFP16Config``).
``tensor_parallel.autotp_size``
    ``deepspeed/runtime/tensor_parallel/config.py::TPTrainingConfig`` (AutoTP training).
``activation_checkpointing.partition_activations``, ``.contiguous_memory_optimization``
    ``deepspeed/runtime/activation_checkpointing/config.py``.
``optimizer.type``
    ``deepspeed/runtime/config.py`` (``DEEPSPEED_OPTIMIZERS``: ``AdamW``, ``Lion``, ...).

Pipeline stages (``deepspeed.pipe.PipelineModule(num_stages=...)``), expert parallelism
(``deepspeed.moe.layer.MoE(ep_size=...)``) and Ulysses sequence parallelism are set in model
code, not in this file, so plans with pp, ep or cp > 1 are errors here.
"""

from __future__ import annotations

import json
from typing import Final

from trainplan.export._common import (
    FUSED_LOSS_WARNING,
    PlanFacts,
    check_megatron_options,
    plan_facts,
    unsupported,
)
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

VERSION: Final = "0.19.8"
TARGET: Final = f"DeepSpeed {VERSION} config"

_OPTIMIZERS: Final = {"adamw": "AdamW", "lion": "Lion"}


def build_config(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[dict[str, object], PlanFacts, tuple[str, ...]]:
    facts = plan_facts(system, model, recipe, layout)
    warnings: list[str] = []
    check_megatron_options(recipe, TARGET)
    if recipe.fused_cross_entropy:
        warnings.append(FUSED_LOSS_WARNING)
    if recipe.recompute_every > 1:
        raise unsupported(
            TARGET,
            "recompute_every",
            f"checkpointing one block in {recipe.recompute_every} (its checkpointing wraps every layer)",
            "export to torchtitan (selective_ac_option), or plan with --recompute-every 1",
        )
    if layout.pp > 1:
        raise unsupported(
            TARGET,
            "pp",
            f"pipeline parallelism (pp={layout.pp}): stages are set by deepspeed.pipe.PipelineModule "
            "in model code, and its pipeline engine allows ZeRO stage 1 at most",
            "plan with --pp 1, or export to torchtitan",
        )
    if layout.cp > 1:
        raise unsupported(
            TARGET,
            "cp",
            f"ring-attention context parallelism (cp={layout.cp}); DeepSpeed's Ulysses sequence "
            "parallelism is a different algorithm set up in model code",
            "plan with --cp 1, or export to torchtitan/accelerate",
        )
    if layout.ep > 1:
        raise unsupported(
            TARGET,
            "ep",
            f"expert parallelism (ep={layout.ep}): it is set by deepspeed.moe.layer.MoE(ep_size=...) in model code",
            "plan with --ep 1, or export to torchtitan",
        )
    if layout.tp_comm_overlap:
        raise unsupported(
            TARGET,
            "tp_comm_overlap",
            "tensor-parallel communication overlap (AutoTP runs its collectives after the GEMMs)",
            "plan without --tp-comm-overlap, or export to torchtitan (async tensor parallelism)",
        )
    if layout.tp > 1 and layout.zero == 3:
        raise unsupported(
            TARGET,
            "tp",
            "AutoTP tensor parallelism together with ZeRO stage 3",
            "plan with --zero 2 or less, or export to torchtitan",
        )
    if layout.sequence_parallel:
        raise unsupported(
            TARGET,
            "sequence_parallel",
            "Megatron sequence parallelism (AutoTP shards linear layers only)",
            "drop --sequence-parallel",
        )
    if recipe.precision in ("fp8", "fp4"):
        raise unsupported(
            TARGET,
            "precision",
            f"{recipe.precision} GEMMs (low-precision matmuls come from Transformer Engine modules in model code)",
            "plan with bf16, or export to torchtitan/accelerate",
        )
    if recipe.optimizer_in_backward:
        raise unsupported(
            TARGET, "optimizer_in_backward", "an optimizer step inside the backward", "drop the flag"
        )
    if recipe.paged_optimizer:
        raise unsupported(TARGET, "paged_optimizer", "bitsandbytes paged optimizers", "drop the flag")

    config: dict[str, object] = {
        "train_batch_size": facts.global_batch,
        "train_micro_batch_size_per_gpu": recipe.micro_batch,
        "gradient_accumulation_steps": facts.micro_batches,
    }
    zero: dict[str, object] = {"stage": layout.zero}
    if recipe.offload != "none":
        if layout.zero == 0:
            raise unsupported(TARGET, "offload", "CPU offload without ZeRO", "plan with --zero 1 or more")
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if recipe.offload == "optimizer+params":
        if layout.zero != 3:
            raise unsupported(TARGET, "offload", "parameter offload below ZeRO stage 3", "plan with --zero 3")
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config["zero_optimization"] = zero

    if recipe.precision == "bf16":
        bf16: dict[str, object] = {"enabled": True}
        if not recipe.master_weights:
            if layout.zero == 0:
                raise unsupported(
                    TARGET, "master_weights", "pure bf16 training without ZeRO", "plan with --zero 1 or more"
                )
            bf16["bf16_master_weights_and_grads"] = True
            bf16["bf16_optimizer_states"] = True
        config["bf16"] = bf16
    elif recipe.precision == "fp16":
        if not recipe.master_weights:
            raise unsupported(TARGET, "master_weights", "pure fp16 training", "plan with master weights")
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}

    if recipe.recompute == "full":
        config["activation_checkpointing"] = {
            "partition_activations": layout.tp > 1,
            "contiguous_memory_optimization": False,
        }
        if recipe.recompute_early_stop:
            warnings.append(
                "recompute full with early stop: checkpoint each layer with torch.utils.checkpoint"
                "(use_reentrant=False) or model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                '{"use_reentrant": False}); deepspeed.checkpointing.checkpoint recomputes whole layers '
                "(the estimate without --recompute-early-stop)"
            )
        else:
            warnings.append(
                "recompute full: the model code must checkpoint each layer (deepspeed.checkpointing.checkpoint "
                "or model.gradient_checkpointing_enable()); the activation_checkpointing section configures it"
            )
    elif recipe.recompute == "selective":
        raise unsupported(
            TARGET,
            "recompute",
            "selective (attention-only) recompute",
            "plan with --recompute full or none, or export to torchtitan",
        )
    elif recipe.recompute == "sac":
        raise unsupported(
            TARGET,
            "recompute",
            "per-op selective checkpointing (torchtitan's selective_ac_option = 'op'; "
            "deepspeed.checkpointing recomputes whole layers)",
            "plan with --recompute full or none, or export to torchtitan",
        )

    opt = _OPTIMIZERS.get(recipe.optimizer)
    if opt is not None:
        config["optimizer"] = {"type": opt}
    else:
        warnings.append(
            f"optimizer {recipe.optimizer!r} has no DeepSpeed config name: pass it to deepspeed.initialize(optimizer=...)"
        )
    if recipe.is_peft or recipe.method in ("dpo", "ppo", "grpo"):
        warnings.append(
            f"method {recipe.method}: adapters/objective are set up in the training script (PEFT, TRL); "
            "this file carries the distributed settings only"
        )
    if recipe.attention == "eager":
        warnings.append("attention eager: choose the attention implementation when loading the model")
    return config, facts, tuple(warnings)


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    config, _facts, warnings = build_config(system, model, recipe, layout)
    return json.dumps(config, indent=2) + "\n", warnings
