"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): parameters, FLOPs, GEMMs, saved
activations and ring traffic, each against a hand count, and the layouts and methods it refuses.

Published checks: DeepSeek-V3 has 671B parameters with 37B activated (arXiv:2412.19437, Sec. 1),
and Megatron-Bridge's table of DeepSeek-V3 runs without MTP reports 961 model TFLOP/s per GPU at
3,848 tokens/s per GPU (docs/performance-summary-archive.md at 067f987, 25.11, DGX-GB300 BF16):
249.7 GFLOP per token at sequence 4096.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainplan.errors import LayoutError, RecipeError, TrainplanError
from trainplan.export import export_plan
from trainplan.flops import gemm_params, layer_forward_flops, layer_gemms, lora_adapter_params, step_flops
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import layer_activations
from trainplan.models import load_model
from trainplan.models.hf import from_hf_config
from trainplan.models.params import count_params, layer_params, linear_shapes, lora_params
from trainplan.models.spec import MLASpec, ModelSpec
from trainplan.planner import SearchSpace, plan
from trainplan.predict import estimate
from trainplan.recipe import LoRASpec, Recipe, check_model_recipe
from trainplan.sharding import device_params

HF = Path(__file__).parent / "data" / "hf_configs"
V3 = load_model("deepseek-v3")
LITE = load_model("deepseek-v2-lite")

# DeepSeek-V3 shapes (config.json): h 7168, a 128, r_q 1536, r_kv 512, d_n 128, d_r 64, d_v 128
H, A, RQ, RKV, DN, DR, DV = 7168, 128, 1536, 512, 128, 64, 128


def _v3_attention_weights() -> int:
    """q_a, q_b, kv_a, kv_b, o of one DeepSeek-V3 block, by hand."""
    return H * RQ + RQ * A * (DN + DR) + H * (RKV + DR) + RKV * A * (DN + DV) + A * DV * H


def test_presets_match_their_hugging_face_configs() -> None:
    for name in ("deepseek-v3", "deepseek-v2-lite"):
        cfg = json.loads((HF / f"{name}.json").read_text())
        got = from_hf_config(cfg, name)
        assert count_params(got) == count_params(load_model(name))
        assert (got.mla, got.moe, got.head_dim, got.num_kv_heads) == (
            load_model(name).mla,
            load_model(name).moe,
            192,
            got.num_heads,
        )
    assert any(
        "multi-token-prediction" in n
        for n in from_hf_config(cfg | {"num_nextn_predict_layers": 1}, "x").notes
    )


def test_deepseek_v3_parameters_by_hand_and_as_published() -> None:
    attention = _v3_attention_weights() + RQ + RKV  # + the two latent RMSNorms
    norms = 2 * H
    dense_mlp = 3 * H * 18432
    moe = H * 256 + 256 * 3 * H * 2048 + 3 * H * 2048  # router, 256 routed experts, 1 shared expert
    embeddings = 2 * 129280 * H  # untied
    total = 61 * (attention + norms) + 3 * dense_mlp + 58 * moe + embeddings + H
    c = count_params(V3)
    assert c.total == total
    assert layer_params(V3, 0) == attention + norms + dense_mlp
    assert round(c.total / 1e9) == 671  # "671B total parameters"
    assert int(c.active / 1e9) == 37  # "37B activated for each token"
    assert [s.module for s in linear_shapes(V3, 0)[:5]] == ["q_a", "q_b", "kv_a", "kv_b", "o"]
    # without query compression (DeepSeek-V2-Lite): q is projected from x
    assert [s.module for s in linear_shapes(LITE, 0)[:4]] == ["q", "kv_a", "kv_b", "o"]
    assert round(count_params(LITE).total / 1e8) == 157  # "15.7B total parameters"
    kimi = count_params(load_model("kimi-k2"))
    assert (round(kimi.total / 1e12, 2), round(kimi.active / 1e9)) == (1.03, 33)


def test_layer_flops_and_gemms_by_hand() -> None:
    b, s = 1.0, 4096.0
    t = b * s
    fl = layer_forward_flops(V3, 3, b, s)  # an MoE layer
    assert fl.latent_proj == 2 * t * H * (RQ + RKV + DR)
    assert fl.qkv_proj == 2 * t * (RQ * A * (DN + DR) + RKV * A * (DN + DV))
    assert fl.out_proj == 2 * t * A * DV * H
    assert fl.attn_scores == 2 * b * A * s * s * (DN + DR) / 2  # causal
    assert fl.attn_values == 2 * b * A * s * s * DV / 2
    assert gemm_params(V3) - gemm_params(V3, active=False) == 58 * (8 - 256) * 3 * H * 2048
    gemms = {g.name: g for g in layer_gemms(V3, 3, t, tp=1, ep=8)}
    assert (gemms["kv_a_proj"].n, gemms["kv_a_proj"].k) == (RKV + DR, H)
    assert (gemms["kv_b_proj"].n, gemms["kv_b_proj"].k) == (A * (DN + DV), RKV)
    assert (gemms["o_proj"].n, gemms["o_proj"].k) == (H, A * DV)
    assert (
        sum(g.flops for n, g in gemms.items() if n.endswith("_proj"))
        == fl.qkv_proj + fl.latent_proj + fl.out_proj
    )


def test_model_flops_per_token_match_megatron_bridges_published_ratio() -> None:
    sf = step_flops(V3, Recipe(seq_len=4096, micro_batch=1, global_batch=1))
    per_token = sf.model_flops / 4096
    published = 961e12 / 3848  # model TFLOP/s per GPU over tokens/s per GPU, without MTP
    assert per_token == pytest.approx(published, rel=0.01)


def test_saved_activations_by_hand() -> None:
    recipe = Recipe(seq_len=4096, micro_batch=1, global_batch=8, stack="pytorch")
    acts = layer_activations(V3, recipe, Layout(dp=8), 0).terms
    t, e = 4096, 2
    assert acts["q_k_v"] == e * t * (A * (DN + DR) * 2 + A * DV)
    assert acts["attn_output_and_lse"] == e * t * A * DV + 4 * A * t
    assert acts["mla_latents"] == 2 * e * t * (RQ + RKV)  # each norm's input and output
    assert acts["norm_stats_latent"] == 2 * 4 * t
    # LoRA on o only: the frozen up projections keep no copy; the latent norms keep their inputs
    lora = Recipe(seq_len=4096, micro_batch=1, global_batch=8, stack="pytorch", method="lora",
                  lora=LoRASpec(rank=8, targets=("o",)))  # fmt: skip
    assert layer_activations(V3, lora, Layout(dp=8), 0).terms["mla_latents"] == e * t * (RQ + RKV)
    # Transformer Engine under FP8: the two down projections each keep a quantized copy of x
    fp8 = replace(recipe, stack="megatron", precision="fp8")
    te = layer_activations(V3, fp8, Layout(dp=8), 0).terms
    assert te["qkv_input"] == 2 * (1 + 1 / 32) * t * H


def test_context_parallel_ring_carries_mla_keys_and_values() -> None:
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    est = estimate(system, LITE, Recipe(seq_len=8192, micro_batch=1, global_batch=8), Layout(dp=4, cp=2))
    ring = [c for c in est.time.collectives if c.group == "cp"]
    assert ring
    # K: a·(d_n + d_r), V: a·d_v per local token, bf16
    kv = 1 * (8192 / 2) * 16 * (192 + 128) * 2
    assert min(c.buffer_bytes for c in ring) == kv


def test_lora_targets_map_onto_the_latent_projections() -> None:
    lora = LoRASpec(rank=16, targets=("q", "k", "v", "o"))
    q = RQ + A * (DN + DR) + H + RQ  # q_a (h→r_q) and q_b (r_q→a·d)
    kv = H + RKV + DR + RKV + A * (DN + DV)  # kv_a and kv_b, adapted once for k and v together
    o = A * DV + H
    assert lora_params(V3, rank=16, targets=lora.targets) == 61 * 16 * (q + kv + o)
    assert lora_adapter_params(V3, lora) == lora_params(V3, rank=16, targets=lora.targets)
    dev = device_params(V3, Layout(), 0, lora)
    assert dev.lora_adapters == lora_params(V3, rank=16, targets=lora.targets)


def test_per_device_parameters_add_up_over_pipeline_and_expert_ranks() -> None:
    layout = Layout(dp=8, pp=4, ep=8)
    c = count_params(V3)
    expert = c.moe_experts
    per_stage = [device_params(V3, layout, st) for st in range(4)]
    assert sum(d.dense for d in per_stage) == c.total - expert
    assert sum(d.expert_linear for d in per_stage) * 8 == expert


def test_refusals_name_the_reason() -> None:
    with pytest.raises(LayoutError, match="megatron stack"):
        estimate(
            System(accelerator=get_accelerator("h100-sxm"), num_devices=8),
            LITE,
            Recipe(global_batch=8, stack="pytorch"),
            Layout(dp=4, tp=2),
        )
    with pytest.raises(RecipeError, match="latent attention"):
        check_model_recipe(V3, Recipe(method="grpo"))
    with pytest.raises(TrainplanError, match="latent attention"):
        estimate(
            System(accelerator=get_accelerator("h100-sxm"), num_devices=8),
            LITE,
            Recipe(recompute="sac", global_batch=8, stack="pytorch"),
            Layout(dp=8),
        )
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    with pytest.raises(TrainplanError, match="latent attention"):
        export_plan("nemo", system, LITE, Recipe(global_batch=8), Layout(dp=8, ep=8))
    with pytest.raises(Exception, match="latent attention"):
        from trainplan.trace.step import check_supported

        check_supported(LITE, Recipe(global_batch=8), Layout(dp=8))
    with pytest.raises(TrainplanError, match="head_dim"):
        ModelSpec(
            name="x", family="x", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
            ffn_hidden=128, vocab_size=100,
            mla=MLASpec(q_lora_rank=0, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
        )  # fmt: skip


def test_tensor_parallel_collectives_carry_the_latents() -> None:
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    recipe = Recipe(seq_len=4096, micro_batch=1, global_batch=8)
    est = estimate(system, V3, recipe, Layout(dp=4, tp=2, ep=4, sequence_parallel=True, zero=1))
    by_name = {c.name: c.buffer_bytes for c in est.time.collectives if c.group == "tp"}
    act = 1 * 4096 * H * 2  # b·s·h·e
    f = (RQ + RKV + DR) / H  # the gathered query latent, key/value latent and rotary key
    assert by_name["tp_forward_all_gather"] == pytest.approx(act * (1 + f) / 2)
    assert by_name["tp_forward_reduce_scatter"] == pytest.approx(act)  # leaving a region: h
    assert by_name["tp_backward_reduce_scatter"] == pytest.approx(act * (1 + f) / 2)
    assert by_name["tp_backward_all_gather"] == pytest.approx(act)
    dense = estimate(
        system, load_model("qwen3-30b-a3b"), recipe, Layout(dp=4, tp=2, ep=4, sequence_parallel=True, zero=1)
    )
    assert {c.buffer_bytes for c in dense.time.collectives if c.name.startswith("tp_forward_")} == {
        1 * 4096 * 2048 * 2.0
    }


def test_planner_searches_tensor_parallelism_on_the_megatron_stack() -> None:
    result = plan(
        LITE,
        Recipe(method="full", global_batch=64, tokens=1e9),
        [get_accelerator("h100-sxm")],
        space=SearchSpace(device_counts=(8,)),
    )
    assert result.plans
    best = result.plans[0].estimate
    again = estimate(best.system, LITE, best.recipe, best.layout)
    assert again.time.step_s == pytest.approx(best.time.step_s, rel=1e-12)
