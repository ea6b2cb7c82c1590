"""Exports round-trip: each file is read back by the engine's own config parser and the degrees and
batch sizes it reports equal the plan's. Plans a target cannot express are errors naming the field.

Engine parsers (the optional ``export-check`` extra; each test skips with the reason when absent):
torchtitan 0.2.2 ``ConfigManager`` + ``ParallelDims``, DeepSpeed 0.19.8 ``DeepSpeedConfig``,
Accelerate 1.15.0 ``accelerate launch`` config handling, torch's ``torchrun`` argument parser.
"""

from __future__ import annotations

import abc
import importlib.util
import json
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.export import TARGETS, export_plan
from trainplan.export import deepspeed as ds_export
from trainplan.export import torchrun as torchrun_export
from trainplan.export import torchtitan as tt_export
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe

H100 = get_accelerator("h100-sxm", [])


def _plan(
    model: str = "llama-3.1-8b", devices: int = 8, recipe: dict[str, Any] | None = None, **layout: Any
) -> tuple[System, ModelSpec, Recipe, Layout]:
    return (
        System(accelerator=H100, num_devices=devices),
        load_model(model),
        Recipe(**(recipe or {})),
        Layout.for_devices(devices, **layout),
    )


def _micro_batches(recipe: Recipe, layout: Layout) -> int:
    return layout.check_batch(
        seq_len=recipe.seq_len, micro_batch=recipe.micro_batch, global_batch=recipe.global_batch
    )


# --------------------------------------------------------------------------- torchtitan
def _torchtitan_config_manager() -> Any:
    """torchtitan's ``ConfigManager`` without running ``torchtitan/__init__.py``, which imports the
    model zoo (and with it triton, a GPU-only package). The config modules themselves only need
    torch, tyro and the standard library, and are used unchanged."""
    pytest.importorskip(
        "tyro", reason="torchtitan's config parser needs tyro (pip install -e '.[export-check]')"
    )
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or spec.submodule_search_locations is None:
            pytest.skip("torchtitan==0.2.2 not installed (pip install --no-deps torchtitan==0.2.2)")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["torchtitan"] = pkg
    from torchtitan.config import ConfigManager

    return ConfigManager


def _parallel_dims(cfg: Any, world_size: int) -> Any:
    from torchtitan.distributed.parallel_dims import ParallelDims

    p = cfg.parallelism
    return ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=world_size,
    )


TORCHTITAN_PLANS = [
    pytest.param({"model": "llama-3.1-8b", "devices": 8, "zero": 3}, id="fsdp"),
    pytest.param({"model": "llama-3.1-8b", "devices": 8, "zero": 0}, id="ddp"),
    pytest.param(
        {
            "model": "llama-3.1-8b",
            "devices": 8,
            "zero": 3,
            "recipe": {"recompute": "full", "recompute_early_stop": True},
        },
        id="fsdp-full-recompute-early-stop",
    ),
    pytest.param(
        {"model": "llama-3.1-8b", "devices": 8, "zero": 3, "recipe": {"recompute": "sac", "micro_batch": 2}},
        id="fsdp-per-op-sac",
    ),
    pytest.param(
        {"model": "llama-3.1-8b", "devices": 8, "zero": 2, "recipe": {"micro_batch": 2, "global_batch": 64}},
        id="zero2-accumulation",
    ),
    pytest.param(
        {
            "model": "llama-3.1-70b",
            "devices": 64,
            "tp": 4,
            "pp": 4,
            "zero": 3,
            "sequence_parallel": True,
            "pp_schedule": "interleaved",
            "virtual_stages": 4,
            "recipe": {"micro_batch": 1, "global_batch": 64, "precision": "fp8", "recompute": "full"},
        },
        id="3d-interleaved-fp8",
    ),
    pytest.param(
        {
            "model": "llama-3.1-8b",
            "devices": 16,
            "tp": 2,
            "cp": 2,
            "pp": 2,
            "zero": 3,
            "sequence_parallel": True,
            "recipe": {"micro_batch": 2, "global_batch": 32, "seq_len": 8192},
        },
        id="tp-cp-pp-1f1b",
    ),
    pytest.param(
        {"model": "qwen3-30b-a3b", "devices": 16, "ep": 8, "zero": 3, "recipe": {"micro_batch": 2}},
        id="moe-ep",
    ),
    pytest.param(
        {
            "model": "llama-3.1-8b",
            "devices": 8,
            "tp": 4,
            "zero": 3,
            "sequence_parallel": True,
            "tp_comm_overlap": True,
            "recipe": {"micro_batch": 1, "global_batch": 16},
        },
        id="async-tp",
    ),
]


@pytest.mark.parametrize("plan", TORCHTITAN_PLANS)
def test_torchtitan_roundtrip(plan: dict[str, Any], tmp_path: Path) -> None:
    config_manager = _torchtitan_config_manager()
    plan = dict(plan)
    system, model, recipe, layout = _plan(
        plan.pop("model"), plan.pop("devices"), plan.pop("recipe", None), **plan
    )
    result = export_plan("torchtitan", system, model, recipe, layout)
    path = tmp_path / result.filename
    path.write_text(result.text)
    cfg = config_manager().parse_args(["--job.config_file", str(path)])
    dims = _parallel_dims(cfg, world_size=system.num_devices)  # asserts the product equals the world size

    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (layout.tp, layout.pp, layout.cp, layout.ep)
    assert dims.dp_replicate * dims.dp_shard == layout.dp
    assert dims.dp_shard == (layout.dp if layout.zero >= 2 else 1)
    m = _micro_batches(recipe, layout)
    local = cfg.training.local_batch_size
    assert cfg.training.seq_len == recipe.seq_len
    assert cfg.training.global_batch_size == layout.dp * recipe.micro_batch * m
    # torchtitan/train.py: gradient accumulation = global // (local · dp); PP splits local into micro-batches.
    accumulation = cfg.training.global_batch_size // (local * dims.dp_replicate * dims.dp_shard)
    if layout.pp > 1:
        assert accumulation == 1
        assert local // cfg.parallelism.pipeline_parallel_microbatch_size == m
        assert cfg.parallelism.pipeline_parallel_microbatch_size == recipe.micro_batch
    else:
        assert local == recipe.micro_batch
        assert accumulation == m
    # recompute="sac" is torchtitan's per-op selective checkpointing (selective_ac_option = "op")
    assert cfg.activation_checkpoint.mode == ("selective" if recipe.recompute == "sac" else recipe.recompute)
    if recipe.recompute == "sac":
        assert cfg.activation_checkpoint.selective_ac_option == "op"
    # torchtitan passes early_stop to torch.utils.checkpoint: the job recomputes what the plan counts
    assert cfg.activation_checkpoint.early_stop == (
        recipe.recompute in ("full", "sac") and recipe.recompute_early_stop
    )
    assert cfg.model.name in ("llama3", "qwen3")
    assert ("quantize.linear.float8" in cfg.model.converters) == (recipe.precision == "fp8")
    # Async TP is the plan's TP overlap; torchtitan applies it only under torch.compile.
    assert cfg.parallelism.enable_async_tensor_parallel == layout.tp_comm_overlap
    if layout.tp_comm_overlap:
        assert cfg.compile.enable


def test_torchtitan_interleaved_stage_count() -> None:
    """torchtitan's pipeline_llm makes ceil((L + first + last) / layers_per_stage) stages: pp·v."""
    for layers, pp, v in ((32, 2, 4), (80, 4, 4), (126, 2, 3), (32, 4, 2)):
        model = load_model({32: "llama-3.1-8b", 80: "llama-3.1-70b", 126: "llama-3.1-405b"}[layers])
        devices = pp * 8
        system, _, recipe, _ = _plan(devices=devices, recipe={"global_batch": 8 * pp * 4})
        layout = Layout.for_devices(
            devices, pp=pp, tp=8, sequence_parallel=True, pp_schedule="interleaved", virtual_stages=v
        )
        config, _, _ = tt_export.build_config(system, model, recipe, layout)
        par = config["parallelism"]
        lps = par.get("pipeline_parallel_layers_per_stage")
        if lps is None:
            assert v == 2  # torchtitan's default: 2 stages per rank for looped schedules
            continue
        assert isinstance(lps, int)
        edge = par.get("pipeline_parallel_first_stage_less_layers", 1)
        assert isinstance(edge, int)
        assert -(-(layers + 2 * edge) // lps) == pp * v


def test_torchrun_roundtrip() -> None:
    """torch's own torchrun parser reads the launcher flags; torchtitan's reads the trainer flags."""
    from torch.distributed.run import get_args_parser

    config_manager = _torchtitan_config_manager()
    system, model, recipe, layout = _plan(
        devices=32, tp=4, zero=3, sequence_parallel=True, recipe={"micro_batch": 2, "global_batch": 64}
    )
    argv, _ = torchrun_export.build_argv(system, model, recipe, layout)
    assert argv[0] == "torchrun"
    args = get_args_parser().parse_args(argv[1:])
    assert args.nnodes == str(system.num_nodes) == "4"
    assert int(args.nproc_per_node) == 8
    assert args.rdzv_backend == "c10d"
    assert args.module and args.training_script == "torchtitan.train"
    cfg = config_manager().parse_args(args.training_script_args)
    dims = _parallel_dims(cfg, world_size=int(args.nnodes) * int(args.nproc_per_node))
    assert (dims.dp_shard, dims.tp) == (layout.dp, layout.tp)
    assert cfg.training.global_batch_size == 64
    assert cfg.training.local_batch_size == 2
    # The rendered text is the same command.
    text = export_plan("torchrun", system, model, recipe, layout).text
    assert "--parallelism.tensor_parallel_degree 4" in text
    assert "--nnodes 4" in text


def test_torchrun_single_node_standalone() -> None:
    from torch.distributed.run import get_args_parser

    system, model, recipe, layout = _plan(devices=4, zero=3)
    argv, _ = torchrun_export.build_argv(system, model, recipe, layout)
    args = get_args_parser().parse_args(argv[1:])
    assert args.standalone and int(args.nproc_per_node) == 4 and args.nnodes == "1"


# --------------------------------------------------------------------------- DeepSpeed
DEEPSPEED_PLANS = [
    pytest.param({"devices": 8, "zero": 3, "recipe": {"micro_batch": 2, "global_batch": 64}}, id="zero3"),
    pytest.param(
        {"devices": 16, "zero": 2, "recipe": {"micro_batch": 1, "global_batch": 128, "offload": "optimizer"}},
        id="zero2-offload",
    ),
    pytest.param(
        {"devices": 8, "zero": 3, "recipe": {"offload": "optimizer+params", "recompute": "full"}},
        id="zero3-offload-all",
    ),
    pytest.param({"devices": 8, "zero": 1, "tp": 2, "recipe": {"precision": "fp16"}}, id="autotp-fp16"),
    pytest.param({"devices": 4, "zero": 0, "recipe": {"precision": "fp32", "micro_batch": 4}}, id="ddp-fp32"),
]


@pytest.mark.parametrize("plan", DEEPSPEED_PLANS)
def test_deepspeed_roundtrip(plan: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds_config = pytest.importorskip(
        "deepspeed.runtime.config",
        reason="deepspeed==0.19.8 not installed (pip install -e '.[export-check]')",
    )
    plan = dict(plan)
    system, model, recipe, layout = _plan(
        "llama-3.1-8b", plan.pop("devices"), plan.pop("recipe", None), **plan
    )
    result = export_plan("deepspeed", system, model, recipe, layout)
    path = tmp_path / result.filename
    path.write_text(result.text)

    # DeepSpeedConfig takes the data-parallel size from the model-parallel unit once a process group
    # exists; stand both in so that its batch assertion checks against the plan's dp.
    class DataParallelUnit:
        def get_data_parallel_world_size(self) -> int:
            return layout.dp

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    cfg = ds_config.DeepSpeedConfig(str(path), mpu=DataParallelUnit())

    m = _micro_batches(recipe, layout)
    assert cfg.world_size == layout.dp
    assert cfg.train_micro_batch_size_per_gpu == recipe.micro_batch
    assert cfg.gradient_accumulation_steps == m
    assert cfg.train_batch_size == layout.dp * recipe.micro_batch * m
    assert cfg.zero_optimization_stage == layout.zero
    offload_opt = cfg.zero_config.offload_optimizer
    offload_param = cfg.zero_config.offload_param
    assert (offload_opt is not None and str(offload_opt.device).endswith("cpu")) == (recipe.offload != "none")
    assert (offload_param is not None and str(offload_param.device).endswith("cpu")) == (
        recipe.offload == "optimizer+params"
    )
    assert cfg.bfloat16_config.enabled == (recipe.precision == "bf16")
    assert cfg.float16_config.enabled == (recipe.precision == "fp16")
    assert cfg.tensor_parallel_config.autotp_size == (layout.tp if layout.tp > 1 else 0)


def test_deepspeed_batch_is_checked_by_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round trip can fail: a config whose batch disagrees with dp is rejected by DeepSpeed."""
    ds_config = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed==0.19.8 not installed")
    system, model, recipe, layout = _plan(devices=8, zero=3, recipe={"micro_batch": 2, "global_batch": 64})
    config, _, _ = ds_export.build_config(system, model, recipe, layout)
    config["train_batch_size"] = 48

    class DataParallelUnit:
        def get_data_parallel_world_size(self) -> int:
            return layout.dp

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    with pytest.raises(AssertionError, match="train_batch_size"):
        ds_config.DeepSpeedConfig(config, mpu=DataParallelUnit())


# --------------------------------------------------------------------------- Accelerate
def _accelerate_env(path: Path) -> tuple[Any, dict[str, str]]:
    """What ``accelerate launch --config_file PATH train.py`` hands the training processes."""
    launch = pytest.importorskip(
        "accelerate.commands.launch",
        reason="accelerate==1.15.0 not installed (pip install -e '.[export-check]')",
    )
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch.launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, _ = launch._validate_launch_command(args)
    if args.use_deepspeed:
        # as accelerate/commands/launch.py::launch_command does before deepspeed_launcher
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return args, env


ACCELERATE_PLANS = [
    pytest.param({"devices": 8, "zero": 3, "recipe": {"recompute": "full"}}, id="fsdp2-full-shard"),
    pytest.param({"devices": 8, "zero": 2}, id="fsdp2-zero2"),
    pytest.param({"devices": 16, "zero": 3, "tp": 2, "cp": 2, "sequence_parallel": True}, id="fsdp2-tp-cp"),
    pytest.param({"devices": 8, "zero": 0}, id="ddp"),
    pytest.param(
        {"devices": 8, "zero": 1, "recipe": {"offload": "optimizer", "micro_batch": 2, "global_batch": 64}},
        id="deepspeed-zero1",
    ),
    pytest.param({"devices": 8, "zero": 3, "recipe": {"offload": "optimizer+params"}}, id="fsdp2-offload"),
]


@pytest.mark.parametrize("plan", ACCELERATE_PLANS)
def test_accelerate_roundtrip(plan: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("yaml", reason="accelerate's config loader needs PyYAML")
    plan = dict(plan)
    system, model, recipe, layout = _plan(
        "llama-3.1-8b", plan.pop("devices"), plan.pop("recipe", None), **plan
    )
    result = export_plan("accelerate", system, model, recipe, layout)
    path = tmp_path / result.filename
    path.write_text(result.text)
    args, env = _accelerate_env(path)

    assert args.num_processes == system.num_devices
    assert args.num_machines == system.num_nodes
    assert env["ACCELERATE_MIXED_PRECISION"] == {"bf16": "bf16", "fp32": "no"}[recipe.precision]
    if layout.zero in (2, 3) or layout.tp > 1 or layout.cp > 1:
        assert args.use_fsdp and env["FSDP_VERSION"] == "2"
        assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(layout.zero == 3).lower()
        assert env["FSDP_OFFLOAD_PARAMS"] == str(recipe.offload == "optimizer+params").lower()
        assert env["FSDP_ACTIVATION_CHECKPOINTING"] == str(recipe.recompute == "full").lower()
        if layout.tp > 1 or layout.cp > 1:
            sizes = [
                int(env["PARALLELISM_CONFIG_" + k])
                for k in ("DP_REPLICATE_SIZE", "DP_SHARD_SIZE", "TP_SIZE", "CP_SIZE")
            ]
            assert sizes == [1, layout.dp, layout.tp, layout.cp]
            assert sizes[0] * sizes[1] * sizes[2] * sizes[3] == args.num_processes
    elif layout.zero == 1:
        assert args.use_deepspeed
        assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "1"
        assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == str(_micro_batches(recipe, layout))
        assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    else:
        assert args.multi_gpu and not args.use_fsdp and not args.use_deepspeed


# --------------------------------------------------------------------------- always (no engine)
@pytest.mark.parametrize("target", TARGETS)
def test_every_target_writes_parseable_text(target: str) -> None:
    system, model, recipe, layout = _plan(devices=8, zero=3, recipe={"micro_batch": 2, "global_batch": 32})
    result = export_plan(target, system, model, recipe, layout)
    assert result.text.endswith("\n") and result.filename
    if target == "torchtitan":
        data = tomllib.loads(result.text)
        assert data["parallelism"]["data_parallel_shard_degree"] == 8
        assert data["training"]["global_batch_size"] == 32
        assert data["training"]["local_batch_size"] == 2
    elif target == "deepspeed":
        data = json.loads(result.text)
        assert data["train_batch_size"] == 32 == data["train_micro_batch_size_per_gpu"] * 8 * 2
        assert data["zero_optimization"]["stage"] == 3
    elif target == "accelerate":
        assert 'distributed_type: "FSDP"' in result.text and "num_processes: 8" in result.text
    elif target == "nemo":
        compile(result.text, result.filename, "exec")
        assert '"global_batch_size": 32' in result.text and '"micro_batch_size": 2' in result.text
        assert '"data_parallel_sharding_strategy": "optim_grads_params"' in result.text
    else:
        assert result.text.splitlines()[2].startswith("torchrun")


@pytest.mark.parametrize(
    ("target", "plan", "field"),
    [
        ("torchtitan", {"recipe": {"method": "qlora"}}, "method"),
        ("torchtitan", {"model": "qwen2.5-7b"}, "model"),
        ("torchtitan", {"model": "gemma-2-9b"}, "model"),
        ("torchtitan", {"model": "qwen1.5-moe-a2.7b"}, "model"),
        ("torchtitan", {"model": "mistral-7b", "recipe": {"seq_len": 8192}}, "seq_len"),
        ("torchtitan", {"model": "llama-3.2-1b", "pp": 2}, "pp"),
        ("torchtitan", {"recipe": {"precision": "fp16"}}, "precision"),
        ("torchtitan", {"zero": 1}, "zero"),
        ("torchtitan", {"tp": 2}, "sequence_parallel"),
        ("torchtitan", {"pp": 2, "pp_schedule": "zb"}, "pp_schedule"),
        ("torchtitan", {"zero": 3, "recipe": {"offload": "optimizer"}}, "offload"),
        ("torchtitan", {"recipe": {"optimizer": "lion"}}, "optimizer"),
        ("torchrun", {"recipe": {"method": "lora"}}, "method"),
        ("deepspeed", {"pp": 2}, "pp"),
        ("deepspeed", {"cp": 2}, "cp"),
        ("deepspeed", {"tp": 2, "zero": 3}, "tp"),
        ("deepspeed", {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True}, "tp_comm_overlap"),
        (
            "accelerate",
            {"tp": 2, "zero": 3, "sequence_parallel": True, "tp_comm_overlap": True},
            "tp_comm_overlap",
        ),
        ("deepspeed", {"recipe": {"precision": "fp8"}}, "precision"),
        ("deepspeed", {"recipe": {"recompute": "selective"}}, "recompute"),
        ("deepspeed", {"zero": 2, "recipe": {"offload": "optimizer+params"}}, "offload"),
        ("accelerate", {"pp": 2}, "pp"),
        ("accelerate", {"recipe": {"precision": "fp4"}}, "precision"),
        ("accelerate", {"zero": 1, "tp": 2}, "zero"),
        ("accelerate", {"recipe": {"recompute": "selective"}}, "recompute"),
        ("deepspeed", {"recipe": {"recompute": "sac"}}, "recompute"),
        ("accelerate", {"zero": 3, "recipe": {"recompute": "sac"}}, "recompute"),
        ("accelerate", {"recipe": {"recompute": "sac"}}, "recompute"),
    ],
)
def test_inexpressible_plans_are_errors(target: str, plan: dict[str, Any], field: str) -> None:
    plan = dict(plan)
    system, model, recipe, layout = _plan(
        plan.pop("model", "llama-3.1-8b"), 8, plan.pop("recipe", None), **plan
    )
    with pytest.raises(TrainplanError) as info:
        export_plan(target, system, model, recipe, layout)
    assert info.value.field == field


def test_unknown_target_and_moe_ep_for_deepspeed() -> None:
    system, model, recipe, layout = _plan("qwen3-30b-a3b", 8, ep=8)
    with pytest.raises(TrainplanError, match="ep"):
        export_plan("deepspeed", system, model, recipe, layout)
    with pytest.raises(TrainplanError) as info:
        export_plan("nemo-recipe", system, model, recipe, layout)
    assert info.value.field == "to"
    # Megatron-LM runs expert parallelism: the same plan exports there
    text = export_plan("megatron", system, model, recipe, layout).text
    assert "--expert-model-parallel-size 8" in text


def test_torchtitan_flavor_dims_match_presets() -> None:
    """The flavor table reproduces torchtitan's FFN arithmetic for the Llama 3 flavors."""
    for name, flavor in (
        ("llama-3.1-8b", "8B"),
        ("llama-3.1-70b", "70B"),
        ("llama-3.1-405b", "405B"),
        ("qwen3-30b-a3b", "30B-A3B"),
    ):
        found = tt_export.find_flavor(load_model(name))
        assert found is not None and found.flavor == flavor
        assert not export_plan("torchtitan", *_plan(name, 8, zero=3)).files


class _Absent(abc.ABCMeta):
    """Stand-in classes for packages absent here: any attribute is another stand-in, and calling
    one (a decorator such as ``triton.jit``) returns its argument."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(name, (), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and not kwargs else cls


class _AbsentModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(name, (), {})


def _torchtitan_models(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torchtitan's train-spec registry with its llama3 and qwen3 models importable. Their
    ``__init__`` modules import a training machine's data, tokenizer, logging and GPU-kernel packages
    (datasets, tokenizers, torchdata, tensorboard; triton for the MoE permutation kernel); building a model on the meta device
    uses none of them, so those not installed are stand-ins for this test only."""
    _torchtitan_config_manager()
    import torch.utils.data

    stubs = ["datasets", "datasets.distributed", "tokenizers"]
    stubs += ["torchdata", "torchdata.stateful_dataloader"]
    absent = {name for name in {n.split(".")[0] for n in stubs} if importlib.util.find_spec(name) is None}
    for name in stubs:
        if name.split(".")[0] in absent:
            monkeypatch.setitem(sys.modules, name, _AbsentModule(name))
    if "torchdata" in absent:
        monkeypatch.setattr(
            sys.modules["torchdata.stateful_dataloader"],
            "StatefulDataLoader",
            torch.utils.data.DataLoader,
            raising=False,
        )
    try:
        import torch.utils.tensorboard
    except ImportError:
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", _AbsentModule("torch.utils.tensorboard"))
    for name in [n for n in sys.modules if n.startswith(("torchtitan.models", "torchtitan.components"))]:
        monkeypatch.delitem(sys.modules, name)
    if importlib.util.find_spec("triton") is None:
        # the MoE token permutation's Triton kernel (torchtitan/models/moe/kernels.py), used at run time only
        kernels = "torchtitan.models.moe.kernels"
        monkeypatch.setitem(sys.modules, kernels, _AbsentModule(kernels))
    from torchtitan.protocols import train_spec

    return train_spec


@pytest.mark.parametrize(
    ("model", "layout", "recipe"),
    [
        ("llama-2-7b", {"zero": 3}, {}),
        ("llama-2-70b", {"zero": 3, "pp": 2}, {}),
        ("mistral-7b", {"zero": 3}, {}),
        ("llama-3.2-1b", {"zero": 3}, {}),
        ("mixtral-8x7b", {"zero": 3, "ep": 8}, {}),
        ("phi-3-mini", {"zero": 2}, {"seq_len": 2047, "micro_batch": 2, "global_batch": 32}),
    ],
)
def test_torchtitan_builds_models_outside_its_flavor_tables(
    model: str,
    layout: dict[str, Any],
    recipe: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job config and the module beside it, read by torchtitan's ConfigManager, register a train
    spec whose model, built on the meta device, has trainplan's exact parameter count."""
    import torch

    from trainplan.models.params import count_params

    registry = _torchtitan_models(monkeypatch)
    system, spec, rec, lay = _plan(model, 8, recipe, **layout)
    result = export_plan("torchtitan", system, spec, rec, lay)
    [(module_file, source)] = result.files
    (tmp_path / module_file).write_text(source)
    toml = tmp_path / "job.toml"
    toml.write_text(result.text)
    module = module_file.removesuffix(".py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    try:
        cfg = _torchtitan_config_manager()().parse_args(["--job.config_file", str(toml)])
        assert cfg.job.custom_config_module == module == cfg.model.name
        train_spec = registry.get_train_spec(cfg.model.name)
        args = train_spec.model_args[cfg.model.flavor]
        args.update_from_config(cfg)
        with torch.device("meta"):
            built = train_spec.model_cls(args)
        assert sum(p.numel() for p in built.parameters()) == count_params(spec).total
        assert train_spec.pipelining_fn is not None or lay.pp == 1
        if spec.moe is not None:
            assert cfg.parallelism.expert_parallel_degree == lay.ep > 1
            assert args.moe_args.num_experts == spec.moe.num_experts and args.moe_args.top_k == spec.moe.top_k
        _parallel_dims(cfg, world_size=8)
    finally:
        registry._extra_train_specs.pop(module, None)


def test_torchtitan_writes_lora_as_its_0_3_config_and_refuses_qlora_naming_the_targets_that_run_it() -> None:
    """torchtitan 0.2.2 has no adapters; LoRA came with 0.3.0's Python config modules, which the
    target writes for a LoRA plan. QLoRA (no NF4 base in torchtitan) is refused naming only targets
    that write the plan."""
    from trainplan.export.saved import export_or_explain, targets_for

    lora = _plan("llama-2-7b", 8, {"method": "lora"}, zero=3)
    assert "torchtitan" in targets_for(*lora)
    assert export_plan("torchtitan", *lora).text.startswith("# torchtitan 0.3.0 config")
    qlora = _plan("llama-2-7b", 8, {"method": "qlora"}, zero=3)
    with pytest.raises(TrainplanError) as info:
        export_or_explain("torchtitan", *qlora)
    assert info.value.field == "method" and "0.3.0" in info.value.message
    can = targets_for(*qlora)
    assert can and "torchtitan" not in can
    assert info.value.message.endswith("targets that can export this plan: " + ", ".join(can))


def test_torchtitan_companion_module_is_written_beside_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "export",
        "llama-2-7b",
        "--hardware",
        "h100-sxm",
        "--devices",
        "8",
        "--zero",
        "3",
        "--to",
        "torchtitan",
    ]
    assert main(argv) == 2
    assert "--output" in capsys.readouterr().err
    assert main([*argv, "--output", str(tmp_path / "job.toml")]) == 0
    data = tomllib.loads((tmp_path / "job.toml").read_text())
    module = data["job"]["custom_config_module"]
    source = (tmp_path / f"{module}.py").read_text()
    compile(source, module, "exec")
    assert "dim=4096" in source and "n_kv_heads=32" in source and "vocab_size=32000" in source
    # the torchrun target carries the same module in its script
    launch = export_plan("torchrun", *_plan("llama-2-7b", 8, zero=3)).text
    assert source in launch and f"--job.custom_config_module {module}" in launch


# --------------------------------------------------------------------------- CLI
def test_cli_export_stdout_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "llama-3.1-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    assert main([*argv, "--micro-batch", "2", "--global-batch", "32", "--to", "deepspeed"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["gradient_accumulation_steps"] == 2
    target = tmp_path / "tt.toml"
    assert main([*argv, "--to", "torchtitan", "--output", str(target)]) == 0
    assert capsys.readouterr().out == ""
    assert tomllib.loads(target.read_text())["parallelism"]["data_parallel_shard_degree"] == 8


def test_cli_export_error_names_field(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "export",
            "llama-3.1-8b",
            "--hardware",
            "h100-sxm",
            "--devices",
            "8",
            "--pp",
            "2",
            "--to",
            "deepspeed",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("trainplan: error: pp:") and len(err.strip().splitlines()) == 1


def test_full_recompute_warnings_name_the_checkpoint_semantics() -> None:
    """Accelerate's FSDP2 checkpointing stops early; other backends are told which variant matches."""
    for early in (False, True):
        recipe = {"recompute": "full", "recompute_early_stop": early}
        fsdp = export_plan("accelerate", *_plan("llama-3.1-8b", 8, recipe, zero=3))
        assert any("--recompute-early-stop" in w for w in fsdp.warnings) == (not early)
        ddp = export_plan("accelerate", *_plan("llama-3.1-8b", 8, recipe, zero=0))
        assert any(f'"use_reentrant": {not early}' in w for w in ddp.warnings)
        ds = export_plan("deepspeed", *_plan("llama-3.1-8b", 8, recipe, zero=1))
        assert any("use_reentrant=False" in w for w in ds.warnings) == early


def test_torchtitan_per_op_sac_is_written_without_a_warning() -> None:
    """sac is what torchtitan's selective_ac_option = "op" runs; the attention-only "selective"
    recompute has no torchtitan equivalent and keeps its warning."""
    sac = export_plan("torchtitan", *_plan("llama-3.1-8b", 8, {"recompute": "sac"}, zero=3))
    ac = tomllib.loads(sac.text)["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "op", "early_stop": False}
    assert not any("recompute" in w for w in sac.warnings)
    early = export_plan(
        "torchtitan", *_plan("llama-3.1-8b", 8, {"recompute": "sac", "recompute_early_stop": True}, zero=3)
    )
    assert tomllib.loads(early.text)["activation_checkpoint"]["early_stop"] is True
    selective = export_plan("torchtitan", *_plan("llama-3.1-8b", 8, {"recompute": "selective"}, zero=3))
    assert tomllib.loads(selective.text)["activation_checkpoint"]["selective_ac_option"] == "op"
    assert any("recompute selective" in w and "--recompute sac" in w for w in selective.warnings)
