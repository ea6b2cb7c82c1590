"""A Megatron Bridge (NeMo 2's Megatron training library) recipe: a Python file that builds the
plan's ``ConfigContainer`` and runs ``pretrain`` when launched by ``torchrun``.

Schema: Megatron Bridge 0.3.1 (PyPI ``megatron-bridge==0.3.1``) with Megatron-Core 0.16.1, the
``core_v0.16.1`` commit its ``v0.3.1`` tag holds as ``3rdparty/Megatron-LM`` (its ``pyproject.toml``
allows ``megatron-core>=0.15.0a0,<0.17.0``). The recipe starts where Megatron Bridge's own recipes start,
``megatron/bridge/recipes/common.py::_pretrain_common`` (its Llama 2 recipe,
``recipes/llama/llama2.py``, then sets the model and overrides the sections), and sets:

``model``: ``GPTModelProvider(...)`` (``megatron/bridge/models/gpt_provider.py``; its fields are
    Megatron-Core's ``TransformerConfig`` and ``ModelParallelConfig``): the dimensions,
    ``normalization``, ``gated_linear_unit`` + ``activation_func`` (SwiGLU), ``position_embedding_type``,
    ``share_embeddings_and_output_weights``, ``add_bias_linear`` / ``add_qkv_bias``, ``qk_layernorm``;
    MoE ``num_moe_experts``, ``moe_router_topk``, ``moe_ffn_hidden_size``, ``moe_grouped_gemm``,
    ``moe_token_dispatcher_type``, ``moe_shared_expert_intermediate_size``; parallelism
    ``tensor/pipeline/context/expert_model_parallel_size``, ``virtual_pipeline_model_parallel_size``,
    ``sequence_parallel``, ``account_for_embedding/loss_in_pipeline_split``; recompute
    ``recompute_granularity`` / ``recompute_method`` / ``recompute_num_layers``; dropouts,
    ``attention_backend``, ``gradient_accumulation_fusion``, ``seq_length``.
``train`` (``TrainingConfig``): ``global_batch_size``, ``micro_batch_size``, ``train_iters`` from ``--tokens``.
``optimizer`` (``OptimizerConfig``): ``optimizer``, ``use_distributed_optimizer``, ``optimizer_cpu_offload``.
``scheduler`` (``SchedulerConfig``): ``lr_decay_iters`` = the step count (the schedule's length).
``ddp`` (``DistributedDataParallelConfig``): ``use_distributed_optimizer`` (ZeRO-1),
    ``use_megatron_fsdp`` + ``data_parallel_sharding_strategy`` ``optim_grads`` / ``optim_grads_params``
    (ZeRO-2 / ZeRO-3), ``overlap_grad_reduce``, ``overlap_param_gather``.
``checkpoint`` (``CheckpointConfig``): ``ckpt_format = "fsdp_dtensor"`` with Megatron-FSDP
    (``ConfigContainer.validate`` asserts it).
``dataset`` (``GPTDatasetConfig``): ``sequence_length``; ``tokenizer``: ``TokenizerConfig(NullTokenizer,
    vocab_size)`` with ``_pretrain_common``'s mock data, so the recipe runs as written.
``comm_overlap``: ``CommOverlapConfig(tp_comm_overlap, overlap_p2p_comm, overlap_grad_reduce,
    overlap_param_gather)`` (``megatron/bridge/training/comm_overlap.py``). The data-parallel overlaps
    are written here as well as in ``ddp``: ``runtime_config_update`` runs ``CommOverlapConfig.setup``,
    whose ``_get_optimizer_overlap_cfgs`` (lines 539-549) sets both on in ``ddp`` and ``optimizer``
    with DP > 1 and the distributed optimizer unless the ``CommOverlapConfig`` gives them (a plan with
    ``--no-overlap-grad-reduce`` would otherwise run overlapped).
``mixed_precision``: a recipe name of ``megatron/bridge/training/mixed_precision.py``: ``bf16_mixed``,
    ``fp16_mixed``, ``bf16_with_fp8_delayed_scaling_mixed`` (fp8; Megatron-LM's ``--fp8-format hybrid``
    delayed scaling, as the megatron target writes), ``bf16_with_nvfp4_mixed`` (fp4).

Every key is checked against the field lists of those classes copied into the package
(``trainplan/data/megatron_bridge_schema.json``, ``dataclasses.fields`` of the 0.3.1 wheel), and
the recipe itself refuses a key that is not a field when it runs. What Megatron-Core cannot express
is refused by the same rules as the Megatron-LM target (:mod:`trainplan.export.megatron`).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Final

from trainplan.data_files import data_text
from trainplan.export import megatron
from trainplan.export._common import PlanFacts, plan_facts, unsupported
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe, fp8_options_set

TARGET: Final = "nemo"
VERSION: Final = "0.3.1"
MCORE_VERSION: Final = "0.16.1"

SECTION_CLASSES: Final = {
    "model": "GPTModelProvider",
    "train": "TrainingConfig",
    "optimizer": "OptimizerConfig",
    "scheduler": "SchedulerConfig",
    "ddp": "DistributedDataParallelConfig",
    "checkpoint": "CheckpointConfig",
    "dataset": "GPTDatasetConfig",
    "tokenizer": "TokenizerConfig",
    "comm_overlap": "CommOverlapConfig",
}
"""The ``ConfigContainer`` section each table sets and the dataclass it is."""
CONSTRUCTED: Final = ("model", "tokenizer", "comm_overlap")
"""Sections the recipe builds from its table (the others are ``_pretrain_common``'s, updated)."""

_MIXED_PRECISION: Final = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8": "bf16_with_fp8_delayed_scaling_mixed",
    "fp4": "bf16_with_nvfp4_mixed",
}


class Code:
    """A value written as Python source (a function or an enum member), not as a literal."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __repr__(self) -> str:
        return self.source

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Code) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)


@cache
def schema() -> dict[str, Any]:
    """The copied field lists (``classes``), mixed-precision recipe names and their source."""
    text = data_text("trainplan", "data", "megatron_bridge_schema.json")
    data: dict[str, Any] = json.loads(text)
    return data


Sections = dict[str, dict[str, object]]


def _model(model: ModelSpec, recipe: Recipe, layout: Layout) -> dict[str, object]:
    out: dict[str, object] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_heads,
        "num_query_groups": model.num_kv_heads,
        "kv_channels": model.head_dim,
        "vocab_size": model.vocab_size,
        "seq_length": recipe.seq_len,
        "normalization": "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        "gated_linear_unit": model.activation == "swiglu",
        "activation_func": Code("F.silu" if model.activation == "swiglu" else "F.gelu"),
        "position_embedding_type": {"rope": "rope", "learned": "learned_absolute", "none": "none"}[
            model.position
        ],
        "share_embeddings_and_output_weights": model.tied_embeddings,
        "add_bias_linear": model.attn_out_bias or model.mlp_bias,
        "add_qkv_bias": model.qkv_bias,
        "qk_layernorm": model.qk_norm,
        "attention_dropout": recipe.dropout,
        "hidden_dropout": recipe.dropout,
        "attention_backend": Code(
            "AttnBackend.flash" if recipe.attention == "flash" else "AttnBackend.unfused"
        ),
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.virtual_stages
        if layout.pp_schedule == "interleaved"
        else None,
        "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep,
        **({"expert_tensor_parallel_size": layout.expert_tp} if layout.expert_tp != layout.tp else {}),
        "sequence_parallel": layout.sequence_parallel,
        "account_for_embedding_in_pipeline_split": layout.pp_split_embedding,
        "account_for_loss_in_pipeline_split": layout.pp_split_head,
        "gradient_accumulation_fusion": layout.grad_accumulation == "fused" and layout.zero < 2,
        "recompute_granularity": None if recipe.recompute == "none" else recipe.recompute,
    }
    if model.ffn_hidden:
        out["ffn_hidden_size"] = model.ffn_hidden
    if model.attention_window:
        # TransformerConfig.window_size (left, right): a query sees itself and w - 1 keys before it
        out["window_size"] = (model.attention_window - 1, 0)
        if model.global_every:
            out["window_attn_skip_freq"] = model.global_every
    if recipe.recompute_modules is not None:
        out["recompute_modules"] = list(recipe.recompute_modules)
    if layout.ep_comm_overlap:
        out["overlap_moe_expert_parallel_comm"] = True
        out["delay_wgrad_compute"] = True
    if recipe.recompute == "full":
        out["recompute_method"] = "block" if recipe.recompute_layers else "uniform"
        out["recompute_num_layers"] = recipe.recompute_layers or 1
    moe = model.moe
    if moe is not None:
        out["num_moe_experts"] = moe.num_experts
        out["moe_router_topk"] = moe.top_k
        out["moe_ffn_hidden_size"] = moe.expert_ffn_hidden
        out["moe_grouped_gemm"] = True
        out["moe_token_dispatcher_type"] = "alltoall"
        if recipe.moe_capacity_factor is not None:
            out["moe_expert_capacity_factor"] = recipe.moe_capacity_factor
            out["moe_pad_expert_input_to_capacity"] = True
        if moe.num_shared_experts:
            width = (moe.shared_expert_ffn_hidden or moe.expert_ffn_hidden) * moe.num_shared_experts
            out["moe_shared_expert_intermediate_size"] = width
    return out


def build_recipe(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[Sections, str, PlanFacts, tuple[str, ...]]:
    """The sections (``ConfigContainer`` field → its settings), the mixed-precision recipe name,
    the plan facts and warnings."""
    facts = plan_facts(system, model, recipe, layout)
    if recipe.method not in ("pretrain", "full"):
        raise unsupported(
            TARGET,
            "method",
            f"method {recipe.method!r} (this target writes a pre-training recipe that trains every weight; "
            "Megatron Bridge's LoRA recipes start from a converted checkpoint)",
            "export a LoRA/QLoRA plan to deepspeed or accelerate, or plan --method full",
        )
    for name, flag in fp8_options_set(recipe):
        raise unsupported(
            TARGET,
            name,
            f"{flag} (this target names one of Megatron Bridge's mixed-precision recipes, whose "
            "MixedPrecisionConfig sets the FP8 fields of the model)",
            f"export to megatron{' (--fp8-param-gather)' if name == 'fp8_params' else ''}, or drop {flag}",
        )
    # The rules Megatron-Core imposes, shared with the Megatron-LM target.
    megatron._check_recipe(recipe, TARGET)
    megatron._model_args(model, recipe, TARGET)
    if model.mla is not None:
        raise unsupported(
            TARGET,
            "model",
            f"{model.name}'s multi-head latent attention (this target writes a GPTModelProvider; MLA needs "
            "Megatron Bridge's MLA model providers)",
            "export to megatron (--multi-latent-attention)",
        )
    if model.moe is not None and model.moe.first_dense_layers:
        raise unsupported(
            TARGET,
            "model",
            f"{model.name}'s leading dense layers (the written provider has no moe_layer_freq pattern)",
            "export to megatron (--moe-layer-freq)",
        )
    megatron._parallel_args(model, layout, TARGET)
    megatron._recipe_args(recipe, TARGET)
    if recipe.precision not in _MIXED_PRECISION:
        raise unsupported(
            TARGET,
            "precision",
            f"precision {recipe.precision} (its mixed-precision recipes train in bf16 or fp16)",
            "plan with --precision bf16",
        )
    warnings: list[str] = [
        "mock data and NullTokenizer (_pretrain_common): set cfg.dataset.blend and cfg.tokenizer for real data",
    ]
    if model.position == "rope":
        warnings.append(f"rotary_base is GPTModelProvider's default (10000): set {model.name}'s RoPE base")
    sharded = layout.zero in (2, 3)
    steps = megatron.train_steps(recipe, facts.global_batch)
    train: dict[str, object] = {
        "global_batch_size": facts.global_batch,
        "micro_batch_size": recipe.micro_batch,
    }
    scheduler: dict[str, object] = {}
    if steps is None:
        warnings.append("no --tokens: train.train_iters keeps _pretrain_common's 300000")
    else:
        train["train_iters"] = steps
        scheduler["lr_decay_iters"] = steps
    dp_overlap = {
        "overlap_grad_reduce": layout.overlap_grad_reduce,
        "overlap_param_gather": layout.overlap_grad_reduce and layout.zero >= 1,
    }
    sections: Sections = {
        "model": _model(model, recipe, layout),
        "train": train,
        "optimizer": {
            "optimizer": {"adamw": "adam", "sgd": "sgd", "sgd-momentum": "sgd"}[recipe.optimizer],
            "use_distributed_optimizer": layout.zero >= 1,
            "optimizer_cpu_offload": recipe.offload == "optimizer",
        },
        "scheduler": scheduler,
        "ddp": {
            "use_distributed_optimizer": layout.zero >= 1,
            "use_megatron_fsdp": sharded,
            "data_parallel_sharding_strategy": {2: "optim_grads", 3: "optim_grads_params"}.get(
                layout.zero, "no_shard"
            ),
            **dp_overlap,
        },
        "dataset": {"sequence_length": recipe.seq_len},
        "tokenizer": {"tokenizer_type": "NullTokenizer", "vocab_size": model.vocab_size},
        "comm_overlap": {
            "tp_comm_overlap": layout.tp_comm_overlap,
            "overlap_p2p_comm": layout.pp_schedule == "interleaved" and layout.pp_comm_overlap,
            # CommOverlapConfig.setup overrides the ddp section's overlaps unless these are given
            **dp_overlap,
        },
    }
    if recipe.optimizer == "sgd":
        sections["optimizer"]["sgd_momentum"] = 0.0
    if recipe.offload == "optimizer":
        sections["optimizer"]["optimizer_offload_fraction"] = 1.0
    if sharded:
        sections["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
    return sections, _MIXED_PRECISION[recipe.precision], facts, tuple(warnings)


def _py(value: object) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _table(values: dict[str, object], indent: str) -> str:
    return "".join(f"{indent}{json.dumps(k)}: {_py(v)},\n" for k, v in values.items())


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    sections, mixed_precision, facts, warnings = build_recipe(system, model, recipe, layout)
    launch = f"torchrun --nnodes {facts.num_nodes} --nproc-per-node {facts.nproc_per_node}"
    if facts.num_nodes > 1:
        launch += " --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 --rdzv-id trainplan"
        warnings = (*warnings, "multi-node: run the same command on every node with MASTER_ADDR set")
    tables = "".join(
        f"    {json.dumps(name)}: {{\n{_table(values, '        ')}    }},\n"
        for name, values in sections.items()
    )
    text = (
        f"# Megatron Bridge {VERSION} (Megatron-Core {MCORE_VERSION}) recipe written by trainplan\n"
        f"# {model.name}, {recipe.method}, {recipe.precision}, layout {layout.describe()}\n"
        f"# launch: {launch} THIS_FILE [Hydra-style overrides, e.g. train.train_iters=100]\n"
        '"""The plan as a Megatron Bridge ConfigContainer: _pretrain_common() with PLAN\'s sections set."""\n\n'
        "import dataclasses\n"
        "import sys\n\n"
        "import torch.nn.functional as F\n"
        "from megatron.bridge.models.gpt_provider import GPTModelProvider\n"
        "from megatron.bridge.recipes.common import _pretrain_common\n"
        "from megatron.bridge.training.comm_overlap import CommOverlapConfig\n"
        "from megatron.bridge.training.config import ConfigContainer\n"
        "from megatron.bridge.training.tokenizers.config import TokenizerConfig\n"
        "from megatron.core.transformer.enums import AttnBackend\n\n"
        f"MIXED_PRECISION = {_py(mixed_precision)}\n"
        f"PLAN = {{\n{tables}}}\n\n\n"
        "def trainplan_pretrain_config() -> ConfigContainer:\n"
        '    """_pretrain_common() with the model, tokenizer and overlap built from PLAN and its other\n'
        '    sections updated; a key that is not a field of its section is an error."""\n'
        "    cfg = _pretrain_common()\n"
        '    cfg.model = GPTModelProvider(**PLAN["model"])\n'
        '    cfg.tokenizer = TokenizerConfig(**PLAN["tokenizer"])\n'
        '    cfg.comm_overlap = CommOverlapConfig(**PLAN["comm_overlap"])\n'
        "    cfg.mixed_precision = MIXED_PRECISION\n"
        "    for section, values in PLAN.items():\n"
        f"        if section in {CONSTRUCTED!r}:\n"
        "            continue\n"
        "        target = getattr(cfg, section)\n"
        "        known = {f.name for f in dataclasses.fields(target)}\n"
        "        for key, value in values.items():\n"
        "            if key not in known:\n"
        '                raise KeyError(f"{section}.{key} is not a field of {type(target).__name__}")\n'
        "            setattr(target, key, value)\n"
        "    return cfg\n\n\n"
        'if __name__ == "__main__":\n'
        "    from megatron.bridge.training.gpt_step import forward_step\n"
        "    from megatron.bridge.training.pretrain import pretrain\n"
        "    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides\n\n"
        "    config = process_config_with_overrides(trainplan_pretrain_config(), cli_overrides=sys.argv[1:] or None)\n"
        "    pretrain(config=config, forward_step_func=forward_step)\n"
    )
    return text, warnings
