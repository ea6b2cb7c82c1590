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


# Megatron-LM's block method: the first N blocks of each stage (Recipe.recompute_layers)


def test_megatron_block_method_recomputes_the_first_blocks() -> None:
    """transformer_block.py _checkpointed_forward, method 'block': layer l is checkpointed when
    l < recompute_num_layers."""
    r = Recipe(recompute="full", recompute_layers=3)
    assert [recomputes_block(r, j) for j in range(6)] == [True, True, True, False, False, False]


def test_block_method_counts_like_every_nth_with_the_same_number() -> None:
    """16 of 32 blocks checkpointed: the first 16 (Megatron) hold what every 2nd (torchtitan) holds,
    and recompute the same FLOPs; 21 of 80 is 21/80 of full recompute."""
    lay = Layout()
    first = Recipe(recompute="full", recompute_layers=16)
    every = Recipe(recompute="full", recompute_every=2)
    mf, me = memory_breakdown(MODEL, first, lay), memory_breakdown(MODEL, every, lay)
    assert mf.activations_bytes == pytest.approx(me.activations_bytes, rel=1e-12)
    assert step_flops(MODEL, first).recompute.flops == pytest.approx(step_flops(MODEL, every).recompute.flops)
    big = load_model("llama-2-70b")
    full = step_flops(big, Recipe(recompute="full")).recompute.flops
    assert step_flops(big, Recipe(recompute="full", recompute_layers=21)).recompute.flops == pytest.approx(
        21 / 80 * full, rel=1e-12
    )
    # per pipeline stage: 4 stages of 8, the first 3 of each
    per_block = step_flops(MODEL, Recipe(recompute="full", global_batch=8)).recompute.flops / 32
    rec = step_flops(MODEL, Recipe(recompute="full", recompute_layers=3, global_batch=8), Layout(pp=4))
    assert rec.recompute.flops == pytest.approx(12 * per_block, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "layout", "match"),
    [
        ({"recompute": "selective"}, Layout(), "needs --recompute full"),
        ({"recompute": "full", "recompute_every": 2}, Layout(), "give one"),
        ({"recompute": "full", "stack": "pytorch"}, Layout(), "--recompute-every, or --stack megatron"),
        ({"recompute": "full"}, Layout(pp=4, virtual_stages=2, pp_schedule="interleaved"), "virtual chunk"),
        ({"recompute": "full"}, Layout(tp=2), "tensor parallelism"),
    ],
)
def test_block_method_refusals(kwargs: dict[str, object], layout: Layout, match: str) -> None:
    with pytest.raises(TrainplanError, match=match):
        memory_breakdown(MODEL, Recipe(recompute_layers=2, global_batch=8, **kwargs), layout)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="every block would be"):
        step_flops(MODEL, Recipe(recompute="full", recompute_layers=32))


def test_block_method_exports() -> None:
    from trainplan.export import megatron as mg_export
    from trainplan.export import nemo as nemo_export

    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    model = load_model("llama-3.1-8b")
    recipe, layout = Recipe(recompute="full", recompute_layers=5, global_batch=64), Layout(dp=8, zero=1)
    argv = mg_export.build_argv(system, model, recipe, layout)[0]
    i = argv.index("--recompute-method")
    assert argv[i + 1 : i + 4] == ["block", "--recompute-num-layers", "5"]
    text = nemo_export.render(system, model, recipe, layout)[0]
    assert '"recompute_method": "block",' in text and '"recompute_num_layers": 5,' in text
    for export in (tt_export.build_config, ds_export.build_config):
        with pytest.raises(TrainplanError, match="first 5 blocks"):
            export(system, model, recipe, Layout(dp=8, zero=3))


def test_block_method_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-2-70b", "--hardware", "mi300x", "--devices", "8", "--method", "lora"]
    assert (
        main([*args, "--recompute", "full", "--recompute-layers", "21", "--seq-len", "8192", "--json"]) == 0
    )
    capsys.readouterr()
    assert main(["plan", "llama-3-8b", "--hardware", "h100-sxm", "--recompute-layers", "2"]) != 0
    assert "--recompute-layers 2" in capsys.readouterr().err
