"""FLOP and byte counts against published closed forms and hand-derived numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from trainplan import flops as F
from trainplan.errors import RecipeError
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec, MoESpec
from trainplan.recipe import LoRASpec, Recipe


def gpt(layers: int, hidden: int, heads: int, vocab: int = 51200) -> ModelSpec:
    """GPT-3-style layer: f = 4h, a·d = h, no GQA, GELU, LayerNorm, learned positions."""
    return ModelSpec(
        name=f"gpt-{layers}x{hidden}",
        family="gpt2",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden=4 * hidden,
        vocab_size=vocab,
        activation="gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=True,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )


LLAMA_7B = ModelSpec(
    name="llama-7b-like",
    family="llama",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=32,
    head_dim=128,
    ffn_hidden=11008,
    vocab_size=32000,
)

# A tiny GQA + SwiGLU model whose counts are derived by hand below.
TINY = ModelSpec(
    name="tiny",
    family="llama",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    ffn_hidden=160,
    vocab_size=100,
)

TINY_MOE = ModelSpec(
    name="tiny-moe",
    family="qwen2_moe",
    num_layers=3,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    ffn_hidden=160,
    vocab_size=100,
    moe=MoESpec(
        num_experts=8,
        top_k=2,
        expert_ffn_hidden=32,
        num_shared_experts=1,
        shared_expert_ffn_hidden=48,
        shared_expert_gate=True,
        first_dense_layers=1,
    ),
)

# Megatron 2021 Table 1 shapes (l, h, a) for a few rows.
TABLE1 = [(24, 2304, 24), (40, 6144, 48), (96, 12288, 96), (128, 25600, 160)]


# --- Megatron 2021 Eq. 3 -------------------------------------------------------------------
@pytest.mark.parametrize(("layers", "hidden", "heads"), TABLE1)
def test_full_recompute_hardware_flops_equal_megatron_eq3(layers: int, hidden: int, heads: int) -> None:
    """Eq. 3 = 4 × forward of every layer + 3 × forward of the LM head, non-causal attention.

    Eq. 3 omits biases, norms, softmax and the embedding (all memory-bound here, not FLOPs), so with
    ``causal=False`` and eager attention (no flash backward recompute) the match is exact.
    """
    batch, s, v = 512, 2048, 51200
    recipe = Recipe(seq_len=s, micro_batch=1, global_batch=batch, recompute="full", attention="eager")
    step = F.step_flops(gpt(layers, hidden, heads, v), recipe, causal=False)
    assert step.hardware_flops == pytest.approx(
        F.megatron2021_eq3_flops(batch, s, layers, hidden, v), rel=1e-12
    )


def test_causal_convention_maps_onto_eq3() -> None:
    """Causal: the s² term of Eq. 3 (16·B·s²·l·h) is halved, i.e. s/(6h) -> s/(12h)."""
    layers, hidden, heads = TABLE1[1]
    batch, s, v = 64, 2048, 51200
    recipe = Recipe(seq_len=s, micro_batch=1, global_batch=batch, recompute="full", attention="eager")
    step = F.step_flops(gpt(layers, hidden, heads, v), recipe, causal=True)
    adjusted = 96.0 * batch * s * layers * hidden**2 * (1 + s / (12 * hidden) + v / (16 * layers * hidden))
    assert step.hardware_flops == pytest.approx(adjusted, rel=1e-12)
    eq3 = F.megatron2021_eq3_flops(batch, s, layers, hidden, v)
    assert eq3 - step.hardware_flops == pytest.approx(8.0 * batch * s * s * layers * hidden, rel=1e-12)


# --- Korthikanti 2022 Eq. 7 / 8 ------------------------------------------------------------
@pytest.mark.parametrize(("layers", "hidden", "heads"), TABLE1)
def test_model_flops_equal_korthikanti_eq7(layers: int, hidden: int, heads: int) -> None:
    batch, s, v = 8, 2048, 51200
    recipe = Recipe(seq_len=s, micro_batch=1, global_batch=batch, recompute="selective", attention="eager")
    step = F.step_flops(gpt(layers, hidden, heads, v), recipe, causal=False)
    assert step.model_flops == pytest.approx(
        F.korthikanti2022_eq7_model_flops(batch, s, layers, hidden, v), rel=1e-12
    )


def test_selective_recompute_adds_one_attention_core_forward_eq8_adds_three() -> None:
    """Ours: + 4·B·L·s²·h (QKᵀ + PV forward). Eq. 8 − Eq. 7 = 12·B·L·s²·h (doubles the whole s² term)."""
    layers, hidden, heads = TABLE1[0]
    batch, s, v = 4, 2048, 51200
    recipe = Recipe(seq_len=s, micro_batch=1, global_batch=batch, recompute="selective", attention="eager")
    step = F.step_flops(gpt(layers, hidden, heads, v), recipe, causal=False)
    core_fwd = 4.0 * batch * layers * s * s * hidden
    assert step.hardware_flops - step.model_flops == pytest.approx(core_fwd, rel=1e-12)
    eq7 = F.korthikanti2022_eq7_model_flops(batch, s, layers, hidden, v)
    eq8 = F.korthikanti2022_eq8_hardware_flops(batch, s, layers, hidden, v)
    assert eq8 - eq7 == pytest.approx(3.0 * core_fwd, rel=1e-12)
    # Table 5 of the paper follows Eq. 8: its 22B row (L=48, h=6144) reports HFU/MFU = 43.7/41.5
    eq7_22b = F.korthikanti2022_eq7_model_flops(4, s, 48, 6144, v)
    eq8_22b = F.korthikanti2022_eq8_hardware_flops(4, s, 48, 6144, v)
    assert eq8_22b / eq7_22b == pytest.approx(43.7 / 41.5, rel=0.002)


# --- PaLM / 6N -------------------------------------------------------------------------------
def test_non_causal_model_flops_equal_palm_formula() -> None:
    s = 2048
    recipe = Recipe(seq_len=s, micro_batch=1, global_batch=1)
    step = F.step_flops(LLAMA_7B, recipe, causal=False)
    n = F.gemm_params(LLAMA_7B)
    per_token = F.palm_flops_per_token(n, 32, 32, 128, s)
    assert step.model_flops / step.tokens == pytest.approx(per_token, rel=1e-12)
    causal = F.step_flops(LLAMA_7B, recipe, causal=True)
    assert causal.model_flops / causal.tokens == pytest.approx(6 * n + 6 * 32 * 32 * 128 * s, rel=1e-12)


def test_six_n_rule_for_llama_7b_within_three_percent() -> None:
    """6·N·T with N = all 6.74B parameters vs our causal model FLOPs at s = 2048.

    Ours = 6·(N − V·h embedding − norm weights)·T + 6·L·s·h·T (causal attention): the embedding is a
    lookup (−1.9 %), attention adds +4.0 %; net +2.0 %.
    """
    h, f, v, layers = 4096, 11008, 32000, 32
    n_total = layers * (4 * h * h + 3 * h * f + 2 * h) + h + 2 * v * h  # untied, RMSNorm weights
    assert n_total == 6_738_415_616  # Llama-7B's published count
    s = 2048
    step = F.step_flops(LLAMA_7B, Recipe(seq_len=s, micro_batch=1, global_batch=8))
    exact = 6 * (n_total - v * h - layers * 2 * h - h) * step.tokens + 6 * layers * s * h * step.tokens
    assert step.model_flops == pytest.approx(exact, rel=1e-12)
    ratio = step.model_flops / F.six_n_flops(n_total, step.tokens)
    assert ratio == pytest.approx(1.020, abs=0.002)
    assert abs(ratio - 1) < 0.03


# --- Hand-derived tiny configs --------------------------------------------------------------
def test_tiny_gqa_swiglu_layer_by_hand() -> None:
    # b = 2, s = 8, T = 16; h = 64, a = 4, k = 2, d = 16, f = 160
    fl = F.layer_forward_flops(TINY, 0, 2, 8, causal=False)
    assert fl.qkv_proj == 2 * 16 * 64 * (64 + 32 + 32) == 262_144
    assert fl.attn_scores == 2 * 2 * 4 * 8 * 8 * 16 == 16_384
    assert fl.attn_values == 16_384
    assert fl.out_proj == 2 * 16 * 64 * 64 == 131_072
    assert fl.mlp == 3 * 2 * 16 * 64 * 160 == 983_040
    assert fl.moe_experts == 0 and fl.router == 0
    assert fl.total == 262_144 + 2 * 16_384 + 131_072 + 983_040
    causal = F.layer_forward_flops(TINY, 0, 2, 8)
    assert causal.attn_scores == 8_192 and causal.gemm == fl.gemm
    assert F.logits_forward_flops(TINY, 2, 8) == 2 * 16 * 64 * 100
    # N = 2 layers x (64·128 + 64·64 + 3·64·160) + 100·64
    assert F.gemm_params(TINY) == 2 * (8192 + 4096 + 30720) + 6400


def test_tiny_moe_layers_by_hand() -> None:
    dense = F.layer_forward_flops(TINY_MOE, 0, 2, 8)  # first_dense_layers = 1
    assert dense.mlp == 983_040 and dense.moe_experts == 0
    moe = F.layer_forward_flops(TINY_MOE, 1, 2, 8)
    # K·f_e + shared = 2·32 + 48 = 112 columns, 3 matrices (SwiGLU)
    assert moe.moe_experts == 3 * 2 * 16 * 64 * 112 == 688_128
    # router h -> E plus the shared-expert gate h -> 1
    assert moe.router == 2 * 16 * 64 * 8 + 2 * 16 * 64 == 18_432
    assert moe.mlp == 0
    active = F.gemm_params(TINY_MOE)
    total = F.gemm_params(TINY_MOE, active=False)
    assert total - active == 2 * 3 * 64 * (8 - 2) * 32  # 2 MoE layers x 6 idle experts


def test_layer_gemms_sum_to_layer_flops_with_tp_and_ep() -> None:
    tokens = 16.0
    fl = F.layer_forward_flops(TINY_MOE, 1, 2, 8)
    gemms = F.layer_gemms(TINY_MOE, 1, tokens, tp=2, ep=4)
    by_name = {g.name: g for g in gemms}
    assert by_name["expert_up"].m == tokens * 2 * 4 / 8  # tokens·K·ep/E per local expert
    assert by_name["expert_up"].count == 2 * 8 / 4  # gate + up for E/ep experts
    split = sum(g.flops for g in gemms if g.name != "router")
    assert split == pytest.approx((fl.gemm - fl.router) / 2)
    assert by_name["router"].flops == pytest.approx(2 * tokens * 64 * 8)


# --- Backward, recompute, PEFT -------------------------------------------------------------
def test_backward_is_twice_forward_and_flash_recomputes_scores() -> None:
    eager = F.step_flops(TINY, Recipe(seq_len=8, micro_batch=2, attention="eager"))
    assert eager.backward.gemm_flops == 2 * eager.forward.gemm_flops
    assert eager.backward.attention_flops == 2 * eager.forward.attention_flops
    assert eager.recompute.flops == 0 and eager.hardware_flops == eager.model_flops
    flash = F.step_flops(TINY, Recipe(seq_len=8, micro_batch=2, attention="flash"))
    assert flash.backward.attention_flops == 2.5 * flash.forward.attention_flops
    assert flash.model_flops == eager.model_flops


def test_full_recompute_repeats_layers_not_the_head() -> None:
    r = Recipe(seq_len=8, micro_batch=2, recompute="full", attention="eager")
    step = F.step_flops(TINY, r)
    head = F.logits_forward_flops(TINY, 2, 8)
    assert step.recompute.flops == pytest.approx(step.forward.flops - head)


def _early_stop_pair(
    spec: ModelSpec, layout: Layout | None = None, **kw: object
) -> tuple[F.StageFlops, F.StageFlops]:
    """(recompute the whole block, early stop) on the only stage of ``layout``."""
    layout = layout or Layout()
    base = dict(seq_len=8, micro_batch=2, recompute="full", attention="eager")
    base.update(kw)
    whole = F.device_flops(spec, Recipe(**base), layout)[0]  # type: ignore[arg-type]
    early = F.device_flops(spec, Recipe(**base, recompute_early_stop=True), layout)[0]  # type: ignore[arg-type]
    return whole, early


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False), (2, True)])
def test_early_stop_recompute_skips_each_dense_down_projection(tp: int, sp: bool) -> None:
    """PyTorch checkpoint with early stop: recompute = forward - 2·b·s·h·f/tp per dense layer, exactly."""
    layout = Layout(tp=tp, sequence_parallel=sp)
    whole, early = _early_stop_pair(TINY, layout)
    b, s, h, f, e = 2, 8, 64, 160, 2
    down = 2 * b * s * h * f / tp
    head = F.logits_forward_flops(TINY, b, s) / tp
    assert whole.recompute.gemm_flops == whole.forward.gemm_flops - head
    assert early.recompute.gemm_flops == whole.recompute.gemm_flops - TINY.num_layers * down
    assert early.recompute.attention_flops == whole.recompute.attention_flops
    assert early.forward == whole.forward and early.backward == whole.backward
    # the residual add after the MLP (3·T·h·e bytes) is not redone either; split like residuals
    residual = 3 * b * s * h * e / (tp if sp else 1)
    assert early.recompute.memory_bytes == whole.recompute.memory_bytes - TINY.num_layers * residual


def test_early_stop_keeps_model_flops_and_lowers_hardware_flops() -> None:
    r = Recipe(seq_len=8, micro_batch=2, global_batch=4, recompute="full")
    whole = F.step_flops(TINY, r)
    early = F.step_flops(
        TINY, Recipe(seq_len=8, micro_batch=2, global_batch=4, recompute="full", recompute_early_stop=True)
    )
    assert early.model_flops == whole.model_flops
    assert early.hardware_flops == whole.hardware_flops - TINY.num_layers * 2 * (4 * 8) * 64 * 160
    # recompute none / selective: the switch changes nothing
    for rc in ("none", "selective"):
        a = F.step_flops(TINY, Recipe(seq_len=8, micro_batch=2, recompute=rc))  # type: ignore[arg-type]
        b = F.step_flops(TINY, Recipe(seq_len=8, micro_batch=2, recompute=rc, recompute_early_stop=True))  # type: ignore[arg-type]
        assert a == b


@pytest.mark.parametrize(
    ("method", "targets", "skipped"),
    [
        ("lora", ("q", "v", "down"), 2 * 16 * 4 * 64),  # LoRA B of down (r -> h) runs after the base
        ("lora", ("q", "v"), 2 * 16 * 160 * 64),  # the frozen base down saves its weight, then runs
        ("qlora", ("q", "v", "down"), 2 * 16 * 4 * 64),
        ("qlora", ("q", "v"), 0),  # the NF4 matmul (an autograd Function) saves after it runs
    ],
)
def test_early_stop_with_adapters(method: str, targets: tuple[str, ...], skipped: int) -> None:
    whole, early = _early_stop_pair(TINY, method=method, lora=LoRASpec(rank=4, targets=targets))
    assert early.recompute.gemm_flops == whole.recompute.gemm_flops - TINY.num_layers * skipped
    assert early.dequant_bytes == whole.dequant_bytes  # the NF4 down projection is always redone


def test_early_stop_skips_no_gemm_when_a_later_op_saves_the_mlp_output() -> None:
    residual = TINY.num_layers * 3 * 2 * 8 * 64 * 2
    cases = [
        (TINY, {"precision": "fp8"}),  # torchao Float8Linear is an autograd Function
        (TINY, {"dropout": 0.1}),  # the hidden dropout saves its mask after the down projection
        (replace(TINY, name="tiny-post", post_norms=True), {}),  # Gemma 2's post-MLP norm
    ]
    for spec, kw in cases:
        whole, early = _early_stop_pair(spec, **kw)
        assert early.recompute.gemm_flops == whole.recompute.gemm_flops, kw
        assert early.recompute.memory_bytes == whole.recompute.memory_bytes - residual, kw


def test_early_stop_on_moe_layers() -> None:
    b, s, h, e = 2, 8, 64, 2
    t = b * s
    moe = TINY_MOE.moe
    assert moe is not None
    dense_down = 2 * t * h * 160  # layer 0 is dense
    # gated shared expert: the gate product saves the shared output, nothing skipped on MoE layers
    whole, early = _early_stop_pair(TINY_MOE)
    assert early.recompute.gemm_flops == whole.recompute.gemm_flops - dense_down
    # ungated: the shared expert's down projection (48 wide) is the last save of both MoE layers
    ungated = replace(TINY_MOE, moe=replace(moe, shared_expert_gate=False))
    whole, early = _early_stop_pair(ungated)
    assert early.recompute.gemm_flops == whole.recompute.gemm_flops - dense_down - 2 * (2 * t * h * 48)
    # routed experts only: index_add (the combine) saves before it runs, so it is skipped too
    routed = replace(
        TINY_MOE,
        moe=replace(moe, num_shared_experts=0, shared_expert_ffn_hidden=0, shared_expert_gate=False),
    )
    whole, early = _early_stop_pair(routed)
    assert early.recompute.gemm_flops == whole.recompute.gemm_flops - dense_down
    combine = (t * moe.top_k * h + t * h) * e
    residual = 3 * t * h * e
    assert early.recompute.memory_bytes == whole.recompute.memory_bytes - 3 * residual - 2 * combine


def test_recompute_early_stop_must_be_a_bool() -> None:
    with pytest.raises(RecipeError) as err:
        Recipe(recompute="full", recompute_early_stop="yes")  # type: ignore[arg-type]
    assert err.value.field == "recompute_early_stop"
    assert "--recompute-early-stop" in str(err.value)


def test_lora_frozen_base_backward_is_dx_only() -> None:
    lora = LoRASpec(rank=4, targets=("q", "v"))
    r = Recipe(method="lora", seq_len=8, micro_batch=2, lora=lora, attention="eager")
    step = F.step_flops(TINY, r)
    full = F.step_flops(TINY, Recipe(seq_len=8, micro_batch=2, attention="eager"))
    tokens = 16
    # adapters: q (64->64) and v (64->32): 2·r·(n_in + n_out) per token per layer
    adapter_fwd = 2 * tokens * 2 * 4 * ((64 + 64) + (64 + 32))
    assert step.forward.gemm_flops == pytest.approx(full.forward.gemm_flops + adapter_fwd)
    # frozen base (and frozen LM head): backward = dX only = 1x forward; adapters: 2x; and the first
    # layer's input needs no gradient (frozen embedding): no dX for its q/k/v (64 -> 64+32+32) nor
    # for its q and v adapters' A matrices (r x 64)
    skipped = 2 * tokens * 64 * (64 + 32 + 32) + 2 * (2 * tokens * 4 * 64)
    assert step.backward.gemm_flops == pytest.approx(full.forward.gemm_flops + 2 * adapter_fwd - skipped)
    assert step.backward.attention_flops == full.backward.attention_flops
    base_plus_head = full.forward.gemm_flops
    # the skipped input gradients are not model FLOPs either, so MFU stays <= HFU
    assert step.model_flops == pytest.approx(
        2 * base_plus_head + 3 * adapter_fwd + 3 * full.forward.attention_flops - skipped
    )
    assert step.model_flops <= step.hardware_flops
    assert F.lora_adapter_params(TINY, lora) == 2 * 4 * ((64 + 64) + (64 + 32))


def test_qlora_dequantisation_is_bytes_not_flops() -> None:
    lora = LoRASpec(rank=4)
    r_lora = Recipe(method="lora", seq_len=8, micro_batch=2, global_batch=4, lora=lora)
    r_q = Recipe(method="qlora", seq_len=8, micro_batch=2, global_batch=4, lora=lora)
    a, q = F.step_flops(TINY, r_lora), F.step_flops(TINY, r_q)
    assert q.hardware_flops == a.hardware_flops
    per_param = F.qlora_dequant_bytes_per_param(lora)
    assert per_param == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256) + 2.0)
    block_params = 2 * (64 * 128 + 64 * 64 + 3 * 64 * 160)
    # forward + backward (dX) per micro-batch, 2 micro-batches
    assert q.dequant_bytes == pytest.approx(2 * 2 * block_params * per_param)
    assert a.dequant_bytes == 0


def test_memory_traffic_terms() -> None:
    flash = F.layer_memory_traffic(TINY, 0, 2, 8, attention="flash")
    eager = F.layer_memory_traffic(TINY, 0, 2, 8, attention="eager")
    assert flash.softmax == 0 and flash.attention_io == 16 * (2 * 4 + 2 * 2) * 16 * 2
    assert eager.attention_io == 0 and eager.softmax == 2 * 4 * 8 * 8 * 2 * 2
    assert flash.activation == 16 * 160 * 2 * 3  # SwiGLU reads gate, up; writes y
    back = F.layer_memory_traffic(TINY, 0, 2, 8, direction="backward")
    assert back.norms == 1.5 * flash.norms and back.activation == pytest.approx(5 / 3 * flash.activation)
    moe = F.layer_memory_traffic(TINY_MOE, 1, 2, 8)
    assert moe.moe_permute > 0 and moe.router > 0
    assert F.layer_memory_traffic(TINY_MOE, 0, 2, 8).moe_permute == 0


def test_optimizer_update_bytes() -> None:
    # AdamW, BF16 mixed precision: master 4+4, m 4+4, v 4+4, grad read twice 2+2, BF16 copy 2
    assert F.optimizer_update_bytes(1.0, Recipe()) == 30.0
    assert F.optimizer_update_bytes(1.0, Recipe(precision="fp32")) == 24.0 + 8.0
    assert F.optimizer_update_bytes(10.0, Recipe(optimizer="sgd")) == 10 * (8 + 4 + 2)


# --- Per device ------------------------------------------------------------------------------
def test_stage_layers_split_and_interleave() -> None:
    assert [len(x) for x in F.stage_layers(10, 4)] == [3, 3, 2, 2]
    assert F.stage_layers(8, 2, 2) == ((0, 1, 4, 5), (2, 3, 6, 7))


def test_device_flops_sum_to_step_flops_with_sequence_parallel() -> None:
    spec = gpt(8, 512, 8, 1024)
    layout = Layout(dp=2, tp=4, pp=2, cp=2, sequence_parallel=True)
    r = Recipe(seq_len=256, micro_batch=2, global_batch=16, recompute="selective", attention="flash")
    step = F.step_flops(spec, r)
    stages = F.device_flops(spec, r, layout)
    assert [st.micro_batches for st in stages] == [4, 4]
    per_stage_devices = layout.tp * layout.cp * layout.dp
    assert sum(st.step_hardware_flops for st in stages) * per_stage_devices == pytest.approx(
        step.hardware_flops
    )
    passes = sum(st.step_memory_bytes for st in stages) * per_stage_devices
    assert passes == pytest.approx(step.memory_bytes)
    assert stages[1].forward.gemm_flops > stages[0].forward.gemm_flops  # the LM head is on the last stage
    balanced = step.per_device(layout)
    assert balanced.model_flops == pytest.approx(step.model_flops / layout.num_devices)


def test_without_sequence_parallel_norms_are_replicated() -> None:
    spec = gpt(4, 256, 4, 512)
    r = Recipe(seq_len=128, micro_batch=1)
    sp = F.device_flops(spec, r, Layout(tp=4, sequence_parallel=True))[0]
    no_sp = F.device_flops(spec, r, Layout(tp=4))[0]
    assert no_sp.forward.flops == sp.forward.flops
    assert no_sp.forward.memory_bytes > sp.forward.memory_bytes


def test_expert_parallelism_does_not_change_device_flops() -> None:
    r = Recipe(seq_len=8, micro_batch=2)
    one = F.device_flops(TINY_MOE, r, Layout(dp=4))[0]
    ep = F.device_flops(TINY_MOE, r, Layout(dp=4, ep=4))[0]
    assert one.forward.flops == ep.forward.flops


def test_attention_fraction_is_a_fraction() -> None:
    frac = F.attention_fraction(LLAMA_7B, 4096)
    assert 0 < frac < 0.2 and not math.isnan(frac)


def test_moe_stages_with_layer_frequency_sum_to_the_step() -> None:
    spec = ModelSpec(
        name="moe-freq",
        family="mixtral",
        num_layers=10,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        ffn_hidden=128,
        vocab_size=100,
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden=32, first_dense_layers=1, layer_freq=2),
    )
    r = Recipe(seq_len=8, micro_batch=1, global_batch=4)
    stages = F.device_flops(spec, r, Layout(dp=2, pp=2))
    total = sum(st.step_hardware_flops for st in stages) * 2
    assert total == pytest.approx(F.step_flops(spec, r).hardware_flops)


# --- Per-op selective checkpointing (recompute="sac") ---------------------------------------
def _sac(spec: ModelSpec, layout: Layout | None = None, **kw: object) -> F.StageFlops:
    base: dict[str, object] = dict(seq_len=8, micro_batch=2, recompute="sac")
    base.update(kw)
    return F.device_flops(spec, Recipe(**base), layout or Layout())[0]  # type: ignore[arg-type]


def test_sac_recomputes_the_even_matmuls_of_a_llama_block() -> None:
    """q(1) k(2) v(3) o(4) gate(5) up(6) down(7): k, o and up are rerun, 2·T·h·(k·d + a·d + f)."""
    t, h, q, g, f = 2 * 8, 64, 64, 32, 160
    st = _sac(TINY)
    assert st.recompute.gemm_flops == TINY.num_layers * 2 * t * h * (g + q + f)
    assert st.recompute.attention_flops == 0  # the flash kernel's output is kept
    none = _sac(TINY, recompute="none")
    assert st.forward == none.forward and st.backward == none.backward
    # the memory-bound forward ops are rerun, the attention kernel's I/O is not
    fwd = F.layer_memory_traffic(TINY, 0, 2, 8, dtype_bytes=2.0)
    assert st.recompute.memory_bytes == pytest.approx(TINY.num_layers * (fwd.total - fwd.attention_io))
    # the down projection is kept: early stop skips no GEMM, only the last residual add
    early = _sac(TINY, recompute_early_stop=True)
    assert early.recompute.gemm_flops == st.recompute.gemm_flops
    residual = 3 * t * h * 2
    assert early.recompute.memory_bytes == pytest.approx(
        st.recompute.memory_bytes - TINY.num_layers * residual
    )


def test_sac_recomputes_every_biased_linear() -> None:
    """aten.addmm (a linear with a bias) is neither kept nor counted: a GPT-2 block reruns all four
    projections; with biases on q/k/v only the count starts at o (o, up kept; gate, down rerun)."""
    model = gpt(2, 64, 4, vocab=100)
    st = _sac(model)
    full = _sac(model, recompute="full")
    assert st.recompute.gemm_flops == full.recompute.gemm_flops
    assert full.recompute.attention_flops > 0 and st.recompute.attention_flops == 0
    # early stop: the recomputed down projection is the last save's op, as under full recompute
    early = _sac(model, recompute_early_stop=True)
    full_early = _sac(model, recompute="full", recompute_early_stop=True)
    assert early.recompute.gemm_flops == full_early.recompute.gemm_flops
    t, h, f, q, g = 2 * 8, 64, 160, 64, 32
    qwen = replace(TINY, name="tiny-qkv-bias", qkv_bias=True)
    assert _sac(qwen).recompute.gemm_flops == TINY.num_layers * 2 * t * (h * (q + 2 * g) + h * f + f * h)
    early = _sac(qwen, recompute_early_stop=True)
    assert early.recompute.gemm_flops == TINY.num_layers * 2 * t * (h * (q + 2 * g) + h * f)


def test_sac_keeps_model_flops_and_adds_hardware_flops() -> None:
    r = Recipe(seq_len=8, micro_batch=2, global_batch=4)
    none = F.step_flops(TINY, r)
    sac = F.step_flops(TINY, replace(r, recompute="sac"))
    assert sac.model_flops == none.model_flops
    t = 4 * 8
    assert sac.hardware_flops == pytest.approx(
        none.hardware_flops + TINY.num_layers * 2 * t * 64 * (32 + 64 + 160)
    )


def test_sac_combinations_that_are_not_modelled_are_errors() -> None:
    from trainplan.errors import LayoutError

    for kw in (
        {"method": "lora"},
        {"method": "qlora"},
        {"precision": "fp8"},
        {"precision": "fp4"},
        {"attention": "eager"},
        {"dropout": 0.1},
    ):
        with pytest.raises(RecipeError) as err:
            Recipe(recompute="sac", **kw)  # type: ignore[arg-type]
        assert err.value.field == "recompute" and "--recompute full or selective" in str(err.value), kw
    with pytest.raises(RecipeError, match="MoE"):
        F.step_flops(TINY_MOE, Recipe(seq_len=8, recompute="sac"))
    for layout, field in ((Layout(tp=2), "tp"), (Layout(cp=2), "cp")):
        with pytest.raises(LayoutError) as lerr:
            F.device_flops(TINY, Recipe(seq_len=8, recompute="sac"), layout)
        assert lerr.value.field == field


def test_sliding_window_attention_counts_the_band() -> None:
    """A local layer scores s·w − w²/2 query-key pairs per head (query i sees min(i + 1, w) keys);
    Gemma 2 alternates local (even) and global (odd) layers; a window at least the sequence is the
    causal count."""
    from trainplan.errors import LayoutError, ModelError
    from trainplan.models import load_model
    from trainplan.models.hf import from_hf_config

    mistral = load_model("mistral-7b")  # every layer local, 4096
    full = load_model("mistral-7b-v0.2")
    s, w = 8192, 4096
    ratio = (s * w - w * w / 2) / (s * s / 2)
    r = Recipe(seq_len=s, global_batch=1)
    assert F.step_flops(mistral, r).attention_flops == pytest.approx(
        ratio * F.step_flops(full, r).attention_flops
    )
    short = Recipe(seq_len=2048, global_batch=1)
    assert F.step_flops(mistral, short).attention_flops == pytest.approx(
        F.step_flops(full, short).attention_flops
    )
    gemma = load_model("gemma-2-9b")
    assert [gemma.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    dense = replace(gemma, attention_window=0, global_every=0)
    r = Recipe(seq_len=16384, global_batch=1)
    half = (1 + (16384 * 4096 - 4096**2 / 2) / (16384**2 / 2)) / 2
    assert F.step_flops(gemma, r).attention_flops == pytest.approx(
        half * F.step_flops(dense, r).attention_flops
    )
    with pytest.raises(LayoutError, match="sliding-window"):
        F.step_flops(mistral, Recipe(seq_len=8192, global_batch=1), Layout(cp=2))
    # config.json: layer_types every third layer global; Qwen's window on the last layers refused
    cfg = {
        "model_type": "mistral",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 8,
        "num_hidden_layers": 6,
        "num_key_value_heads": 8,
        "vocab_size": 1000,
        "max_position_embeddings": 8192,
        "sliding_window": 512,
        "hidden_act": "silu",
    }
    assert from_hf_config(cfg, "m").global_every == 0
    types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    m = from_hf_config({**cfg, "layer_types": types}, "m")
    assert (m.attention_window, m.global_every) == (512, 3)
    with pytest.raises(ModelError, match="layer_types"):
        from_hf_config({**cfg, "layer_types": ["full_attention", *types[1:]]}, "m")
    qwen = {**cfg, "model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 3}
    with pytest.raises(ModelError, match="use_sliding_window"):
        from_hf_config(qwen, "q")
