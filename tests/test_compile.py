"""torch.compile as a speed term: eager chains of kernels for RMSNorm, rotary and gated activations."""

from __future__ import annotations

import pytest

from trainplan.errors import RecipeError, TrainplanError
from trainplan.flops import (
    EAGER_GATED_ACTIVATION_TRAFFIC,
    EAGER_RMSNORM_TRAFFIC,
    EAGER_ROTARY_TRAFFIC,
    layer_memory_traffic,
)
from trainplan.inputs import COMMANDS, build_recipe, fill_defaults
from trainplan.models import load_model
from trainplan.recipe import Recipe
from trainplan.validate.datasets import timing_rows
from trainplan.validate.timing import validate_dataset


def test_eager_factors_follow_the_op_chains() -> None:
    e = 2.0
    assert (28 + 4 * e) / (2 * e) == EAGER_RMSNORM_TRAFFIC
    assert (16 + 2 * e) / (2 * e) == EAGER_ROTARY_TRAFFIC
    assert 5 * e / (3 * e) == EAGER_GATED_ACTIVATION_TRAFFIC


def test_eager_traffic_scales_only_the_composite_ops() -> None:
    llama = load_model("llama-3.1-8b")
    fused = layer_memory_traffic(llama, 0, 1, 4096)
    eager = layer_memory_traffic(llama, 0, 1, 4096, eager=True)
    assert eager.norms == pytest.approx(EAGER_RMSNORM_TRAFFIC * fused.norms)
    assert eager.rotary == pytest.approx(EAGER_ROTARY_TRAFFIC * fused.rotary)
    assert eager.activation == pytest.approx(EAGER_GATED_ACTIVATION_TRAFFIC * fused.activation)
    assert (eager.residual, eager.attention_io) == (fused.residual, fused.attention_io)
    # LayerNorm and GELU are one native kernel each: GPT-2 moves the same bytes either way
    gpt = load_model("gpt2")
    assert (
        layer_memory_traffic(gpt, 0, 1, 1024, eager=True).total == layer_memory_traffic(gpt, 0, 1, 1024).total
    )


def test_compile_is_refused_outside_the_pytorch_stack() -> None:
    with pytest.raises(RecipeError, match="torch_compile"):
        Recipe(stack="megatron", torch_compile=True)
    values = fill_defaults({"model": "llama-3.1-8b", "hardware": "h100-sxm"}, COMMANDS["estimate"])
    with pytest.raises(TrainplanError, match="torch_compile"):
        build_recipe(values | {"torch_compile": True})  # the default engine is Megatron-Core
    assert build_recipe(values | {"engine": "torchtitan", "torch_compile": True}).torch_compile
    assert not build_recipe(values | {"engine": "torchtitan"}).torch_compile


def test_torchtitan_compile_pairs() -> None:
    """The published on/off pairs of torchtitan's benchmark (8 and 128 H100): the predicted
    speedup within 3 % of the published one, nothing fitted to them."""
    rows = {r.name: r for r in timing_rows("torchtitan_llama3")}
    res = {r.name: r for r in validate_dataset("torchtitan_llama3").rows}
    for n in (8, 128):
        table = 1 if n == 8 else 3
        off = f"torchtitan-8b-{n}gpu-table{table}-fsdp-s8192"
        on = f"torchtitan-8b-{n}gpu-table{table}-fsdp-torch-compile-s8192"
        assert rows[on].recipe_flags.torch_compile and not rows[off].recipe_flags.torch_compile
        published = rows[on].tokens_per_s / rows[off].tokens_per_s  # type: ignore[operator]
        predicted = res[on].predicted / res[off].predicted  # type: ignore[operator]
        assert predicted == pytest.approx(published, rel=0.03)
        assert abs(res[off].error) < 0.05  # type: ignore[arg-type]


def test_torchtitan_export_compiles_what_the_estimate_priced() -> None:
    from trainplan.export.torchtitan import build_config
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.layout import Layout

    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    model = load_model("llama-3.1-8b")
    layout = Layout(dp=8, zero=3)
    base = Recipe(stack="pytorch", seq_len=8192, micro_batch=1, global_batch=8)
    for compiled in (False, True):
        config, _, warnings = build_config(
            system, model, Recipe(**{**vars(base), "torch_compile": compiled}), layout
        )
        assert config["compile"]["enable"] is compiled  # type: ignore[index]
        assert not any("torch.compile" in w for w in warnings)
    fp8 = Recipe(**{**vars(base), "precision": "fp8"})
    config, _, warnings = build_config(system, model, fp8, layout)
    assert config["compile"]["enable"] is True  # type: ignore[index]
    assert any("--torch-compile" in w for w in warnings)
