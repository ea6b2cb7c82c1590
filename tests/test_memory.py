"""The memory model against closed forms from the papers it generalises."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainplan.layout import Layout
from trainplan.memory import (
    korthikanti_table2_bytes,
    layer_activations,
    memory_breakdown,
)
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LoRASpec, Recipe

# Korthikanti et al. 2022 Table 3: GPT configurations (heads a, hidden h, layers L, tp t), s = 2048.
KORTHIKANTI_GPT = {
    "22B": (64, 6144, 48, 8),
    "175B": (96, 12288, 96, 8),
    "530B": (128, 20480, 105, 8),
    "1T": (160, 25600, 128, 8),
}


def gpt(a: int, h: int, layers: int) -> ModelSpec:
    return ModelSpec(
        name="gpt",
        family="gpt2",
        num_layers=layers,
        hidden_size=h,
        num_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        ffn_hidden=4 * h,
        vocab_size=51200,
        activation="gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=True,
        max_seq_len=2048,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )


MODES = {
    # Table 2 row -> (sequence_parallel, recompute)
    "tp": (False, "none"),
    "tp+sp": (True, "none"),
    "tp+selective": (False, "selective"),
    "tp+sp+selective": (True, "selective"),
    "full": (False, "full"),
}


@pytest.mark.parametrize("name", sorted(KORTHIKANTI_GPT))
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("micro_batch", [1, 4])
def test_korthikanti_table2_every_mode(name: str, mode: str, micro_batch: int) -> None:
    a, h, layers, t = KORTHIKANTI_GPT[name]
    sp, recompute = MODES[mode]
    model = gpt(a, h, layers)
    recipe = Recipe(
        seq_len=2048,
        micro_batch=micro_batch,
        attention="eager",
        dropout=0.1,
        recompute=recompute,  # type: ignore[arg-type]
    )
    layout = Layout(tp=t, sequence_parallel=sp)
    terms = layer_activations(model, recipe, layout, 0).terms
    # Korthikanti counts Megatron-LM's sequence parallelism, which saves the sequence shard of the
    # q/k/v and MLP inputs and all-gathers it again in backward (Sec. 4.2.2); PyTorch's DTensor
    # keeps the gathered input, the separate ``sp_gathered_inputs`` term.
    ours = sum(v for k, v in terms.items() if k not in ("norm_stats", "sp_gathered_inputs"))
    paper = korthikanti_table2_bytes(s=2048, b=micro_batch, h=h, a=a, t=t, mode=mode)
    assert ours == pytest.approx(paper, rel=1e-12)
    if sp:
        gathered = 2 * 2 * 2048 * micro_batch * h * (1 - 1 / t)  # q/k/v and MLP inputs, e = 2
        assert terms["sp_gathered_inputs"] == pytest.approx(gathered, rel=1e-12)
    # Korthikanti omits the FP32 LayerNorm statistics: 2 norms x (mean + rstd) = 16 bytes per token
    assert terms.get("norm_stats", 0.0) <= 16 * 2048 * micro_batch


def test_korthikanti_no_parallelism() -> None:
    a, h, layers, _ = KORTHIKANTI_GPT["22B"]
    recipe = Recipe(seq_len=2048, micro_batch=1, attention="eager", dropout=0.1)
    terms = layer_activations(gpt(a, h, layers), recipe, Layout(), 0).terms
    ours = sum(v for k, v in terms.items() if k != "norm_stats")
    assert ours == pytest.approx(korthikanti_table2_bytes(s=2048, b=1, h=h, a=a, t=1, mode="none"), rel=1e-12)


def test_flash_attention_drops_quadratic_terms() -> None:
    a, h, layers, _ = KORTHIKANTI_GPT["22B"]
    model = gpt(a, h, layers)
    eager = layer_activations(model, Recipe(seq_len=8192, attention="eager"), Layout(), 0).total_bytes
    flash = layer_activations(model, Recipe(seq_len=8192, attention="flash"), Layout(), 0).total_bytes
    flash_long = layer_activations(model, Recipe(seq_len=16384, attention="flash"), Layout(), 0).total_bytes
    assert flash < eager / 2
    assert flash_long == pytest.approx(2 * flash, rel=1e-12)  # linear in s without s² terms


def llama7b() -> ModelSpec:
    return ModelSpec(
        name="llama-2-7b",
        family="llama",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        ffn_hidden=11008,
        vocab_size=32000,
    )


def test_sixteen_bytes_per_parameter() -> None:
    """ZeRO Sec. 3.1: mixed-precision AdamW model states are 2 + 2 + 12 = 16 bytes per parameter."""
    model = llama7b()
    mem = memory_breakdown(model, Recipe(method="full", seq_len=512), Layout())
    n = mem.params_on_device
    assert n == 6_738_415_616
    assert mem.weights_bytes == 2 * n
    assert mem.gradients_bytes == 2 * n
    assert mem.optimizer_bytes == 12 * n
    assert mem.master_weights_bytes == 4 * n
    assert mem.model_states_bytes / 1e9 == pytest.approx(107.8, abs=0.1)  # "≈112 GB" for a round 7B


@pytest.mark.parametrize("dp", [1, 4, 16, 64, 256, 1024])
def test_zero_stage_formulas(dp: int) -> None:
    """ZeRO Sec. 5: P_os = 4Ψ + 12Ψ/N, P_os+g = 2Ψ + 14Ψ/N, P_os+g+p = 16Ψ/N."""
    model = llama7b()
    recipe = Recipe(method="full", seq_len=512)
    psi = 6_738_415_616
    expected = {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp, 3: 16 * psi / dp}
    for zero, want in expected.items():
        mem = memory_breakdown(model, recipe, Layout(dp=dp, zero=zero))
        assert mem.model_states_bytes == pytest.approx(want, rel=1e-12)


def test_qlora_quant_constants_bits_per_param() -> None:
    """QLoRA Sec. 3: constants cost 0.5 bits/param, 0.127 bits with double quantization."""
    model = llama7b()
    for dq, bits in ((False, 0.5), (True, 0.127)):
        recipe = Recipe(method="qlora", seq_len=512, lora=LoRASpec(double_quant=dq))
        mem = memory_breakdown(model, recipe, Layout())
        n_linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
        assert mem.quant_constants_bytes * 8 / n_linear == pytest.approx(bits, abs=0.0005)


def test_pipeline_first_stage_holds_pp_microbatches() -> None:
    """Korthikanti Eq. 5: under 1F1B the first stage stores L layers' worth of activations."""
    a, h, layers, t = KORTHIKANTI_GPT["175B"]
    model = gpt(a, h, layers)
    recipe = Recipe(seq_len=2048, micro_batch=1, attention="eager", dropout=0.1, global_batch=64)
    layout = Layout(tp=t, pp=8, sequence_parallel=True)
    mem = memory_breakdown(model, recipe, layout)
    per_layer = korthikanti_table2_bytes(s=2048, b=1, h=h, a=a, t=t, mode="tp+sp")
    layer_terms = sum(
        v for k, v in mem.activation_terms.items() if k not in ("norm_stats", "inputs", "sp_gathered_inputs")
    )
    assert mem.stage == 0
    assert layer_terms == pytest.approx(per_layer * layers, rel=1e-12)


def test_does_not_fit_names_optimizer_states() -> None:
    model = llama7b()
    mem = memory_breakdown(model, Recipe(method="full", seq_len=2048), Layout(), capacity_bytes=80e9)
    assert not mem.fits
    (reason,) = mem.reasons()
    assert "optimizer states" in reason
    assert "over by" in reason


def test_tensor_parallel_embedding_gradient_is_full_size_without_fsdp() -> None:
    """DTensor's vocabulary-parallel embedding keeps a replicated V × h gradient (traced)."""
    model = llama7b()
    v, h = model.vocab_size, model.hidden_size
    recipe = Recipe(method="full", seq_len=512)
    one = memory_breakdown(model, recipe, Layout(tp=4), num_microbatches=1)
    assert one.tp_embedding_grad_bytes == 2 * (v * h - v * h // 4)
    assert one.gradients_bytes == one.weights_bytes + one.tp_embedding_grad_bytes
    fsdp = memory_breakdown(model, recipe, Layout(dp=2, tp=4, zero=3), num_microbatches=1)
    assert fsdp.tp_embedding_grad_bytes == 0.0 and fsdp.fsdp_embedding_grad_bytes == 2 * v * h


def test_fsdp_root_post_backward_moment() -> None:
    """W + O + G − g·P_R/N + c·P_R (gathered) + c·P_R (its gradients) + c·V·h (TP embedding
    gradient and its Shard(0) copy) + r·P_L (the last block's reduce-scatter input)."""
    model = llama7b()
    mem = memory_breakdown(
        model, Recipe(method="full", seq_len=512), Layout(dp=4, tp=2, zero=3), num_microbatches=1
    )
    c, r = 2.0, 4.0
    v_local = model.vocab_size // 2 * model.hidden_size
    p_root = 2 * v_local + model.hidden_size
    p_layer = mem.fsdp_block_bytes / c
    expected = (
        mem.weights_bytes
        + mem.optimizer_bytes
        + mem.gradients_bytes
        - 4.0 * p_root / 4
        + 2 * c * p_root
        + c * model.vocab_size * model.hidden_size
        + r * p_layer
    )
    assert mem.phase_bytes("backward (root)") == pytest.approx(expected, rel=1e-12)


def test_tied_weight_gradients_are_summed_out_of_place() -> None:
    """At the end of backward a tied embedding/head weight has both gradients and their sum alive."""
    model = gpt(12, 768, 12)
    recipe = Recipe(method="full", seq_len=1024)
    mem = memory_breakdown(model, recipe, Layout(), num_microbatches=1)
    vh = model.vocab_size * model.hidden_size
    assert mem.tied_grad_bytes == 2 * vh
    states = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
    assert mem.phase_bytes("backward end") == pytest.approx(states + 2 * 2 * vh, rel=1e-12)
    accumulating = memory_breakdown(model, replace(recipe, global_batch=4), Layout(), num_microbatches=4)
    assert accumulating.phase_bytes("backward end") == pytest.approx(states + 3 * 2 * vh, rel=1e-12)
