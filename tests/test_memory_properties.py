"""Invariants of the memory model, over randomly drawn models, recipes and layouts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainplan.layout import Layout
from trainplan.memory import memory_breakdown
from trainplan.models.spec import ModelSpec, MoESpec
from trainplan.recipe import Recipe


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    hidden = heads * head_dim
    moe = None
    if draw(st.booleans()):
        moe = MoESpec(num_experts=8, top_k=draw(st.sampled_from([1, 2])), expert_ffn_hidden=2 * hidden)
    return ModelSpec(
        name="m",
        family="llama",
        num_layers=draw(st.integers(2, 16)),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden=draw(st.sampled_from([2, 3, 4])) * hidden,
        vocab_size=draw(st.sampled_from([1000, 32000])),
        activation=draw(st.sampled_from(["swiglu", "gelu"])),
        tied_embeddings=draw(st.booleans()),
        moe=moe,
    )


recipes = st.builds(
    Recipe,
    method=st.sampled_from(["pretrain", "full", "lora", "qlora"]),
    precision=st.sampled_from(["fp32", "bf16", "fp8"]),
    optimizer=st.sampled_from(["adamw", "adamw-8bit", "sgd", "sgd-momentum", "lion", "adafactor"]),
    seq_len=st.sampled_from([256, 512, 1024, 4096]),
    micro_batch=st.integers(1, 8),
    recompute=st.sampled_from(["none", "selective", "full"]),
    attention=st.sampled_from(["flash", "eager"]),
)


def layout_for(model: ModelSpec, draw_tp: int) -> Layout:
    tp = draw_tp if model.num_kv_heads % draw_tp == 0 else 1
    # Megatron-Core trains MoE with tensor parallelism under sequence parallelism only
    return Layout(tp=tp, sequence_parallel=tp > 1 and model.moe is not None)


@settings(max_examples=80, deadline=None)
@given(models(), recipes, st.sampled_from([1, 2]))
def test_memory_never_decreases_with_micro_batch_or_sequence(
    model: ModelSpec, recipe: Recipe, tp: int
) -> None:
    layout = layout_for(model, tp)
    base = memory_breakdown(model, recipe, layout).per_device_bytes
    bigger_b = memory_breakdown(
        model, replace(recipe, micro_batch=recipe.micro_batch + 1), layout
    ).per_device_bytes
    bigger_s = memory_breakdown(model, replace(recipe, seq_len=recipe.seq_len * 2), layout).per_device_bytes
    assert bigger_b >= base
    assert bigger_s >= base


@settings(max_examples=80, deadline=None)
@given(models(), recipes, st.sampled_from([1, 2, 8, 64]))
def test_zero_stages_are_ordered(model: ModelSpec, recipe: Recipe, dp: int) -> None:
    states = [memory_breakdown(model, recipe, Layout(dp=dp, zero=z)).model_states_bytes for z in (0, 1, 2, 3)]
    assert states[3] <= states[2] <= states[1] <= states[0]


@settings(max_examples=80, deadline=None)
@given(models(), recipes, st.integers(1, 3), st.sampled_from([1, 2, 3]))
def test_more_dp_never_increases_model_states(
    model: ModelSpec, recipe: Recipe, zero: int, dp_exp: int
) -> None:
    dp = 2**dp_exp
    small = memory_breakdown(model, recipe, Layout(dp=dp, zero=zero)).model_states_bytes
    large = memory_breakdown(model, recipe, Layout(dp=2 * dp, zero=zero)).model_states_bytes
    assert large <= small


@settings(max_examples=80, deadline=None)
@given(models(), recipes)
def test_lora_never_exceeds_full_finetuning(model: ModelSpec, recipe: Recipe) -> None:
    # Adapters are r·(in + out) per matrix: smaller than the matrix only while r is small against its
    # sides (r = 16 here); at hidden < 8r a "low-rank" adapter can outweigh the model itself.
    assume(model.hidden_size >= 8 * 16)
    # With a stateless optimizer (plain SGD) and no accumulation, full fine-tuning's gradients never
    # coexist with the activations, and LoRA's extra adapter weights can make it (slightly) larger.
    assume(recipe.optimizer in ("adamw", "adamw-8bit", "lion", "sgd-momentum"))
    full = memory_breakdown(model, replace(recipe, method="full", lora=None), Layout()).per_device_bytes
    lora = memory_breakdown(model, replace(recipe, method="lora", lora=None), Layout()).per_device_bytes
    qlora = memory_breakdown(model, replace(recipe, method="qlora", lora=None), Layout()).per_device_bytes
    assert qlora <= lora <= full
