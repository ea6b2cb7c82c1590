"""Hugging Face Transformers + PEFT QLoRA memory terms, and the Unsloth README context rows."""

from __future__ import annotations

import pytest

from trainplan.errors import RecipeError, TrainplanError
from trainplan.inputs import COMMANDS, build_recipe, fill_defaults
from trainplan.layout import Layout
from trainplan.memory import layer_activations, logits_bytes, loss_forward_bytes, memory_breakdown
from trainplan.models import load_model
from trainplan.recipe import LoRASpec, Recipe
from trainplan.sharding import device_params
from trainplan.validate.hf_context import comparisons, hf_qlora_recipe, validate_hf_context

M8 = load_model("llama-3.1-8b")


def _values() -> dict[str, object]:
    return fill_defaults({"model": "llama-3.1-8b", "hardware": "a100-80gb"}, COMMANDS["estimate"])


def _qlora(**kw: object) -> Recipe:
    base: dict[str, object] = {
        "method": "qlora",
        "seq_len": 2048,
        "recompute": "full",
        "lora": LoRASpec(rank=32),
        "stack": "pytorch",  # the Hugging Face Trainer runs PyTorch modules
    }
    base.update(kw)
    return Recipe(**base)  # type: ignore[arg-type]


def test_upcast_makes_the_unquantized_parameters_fp32() -> None:
    dev = device_params(M8, Layout(), 0, LoRASpec(rank=32))
    off = memory_breakdown(M8, _qlora(), Layout())
    on = memory_breakdown(M8, _qlora(kbit_fp32_upcast=True), Layout())
    assert on.weights_bytes - off.weights_bytes == pytest.approx(2.0 * dev.dense_other)


def test_upcast_makes_the_residual_stream_fp32() -> None:
    s, h = 2048, M8.hidden_size
    full = layer_activations(M8, _qlora(kbit_fp32_upcast=True), Layout(), 0).terms
    assert full == {"layer_input": 4.0 * s * h}
    none = layer_activations(M8, _qlora(recompute="none", kbit_fp32_upcast=True), Layout(), 0).terms
    plain = layer_activations(M8, _qlora(recompute="none"), Layout(), 0).terms
    for k in ("attn_norm_input", "qkv_input", "mlp_norm_input", "mlp_input"):
        assert none[k] == 2 * plain[k]
    assert none["mlp_intermediate"] == 2 * plain["mlp_intermediate"]
    assert none["q_k_v"] == plain["q_k_v"]


def test_shift_copy_loss_forward_is_the_peak() -> None:
    s, v = 8192, M8.vocab_size
    r = _qlora(seq_len=s, logits_shift_copy=True)
    assert loss_forward_bytes(M8, r, Layout()) == pytest.approx(10.0 * s * v)
    assert logits_bytes(M8, r, Layout())[1] == pytest.approx(8.0 * s * v)
    mem = memory_breakdown(M8, r, Layout())
    assert mem.peak_phase == "forward (loss)"
    plain = memory_breakdown(M8, _qlora(seq_len=s), Layout())
    assert plain.peak_phase == "backward start"
    assert mem.peak_bytes - plain.peak_bytes == pytest.approx(2.0 * s * v)


def test_refusals() -> None:
    with pytest.raises(RecipeError, match="kbit"):
        Recipe(method="lora", lora=LoRASpec(), kbit_fp32_upcast=True)
    with pytest.raises(RecipeError, match="logits_shift_copy"):
        Recipe(logits_shift_copy=True, loss_chunks=8)
    values = _values()
    with pytest.raises(TrainplanError, match="kbit"):
        build_recipe(values | {"method": "lora", "kbit_fp32_upcast": True})


def test_engine_sets_the_upcast_for_qlora_only() -> None:
    values = _values()
    assert build_recipe(values | {"engine": "hf-trainer", "method": "qlora"}).kbit_fp32_upcast
    assert not build_recipe(values | {"engine": "hf-trainer", "method": "lora"}).kbit_fp32_upcast
    assert not build_recipe(values | {"engine": "torchtune", "method": "qlora"}).kbit_fp32_upcast
    assert not build_recipe(
        values | {"engine": "hf-trainer", "method": "qlora", "kbit_fp32_upcast": False}
    ).kbit_fp32_upcast


def test_context_rows_closer_with_the_hf_terms() -> None:
    cs = [c for c in comparisons() if not c.oom]
    assert cs
    for c in cs:
        after, before = c.error(c.predicted), c.error(c.before)
        assert after is not None and before is not None
        assert abs(after) < abs(before), c.row.name
        assert abs(after) < 0.15, c.row.name
    res = validate_hf_context()
    assert res.passed and res.scored


def test_oom_rows_do_not_fit() -> None:
    ooms = [c for c in comparisons() if c.oom]
    assert len(ooms) == 2
    assert all(c.predicted == 0 for c in ooms)


def test_recipe_is_the_trainer_run() -> None:
    r = hf_qlora_recipe(4096)
    assert r.kbit_fp32_upcast and r.logits_shift_copy and r.recompute == "full" and r.attention == "flash"


def test_hf_eager_softmax_keeps_fp32_scores_and_a_copy() -> None:
    s, a = 2048, M8.num_heads
    eager = _qlora(recompute="none", attention="eager")
    hf = _qlora(recompute="none", attention="eager", softmax_fp32=True)
    plain = layer_activations(M8, eager, Layout(), 1).terms["attn_scores"]
    assert plain == pytest.approx(2.0 * a * s * s)
    assert layer_activations(M8, hf, Layout(), 1).terms["attn_scores"] == pytest.approx(6.0 * a * s * s)
    with pytest.raises(RecipeError, match="softmax_fp32"):
        _qlora(softmax_fp32=True)  # flash keeps no scores
    values = _values()
    assert build_recipe(values | {"engine": "hf-trainer", "attention": "eager"}).softmax_fp32
    assert not build_recipe(values | {"engine": "hf-trainer"}).softmax_fp32  # flash
    assert not build_recipe(values | {"engine": "torchtitan", "attention": "eager"}).softmax_fp32
