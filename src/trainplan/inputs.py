"""The input schema: every field a command, the web API and the Python API accept, declared once.

Each :class:`Field` has the name used everywhere — the ``dest`` of its CLI flag (``--seq-len`` is
``seq_len``), the web API's request field and the keyword of :func:`trainplan.estimate` — with
its type, default, choices, help text and whether the planner searches it. Defaults and choices
of recipe and layout fields are read from :class:`~trainplan.recipe.Recipe`,
:class:`~trainplan.layout.Layout` and their constants, so each is written in one place; values
are validated once, by those dataclasses' ``__post_init__``.

Built from this table: the argparse flags of ``estimate``, ``plan``, ``compare``, ``export``,
``run`` and ``verify`` (:func:`add_arguments`), the web API's body validation and its OpenAPI
document (:mod:`trainplan.web.api`), and the keywords of :mod:`trainplan.api` (docs/api.md).
:func:`build_recipe` and :func:`build_layout` turn parsed values into the typed inputs.

Importing this module does not import argparse, numpy or the planner.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from trainplan.cost import DEFAULT_PUE
from trainplan.engines import (
    DEFAULT_ENGINE,
    ENGINE_FIELDS,
    ENGINE_NAMES,
    Applied,
    check_capabilities,
    resolve,
)
from trainplan.errors import TrainplanError
from trainplan.export import TARGETS as EXPORT_TARGETS
from trainplan.goodput import DEFAULT_RELIABILITY, Reliability
from trainplan.hardware.accelerator import PRICE_KINDS
from trainplan.hardware.prices import PriceQuery
from trainplan.layout import (
    GRAD_ACCUMULATIONS,
    PIPELINE_SCHEDULES,
    ZERO3_GRANULARITIES,
    ZERO_STAGES,
    Layout,
    LayoutOptions,
)
from trainplan.memory import DEFAULT_MEMORY_MARGIN
from trainplan.ownership import (
    DEFAULT_NETWORK_FRACTION,
    DEFAULT_USD_PER_KW_MONTH,
    DEFAULT_USD_PER_KWH,
    DEFAULT_UTILISATION,
    DEFAULT_YEARS,
)
from trainplan.recipe import (
    ATTENTIONS,
    LORA_TARGETS,
    METHODS,
    MOE_DISPATCHES,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE_MODULES,
    RECOMPUTES,
    RLHF_ACTORS,
    RLHF_ENGINES,
    RLHF_METHODS,
    RLHF_PLACEMENTS,
    RLHF_REFERENCES,
    STACKS,
    LoRASpec,
    Recipe,
)

if TYPE_CHECKING:
    import argparse

    from trainplan.models.spec import ModelSpec
    from trainplan.rlhf import RLHFSpec

Group = Literal[
    "input",
    "hardware",
    "layout",
    "recipe",
    "rlhf",
    "cost",
    "own",
    "plan",
    "export",
    "verify",
    "run",
    "output",
]
ValueType = type[int] | type[float] | type[str] | type[bool]

# Planner settings. ``trainplan.planner.search`` has the same values (tests/test_inputs.py pins
# them); they are declared here so that building the CLI's parser does not import the planner.
DEFAULT_MAX_DEVICES: Final = 1024
OBJECTIVES: Final = ("time", "cost", "balanced")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Field:
    """One input: its name (a CLI ``dest``, a JSON field, a Python keyword) and how it is read.

    ``type`` is ``bool`` for a switch (a CLI ``--flag`` without a value, always ``False`` by
    default), else the type of the value; ``repeatable`` fields are lists (a CLI flag given several
    times). ``positive`` values must be > 0. ``searchable``: the planner searches this field when a
    plan request leaves it open (``None``); a field that is not searchable is the same for every
    plan the planner ranks.
    """

    name: str
    group: Group
    type: ValueType = str
    default: object = None
    choices: tuple[object, ...] | None = None
    help: str = ""
    searchable: bool = False
    positive: bool = False
    repeatable: bool = False
    required: bool = False
    positional: bool = False
    optional: bool = False  # a positional argument that may be left out (argparse nargs="?")
    metavar: str | None = None

    @property
    def option(self) -> str:
        """The CLI spelling: ``--seq-len`` (the name for a positional argument)."""
        return self.name if self.positional else "--" + self.name.replace("_", "-")

    def convert(self, text: str) -> object:
        """CLI text to a value (the argparse ``type``); ``ValueError`` with a message when bad."""
        if self.type is int:
            try:
                number = int(text)
            except ValueError:
                if self.positive:
                    raise ValueError(f"expected a positive integer, got {text!r}") from None
                raise
            if self.positive and number <= 0:
                raise ValueError(f"expected a positive integer, got {text!r}")
            return number
        if self.type is float:
            try:
                real = float(text)
            except ValueError:
                if self.positive:
                    raise ValueError(f"expected a positive number, got {text!r}") from None
                raise
            if not math.isfinite(real):
                raise ValueError(f"expected a finite number, got {text!r}")
            if self.positive and not real > 0:
                raise ValueError(f"expected a positive number, got {text!r}")
            return real
        return text

    def parse(self, value: object) -> object:
        """A JSON or Python value, checked and converted as the CLI checks the flag's text.

        ``None`` is the default. Raises :class:`~trainplan.errors.TrainplanError` naming the field.
        """
        if value is None:
            return list(self.default) if isinstance(self.default, list) else self.default
        if self.type is bool:
            if not isinstance(value, bool):
                raise TrainplanError(self.name, f"expected true or false, got {json.dumps(_jsonable(value))}")
            return value
        if self.repeatable:
            items = list(value) if isinstance(value, list | tuple) else [value]
            one = dataclasses.replace(self, repeatable=False, default=None)
            return [one.parse(v) for v in items]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise TrainplanError(
                self.name, f"expected a string or a number, got {json.dumps(_jsonable(value))}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise TrainplanError(self.name, f"expected a finite number, got {value}")
        text = str(value)
        try:
            converted = self.convert(text)
        except ValueError as exc:
            raise TrainplanError(self.name, f"{self.option}: {exc}") from None
        if self.choices is not None and converted not in self.choices:
            choices = ", ".join(str(c) for c in self.choices)
            raise TrainplanError(self.name, f"{self.option}: {text!r} is not one of {choices}")
        return converted

    def json_schema(self) -> dict[str, Any]:
        """The field as a JSON Schema property (OpenAPI 3.1), described by its CLI flag."""
        schema: dict[str, Any]
        if self.type is bool and self.default is None:
            schema = {"type": ["boolean", "null"], "default": None}
        elif self.type is bool:
            schema = {"type": "boolean", "default": bool(self.default)}
        elif self.repeatable:
            schema = {"type": ["array", "string"], "items": {"type": "string"}, "default": []}
        else:
            kind = {int: "integer", float: "number"}.get(self.type, "string")
            schema = {"type": [kind, "null"] if self.default is None else kind}
            if self.default is not None:
                schema["default"] = self.default
            if self.choices is not None:
                schema["enum"] = list(self.choices)
            if self.positive:
                schema["exclusiveMinimum" if kind == "number" else "minimum"] = 0 if kind == "number" else 1
        schema["description"] = f"CLI {self.option}" + (f": {self.help}" if self.help else "")
        schema["x-group"] = self.group  # the form's fieldset (OpenAPI 3.1 specification extension)
        return schema


def _jsonable(value: object) -> object:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _default(cls: type[Any], name: str) -> Any:
    """The declared default of dataclass field ``name`` of ``cls`` (the one place it is written)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is dataclasses.MISSING:
                raise AssertionError(f"{cls.__name__}.{name} has no default")
            return f.default
    raise AssertionError(f"{cls.__name__} has no field {name}")


def _switch(name: str, group: Group, help: str, **kw: Any) -> Field:
    return Field(name=name, group=group, type=bool, default=False, help=help, **kw)


def _engine_switch(name: str, group: Group, help: str) -> Field:
    """A setting the engine decides unless given: ``--name`` / ``--no-name``, ``None`` when unset
    (``trainplan.engines.resolve`` fills it)."""
    return Field(name=name, group=group, type=bool, default=None, help=help + " (default: the engine's)")


ENGINE: Final = Field(
    name="engine",
    group="recipe",
    choices=ENGINE_NAMES,
    help="the training software: sets the stack's calibrated efficiency, its recompute, ZeRO-3/FSDP, "
    "overlap and gradient-accumulation behaviour, and the default export target; explicit flags "
    f"override each (trainplan.engines; default {DEFAULT_ENGINE})",
)


# --- the model and the hardware -------------------------------------------------------------------
MODEL: Final = Field(
    name="model",
    group="input",
    positional=True,
    help="preset name (see `trainplan models`) or path to a Hugging Face config.json",
)
HARDWARE: Final = Field(
    name="hardware", group="hardware", required=True, help="accelerator name (see `trainplan hardware list`)"
)
HARDWARE_FILE: Final = Field(
    name="hardware_file",
    group="hardware",
    repeatable=True,
    default=[],
    metavar="PATH",
    help="extra accelerator catalog file (TOML, same schema as the built-ins); repeatable",
)

HOST_MEMORY: Final = Field(
    name="host_memory",
    group="hardware",
    type=float,
    positive=True,
    metavar="GB",
    help="CPU memory per server in GB (10^9 bytes), for offloaded states "
    "(default: the catalog's reference server; see `trainplan hardware show`)",
)
MEMORY_MARGIN: Final = Field(
    name="memory_margin",
    group="hardware",
    type=float,
    default=DEFAULT_MEMORY_MARGIN,
    metavar="FRACTION",
    help="fraction of device memory a plan leaves free: it fits when its peak is at most "
    f"capacity·(1 − margin), in estimate and plan alike (default {DEFAULT_MEMORY_MARGIN:g}: the peak "
    "already counts the CUDA context and allocator fragmentation; e.g. 0.1 keeps a tenth free)",
)
SYSTEM_FIELDS: Final = (HOST_MEMORY, MEMORY_MARGIN)


def host_memory_bytes(values: Mapping[str, Any]) -> float | None:
    """``--host-memory`` in bytes, ``None`` when not given (the catalog's figure applies)."""
    gb = values.get("host_memory")
    return None if gb is None else float(gb) * 1e9


# --- the layout -----------------------------------------------------------------------------------
LAYOUT_OPTION_FIELDS: Final = (
    _switch(
        "no_overlap_grad_reduce",
        "layout",
        "reduce gradients after the backward instead of overlapping it (older Megatron-LM)",
    ),
    _engine_switch(
        "tp_comm_overlap",
        "layout",
        "overlap the sequence-parallel collectives with the GEMMs (Megatron-Core --tp-comm-overlap, "
        "torchtitan async TP; needs --sequence-parallel)",
    ),
    _engine_switch(
        "pp_comm_overlap",
        "layout",
        "overlap pipeline sends with other micro-batches' compute (Megatron-Core overlap_p2p_comm)",
    ),
    _switch(
        "ep_comm_overlap",
        "layout",
        "overlap one micro-batch's expert all-to-alls with another's compute (Megatron-Core "
        "--overlap-moe-expert-parallel-comm with --delay-wgrad-compute; needs --ep, an interleaved "
        "pipeline or none, and no full recompute)",
    ),
    Field(
        name="zero3_granularity",
        group="layout",
        choices=ZERO3_GRANULARITIES,
        help="ZeRO-3 collectives: one per block, prefetched (FSDP/FSDP2) or one blocking "
        "gather per parameter tensor (DeepSpeed ZeRO-3 as of 2021) (default: the engine's)",
    ),
    Field(
        name="grad_accumulation",
        group="layout",
        choices=GRAD_ACCUMULATIONS,
        help="how micro-batch gradients are summed: inside the weight-gradient GEMM (Megatron-LM "
        "--gradient-accumulation-fusion), by PyTorch autograd into .grad, or by a hook into "
        "a main-gradient buffer (Megatron-LM LocalDDP 2021-2022) (default: the engine's)",
    ),
)
"""The engine options of a layout: the planner does not search them, it applies the given (or
default) values to every candidate where they mean something (``layout.LayoutOptions``)."""

LAYOUT_FIELDS: Final = (
    Field(
        name="devices",
        group="layout",
        type=int,
        positive=True,
        default=1,
        searchable=True,
        help="number of accelerators (dp = devices/(tp·pp·cp))",
    ),
    Field(
        name="tp",
        group="layout",
        type=int,
        positive=True,
        default=_default(Layout, "tp"),
        searchable=True,
        help="tensor-parallel degree",
    ),
    Field(
        name="pp",
        group="layout",
        type=int,
        positive=True,
        default=_default(Layout, "pp"),
        searchable=True,
        help="pipeline stages",
    ),
    Field(
        name="cp",
        group="layout",
        type=int,
        positive=True,
        default=_default(Layout, "cp"),
        searchable=True,
        help="context-parallel degree",
    ),
    Field(
        name="ep",
        group="layout",
        type=int,
        positive=True,
        default=_default(Layout, "ep"),
        searchable=True,
        help="expert-parallel degree",
    ),
    Field(
        name="etp",
        group="layout",
        type=int,
        positive=True,
        help="expert tensor-parallel degree: 1 puts whole experts on each rank and folds the "
        "expert-parallel groups into the tp·cp·dp ranks, so ep·etp divides tp·cp·dp (Megatron-Core "
        "parallel folding, --expert-tensor-parallel-size 1; needs --sequence-parallel with tp > 1); "
        "default: tp",
    ),
    Field(
        name="zero",
        group="layout",
        type=int,
        default=_default(Layout, "zero"),
        choices=ZERO_STAGES,
        searchable=True,
        help="ZeRO stage (FSDP full shard = 3)",
    ),
    _switch(
        "sequence_parallel",
        "layout",
        "Megatron sequence parallelism (needs tp > 1)",
        searchable=True,
    ),
    Field(
        name="pp_schedule",
        group="layout",
        default=_default(Layout, "pp_schedule"),
        choices=PIPELINE_SCHEDULES,
        searchable=True,
        help="pipeline schedule: 1f1b, interleaved (with --virtual-stages) or zero-bubble zb",
    ),
    Field(
        name="virtual_stages",
        group="layout",
        type=int,
        positive=True,
        default=_default(Layout, "virtual_stages"),
        searchable=True,
        help="interleaved pipeline chunks per device",
    ),
    _switch(
        "pp_split_embedding",
        "layout",
        "the embedding takes one layer's place in the pipeline split: the first chunk holds one layer "
        "fewer (Megatron-Core account_for_embedding_in_pipeline_split; Llama 3 405B)",
    ),
    _switch(
        "pp_split_head",
        "layout",
        "the LM head and loss take one layer's place in the pipeline split: the last chunk holds one "
        "layer fewer (Megatron-Core account_for_loss_in_pipeline_split; Llama 3 405B)",
    ),
    *LAYOUT_OPTION_FIELDS,
)

# --- the recipe -----------------------------------------------------------------------------------
RECIPE_FIELDS: Final = (
    Field(
        name="method",
        group="recipe",
        default=_default(Recipe, "method"),
        choices=METHODS,
        help="what is trained: pre-training, a full fine-tune, LoRA / QLoRA adapters, or DPO / PPO / GRPO",
    ),
    Field(
        name="precision",
        group="recipe",
        default=_default(Recipe, "precision"),
        choices=PRECISIONS,
        searchable=True,
        help="number format of weights, gradients, optimizer states and GEMMs (the table in trainplan.recipe)",
    ),
    Field(
        name="optimizer",
        group="recipe",
        default=_default(Recipe, "optimizer"),
        choices=OPTIMIZERS,
        help="optimizer, for its state memory and step time",
    ),
    Field(
        name="seq_len",
        group="recipe",
        type=int,
        positive=True,
        default=_default(Recipe, "seq_len"),
        help="tokens per sequence",
    ),
    Field(
        name="micro_batch",
        group="recipe",
        type=int,
        positive=True,
        default=_default(Recipe, "micro_batch"),
        searchable=True,
        help="sequences per device",
    ),
    Field(
        name="global_batch",
        group="recipe",
        type=int,
        positive=True,
        default=_default(Recipe, "global_batch"),
        help="sequences per optimizer step (default dp·micro)",
    ),
    Field(
        name="tokens",
        group="recipe",
        type=float,
        positive=True,
        default=_default(Recipe, "tokens"),
        help="tokens to train for (time, cost, energy)",
    ),
    Field(
        name="recompute",
        group="recipe",
        default=_default(Recipe, "recompute"),
        choices=RECOMPUTES,
        searchable=True,
        help="activation recompute: none; selective (the attention core, Korthikanti et al. 2022); full "
        "(each block again); sac (torchtitan's per-op selective checkpointing: every other matmul "
        "output and the attention output kept, the rest recomputed)",
    ),
    ENGINE,
    Field(
        name="stack",
        group="recipe",
        choices=STACKS,
        help="training software, for the calibrated compute efficiency: megatron (Megatron-Core, NeMo, "
        "Megatron Bridge, on CUDA or ROCm), pytorch (torchtitan, torchtune, FSDP/FSDP2, llm-foundry, "
        "Accelerate), deepspeed (DeepSpeed ZeRO on transformers modules: OpenRLHF, DeepSpeed-Chat), "
        "maxtext (JAX/XLA: MaxText on TPU) or neuron (AWS Neuron SDK on Trainium) (default: the engine's)",
    ),
    Field(
        name="recompute_every",
        group="recipe",
        type=int,
        positive=True,
        default=_default(Recipe, "recompute_every"),
        metavar="N",
        help="with --recompute full, checkpoint only every N-th block of each pipeline stage, the others "
        "keeping all activations (torchtitan selective_ac_option = N; default 1, every block)",
    ),
    Field(
        name="recompute_layers",
        group="recipe",
        type=int,
        default=_default(Recipe, "recompute_layers"),
        metavar="N",
        help="with --recompute full on the megatron stack, recompute only the first N blocks of each "
        "pipeline stage, the others keeping all activations (Megatron-LM --recompute-method block "
        "--recompute-num-layers N; default 0, every block)",
    ),
    _engine_switch(
        "recompute_early_stop",
        "recipe",
        "full (or sac) recompute by PyTorch's non-reentrant checkpoint with early stop (FSDP2, "
        "torchtune, Accelerate): the trailing GEMM no saved tensor needs is not recomputed",
    ),
    _engine_switch(
        "kbit_fp32_upcast",
        "recipe",
        "QLoRA prepared by PEFT's prepare_model_for_kbit_training (the Hugging Face Trainer path): "
        "embedding, LM head and norms cast to FP32, so the residual stream and the block inputs a "
        "checkpoint keeps are FP32 (applies to --method qlora)",
    ),
    _engine_switch(
        "torch_compile",
        "recipe",
        "the model under torch.compile: fused elementwise kernels; without it the pytorch stack runs "
        "RMSNorm, rotary embeddings and gated activations as eager chains of kernels (pytorch stack only)",
    ),
    _engine_switch(
        "softmax_fp32",
        "recipe",
        "eager attention with the softmax in FP32 (Hugging Face transformers eager_attention_forward): its FP32 "
        "output and a 16-bit copy saved per score (applies to --attention eager)",
    ),
    _switch(
        "logits_shift_copy",
        "recipe",
        "the loss of Hugging Face transformers 4.46-4.49 (ForCausalLMLoss): an FP32 contiguous copy of "
        "the shifted logits alive with their 16-bit and FP32 forms while cross-entropy runs "
        "(4.50 and later make no copy)",
    ),
    _switch(
        "fused_cross_entropy",
        "recipe",
        "cross-entropy by a fused kernel on the 16-bit logits (flash-attn's CrossEntropyLoss, llm-foundry's "
        "loss_fn: fused_crossentropy): no FP32 log-softmax (pytorch stack, --tp 1)",
    ),
    _switch(
        "fp8_params",
        "recipe",
        "Transformer Engine FP8 weights (te.fp8_model_init; Megatron-LM --fp8-param-gather, NeMo fp8_params): "
        "a frozen LoRA base in 1 byte per parameter, the gathered weights in FP8 (megatron stack, --precision fp8)",
    ),
    _switch(
        "fp8_activation_store",
        "recipe",
        "Megatron-Core activation_func_fp8_input_store: the SwiGLU saves its input in FP8 (megatron stack, "
        "--precision fp8 or fp4)",
    ),
    _switch(
        "fp8_attention",
        "recipe",
        "Transformer Engine FP8 dot-product attention (cuDNN FP8 forward and backward, at the FP8 / BF16 "
        "ratios NVIDIA's cuDNN benchmarks measure; q, k, v saved in FP8) (megatron stack, --precision fp8 or fp4)",
    ),
    _switch(
        "triton_attention",
        "recipe",
        "flash attention by FlashAttention in Triton (flash-attention's flash_attn_triton.py; llm-foundry "
        "attn_impl: triton): FlashAttention-2's speed times Dao 2023's published ratio (1/1.4 forward, "
        "1/2 backward, A100)",
    ),
    Field(
        name="attention",
        group="recipe",
        default=_default(Recipe, "attention"),
        choices=ATTENTIONS,
        help="attention kernel: flash (no s² scores kept: FlashAttention-2/3, or PyTorch SDPA's flash and "
        "memory-efficient kernels, Hugging Face attn_implementation sdpa / flash_attention_2) or eager",
    ),
    Field(
        name="offload",
        group="recipe",
        default=_default(Recipe, "offload"),
        choices=OFFLOADS,
        searchable=True,
        help="model states kept in host memory: none, the optimizer states, or those and the parameters",
    ),
    Field(
        name="lora_rank",
        group="recipe",
        type=int,
        positive=True,
        help=f"LoRA rank r, alpha = 2r (default {_default(LoRASpec, 'rank')}; needs --method lora or qlora)",
    ),
    Field(
        name="lora_targets",
        group="recipe",
        help="comma-separated modules among " + ",".join(LORA_TARGETS),
    ),
    _switch("no_double_quant", "recipe", "QLoRA without double quantization"),
    Field(
        name="dropout",
        group="recipe",
        type=float,
        default=_default(Recipe, "dropout"),
        help="dropout probability (stores 1-byte masks)",
    ),
    _switch(
        "no_master_weights",
        "recipe",
        "pure 16-bit training: no FP32 master copy, optimizer states in the weight dtype",
    ),
    Field(
        name="loss_chunks",
        group="recipe",
        type=int,
        positive=True,
        default=_default(Recipe, "loss_chunks"),
        help="chunked cross-entropy: LM head and FP32 upcast per sequence chunk (torchtune: 8)",
    ),
    _switch(
        "optimizer_in_backward",
        "recipe",
        "step each parameter during backward and free its gradient (torchtune optimizer_in_bwd)",
    ),
    _switch(
        "paged_optimizer",
        "recipe",
        "optimizer states in CUDA unified memory (bitsandbytes Paged*), outside the allocator",
    ),
    Field(
        name="moe_capacity_factor",
        group="recipe",
        type=float,
        positive=True,
        metavar="CF",
        help="token-dropping MoE on capacity-padded expert buffers: each expert computes "
        "int(ceil(S*K/E)*CF) token slots per sequence, filled or not (MaxText capacity_factor; Megatron "
        "--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity); default: dropless",
    ),
    Field(
        name="mtp_layers",
        group="recipe",
        type=int,
        default=_default(Recipe, "mtp_layers"),
        metavar="D",
        help="multi-token prediction modules trained after the decoder (DeepSeek-V3; Megatron-Core "
        "--mtp-num-layers): D more layers on the last pipeline stage and D more LM-head losses; megatron "
        "stack, full training (default 0)",
    ),
    Field(
        name="recompute_modules",
        group="recipe",
        metavar="LIST",
        help="with --recompute selective on the megatron stack: comma-separated Megatron-Core modules to "
        "recompute among " + ",".join(RECOMPUTE_MODULES) + " (--recompute-modules; default core_attn)",
    ),
    Field(
        name="moe_dispatch",
        group="recipe",
        default=_default(Recipe, "moe_dispatch"),
        choices=MOE_DISPATCHES,
        help="how MoE tokens reach their experts: gather (index permutation and grouped GEMMs: Megatron, "
        "torchtitan, Hugging Face, MaxText sparse_matmul) or einsum (GShard one-hot dispatch and combine "
        "matmuls, MaxText sparse_matmul=False; needs --moe-capacity-factor)",
    ),
)

# --- RLHF and preference training (trainplan.rlhf; refused with other methods) -------------------
RLHF_FIELDS: Final = (
    Field(
        name="actor",
        group="rlhf",
        choices=RLHF_ACTORS,
        help="how ppo/grpo/dpo train the policy: full (default), or LoRA / QLoRA adapters "
        "(--lora-rank, --lora-targets set them)",
    ),
    Field(
        name="reward_model",
        group="rlhf",
        help="ppo/grpo reward model: a preset or config.json (default: the policy's architecture), "
        "or 'none' for a rule-based reward",
    ),
    Field(
        name="critic_model",
        group="rlhf",
        help="ppo critic: a preset or config.json (default: the reward model's architecture, "
        "which initialises it)",
    ),
    Field(
        name="critic_zero",
        group="rlhf",
        type=int,
        choices=ZERO_STAGES,
        help="ppo, colocated: the critic's ZeRO stage when not the actor's (DeepSpeed-Chat "
        "--critic_zero_stage; default: --zero)",
    ),
    Field(
        name="critic_offload",
        group="rlhf",
        choices=OFFLOADS,
        help="ppo, colocated: what the critic keeps in host memory when not the actor's (DeepSpeed-Chat "
        "--offload on a ZeRO-3 critic: optimizer+params; default: --offload)",
    ),
    Field(
        name="reference",
        group="rlhf",
        choices=RLHF_REFERENCES,
        help="reference policy: model (a frozen copy, default), precomputed (dpo log-probs), "
        "none (grpo without KL), lora-base (the LoRA actor's frozen base, TRL/Unsloth)",
    ),
    Field(
        name="group_size", group="rlhf", type=int, positive=True, help="grpo samples per prompt (default 1)"
    ),
    Field(
        name="prompt_len",
        group="rlhf",
        type=int,
        positive=True,
        help="ppo/grpo prompt tokens (default: --seq-len minus --gen-len)",
    ),
    Field(
        name="gen_len",
        group="rlhf",
        type=int,
        positive=True,
        help="ppo/grpo generated tokens per sequence (default: half of --seq-len)",
    ),
    Field(
        name="rollout_tp",
        group="rlhf",
        type=int,
        positive=True,
        help="tensor-parallel size of each rollout engine (default 1; engines = devices / rollout-tp)",
    ),
    Field(
        name="rollout_engine_mem_fraction",
        group="rlhf",
        type=float,
        positive=True,
        help="share of device memory the rollout engine takes for weights and KV cache "
        "(vLLM gpu_memory_utilization; default 0.3, TRL's colocated default)",
    ),
    Field(
        name="rollout_concurrency",
        group="rlhf",
        type=int,
        positive=True,
        help="most sequences an engine generates at once (vLLM max_num_seqs, HF generate micro-batch; "
        "default: what the KV budget holds)",
    ),
    Field(
        name="response_len_mean",
        group="rlhf",
        type=int,
        positive=True,
        help="ppo/grpo mean generated tokens per response, responses stopping at EOS (default: every "
        "response runs to --gen-len); continuous-batching engines (vllm, hybrid) refill freed slots",
    ),
    Field(
        name="rollout_engine",
        group="rlhf",
        choices=RLHF_ENGINES,
        help="vllm (own weight copy, default), hybrid (the trainer's weights gathered into the engine "
        "layout: DeepSpeed Hybrid Engine, verl), trainer (HF generate in the training layout, per-step "
        "ZeRO-3 gathers: OpenRLHF without vLLM, DeepSpeed-Chat without the Hybrid Engine)",
    ),
    _switch(
        "rollout_eager",
        "rlhf",
        "ppo/grpo: the inference engine launches its kernels eagerly each decode step, no CUDA graph "
        "(DeepSpeed Hybrid Engine, vLLM/verl enforce_eager): a per-layer host floor; HF generate "
        "(--rollout-engine trainer) always is",
    ),
    _switch(
        "sequence_packing",
        "rlhf",
        "ppo/grpo: scoring and training run over each sequence's real tokens, packed (OpenRLHF "
        "--packing_samples, verl use_remove_padding, NeMo RL sequence_packing): timed at --prompt-len + "
        "--response-len-mean, memory at --seq-len; needs --response-len-mean and flash attention",
    ),
    Field(
        name="train_batch",
        group="rlhf",
        type=int,
        positive=True,
        help="sequences (ppo/grpo) or pairs (dpo/rm) per optimizer update; the step's batch is cut "
        "into several updates (OpenRLHF --train_batch_size; default: one update per step)",
    ),
    Field(
        name="placement",
        group="rlhf",
        choices=RLHF_PLACEMENTS,
        help="colocated (every model resident on all devices, default), offload-between-phases "
        "(each phase loads its own models: vLLM/DeepSpeed sleep), disaggregated (a device group per "
        "model and for the rollout engine, --groups: OpenRLHF Ray, NeMo RL, verl)",
    ),
    Field(
        name="groups",
        group="rlhf",
        metavar="ROLE=N,...",
        help="disaggregated device groups, e.g. actor=4,critic=4,ref=2,reward=2,rollout=4; '+' shares a "
        "group (actor+ref=4), :tpN/:ppN/:zeroN give a group its own layout; no rollout group: the actor's "
        "group generates (--rollout-engine trainer)",
    ),
)
"""The RLHF settings of ``estimate`` (:func:`build_rlhf` builds them)."""

# --- cost -----------------------------------------------------------------------------------------
COST_FIELDS: Final = (
    Field(
        name="price",
        group="cost",
        type=float,
        positive=True,
        help="USD per device-hour (overrides the catalog)",
    ),
    Field(
        name="provider",
        group="cost",
        help="price at this provider's dated catalog offering (e.g. AWS, CoreWeave, Nebius, RunPod)",
    ),
    Field(
        name="price_kind",
        group="cost",
        choices=PRICE_KINDS,
        help="price at this kind of offering (default: on-demand, else the accelerator's other kinds; "
        "'estimate' is a rate a named report states, not a provider's price)",
    ),
    Field(
        name="max_price_age",
        group="cost",
        type=int,
        positive=True,
        metavar="DAYS",
        help="use only catalog prices dated at most this many days ago",
    ),
    Field(
        name="pue",
        group="cost",
        type=float,
        default=DEFAULT_PUE,
        help="data-centre power usage effectiveness for energy (>= 1)",
    ),
)

# --- goodput (trainplan.goodput) --------------------------------------------------------------------
GOODPUT_FIELDS: Final = (
    Field(
        name="device_mtbf",
        group="cost",
        type=float,
        positive=True,
        default=DEFAULT_RELIABILITY.device_mtbf_h,
        metavar="HOURS",
        help="device-hours between unexpected interruptions, per device "
        "(default: Llama 3 405B's 419 in 54 days on 16,384 GPUs)",
    ),
    Field(
        name="checkpoint_bandwidth",
        group="cost",
        type=float,
        positive=True,
        default=DEFAULT_RELIABILITY.checkpoint_bytes_per_s_per_device / 1e6,
        metavar="MB/S",
        help="checkpoint write bandwidth per device, MB/s (default: Llama 3's 2 TB/s for 16,384 GPUs)",
    ),
    Field(
        name="restart_time",
        group="cost",
        type=float,
        default=DEFAULT_RELIABILITY.restart_s / 60,
        metavar="MIN",
        help="minutes to re-schedule and initialise after an interruption, before reading the checkpoint",
    ),
    Field(
        name="checkpoint_interval",
        group="cost",
        type=float,
        positive=True,
        metavar="MIN",
        help="minutes of training between checkpoints (default: the Young/Daly optimum)",
    ),
    _switch(
        "no_goodput",
        "cost",
        "time-to-train of the steps alone: no interruptions, checkpoints or restarts",
    ),
)


def check_no_rlhf_fields(values: Mapping[str, Any], method: str) -> None:
    """Refuse an RLHF field given with a method that is not an RL / preference method (estimate,
    plan and compare alike). A field is given unless it is absent or an unset switch (0 is a
    value: ``--critic-zero 0``)."""
    given = [
        f.name for f in RLHF_FIELDS if values.get(f.name) is not None and values.get(f.name) is not False
    ]
    if given:
        raise TrainplanError(
            given[0],
            f"--{given[0].replace('_', '-')} is an RLHF setting; use --method ppo, grpo, dpo or rm "
            f"(the method is {method})",
        )


def build_rlhf(values: Mapping[str, Any], policy: ModelSpec, recipe: Recipe) -> RLHFSpec | None:
    """The :class:`~trainplan.rlhf.RLHFSpec` the RLHF fields describe (``None`` for other methods,
    where any RLHF field given is an error naming it)."""
    from trainplan.models import load_model
    from trainplan.rlhf import RLHFSpec, is_rlhf, seq_lengths
    from trainplan.rlhf_groups import DEDICATED_ENGINE_MEM_FRACTION, parse_groups

    method = recipe.method
    if not is_rlhf(method):
        check_no_rlhf_fields(values, method)
        return None
    rollout = method in ("ppo", "grpo")
    reward = values.get("reward_model")
    if reward is None:
        reward_model = policy if rollout else None
    elif reward == "none":
        reward_model = None
    else:
        reward_model = load_model(reward)
    critic = values.get("critic_model")
    actor: Any = values.get("actor") or "full"
    prompt, gen = seq_lengths(method, recipe.seq_len, values.get("prompt_len"), values.get("gen_len"))
    optional: dict[str, Any] = {
        k: values[k]
        for k in (
            "group_size",
            "rollout_tp",
            "rollout_engine_mem_fraction",
            "rollout_concurrency",
            "response_len_mean",
            "train_batch",
            "critic_zero",
            "critic_offload",
        )
        if values.get(k) is not None
    }
    if values.get("placement") == "disaggregated" and values.get("rollout_engine_mem_fraction") is None:
        optional["rollout_engine_mem_fraction"] = DEDICATED_ENGINE_MEM_FRACTION
    return RLHFSpec(
        method=method,
        actor=actor,
        lora=build_lora(values) if actor != "full" else None,
        reward_model=reward_model if not (method in ("dpo", "rm") and reward is None) else None,
        critic_model=load_model(critic) if critic is not None else None,
        reference=values.get("reference") or ("none" if method == "rm" else "model"),
        prompt_len=prompt,
        gen_len=gen,
        rollout_engine=values.get("rollout_engine") or "vllm",
        rollout_eager=bool(values.get("rollout_eager")),
        sequence_packing=bool(values.get("sequence_packing")),
        placement=values.get("placement") or "colocated",
        groups=parse_groups(values["groups"]) if values.get("groups") else (),
        **optional,
    )


def build_reliability(values: Mapping[str, Any]) -> Reliability | None:
    """The :class:`~trainplan.goodput.Reliability` the goodput fields describe (``None``: --no-goodput).

    The goodput fields shape the time-to-train alone: without ``--tokens`` they are refused."""
    if "tokens" in values and values["tokens"] is None:
        given_any = [
            f.name
            for f in GOODPUT_FIELDS
            if (v := values.get(f.name)) is not None
            and v is not False
            and not (v == f.default and type(v) is type(f.default))
        ]
        if given_any:
            raise TrainplanError(
                given_any[0],
                f"--{given_any[0].replace('_', '-')} shapes the time to train, which needs --tokens; "
                "give --tokens or drop it",
            )
    if values.get("no_goodput", False):
        given = [
            f.name
            for f in GOODPUT_FIELDS
            if f.name != "no_goodput" and f.name in values and values[f.name] != f.default
        ]
        if given:
            raise TrainplanError(
                given[0], f"--{given[0].replace('_', '-')} has no effect with --no-goodput; drop one of them"
            )
        return None
    interval = values.get("checkpoint_interval")
    return Reliability(
        device_mtbf_h=values.get("device_mtbf", DEFAULT_RELIABILITY.device_mtbf_h),
        checkpoint_bytes_per_s_per_device=values.get(
            "checkpoint_bandwidth", DEFAULT_RELIABILITY.checkpoint_bytes_per_s_per_device / 1e6
        )
        * 1e6,
        restart_s=values.get("restart_time", DEFAULT_RELIABILITY.restart_s / 60) * 60.0,
        checkpoint_interval_s=None if interval is None else interval * 60.0,
    )


# --- plan and compare -----------------------------------------------------------------------------
PLAN_HARDWARE: Final = Field(
    name="hardware",
    group="hardware",
    default="any",
    help="'any' (the whole catalog) or comma-separated accelerator names",
)
COMPARE_HARDWARE: Final = Field(
    name="hardware", group="hardware", required=True, help="comma-separated accelerators to compare"
)
PLAN_DEVICES: Final = Field(
    name="devices",
    group="plan",
    searchable=True,
    help="comma-separated device counts to consider (default: 1,2,4 and node/domain multiples)",
)
COMPARE_DEVICES: Final = Field(
    name="devices",
    group="plan",
    type=int,
    positive=True,
    searchable=True,
    help="fixed device count (default: searched)",
)
PLAN_CONSTRAINTS: Final = (
    Field(name="budget", group="plan", type=float, positive=True, help="maximum cost of the run, USD"),
    Field(name="deadline", group="plan", type=float, positive=True, help="maximum time to train, hours"),
    Field(name="top", group="plan", type=int, positive=True, default=5, help="how many ranked plans to show"),
)
SEARCH_FIELDS: Final = (
    Field(
        name="max_devices",
        group="plan",
        type=int,
        positive=True,
        default=DEFAULT_MAX_DEVICES,
        help=f"largest device count searched (default {DEFAULT_MAX_DEVICES})",
    ),
    Field(
        name="objective",
        group="plan",
        default="time",
        choices=OBJECTIVES,
        help="rank by time, cost or both",
    ),
    Field(
        name="precisions",
        group="plan",
        default="bf16",
        help="precisions the search may use when --precision is not given (comma-separated, default bf16)",
    ),
    Field(
        name="device_price",
        group="plan",
        repeatable=True,
        default=[],
        metavar="NAME=USD",
        help="price of one accelerator in USD per device-hour (repeatable; overrides the catalog)",
    ),
)

# --- export, verify, run --------------------------------------------------------------------------
EXPORT_FIELDS: Final = (
    Field(
        name="to",
        group="export",
        choices=EXPORT_TARGETS,
        help="target engine (see docs/export.md; default: the --engine's export target)",
    ),
    Field(name="output", group="export", metavar="FILE", help="write here instead of stdout"),
    Field(
        name="plan",
        group="export",
        metavar="FILE",
        help="export a saved plan (`trainplan plan --json` output) instead of a model, --hardware and flags",
    ),
    Field(
        name="rank",
        group="export",
        type=int,
        positive=True,
        help="with --plan: the ranked plan to export (default: the first one a target can write)",
    ),
)
PLAN_EXPORT_FIELDS: Final = (
    Field(
        name="export",
        group="export",
        choices=(*EXPORT_TARGETS, "engine"),
        help="also write the best ranked plan the target can run as its config (engine: the --engine's "
        "target); ranked plans ahead of it that it cannot run are named",
    ),
    Field(
        name="export_file",
        group="export",
        metavar="FILE",
        help="with --export: write the config here (default: the target's file name)",
    ),
)
VERIFY_FIELDS: Final = (
    Field(
        name="depth",
        group="verify",
        type=int,
        positive=True,
        help="trace this many layers (default: all)",
    ),
    Field(
        name="device",
        group="verify",
        default="fake",
        choices=("fake", "cuda"),
        help="fake: FakeTensorMode on CPU (exact, no memory)",
    ),
)
RUN_FIELDS: Final = (
    Field(
        name="steps",
        group="run",
        type=int,
        positive=True,
        default=8,
        help="optimizer steps to train (default 8)",
    ),
    Field(
        name="warmup",
        group="run",
        type=int,
        default=1,
        help="first steps left out of the median step time (default 1)",
    ),
    Field(
        name="device",
        group="run",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="cuda (NCCL) or cpu (gloo); auto picks cuda when PyTorch sees a GPU",
    ),
    Field(name="lr", group="run", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)"),
    Field(name="seed", group="run", type=int, default=0, help="seed of the weights and the synthetic data"),
    Field(
        name="timeout",
        group="run",
        type=float,
        metavar="SECONDS",
        help="stop the run after this long",
    ),
    _switch("verbose", "run", "stream torchrun's and the workers' output"),
)

# --- output (CLI only: how the answer is printed) -------------------------------------------------
# --- buy or rent (trainplan.ownership) -------------------------------------------------------------
OWN_FIELDS: Final = (
    Field(
        name="devices",
        group="own",
        type=int,
        positive=True,
        help="accelerators to own or rent (default: one server of the catalog's devices per node)",
    ),
    Field(
        name="node_price",
        group="own",
        type=float,
        positive=True,
        metavar="USD",
        help="purchase price of one server (default: the catalog's accelerator price × devices per "
        "node + 25%)",
    ),
    Field(
        name="years",
        group="own",
        type=float,
        positive=True,
        default=DEFAULT_YEARS,
        help="amortisation period, years",
    ),
    Field(
        name="utilisation",
        group="own",
        type=float,
        positive=True,
        default=DEFAULT_UTILISATION,
        help="fraction of the hours the accelerators train (0 < u <= 1)",
    ),
    Field(
        name="usd_per_kwh",
        group="own",
        type=float,
        positive=True,
        default=DEFAULT_USD_PER_KWH,
        help="electricity price, USD per kWh",
    ),
    Field(
        name="usd_per_kw_month",
        group="own",
        type=float,
        positive=True,
        default=DEFAULT_USD_PER_KW_MONTH,
        help="space and cooling (colocation) per kW of IT load per month, USD",
    ),
    Field(
        name="network_fraction",
        group="own",
        type=float,
        default=DEFAULT_NETWORK_FRACTION,
        help="scale-out network per server as a fraction of its price",
    ),
)

JSON: Final = _switch("json", "output", "print one JSON object with stable keys")
GIB: Final = _switch("gib", "output", "print sizes in GiB (2^30) instead of GB (10^9)")
PLOT: Final = Field(
    name="plot",
    group="output",
    metavar="FILE",
    help="also save a plot (.png or .svg; needs trainplan[plot])",
)


def open_for_search(fields: Iterable[Field]) -> tuple[Field, ...]:
    """``fields`` as a plan request takes them: each searchable one defaults to ``None`` (searched)."""
    return tuple(dataclasses.replace(f, default=None) if f.searchable else f for f in fields)


ESTIMATE_FIELDS: Final = (
    *SYSTEM_FIELDS,
    *LAYOUT_FIELDS,
    *RECIPE_FIELDS,
    *RLHF_FIELDS,
    *COST_FIELDS,
    *GOODPUT_FIELDS,
)
"""The layout, recipe and cost fields of ``estimate`` (the keywords of :func:`trainplan.estimate`)."""
PLAN_FIELDS: Final = (
    PLAN_HARDWARE,
    PLAN_DEVICES,
    *PLAN_CONSTRAINTS,
    HARDWARE_FILE,
    *SYSTEM_FIELDS,
    *SEARCH_FIELDS,
    *open_for_search(RECIPE_FIELDS),
    *LAYOUT_OPTION_FIELDS,
    *RLHF_FIELDS,
    *COST_FIELDS,
    *GOODPUT_FIELDS,
)
"""Every field of ``plan`` but the model, in CLI order."""
COMPARE_FIELDS: Final = (
    COMPARE_HARDWARE,
    COMPARE_DEVICES,
    HARDWARE_FILE,
    *SYSTEM_FIELDS,
    *SEARCH_FIELDS,
    *open_for_search(RECIPE_FIELDS),
    *LAYOUT_OPTION_FIELDS,
    *RLHF_FIELDS,
    *COST_FIELDS,
    *GOODPUT_FIELDS,
)
"""Every field of ``compare`` but the model, in CLI order."""
CHOOSE_FIELDS: Final = (
    PLAN_HARDWARE,
    COMPARE_DEVICES,
    *(f for f in PLAN_CONSTRAINTS if f.name != "top"),
    HARDWARE_FILE,
    *SYSTEM_FIELDS,
    *(f for f in SEARCH_FIELDS if f.name != "objective"),
    *open_for_search(RECIPE_FIELDS),
    *LAYOUT_OPTION_FIELDS,
    *RLHF_FIELDS,
    *COST_FIELDS,
    *GOODPUT_FIELDS,
)
"""Every field of ``choose`` but the model: ``compare``'s, over the whole catalog by default, with
a deadline and a budget (it ranks by time and by cost itself)."""
COMMANDS: Final[dict[str, tuple[Field, ...]]] = {
    "estimate": (MODEL, HARDWARE, HARDWARE_FILE, *ESTIMATE_FIELDS, JSON, GIB, PLOT),
    "plan": (MODEL, *PLAN_FIELDS, *PLAN_EXPORT_FIELDS, JSON, PLOT),
    "compare": (MODEL, *COMPARE_FIELDS, JSON, PLOT),
    "choose": (MODEL, *CHOOSE_FIELDS, JSON),
    "export": (
        dataclasses.replace(MODEL, optional=True),
        dataclasses.replace(HARDWARE, required=False),
        HARDWARE_FILE,
        *LAYOUT_FIELDS,
        *RECIPE_FIELDS,
        *EXPORT_FIELDS,
    ),
    "cost": (
        dataclasses.replace(HARDWARE, positional=True, required=False),
        HARDWARE_FILE,
        *OWN_FIELDS,
        *COST_FIELDS,
        JSON,
    ),
    "verify": (MODEL, *LAYOUT_FIELDS, *RECIPE_FIELDS, *VERIFY_FIELDS, JSON),
    "run": (
        MODEL,
        dataclasses.replace(
            HARDWARE, help="accelerator the prediction is for (see `trainplan hardware list`)"
        ),
        HARDWARE_FILE,
        *LAYOUT_FIELDS,
        *RECIPE_FIELDS,
        *RUN_FIELDS,
        JSON,
    ),
}
"""The fields of each command that reads a model, a layout and a recipe, in CLI order."""


def _same(a: Field, b: Field) -> bool:
    """One declaration: equal but for the default a plan request opens (:func:`open_for_search`)."""
    return a.name == b.name and a.help == b.help and a.group == b.group


def _distinct(commands: Mapping[str, Sequence[Field]]) -> tuple[Field, ...]:
    out: list[Field] = []
    for fields in commands.values():
        out.extend(f for f in fields if not any(_same(f, o) for o in out))
    return tuple(out)


def all_fields() -> tuple[Field, ...]:
    """Every field of every command, once each; ``devices``, ``hardware`` and ``device`` have one
    declaration per meaning (estimate's device count, plan's list of counts, ...)."""
    return _distinct(COMMANDS)


GROUP_TITLES: Final[dict[Group, str]] = {
    "layout": "layout",
    "recipe": "recipe",
    "rlhf": "rlhf (ppo, grpo, dpo, rm)",
    "cost": "cost",
    "own": "buy or rent",
    "run": "run",
}


# --- argparse -------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser, fields: Sequence[Field]) -> None:
    """Add ``fields`` to ``parser`` as flags, in order; the layout, recipe, cost and run fields go
    into argument groups of those titles (as ``--help`` lists them)."""

    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields:
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        title = GROUP_TITLES.get(f.group)
        if title is not None:
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            target = groups[title]
        kw: dict[str, Any] = {
            "help": f.help.replace("%", "%%") if f.help else None
        }  # argparse formats help with %
        if f.type is bool:
            if f.default is None:
                import argparse

                target.add_argument(f.option, action=argparse.BooleanOptionalAction, default=None, **kw)
            else:
                target.add_argument(f.option, action="store_true", **kw)
            continue
        if f.metavar is not None:
            kw["metavar"] = f.metavar
        if f.choices is not None:
            kw["choices"] = f.choices
        if f.type is not str:
            kw["type"] = _argparse_type(f)
        if f.positional:
            if f.optional:
                kw["nargs"] = "?"
            target.add_argument(f.name, **kw)
            continue
        if f.repeatable:
            kw["action"] = "append"
        if f.required:
            kw["required"] = True
        else:
            kw["default"] = list(f.default) if isinstance(f.default, list) else f.default
        target.add_argument(f.option, **kw)


def _argparse_type(f: Field) -> Any:
    """``int`` itself (argparse's own messages), else a converter whose errors argparse prints
    as they are: positive numbers, and every float, which must be finite (``--pue inf``)."""
    if not f.positive and f.type is not float:
        return f.type
    import argparse

    def convert(text: str) -> object:
        try:
            return f.convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = f"{'positive' if f.positive else 'finite'}_{f.type.__name__}"
    return convert


# --- values ---------------------------------------------------------------------------------------
def read(
    values: Mapping[str, object], fields: Sequence[Field], *, also: Iterable[str] = ()
) -> dict[str, Any]:
    """Each field's value from ``values`` (checked by :meth:`Field.parse`), its default where
    absent or ``None``. A key that is neither a field nor in ``also`` is an error naming it."""
    by_name = {f.name: f for f in fields}
    allowed = set(also)
    for key in values:
        if key not in by_name and key not in allowed:
            raise TrainplanError(key, unknown_message(key, by_name))
    return {f.name: f.parse(values.get(f.name)) for f in fields}


def unknown_message(key: str, known: Iterable[str]) -> str:
    """What to say about an unknown field ``key``: the close names, else where the list is."""
    import difflib

    close = difflib.get_close_matches(key, list(known), n=3)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"unknown field {key!r}; {hint}the fields are listed in docs/api.md and GET /api/openapi.json"


def names(value: object, field: str) -> list[str]:
    """A list of names (or numbers) from a JSON/Python list or the CLI's comma-separated text."""
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, list | tuple) and all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        return [str(v).strip() for v in value if str(v).strip()]
    raise TrainplanError(field, "expected a list of names (or comma-separated text)")


def fill_defaults(values: Mapping[str, object], fields: Sequence[Field]) -> dict[str, object]:
    """``values`` with each of ``fields`` that is ``None`` replaced by its estimate default
    (what a plan request's open recipe fields are when the planner does not search them)."""
    out = dict(values)
    for f in fields:
        if out.get(f.name) is None:
            out[f.name] = f.default
    return out


def build_recipe(values: Mapping[str, Any]) -> Recipe:
    """The :class:`~trainplan.recipe.Recipe` the recipe fields in ``values`` describe.

    ``lora_rank``, ``lora_targets`` and ``no_double_quant`` build its
    :class:`~trainplan.recipe.LoRASpec` (alpha = 2 × rank); validation is the dataclasses'.
    """
    method = values["method"]
    rank = values.get("lora_rank")
    targets = values.get("lora_targets")
    no_double_quant = values.get("no_double_quant", False)
    lora = None
    qlora_actor = method in RLHF_METHODS and values.get("actor") == "qlora"
    if no_double_quant and method != "qlora" and not qlora_actor:
        raise TrainplanError(
            "no_double_quant",
            f"--no-double-quant describes QLoRA's 4-bit quantization constants; it needs --method qlora, "
            f"not {method}; drop it or use --method qlora",
        )
    if method in ("lora", "qlora"):
        rank = rank if rank is not None else _default(LoRASpec, "rank")
        if targets is not None and not str(targets).strip():
            raise TrainplanError("lora_targets", "empty; name modules among " + ",".join(LORA_TARGETS))
        lora = LoRASpec(
            rank=rank,
            alpha=2.0 * rank,
            targets=tuple(t.strip() for t in targets.split(",")) if targets else LORA_TARGETS,
            double_quant=not no_double_quant,
        )
    elif (rank is not None or targets is not None) and (
        method not in RLHF_METHODS or values.get("actor") not in ("lora", "qlora")
    ):
        field = "lora_rank" if rank is not None else "lora_targets"
        raise TrainplanError(
            field,
            f"--lora-rank/--lora-targets need --method lora or qlora (or an RLHF method with "
            f"--actor lora), not {method}; drop them or add --method lora",
        )
    applied = engine_settings(values)
    check_capabilities(applied, recompute=values.get("recompute"), zero=None)
    _check_recipe_flags_apply(values)
    return Recipe(
        method=method,
        precision=values["precision"],
        optimizer=values["optimizer"],
        seq_len=values["seq_len"],
        micro_batch=values["micro_batch"],
        global_batch=values.get("global_batch"),
        tokens=values.get("tokens"),
        recompute=values["recompute"],
        attention=values["attention"],
        offload=values["offload"],
        lora=lora,
        dropout=values["dropout"],
        master_weights=not values.get("no_master_weights", False),
        loss_chunks=values["loss_chunks"],
        optimizer_in_backward=values.get("optimizer_in_backward", False),
        paged_optimizer=values.get("paged_optimizer", False),
        recompute_early_stop=bool(applied.values["recompute_early_stop"]),
        # the engine's k-bit path applies to QLoRA; given by flag with another method it is refused
        kbit_fp32_upcast=bool(applied.values["kbit_fp32_upcast"])
        and (method == "qlora" or "kbit_fp32_upcast" in applied.explicit),
        logits_shift_copy=bool(values.get("logits_shift_copy", False)),
        triton_attention=bool(values.get("triton_attention", False)),
        fused_cross_entropy=bool(values.get("fused_cross_entropy", False)),
        fp8_params=bool(values.get("fp8_params", False)),
        fp8_activation_store=bool(values.get("fp8_activation_store", False)),
        fp8_attention=bool(values.get("fp8_attention", False)),
        # the engine's eager-attention convention applies to eager attention; a flag with flash is refused
        softmax_fp32=bool(applied.values["softmax_fp32"])
        and (values["attention"] == "eager" or "softmax_fp32" in applied.explicit),
        # the engine's compile default means something on the pytorch stack only; a flag elsewhere is refused
        torch_compile=bool(applied.values["torch_compile"])
        and (applied.values["stack"] == "pytorch" or "torch_compile" in applied.explicit),
        recompute_every=values.get("recompute_every") or 1,
        recompute_layers=values.get("recompute_layers") or 0,
        stack=applied.values["stack"],  # type: ignore[arg-type]
        moe_capacity_factor=values.get("moe_capacity_factor"),
        moe_dispatch=values.get("moe_dispatch") or "gather",
        mtp_layers=values.get("mtp_layers") or 0,
        recompute_modules=_module_list(values.get("recompute_modules")),
    )


def _module_list(text: object) -> tuple[str, ...] | None:
    """``--recompute-modules a,b`` as a tuple (a list or tuple from JSON is taken as given)."""
    if text is None:
        return None
    if isinstance(text, list | tuple):
        return tuple(text)
    if not isinstance(text, str):
        raise TrainplanError("recompute_modules", f"must be comma-separated module names, got {text!r}")
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise TrainplanError("recompute_modules", "empty; name modules among " + ",".join(RECOMPUTE_MODULES))
    return names


def build_lora(values: Mapping[str, Any]) -> LoRASpec:
    """The adapters ``lora_rank``, ``lora_targets`` and ``no_double_quant`` describe (alpha = 2r)."""
    rank = values.get("lora_rank")
    rank = rank if rank is not None else _default(LoRASpec, "rank")
    targets = values.get("lora_targets")
    return LoRASpec(
        rank=rank,
        alpha=2.0 * rank,
        targets=tuple(t.strip() for t in targets.split(",")) if targets else LORA_TARGETS,
        double_quant=not values.get("no_double_quant", False),
    )


def engine_settings(values: Mapping[str, Any]) -> Applied:
    """The engine ``values`` names (the default when none) with each of its settings that
    ``values`` leaves unset filled in (:func:`trainplan.engines.resolve`)."""
    return resolve(values)


def _check_recipe_flags_apply(values: Mapping[str, Any]) -> None:
    """Recipe switches that would change nothing with the other values given are refused
    (a value left open for the planner, ``None``, is not judged)."""
    if values.get("no_master_weights") and values.get("precision") == "fp32":
        raise TrainplanError(
            "no_master_weights",
            "fp32 training keeps no separate master copy (the weights are fp32 already), so "
            "--no-master-weights changes nothing; drop it or use a 16-bit --precision",
        )
    if values.get("recompute_early_stop") and values.get("recompute") in ("none", "selective"):
        raise TrainplanError(
            "recompute_early_stop",
            f"--recompute-early-stop stops a recomputed forward early, and --recompute {values['recompute']} "
            "reruns no whole block forward, so it changes nothing; drop it, or use --recompute full or sac",
        )


def _check_layout_flags_apply(values: Mapping[str, Any], layout: Layout) -> None:
    """Layout options that would change nothing on this layout are refused with the reason (the
    options the request gives; an engine's own settings apply where they mean something):
    gradient synchronisation options without data or context parallelism, autograd gradient
    accumulation with one micro-batch per step (the main-gradient buffer of ``main_grad`` costs
    time even then). A ZeRO stage over one rank is answered: it is the stage a published
    config names, sharded over dp·cp = 1."""
    shards = layout.dp * layout.cp
    if shards == 1:
        if layout.zero == 3 and values.get("zero3_granularity") not in (None, "block"):
            raise TrainplanError(
                "zero3_granularity",
                "with dp·cp = 1 ZeRO-3 shards nothing and gathers nothing, so the gather granularity "
                "changes nothing; drop --zero3-granularity, or use more --devices",
            )
        if values.get("no_overlap_grad_reduce"):
            raise TrainplanError(
                "no_overlap_grad_reduce",
                "with dp·cp = 1 there is no gradient reduction to overlap; drop --no-overlap-grad-reduce, "
                "or use more --devices",
            )
    if values.get("pp_comm_overlap") is False and layout.pp == 1:
        raise TrainplanError(
            "pp_comm_overlap",
            "with pp = 1 there is no pipeline communication to overlap, so --no-pp-comm-overlap changes "
            "nothing; drop it, or add --pp N",
        )
    if values.get("tp_comm_overlap") is False and not layout.sequence_parallel:
        raise TrainplanError(
            "tp_comm_overlap",
            "tensor-parallel communication overlap exists only with sequence parallelism, so "
            "--no-tp-comm-overlap changes nothing here; drop it, or add --sequence-parallel",
        )
    global_batch, micro = values.get("global_batch"), values.get("micro_batch")
    one_micro_batch = global_batch is None or (isinstance(micro, int) and global_batch == layout.dp * micro)
    if one_micro_batch and values.get("grad_accumulation") == "autograd":
        raise TrainplanError(
            "grad_accumulation",
            "with one micro-batch per step autograd accumulates nothing (its first backward writes "
            ".grad as the fused GEMM does), so --grad-accumulation autograd changes nothing; drop it, "
            "or give a --global-batch above dp × micro-batch",
        )


def build_layout(values: Mapping[str, Any]) -> Layout:
    """The :class:`~trainplan.layout.Layout` the layout fields in ``values`` describe
    (dp = devices / (tp·pp·cp)).

    An option the request gives is used as given (and refused where the layout cannot have it);
    one the engine fills applies where it means something (``LayoutOptions.for_candidate``): the
    engine's tensor-parallel overlap with sequence parallelism, its pipeline overlap on the
    schedules it overlaps, its ZeRO-3 granularity with ZeRO-3."""
    options = build_layout_options(values)
    applied_engine = engine_settings(values)
    check_capabilities(applied_engine, recompute=None, zero=values["zero"])
    explicit = applied_engine.explicit
    sp = values.get("sequence_parallel", False)
    applied = options.for_candidate(
        sequence_parallel=sp, pp=values["pp"], zero=values["zero"], pp_schedule=values["pp_schedule"]
    )
    for name in ("tp_comm_overlap", "pp_comm_overlap", "zero3_granularity"):
        if name in explicit:
            applied[name] = getattr(options, name)
    applied["ep_comm_overlap"] = (
        options.ep_comm_overlap
    )  # given by flag: as given, refused where it cannot apply
    layout = Layout.for_devices(
        values["devices"],
        tp=values["tp"],
        pp=values["pp"],
        cp=values["cp"],
        ep=values["ep"],
        zero=values["zero"],
        sequence_parallel=sp,
        pp_schedule=values["pp_schedule"],
        virtual_stages=values["virtual_stages"],
        pp_split_embedding=values.get("pp_split_embedding", False),
        pp_split_head=values.get("pp_split_head", False),
        etp=values.get("etp"),
        **applied,  # type: ignore[arg-type]
    )
    _check_layout_flags_apply(values, layout)
    return layout


def build_layout_options(values: Mapping[str, Any]) -> LayoutOptions:
    """The :class:`~trainplan.layout.LayoutOptions` the option fields in ``values`` describe,
    each one left unset taken from the engine (:func:`engine_settings`)."""
    v = engine_settings(values).values
    pp_overlap = v["pp_comm_overlap"]
    return LayoutOptions(
        overlap_grad_reduce=bool(v["overlap_grad_reduce"]),
        tp_comm_overlap=bool(v["tp_comm_overlap"]),
        pp_comm_overlap=pp_overlap is True or pp_overlap in ("always", "interleaved"),
        pp_comm_overlap_schedules=("interleaved",) if pp_overlap == "interleaved" else PIPELINE_SCHEDULES,
        zero3_granularity=v["zero3_granularity"],  # type: ignore[arg-type]
        grad_accumulation=v["grad_accumulation"],  # type: ignore[arg-type]
        ep_comm_overlap=bool(values.get("ep_comm_overlap", False)),
    )


# --- docs ---------------------------------------------------------------------------------------
def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value)
    return f"`{json.dumps(value)}`"


def fields_markdown() -> str:
    """The table of every field in docs/api.md (tests/test_api.py checks it is current)."""
    lines = [
        "| field | CLI | type | default | choices | planner searches | commands | what |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in all_fields():
        commands = ", ".join(c for c, fields in COMMANDS.items() if any(_same(f, g) for g in fields))
        kind = ("list of " if f.repeatable else "") + f.type.__name__ + (" > 0" if f.positive else "")
        default = "required" if f.required or (f.positional and not f.optional) else _cell(f.default)
        if f.name in ENGINE_FIELDS and f.default is None:
            default = "the engine's"
        elif f.name == "engine":
            default = f"`{json.dumps(DEFAULT_ENGINE)}`"
        what = f.help.replace("|", "\\|")
        lines.append(
            f"| `{f.name}` | `{f.option}` | {kind} | {default} | {_cell(f.choices)} | "
            f"{'yes' if f.searchable else ''} | {commands} | {what} |"
        )
    return "\n".join(lines) + "\n"


def price_query(values: Mapping[str, Any]) -> PriceQuery:
    """The price filters (``--price-kind``, ``--provider``, ``--max-price-age``) of parsed values.

    They pick a catalog offering, so they contradict ``--price``, which replaces the catalog's:
    given together, the request is refused rather than the filters ignored."""
    given = [
        f"--{k.replace('_', '-')}"
        for k in ("provider", "price_kind", "max_price_age")
        if values.get(k) is not None
    ]
    if values.get("price") is not None and given:
        raise TrainplanError(
            "price",
            f"--price replaces the catalog's prices, so {', '.join(given)} would pick nothing; "
            "give --price alone, or drop it to price from the catalog's offerings",
        )
    return PriceQuery(
        kind=values.get("price_kind"),
        provider=values.get("provider"),
        max_age_days=values.get("max_price_age"),
    )
