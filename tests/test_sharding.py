"""Per-device parameter counts, summed over ranks, give back the exact totals."""

from __future__ import annotations

import pytest

from trainplan.layout import Layout
from trainplan.models import list_presets, load_model
from trainplan.models.params import count_params
from trainplan.sharding import device_params, stage_layers

PRESETS = [m.name for m in list_presets()]


@pytest.mark.parametrize("name", PRESETS)
def test_single_device_holds_the_whole_model(name: str) -> None:
    model = load_model(name)
    assert device_params(model, Layout(), 0).total == count_params(model).total


@pytest.mark.parametrize("name", PRESETS)
def test_pipeline_stages_partition_the_layers(name: str) -> None:
    model = load_model(name)
    pp = min(4, model.num_layers)
    layout = Layout(pp=pp)
    layers = [i for st in range(pp) for i in stage_layers(model, Layout(pp=pp), st)]
    assert layers == list(range(model.num_layers))
    total = sum(device_params(model, layout, st).total for st in range(pp))
    tied_copy = model.vocab_size * model.embed_width if model.tied_embeddings else 0
    assert total - tied_copy == count_params(model).total


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-3.1-70b", "mixtral-8x7b", "gpt3-175b", "qwen2.5-7b"])
def test_tensor_parallel_shards_sum_to_the_linears(name: str) -> None:
    model = load_model(name)
    tp = 4 if model.num_kv_heads % 4 == 0 else 2
    full = device_params(model, Layout(), 0)
    shard = device_params(model, Layout(tp=tp), 0)
    assert shard.dense_linear * tp == full.dense_linear
    assert shard.expert_linear * tp == full.expert_linear


def test_expert_parallel_divides_routed_experts() -> None:
    model = load_model("mixtral-8x7b")
    full = device_params(model, Layout(dp=8), 0)
    ep8 = device_params(model, Layout(dp=8, ep=8), 0)
    assert ep8.expert_linear * 8 == full.expert_linear
    assert ep8.dense == full.dense


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    """Llama-3.1-70B has 8 kv heads; at tp=16 every rank keeps one whole kv head (d = 128)."""
    model = load_model("llama-3.1-70b")
    dev = device_params(model, Layout(tp=16), 0)
    k = next(lin for lin, _ in dev.linears if lin.name == "k")
    assert k.local_weight_params == model.hidden_size * model.head_dim


def test_input_embedding_is_its_own_parameter_unless_tied_on_one_stage() -> None:
    llama, gpt = load_model("llama-3-8b"), load_model("gpt2")
    v_local = -(-llama.vocab_size // 4) * llama.hidden_size
    assert device_params(llama, Layout(tp=4), 0).input_embedding_params == v_local
    assert device_params(llama, Layout(tp=4, pp=2), 1).input_embedding_params == 0
    # tied: the same tensor as the LM head on one stage; its own copy on stage 0 when pp > 1
    assert device_params(gpt, Layout(), 0).input_embedding_params == 0
    assert device_params(gpt, Layout(pp=2), 0).input_embedding_params == gpt.vocab_size * gpt.hidden_size
