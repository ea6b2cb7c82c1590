"""The working set inside one block's backward under ZeRO-3 (memory.block_backward_bytes)."""

from __future__ import annotations

import pytest

from trainplan.layout import Layout
from trainplan.memory import block_backward_bytes, layer_activations, memory_breakdown
from trainplan.models import load_model
from trainplan.recipe import Recipe


def test_llama2_70b_full_recompute_terms() -> None:
    model = load_model("llama-2-70b")
    recipe = Recipe(seq_len=4096, recompute="full", stack="pytorch")  # FSDP2 on PyTorch modules, traced
    layout = Layout(dp=64, zero=3)
    h, f, bs = model.hidden_size, model.ffn_hidden, 4096
    rebuilt = (
        layer_activations(model, Recipe(seq_len=4096, stack="pytorch"), layout, 0).total_bytes - 2 * bs * h
    )
    expected = rebuilt + 2 * f * h + 2 * 2 * bs * f  # dW_down + dX_down and the two SwiGLU products
    assert block_backward_bytes(model, recipe, layout, 0) == pytest.approx(expected, rel=1e-12)
    mem = memory_breakdown(model, recipe, layout, num_microbatches=1)
    assert mem.peak_phase == "backward (in a block)"
    assert mem.peak_bytes / 2**30 == pytest.approx(27.0159, abs=1e-3)  # the traced peak, 80 layers


def test_zero_outside_dense_full_training() -> None:
    lay = Layout(dp=8, zero=3)
    assert block_backward_bytes(load_model("llama-3-8b"), Recipe(method="lora"), lay, 0) == 0.0
    moe = load_model("mixtral-8x7b")
    assert block_backward_bytes(moe, Recipe(), lay, 0) == 0.0
    # without ZeRO-3 the moment does not exist
    assert memory_breakdown(load_model("llama-3-8b"), Recipe(), Layout()).fsdp_block_backward_bytes == 0.0
