"""The torchtitan target's 0.3.0 config module (LoRA plans).

Always: every keyword the module passes is a field of its torchtitan 0.3.0 config class (the field
lists copied into the package, ``trainplan/data/torchtitan_0_3_schema.json``), the values are the
plan's, the text is valid Python, and what 0.3.0 cannot run is refused naming only targets that
write the plan. Where torchtitan 0.3.0 is installed (``pip install --no-deps torchtitan==0.3.0
spmd_types==0.2.3 torch_checkpointing``, beside torch 2.13 and tyro), its own ``ConfigManager``
imports the written module and the model it configures is built on the meta device: its
parameters and trainable adapter parameters equal trainplan's counts.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.metadata
import math
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.export import TARGETS, export_plan
from trainplan.export import torchtitan03 as tt03
from trainplan.export.saved import export_or_explain, targets_for
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.models.params import count_params, lora_params
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LoRASpec, Recipe


def _plan(
    model: str, devices: int, recipe: dict[str, Any] | None = None, **layout: Any
) -> tuple[System, ModelSpec, Recipe, Layout]:
    return (
        System(accelerator=get_accelerator("a100-80gb"), num_devices=devices),
        load_model(model),
        Recipe(**{"method": "lora", **(recipe or {})}),
        Layout.for_devices(devices, **layout),
    )


PLANS: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = [
    ("llama-2-7b", 8, {"micro_batch": 2, "global_batch": 128, "tokens": 1e9}, {"zero": 3}),
    ("llama-2-7b", 8, {"global_batch": 32, "recompute": "full", "lora": LoRASpec(rank=8, alpha=16.0, targets=("q", "v"))}, {"zero": 0}),
    ("llama-3.1-8b", 16, {"global_batch": 64, "recompute": "selective", "loss_chunks": 8}, {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True, "zero": 2}),
    ("llama-3.1-70b", 32, {"global_batch": 64, "lora": LoRASpec(rank=32, alpha=64.0, targets=("q", "k", "v", "o"))}, {"tp": 4, "pp": 4, "sequence_parallel": True, "zero": 3}),
    ("mistral-7b", 8, {"global_batch": 16, "seq_len": 4096, "offload": "optimizer+params"}, {"zero": 3}),
]  # fmt: skip


@pytest.mark.parametrize(("model", "devices", "recipe", "layout"), PLANS)
def test_every_keyword_is_a_field_of_its_torchtitan_class(
    model: str, devices: int, recipe: dict[str, Any], layout: dict[str, Any]
) -> None:
    plan = _plan(model, devices, recipe, **layout)
    schema = tt03.schema()
    sections, other, facts, _ = tt03.build_config(*plan)
    for section, values in sections.items():
        unknown = set(values) - set(schema["classes"][tt03.SECTION_CLASSES[section]])
        assert not unknown, (section, unknown)
    # the values are the plan's
    _, spec, rec, lay = plan
    p, t = sections["parallelism"], sections["training"]
    assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == lay.dp
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["context_parallel_degree"]) == (
        lay.tp,
        lay.pp,
        lay.cp,
    )
    assert p["fsdp_reshard_after_forward"] == ("never" if lay.zero == 2 else "default")
    assert p["data_parallel_shard_degree"] == (1 if lay.zero == 0 else lay.dp)
    # torchtitan/trainer.py: gradient accumulation = global // (local · dp); PP splits local into micro-batches
    assert t["global_batch_size"] == facts.global_batch == (rec.global_batch or lay.dp * rec.micro_batch)
    if lay.pp > 1:
        assert t["local_batch_size"] == rec.micro_batch * facts.micro_batches
        assert p["pipeline_parallel_microbatch_size"] == rec.micro_batch
    else:
        assert t["local_batch_size"] == rec.micro_batch
    if rec.tokens is not None:
        assert t["steps"] == math.ceil(rec.tokens / (facts.global_batch * rec.seq_len))
    else:
        assert "steps" not in t
    assert (
        t["enable_cpu_offload"] is True
        if rec.offload == "optimizer+params"
        else "enable_cpu_offload" not in t
    )
    assert sections["compile"]["enable_async_tensor_parallel"] == lay.tp_comm_overlap
    lora = rec.lora
    assert lora is not None
    assert sections["lora"]["rank"] == lora.rank and sections["lora"]["alpha"] == lora.alpha
    # k and v share the config wkv unless only one of them is adapted; then v's is wv of its own
    split = len({"k", "v"} & set(lora.targets)) == 1
    wanted = {"wv" if m == "v" and split else tt03.LORA_MODULES[m] for m in lora.targets}
    assert ("class SplitKVLinear(QKVLinear)" in tt03.render(*plan)[0]) == split
    assert set(sections["lora"]["target_modules"]) == wanted
    assert (
        other["activation_checkpoint"]
        == {"none": None, "full": "FullAC", "selective": "SelectiveAC"}[rec.recompute]
    )
    assert (other["dim"], other["n_layers"], other["n_kv_heads"], other["hidden_dim"]) == (
        spec.hidden_size,
        spec.num_layers,
        spec.num_kv_heads,
        spec.ffn_hidden,
    )
    # the module is Python whose builder call and imports exist in 0.3.0
    text, _ = tt03.render(*plan)
    tree = ast.parse(text)
    builder = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_build_llama3_layers"
    )
    assert {k.arg for k in builder.keywords} <= set(schema["builder"]["_build_llama3_layers"])
    imported = {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "torchtitan.models.llama3"
        for a in n.names
    }
    assert imported <= set(schema["names"])
    configs = {
        n.func.value.id  # type: ignore[attr-defined]
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "Config"
    }
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert {f"{c}.Config" for c in configs - own} <= set(schema["classes"])


def test_lora_plans_are_written_as_the_0_3_module_and_full_plans_as_the_toml() -> None:
    lora = export_plan("torchtitan", *_plan("llama-2-7b", 8, {"global_batch": 32}, zero=3))
    assert lora.filename == f"{tt03.MODULE}.py" and not lora.files
    assert f"--module {tt03.MODULE} --config {tt03.CONFIG_FUNCTION}" in lora.text
    full = export_plan("torchtitan", *_plan("llama-2-7b", 8, {"method": "full", "global_batch": 32}, zero=3))
    assert full.filename == "torchtitan.toml" and "[parallelism]" in full.text


@pytest.mark.parametrize(
    ("model", "recipe", "layout", "field"),
    [
        ("llama-2-7b", {"method": "qlora"}, {"zero": 3}, "method"),
        (
            "llama-2-7b",
            {"lora": LoRASpec(targets=("q", "k"))},
            {"tp": 2, "sequence_parallel": True, "zero": 3},
            "lora_targets",
        ),
        ("mixtral-8x7b", {}, {"zero": 3}, "model"),
        ("qwen2.5-7b", {}, {"zero": 3}, "model"),
        (
            "llama-2-7b",
            {"recompute": "full", "recompute_early_stop": True},
            {"zero": 3},
            "recompute_early_stop",
        ),
        ("llama-2-7b", {"recompute": "full", "recompute_every": 2}, {"zero": 3}, "recompute_every"),
        ("llama-2-7b", {"precision": "fp8"}, {"zero": 3}, "precision"),
        ("llama-2-7b", {}, {"zero": 1}, "zero"),
    ],
)
def test_what_0_3_cannot_run_is_refused_naming_only_targets_that_can(
    model: str, recipe: dict[str, Any], layout: dict[str, Any], field: str
) -> None:
    plan = _plan(model, 8, {"global_batch": 32, **recipe}, **layout)
    with pytest.raises(TrainplanError) as direct:
        export_plan("torchtitan", *plan)
    assert direct.value.field == field and tt03.TARGET in direct.value.message
    # no circle: the targets a refusal names all write the plan
    can = targets_for(*plan)
    assert "torchtitan" not in can
    named = {
        t for t in TARGETS if f"export to {t}" in direct.value.message or f" or {t}" in direct.value.message
    }
    assert named <= set(can), (direct.value.message, can)
    with pytest.raises(TrainplanError) as explained:
        export_or_explain("torchtitan", *plan)
    message = explained.value.message
    assert message.endswith(
        "targets that can export this plan: " + ", ".join(can)
        if can
        else "no export target can write this plan as it is"
    )


def test_qlora_refusal_names_a_target_that_writes_it() -> None:
    plan = _plan("llama-2-7b", 8, {"method": "qlora", "global_batch": 32}, zero=3)
    assert {"deepspeed", "accelerate"} & set(targets_for(*plan))


def test_the_0_2_2_flags_name_the_0_3_module_for_lora() -> None:
    """The torchrun target writes torchtitan 0.2.2 flags: its LoRA refusal names the torchtitan target."""
    plan = _plan("llama-2-7b", 8, {"global_batch": 32}, zero=3)
    assert "torchtitan" in targets_for(*plan) and "torchrun" not in targets_for(*plan)
    with pytest.raises(TrainplanError) as info:
        export_or_explain("torchrun", *plan)
    assert info.value.message.endswith("targets that can export this plan: " + ", ".join(targets_for(*plan)))


def test_llama_2_7b_lora_on_8_a100_exported_for_torchtitan_in_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"{tt03.MODULE}.py"
    argv = ["plan", "llama-2-7b", "--method", "lora", "--hardware", "a100-80gb", "--devices", "8"]
    code = main(
        [*argv, "--engine", "torchtitan", "--tokens", "1e9", "--export", "engine", "--export-file", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "error" not in err and f"as torchtitan config to {out}" in err
    text = out.read_text()
    ast.parse(text)
    assert "LoRAConverter.Config(**LORA)" in text and '"data_parallel_shard_degree"' in text


# --------------------------------------------------------------- torchtitan 0.3.0's own classes
class _StandIn(types.ModuleType):
    """A GPU-only or logging package torchtitan imports at module level (triton, tensorboard, wandb,
    torchdata, datasets, tokenizers): class names give empty classes, other names mocks."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value: Any = type(name, (), {}) if name[:1].isupper() else mock.MagicMock(name=name)
        setattr(self, name, value)
        return value


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    names = ("triton", "tensorboard", "wandb", "torchdata", "datasets", "tokenizers")

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".")[0]
        missing = top in self.names and importlib.machinery.PathFinder.find_spec(top) is None
        if missing or fullname.startswith("torch.utils.tensorboard"):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _torchtitan_0_3() -> None:
    try:
        version = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version != tt03.VERSION:
        pytest.skip(
            f"torchtitan {version} installed, not {tt03.VERSION} (pip install --no-deps "
            "torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing in a separate environment)"
        )
    pytest.importorskip("tyro")
    if not any(isinstance(f, _StandIns) for f in sys.meta_path):
        sys.meta_path.insert(0, _StandIns())


@pytest.mark.parametrize(("model", "devices", "recipe", "layout"), PLANS)
def test_torchtitan_0_3_reads_the_module_and_builds_the_plans_model(
    model: str,
    devices: int,
    recipe: dict[str, Any],
    layout: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _torchtitan_0_3()
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = _plan(model, devices, recipe, **layout)
    _, spec, rec, lay = plan
    result = export_plan("torchtitan", *plan)
    name = f"trainplan_check_{abs(hash((model, devices, str(recipe), str(layout))))}"
    (tmp_path / f"{name}.py").write_text(result.text)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ConfigManager().parse_args(["--module", name, "--config", tt03.CONFIG_FUNCTION])
    p = cfg.parallelism
    dims = ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        world_size=devices,
    )
    assert dims.world_size == devices
    assert cfg.training.global_batch_size == (rec.global_batch or lay.dp * rec.micro_batch)
    with torch.device("meta"):
        net = cfg.model_spec.model.build()
    lora = rec.lora
    assert lora is not None
    adapters = lora_params(spec, rank=lora.rank, targets=lora.targets)
    assert sum(q.numel() for q in net.parameters()) == count_params(spec).total + adapters
    assert sum(q.numel() for q in net.parameters() if q.requires_grad) == adapters
