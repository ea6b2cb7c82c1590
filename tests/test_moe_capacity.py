"""Token-dropping MoE: capacity-padded experts and GShard/MaxText einsum dispatch, one term each.

Checked against hand counts of MaxText's dense_matmul path (moe.py at 14b5876e): C = 1280 slots
per expert and sequence for Mixtral at S 4096, cf 1.25; expert GEMMs on E·C slots; dispatch and
combine einsums 2·S·E·C·h FLOPs each per sequence.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainplan.cli import main
from trainplan.errors import LayoutError, RecipeError, TrainplanError
from trainplan.export import export_plan
from trainplan.flops import capacity_slots, expert_slot_ratio, moe_einsum_flops, step_flops
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import layer_activations
from trainplan.models import load_model
from trainplan.planner import SearchSpace, plan
from trainplan.predict import estimate
from trainplan.recipe import Recipe, check_model_recipe
from trainplan.validate.datasets import timing_rows
from trainplan.validate.timing import predict_row

MIXTRAL = load_model("mixtral-8x7b")
BASE = Recipe(seq_len=4096, micro_batch=2, global_batch=512, recompute="full", stack="maxtext")
PADDED = replace(BASE, moe_capacity_factor=1.25)
EINSUM = replace(PADDED, moe_dispatch="einsum")


def test_capacity_is_maxtexts_per_sequence_slots() -> None:
    # int(max(ceil(4096·2/8)·1.25, 1.25)) = int(1280.0)
    assert capacity_slots(4096, 2, 8, 1.25) == 1280
    # the product is truncated: ceil(100·2/8) = 25, 25·1.1 = 27.5 -> 27
    assert capacity_slots(100, 2, 8, 1.1) == 27
    # never fewer than cf slots
    assert capacity_slots(1, 1, 64, 2.0) == 2
    assert expert_slot_ratio(MIXTRAL, PADDED) == pytest.approx(8 * 1280 / (4096 * 2))
    assert expert_slot_ratio(MIXTRAL, BASE) == 1.0


def test_padding_and_einsums_are_executed_not_model_flops() -> None:
    layout = Layout(dp=256, zero=3)
    plain, padded, einsum = (step_flops(MIXTRAL, r, layout) for r in (BASE, PADDED, EINSUM))
    assert padded.model_flops == plain.model_flops == einsum.model_flops
    moe = MIXTRAL.moe
    assert moe is not None
    sequences = 512
    tokens = sequences * 4096
    h, fe, k = MIXTRAL.hidden_size, moe.expert_ffn_hidden, moe.top_k
    layers = MIXTRAL.num_layers
    # the padded slots: (ratio - 1) of the routed experts' three GEMMs, forward + 2x backward + recompute
    routed_fwd = 2.0 * tokens * h * k * fe * 3 * layers
    pad = (expert_slot_ratio(MIXTRAL, PADDED) - 1.0) * routed_fwd
    assert padded.hardware_flops - plain.hardware_flops == pytest.approx(pad * (1 + 2 + 1), rel=1e-12)
    # two einsums of 2·S·E·C·h per sequence, forward; 1.5x that backward; again in the recompute
    ein_fwd = 2 * 2.0 * sequences * 4096 * 8 * 1280 * h * layers
    assert moe_einsum_flops(MIXTRAL, EINSUM, sequences) * layers == pytest.approx(ein_fwd)
    assert einsum.hardware_flops - padded.hardware_flops == pytest.approx(ein_fwd * (1 + 1.5 + 1), rel=1e-12)


def test_the_step_slows_and_mfu_falls_while_hfu_counts_the_padding() -> None:
    system = System(accelerator=get_accelerator("tpu-v6e"), num_devices=256)
    layout = Layout(dp=256, zero=3)
    a, b, c = (estimate(system, MIXTRAL, r, layout) for r in (BASE, PADDED, EINSUM))
    # padding slows both dispatches; which of the two padded ones is faster depends on the shapes
    # (the grouped matmul's boundary tiles against the einsums' one-hot matmuls)
    assert a.time.step_s < min(b.time.step_s, c.time.step_s)
    assert a.throughput.mfu > max(b.throughput.mfu, c.throughput.mfu)
    assert b.throughput.hfu > b.throughput.mfu and c.throughput.hfu > c.throughput.mfu
    # the einsums' FLOPs are executed on top of the padded experts'
    assert c.throughput.hardware_flops_per_step > b.throughput.hardware_flops_per_step
    # the expert all-to-all and the JSON carry the setting
    d = c.to_dict()
    assert d["recipe"]["moe_capacity_factor"] == 1.25 and d["recipe"]["moe_dispatch"] == "einsum"


def test_saved_expert_activations_grow_by_the_slot_ratio_and_einsum_saves_its_masks() -> None:
    rec = replace(BASE, recompute="none")
    layout = Layout()
    plain = layer_activations(MIXTRAL, rec, layout, 0).terms
    padded = layer_activations(MIXTRAL, replace(rec, moe_capacity_factor=1.25), layout, 0).terms
    einsum = layer_activations(
        MIXTRAL, replace(rec, moe_capacity_factor=1.25, moe_dispatch="einsum"), layout, 0
    )
    ratio = expert_slot_ratio(MIXTRAL, PADDED)
    for term in ("expert_inputs", "expert_outputs"):
        assert padded[term] == pytest.approx(ratio * plain[term])
    assert padded["expert_weighted_outputs"] == plain["expert_weighted_outputs"]
    masks = 2 * 4096 * 8 * 1280  # b·S·E·C
    assert einsum.terms["dispatch_mask"] == masks
    assert einsum.terms["combine_mask"] == 2.0 * masks
    assert "routing_indices" not in einsum.terms and "expert_weighted_outputs" not in einsum.terms


def test_the_maxtext_dropping_rows_are_scored_with_the_setting() -> None:
    rows = [r for r in timing_rows("maxtext_tpu") if r.name.endswith("-dropped")]
    assert len(rows) == 2 and all(r.is_target for r in rows)
    for r in rows:
        assert r.recipe_flags.moe_capacity_factor == 1.25 and r.recipe_flags.moe_dispatch == "einsum"
        # dropless, the same rows were 19-26% too fast; with the dropping path within 10%
        assert abs(predict_row(r).error) < 0.10, r.name


@pytest.mark.parametrize(
    ("recipe", "model", "field"),
    [
        (Recipe(moe_capacity_factor=1.25), "llama-3.2-1b", "moe_capacity_factor"),
        (Recipe(moe_capacity_factor=1.25, moe_dispatch="einsum"), "llama-3.2-1b", "moe_capacity_factor"),
    ],
)
def test_routing_settings_on_a_dense_model_are_refused(recipe: Recipe, model: str, field: str) -> None:
    with pytest.raises(RecipeError) as err:
        check_model_recipe(load_model(model), recipe)
    assert err.value.field == field and "dense model" in str(err.value)


def test_bad_routing_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(RecipeError, match="--moe-capacity-factor"):
        Recipe(moe_dispatch="einsum")
    for bad in (0.0, -1.0, float("nan"), 1e9, True):
        with pytest.raises(RecipeError):
            Recipe(moe_capacity_factor=bad)  # type: ignore[arg-type]
    with pytest.raises(RecipeError):
        Recipe(moe_dispatch="sorted")  # type: ignore[arg-type]
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    with pytest.raises(LayoutError, match="tp"):
        estimate(system, MIXTRAL, replace(EINSUM, global_batch=8), Layout(dp=4, tp=2))
    with pytest.raises(LayoutError, match="cp"):
        estimate(system, MIXTRAL, replace(PADDED, global_batch=8, recompute="none"), Layout(dp=4, cp=2))


def test_export_writes_megatron_padding_and_refuses_what_a_target_cannot_run() -> None:
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    layout = Layout(dp=8, zero=1)
    rec = replace(PADDED, global_batch=8, micro_batch=1, stack="megatron")
    text = export_plan("megatron", system, MIXTRAL, rec, layout).text
    assert "--moe-expert-capacity-factor 1.25" in text and "--moe-pad-expert-input-to-capacity" in text
    assert "moe_pad_expert_input_to_capacity" in export_plan("nemo", system, MIXTRAL, rec, layout).text
    with pytest.raises(TrainplanError) as err:
        export_plan("torchtitan", system, MIXTRAL, rec, layout)
    assert err.value.field == "moe_capacity_factor"
    with pytest.raises(TrainplanError) as err:
        export_plan("megatron", system, MIXTRAL, replace(rec, moe_dispatch="einsum"), layout)
    assert err.value.field == "moe_dispatch"


def test_the_planner_applies_the_routing_and_searches_only_layouts_it_models() -> None:
    model = load_model("qwen1.5-moe-a2.7b")
    recipe = Recipe(
        tokens=1e9, global_batch=32, seq_len=4096, moe_capacity_factor=1.25, moe_dispatch="einsum"
    )
    space = SearchSpace(micro_batches=(1, 2), recomputes=("none", "full"), offloads=("none",), max_devices=8)
    result = plan(model, recipe, [get_accelerator("h100-sxm")], space=space, objective="time", top=5)
    assert result.plans
    for p in result.plans:
        assert p.estimate.layout.tp == 1 and p.estimate.layout.cp == 1
        again = estimate(p.estimate.system, model, p.estimate.recipe, p.estimate.layout)
        assert p.estimate.time.step_s == pytest.approx(again.time.step_s, rel=1e-9)
        assert again.recipe.moe_dispatch == "einsum"
    assert result.stats.invalid.get("layout: tp", 0) > 0
    assert any(
        n.startswith("not searched, as given: MoE capacity factor 1.25 with einsum") for n in result.notes
    )
    # dropless is faster on the same space
    fast = plan(
        model,
        replace(recipe, moe_capacity_factor=None, moe_dispatch="gather"),
        [get_accelerator("h100-sxm")],
        space=space,
        objective="time",
        top=1,
    )
    assert fast.plans[0].estimate.time.step_s < result.plans[0].estimate.time.step_s


def test_cli_takes_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "mixtral-8x7b", "--hardware", "tpu-v6e", "--devices", "256", "--zero", "3"]
    args += ["--seq-len", "4096", "--micro-batch", "2", "--recompute", "full", "--stack", "maxtext"]
    assert main([*args, "--moe-capacity-factor", "1.25", "--moe-dispatch", "einsum"]) == 0
    out = capsys.readouterr().out
    assert "MoE capacity factor 1.25 (padded expert buffers, einsum dispatch)" in out
    assert main(["estimate", "llama-3.2-1b", "--hardware", "h100-sxm", "--moe-capacity-factor", "1.25"]) != 0
    assert "dense model" in capsys.readouterr().err
