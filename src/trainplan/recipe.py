"""The training recipe: what is trained, in which number format, with which optimizer and batch.

Precision conventions (what each ``precision`` keeps in which dtype)::

    precision  weights (compute copy)  gradients  master weights  optimizer states  GEMM peak used
    fp32       fp32                    fp32       none            fp32              tf32 if the device has it, else fp32
    bf16       bf16                    bf16       fp32            fp32              bf16
    fp16       fp16                    fp16       fp32            fp32              fp16
    fp8        bf16                    bf16       fp32            fp32              fp8  (GEMMs only; FP8 casts are transient)
    fp4        bf16                    bf16       fp32            fp32              fp4  (GEMMs only; FP4 casts are transient)

``bf16``/``fp16`` are mixed precision as in Micikevicius et al. 2018 (Sec. 3) and ZeRO
(Rajbhandari et al. 2020, Sec. 3.1): 2-byte weights and gradients, FP32 master weights and
FP32 Adam moments, i.e. 2 + 2 + 12 = 16 bytes per trained parameter. ``fp8``/``fp4`` follow
the same model-state layout (Transformer Engine / torchao float8 keep BF16 weights and an
FP32 optimizer; only GEMM inputs are cast), so they save time, not model-state memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Literal, get_args

from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.errors import RecipeError

if TYPE_CHECKING:
    from trainplan.models.spec import ModelSpec
from trainplan.limits import (
    MAX_SEQ_LEN,
    MAX_SEQUENCES,
    MAX_TOKENS,
    MAX_WIDTH,
    MIN_TOKENS,
    check_int,
    check_real,
)

Method = Literal["pretrain", "full", "lora", "qlora", "dpo", "ppo", "grpo", "rm"]
"""``dpo``, ``ppo``, ``grpo`` and ``rm`` (reward-model training) are modelled by :mod:`trainplan.rlhf`."""
Precision = Literal["fp32", "bf16", "fp16", "fp8", "fp4"]
Optimizer = Literal["adamw", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]
Recompute = Literal["none", "selective", "full", "sac"]
Attention = Literal["flash", "eager"]
Offload = Literal["none", "optimizer", "optimizer+params"]
# The training software, which sets the calibrated compute factor κ (``timing.calibrated_kappa``):
# "megatron" — Megatron-LM / Megatron-Core and what runs on it (NeMo, Megatron Bridge), with
# Transformer Engine's fused kernels; "pytorch" — stacks built on PyTorch's own modules and
# FSDP (torchtitan, torchtune, llm-foundry / Composer, Accelerate, plain FSDP2 / DDP);
# "deepspeed" — DeepSpeed ZeRO engines on Hugging Face transformers modules (OpenRLHF,
# DeepSpeed-Chat, TRL / Accelerate with DeepSpeed), κ fitted on the RL rows named in
# validate/calibrate.py (RLHF_CALIBRATION_SETS).
# "maxtext" — JAX programs compiled by XLA (MaxText, the TPU reference stack; XLA fuses and
# schedules the whole step); "neuron" — the AWS Neuron SDK on Trainium (NeuronX Distributed
# Training, NeMo-Megatron for Neuron: PyTorch/XLA lowered by the Neuron compiler). Each has its
# own κ fitted on its family's runs (``hardware/data/calibration.toml``).
Stack = Literal["megatron", "pytorch", "deepspeed", "maxtext", "neuron"]
# How an MoE layer moves tokens to its experts (``Recipe.moe_dispatch``).
MoEDispatch = Literal["gather", "einsum"]

# RLHF / preference training (trainplan.rlhf): how the actor is trained, where its reference comes
# from, and how the models share the devices.
RLHFActor = Literal["full", "lora", "qlora"]
RLHFReference = Literal["model", "precomputed", "none", "lora-base"]
RLHFPlacement = Literal["colocated", "offload-between-phases", "disaggregated"]
RolloutEngine = Literal["vllm", "hybrid", "trainer"]
RLHF_METHODS: Final = ("ppo", "grpo", "dpo", "rm")
RLHF_ENGINES: Final = get_args(RolloutEngine)
RLHF_ACTORS: Final = get_args(RLHFActor)
RLHF_REFERENCES: Final = get_args(RLHFReference)
RLHF_PLACEMENTS: Final = get_args(RLHFPlacement)

METHODS: Final = get_args(Method)
PRECISIONS: Final = get_args(Precision)
OPTIMIZERS: Final = get_args(Optimizer)
RECOMPUTES: Final = get_args(Recompute)
ATTENTIONS: Final = get_args(Attention)
OFFLOADS: Final = get_args(Offload)
STACKS: Final = get_args(Stack)
MOE_DISPATCHES: Final = get_args(MoEDispatch)
MAX_CAPACITY_FACTOR: Final = 64.0
MAX_MTP_LAYERS: Final = 8
"""Largest accepted ``mtp_layers`` (DeepSeek-V3 trains with 1; the paper's ablations use 1-2)."""
RECOMPUTE_MODULES: Final = ("core_attn", "mla_up_proj", "mlp", "moe_act")
"""The Megatron-Core ``recompute_modules`` that are modelled (:attr:`Recipe.recompute_modules`)."""
UNMODELLED_RECOMPUTE_MODULES: Final = ("layernorm", "moe", "shared_experts")
"""Largest accepted ``moe_capacity_factor``: at cf ≥ E/K every expert already has a slot for every
token of the sequence, so larger factors only pad more."""

LORA_TARGETS: Final = ("q", "k", "v", "o", "gate", "up", "down")
PAGED_OPTIMIZERS: Final = (
    "adamw",
    "adamw-8bit",
    "lion",
)  # bitsandbytes PagedAdamW, PagedAdamW8bit, PagedLion

# Dtype in which each precision keeps the compute copy of the weights and the gradients.
WEIGHT_DTYPE: Final[dict[str, str]] = {
    "fp32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "bf16",
    "fp4": "bf16",
}
# Dtype of the GEMM peak each precision runs at (fp32 uses TF32 tensor cores where present).
GEMM_DTYPE: Final[dict[str, str]] = {
    "fp32": "tf32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "fp4": "fp4",
}


def reruns_forward_hooks(recompute: str) -> bool:
    """Whether a recompute mode re-runs the modules' forward (and so their hooks): full recompute,
    and per-op selective checkpointing (``sac``), whose cached matmuls skip the arithmetic but not
    the modules' forward. Per-parameter ZeRO-3 gathers run again; ZeRO-Infinity streams the
    weights in a third time."""
    return recompute in ("full", "sac")


def recomputes_position(position: int, every: int = 1, first: int = 0) -> bool:
    """Whether layer-selective checkpointing recomputes the block at 0-based ``position`` of its
    pipeline stage: the first ``first`` blocks (``first`` > 0: Megatron-LM's block method), else
    every ``every``-th one (positions n−1, 2n−1, …: torchtitan's ``_apply_layer_sac``)."""
    if first:
        return position < first
    return (position + 1) % every == 0


def recomputes_block(recipe: Recipe, position: int) -> bool:
    """Whether the block at 0-based ``position`` among its pipeline stage's blocks is recomputed:
    every block under ``recompute`` other than "none"; under layer-selective checkpointing
    (:attr:`Recipe.layer_selective`) the blocks :func:`recomputes_position` names: every
    ``recompute_every``-th one (torchtitan ``_apply_layer_sac`` wraps the block when its 1-based
    count is a multiple of n), or the first ``recompute_layers`` (Megatron-LM
    ``--recompute-method block``)."""
    return recipe.recompute != "none" and recomputes_position(
        position, recipe.recompute_every, recipe.recompute_layers
    )


def block_recipe(recipe: Recipe, position: int) -> Recipe:
    """The recipe one block runs under: ``recipe`` itself, or — a block that layer-selective
    checkpointing leaves out (:func:`recomputes_block`) — the recipe without recompute."""
    if not recipe.layer_selective or recomputes_block(recipe, position):
        return recipe
    return without_recompute(recipe)


@functools.lru_cache(maxsize=256)
def without_recompute(recipe: Recipe) -> Recipe:
    """``recipe`` with ``recompute="none"``: a block layer-selective checkpointing leaves out, and
    what a recomputed block holds while it reruns."""
    return replace(recipe, recompute="none", recompute_every=1, recompute_layers=0, recompute_modules=None)


def repeats_attention(recompute: str) -> bool:
    """Whether a recompute mode runs the attention forward again (full, and selective: the
    attention core), so a context-parallel ring repeats its K/V exchange."""
    return recompute in ("full", "selective")


def fp32_main_grad(weight_dtype: str) -> bool:
    """Megatron-LM's main-gradient buffer is FP32 for BF16 weights (``megatron/arguments.py``
    forces FP32 accumulation for BF16) and for FP32 training; else it has the weight dtype."""
    return weight_dtype in ("bf16", "fp32")


def _check_choice(field_name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise RecipeError(field_name, f"unknown value {value!r}; choose one of {', '.join(choices)}")


@dataclass(frozen=True, kw_only=True)
class LoRASpec:
    """Low-rank adapters (Hu et al. 2021): W + (alpha/r)·B·A on each targeted linear layer.

    QLoRA (Dettmers et al. 2023, Sec. 2-3): the frozen base is stored in 4-bit NF4 with one
    absmax constant per ``quant_block`` weights; double quantization stores those constants in
    8 bits with one FP32 constant per ``double_quant_block`` of them.
    """

    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = LORA_TARGETS
    quant_block: int = 64
    double_quant: bool = True
    double_quant_block: int = 256

    def __post_init__(self) -> None:
        check_int("lora_rank", self.rank, high=MAX_WIDTH, error=RecipeError)
        check_real("lora_alpha", self.alpha, low=0.0, high=float(MAX_WIDTH), error=RecipeError)
        if isinstance(self.targets, str) or not isinstance(self.targets, tuple | list):
            raise RecipeError("lora_targets", f"must be a tuple of module names, got {self.targets!r}")
        object.__setattr__(self, "targets", tuple(self.targets))
        if not isinstance(self.double_quant, bool):
            raise RecipeError("double_quant", f"must be true or false, got {self.double_quant!r}")
        if not self.targets:
            raise RecipeError("lora_targets", "name at least one module: " + ", ".join(LORA_TARGETS))
        for t in self.targets:
            _check_choice("lora_targets", t, LORA_TARGETS)
        check_int("quant_block", self.quant_block, high=MAX_WIDTH, error=RecipeError)
        check_int("double_quant_block", self.double_quant_block, high=MAX_WIDTH, error=RecipeError)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How the model is trained. ``global_batch`` and ``micro_batch`` count sequences."""

    method: Method = "pretrain"
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int | None = None  # None = dp × micro_batch (no gradient accumulation)
    tokens: float | None = None  # tokens to train for, for time-to-train and cost
    recompute: Recompute = "none"
    """Activation recomputation of the transformer blocks (``RECOMPUTES``).

    ``"none"``: every tensor autograd saves is kept. ``"selective"``: the attention core (the s²
    score tensors) is recomputed, the rest kept (Korthikanti et al. 2022, Sec. 5; with flash
    attention nothing is left to drop). ``"full"``: each block keeps only its input and is run
    again in the backward (how much of it: ``recompute_early_stop``). ``"sac"``: torchtitan's
    per-op selective checkpointing (``[activation_checkpoint] mode = "selective"``,
    ``selective_ac_option = "op"``, its default): each block keeps its input, the outputs of every
    other bias-free linear layer (odd-numbered ``aten.mm`` calls of the block: q, v, gate and down
    of a Llama block) and of the SDPA kernel (output and log-sum-exp), and recomputes the rest in
    the backward — the even-numbered matmuls (k, o, up), every biased linear (``aten.addmm``),
    norms, rotary, activation and residual adds, not the attention core. Sources and the rule:
    :mod:`trainplan.sac`. Modelled for dense blocks with flash attention, 16/32-bit GEMMs, no
    adapters, no dropout, without tensor or context parallelism; other combinations are errors."""
    attention: Attention = "flash"
    offload: Offload = "none"
    lora: LoRASpec | None = None
    dropout: float = (
        0.0  # hidden/attention dropout probability; > 0 stores 1-byte masks (Korthikanti 2022 Sec. 4.1)
    )
    master_weights: bool = (
        True  # False = "pure" 16-bit training: no FP32 master, optimizer states in the weight dtype
    )
    loss_chunks: int = 1
    """Chunked cross-entropy: the LM-head output and the loss are computed in this many sequence
    chunks, each upcast to FP32 separately (torchtune ``CEWithChunkedOutputLoss``, default 8
    chunks, with ``compute_cross_entropy`` compiled). 1 = one cross-entropy over all tokens."""
    optimizer_in_backward: bool = False
    """The optimizer step of each parameter runs inside the backward pass as soon as its gradient
    is ready, and the gradient is freed (torchtune ``optimizer_in_bwd``, via
    ``register_post_accumulate_grad_hook``): at most one parameter's gradient is alive."""
    recompute_early_stop: bool = False
    """How ``recompute="full"`` (or ``"sac"``) re-runs a checkpointed block in the backward.

    ``False``: the whole block forward is run again. Megatron-LM's ``CheckpointFunction``
    (``megatron/core/tensor_parallel/random.py``: ``backward`` calls
    ``ctx.run_function(*detached_inputs)``, a reentrant checkpoint), Transformer Engine's
    ``checkpoint`` (reentrant by default; its non-reentrant path recomputes everything too),
    DeepSpeed's ``deepspeed.checkpointing.checkpoint`` (``CheckpointFunction``), and
    ``torch.utils.checkpoint`` with ``use_reentrant=True`` or with early stop turned off, as
    torchtitan 0.2 does by default (``[activation_checkpoint] early_stop = false``).

    ``True``: PyTorch's non-reentrant ``torch.utils.checkpoint`` with early stop, its default
    (``early_stop=True``; ``torch.utils.checkpoint.set_checkpoint_early_stop``). The
    recomputation counts the tensors it saves again and raises ``_StopRecomputationError`` once
    it has re-saved as many as the forward saved, so the trailing ops of the block whose outputs
    nothing saved are not re-run: for a dense block the MLP down projection's GEMM, whose input
    is saved before the matmul runs, and the residual add (:func:`trainplan.flops.early_stop_skip`).
    This is what ``checkpoint_wrapper`` (``CheckpointImpl.NO_REENTRANT``) does under PyTorch FSDP /
    FSDP2, torchtune's ``set_activation_checkpointing``, Accelerate's
    ``fsdp_activation_checkpointing`` and torchtitan before 0.2.

    Under ``recompute="sac"`` it is the same engine setting (torchtitan 0.2 passes its
    ``early_stop`` to the per-op checkpoint too): the recomputation stops at the block's last
    saved tensor, which skips the down projection's GEMM only when that projection is recomputed
    (biased, or an even-numbered matmul) and always the last residual add.

    Accepted with every ``recompute`` value (it describes the checkpointing engine, which a plan
    keeps while it varies ``recompute``). It changes the full-recompute hardware FLOPs and
    memory-bound bytes, hence step time and HFU, never model FLOPs (MFU)."""
    recompute_every: int = 1
    """With ``recompute="full"``: checkpoint only every n-th block of each pipeline stage, the
    others keeping every activation — torchtitan's layer-selective activation checkpointing
    (``[activation_checkpoint] mode = "selective"``, ``selective_ac_option = "n"``;
    torchtitan/distributed/activation_checkpoint.py ``_apply_layer_sac``: a counter over the
    blocks wrapped in the process, the block wrapped when ``count % n == 0``, so the n-th,
    2n-th, … blocks of a stage, 1-based). 1 = every block (plain full recompute). See
    :func:`recomputes_block`."""
    recompute_layers: int = 0
    """With ``recompute="full"``: recompute only the first N blocks of each pipeline stage, the
    others keeping every activation — Megatron-LM's ``--recompute-granularity full
    --recompute-method block --recompute-num-layers N`` (megatron/core/transformer/
    transformer_block.py ``_checkpointed_forward``: under the block method, layer l of a chunk is
    checkpointed when ``l < recompute_num_layers``; NeMo ``recompute_method: block``,
    ``recompute_num_layers``). 0 = every block (Megatron's uniform method with one layer per
    group, plain full recompute). The megatron stack only; see :func:`recomputes_block`."""
    torch_compile: bool = False
    """The model runs under ``torch.compile`` (inductor), which fuses each chain of elementwise
    kernels into one: the memory-bound ops cost the fused kernels' traffic. Without it, on the
    pytorch stack, RMSNorm, rotary embeddings and gated activations run as PyTorch's eager chains
    of kernels (:func:`trainplan.flops.eager_kernels`). torchtitan ``[compile] enable`` (default
    false, torchtitan/config/job_config.py), torchtune ``compile`` (default False), Hugging Face
    ``TrainingArguments.torch_compile`` (default False). Only the pytorch stack: the other stacks
    fuse their own kernels (the flag would change nothing and is refused)."""
    kbit_fp32_upcast: bool = False
    """QLoRA prepared by PEFT's ``prepare_model_for_kbit_training`` (the Hugging Face k-bit path):
    every parameter that is not 4-bit (embedding, LM head, norms) is cast to FP32
    (huggingface/peft v0.14.0 src/peft/utils/other.py lines 135-140: ``param.data =
    param.data.to(torch.float32)`` for each 16-bit parameter that is not ``Params4bit``). Two
    memory terms follow: those parameters take 4 bytes each, and the residual stream is FP32 —
    the embedding output is FP32, each RMSNorm returns ``weight * x.to(input_dtype)`` with an
    FP32 weight, the bitsandbytes 4-bit linears return ``out.to(inp_dtype)`` in their input's
    dtype, and the residual adds promote to FP32 — so every block input and norm output a block
    saves (and the block input a checkpoint keeps) is 4 bytes per element
    (:func:`trainplan.memory.residual_bytes_per_element`), and so are the gated MLP's saved
    intermediates, the 4-bit gate and up projections returning FP32. The q, k and v inputs of
    FlashAttention-2 are cast back to 16 bits by transformers (``_flash_attention_forward``).
    QLoRA only."""
    softmax_fp32: bool = False
    """Eager attention as Hugging Face transformers writes it (``eager_attention_forward`` in
    ``src/transformers/models/llama/modeling_llama.py``: ``softmax(attn_weights, dim=-1,
    dtype=torch.float32).to(query.dtype)``): the softmax runs in FP32 and saves its FP32 output,
    and the 16-bit copy is saved again by the product with V — (4 + e) bytes per score instead
    of e. ``attention="eager"`` only (FlashAttention and SDPA keep no scores)."""
    logits_shift_copy: bool = False
    """The loss of Hugging Face transformers 4.46-4.49 (``src/transformers/loss/loss_utils.py``
    ``ForCausalLMLoss``: ``logits = logits.float()`` then ``shift_logits = logits[..., :-1,
    :].contiguous()``): while cross-entropy runs, the 16-bit logits (held by the model's
    ``forward``), their FP32 upcast and the FP32 contiguous copy of the shifted logits are alive
    with the FP32 log-softmax it saves — a loss-forward moment of 2 + 4 + 4 bytes per logit
    beyond the saved 4 (:func:`trainplan.memory.loss_forward_bytes`). transformers 4.50 and
    later pad the labels instead and make no copy (the default, ``False``). One cross-entropy
    over all tokens only (``loss_chunks = 1``)."""
    triton_attention: bool = False
    """Flash attention by FlashAttention in Triton (the flash-attention repository's
    ``flash_attn/flash_attn_triton.py``, the FlashAttention-1 algorithm in Triton, which supports an
    attention bias; llm-foundry's ``attn_impl: triton`` runs a copy of it,
    ``llmfoundry/models/layers/flash_attn_triton.py``). Its speed is FlashAttention-2's times the ratio
    Dao 2023 Sec. 4.1 publishes on the A100 (:mod:`trainplan.attention`, step 5). ``attention="flash"``
    only."""
    stack: Stack = "megatron"
    """The training software (``STACKS``): its calibrated κ is what the compute terms are divided
    by; each stack's κ is fitted on its own calibration split (``validate/calibrate.py``)."""
    paged_optimizer: bool = False
    """Optimizer states in CUDA unified (managed) memory, as the bitsandbytes paged optimizers
    (``PagedAdamW``, ``PagedAdamW8bit``, ``PagedLion``; Dettmers et al. 2023, QLoRA Sec. 3 "Paged
    Optimizers") allocate them: outside PyTorch's caching allocator, paged to host memory by the
    driver under memory pressure."""
    moe_capacity_factor: float | None = None
    """Token-dropping MoE with capacity-padded expert buffers: every routed expert runs its GEMMs on
    ``C = int(max(ceil(S·K/E)·cf, cf))`` token slots per sequence of ``S`` tokens, filled or not
    (MaxText ``MaxText/layers/moe.py`` ``generate_masks`` at 14b5876e, L630-642: capacity per expert
    and per sequence in training; the expert einsums ``EBCM,EMH -> EBCH`` run on all C slots,
    L814-844; Megatron-Core ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity`` pads the same way). The executed expert FLOPs, the
    saved expert activations and the all-to-all buffers grow by ``E·C / (S·K)``
    (:func:`trainplan.flops.expert_slot_ratio`, ≈ cf); model FLOPs (MFU) stay at K experts per
    token, as MaxText's own counter keeps them (``maxtext_utils.py`` "calculation based on dropless
    implementation"). ``None``: dropless routing, each expert computing the tokens routed to it
    (balanced: ``S·K/E`` per sequence). Under balanced routing a capacity factor without padding
    drops no token and costs what dropless costs: leave it ``None`` then. MoE models only."""
    moe_dispatch: MoEDispatch = "gather"
    """How an MoE layer moves tokens to its experts and back (``MOE_DISPATCHES``).

    ``"gather"``: index permutation (gather or sort the routed rows, grouped or per-expert GEMMs,
    scatter or ``index_add`` back: Megatron-Core, torchtitan, Hugging Face, DeepSpeed-MoE's
    grouped path, MaxText ``sparse_matmul``); its memory-bound traffic is the ``moe_permute``
    term. ``"einsum"``: GShard's one-hot dispatch and combine matmuls (Lepikhin et al. 2020,
    Sec. 2.2; MaxText ``dense_matmul`` with a capacity factor, ``moe.py`` L773-775 and L855-860:
    ``BSM,BSEC -> EBCM`` and ``EBCM,BSEC -> BSM`` over the whole sequence), each
    ``2·S·E·C·h`` FLOPs per sequence in the forward, so quadratic in the sequence length
    (:func:`trainplan.flops.moe_einsum_flops`); it needs ``moe_capacity_factor``."""

    fused_cross_entropy: bool = False
    """Cross-entropy by a fused kernel on the 16-bit logits — flash-attn's ``CrossEntropyLoss``
    (flash_attn/losses/cross_entropy.py, ``inplace_backward=False``), which llm-foundry's MPT runs
    by default (``loss_fn: fused_crossentropy``, llmfoundry/models/mpt/modeling_mpt.py at 5e85bd62
    L981-987): it computes the loss and the FP32 log-sum-exp per token in one pass and saves the
    logits, the log-sum-exp and the labels; its backward writes the logit gradient in the logits'
    dtype. No FP32 log-softmax exists (:func:`trainplan.memory.logits_bytes`,
    :func:`trainplan.flops.logits_memory_bytes`). The pytorch stack, one cross-entropy over all
    tokens, without tensor parallelism (the vocabulary-parallel form is not modelled)."""
    fp8_params: bool = False
    """Transformer Engine FP8 parameters (TE ``fp8_model_init``; Megatron-LM ``--fp8-param-gather``,
    ``TransformerConfig.fp8_param``; NeMo ``fp8_params``): the weights of the TE linear layers are
    created as FP8 tensors and kept only so — no 16-bit copy on the device
    (TransformerEngine d0067d0d ``pytorch/module/base.py`` L1838-1865, ``quantization.py``
    L901-910). A frozen weight (the LoRA base) is its FP8 data, 1 byte per parameter (the published
    MLPerf v5.1 Llama 2 70B LoRA runs, which build the base under ``te.fp8_model_init``, fit only so);
    a trained weight keeps its FP8 data and the transposed (Hopper) or column-wise (MXFP8) copy
    the weight-gradient and input-gradient GEMMs read, 2 bytes, as a 16-bit weight takes
    (``csrc/quantizer.cpp`` L361-384, L1502-1535). The parameters Megatron gathers — the
    distributed optimizer's all-gather after the step, ZeRO-3's before each use — move 1 byte per
    element (Megatron-LM d98e8a64 ``param_and_grad_buffer.py`` L505-527). The megatron stack with
    ``precision="fp8"``; Megatron-LM accepts it with the distributed optimizer or an FSDP (ZeRO ≥ 1)
    or with frozen weights."""
    fp8_activation_store: bool = False
    """Megatron-Core's ``activation_func_fp8_input_store`` (NeMo ``FP8_ACT``): the SwiGLU saves its
    input, the fc1 output (2·f wide), cast to FP8 — 1 byte per element instead of 2
    (Megatron-LM d98e8a64 ``megatron/core/fusions/fused_bias_swiglu.py`` L168-210: ``input.to(
    torch.float8_e4m3fn)`` saved, cast back in backward; ``transformer_config.py`` L2467-2469:
    "supported only for SwiGLU"). The megatron stack, ``precision`` fp8 or fp4 (NVIDIA's NVFP4
    recipes set it too), gated SiLU MLPs."""
    fp8_attention: bool = False
    """Transformer Engine's FP8 dot-product attention (``TransformerConfig.fp8_dot_product_attention``;
    NeMo ``FP8_DPA=1`` with ``NVTE_FP8_DPA_BWD=1``, the default): cuDNN's fused attention runs its
    forward and backward in FP8, at the speed-ups over the BF16 kernel that NVIDIA's cuDNN
    benchmarks publish per pass (:mod:`trainplan.attention`), and saves q, k and v in FP8 for the
    backward, the output in BF16 (TransformerEngine d0067d0d ``attention/dot_product_attention/
    backends.py`` L1580-1591: current scaling and MXFP8 keep O in 16 bits). The megatron stack,
    ``precision`` fp8 or fp4 (NVIDIA's NVFP4 recipes run attention in FP8: MLPerf v5.1
    ``config_common_fp4.sh``), flash attention, on an NVIDIA GPU with a published FP8 attention
    curve."""
    mtp_layers: int = 0
    """Multi-token prediction depth D (DeepSeek-V3, arXiv:2412.19437 Sec. 2.2; Megatron-Core
    ``--mtp-num-layers``, ``megatron/core/transformer/multi_token_prediction.py``): D modules after
    the decoder, each a transformer block built like the decoder's layers, fed by ``eh_proj``
    (2h → h) of the normalised hidden state and the next token's embedding, with a loss of its own
    through the shared LM head. Costed as D more layers on the last pipeline stage
    (:meth:`trainplan.models.spec.ModelSpec.with_mtp`) and D more LM-head passes and losses with
    their ``eh_proj`` GEMMs (:func:`trainplan.flops.mtp_head_flops`); all of it counts as model
    FLOPs, as Megatron-Bridge's FLOP counter counts it. The megatron stack only (transformers,
    torchtitan and DeepSpeed do not build the modules), full training only."""
    recompute_modules: tuple[str, ...] | None = None
    """With ``recompute="selective"`` on the megatron stack: the Megatron-Core submodules recomputed
    (``--recompute-modules``; ``TransformerConfig.recompute_modules``, megatron/core/transformer/
    transformer_config.py at core_r0.14.0 L304-316; ``None`` is Megatron's default,
    ``("core_attn",)``). Modelled (:data:`RECOMPUTE_MODULES`): ``core_attn`` (the attention core),
    ``mla_up_proj`` (MLA's up projections and RoPE: their outputs q, k, v are discarded after the
    attention forward and rebuilt for its backward), ``mlp`` (the dense layers' MLP, checkpointed
    from its normalised input; not MoE layers), ``moe_act`` (the routed experts' activation
    function: its output, the fc2 input, is discarded and recomputed). ``layernorm``, ``moe`` and
    ``shared_experts`` are refused (not modelled)."""

    def __post_init__(self) -> None:
        _check_choice("method", self.method, METHODS)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("recompute", self.recompute, RECOMPUTES)
        _check_choice("attention", self.attention, ATTENTIONS)
        _check_choice("offload", self.offload, OFFLOADS)
        _check_choice("stack", self.stack, STACKS)
        _check_choice("moe_dispatch", self.moe_dispatch, MOE_DISPATCHES)
        if self.moe_capacity_factor is not None:
            check_real(
                "moe_capacity_factor",
                self.moe_capacity_factor,
                low=1e-3,
                high=MAX_CAPACITY_FACTOR,
                error=RecipeError,
                what="expert slots per routed token",
            )
        if self.moe_dispatch == "einsum" and self.moe_capacity_factor is None:
            raise RecipeError(
                "moe_dispatch",
                "one-hot einsum dispatch sizes its buffers by a capacity factor (C slots per expert); "
                "give --moe-capacity-factor (MaxText capacity_factor, e.g. 1.25) or use --moe-dispatch gather",
            )
        check_int("seq_len", self.seq_len, high=MAX_SEQ_LEN, error=RecipeError, what="tokens per sequence")
        check_int("micro_batch", self.micro_batch, high=MAX_SEQUENCES, error=RecipeError, what="sequences")
        if self.global_batch is not None:
            check_int(
                "global_batch", self.global_batch, high=MAX_SEQUENCES, error=RecipeError, what="sequences"
            )
        if self.tokens is not None:
            if (
                isinstance(self.tokens, int | float)
                and not isinstance(self.tokens, bool)
                and not self.tokens > 0
            ):
                raise RecipeError("tokens", f"must be positive, got {self.tokens!r}")
            check_real(
                "tokens", self.tokens, low=MIN_TOKENS, high=MAX_TOKENS, error=RecipeError, what="tokens"
            )
        if (
            isinstance(self.dropout, bool)
            or not isinstance(self.dropout, int | float)
            or not 0.0 <= self.dropout < 1.0
        ):
            raise RecipeError("dropout", f"must be in [0, 1), got {self.dropout!r}")
        for name in ("master_weights", "optimizer_in_backward", "paged_optimizer"):
            if not isinstance(getattr(self, name), bool):
                raise RecipeError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.lora is not None and not isinstance(self.lora, LoRASpec):
            raise RecipeError("lora_rank", f"lora must be a LoRASpec, got {self.lora!r}")
        if not isinstance(self.loss_chunks, int) or self.loss_chunks <= 0:
            raise RecipeError("loss_chunks", f"must be a positive integer, got {self.loss_chunks!r}")
        if self.loss_chunks > self.seq_len:
            raise RecipeError(
                "loss_chunks",
                f"{self.loss_chunks} chunks exceed the sequence length {self.seq_len}; use at most one per token",
            )
        if not isinstance(self.torch_compile, bool):
            raise RecipeError("torch_compile", f"must be true or false, got {self.torch_compile!r}")
        if self.torch_compile and self.stack != "pytorch":
            raise RecipeError(
                "torch_compile",
                f"the {self.stack} stack runs its own fused or compiled kernels, so torch.compile changes "
                "nothing in the model; drop --torch-compile or use --stack pytorch",
            )
        if not isinstance(self.triton_attention, bool):
            raise RecipeError("triton_attention", f"must be true or false, got {self.triton_attention!r}")
        if self.triton_attention and self.attention != "flash":
            raise RecipeError(
                "triton_attention",
                f"the Triton FlashAttention kernel is a flash kernel; attention {self.attention!r} is not: drop "
                "--triton-attention or use --attention flash",
            )
        if self.softmax_fp32 and self.attention != "eager":
            raise RecipeError(
                "softmax_fp32",
                f"the FP32 softmax copy is a tensor of eager attention; attention {self.attention!r} keeps no "
                "scores: drop --softmax-fp32 or use --attention eager",
            )
        for name in ("kbit_fp32_upcast", "logits_shift_copy", "softmax_fp32"):
            if not isinstance(getattr(self, name), bool):
                raise RecipeError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.kbit_fp32_upcast and self.method != "qlora":
            raise RecipeError(
                "kbit_fp32_upcast",
                f"PEFT's prepare_model_for_kbit_training upcast is the QLoRA (4-bit base) path; "
                f"method {self.method!r} has no k-bit base: drop --kbit-fp32-upcast or use --method qlora",
            )
        if self.kbit_fp32_upcast and self.stack != "pytorch":
            raise RecipeError(
                "kbit_fp32_upcast",
                f"PEFT's k-bit upcast is the Hugging Face Trainer's path (PyTorch modules); the {self.stack} stack "
                "runs its own modules: use --stack pytorch (or --engine hf-trainer), or drop --kbit-fp32-upcast",
            )
        if self.kbit_fp32_upcast and self.recompute in ("selective", "sac"):
            raise RecipeError(
                "kbit_fp32_upcast",
                f"the FP32 residual stream is modelled for --recompute none or full (what the Hugging Face "
                f"Trainer runs), not {self.recompute!r}",
            )
        if not isinstance(self.fused_cross_entropy, bool):
            raise RecipeError(
                "fused_cross_entropy", f"must be true or false, got {self.fused_cross_entropy!r}"
            )
        if self.fused_cross_entropy:
            if self.stack != "pytorch":
                raise RecipeError(
                    "fused_cross_entropy",
                    f"--fused-cross-entropy is flash-attn's CrossEntropyLoss on a PyTorch model (llm-foundry); the "
                    f"{self.stack} stack's loss is its own: use --stack pytorch, or drop it",
                )
            if self.loss_chunks > 1 or self.logits_shift_copy:
                raise RecipeError(
                    "fused_cross_entropy",
                    "--fused-cross-entropy is one fused kernel over all tokens; drop --loss-chunks / --logits-shift-copy",
                )
        if self.logits_shift_copy and self.loss_chunks > 1:
            raise RecipeError(
                "logits_shift_copy",
                "the shifted-logits copy belongs to one cross-entropy over all tokens (transformers "
                "ForCausalLMLoss); with --loss-chunks the loss is chunked: drop one of them",
            )
        if not isinstance(self.recompute_early_stop, bool):
            raise RecipeError(
                "recompute_early_stop",
                f"must be true or false, got {self.recompute_early_stop!r} "
                "(--recompute-early-stop: PyTorch non-reentrant checkpoint with early stop)",
            )
        for name, low in (("recompute_every", 1), ("recompute_layers", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                what = "a positive" if low else "a non-negative"
                raise RecipeError(name, f"must be {what} integer, got {value!r}")
        if self.recompute_layers:
            if self.recompute != "full":
                raise RecipeError(
                    "recompute_layers",
                    f"--recompute-layers {self.recompute_layers} recomputes the first N blocks of each stage in "
                    f"full (Megatron-LM --recompute-method block); it needs --recompute full, got {self.recompute!r}",
                )
            if self.recompute_every > 1:
                raise RecipeError(
                    "recompute_layers",
                    "--recompute-layers (the first N blocks, Megatron-LM) and --recompute-every (every n-th, "
                    "torchtitan) are two ways to pick the blocks; give one",
                )
            if self.stack != "megatron":
                raise RecipeError(
                    "recompute_layers",
                    f"--recompute-layers is Megatron-LM's block method; the {self.stack} stack checkpoints "
                    "every n-th block instead: use --recompute-every, or --stack megatron",
                )
        _check_fp8_options(self)
        _check_mtp_and_modules(self)
        if self.recompute_every > 1 and self.recompute != "full":
            raise RecipeError(
                "recompute_every",
                f"--recompute-every {self.recompute_every} checkpoints every n-th block in full "
                f"(torchtitan selective_ac_option = n); it needs --recompute full, got {self.recompute!r}",
            )
        if self.recompute == "sac":
            self._check_sac()
        if self.paged_optimizer and self.optimizer not in PAGED_OPTIMIZERS:
            raise RecipeError(
                "paged_optimizer",
                f"bitsandbytes has paged versions of {', '.join(PAGED_OPTIMIZERS)} only, not {self.optimizer!r}",
            )
        if self.paged_optimizer and self.offload != "none":
            raise RecipeError(
                "paged_optimizer", "a paged optimizer and CPU offload both move optimizer states; choose one"
            )
        if self.method in ("lora", "qlora") and self.lora is None:
            object.__setattr__(self, "lora", LoRASpec())
        if self.method == "lora" and self.lora is not None:
            plain = LoRASpec(rank=self.lora.rank, alpha=self.lora.alpha, targets=self.lora.targets)
            if self.lora != plain:
                raise RecipeError(
                    "no_double_quant",
                    "quant_block, double_quant and double_quant_block describe QLoRA's 4-bit base weights; "
                    "a LoRA base is not quantized: leave them at their defaults, or use method qlora",
                )
        if self.method not in ("lora", "qlora") and self.lora is not None:
            raise RecipeError(
                "lora_rank", f"LoRA settings given but method is {self.method!r}; use --method lora"
            )

    def _check_sac(self) -> None:
        """Recipe settings under which per-op selective checkpointing is not modelled (``sac``)."""
        instead = "use --recompute full or selective"
        if self.method in ("lora", "qlora"):
            raise RecipeError(
                "recompute",
                f"sac with {self.method}: the adapters' matmuls (and QLoRA's NF4 matmul) change which "
                f"outputs the per-op policy keeps, which is not modelled; {instead}",
            )
        if self.precision in ("fp8", "fp4"):
            raise RecipeError(
                "recompute",
                f"sac with {self.precision}: the low-precision linears run their casts and amax "
                "reductions inside the block (torchtitan's policy keeps aten.max, and at 9dec370 aten.abs), "
                f"which is not modelled; use --precision bf16, or {instead}",
            )
        if self.attention != "flash":
            raise RecipeError(
                "recompute",
                "sac is modelled with flash attention (the policy keeps the SDPA kernel's output); "
                f"use --attention flash, or {instead}",
            )
        if self.dropout > 0:
            raise RecipeError(
                "recompute",
                f"sac with dropout: the recomputed dropout masks are not modelled; use --dropout 0, or {instead}",
            )

    @property
    def gathered_weight_bytes(self) -> float:
        """Bytes per element of the weights a data-parallel gather moves (ZeRO-3 before each use,
        ZeRO-1/2 after the step): NF4 for QLoRA's frozen base, FP8 under ``fp8_params``, else the
        weight dtype."""
        if self.method == "qlora":
            return BYTES_PER_ELEMENT["nf4"]
        if self.fp8_params:
            return BYTES_PER_ELEMENT["fp8"]
        return BYTES_PER_ELEMENT[self.weight_dtype]

    @property
    def layer_selective(self) -> bool:
        """Layer-selective checkpointing: some blocks of a stage recomputed, the others not
        (``recompute_every`` > 1 or ``recompute_layers`` > 0)."""
        return self.recompute_every > 1 or self.recompute_layers > 0

    @property
    def is_peft(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def weight_dtype(self) -> str:
        return WEIGHT_DTYPE[self.precision]

    @property
    def gemm_dtype(self) -> str:
        return GEMM_DTYPE[self.precision]

    @property
    def keeps_master_weights(self) -> bool:
        """Mixed precision keeps an FP32 master copy of every trained weight (unless pure 16-bit)."""
        return self.precision != "fp32" and self.master_weights

    @property
    def optimizer_state_dtype(self) -> str:
        """FP32 moments with mixed precision and fp32; the weight dtype for pure 16-bit training."""
        return "fp32" if self.precision == "fp32" or self.master_weights else self.weight_dtype


FP8_OPTIONS: Final = ("fp8_params", "fp8_activation_store", "fp8_attention")
"""The Transformer Engine FP8 switches of a megatron-stack FP8 recipe (:class:`Recipe`)."""


def fp8_options_set(recipe: Recipe, names: tuple[str, ...] = FP8_OPTIONS) -> list[tuple[str, str]]:
    """(field, CLI flag) of each of ``names`` the recipe sets."""
    return [(n, "--" + n.replace("_", "-")) for n in names if getattr(recipe, n) is True]


def _check_fp8_options(recipe: Recipe) -> None:
    """:attr:`Recipe.fp8_params`, :attr:`Recipe.fp8_activation_store`, :attr:`Recipe.fp8_attention`:
    Transformer Engine settings of FP8 training on the megatron stack."""
    for name in FP8_OPTIONS:
        value = getattr(recipe, name)
        if not isinstance(value, bool):
            raise RecipeError(name, f"must be true or false, got {value!r}")
    for name, flag in fp8_options_set(recipe):
        # NVFP4 recipes keep attention and the SwiGLU store in FP8 (their weights are not FP8)
        allowed = ("fp8",) if name == "fp8_params" else ("fp8", "fp4")
        if recipe.precision not in allowed:
            raise RecipeError(
                name,
                f"{flag} is a Transformer Engine FP8 setting; it needs --precision {' or '.join(allowed)}, "
                f"got {recipe.precision}",
            )
        if recipe.stack != "megatron":
            raise RecipeError(
                name,
                f"{flag} is a Transformer Engine / Megatron-Core setting; the {recipe.stack} stack does not "
                "have it: use --stack megatron, or drop it",
            )
    if recipe.fp8_params and recipe.method == "qlora":
        raise RecipeError(
            "fp8_params", "--fp8-params with QLoRA: the frozen base is NF4, not FP8; drop one of them"
        )
    if recipe.fp8_params and recipe.method in ("dpo", "ppo", "grpo", "rm"):
        raise RecipeError(
            "fp8_params",
            f"--fp8-params with {recipe.method}: FP8 weights are not modelled for the RL jobs' models and "
            "rollout engines; drop --fp8-params",
        )
    if recipe.fp8_attention and recipe.attention != "flash":
        raise RecipeError(
            "fp8_attention", "--fp8-attention is the fused (flash) attention kernel; drop --attention eager"
        )


def _check_mtp_and_modules(recipe: Recipe) -> None:
    """:attr:`Recipe.mtp_layers` and :attr:`Recipe.recompute_modules` (see their docstrings)."""
    mtp = recipe.mtp_layers
    if isinstance(mtp, bool) or not isinstance(mtp, int) or not 0 <= mtp <= MAX_MTP_LAYERS:
        raise RecipeError("mtp_layers", f"must be an integer in 0..{MAX_MTP_LAYERS}, got {mtp!r}")
    if mtp and recipe.stack != "megatron":
        raise RecipeError(
            "mtp_layers",
            f"multi-token prediction is a Megatron-Core module (--mtp-num-layers); the {recipe.stack} stack's "
            "models do not build it: use --stack megatron, or drop --mtp-layers",
        )
    if mtp and recipe.method not in ("pretrain", "full"):
        raise RecipeError(
            "mtp_layers", f"multi-token prediction is modelled for full training, not {recipe.method!r}"
        )
    modules = recipe.recompute_modules
    if modules is None:
        return
    if not isinstance(modules, tuple) or not all(isinstance(m, str) for m in modules):
        raise RecipeError("recompute_modules", f"must be a tuple of module names, got {modules!r}")
    if recipe.recompute != "selective":
        raise RecipeError(
            "recompute_modules",
            f"--recompute-modules names what selective recompute recomputes; it needs --recompute selective, "
            f"got {recipe.recompute!r}",
        )
    if recipe.stack != "megatron":
        raise RecipeError(
            "recompute_modules",
            f"--recompute-modules is Megatron-Core's (TransformerConfig.recompute_modules); the {recipe.stack} "
            "stack recomputes the attention core under --recompute selective: drop --recompute-modules",
        )
    if not modules:
        raise RecipeError(
            "recompute_modules", "an empty list recomputes nothing: use --recompute none (or name modules)"
        )
    for m in modules:
        if m in UNMODELLED_RECOMPUTE_MODULES:
            raise RecipeError(
                "recompute_modules",
                f"recomputing {m!r} is not modelled; choose among {', '.join(RECOMPUTE_MODULES)}",
            )
        _check_choice("recompute_modules", m, RECOMPUTE_MODULES)
    if len(set(modules)) != len(modules):
        raise RecipeError("recompute_modules", f"{modules} names a module twice")


def recompute_module_set(recipe: Recipe) -> frozenset[str]:
    """The Megatron-Core modules ``recipe`` recomputes under ``recompute="selective"`` (the
    attention core alone unless ``recompute_modules`` says otherwise); empty otherwise."""
    if recipe.recompute != "selective":
        return frozenset()
    return frozenset(recipe.recompute_modules or ("core_attn",))


def check_model_recipe(model: ModelSpec, recipe: Recipe) -> None:
    """Recipe settings the model cannot take, refused with the reason and the fix.

    * A sequence longer than a learned position table (GPT-2 ``wpe``: ``n_positions`` rows): the
      model has no position embedding for the later tokens. Rotary, ALiBi and position-free models
      take any length.
    * MoE routing settings (``moe_capacity_factor``, ``moe_dispatch``) on a dense model.
    * Rollout methods (PPO, GRPO) on a model with multi-head latent attention: the KV cache of
      generation is not modelled for it.
    * A LoRA rank above the smaller side of an adapted matrix: ``ΔW = B·A`` (``B``: out×r, ``A``:
      r×in) has rank at most ``min(in, out)`` (Hu et al. 2021, Sec. 4.1), so a larger ``r`` adds
      parameters and FLOPs, not capacity; at ranks near the hidden size the adapters outgrow the
      base model.
    """
    if model.position == "learned" and recipe.seq_len > model.max_seq_len:
        raise RecipeError(
            "seq_len",
            f"{model.name} has a learned position table of {model.max_seq_len} positions; a sequence of "
            f"{recipe.seq_len} tokens has no embedding past position {model.max_seq_len}; "
            f"use --seq-len {model.max_seq_len} or less",
        )
    if recipe.lora is not None:
        _check_lora_rank(model, recipe.lora)
    modules = recompute_module_set(recipe)
    if "mla_up_proj" in modules and model.mla is None:
        raise RecipeError(
            "recompute_modules",
            f"mla_up_proj recomputes the up projections of multi-head latent attention; {model.name} has none",
        )
    if "moe_act" in modules and model.moe is None:
        raise RecipeError(
            "recompute_modules", f"moe_act recomputes expert activations; {model.name} has no experts"
        )
    if "mlp" in modules and model.num_dense_layers == 0:
        raise RecipeError("recompute_modules", f"mlp recomputes the dense layers' MLP; {model.name} has none")
    if model.mla is not None and recipe.method in ("ppo", "grpo"):
        raise RecipeError(
            "method",
            f"{recipe.method} generates rollouts, and the KV cache of multi-head latent attention ({model.name}) "
            "depends on the engine (vLLM keeps the compressed latent, Hugging Face generate the expanded keys "
            "and values), which is not modelled; estimate the policy update with --method full or dpo",
        )
    if model.moe is None:
        for name, set_ in (
            ("moe_capacity_factor", recipe.moe_capacity_factor is not None),
            ("moe_dispatch", recipe.moe_dispatch != "gather"),
        ):
            if set_:
                raise RecipeError(
                    name,
                    f"{model.name} is a dense model (no experts), so --{name.replace('_', '-')} has nothing "
                    "to act on; drop it or choose an MoE model",
                )


def _check_lora_rank(model: ModelSpec, lora: LoRASpec) -> None:
    from trainplan.flops import _lora_linear_dims
    from trainplan.models.params import lora_modules

    layers = {0}
    if model.moe is not None:
        layers.add(next(i for i in range(model.num_layers) if model.is_moe_layer(i)))
    sides = [
        (min(n_in, n_out), target, n_in, n_out)
        for target in lora_modules(model, lora.targets)
        for i in sorted(layers)
        for n_in, n_out, _, _ in _lora_linear_dims(model, i, target)
    ]
    if not sides:
        return
    side, target, n_in, n_out = min(sides)
    if lora.rank > side:
        raise RecipeError(
            "lora_rank",
            f"rank {lora.rank} exceeds the smaller side of {model.name}'s {target!r} matrix "
            f"({n_in} in × {n_out} out): an adapter B·A has rank at most {side}; "
            f"use --lora-rank {side} or less (typical ranks are 8-256)",
        )
