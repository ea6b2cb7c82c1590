"""torchtitan job configuration (TOML) for a plan.

Schema: torchtitan 0.2.2 (PyPI ``torchtitan==0.2.2``, the last release whose trainer reads a TOML
job config; 0.3 replaced it with Python config registries). Every key written here is a field
of ``torchtitan/config/job_config.py`` in that release, read by
``torchtitan/config/manager.py::ConfigManager.parse_args(["--job.config_file", PATH])``, which
rejects unknown keys. The keys and where torchtitan uses them:

``[model]`` ``name``, ``flavor``
    ``job_config.Model``; the flavor tables are ``torchtitan/models/llama3/__init__.py``
    (``llama3_args``) and ``torchtitan/models/qwen3/__init__.py`` (``qwen3_args``). A model
    with a registered flavor's exact dimensions is named by it; any other that torchtitan's llama3
    or qwen3 classes build (:func:`custom_model`) gets a train spec of its own, registered by a
    Python module written beside the TOML (:func:`custom_module_source`).
``[job]`` ``custom_config_module``
    ``job_config.Job``: the module ``ConfigManager`` imports while parsing the TOML
    (``torchtitan/config/manager.py::_maybe_add_custom_config``); importing it runs
    ``torchtitan/protocols/train_spec.py::register_train_spec`` before the trainer looks the spec up
    (``get_train_spec(job_config.model.name)`` in ``torchtitan/train.py``).
``[model]`` ``converters``
    ``"quantize.linear.float8"`` / ``"quantize.linear.mx"``, registered in
    ``torchtitan/components/quantization/float8.py`` and ``mx.py``.
``[training]`` ``local_batch_size``, ``global_batch_size``, ``seq_len``, ``dtype``,
``mixed_precision_param``, ``enable_cpu_offload``
    ``job_config.Training``. ``torchtitan/train.py`` derives gradient accumulation as
    ``global_batch_size // (local_batch_size · dp_replicate · dp_shard)``.
``[parallelism]`` ``data_parallel_replicate_degree``, ``data_parallel_shard_degree``,
``fsdp_reshard_after_forward``, ``tensor_parallel_degree``, ``disable_loss_parallel``,
``pipeline_parallel_degree``, ``pipeline_parallel_schedule``, ``pipeline_parallel_microbatch_size``,
``pipeline_parallel_layers_per_stage``, ``pipeline_parallel_first_stage_less_layers``,
``pipeline_parallel_last_stage_less_layers``, ``context_parallel_degree``, ``expert_parallel_degree``,
``expert_tensor_parallel_degree``, ``enable_async_tensor_parallel``
    ``job_config.Parallelism``; checked against the world size by
    ``torchtitan/distributed/parallel_dims.py::ParallelDims``. Schedule names are those of
    ``torch.distributed.pipelining.schedules.get_schedule_class``; stage counts follow
    ``torchtitan/distributed/pipeline_parallel.py::pipeline_llm``.
``[activation_checkpoint]`` ``mode``, ``selective_ac_option``, ``early_stop``
    ``job_config.ActivationCheckpoint``. ``recompute="sac"`` is ``mode = "selective"``,
    ``selective_ac_option = "op"`` (``_apply_op_sac``, the per-op policy :mod:`trainplan.sac`
    models); ``recompute="selective"`` is written the same way with a warning, as torchtitan has no
    attention-only recompute. ``early_stop`` (default ``false``) is passed to
    ``torch.utils.checkpoint`` by ``torchtitan/distributed/activation_checkpoint.py::_apply_full_ac``
    and ``_apply_op_sac``; it is written for full and per-op recompute from
    ``Recipe.recompute_early_stop``, so the job recomputes what the estimate counts (the whole
    block, or the block up to its last saved tensor).
``[compile]`` ``enable``, ``components``
    ``job_config.Compile``: ``enable`` from ``Recipe.torch_compile``, and on (with a warning when the
    recipe is eager) for float8/MX linears and async TP, which torchtitan runs compiled.
``[quantize.linear.float8]`` ``recipe_name``, ``enable_fsdp_float8_all_gather``,
``precompute_float8_dynamic_scale_for_fsdp``; ``[quantize.linear.mx]`` ``recipe_name``
    ``job_config.Float8Linear`` / ``job_config.MXLinear`` (recipes of torchao's
    ``Float8LinearConfig.from_recipe_name`` / ``MXLinearConfig.from_recipe_name``).
``[optimizer]`` ``name``, ``early_step_in_backward``
    ``job_config.Optimizer``; names of ``torchtitan/components/optimizer.py::build_optimizers``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from trainplan.errors import TrainplanError
from trainplan.export._common import PlanFacts, check_loss, check_megatron_options, plan_facts, unsupported
from trainplan.export._text import to_toml
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

VERSION: Final = "0.2.2"
TARGET: Final = f"torchtitan {VERSION}"

Config = dict[str, dict[str, object]]


@dataclass(frozen=True, kw_only=True)
class Flavor:
    """One registered torchtitan model flavor and the dimensions it builds."""

    module: str
    flavor: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int  # dense MLP width (unused by all-MoE flavors: 0 = not compared)
    vocab_size: int
    num_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int = 0


def _llama3_ffn(dim: int, multiple_of: int, multiplier: float) -> int:
    """SwiGLU width of ``torchtitan/models/llama3/model/model.py::FeedForward``:
    ``int(2·4·dim/3)``, times ``ffn_dim_multiplier``, rounded up to ``multiple_of``."""
    hidden = int(multiplier * int(2 * (4 * dim) / 3))
    return multiple_of * math.ceil(hidden / multiple_of)


# torchtitan 0.2.2 torchtitan/models/llama3/__init__.py (llama3_args; vocab_size default 128256
# from torchtitan/models/llama3/model/args.py) and torchtitan/models/qwen3/__init__.py (qwen3_args).
FLAVORS: Final[tuple[Flavor, ...]] = (
    Flavor(
        module="llama3",
        flavor="8B",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden=_llama3_ffn(4096, 1024, 1.3),
        vocab_size=128256,
    ),
    Flavor(
        module="llama3",
        flavor="70B",
        num_layers=80,
        hidden_size=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden=_llama3_ffn(8192, 4096, 1.3),
        vocab_size=128256,
    ),
    Flavor(
        module="llama3",
        flavor="405B",
        num_layers=126,
        hidden_size=16384,
        num_heads=128,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden=_llama3_ffn(16384, 4096, 1.2),
        vocab_size=128256,
    ),
    *(
        Flavor(
            module="qwen3",
            flavor=name,
            num_layers=layers,
            hidden_size=dim,
            num_heads=heads,
            num_kv_heads=8,
            head_dim=128,
            ffn_hidden=ffn,
            vocab_size=151936,
        )
        for name, layers, dim, heads, ffn in (
            ("0.6B", 28, 1024, 16, 3072),
            ("1.7B", 28, 2048, 16, 6144),
            ("4B", 36, 2560, 32, 9728),
            ("8B", 36, 4096, 32, 12288),
            ("14B", 40, 5120, 40, 17408),
            ("32B", 64, 5120, 64, 25600),
        )
    ),
    Flavor(
        module="qwen3",
        flavor="30B-A3B",
        num_layers=48,
        hidden_size=2048,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        ffn_hidden=0,
        vocab_size=151936,
        num_experts=128,
        top_k=8,
        expert_ffn_hidden=768,
    ),
    Flavor(
        module="qwen3",
        flavor="235B-A22B",
        num_layers=94,
        hidden_size=4096,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        ffn_hidden=0,
        vocab_size=151936,
        num_experts=128,
        top_k=8,
        expert_ffn_hidden=1536,
    ),
)


def _matches(f: Flavor, m: ModelSpec) -> bool:
    dims = (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.vocab_size)
    if dims != (f.num_layers, f.hidden_size, f.num_heads, f.num_kv_heads, f.head_dim, f.vocab_size):
        return False
    if f.num_experts == 0:
        return m.moe is None and m.ffn_hidden == f.ffn_hidden
    return m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden) == (
        f.num_experts,
        f.top_k,
        f.expert_ffn_hidden,
    )


def find_flavor(model: ModelSpec) -> Flavor | None:
    """The registered flavor with exactly the model's dimensions, or ``None``."""
    for f in FLAVORS:
        if _matches(f, model):
            return f
    return None


# ---------------------------------------------------------------- models outside the flavor tables
@dataclass(frozen=True, kw_only=True)
class CustomModel:
    """A model torchtitan builds from a train spec that the job registers itself.

    ``family`` is the torchtitan model whose classes build it: ``llama3``
    (``torchtitan/models/llama3/model/args.py::TransformerModelArgs``: head width = dim / heads,
    untied embeddings, pipeline parallelism through ``pipeline_llm``) or ``qwen3``
    (``torchtitan/models/qwen3/model/args.py::Qwen3ModelArgs``: its own head width, optional
    q/k norms, tied embeddings and token-choice MoE; its train spec has no pipelining function).
    ``module`` is the Python module the job config names as ``job.custom_config_module`` and
    ``spec`` the train spec it registers (``torchtitan/protocols/train_spec.py::register_train_spec``),
    with one flavor, :data:`CUSTOM_FLAVOR`.
    """

    family: str
    module: str
    spec: str
    args: dict[str, object]
    moe_args: dict[str, object] | None = None


CUSTOM_FLAVOR: Final = "plan"
ROPE_THETA: Final = 10000.0
NORM_EPS: Final = 1e-5


def _module_name(model: ModelSpec) -> str:
    """``trainplan_<model name>`` as a Python identifier (the companion file is ``<module>.py``)."""
    return "trainplan_" + (re.sub(r"[^0-9a-zA-Z]+", "_", model.name).strip("_").lower() or "model")


def _llama3_ffn_args(dim: int, ffn_hidden: int) -> tuple[int, float | None]:
    """``(multiple_of, ffn_dim_multiplier)`` with which ``_llama3_ffn`` gives exactly ``ffn_hidden``:
    no multiplier and a power-of-two ``multiple_of`` when one fits (Llama 2: 11008 = 43·256), else
    ``multiple_of = ffn_hidden`` and the multiplier that brings ``int(8·dim/3)`` to at most it."""
    for multiple_of in (256, 512, 1024, 2048, 4096):
        if _llama3_ffn(dim, multiple_of, 1.0) == ffn_hidden:
            return multiple_of, None
    multiplier = ffn_hidden / int(2 * (4 * dim) / 3)
    assert _llama3_ffn(dim, ffn_hidden, multiplier) == ffn_hidden
    return ffn_hidden, multiplier


_OTHERS: Final = "megatron, deepspeed or accelerate"


def _cannot_build(model: ModelSpec, what: str, target: str = TARGET, others: str = _OTHERS) -> TrainplanError:
    return unsupported(
        target,
        "model",
        f"{model.name}: {what} (its llama3 and qwen3 models are pre-norm RMSNorm, SwiGLU, RoPE "
        "decoders without biases)",
        f"export to {others}",
    )


def check_kernels(recipe: Recipe, target: str, attention_kernels: str) -> None:
    """What no torchtitan release's models run, refused for ``target``: eager attention (its models
    call ``attention_kernels``), dropout (none of its models has it) and bitsandbytes paged
    optimizers."""
    if recipe.attention != "flash":
        raise unsupported(
            target,
            "attention",
            f"eager attention (its models call {attention_kernels})",
            "plan with --attention flash",
        )
    if recipe.dropout:
        raise unsupported(target, "dropout", "dropout (its models have none)", "plan with --dropout 0")
    if recipe.paged_optimizer:
        raise unsupported(
            target, "paged_optimizer", "bitsandbytes paged optimizers", "drop --paged-optimizer"
        )


def check_architecture(model: ModelSpec, recipe: Recipe, target: str = TARGET, others: str = _OTHERS) -> None:
    """Refuse, naming the difference, a model that torchtitan's llama3 / qwen3 blocks cannot
    build: both releases (0.2.2 and 0.3.0) share these blocks (pre-norm RMSNorm, SwiGLU, RoPE,
    no biases, per-head q/k norms, full causal attention). ``others``: the targets the refusal
    names, those that run the plan's method."""
    if model.activation != "swiglu":
        raise _cannot_build(model, f"a {model.activation} MLP", target, others)
    if model.norm != "rmsnorm":
        raise _cannot_build(model, f"{model.norm} normalisation", target, others)
    if model.position != "rope":
        raise _cannot_build(model, f"{model.position} position embeddings", target, others)
    if model.qkv_bias or model.attn_out_bias or model.mlp_bias:
        raise _cannot_build(model, "biases on its linear layers", target, others)
    if model.post_norms or model.parallel_attn_mlp:
        raise _cannot_build(model, "post-norms or parallel attention/MLP blocks", target, others)
    if model.qk_norm_full_width:
        raise _cannot_build(model, "q/k norms over all heads (its q/k norms are per head)", target, others)
    for note in model.approximations:
        raise _cannot_build(model, f"an architecture trainplan approximates ({note})", target, others)
    # its attention is full causal: the same as a sliding window only up to the window
    if 0 < model.attention_window < recipe.seq_len:
        raise unsupported(
            target,
            "seq_len",
            f"{model.name}'s sliding-window ({model.attention_window}) attention at seq_len {recipe.seq_len} "
            "(its attention is full causal, the same only up to the window)",
            f"plan with --seq-len {model.attention_window} or less, or export to {others}",
        )


def custom_model(model: ModelSpec, recipe: Recipe, layout: Layout) -> CustomModel:
    """The train spec that builds ``model`` exactly, or an error naming what torchtitan 0.2.2's
    models cannot build. Parameter for parameter the same model as :func:`trainplan.models.params.count_params`
    counts (tests/test_export.py builds it on the meta device and compares)."""
    check_architecture(model, recipe)
    moe = model.moe
    if moe is not None and (
        moe.num_shared_experts or moe.first_dense_layers or moe.layer_freq != 1 or moe.router_bias
    ):
        raise _cannot_build(
            model,
            "shared experts, dense layers between the expert layers or a router bias (its qwen3 "
            "MoE routes every layer to experts only, torchtitan/models/qwen3/model/model.py)",
        )
    module = _module_name(model)
    common: dict[str, object] = {
        "dim": model.hidden_size,
        "n_layers": model.num_layers,
        "n_heads": model.num_heads,
        "n_kv_heads": model.num_kv_heads,
        "vocab_size": model.vocab_size,
        "norm_eps": NORM_EPS,
        "rope_theta": ROPE_THETA,
        "max_seq_len": max(recipe.seq_len, model.max_seq_len),
    }
    llama3 = (
        moe is None
        and not model.qk_norm
        and not model.tied_embeddings
        and model.head_dim * model.num_heads == model.hidden_size
    )
    if llama3:
        multiple_of, multiplier = _llama3_ffn_args(model.hidden_size, model.ffn_hidden)
        return CustomModel(
            family="llama3",
            module=module,
            spec=module,
            args={**common, "multiple_of": multiple_of, "ffn_dim_multiplier": multiplier},
        )
    if layout.pp > 1:
        what = (
            "expert layers"
            if moe is not None
            else "q/k norms, tied embeddings or a head width other than dim/heads"
        )
        raise unsupported(
            TARGET,
            "pp",
            f"pipeline parallelism for {model.name} ({what} need its qwen3 model, whose train spec "
            "has no pipelining function: torchtitan/models/qwen3/__init__.py pipelining_fn=None)",
            "plan with --pp 1, or export to megatron",
        )
    args: dict[str, object] = {
        **common,
        "head_dim": model.head_dim,
        "hidden_dim": model.ffn_hidden or (moe.expert_ffn_hidden if moe else 0),
        "qk_norm": model.qk_norm,
        "enable_weight_tying": model.tied_embeddings,
        "moe_enabled": moe is not None,
    }
    moe_args = None
    if moe is not None:
        args["moe_inter_dim"] = moe.expert_ffn_hidden
        # the routing of torchtitan's own qwen3 MoE flavors (softmax over all experts, top-k
        # weights renormalised): Mixtral's and Qwen3's
        moe_args = {
            "num_experts": moe.num_experts,
            "num_shared_experts": 0,
            "top_k": moe.top_k,
            "score_func": "softmax",
            "route_norm": True,
            "route_scale": 1.0,
            "score_before_experts": False,
        }
    return CustomModel(family="qwen3", module=module, spec=module, args=args, moe_args=moe_args)


def companion_files(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[tuple[str, str], ...]:
    """``(file name, text)`` of the files the job config needs beside it: the model module of a
    model outside torchtitan's flavor tables, else none (the 0.3.0 config module builds its model
    itself)."""
    if writes_0_3(recipe) or find_flavor(model) is not None:
        return ()
    custom = custom_model(model, recipe, layout)
    return ((f"{custom.module}.py", custom_module_source(model, custom)),)


def _py_kwargs(kwargs: dict[str, object], indent: str) -> str:
    return "".join(f"{indent}{k}={v!r},\n" for k, v in kwargs.items())


def custom_module_source(model: ModelSpec, custom: CustomModel) -> str:
    """The Python module that registers ``custom``'s train spec when torchtitan's ``ConfigManager``
    imports it (``torchtitan/config/manager.py::_maybe_add_custom_config`` imports
    ``job.custom_config_module`` and merges its ``JobConfig`` dataclass, empty here)."""
    if custom.family == "llama3":
        imports = (
            "from torchtitan.models.llama3 import get_train_spec\n"
            "from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs\n"
        )
        build = (
            "MODEL_ARGS = TransformerModelArgs(\n"
            + _py_kwargs(custom.args, "    ")
            + "    rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0),  # 1.0: no RoPE scaling\n)\n"
        )
    else:
        imports = (
            "from torchtitan.models.qwen3 import get_train_spec\n"
            "from torchtitan.models.qwen3.model.args import Qwen3ModelArgs\n"
            + ("from torchtitan.models.moe import MoEArgs\n" if custom.moe_args else "")
        )
        build = "MODEL_ARGS = Qwen3ModelArgs(\n" + _py_kwargs(custom.args, "    ")
        if custom.moe_args:
            build += "    moe_args=MoEArgs(\n" + _py_kwargs(custom.moe_args, "        ") + "    ),\n"
        build += ")\n"
    return (
        f'"""{model.name} for torchtitan {VERSION}, written by trainplan.\n\n'
        f'The job config names this module ([job] custom_config_module = "{custom.module}"): torchtitan\'s\n'
        f'ConfigManager imports it, and it registers the train spec "{custom.spec}", torchtitan\'s\n'
        f'{custom.family} train spec with one flavor, "{CUSTOM_FLAVOR}", of exactly these dimensions.\n'
        "Keep it next to the job config and launch with PYTHONPATH=. (or put its folder on PYTHONPATH).\n"
        '"""\n\n'
        "import dataclasses\n\n"
        + imports
        + "from torchtitan.protocols.train_spec import register_train_spec\n\n"
        + build
        + "\n\n@dataclasses.dataclass\nclass JobConfig:\n"
        '    """No job-config fields of its own: ConfigManager merges this dataclass into its JobConfig."""\n\n\n'
        f'register_train_spec("{custom.spec}", dataclasses.replace(get_train_spec(), '
        f'model_args={{"{CUSTOM_FLAVOR}": MODEL_ARGS}}))\n'
    )


_SCHEDULES: Final = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


def _layers_per_stage(num_layers: int, stages: int) -> tuple[int, int] | None:
    """``(layers_per_stage, edge_weight)`` giving exactly ``stages`` stages in ``pipeline_llm``:
    ``ceil((L + 2·edge_weight) / layers_per_stage) == stages``, trying torchtitan's default
    first/last-stage weight of 1 (embedding and output count as a layer each), then 0."""
    for weight in (1, 0):
        for lps in range(1, num_layers + 3):
            if math.ceil((num_layers + 2 * weight) / lps) == stages:
                return lps, weight
    return None


def data_parallel(layout: Layout, target: str = TARGET) -> tuple[int, int, tuple[str, ...]]:
    """``(data_parallel_replicate_degree, data_parallel_shard_degree, warnings)``: FSDP2 shards over
    dp_shard·cp, DDP replicates over dp_replicate (``torchtitan/distributed/parallel_dims.py``, the
    same fields in 0.2.2 and 0.3.0); ZeRO-1 has no FSDP2 form."""
    warnings: list[str] = []
    if layout.zero == 1:
        raise unsupported(
            target,
            "zero",
            "ZeRO-1 (FSDP2 shards gradients with the optimizer states)",
            "plan with --zero 2 (fsdp_reshard_after_forward = never) or --zero 3",
        )
    if layout.zero == 0:
        replicate, shard = layout.dp, 1
        if layout.cp > 1:
            warnings.append(
                f"torchtitan applies FSDP over the context-parallel group (cp={layout.cp}) even without "
                "ZeRO, so model states are sharded cp ways where the plan replicates them"
            )
    else:
        replicate, shard = 1, layout.dp
    return replicate, shard, tuple(warnings)


def pipeline(
    model: ModelSpec, recipe: Recipe, layout: Layout, facts: PlanFacts, target: str = TARGET
) -> tuple[int, dict[str, object]]:
    """``(training.local_batch_size, parallelism fields)``: without PP the micro-batches are
    gradient-accumulation steps; with PP they are the pipeline's micro-batches inside one local batch
    (the same ``ParallelismConfig`` fields in 0.2.2 and 0.3.0, ``pipeline_llm`` in both)."""
    training: dict[str, object] = {}
    parallelism: dict[str, object] = {}
    if layout.pp > 1:
        if layout.pp_schedule == "zb":
            raise unsupported(
                target,
                "pp_schedule",
                "a zero-bubble schedule with one stage per rank (torch's zero-bubble schedules, "
                "InterleavedZeroBubble and ZBVZeroBubble, need 2 or more stages per rank)",
                "plan with --pp-schedule interleaved --virtual-stages 2, or 1f1b",
            )
        training["local_batch_size"] = recipe.micro_batch * facts.micro_batches
        parallelism["pipeline_parallel_schedule"] = _SCHEDULES[layout.pp_schedule]
        parallelism["pipeline_parallel_microbatch_size"] = recipe.micro_batch
        if layout.pp_schedule == "interleaved" and layout.virtual_stages != 2:
            lps = _layers_per_stage(model.num_layers, layout.pp * layout.virtual_stages)
            if lps is None:
                raise unsupported(
                    target,
                    "virtual_stages",
                    f"{layout.pp}·{layout.virtual_stages} stages of {model.num_layers} layers "
                    "(no pipeline_parallel_layers_per_stage gives that many)",
                    "choose another --virtual-stages",
                )
            if (layout.pp_split_embedding or layout.pp_split_head) and (
                int(layout.pp_split_embedding),
                int(layout.pp_split_head),
            ) != (lps[1], lps[1]):
                raise unsupported(
                    target,
                    "pp_split_embedding",
                    f"{layout.pp}·{layout.virtual_stages} stages of {model.num_layers} layers with the "
                    "embedding / head in the split as given (pipeline_parallel_layers_per_stage fixes "
                    "the first and last stage's weights together)",
                    "give both --pp-split-embedding and --pp-split-head, or neither",
                )
            parallelism["pipeline_parallel_layers_per_stage"] = lps[0]
            if lps[1] != 1:
                parallelism["pipeline_parallel_first_stage_less_layers"] = lps[1]
                parallelism["pipeline_parallel_last_stage_less_layers"] = lps[1]
        elif layout.pp_split_embedding or layout.pp_split_head:
            # torchtitan's pipeline_llm counts the embedding and the output as input_weight /
            # output_weight layers of the split (distributed/pipeline_parallel.py
            # generate_llm_fqn_per_model_part), the rule of layout.stage_layers
            parallelism["pipeline_parallel_first_stage_less_layers"] = int(layout.pp_split_embedding)
            parallelism["pipeline_parallel_last_stage_less_layers"] = int(layout.pp_split_head)
    else:
        training["local_batch_size"] = recipe.micro_batch
    return int(str(training["local_batch_size"])), parallelism


def precision(recipe: Recipe, layout: Layout, target: str = TARGET) -> dict[str, object]:
    """The ``training`` fields of the plan's precision and offload: ``mixed_precision_param``,
    ``dtype`` (bfloat16 = pure 16-bit, no fp32 master copy) and FSDP2 ``enable_cpu_offload``
    (the same ``TrainingConfig`` fields in 0.2.2 and 0.3.0)."""
    training: dict[str, object] = {}
    if recipe.precision == "fp16":
        raise unsupported(
            target, "precision", "fp16 (training dtypes are bfloat16 and float32)", "plan with bf16"
        )
    if recipe.precision == "fp32":
        training["mixed_precision_param"] = "float32"
    else:
        training["mixed_precision_param"] = "bfloat16"
    if not recipe.master_weights:
        if recipe.precision != "bf16":
            raise unsupported(
                target,
                "master_weights",
                f"pure 16-bit training with precision {recipe.precision}",
                "plan pure 16-bit training with --precision bf16",
            )
        training["dtype"] = "bfloat16"
    else:
        training["dtype"] = "float32"

    if recipe.offload == "optimizer+params":
        if layout.zero != 3:
            raise unsupported(target, "offload", "CPU offload without FSDP sharding", "plan with --zero 3")
        training["enable_cpu_offload"] = True
    elif recipe.offload == "optimizer":
        raise unsupported(
            target,
            "offload",
            "offloading only the optimizer (FSDP2 CPU offload moves parameters, gradients and "
            "optimizer states together)",
            "plan with --offload optimizer+params or none",
        )

    return training


def build_config(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[Config, PlanFacts, tuple[str, ...]]:
    """The job config as nested tables, the plan facts, and warnings."""
    facts = plan_facts(system, model, recipe, layout)
    warnings: list[str] = []
    flavor = find_flavor(model)
    custom = custom_model(model, recipe, layout) if flavor is None else None

    if recipe.method not in ("pretrain", "full"):
        raise unsupported(
            TARGET,
            "method",
            f"method {recipe.method!r} (the {VERSION} trainer updates all weights of one model with a "
            "next-token loss: no LoRA/QLoRA adapters, no preference or RL objectives; LoRA came in "
            "torchtitan 0.3.0, torchtitan/components/lora.py LoRAConverter, configured by Python "
            "config modules instead of the TOML job config: the torchtitan target writes that form "
            "for LoRA plans)",
            "export a LoRA plan to torchtitan (its 0.3.0 config), or export to deepspeed or accelerate "
            "and apply PEFT in the training script",
        )
    check_kernels(recipe, TARGET, "SDPA/flex attention kernels")
    if recipe.loss_chunks != 1:
        raise unsupported(TARGET, "loss_chunks", "chunked cross-entropy", "plan with --loss-chunks 1")
    optimizer = {"adamw": "AdamW"}.get(recipe.optimizer)
    if optimizer is None:
        raise unsupported(
            TARGET,
            "optimizer",
            f"optimizer {recipe.optimizer!r} (build_optimizers knows Adam and AdamW)",
            "plan with --optimizer adamw",
        )

    replicate, shard, dp_warnings = data_parallel(layout)
    warnings.extend(dp_warnings)
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "never" if layout.zero == 2 else "default",
        "tensor_parallel_degree": layout.tp,
        "context_parallel_degree": layout.cp,
        "pipeline_parallel_degree": layout.pp,
        "expert_parallel_degree": layout.ep,
        "expert_tensor_parallel_degree": layout.tp if layout.ep > 1 else 1,
    }
    if layout.tp > 1 and not layout.sequence_parallel:
        raise unsupported(
            TARGET,
            "sequence_parallel",
            "tensor parallelism without sequence parallelism (its TP plans always shard norms "
            "along the sequence)",
            "plan with --sequence-parallel",
        )
    if layout.ep > 1 and layout.ep > layout.dp * layout.cp:
        raise unsupported(TARGET, "ep", f"ep={layout.ep} > dp·cp", "lower ep")
    needs_compile = recipe.precision in ("fp8", "fp4") or layout.tp_comm_overlap
    if layout.tp_comm_overlap:
        # Async TP (``torchtitan/distributed/tensor_parallel.py::maybe_enable_async_tp``) works only
        # under torch.compile, which the [compile] table below then enables.
        parallelism["enable_async_tensor_parallel"] = True

    # -- batch: without PP the micro-batches are gradient-accumulation steps; with PP they are the
    # pipeline's micro-batches inside one local batch.
    training: dict[str, object] = {"seq_len": recipe.seq_len, "global_batch_size": facts.global_batch}
    from trainplan.export.megatron import train_steps

    steps = train_steps(recipe, facts.global_batch)
    if steps is not None:
        training["steps"] = steps  # also the length of its learning-rate schedule (lr_scheduler.py)
    local_batch, pp_fields = pipeline(model, recipe, layout, facts)
    training["local_batch_size"] = local_batch
    parallelism.update(pp_fields)

    training.update(precision(recipe, layout))

    if flavor is not None:
        model_table: dict[str, object] = {"name": flavor.module, "flavor": flavor.flavor}
    else:
        assert custom is not None
        model_table = {"name": custom.spec, "flavor": CUSTOM_FLAVOR}
    config: Config = {
        "job": {
            "description": f"trainplan: {model.name} on {system.num_devices} x {system.accelerator.name}"
        },
        "model": model_table,
        "optimizer": {"name": optimizer, "early_step_in_backward": recipe.optimizer_in_backward},
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": "selective" if recipe.recompute == "sac" else recipe.recompute},
        "compile": {
            "enable": recipe.torch_compile or needs_compile,
            "components": ["model", "loss"],
        },
    }
    if custom is not None:
        config["job"]["custom_config_module"] = custom.module
        warnings.append(
            f"{model.name} is built by the train spec that {custom.module}.py registers (launch with "
            f"PYTHONPATH=. beside it): its RoPE base ({ROPE_THETA:g}) and RMSNorm eps ({NORM_EPS:g}) are "
            f"the defaults of torchtitan's TransformerModelArgs, set {model.name}'s own there"
        )
    if needs_compile and not recipe.torch_compile:
        warnings.append(
            "[compile] enable = true: torchtitan's float8/MX linears and async TP run under torch.compile, "
            "but the estimate priced eager kernels; give --torch-compile for the compiled step time"
        )
    if recipe.recompute in ("full", "sac"):
        # _apply_full_ac and _apply_op_sac both pass it to torch.utils.checkpoint
        config["activation_checkpoint"]["early_stop"] = recipe.recompute_early_stop
    check_megatron_options(recipe, TARGET)
    check_loss(recipe, TARGET)
    if recipe.recompute_every > 1:
        # torchtitan/distributed/activation_checkpoint.py::_apply_layer_sac: every n-th block
        config["activation_checkpoint"]["mode"] = "selective"
        config["activation_checkpoint"]["selective_ac_option"] = str(recipe.recompute_every)
    if recipe.recompute == "sac":
        # torchtitan/distributed/activation_checkpoint.py::_apply_op_sac with the Llama 3 save list
        # (torchtitan/models/llama3/infra/parallelize.py::_op_sac_save_list): what "sac" counts
        config["activation_checkpoint"]["selective_ac_option"] = "op"
    if recipe.recompute == "selective":
        config["activation_checkpoint"]["selective_ac_option"] = "op"
        warnings.append(
            "recompute selective -> torchtitan per-op selective checkpointing (saves every other "
            "matmul output), not the plan's attention-only recompute; its memory differs "
            "(plan with --recompute sac for the matching estimate)"
        )
    if recipe.precision == "fp8":
        fsdp = shard * layout.cp > 1
        config["model"]["converters"] = ["quantize.linear.float8"]
        config["quantize.linear.float8"] = {
            "recipe_name": "tensorwise",
            "enable_fsdp_float8_all_gather": fsdp,
            "precompute_float8_dynamic_scale_for_fsdp": fsdp,
        }
        if model.moe is not None:
            warnings.append("fp8 covers nn.Linear layers; the experts' grouped GEMMs stay in bf16")
    elif recipe.precision == "fp4":
        config["model"]["converters"] = ["quantize.linear.mx"]
        config["quantize.linear.mx"] = {"recipe_name": "mxfp4_cutlass"}
        warnings.append("fp4 -> MX recipe mxfp4_cutlass (torchao prototype; needs Blackwell-class GPUs)")
    return _nest(config), facts, tuple(warnings)


def _nest(config: Config) -> Config:
    """Turn dotted table names (``quantize.linear.float8``) into nested tables."""
    out: dict[str, dict[str, object]] = {}
    for name, table in config.items():
        head, *rest = name.split(".")
        node: dict[str, object] = out.setdefault(head, {})
        for part in rest:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node.update(table)
    return out


def writes_0_3(recipe: Recipe) -> bool:
    """Whether the ``torchtitan`` target writes this plan as the torchtitan 0.3.0 config module
    (:mod:`trainplan.export.torchtitan03`): adapter plans, which only 0.3.0 trains (QLoRA is
    refused there, naming the targets that run it)."""
    return recipe.method in ("lora", "qlora")


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    if writes_0_3(recipe):
        from trainplan.export import torchtitan03

        return torchtitan03.render(system, model, recipe, layout)
    config, facts, warnings = build_config(system, model, recipe, layout)
    module = config["job"].get("custom_config_module")
    header = (
        f"torchtitan {VERSION} job config written by trainplan",
        f"{model.name}, {recipe.method}, {recipe.precision}, layout {layout.describe()}",
        *((f"the model is registered by {module}.py, written beside this file",) if module else ()),
        f"launch on {facts.num_nodes} node(s) x {facts.nproc_per_node} process(es): "
        + ("PYTHONPATH=. " if module else "")
        + f"torchrun --nnodes {facts.num_nodes} --nproc-per-node {facts.nproc_per_node} "
        "-m torchtitan.train --job.config_file THIS_FILE",
    )
    return to_toml(config, header=header), warnings


def cli_overrides(config: Config) -> list[str]:
    """The same settings as ``--section.key value`` flags of torchtitan's ``ConfigManager`` (tyro)."""
    args: list[str] = []

    def walk(table: dict[str, object], path: tuple[str, ...]) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk(value, (*path, key))
                continue
            flag = "--" + ".".join((*path, key))
            if isinstance(value, bool):
                # tyro spells a false boolean as --section.no-key / --section.no_key.
                args.append(flag if value else "--" + ".".join((*path, "no_" + key)))
            elif isinstance(value, list):
                args.extend([flag, ",".join(str(v) for v in value)])
            else:
                args.extend([flag, str(value)])

    walk(dict(config), ())
    return args
