"""torchtitan 0.3.0 configuration (a Python config module) for a LoRA plan.

torchtitan 0.3.0 (PyPI ``torchtitan==0.3.0``) has low-rank adapters
(``torchtitan/components/lora.py::LoRAConverter``, pytorch/torchtitan PR #3264) and no TOML job
config: ``torchtitan/config/manager.py::ConfigManager`` imports ``--module`` (a module path) and
calls its ``--config`` function, which returns a ``torchtitan/trainer.py::Trainer.Config`` built of
nested config dataclasses. The ``torchtitan`` target writes this form for LoRA plans (the 0.2.2 TOML
job config of :mod:`trainplan.export.torchtitan` has no adapters); the file is that module:

``model_spec``
    ``torchtitan/protocols/model_spec.py::ModelSpec`` with the llama3 model
    (``torchtitan/models/llama3/model.py::Llama3Model.Config``) built exactly as the registered
    flavors are, by ``torchtitan/models/llama3/__init__.py::_build_llama3_layers``, with the plan's
    dimensions and ``fuse_qkv=False``, so that ``wq`` and ``wkv`` (the config ``wk`` and ``wv`` are
    built from, ``torchtitan/models/common/attention.py::QKVLinear``) are separate Linear configs
    an adapter can target, as the plan's q, k, v adapters are. ``LoRAConverter.Config(rank, alpha,
    target_modules)`` converts the config tree (every other module is frozen), the way
    ``torchtitan/models/llama3/config_registry.py::llama3_debugmodel_float8_emulate_lora`` applies it.
``training`` ``TrainingConfig``: ``local_batch_size``, ``global_batch_size``, ``seq_len``,
    ``steps`` (from ``--tokens``), ``dtype``, ``mixed_precision_param``, ``enable_cpu_offload``, and
    ``disable_cuda_graphs = True`` (0.3.0 captures the step in a CUDA graph by default; trainplan's
    step time and memory are the eager step's, and PP refuses graphs).
``parallelism`` ``ParallelismConfig``: ``data_parallel_replicate_degree``,
    ``data_parallel_shard_degree``, ``fsdp_reshard_after_forward``, ``tensor_parallel_degree``,
    ``enable_sequence_parallel``, ``context_parallel_degree``, ``pipeline_parallel_*``.
``activation_checkpoint`` ``FullAC.Config`` (full), ``SelectiveAC.Config`` (per-op SAC, the
    policy :mod:`trainplan.sac` models) or ``None``; both pass ``early_stop=False`` to
    ``torch.utils.checkpoint`` (``torchtitan/distributed/activation_checkpoint.py``).
``compile`` ``CompileConfig``: ``enable``, ``enable_async_tensor_parallel`` (the plan's TP overlap).
``loss`` ``CrossEntropyLoss.Config`` or ``ChunkedLossWrapper.Config(num_chunks)``.
``optimizer`` ``torchtitan/components/optimizer/optimizer.py::default_adamw``.
``checkpoint`` ``CheckpointManager.Config(enable, initial_load_in_hf)``: the frozen base weights
    are read from ``hf_assets_path`` (Hugging Face safetensors) before the first step.

Every key is checked against the field lists of those classes copied into the package
(``trainplan/data/torchtitan_0_3_schema.json``, ``dataclasses.fields`` of the 0.3.0 wheel), and
the classes themselves refuse an unknown key when the module is imported.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any, Final

from trainplan.data_files import data_text
from trainplan.errors import TrainplanError
from trainplan.export import torchtitan as tt
from trainplan.export._common import PlanFacts, check_loss, check_megatron_options, plan_facts, unsupported
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LoRASpec, Recipe

VERSION: Final = "0.3.0"
TARGET: Final = f"torchtitan {VERSION}"
MODULE: Final = "trainplan_torchtitan"
"""The default file's module name: ``--module trainplan_torchtitan``."""
CONFIG_FUNCTION: Final = "trainplan_config"
METHODS: Final = ("lora",)
"""The plans the ``torchtitan`` target writes in this form (the others as the 0.2.2 job config)."""

LORA_MODULES: Final = {"q": "wq", "k": "wkv", "v": "wkv", "o": "wo", "gate": "w1", "up": "w3", "down": "w2"}
"""trainplan's adapter targets → the last name of the Linear config in torchtitan's llama3 model
(``torchtitan/models/common/config_utils.py::make_gqa_config`` / ``make_ffn_config``: w1 gate,
w3 up, w2 down), which is what ``LoRAConverter`` matches (the last segment of the config's FQN)."""

# The llama3 flavors' rotary settings (torchtitan/models/llama3/__init__.py: ComplexRoPE theta
# 500000 with Llama 3.1 scaling); any other model gets ComplexRoPE.Config's defaults.
FLAVOR_ROPE: Final[dict[str, object]] = {"theta": 500000.0, "scaling": "llama"}
DEFAULT_ROPE: Final[dict[str, object]] = {"theta": 10000.0, "scaling": "none"}
DEFAULT_LR: Final = 8e-4  # default_adamw's lr


@cache
def schema() -> dict[str, Any]:
    """The copied field lists (``classes``), the builder's parameters and their source."""
    text = data_text("trainplan", "data", "torchtitan_0_3_schema.json")
    data: dict[str, Any] = json.loads(text)
    return data


SECTION_CLASSES: Final = {
    "training": "TrainingConfig",
    "parallelism": "ParallelismConfig",
    "compile": "CompileConfig",
    "lora": "LoRAConverter.Config",
    "checkpoint": "CheckpointManager.Config",
    "rope": "ComplexRoPE.Config",
    "dataloader": "HuggingFaceTextDataLoader.Config",
}
"""The config class each section's keyword arguments go to."""

Sections = dict[str, dict[str, object]]


def splits_kv(lora: LoRASpec) -> bool:
    """Whether the plan adapts k without v or v without k: the llama3 model builds ``wk`` and ``wv``
    from one config, ``wkv`` (``torchtitan/models/common/attention.py::QKVLinear``), so the module
    then builds ``wv`` from a config of its own (``SplitKVLinear``) for the adapter to tell apart."""
    return len({"k", "v"} & set(lora.targets)) == 1


def lora_modules(lora: LoRASpec) -> list[str]:
    """``LoRAConverter.Config.target_modules`` for the plan's adapters (the config names of
    :data:`LORA_MODULES`; ``wv`` for v when :func:`splits_kv`)."""
    out: list[str] = []
    for t in lora.targets:
        name = "wv" if t == "v" and splits_kv(lora) else LORA_MODULES[t]
        if name not in out:
            out.append(name)
    return out


def _check(model: ModelSpec, recipe: Recipe, layout: Layout) -> None:
    """What torchtitan 0.3.0's LoRA trainer cannot run, refused naming the reason and a way out."""
    if recipe.method == "qlora":
        raise unsupported(
            TARGET,
            "method",
            "QLoRA (LoRAConverter adapts bf16 / float8 Linear layers; torchtitan has no 4-bit NF4 "
            "base weights)",
            "export to deepspeed or accelerate (PEFT with bitsandbytes), or plan --method lora",
        )
    if recipe.method not in METHODS:
        raise TrainplanError("method", f"the torchtitan {VERSION} config is written for {', '.join(METHODS)}")
    tt.check_architecture(model, recipe, TARGET, "deepspeed or accelerate")
    if model.moe is not None:
        raise unsupported(
            TARGET,
            "model",
            f"adapters on {model.name}'s experts (LoRAConverter converts Linear configs; the experts are "
            "grouped GEMMs, torchtitan/models/common/moe)",
            "export to deepspeed or accelerate (PEFT)",
        )
    if model.qk_norm or model.head_dim * model.num_heads != model.hidden_size:
        raise unsupported(
            TARGET,
            "model",
            f"{model.name}: q/k norms or a head width other than dim/heads (the llama3 layer builder, "
            "_build_llama3_layers, has neither)",
            "export to deepspeed or accelerate (PEFT)",
        )
    tt.check_kernels(recipe, TARGET, "flex attention")
    if recipe.optimizer != "adamw":
        raise unsupported(
            TARGET,
            "optimizer",
            f"optimizer {recipe.optimizer!r} (the config uses default_adamw)",
            "plan with --optimizer adamw",
        )
    if recipe.optimizer_in_backward:
        raise unsupported(
            TARGET,
            "optimizer_in_backward",
            "stepping the optimizer in backward (0.3.0's OptimizersContainer has no early step)",
            "plan without --optimizer-in-backward",
        )
    if recipe.precision in ("fp8", "fp4"):
        raise unsupported(
            TARGET,
            "precision",
            f"{recipe.precision} with adapters (this config trains the adapters in bf16 over bf16 base weights)",
            "plan with --precision bf16",
        )
    if recipe.recompute in ("full", "sac") and recipe.recompute_early_stop:
        raise unsupported(
            TARGET,
            "recompute_early_stop",
            "recompute with early stop (FullAC and SelectiveAC pass early_stop=False to "
            "torch.utils.checkpoint, torchtitan/distributed/activation_checkpoint.py)",
            "plan with --no-recompute-early-stop (the torchtitan engine's default)",
        )
    check_megatron_options(recipe, TARGET)
    check_loss(recipe, TARGET)
    if recipe.recompute_every > 1:
        raise unsupported(
            TARGET,
            "recompute_every",
            "recomputing every n-th block (0.3.0 has no layer-wise selective checkpointing)",
            "plan with --recompute-every 1",
        )
    if layout.ep > 1:
        raise unsupported(TARGET, "ep", "expert parallelism for a dense model", "plan with --ep 1")
    if splits_kv(recipe.lora or LoRASpec()) and layout.tp > 1:
        raise unsupported(
            TARGET,
            "lora_targets",
            "an adapter on k without v (or v without k) under tensor parallelism (the llama3 model "
            "builds wk and wv from one config, wkv, and its TP plan shards only that one: "
            "torchtitan/models/common/decoder_sharding.py set_qkv_linear_sharding)",
            "plan with --lora-targets naming both k and v, or neither, or with --tp 1",
        )


def _hf_name(model: ModelSpec) -> str:
    return re.sub(r"[^0-9a-zA-Z.]+", "-", model.name)


def build_config(
    system: System, model: ModelSpec, recipe: Recipe, layout: Layout
) -> tuple[Sections, dict[str, object], PlanFacts, tuple[str, ...]]:
    """The sections (config class → keyword arguments), the other settings the module writes
    (model dimensions, activation checkpointing, loss chunks, paths), the plan facts and warnings."""
    facts = plan_facts(system, model, recipe, layout)
    _check(model, recipe, layout)
    lora = recipe.lora or LoRASpec()
    warnings: list[str] = []
    replicate, shard, dp_warnings = tt.data_parallel(layout, TARGET)
    warnings.extend(dp_warnings)
    local_batch, pp_fields = tt.pipeline(model, recipe, layout, facts, TARGET)
    training: dict[str, object] = {
        "local_batch_size": local_batch,
        "global_batch_size": facts.global_batch,
        "seq_len": recipe.seq_len,
        **tt.precision(recipe, layout, TARGET),
        # 0.3.0 captures the step in a CUDA graph by default (trainer.py _validate_cuda_graphs, which
        # also refuses it under PP); the estimate's time and memory are those of the eager step
        "disable_cuda_graphs": True,
    }
    from trainplan.export.megatron import train_steps

    steps = train_steps(recipe, facts.global_batch)
    if steps is not None:
        training["steps"] = steps  # also the length of its learning-rate schedule (lr_scheduler.py)
    else:
        warnings.append("no --tokens: training.steps keeps TrainingConfig's 10000")
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "never" if layout.zero == 2 else "default",
        "tensor_parallel_degree": layout.tp,
        "enable_sequence_parallel": layout.sequence_parallel,
        "context_parallel_degree": layout.cp,
        "pipeline_parallel_degree": layout.pp,
        **pp_fields,
    }
    flavor = tt.find_flavor(model)
    rope = dict(FLAVOR_ROPE if flavor is not None and flavor.module == "llama3" else DEFAULT_ROPE)
    if flavor is None or flavor.module != "llama3":
        warnings.append(
            f"RoPE base {DEFAULT_ROPE['theta']:g} without scaling and RMSNorm eps are torchtitan's defaults: "
            f"set {model.name}'s own in ROPE and the norm configs"
        )
    rope.update(dim=model.head_dim, max_seq_len=max(recipe.seq_len, model.max_seq_len))
    sections: Sections = {
        "training": training,
        "parallelism": parallelism,
        "compile": {
            "enable": layout.tp_comm_overlap,
            "enable_async_tensor_parallel": layout.tp_comm_overlap,
        },
        "lora": {"rank": lora.rank, "alpha": float(lora.alpha), "target_modules": lora_modules(lora)},
        "checkpoint": {"enable": True, "initial_load_in_hf": True},
        "rope": rope,
        "dataloader": {"dataset": "c4"},
    }
    if recipe.recompute == "selective":
        warnings.append(
            "recompute selective -> torchtitan per-op selective checkpointing (saves every other "
            "matmul output), not the plan's attention-only recompute; its memory differs "
            "(plan with --recompute sac for the matching estimate)"
        )
    ac = {"none": None, "full": "FullAC", "sac": "SelectiveAC", "selective": "SelectiveAC"}[recipe.recompute]
    other: dict[str, object] = {
        "dim": model.hidden_size,
        "n_layers": model.num_layers,
        "n_heads": model.num_heads,
        "n_kv_heads": model.num_kv_heads,
        "hidden_dim": model.ffn_hidden,
        "vocab_size": model.vocab_size,
        "enable_weight_tying": model.tied_embeddings,
        "activation_checkpoint": ac,
        "loss_chunks": recipe.loss_chunks,
        "hf_assets_path": f"./assets/hf/{_hf_name(model)}",
    }
    warnings.append(
        f"the frozen base weights are read from hf_assets_path ({other['hf_assets_path']}, Hugging Face "
        "safetensors and tokenizer: torchtitan's scripts/download_hf_assets.py), the data is c4: set yours"
    )
    warnings.append(f"learning rate: default_adamw's {DEFAULT_LR:g}; set the run's own")
    return sections, other, facts, tuple(warnings)


def _py(value: object) -> str:
    """``value`` as Python source: strings (and lists of them) in double quotes."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


def _kwargs(values: dict[str, object], indent: str) -> str:
    return "".join(f"{indent}{json.dumps(k)}: {_py(v)},\n" for k, v in values.items())


_IMPORTS: Final = (
    "from torchtitan.components.checkpoint import CheckpointManager",
    "from torchtitan.components.lora import LoRAConverter",
    "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
    "from torchtitan.components.optimizer import default_adamw",
    "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
    "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
    "from torchtitan.distributed.pipeline_parallel import pipeline_llm",
    "from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader",
    "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
    "from torchtitan.models.common.attention import QKVLinear",
    "from torchtitan.models.common.config_utils import decoder_vocab_size",
    "from torchtitan.models.llama3 import Llama3Model, parallelize_llama",
    "from torchtitan.models.llama3 import _EMBEDDING_INIT, _NORM_INIT, _build_llama3_layers, _output_linear_init",
    "from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter",
    "from torchtitan.models.utils import validate_converter_order",
    "from torchtitan.protocols.model_spec import ModelSpec",
    "from torchtitan.trainer import Trainer",
)

_SPLIT_KV: Final = '''

class SplitKVLinear(QKVLinear):
    """QKVLinear with wv built from a config of its own (QKVLinear builds wk and wv from wkv), so
    that LoRAConverter, which matches configs by name, adapts one of them."""

    @dataclass(kw_only=True, slots=True)
    class Config(QKVLinear.Config):
        wv: Linear.Config

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.wv = config.wv.build()
'''

_SPLIT_LAYERS: Final = """\
    for layer in config.layers:
        qkv = layer.attention.qkv_linear
        kept = {f.name: getattr(qkv, f.name) for f in fields(qkv) if f.init}
        layer.attention.qkv_linear = SplitKVLinear.Config(**kept, wv=replace(qkv.wkv))
"""


def render(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> tuple[str, tuple[str, ...]]:
    sections, other, facts, warnings = build_config(system, model, recipe, layout)
    split = splits_kv(recipe.lora or LoRASpec())
    launch = (
        f"PYTHONPATH=. torchrun --nnodes {facts.num_nodes} --nproc-per-node {facts.nproc_per_node} "
        f"-m torchtitan.train --module {MODULE} --config {CONFIG_FUNCTION}"
    )
    if facts.num_nodes > 1:
        warnings = (
            *warnings,
            "multi-node: run the same command on every node with torchrun's rendezvous flags",
        )
    tables = "".join(
        f"{name.upper()} = {{\n{_kwargs(values, '    ')}}}\n" for name, values in sections.items()
    )
    ac = other["activation_checkpoint"]
    ac_code = "None" if ac is None else f"{ac}.Config()"
    chunks = int(str(other["loss_chunks"]))
    vocab = "global_vocab_size=decoder_vocab_size(model_spec)"
    loss_code = (
        f"CrossEntropyLoss.Config({vocab})"
        if chunks == 1
        else f"ChunkedLossWrapper.Config(num_chunks={chunks}, loss_fn=CrossEntropyLoss.Config({vocab}))"
    )
    header = (
        f"# torchtitan {VERSION} config written by trainplan\n"
        f"# {model.name}, {recipe.method}, {recipe.precision}, layout {layout.describe()}\n"
        f"# save as {MODULE}.py and launch on {facts.num_nodes} node(s) x {facts.nproc_per_node} process(es):\n"
        f"#   {launch}\n"
        f'"""{model.name} with low-rank adapters for torchtitan {VERSION}: {CONFIG_FUNCTION}() returns the\n'
        "Trainer.Config; every dictionary below is the keyword arguments of one config class, which\n"
        'refuses a key it does not have."""\n\n'
    )
    imports = [i for i in _IMPORTS if split or "QKVLinear" not in i]
    constants = (
        f"DIM, N_LAYERS, N_HEADS, N_KV_HEADS = {other['dim']}, {other['n_layers']}, {other['n_heads']}, "
        f"{other['n_kv_heads']}\n"
        f"HIDDEN_DIM, VOCAB_SIZE = {other['hidden_dim']}, {other['vocab_size']}\n"
        f"HF_ASSETS_PATH = {json.dumps(other['hf_assets_path'])}\n"
    )
    model_fn = f'''

def model_config() -> Llama3Model.Config:
    """The llama3 model as its registered flavors build it (torchtitan/models/llama3/__init__.py),
    separate wq / wkv configs for the adapters, then LoRAConverter over the config tree."""
    config = Llama3Model.Config(
        dim=DIM,
        vocab_size=VOCAB_SIZE,
        enable_weight_tying={other["enable_weight_tying"]!r},
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB_SIZE, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB_SIZE, param_init=_output_linear_init(DIM)),
        layers=_build_llama3_layers(
            n_layers=N_LAYERS,
            dim=DIM,
            n_heads=N_HEADS,
            n_kv_heads=N_KV_HEADS,
            hidden_dim=HIDDEN_DIM,
            rope=ComplexRoPE.Config(**ROPE),
            fuse_qkv=False,
            attn_backend="flex",
        ),
    )
{_SPLIT_LAYERS if split else ""}    converters = [LoRAConverter.Config(**LORA)]
    validate_converter_order(converters)
    for converter in converters:
        config = converter.build().convert(config)
    return config


def {CONFIG_FUNCTION}() -> Trainer.Config:
    """The plan as torchtitan's Trainer.Config."""
    model_spec = ModelSpec(
        name="llama3",
        flavor="trainplan",
        model=model_config(),
        parallelize_fn=parallelize_llama,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=None,
        state_dict_adapter=Llama3StateDictAdapter,
    )
    return Trainer.Config(
        model_spec=model_spec,
        hf_assets_path=HF_ASSETS_PATH,
        loss={loss_code},
        optimizer=default_adamw(),
        training=TrainingConfig(**TRAINING),
        parallelism=ParallelismConfig(**PARALLELISM),
        compile=CompileConfig(**COMPILE),
        activation_checkpoint={ac_code},
        checkpoint=CheckpointManager.Config(**CHECKPOINT),
        dataloader=HuggingFaceTextDataLoader.Config(**DATALOADER),
    )
'''
    text = (
        header
        + ("from dataclasses import dataclass, fields, replace\n\n" if split else "")
        + "\n".join(imports)
        + "\n\n"
        + constants
        + tables
        + (_SPLIT_KV if split else "")
        + model_fn
    )
    return text, warnings
