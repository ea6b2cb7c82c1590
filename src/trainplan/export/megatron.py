"""A Megatron-LM launch: ``torchrun`` running ``pretrain_gpt.py`` with the plan as its arguments.

Every flag is one of Megatron-LM's own (``megatron/training/arguments.py`` at core_r0.14.0;
tests/test_export_megatron.py pins the set and parses the list back):

* model: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``,
  ``--group-query-attention --num-query-groups``, ``--kv-channels``, ``--normalization``,
  ``--swiglu``, ``--position-embedding-type``, ``--untie-embeddings-and-output-weights``,
  ``--disable-bias-linear`` / ``--add-qkv-bias``, ``--qk-layernorm``; multi-head latent attention:
  ``--multi-latent-attention``, ``--q-lora-rank``, ``--kv-lora-rank``, ``--qk-head-dim``,
  ``--qk-pos-emb-head-dim``, ``--v-head-dim``; mixture of experts:
  ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-grouped-gemm``,
  ``--moe-token-dispatcher-type alltoall``, ``--moe-shared-expert-intermediate-size``,
  ``--moe-layer-freq`` (a leading run of dense layers);
* parallelism: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--num-virtual-stages-per-pipeline-rank``, ``--context-parallel-size``,
  ``--expert-model-parallel-size``, ``--sequence-parallel``, ``--use-distributed-optimizer``
  (ZeRO-1), Megatron-FSDP ``--use-megatron-fsdp --data-parallel-sharding-strategy
  optim_grads`` / ``optim_grads_params`` (ZeRO-2 / ZeRO-3, with ``--no-gradient-accumulation-fusion``
  and ``--ckpt-format fsdp_dtensor`` as its documentation asks);
* overlap: ``--overlap-grad-reduce`` (and ``--overlap-param-gather`` with a sharded optimizer),
  ``--tp-comm-overlap``, ``--no-overlap-p2p-communication`` on an interleaved schedule without it,
  ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``;
* batch and length: ``--micro-batch-size``, ``--global-batch-size``, ``--seq-length``,
  ``--max-position-embeddings``, ``--train-iters`` and ``--lr-decay-iters`` from ``--tokens``;
* recipe: ``--bf16`` / ``--fp16``, ``--fp8-format hybrid``, ``--fp4-format e2m1``,
  ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`` (``block``
  and N under ``--recompute-layers N``) or
  ``--recompute-granularity selective`` (``--recompute-modules``), ``--mtp-num-layers``,
  ``--attention-backend flash`` / ``unfused``,
  ``--attention-dropout`` and ``--hidden-dropout`` (Megatron's default is 0.1: always written),
  ``--optimizer adam`` / ``sgd``, ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0``;
* data: ``--mock-data --tokenizer-type NullTokenizer --vocab-size`` (synthetic data, so the
  command runs as written; the warnings say what to put for real data).
"""

from __future__ import annotations

import math
from typing import Final

from trainplan.errors import TrainplanError
from trainplan.export._common import PlanFacts, check_loss, plan_facts, shell_command, unsupported
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe, fp8_options_set

TARGET: Final = "megatron"
VERSION: Final = "core_r0.14.0"
RDZV_PORT: Final = 29500


def train_steps(recipe: Recipe, global_batch: int) -> int | None:
    """Optimizer steps that train ``recipe.tokens``: ⌈tokens / (global batch · sequence length)⌉."""
    if recipe.tokens is None:
        return None
    return max(1, math.ceil(recipe.tokens / (global_batch * recipe.seq_len)))


_NO_ARGUMENT: Final = {
    "fp8_activation_store": "activation_func_fp8_input_store",
    "fp8_attention": "fp8_dot_product_attention",
}
"""Recipe switches whose Megatron-Core fields have no ``pretrain_gpt.py`` argument."""


def _check_recipe(recipe: Recipe, target: str = TARGET) -> None:
    if recipe.method not in ("pretrain", "full"):
        raise unsupported(
            target,
            "method",
            f"method {recipe.method!r} (pretrain_gpt.py trains every weight with a next-token loss)",
            "export a LoRA/QLoRA plan to deepspeed or accelerate, or plan --method full",
        )
    if recipe.recompute == "sac":
        raise unsupported(
            target,
            "recompute",
            "torchtitan's per-op selective checkpointing (its selective recompute is the attention core)",
            "plan with --recompute selective or full",
        )
    if recipe.recompute_every > 1:
        raise unsupported(
            target,
            "recompute_every",
            f"checkpointing one block in {recipe.recompute_every} (--recompute-method block recomputes the "
            "first N layers of each stage, uniform every layer)",
            "export to torchtitan (selective_ac_option), or plan with --recompute-every 1",
        )
    check_loss(recipe, target)
    for name, flag in fp8_options_set(recipe, tuple(_NO_ARGUMENT)):
        raise unsupported(
            target,
            name,
            f"{flag} (TransformerConfig.{_NO_ARGUMENT[name]} has no pretrain_gpt.py argument: "
            "megatron/training/arguments.py lists it among the fields without one)",
            f"set it in a YAML config by hand, or drop {flag}",
        )
    if recipe.recompute_early_stop and recipe.recompute == "full":
        raise unsupported(
            target,
            "recompute_early_stop",
            "early-stopping recompute (its CheckpointFunction re-runs the whole block)",
            "plan with --engine megatron (or --no-recompute-early-stop)",
        )
    for flag, on, what, option in (
        ("loss_chunks", recipe.loss_chunks != 1, "chunked cross-entropy", "--loss-chunks"),
        ("paged_optimizer", recipe.paged_optimizer, "bitsandbytes paged optimizers", "--paged-optimizer"),
        (
            "optimizer_in_backward",
            recipe.optimizer_in_backward,
            "an optimizer step inside the backward",
            "--optimizer-in-backward",
        ),
        (
            "master_weights",
            not recipe.master_weights,
            "16-bit training without FP32 master weights",
            "--no-master-weights",
        ),
    ):
        if on:
            raise unsupported(target, flag, what, f"plan without {option}")
    if recipe.offload == "optimizer+params":
        raise unsupported(
            target,
            "offload",
            "parameter offload (--optimizer-cpu-offload moves the optimizer only)",
            "plan with --offload optimizer or none",
        )


def _model_args(model: ModelSpec, recipe: Recipe, target: str = TARGET) -> list[str]:
    if model.parallel_attn_mlp or model.post_norms or model.qk_norm_full_width:
        raise unsupported(
            target,
            "model",
            f"{model.name}'s block (parallel attention/MLP, post-norms or full-width q/k norms are not "
            "options of pretrain_gpt.py's GPT model)",
            "export to torchtitan or deepspeed",
        )
    if model.activation not in ("swiglu", "gelu"):
        raise unsupported(target, "model", f"the {model.activation} MLP", "export to deepspeed or accelerate")
    if model.position not in ("rope", "learned", "none"):
        raise unsupported(target, "model", f"{model.position} positions", "export to deepspeed or accelerate")
    args = [
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden_size),
        "--num-attention-heads", str(model.num_heads),
        "--seq-length", str(recipe.seq_len),
        "--max-position-embeddings", str(max(recipe.seq_len, model.max_seq_len)),
        "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
        "--position-embedding-type",
        {"rope": "rope", "learned": "learned_absolute", "none": "none"}[model.position],
    ]  # fmt: skip
    if model.mla is None:  # MLA sizes its heads with --qk-head-dim and --v-head-dim
        args += ["--kv-channels", str(model.head_dim)]
    if model.ffn_hidden:
        args += ["--ffn-hidden-size", str(model.ffn_hidden)]
    if model.num_kv_heads != model.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    if model.attention_window:
        # TransformerConfig.window_size (left, right): a query sees itself and w - 1 keys before it
        args += ["--window-size", f"({model.attention_window - 1},0)"]
        if model.global_every:
            args += ["--window-attn-skip-freq", str(model.global_every)]
    mla = model.mla
    if mla is not None:
        # Megatron-LM megatron/training/arguments.py _add_mla_args: --qk-head-dim is d_n (the
        # query/key head is qk_head_dim + qk_pos_emb_head_dim); no --q-lora-rank: no compression
        # --qk-layernorm builds MLA's latent RMSNorms (q_layernorm, kv_layernorm: gpt_layer_specs.py
        # uses TELayerNormColumnParallelLinear for the up projections only with qk_layernorm)
        args += ["--multi-latent-attention", "--qk-layernorm"]
        if mla.q_lora_rank:
            args += ["--q-lora-rank", str(mla.q_lora_rank)]
        args += [
            "--kv-lora-rank", str(mla.kv_lora_rank),
            "--qk-head-dim", str(mla.qk_nope_head_dim),
            "--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim),
            "--v-head-dim", str(mla.v_head_dim),
        ]  # fmt: skip
    if model.activation == "swiglu":
        args.append("--swiglu")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not (model.attn_out_bias or model.mlp_bias):
        args.append("--disable-bias-linear")
        if model.qkv_bias:
            args.append("--add-qkv-bias")
    elif not model.qkv_bias:
        raise unsupported(
            target, "model", "biases on some linear layers but not on q/k/v", "export to deepspeed"
        )
    if model.qk_norm:
        args.append("--qk-layernorm")
    moe = model.moe
    if moe is not None:
        if moe.layer_freq != 1:
            raise unsupported(
                target, "model", "dense layers between the expert layers", "export to torchtitan or deepspeed"
            )
        if moe.first_dense_layers:
            # a leading run of dense layers as Megatron's pattern string (--moe-layer-freq help:
            # "([0]+[1]*23)": 1 dense layer followed by 23 expert layers)
            dense, sparse = moe.first_dense_layers, model.num_layers - moe.first_dense_layers
            args += ["--moe-layer-freq", f"([0]*{dense}+[1]*{sparse})"]
        args += [
            "--num-experts", str(moe.num_experts),
            "--moe-router-topk", str(moe.top_k),
            "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden),
            "--moe-grouped-gemm",
            "--moe-token-dispatcher-type", "alltoall",
        ]  # fmt: skip
        if recipe.moe_capacity_factor is not None:
            # Megatron-Core sizes the capacity per rank's tokens, not per sequence: the padded
            # slots differ from int(ceil(S·K/E)·cf) per sequence by rounding only
            args += [
                "--moe-expert-capacity-factor", f"{recipe.moe_capacity_factor:g}",
                "--moe-pad-expert-input-to-capacity",
            ]  # fmt: skip
        if moe.num_shared_experts:
            width = (moe.shared_expert_ffn_hidden or moe.expert_ffn_hidden) * moe.num_shared_experts
            args += ["--moe-shared-expert-intermediate-size", str(width)]
    return args


def _parallel_args(model: ModelSpec, layout: Layout, target: str = TARGET) -> list[str]:
    args = [
        "--tensor-model-parallel-size", str(layout.tp),
        "--pipeline-model-parallel-size", str(layout.pp),
        "--context-parallel-size", str(layout.cp),
    ]  # fmt: skip
    if layout.ep > 1:
        args += ["--expert-model-parallel-size", str(layout.ep)]
    if layout.expert_tp != layout.tp:  # parallel folding (the default expert TP is tp)
        args += ["--expert-tensor-parallel-size", str(layout.expert_tp)]
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.pp > 1 and layout.pp_schedule == "zb":
        raise unsupported(
            target, "pp_schedule", "a zero-bubble schedule", "plan with --pp-schedule 1f1b or interleaved"
        )
    # The embedding / the loss as a layer of the split (layout.stage_layers): Megatron-Core's
    # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split, which split
    # num_layers + 1 (+ 1) units evenly (transformer_block.py get_num_layers_to_build).
    units = model.num_layers + int(layout.pp_split_embedding) + int(layout.pp_split_head)
    if layout.pp_split_embedding:
        args.append("--account-for-embedding-in-pipeline-split")
    if layout.pp_split_head:
        args.append("--account-for-loss-in-pipeline-split")
    if (layout.pp_split_embedding or layout.pp_split_head) and units % layout.pp:
        raise unsupported(
            target,
            "pp_split_embedding",
            f"{units} layers with the embedding / head in the split on {layout.pp} stages (it asserts an "
            "even split)",
            "choose a --pp that divides them",
        )
    if layout.pp_schedule == "interleaved":
        if units % (layout.pp * layout.virtual_stages):
            raise unsupported(
                target,
                "virtual_stages",
                f"{layout.pp}·{layout.virtual_stages} chunks of unequal size ({units} layers"
                + (" with the embedding / head in the split" if units != model.num_layers else "")
                + ")",
                "choose a --virtual-stages that divides the layers per stage",
            )
        args += ["--num-virtual-stages-per-pipeline-rank", str(layout.virtual_stages)]
        if not layout.pp_comm_overlap:
            args.append("--no-overlap-p2p-communication")
    elif layout.pp_comm_overlap:
        raise unsupported(
            target,
            "pp_comm_overlap",
            "pipeline overlap without the interleaved schedule (arguments.py turns it off)",
            "plan with --pp-schedule interleaved, or --no-pp-comm-overlap",
        )
    if layout.ep_comm_overlap:
        # arguments.py _add_moe_args: batch-level overlap of the EP all-to-alls in the 1F1B stage
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if layout.zero == 1:
        args.append("--use-distributed-optimizer")
    elif layout.zero in (2, 3):
        strategy = "optim_grads" if layout.zero == 2 else "optim_grads_params"
        args += [
            "--use-distributed-optimizer",
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", strategy,
            "--ckpt-format", "fsdp_dtensor",
        ]  # fmt: skip
    if layout.zero3_granularity != "block":
        raise unsupported(
            target, "zero3_granularity", "per-parameter ZeRO-3 gathers", "plan with --zero3-granularity block"
        )
    if layout.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
        if layout.zero >= 1:
            args.append("--overlap-param-gather")
    if layout.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if layout.grad_accumulation == "main_grad":
        raise unsupported(
            target,
            "grad_accumulation",
            "the 2021 LocalDDP main-gradient hook",
            "plan with --grad-accumulation fused or autograd",
        )
    if layout.grad_accumulation == "autograd" or layout.zero in (2, 3):
        args.append("--no-gradient-accumulation-fusion")
    return args


def _recipe_args(recipe: Recipe, target: str = TARGET) -> list[str]:
    args: list[str] = []
    if recipe.precision == "bf16":
        args.append("--bf16")
    elif recipe.precision == "fp16":
        args.append("--fp16")
    elif recipe.precision == "fp8":
        args += ["--bf16", "--fp8-format", "hybrid"]
        if recipe.fp8_params:
            args.append("--fp8-param-gather")
    elif recipe.precision == "fp4":
        args += ["--bf16", "--fp4-format", "e2m1"]
    if recipe.recompute == "full":
        # block: the first N layers of each stage (Recipe.recompute_layers); uniform 1: every layer
        method, layers = ("block", recipe.recompute_layers) if recipe.recompute_layers else ("uniform", 1)
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            method,
            "--recompute-num-layers",
            str(layers),
        ]
    elif recipe.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if recipe.recompute_modules is not None:
            args += ["--recompute-modules", *recipe.recompute_modules]
    if recipe.mtp_layers:
        args += ["--mtp-num-layers", str(recipe.mtp_layers)]
    args += ["--attention-backend", "flash" if recipe.attention == "flash" else "unfused"]
    args += ["--attention-dropout", repr(recipe.dropout), "--hidden-dropout", repr(recipe.dropout)]
    optimizer = {"adamw": "adam", "sgd": "sgd", "sgd-momentum": "sgd"}.get(recipe.optimizer)
    if optimizer is None:
        raise unsupported(
            target,
            "optimizer",
            f"optimizer {recipe.optimizer!r} (its optimizers are Adam(W) and SGD)",
            "plan with --optimizer adamw",
        )
    args += ["--optimizer", optimizer]
    if recipe.optimizer == "sgd":
        args += ["--sgd-momentum", "0.0"]
    if recipe.offload == "optimizer":
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"]
    return args


def build_argv(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[list[str], PlanFacts, tuple[str, ...]]:
    """The launch's ``argv`` (``torchrun ... pretrain_gpt.py ARGS``), the plan facts and warnings."""
    facts = plan_facts(system, model, recipe, layout)
    _check_recipe(recipe)
    warnings: list[str] = [
        "synthetic data (--mock-data, NullTokenizer): give --data-path and --tokenizer-type/--tokenizer-model "
        "for real data",
    ]
    if model.position == "rope":
        warnings.append(f"--rotary-base is Megatron's default (10000): set {model.name}'s RoPE base")
    args = [
        *_model_args(model, recipe),
        *_parallel_args(model, layout),
        "--micro-batch-size", str(recipe.micro_batch),
        "--global-batch-size", str(facts.global_batch),
        *_recipe_args(recipe),
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size),
    ]  # fmt: skip
    steps = train_steps(recipe, facts.global_batch)
    if steps is None:
        warnings.append("no --tokens: --train-iters is left for you to set")
    else:
        args += ["--train-iters", str(steps), "--lr-decay-iters", str(steps)]
    launcher = ["torchrun", "--nnodes", str(facts.num_nodes), "--nproc-per-node", str(facts.nproc_per_node)]
    if facts.num_nodes > 1:
        launcher += [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"$MASTER_ADDR:{RDZV_PORT}",
            "--rdzv-id",
            "trainplan",
        ]
        warnings.append("multi-node: run the same command on every node with MASTER_ADDR set")
    else:
        launcher.append("--standalone")
    return [*launcher, "pretrain_gpt.py", *args], facts, tuple(warnings)


def megatron_args(argv: list[str]) -> list[str]:
    """The ``pretrain_gpt.py`` arguments of a launch ``argv`` (what Megatron-LM's parser reads)."""
    if "pretrain_gpt.py" not in argv:
        raise TrainplanError("to", "not a Megatron-LM launch")
    return argv[argv.index("pretrain_gpt.py") + 1 :]


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    argv, _, warnings = build_argv(system, model, recipe, layout)
    header = (
        f"# Megatron-LM {VERSION} (run from its repository root), written by trainplan\n"
        f"# {model.name}, {recipe.method}, {recipe.precision}, layout {layout.describe()}\n"
    )
    return header + shell_command(argv, lambda w: w.startswith("--") or w == "pretrain_gpt.py"), warnings
