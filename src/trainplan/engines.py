"""Training engines: what one ``--engine NAME`` sets, each setting with its version and source.

Users name the software they train with; the engine fills the settings that software decides
for them — the calibrated efficiency of its kernels (``Recipe.stack``), how its activation
checkpoint re-runs a block (``Recipe.recompute_early_stop``), how its ZeRO-3 / FSDP gathers
parameters (``Layout.zero3_granularity``), whether it overlaps the gradient reduction, the
tensor-parallel and the pipeline communication with compute, how it sums the micro-batches'
gradients (``Layout.grad_accumulation``) — and the export target that writes its config.

A flag given explicitly (``--stack``, ``--recompute-early-stop`` / ``--no-recompute-early-stop``,
``--tp-comm-overlap`` / ``--no-tp-comm-overlap``, ...) overrides the engine's value; the output
names the engine and what it set (:func:`resolve`). Without ``--engine`` the default engine,
:data:`DEFAULT_ENGINE`, is used and stated.

The registry is :data:`ENGINES`; :func:`register` adds one (a frozen :class:`Engine`).
Importing this module imports nothing beyond the standard library and the typed choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Generic, Literal, TypeVar

from trainplan.errors import TrainplanError

T = TypeVar("T")

StackName = Literal["megatron", "pytorch"]
Granularity = Literal["block", "parameter"]
Accumulation = Literal["fused", "autograd", "main_grad"]
PpOverlap = Literal["never", "interleaved", "always"]
"""When an engine overlaps pipeline sends and receives with compute: never; on interleaved
schedules only (Megatron-LM turns ``overlap_p2p_comm`` off for the others); on every schedule."""


@dataclass(frozen=True, kw_only=True)
class Setting(Generic[T]):
    """One engine setting: its value and where that value is written (repository file or doc)."""

    value: T
    source: str


@dataclass(frozen=True, kw_only=True)
class Engine:
    """A training engine at one version, and the value of each setting it decides."""

    name: str
    title: str
    version: str
    stack: Setting[StackName]
    recompute_early_stop: Setting[bool]
    zero3_granularity: Setting[Granularity]
    overlap_grad_reduce: Setting[bool]
    tp_comm_overlap: Setting[bool]
    pp_comm_overlap: Setting[PpOverlap]
    grad_accumulation: Setting[Accumulation]
    export_target: str | None
    """The ``trainplan export --to`` target that writes this engine's config; ``None`` when
    trainplan writes none (``export_note`` says which target comes closest)."""
    recomputes: Setting[tuple[str, ...]]
    """The ``--recompute`` modes the engine runs (its activation-checkpointing options)."""
    zero_stages: Setting[tuple[int, ...]]
    """The ZeRO stages its data parallelism has (DDP = 0, FSDP full shard = 3)."""
    export_note: str = ""
    kbit_fp32_upcast: Setting[bool] = Setting(
        value=False,
        source="the engine's own QLoRA path keeps the 16-bit embedding, LM head and norms as loaded",
    )
    """QLoRA through PEFT's ``prepare_model_for_kbit_training`` (``Recipe.kbit_fp32_upcast``):
    applies to ``--method qlora`` only."""
    torch_compile: Setting[bool] = Setting(
        value=False,
        source="fused kernels of the stack's own (Transformer Engine); torch.compile does not apply",
    )
    """Whether the engine runs the model under ``torch.compile`` by default (``Recipe.torch_compile``)."""
    softmax_fp32: Setting[bool] = Setting(
        value=False,
        source="its eager attention keeps the softmax output in the compute dtype",
    )
    """Eager attention with an FP32 softmax and a 16-bit copy (``Recipe.softmax_fp32``): applies
    to ``--attention eager`` only."""

    def capabilities(self) -> dict[str, Setting[tuple[object, ...]]]:
        """What the engine can run: a request naming the engine is held to these, and the
        planner searches only these (``recomputes``, ``zero_stages``)."""
        return {"recomputes": self.recomputes, "zero_stages": self.zero_stages}  # type: ignore[dict-item]

    def settings(self) -> dict[str, Setting[object]]:
        """Each setting by name, in declaration order."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Setting) and f.name not in ("recomputes", "zero_stages")
        }

    def pp_comm_overlap_on(self, pp_schedule: str) -> bool:
        """Whether this engine overlaps pipeline communication on ``pp_schedule``."""
        mode = self.pp_comm_overlap.value
        return mode == "always" or (mode == "interleaved" and pp_schedule == "interleaved")


_MLM = "NVIDIA/Megatron-LM"
_MCORE_VERSION = "core_r0.14.0"
_BRIDGE_VERSION = "0.3.1"
_BRIDGE_MCORE_VERSION = "0.16.1"
_BRIDGE = f"NVIDIA-NeMo/Megatron-Bridge v{_BRIDGE_VERSION}"
_BRIDGE_MCORE = f"{_MLM} core_v{_BRIDGE_MCORE_VERSION} (the 3rdparty/Megatron-LM submodule of {_BRIDGE})"
"""The Megatron Bridge release the nemo engine states, the one ``trainplan export --to nemo``
writes for (``trainplan.export.nemo.VERSION``, ``MCORE_VERSION``; tests/test_engines.py checks
they agree), and the Megatron-Core its tag pins as a submodule."""
_TT = "pytorch/torchtitan 0.2.2"
_BLOCK_FSDP = "PyTorch FSDP2 fully_shard on each transformer block, prefetching the next block's all-gather"
_NO_TP_OVERLAP_PYTORCH = (
    "no tensor parallelism of its own beyond the model code's; no overlapped TP collectives"
)


_MEGATRON_RECOMPUTES: Final[Setting[tuple[str, ...]]] = Setting(
    value=("none", "selective", "full"),
    source=f"{_MLM} megatron/training/arguments.py --recompute-granularity full | selective "
    "(selective: the attention core)",
)
_MEGATRON_ZERO: Final[Setting[tuple[int, ...]]] = Setting(
    value=(0, 1, 2, 3),
    source=f"{_MLM} --use-distributed-optimizer (1); Megatron-FSDP --data-parallel-sharding-strategy "
    "optim_grads (2) / optim_grads_params (3)",
)


def _megatron_family(
    name: str,
    title: str,
    version: str,
    tp_overlap: Setting[bool],
    export: str | None,
    note: str = "",
    **sourced: Any,
) -> Engine:
    """The Megatron-Core engine's settings; ``sourced`` replaces any of them (each :class:`Engine`
    field by name) for a framework built on Megatron-Core that states its own value and source."""
    engine = Engine(
        recomputes=_MEGATRON_RECOMPUTES,
        zero_stages=_MEGATRON_ZERO,
        name=name,
        title=title,
        version=version,
        stack=Setting(
            value="megatron",
            source="Megatron-Core modules with Transformer Engine fused kernels (the megatron stack's calibrated κ, "
            "trainplan/validate/calibrate.py)",
        ),
        recompute_early_stop=Setting(
            value=False,
            source=f"{_MLM} megatron/core/tensor_parallel/random.py CheckpointFunction (reentrant: the whole "
            "block forward runs again)",
        ),
        zero3_granularity=Setting(
            value="block",
            source=f"{_MLM} megatron/core/distributed/fsdp (Megatron-FSDP: one gather per module bucket, prefetched)",
        ),
        overlap_grad_reduce=Setting(
            value=True,
            source=f"{_MLM} megatron/core/distributed/distributed_data_parallel_config.py overlap_grad_reduce, "
            "on in Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh and in Megatron Bridge's recipes "
            "(the argparse default of --overlap-grad-reduce is off: give --no-overlap-grad-reduce for it)",
        ),
        tp_comm_overlap=tp_overlap,
        pp_comm_overlap=Setting(
            value="interleaved",
            source=f"{_MLM} megatron/training/arguments.py: overlap_p2p_comm defaults on "
            "(--no-overlap-p2p-communication turns it off) and is set False without the interleaved schedule",
        ),
        grad_accumulation=Setting(
            value="fused",
            source=f"{_MLM} megatron/core/tensor_parallel/layers.py: --gradient-accumulation-fusion (default on) "
            "accumulates in the weight-gradient GEMM (wgrad_gemm_accum_fp32)",
        ),
        export_target=export,
        export_note=note,
    )
    return replace(engine, **sourced) if sourced else engine


def _pytorch_family(
    name: str,
    title: str,
    version: str,
    *,
    early_stop: Setting[bool],
    zero3: Setting[Granularity],
    tp_overlap: Setting[bool],
    pp_overlap: Setting[PpOverlap],
    accumulation: Setting[Accumulation],
    export: str | None,
    recomputes: Setting[tuple[str, ...]],
    zero_stages: Setting[tuple[int, ...]],
    note: str = "",
    kbit_upcast: Setting[bool] | None = None,
    compile_default: Setting[bool] | None = None,
    softmax_fp32: Setting[bool] | None = None,
) -> Engine:
    extra: dict[str, Setting[bool]] = {} if kbit_upcast is None else {"kbit_fp32_upcast": kbit_upcast}
    if softmax_fp32 is not None:
        extra["softmax_fp32"] = softmax_fp32
    extra["torch_compile"] = compile_default or Setting(
        value=False, source="eager PyTorch unless the model is wrapped in torch.compile by the user"
    )
    return Engine(
        **extra,
        recomputes=recomputes,
        zero_stages=zero_stages,
        name=name,
        title=title,
        version=version,
        stack=Setting(
            value="pytorch",
            source="PyTorch's own modules and kernels (the pytorch stack's calibrated κ, "
            "trainplan/validate/calibrate.py)",
        ),
        recompute_early_stop=early_stop,
        zero3_granularity=zero3,
        overlap_grad_reduce=Setting(
            value=True,
            source="PyTorch DDP buckets / FSDP reduce-scatter during the backward (Li et al. 2020 Sec. 3.2.3)",
        ),
        tp_comm_overlap=tp_overlap,
        pp_comm_overlap=pp_overlap,
        grad_accumulation=accumulation,
        export_target=export,
        export_note=note,
    )


_FSDP_FUSED: Final[Setting[Accumulation]] = Setting(
    value="fused",
    source="FSDP2 reduce-scatters every micro-batch and adds only its shard (the add is neglected, "
    "trainplan.timing.grad_accumulation_bytes_n)",
)
_AUTOGRAD: Final[Setting[Accumulation]] = Setting(
    value="autograd",
    source="torch/csrc/autograd/functions/accumulate_grad.h: AccumulateGrad adds each micro-batch into .grad",
)
_NO_TP_OVERLAP: Final[Setting[bool]] = Setting(value=False, source=_NO_TP_OVERLAP_PYTORCH)
_NO_PP_OVERLAP: Final[Setting[PpOverlap]] = Setting(value="never", source="no pipeline schedule of its own")
_BLOCK: Final[Setting[Granularity]] = Setting(value="block", source=_BLOCK_FSDP)
_BLOCK_RECOMPUTE: Final[Setting[tuple[str, ...]]] = Setting(
    value=("none", "full"),
    source="torch.utils.checkpoint around each block (gradient/activation checkpointing)",
)
_ACCELERATE_ZERO: Final[Setting[tuple[int, ...]]] = Setting(
    value=(0, 1, 2, 3),
    source="huggingface/accelerate: DDP (0), DeepSpeed plugin (1, 2, 3), FSDP SHARD_GRAD_OP (2) / FULL_SHARD (3)",
)

ENGINES: dict[str, Engine] = {}
"""Every engine by name (:func:`register` adds one)."""


def register(engine: Engine) -> Engine:
    """Add ``engine`` to :data:`ENGINES` (a name given twice is an error) and return it."""
    if engine.name in ENGINES:
        raise ValueError(f"engine {engine.name!r} is registered already")
    ENGINES[engine.name] = engine
    return engine


register(
    _megatron_family(
        "megatron",
        "Megatron-LM / Megatron-Core",
        _MCORE_VERSION,
        Setting(
            value=False, source=f"{_MLM} megatron/training/arguments.py: --tp-comm-overlap is off by default"
        ),
        "megatron",
    )
)
register(
    _megatron_family(
        "nemo",
        "NeMo 2 / Megatron Bridge",
        f"Megatron Bridge {_BRIDGE_VERSION} (Megatron-Core {_BRIDGE_MCORE_VERSION})",
        Setting(
            value=True,
            source=f"{_BRIDGE} src/megatron/bridge/recipes/llama/llama3.py llama3_70b_pretrain_config (lines "
            "736-740: CommOverlapConfig(tp_comm_overlap=True), as in the Llama 3.1 70B/405B, GPT-3 175B and "
            "Nemotron-H recipes and the scripts/performance configs built on them); "
            "src/megatron/bridge/training/comm_overlap.py _get_model_comm_overlap_cfgs (lines 438-448) turns it "
            "off without sequence parallelism, with TP < 2 or without Transformer Engine. The MoE recipes "
            "(deepseek_v3.py line 168, kimi_k2.py, moonlight_16b.py) write tp_comm_overlap=False and "
            "_pretrain_common sets no CommOverlapConfig: give --no-tp-comm-overlap for those",
        ),
        "nemo",
        stack=Setting(
            value="megatron",
            source=f"{_BRIDGE} src/megatron/bridge/models/gpt_provider.py GPTModelProvider: Megatron-Core "
            "modules with the Transformer Engine layer spec (default_layer_spec, lines 116-121; the megatron "
            "stack's calibrated κ, trainplan/validate/calibrate.py)",
        ),
        recompute_early_stop=Setting(
            value=False,
            source=f"{_BRIDGE_MCORE} megatron/core/transformer/transformer_block.py _checkpointed_forward "
            "(lines 504-530) → megatron/core/tensor_parallel/random.py CheckpointFunction (line 496; "
            "reentrant: the whole block forward runs again; te_checkpoint under FP8/FP4)",
        ),
        zero3_granularity=Setting(
            value="block",
            source=f"{_BRIDGE_MCORE} megatron/core/distributed/fsdp (Megatron-FSDP, ddp.use_megatron_fsdp with "
            "data_parallel_sharding_strategy optim_grads_params: one gather per module bucket, prefetched)",
        ),
        overlap_grad_reduce=Setting(
            value=True,
            source=f"{_BRIDGE} src/megatron/bridge/recipes/common.py _pretrain_common (lines 75-83: "
            "DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather=True, "
            "use_distributed_optimizer=True)); src/megatron/bridge/training/comm_overlap.py "
            "_get_optimizer_overlap_cfgs (lines 539-542) turns both on with DP > 1 and the distributed optimizer",
        ),
        pp_comm_overlap=Setting(
            value="interleaved",
            source=f"{_BRIDGE} src/megatron/bridge/training/comm_overlap.py _get_model_comm_overlap_cfgs "
            "(lines 450-460): overlap_p2p_comm on with PP > 1 and a virtual pipeline, off otherwise (a recipe "
            "with no CommOverlapConfig keeps Megatron-Core's overlap_p2p_comm = False; the export writes one)",
        ),
        grad_accumulation=Setting(
            value="fused",
            source=f"{_BRIDGE} src/megatron/bridge/models/gpt_provider.py line 186: gradient_accumulation_fusion "
            "defaults to fusions.can_enable_gradient_accumulation_fusion() (src/megatron/bridge/utils/fusions.py "
            "lines 34-50: on where the fused_weight_gradient_mlp_cuda extension imports): the weight-gradient "
            "GEMM accumulates into main_grad",
        ),
        softmax_fp32=Setting(
            value=False,
            source=f"{_BRIDGE} src/megatron/bridge/models/gpt_provider.py line 145: attention_softmax_in_fp32 = "
            "False (Megatron-Core's TransformerConfig default is True): the unfused attention's softmax runs in "
            "the compute dtype",
        ),
        recomputes=Setting(
            value=("none", "selective", "full"),
            source=f"{_BRIDGE_MCORE} megatron/core/transformer/transformer_config.py recompute_granularity "
            "None | 'selective' | 'full' (line 383; selective recomputes recompute_modules, default "
            "['core_attn'], lines 1193-1194), a GPTModelProvider field",
        ),
        zero_stages=Setting(
            value=(0, 1, 2, 3),
            source=f"{_BRIDGE_MCORE} megatron/core/distributed/distributed_data_parallel_config.py: "
            "use_distributed_optimizer (1); use_megatron_fsdp with data_parallel_sharding_strategy "
            "optim_grads (2) / optim_grads_params (3) (lines 69, 79)",
        ),
    )
)
register(
    _pytorch_family(
        "torchtitan",
        "torchtitan",
        "0.2.2",
        early_stop=Setting(
            value=False,
            source=f"{_TT} torchtitan/config/job_config.py [activation_checkpoint] early_stop = false "
            "(torchtitan before 0.2 used the non-reentrant checkpoint's early stop: give --recompute-early-stop)",
        ),
        zero3=Setting(
            value="block",
            source=f"{_TT} torchtitan/models/llama3/infra/parallelize.py apply_fsdp: "
            "fully_shard per transformer block",
        ),
        tp_overlap=Setting(
            value=False,
            source=f"{_TT} torchtitan/config/job_config.py [parallelism] enable_async_tensor_parallel = false",
        ),
        pp_overlap=Setting(
            value="never",
            source="torch/distributed/pipelining/schedules.py: each step waits on its sends and receives "
            "before computing",
        ),
        accumulation=_FSDP_FUSED,
        export="torchtitan",
        compile_default=Setting(
            value=False,
            source=f"{_TT} torchtitan/config/job_config.py [compile] enable = false (lines 721-722)",
        ),
        recomputes=Setting(
            value=("none", "full", "sac"),
            source=f"{_TT} torchtitan/config/job_config.py [activation_checkpoint] mode = none | full | "
            "selective (selective_ac_option = op: per-op SAC)",
        ),
        zero_stages=Setting(
            value=(0, 2, 3),
            source=f"{_TT} torchtitan/config/job_config.py: data_parallel_replicate_degree (DDP), FSDP2 "
            "fsdp_reshard_after_forward = never (2) / default (3); no optimizer-only sharding",
        ),
    )
)
register(
    _pytorch_family(
        "torchtune",
        "torchtune",
        "0.6",
        early_stop=Setting(
            value=True,
            source="pytorch/torchtune torchtune/training/activations.py set_activation_checkpointing: "
            "checkpoint_wrapper(NO_REENTRANT), early stop on",
        ),
        zero3=_BLOCK,
        tp_overlap=_NO_TP_OVERLAP,
        pp_overlap=_NO_PP_OVERLAP,
        accumulation=_FSDP_FUSED,
        export=None,
        recomputes=Setting(
            value=("none", "full"),
            source="pytorch/torchtune recipes: enable_activation_checkpointing (whole blocks)",
        ),
        zero_stages=Setting(
            value=(0, 3), source="pytorch/torchtune recipes: single device, or FSDP2 fully_shard (full shard)"
        ),
        note="trainplan writes no torchtune recipe YAML; the torchtitan target writes the same FSDP2 job",
        compile_default=Setting(
            value=False,
            source="pytorch/torchtune recipes/configs/*.yaml compile: False (e.g. llama3_2/3B_full_single_device.yaml "
            "at 1814feb17); the README's tables turn it on",
        ),
    )
)
register(
    _pytorch_family(
        "accelerate",
        "Hugging Face Accelerate",
        "1.15.0",
        early_stop=Setting(
            value=True,
            source="huggingface/accelerate src/accelerate/utils/dataclasses.py FullyShardedDataParallelPlugin "
            "activation_checkpointing: checkpoint_wrapper(NO_REENTRANT)",
        ),
        zero3=_BLOCK,
        tp_overlap=_NO_TP_OVERLAP,
        pp_overlap=_NO_PP_OVERLAP,
        accumulation=_AUTOGRAD,
        export="accelerate",
        recomputes=_BLOCK_RECOMPUTE,
        zero_stages=_ACCELERATE_ZERO,
    )
)
register(
    _pytorch_family(
        "hf-trainer",
        "Hugging Face Transformers Trainer",
        "transformers 4.57",
        early_stop=Setting(
            value=False,
            source="huggingface/transformers src/transformers/modeling_utils.py gradient_checkpointing_enable: "
            "torch.utils.checkpoint with use_reentrant=True unless gradient_checkpointing_kwargs say otherwise",
        ),
        zero3=_BLOCK,
        tp_overlap=_NO_TP_OVERLAP,
        pp_overlap=_NO_PP_OVERLAP,
        accumulation=_AUTOGRAD,
        export="accelerate",
        recomputes=_BLOCK_RECOMPUTE,
        zero_stages=_ACCELERATE_ZERO,
        note="the Trainer runs under `accelerate launch`; the accelerate target writes that config",
        kbit_upcast=Setting(
            value=True,
            source="huggingface/peft v0.14.0 src/peft/utils/other.py prepare_model_for_kbit_training (lines "
            "135-140: every 16-bit parameter that is not Params4bit cast to float32), the QLoRA recipe of the "
            "PEFT and TRL docs; QLoRA only",
        ),
        compile_default=Setting(
            value=False,
            source="huggingface/transformers src/transformers/training_args.py TrainingArguments.torch_compile "
            "(default False)",
        ),
        softmax_fp32=Setting(
            value=True,
            source="huggingface/transformers src/transformers/models/llama/modeling_llama.py eager_attention_forward: "
            "softmax(dtype=torch.float32).to(query.dtype) (attn_implementation='eager' only)",
        ),
    )
)
register(
    _pytorch_family(
        "deepspeed",
        "DeepSpeed",
        "0.19.8",
        early_stop=Setting(
            value=False,
            source="deepspeedai/DeepSpeed deepspeed/runtime/activation_checkpointing/checkpointing.py "
            "CheckpointFunction (reentrant)",
        ),
        zero3=Setting(
            value="block",
            source="deepspeedai/DeepSpeed deepspeed/runtime/zero/partitioned_param_coordinator.py: bucketed, "
            "prefetched gathers (stage3_prefetch_bucket_size; since 0.6)",
        ),
        tp_overlap=_NO_TP_OVERLAP,
        pp_overlap=Setting(
            value="never", source="deepspeedai/DeepSpeed deepspeed/runtime/pipe/engine.py: blocking p2p sends"
        ),
        accumulation=Setting(
            value="fused",
            source="deepspeedai/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py: gradients reduced into "
            "the partition's FP32 buffer per micro-batch (the add is neglected)",
        ),
        export="deepspeed",
        recomputes=_BLOCK_RECOMPUTE,
        zero_stages=Setting(
            value=(0, 1, 2, 3), source="deepspeedai/DeepSpeed zero_optimization.stage 0-3 (ds_config.json)"
        ),
    )
)

ENGINE_NAMES: Final = tuple(ENGINES)
DEFAULT_ENGINE: Final = "megatron"
"""The engine of a request that names none: Megatron-Core, whose settings are trainplan's
defaults (and were before ``--engine`` existed)."""


def get_engine(name: str | None) -> Engine:
    """The engine called ``name`` (the default for ``None``); an unknown name is an error listing them."""
    key = DEFAULT_ENGINE if name is None else name
    if key not in ENGINES:
        raise TrainplanError("engine", f"unknown engine {key!r}; choose one of {', '.join(ENGINES)}")
    return ENGINES[key]


ENGINE_FIELDS: Final = (
    "stack",
    "recompute_early_stop",
    "zero3_granularity",
    "overlap_grad_reduce",
    "tp_comm_overlap",
    "pp_comm_overlap",
    "grad_accumulation",
    "kbit_fp32_upcast",
    "torch_compile",
    "softmax_fp32",
)
"""The input fields an engine fills when the request leaves them unset (``None``)."""


@dataclass(frozen=True, kw_only=True)
class Applied:
    """What an engine decided for one request: each setting's value, and whether the request
    gave it explicitly (then the engine's value was overridden)."""

    engine: Engine
    values: Mapping[str, object]
    explicit: tuple[str, ...]
    default: bool = False
    """True when the request named no engine (the default engine was used)."""

    def to_dict(self) -> dict[str, object]:
        """The ``engine`` section of the JSON outputs."""
        settings = self.engine.settings()
        return {
            "name": self.engine.name,
            "title": self.engine.title,
            "version": self.engine.version,
            "default": self.default,
            "export_target": self.engine.export_target,
            "recomputes": list(self.engine.recomputes.value),
            "zero_stages": list(self.engine.zero_stages.value),
            "settings": {
                name: {
                    "value": self.values[name],
                    "engine_value": settings[name].value,
                    "set_by": "flag" if name in self.explicit else "engine",
                    "source": settings[name].source,
                }
                for name in settings
            },
        }

    def describe(self) -> str:
        """One line: the engine, what it set, and which flags overrode it."""
        set_here = [f"{n}={_show(self.values[n])}" for n in self.engine.settings() if n not in self.explicit]
        which = "default engine; give --engine to name yours: " if self.default else ""
        line = f"{self.engine.name} ({which}{self.engine.title} {self.engine.version}) set " + ", ".join(
            set_here
        )
        if self.explicit:
            line += "; given by flag: " + ", ".join(f"{n}={_show(self.values[n])}" for n in self.explicit)
        return line


def check_capabilities(applied: Applied, *, recompute: str | None, zero: int | None) -> None:
    """A request that names its engine is held to what that engine runs: a ``--recompute`` mode
    or ZeRO stage the engine lacks is an error naming the ones it has. The default engine, named
    by nobody, holds no request to anything."""
    if applied.default:
        return
    e = applied.engine
    if recompute is not None and recompute not in e.recomputes.value:
        raise TrainplanError(
            "recompute",
            f"{e.name} has no {recompute!r} recompute; it runs {', '.join(e.recomputes.value)} "
            f"({e.recomputes.source})",
        )
    if zero is not None and zero not in e.zero_stages.value:
        raise TrainplanError(
            "zero",
            f"{e.name} has no ZeRO-{zero}; it has ZeRO {', '.join(str(z) for z in e.zero_stages.value)} "
            f"({e.zero_stages.source})",
        )


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def resolve(values: Mapping[str, object]) -> Applied:
    """The engine ``values["engine"]`` names applied to ``values``: each of :data:`ENGINE_FIELDS`
    that is ``None`` takes the engine's value; ``no_overlap_grad_reduce`` (a switch) turns the
    gradient-reduction overlap off when set. ``pp_comm_overlap`` is the engine's rule
    (never / interleaved / always) unless a flag gives true or false."""
    engine = get_engine(values.get("engine"))  # type: ignore[arg-type]
    out: dict[str, object] = {}
    explicit: list[str] = []
    for name, setting in engine.settings().items():
        given = values.get(name)
        if name == "overlap_grad_reduce":
            given = False if values.get("no_overlap_grad_reduce") else None
        if given is None:
            out[name] = setting.value
        else:
            out[name] = given
            explicit.append(name)
    return Applied(engine=engine, values=out, explicit=tuple(explicit), default=values.get("engine") is None)


def engines_markdown() -> str:
    """The table of every engine and what it sets, in docs/engines.md (tests/test_engines.py
    checks it is current)."""
    names = tuple(ENGINE_FIELDS)
    lines = [
        "| engine | version | " + " | ".join(names) + " | recompute | ZeRO | export target |",
        "|---" * (len(names) + 5) + "|",
    ]
    for e in ENGINES.values():
        s = e.settings()
        cells = [f"`{_show(s[n].value)}`" for n in names]
        caps = f"{', '.join(e.recomputes.value)} | {', '.join(str(z) for z in e.zero_stages.value)}"
        lines.append(
            f"| `{e.name}` ({e.title}) | {e.version} | "
            + " | ".join(cells)
            + f" | {caps} | {e.export_target or '—'} |"
        )
    lines += ["", "Sources:", ""]
    for e in ENGINES.values():
        lines.append(f"* `{e.name}`:")
        lines += [f"  * `{n}` = `{_show(v.value)}`: {v.source}" for n, v in e.settings().items()]
        lines += [f"  * {n}: {', '.join(map(str, c.value))}: {c.source}" for n, c in e.capabilities().items()]
        if e.export_note:
            lines.append(f"  * export: {e.export_note}")
    return "\n".join(lines) + "\n"
