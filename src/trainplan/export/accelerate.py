"""Hugging Face Accelerate launch configuration (YAML) for a plan.

Schema: Accelerate 1.15.0 (PyPI ``accelerate==1.15.0``). The file is read by
``accelerate/commands/config/config_args.py::ClusterConfig.from_yaml_file`` (unknown keys are an
error) and turned into the launch environment by ``accelerate/commands/launch.py::
_validate_launch_command`` and ``accelerate/utils/launch.py`` (``prepare_multi_gpu_env``,
``prepare_deepspeed_cmd_env``). The keys and where Accelerate reads them:

``compute_environment``, ``distributed_type``, ``mixed_precision``, ``num_processes``,
``num_machines``, ``machine_rank``, ``main_process_ip``, ``main_process_port``, ``rdzv_backend``,
``same_network``, ``use_cpu``, ``downcast_bf16``
    ``ClusterConfig`` / ``BaseConfig`` fields.
``fsdp_config``: ``fsdp_version``, ``fsdp_reshard_after_forward``, ``fsdp_offload_params``,
``fsdp_activation_checkpointing``, ``fsdp_auto_wrap_policy``, ``fsdp_state_dict_type``,
``fsdp_cpu_ram_efficient_loading``
    ``FSDP_*`` variables of ``prepare_multi_gpu_env``, read by
    ``accelerate/utils/dataclasses.py::FullyShardedDataParallelPlugin``.
``parallelism_config``: ``parallelism_config_dp_replicate_size``, ``_dp_shard_size``,
``_tp_size``, ``_cp_size``, ``_cp_backend``
    ``PARALLELISM_CONFIG_*`` variables of ``prepare_extend_env_parallelism_config``, read by
    ``accelerate/parallelism_config.py::ParallelismConfig`` (needs FSDP version 2).
``deepspeed_config``: ``zero_stage``, ``offload_optimizer_device``, ``offload_param_device``,
``gradient_accumulation_steps``, ``zero3_init_flag``
    ``ACCELERATE_DEEPSPEED_*`` variables of ``prepare_deepspeed_cmd_env`` /
    ``prepare_multi_gpu_env``, read by ``accelerate/utils/dataclasses.py::DeepSpeedPlugin``.
``fp8_config``: ``backend``
    ``accelerate/utils/dataclasses.py`` (``AORecipeKwargs`` for ``AO``).

Choice of backend: ZeRO 0 → ``MULTI_GPU`` (DDP) or ``NO`` on one device; ZeRO 2/3 → ``FSDP``
version 2 (``reshard_after_forward`` false/true); ZeRO 1 or offloading only the optimizer →
``DEEPSPEED`` (FSDP has neither). Batch sizes live in the training script (DataLoader and
``Accelerator(gradient_accumulation_steps=...)``) except under DeepSpeed, whose plugin carries
the gradient accumulation.
"""

from __future__ import annotations

from typing import Final

from trainplan.export._common import (
    FUSED_LOSS_WARNING,
    PlanFacts,
    check_megatron_options,
    plan_facts,
    unsupported,
)
from trainplan.export._text import to_yaml
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

VERSION: Final = "1.15.0"
TARGET: Final = f"Accelerate {VERSION} config"
MAIN_PROCESS_PORT: Final = 29500

_MIXED: Final = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}


def _backend(recipe: Recipe, layout: Layout) -> str:
    if layout.tp_comm_overlap:
        raise unsupported(
            TARGET,
            "tp_comm_overlap",
            "tensor-parallel communication overlap (its FSDP2 parallelism_config has no async TP)",
            "plan without --tp-comm-overlap, or export to torchtitan (async tensor parallelism)",
        )
    if layout.zero == 1 or recipe.offload == "optimizer":
        if layout.tp > 1 or layout.cp > 1:
            raise unsupported(
                TARGET,
                "zero" if layout.zero == 1 else "offload",
                "ZeRO-1 / optimizer-only offload (DeepSpeed plugin) together with tp or cp "
                "(FSDP2 parallelism_config)",
                "plan with --zero 2 or 3 and --offload none or optimizer+params",
            )
        return "DEEPSPEED"
    if layout.zero in (2, 3) or layout.tp > 1 or layout.cp > 1:
        return "FSDP"
    return "MULTI_GPU" if layout.num_devices > 1 else "NO"


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
            f"pipeline parallelism (pp={layout.pp})",
            "plan with --pp 1, or export to torchtitan",
        )
    if layout.ep > 1:
        raise unsupported(
            TARGET, "ep", f"expert parallelism (ep={layout.ep})", "plan with --ep 1, or export to torchtitan"
        )
    if recipe.precision == "fp4":
        raise unsupported(
            TARGET, "precision", "fp4 (mixed_precision is no, fp16, bf16 or fp8)", "plan with fp8 or bf16"
        )
    backend = _backend(recipe, layout)
    config: dict[str, object] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": backend,
        "mixed_precision": _MIXED[recipe.precision],
        "downcast_bf16": "no",
        "num_machines": facts.num_nodes,
        "num_processes": facts.num_devices,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static" if facts.num_nodes == 1 else "c10d",
        "same_network": True,
        "use_cpu": False,
    }
    if facts.num_nodes > 1:
        config["main_process_ip"] = "MASTER_ADDR"
        config["main_process_port"] = MAIN_PROCESS_PORT
        warnings.append(
            "multi-node: replace main_process_ip MASTER_ADDR with the first node's address and set "
            "machine_rank on each node"
        )
    if recipe.precision == "fp8":
        config["fp8_config"] = {"backend": "AO"}

    if backend == "FSDP":
        if layout.zero in (0, 1) and layout.dp > 1:
            raise unsupported(
                TARGET,
                "zero",
                f"ZeRO {layout.zero} data parallelism next to tp/cp (FSDP2 shards the data-parallel group)",
                "plan with --zero 2 or 3",
            )
        if recipe.offload == "optimizer+params" and layout.zero != 3:
            raise unsupported(TARGET, "offload", "parameter offload without ZeRO 3", "plan with --zero 3")
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": layout.zero == 3,
            "fsdp_offload_params": recipe.offload == "optimizer+params",
            "fsdp_activation_checkpointing": recipe.recompute == "full",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": False,
        }
        if layout.tp > 1 or layout.cp > 1:
            if layout.tp > 1 and layout.sequence_parallel:
                warnings.append(
                    "sequence_parallel: Accelerate's tp_size applies the model's own TP plan "
                    "(transformers tp_plan), which decides whether norms are sequence-sharded"
                )
            config["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": 1,
                "parallelism_config_dp_shard_size": layout.dp,
                "parallelism_config_tp_size": layout.tp,
                "parallelism_config_cp_size": layout.cp,
                "parallelism_config_cp_backend": "torch",
            }
    elif backend == "DEEPSPEED":
        if recipe.offload == "optimizer+params" and layout.zero != 3:
            raise unsupported(TARGET, "offload", "parameter offload without ZeRO 3", "plan with --zero 3")
        config["deepspeed_config"] = {
            "zero_stage": layout.zero,
            "offload_optimizer_device": "cpu" if recipe.offload != "none" else "none",
            "offload_param_device": "cpu" if recipe.offload == "optimizer+params" else "none",
            "gradient_accumulation_steps": facts.micro_batches,
            "zero3_init_flag": layout.zero == 3,
        }
    elif recipe.offload != "none":
        raise unsupported(TARGET, "offload", "CPU offload without sharding", "plan with --zero 3")

    if recipe.recompute == "selective":
        raise unsupported(
            TARGET,
            "recompute",
            "selective recompute (fsdp_activation_checkpointing checkpoints whole layers)",
            "plan with --recompute full or none, or export to torchtitan",
        )
    if recipe.recompute == "sac":
        raise unsupported(
            TARGET,
            "recompute",
            "per-op selective checkpointing (fsdp_activation_checkpointing and "
            "gradient_checkpointing_enable checkpoint whole layers)",
            "plan with --recompute full or none, or export to torchtitan",
        )
    if recipe.recompute == "full" and backend == "FSDP" and not recipe.recompute_early_stop:
        # accelerate/utils/fsdp_utils.py::fsdp2_apply_ac: checkpoint_wrapper(layer,
        # preserve_rng_state=False), PyTorch's non-reentrant checkpoint with its default early stop
        warnings.append(
            "recompute full: fsdp_activation_checkpointing uses PyTorch's non-reentrant checkpoint, "
            "which stops recomputing early (the MLP down projection is not redone); plan with "
            "--recompute-early-stop for the matching estimate"
        )
    if recipe.recompute == "full" and backend != "FSDP":
        reentrant = not recipe.recompute_early_stop
        warnings.append(
            "recompute full: call model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
            f'{{"use_reentrant": {reentrant}}}) in the training script ({backend} has no checkpointing '
            f"key; use_reentrant={reentrant} recomputes what the plan counts, and the default differs "
            "between transformers releases)"
        )
    if not recipe.master_weights:
        warnings.append(
            "pure 16-bit training: load the model in the 16-bit dtype in the training script "
            "(mixed_precision keeps FP32 parameters otherwise)"
        )
    accumulation = (
        "" if backend == "DEEPSPEED" else f", Accelerator(gradient_accumulation_steps={facts.micro_batches})"
    )
    warnings.append(
        f"batch: DataLoader batch_size={recipe.micro_batch} per process{accumulation} in the training "
        f"script (global batch {facts.global_batch} sequences of {recipe.seq_len} tokens)"
    )
    if recipe.is_peft or recipe.method in ("dpo", "ppo", "grpo"):
        warnings.append(
            f"method {recipe.method}: adapters/objective are set up in the training script (PEFT, TRL)"
        )
    return config, facts, tuple(warnings)


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    config, facts, warnings = build_config(system, model, recipe, layout)
    header = [
        f"Accelerate {VERSION} config written by trainplan",
        f"{model.name}, {recipe.method}, {recipe.precision}, layout {layout.describe()}",
        f"per-process micro batch {recipe.micro_batch}, {facts.micro_batches} micro-batch(es) per step, "
        f"global batch {facts.global_batch}",
        "accelerate launch --config_file THIS_FILE train.py",
    ]
    return to_yaml(config, header=header), warnings
