"""Multi-token prediction (``Recipe.mtp_layers``) and Megatron-Core's selective recompute modules
(``Recipe.recompute_modules``), each against a hand count, Megatron-Bridge's published FLOP
ratio, or the refusal that names the reason.

Published check: Megatron-Bridge's 26.08 DGX-GB300 DeepSeek-V3 row (with MTP) reports 1,635 model
TFLOP/s per GPU at 6,288 tokens/s per GPU (docs/performance-summary.md at 067f987): 260.0 GFLOP
per token at sequence 4096.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainplan.errors import ModelError, RecipeError, TrainplanError
from trainplan.export import export_plan
from trainplan.export.megatron import build_argv
from trainplan.flops import device_flops, layer_forward_flops, step_flops
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import layer_activations, stage_activations
from trainplan.models import load_model
from trainplan.models.params import count_params, layer_params
from trainplan.predict import estimate
from trainplan.recipe import Recipe, check_model_recipe

V3 = load_model("deepseek-v3")
LITE = load_model("deepseek-v2-lite")
QWEN = load_model("qwen3-30b-a3b")
SYSTEM = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)


def test_with_mtp_appends_layers_of_the_last_kind_and_decoder_removes_them() -> None:
    m = V3.with_mtp(1)
    assert (m.num_layers, m.mtp_layers, m.num_moe_layers) == (62, 1, 59)
    assert count_params(m).total == count_params(V3).total + layer_params(V3, 60)
    assert m.with_mtp(1) is m
    assert m.decoder() == V3
    with pytest.raises(ModelError, match="already carries"):
        m.with_mtp(2)
    assert any("multi-token-prediction" in a for a in m.approximations)


def test_model_flops_with_mtp_match_megatron_bridges_published_ratio() -> None:
    recipe = Recipe(seq_len=4096, micro_batch=1, global_batch=1, mtp_layers=1)
    sf = step_flops(V3.with_mtp(1), recipe)
    assert sf.model_flops / 4096 == pytest.approx(1635e12 / 6288, rel=0.01)
    # the extra head pass and eh_proj by hand: 6·T·(V·h + 2h·h) beyond one more MoE layer
    without = step_flops(V3, replace(recipe, mtp_layers=0))
    layer = layer_forward_flops(V3, 60, 1.0, 4096.0)
    extra = sf.model_flops - without.model_flops
    h, v, t = 7168, 129280, 4096
    assert extra == pytest.approx(3 * (layer.gemm + layer.attention) + 6 * t * (v * h + 2 * h * h), rel=1e-12)


def test_mtp_sits_on_the_last_pipeline_stage() -> None:
    recipe = Recipe(seq_len=4096, global_batch=16, mtp_layers=1)
    stages = device_flops(V3.with_mtp(1), recipe, Layout(dp=2, pp=4))
    assert 61 in stages[-1].layers
    base = device_flops(V3, replace(recipe, mtp_layers=0), Layout(dp=2, pp=4))
    assert stages[0].forward == base[0].forward  # the first stage is untouched
    # the model must carry the recipe's modules
    with pytest.raises(RecipeError, match="with_mtp"):
        step_flops(V3, recipe)


def test_estimate_and_export_with_mtp() -> None:
    recipe = Recipe(seq_len=4096, global_batch=64, mtp_layers=1)
    est = estimate(SYSTEM, LITE, recipe, Layout(dp=8, ep=8))
    assert est.model.mtp_layers == 1 and est.summary.params == count_params(LITE.with_mtp(1)).total
    recipe_json = est.to_dict()["recipe"]
    assert isinstance(recipe_json, dict) and recipe_json["mtp_layers"] == 1
    argv, _, _ = build_argv(SYSTEM, est.model.decoder(), recipe, est.layout)
    assert argv[argv.index("--num-layers") + 1] == "27"
    assert argv[argv.index("--mtp-num-layers") + 1] == "1"
    text = export_plan("megatron", SYSTEM, est.model, recipe, est.layout).text
    assert "--num-layers 27" in text and "--mtp-num-layers 1" in text
    with pytest.raises(TrainplanError, match="multi-token"):
        export_plan("deepspeed", SYSTEM, est.model, recipe, Layout(dp=8))


def test_mtp_refusals() -> None:
    with pytest.raises(RecipeError, match="Megatron-Core"):
        Recipe(mtp_layers=1, stack="pytorch")
    with pytest.raises(RecipeError, match="full training"):
        Recipe(mtp_layers=1, method="lora")
    with pytest.raises(RecipeError, match=r"0\.\.8"):
        Recipe(mtp_layers=9)


def test_mla_up_proj_recompute_drops_q_k_v_and_redoes_the_up_projections() -> None:
    base = Recipe(seq_len=4096, micro_batch=1, global_batch=8, recompute="selective")
    up = replace(base, recompute_modules=("mla_up_proj",))
    layout = Layout(dp=8)
    none = layer_activations(V3, replace(base, recompute="none"), layout, 3).terms
    got = layer_activations(V3, up, layout, 3).terms
    assert "q_k_v" in none and "q_k_v" not in got
    assert sum(none.values()) - sum(got.values()) == none["q_k_v"]
    fl = layer_forward_flops(V3, 3, 1.0, 4096.0)
    rec = device_flops(V3, up, layout)[0].recompute
    # 58 MoE + 3 dense layers: only the up projections are redone, not the attention core
    assert rec.gemm_flops == pytest.approx(61 * fl.qkv_proj, rel=1e-12)
    assert rec.attention_flops == 0.0
    core = device_flops(V3, base, layout)[0].recompute
    assert core.gemm_flops == 0.0 and core.attention_flops > 0
    # the rebuilt q, k, v of one layer are a backward transient
    acts = stage_activations(V3, up, Layout(dp=8, ep=8), 0, 1)
    assert acts.recompute_transient_bytes == pytest.approx(none["q_k_v"], rel=1e-12)


def test_mlp_and_moe_act_recompute() -> None:
    base = Recipe(seq_len=4096, micro_batch=1, global_batch=8, recompute="selective")
    layout = Layout(dp=8)
    t, h, e = 4096, 7168, 2
    mlp = layer_activations(V3, replace(base, recompute_modules=("mlp",)), layout, 0).terms
    assert "mlp_intermediate" not in mlp and mlp["mlp_input"] == e * t * h
    moe_layer = layer_activations(V3, replace(base, recompute_modules=("mlp",)), layout, 3).terms
    assert "expert_mlp_intermediate" in moe_layer  # mlp leaves MoE layers alone
    act = layer_activations(V3, replace(base, recompute_modules=("moe_act",)), layout, 3).terms
    full = layer_activations(V3, replace(base, recompute="none"), layout, 3).terms
    slots = t * 8  # top-8, dropless
    assert full["expert_mlp_intermediate"] - act["expert_mlp_intermediate"] == e * slots * 2048
    rec = device_flops(V3, replace(base, recompute_modules=("mlp",)), layout)[0].recompute
    assert rec.gemm_flops == pytest.approx(3 * layer_forward_flops(V3, 0, 1.0, 4096.0).mlp, rel=1e-12)


def test_recompute_module_refusals() -> None:
    with pytest.raises(RecipeError, match="--recompute selective"):
        Recipe(recompute="full", recompute_modules=("mlp",))
    with pytest.raises(RecipeError, match="Megatron-Core"):
        Recipe(recompute="selective", recompute_modules=("mlp",), stack="pytorch")
    with pytest.raises(RecipeError, match="not modelled"):
        Recipe(recompute="selective", recompute_modules=("moe",))
    with pytest.raises(RecipeError, match="recompute_modules"):
        Recipe(recompute="selective", recompute_modules=("attention",))
    with pytest.raises(RecipeError, match="has none"):
        check_model_recipe(QWEN, Recipe(recompute="selective", recompute_modules=("mla_up_proj",)))
    with pytest.raises(RecipeError, match="--recompute none"):
        Recipe(recompute="selective", recompute_modules=())
