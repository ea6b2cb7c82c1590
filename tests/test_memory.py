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
from trainplan.models import load_model
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
        # the default (megatron) stack saves the shard, as Korthikanti counts; PyTorch the gathered input
        assert "sp_gathered_inputs" not in terms
        torch_terms = layer_activations(model, replace(recipe, stack="pytorch"), layout, 0).terms
        gathered = 2 * 2 * 2048 * micro_batch * h * (1 - 1 / t)  # q/k/v and MLP inputs, e = 2
        assert torch_terms["sp_gathered_inputs"] == pytest.approx(gathered, rel=1e-12)
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
        model,
        Recipe(method="full", seq_len=512, stack="pytorch"),
        Layout(dp=4, tp=2, zero=3),
        num_microbatches=1,
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
    """At the end of backward a tied embedding/head weight has both gradients and their sum alive
    (PyTorch: .grad is written by the first backward); with a gradient already held (more
    micro-batches, or Megatron-Core's persistent gradient buffer) three copies."""
    model = gpt(12, 768, 12)
    recipe = Recipe(method="full", seq_len=1024, stack="pytorch")
    mem = memory_breakdown(model, recipe, Layout(), num_microbatches=1)
    vh = model.vocab_size * model.hidden_size
    assert mem.tied_grad_bytes == 2 * vh
    states = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
    assert mem.phase_bytes("backward end") == pytest.approx(states + 2 * 2 * vh, rel=1e-12)
    accumulating = memory_breakdown(model, replace(recipe, global_batch=4), Layout(), num_microbatches=4)
    assert accumulating.phase_bytes("backward end") == pytest.approx(states + 3 * 2 * vh, rel=1e-12)
    megatron = memory_breakdown(model, replace(recipe, stack="megatron"), Layout(), num_microbatches=1)
    assert megatron.phase_bytes("backward end") == pytest.approx(states + 3 * 2 * vh, rel=1e-12)


def test_megatron_s_gradient_buffer_lives_through_the_step() -> None:
    """Megatron-Core DDP allocates the gradients once (param_and_grad_buffer.py), Megatron-FSDP
    its sharded buffer once: with one micro-batch they are alive in the forward too, as PyTorch's
    .grad is not."""
    model = gpt(12, 768, 12)
    for zero, live in ((0, True), (1, True), (3, True)):
        lay = Layout(dp=2, zero=zero)
        mega = memory_breakdown(model, Recipe(method="full", seq_len=1024), lay, num_microbatches=1)
        torch_ = memory_breakdown(
            model, Recipe(method="full", seq_len=1024, stack="pytorch"), lay, num_microbatches=1
        )
        assert mega.grads_live_at_backward_start is live and torch_.grads_live_at_backward_start is False
        diff = mega.phase_bytes("forward (loss)") - torch_.phase_bytes("forward (loss)")
        assert diff == pytest.approx(mega.gradients_bytes if live else 0.0, rel=1e-12)


def test_megatron_keeps_its_gradient_buffer_on_the_device_under_optimizer_offload() -> None:
    """--optimizer-cpu-offload moves the optimizer states; the DDP gradient buffer stays."""
    model = gpt(12, 768, 12)
    lay = Layout(dp=2, zero=1)
    for stack, on_device in (("megatron", True), ("pytorch", False)):
        mem = memory_breakdown(model, Recipe(method="full", offload="optimizer", stack=stack), lay)  # type: ignore[arg-type]
        assert (mem.gradients_bytes > 0) is on_device and mem.optimizer_bytes == 0.0


# --- per-op selective checkpointing (recompute="sac") --------------------------------------
def test_sac_keeps_the_block_input_the_odd_matmuls_and_the_attention_output() -> None:
    """Llama block: input h, q (a·d), v (k·d), attention output (a·d) + FP32 log-sum-exp, gate (f),
    down (h): e·b·s·(2h + 2q + g + f) + 4·b·a·s, the bytes the tracer's step keeps (test_trace)."""
    model = ModelSpec(
        name="llama-3-8b-like",
        family="llama",
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        ffn_hidden=14336,
        vocab_size=128256,
    )
    b, s, e = 2, 1024, 2
    h, q, g, f, a = 4096, 4096, 1024, 14336, 32
    la = layer_activations(model, Recipe(seq_len=s, micro_batch=b, recompute="sac"), Layout(), 3)
    assert la.terms == {
        "layer_input": e * b * s * h,
        "sac_matmul_outputs": e * b * s * (q + g + f + h),
        "attn_output_and_lse": e * b * s * q + 4 * b * a * s,
    }
    # fp32: e = 4
    la32 = layer_activations(
        model, Recipe(seq_len=s, micro_batch=b, recompute="sac", precision="fp32"), Layout(), 3
    )
    assert la32.total_bytes == 4 * b * s * (2 * h + 2 * q + g + f) + 4 * b * a * s
    # between full recompute (the input only) and none
    full = layer_activations(model, Recipe(seq_len=s, micro_batch=b, recompute="full"), Layout(), 3)
    none = layer_activations(model, Recipe(seq_len=s, micro_batch=b), Layout(), 3)
    assert full.total_bytes < la.total_bytes < none.total_bytes / 2


def test_sac_keeps_no_projection_output_of_a_biased_block() -> None:
    """Every GPT-2 linear is aten.addmm: only the input and the flash kernel's outputs are kept."""
    a, h, layers, _ = KORTHIKANTI_GPT["22B"]
    model = gpt(a, h, layers)
    b, s = 1, 2048
    la = layer_activations(model, Recipe(seq_len=s, micro_batch=b, recompute="sac"), Layout(), 0)
    assert la.total_bytes == 2 * b * s * h + 2 * b * s * h + 4 * b * a * s
    assert la.terms["sac_matmul_outputs"] == 0


def test_sac_backward_transient_is_the_rebuilt_block_beyond_what_it_keeps() -> None:
    from trainplan.memory import sac_recompute_transient_bytes

    model = replace(llama7b(), vocab_size=1000)  # the recomputed block, not the loss, sets the transient
    r = Recipe(seq_len=4096, micro_batch=2, recompute="sac")
    kept = layer_activations(model, r, Layout(), 0).terms
    none = layer_activations(model, replace(r, recompute="none"), Layout(), 0).total_bytes
    rebuilt = none - kept["sac_matmul_outputs"] - kept["attn_output_and_lse"]
    assert sac_recompute_transient_bytes(model, r, Layout(), 0) == rebuilt
    mem = memory_breakdown(model, r, Layout())
    assert mem.transient_bytes == rebuilt
    # early stop ends the recomputation before the kept down output is consumed: it stays too
    early = replace(r, recompute_early_stop=True)
    assert sac_recompute_transient_bytes(model, early, Layout(), 0) == rebuilt + 2 * 2 * 4096 * 4096
    # full recompute rebuilds the same set and keeps less: sac's backward lies between none and full
    starts = [
        memory_breakdown(model, replace(r, recompute=rc), Layout()).phase_bytes("backward start")
        for rc in ("full", "sac", "none")
    ]
    assert starts[0] < starts[1] < starts[2]


def test_sac_is_refused_where_it_is_not_modelled() -> None:
    from trainplan.errors import LayoutError, RecipeError
    from trainplan.models import load_model

    r = Recipe(seq_len=1024, recompute="sac")
    with pytest.raises(RecipeError, match="MoE"):
        memory_breakdown(load_model("mixtral-8x7b"), r, Layout())
    with pytest.raises(LayoutError) as err:
        memory_breakdown(llama7b(), r, Layout(tp=2))
    assert err.value.field == "tp"
    with pytest.raises(LayoutError) as err:
        memory_breakdown(llama7b(), r, Layout(cp=2))
    assert err.value.field == "cp"
    # pipeline parallelism, ZeRO and FSDP are fine
    memory_breakdown(llama7b(), replace(r, global_batch=8), Layout(pp=2, dp=2, zero=1))
    memory_breakdown(llama7b(), r, Layout(dp=8, zero=3))


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_no_memory_term_is_negative(method: str, recompute: str) -> None:
    """A saving is never a negative part of the sum: the frozen first norm of PEFT is taken out of
    the terms that counted it, every named term stays >= 0."""
    from trainplan import estimate as run_estimate

    e = run_estimate("llama-3.2-1b", hardware="h100-sxm", method=method, recompute=recompute, seq_len=1024)
    assert all(v >= 0 for v in e.memory.activation_terms.values()), e.memory.activation_terms
    assert all(v >= 0 for _, v in e.memory.terms())


def test_megatron_stack_saves_what_transformer_engine_saves() -> None:
    """Megatron-Core's TE modules: the fused norm's output and fc2's input at the saved-input
    bytes (FP8: one quantized copy, 1 + 1/32 B), the SwiGLU's fc1 output in BF16, the local shard
    under SP; eager PyTorch saves gate, act, up and product (4·e·f) and the gathered SP input."""
    from trainplan.memory import MXFP8_SAVED_BYTES_PER_ELEMENT, linear_input_bytes_per_element

    model = load_model("llama-3.1-8b")
    s, h, f = 4096, model.hidden_size, model.ffn_hidden
    base = Recipe(seq_len=s)
    mega = layer_activations(model, base, Layout(), 0).terms
    torch_ = layer_activations(model, replace(base, stack="pytorch"), Layout(), 0).terms
    assert mega["mlp_intermediate"] == 3 * 2 * s * f and torch_["mlp_intermediate"] == 4 * 2 * s * f
    fp8 = layer_activations(model, replace(base, precision="fp8"), Layout(), 0).terms
    lin = MXFP8_SAVED_BYTES_PER_ELEMENT
    assert linear_input_bytes_per_element(replace(base, precision="fp8")) == lin
    assert fp8["qkv_input"] == lin * s * h and fp8["mlp_input"] == lin * s * h
    assert fp8["mlp_intermediate"] == 2 * 2 * s * f + lin * s * f
    assert fp8["attn_norm_input"] == mega["attn_norm_input"] == 2 * s * h  # the norm input stays BF16
    assert fp8["q_k_v"] == mega["q_k_v"]  # attention's own saved tensors stay BF16
    # the pytorch stack's FP8 (torchao float8) keeps 16-bit saved inputs
    assert (
        layer_activations(model, replace(base, precision="fp8", stack="pytorch"), Layout(), 0).terms == torch_
    )


def test_megatron_moe_experts_save_no_outputs() -> None:
    moe = load_model("mixtral-8x7b")
    r = Recipe(seq_len=4096)
    mega = layer_activations(moe, r, Layout(), 0).terms
    torch_ = layer_activations(moe, replace(r, stack="pytorch"), Layout(), 0).terms
    assert "expert_outputs" not in mega and "expert_weighted_outputs" not in mega
    assert {"expert_outputs", "expert_weighted_outputs"} <= set(torch_)
    assert mega["routing_indices"] == 8.0 * 4096 * 2
    assert mega["mlp_input"] == torch_["mlp_input"]  # the router's BF16 input
    assert sum(mega.values()) < sum(torch_.values())


def test_kbit_upcast_is_the_pytorch_stacks_path() -> None:
    from trainplan.errors import RecipeError
    from trainplan.recipe import LoRASpec

    with pytest.raises(RecipeError, match="stack pytorch"):
        Recipe(method="qlora", lora=LoRASpec(), kbit_fp32_upcast=True, recompute="full")
