"""Layer-selective activation checkpointing: every n-th block recomputed (torchtitan
``selective_ac_option = n``)."""

from __future__ import annotations

import pytest

from trainplan.cli import main
from trainplan.errors import LayoutError, RecipeError, TrainplanError
from trainplan.export import deepspeed as ds_export
from trainplan.export import torchtitan as tt_export
from trainplan.flops import step_flops
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import layer_activations, memory_breakdown
from trainplan.models import load_model
from trainplan.recipe import Recipe, recomputes_block

MODEL = load_model("llama-3-8b")


def test_torchtitan_counts_blocks_from_one() -> None:
    """_apply_layer_sac wraps block k (1-based) when k % n == 0: the 2nd, 4th, ... of a stage."""
    r = Recipe(recompute="full", recompute_every=3)
    assert [recomputes_block(r, j) for j in range(7)] == [False, False, True, False, False, True, False]
    assert all(recomputes_block(Recipe(recompute="full"), j) for j in range(5))
    assert not any(recomputes_block(Recipe(), j) for j in range(5))


def test_needs_full_recompute() -> None:
    with pytest.raises(RecipeError, match="needs --recompute full"):
        Recipe(recompute="sac", recompute_every=2)
    with pytest.raises(RecipeError, match="positive integer"):
        Recipe(recompute="full", recompute_every=0)


def test_memory_and_flops_count_the_checkpointed_blocks() -> None:
    lay = Layout()
    none, full = Recipe(), Recipe(recompute="full")
    half = Recipe(recompute="full", recompute_every=2)
    a_none = layer_activations(MODEL, none, lay, 0).total_bytes
    a_full = layer_activations(MODEL, full, lay, 0).total_bytes
    m = memory_breakdown(MODEL, half, lay)
    blocks = MODEL.num_layers  # 32: 16 checkpointed, 16 keeping everything
    layers_bytes = (
        m.activations_bytes - memory_breakdown(MODEL, none, lay).activations_bytes + blocks * a_none
    )
    assert layers_bytes == pytest.approx(16 * a_none + 16 * a_full, rel=1e-12)
    assert m.transient_bytes >= a_none  # one checkpointed block is rebuilt in its backward
    rec = step_flops(MODEL, half).recompute.flops
    assert rec == pytest.approx(0.5 * step_flops(MODEL, full).recompute.flops, rel=1e-12)
    with pytest.raises(LayoutError, match="no block would be recomputed"):  # 33 > 32 blocks: none
        step_flops(MODEL, Recipe(recompute="full", recompute_every=33))


def test_blocks_are_counted_per_pipeline_stage() -> None:
    """Each stage process counts its own blocks: 32 layers on 4 stages of 8 with n = 3 recompute
    2 blocks per stage (8 in all), not 32 // 3 = 10."""
    recipe = Recipe(recompute="full", recompute_every=3, global_batch=8)
    per_block = step_flops(MODEL, Recipe(recompute="full", global_batch=8)).recompute.flops / 32
    rec = step_flops(MODEL, recipe, Layout(pp=4)).recompute.flops
    assert rec == pytest.approx(8 * per_block, rel=1e-12)


@pytest.mark.parametrize(
    ("layout", "what"),
    [
        (Layout(tp=2), "tensor parallelism"),
        (Layout(dp=1, cp=2), "context parallelism"),
        (Layout(dp=8, zero=3, zero3_granularity="parameter"), "per-parameter ZeRO-3"),
    ],
)
def test_refused_where_the_repeated_collectives_are_not_split(layout: Layout, what: str) -> None:
    with pytest.raises(LayoutError, match=what):
        memory_breakdown(MODEL, Recipe(recompute="full", recompute_every=2, seq_len=2048), layout)


def test_exports_and_plan() -> None:
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    recipe = Recipe(recompute="full", recompute_every=2)
    layout = Layout(dp=8, zero=3)
    config, _, _ = tt_export.build_config(system, load_model("llama-3.1-8b"), recipe, layout)
    ac = config["activation_checkpoint"]
    assert ac["mode"] == "selective" and ac["selective_ac_option"] == "2"
    with pytest.raises(TrainplanError, match="one block in 2"):
        ds_export.build_config(system, load_model("llama-3.1-8b"), recipe, layout)


def test_plan_refuses_with_the_way_out(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "llama-3-8b", "--hardware", "h100-sxm", "--recompute", "full", "--recompute-every", "2"]
    assert main(args) != 0
    assert "trainplan estimate --recompute full --recompute-every 2" in capsys.readouterr().err


def test_estimate_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    assert main([*args, "--recompute", "full", "--recompute-every", "2", "--json"]) == 0
