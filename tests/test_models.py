"""Model presets, Hugging Face import and exact parameter counts.

Published counts are ``sum(p.numel() for p in model.parameters())`` of the Hugging Face model
(the figure PEFT prints as "all params", GGUF stores as ``general.parameter_count``, the Hub shows
as ``safetensors.total`` when the checkpoint stores no extra buffers). Where each came from is
noted per row.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainplan.errors import ModelError
from trainplan.models import (
    ModelSpec,
    MoESpec,
    count_params,
    from_hf_config,
    get_preset,
    layer_params,
    linear_shapes,
    list_presets,
    load_hf_config,
    load_model,
    lora_params,
    preset_names,
)
from trainplan.models.params import norm_params

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"
DOCS = Path(__file__).parent.parent / "docs" / "models.md"

# name -> (total, source of the published figure)
PUBLISHED_TOTAL: dict[str, tuple[int, str]] = {
    # HF model card "6.74B"; PEFT "all params: 6738415616" and GGUF general.parameter_count. The Hub's
    # safetensors.total (6,738,417,664) adds the 32 x 64 rotary inv_freq values stored in the checkpoint.
    "llama-2-7b": (6_738_415_616, "GGUF general.parameter_count of Llama-2-7B conversions"),
    "llama-2-13b": (13_015_864_320, "model.num_parameters() of meta-llama/Llama-2-13b-hf"),
    "llama-2-70b": (68_976_648_192, "num_parameters() of meta-llama/Llama-2-70b-hf (Together catalog)"),
    "llama-3-8b": (8_030_261_248, "same shapes as Llama-3.1-8B"),
    "llama-3-70b": (70_553_706_496, "same shapes as Llama-3.1-70B"),
    "llama-3.1-8b": (8_030_261_248, "Hub API safetensors.total of meta-llama/Llama-3.1-8B"),
    "llama-3.1-70b": (70_553_706_496, "Hub API safetensors.total of meta-llama/Llama-3.1-70B"),
    "llama-3.1-405b": (405_853_388_800, "Hub API safetensors.total of meta-llama/Llama-3.1-405B"),
    "llama-3.2-1b": (1_235_814_400, "Hub API safetensors.total of meta-llama/Llama-3.2-1B(-Instruct)"),
    "llama-3.2-3b": (3_212_749_824, "Hub safetensors.parameters.BF16 of meta-llama/Llama-3.2-3B-Instruct"),
    "gpt2": (124_439_808, "GPT2LMHeadModel num_parameters() (1024 learned positions, tied)"),
    "mistral-7b": (7_241_732_096, "GGUF general.parameter_count of Mistral-7B-v0.1"),
    "mistral-7b-v0.2": (
        7_241_732_096,
        "Mistral-7B-v0.1's dimensions without the window (Mistral-7B-Instruct-v0.2)",
    ),
    "mixtral-8x7b": (46_702_792_704, "Hub API safetensors.total of mistralai/Mixtral-8x7B-Instruct-v0.1"),
    # vocab 32000 (mistral-community conversion); mistralai/Mixtral-8x22B-Instruct-v0.1 has vocab 32768.
    "mixtral-8x22b": (140_620_634_112, "Hub safetensors.total of mistral-community/Mixtral-8x22B-v0.1"),
    "qwen2.5-7b": (7_615_616_512, "Hub safetensors.total of Qwen/Qwen2.5-7B-Instruct"),
    "qwen2.5-72b": (72_706_203_648, "Hub safetensors.total of Qwen/Qwen2.5-72B-Instruct"),
    "qwen1.5-moe-a2.7b": (14_315_784_192, "Hub safetensors.total of Qwen/Qwen1.5-MoE-A2.7B"),
    "qwen3-30b-a3b": (30_532_122_624, "GGUF general.parameter_count of Qwen3-30B-A3B"),
    "qwen3-235b-a22b": (235_093_634_560, "Hub API safetensors.total of Qwen/Qwen3-235B-A22B"),
    "gemma-2-9b": (9_241_705_984, "Hub API safetensors.total of google/gemma-2-9b"),
    "gemma-3-1b": (999_885_952, "Hub API safetensors.total of google/gemma-3-1b-it (text-only checkpoint)"),
    "gpt-oss-20b": (
        20_914_757_184,
        "GGUF general.parameter_count of openai/gpt-oss-20b (ollama gpt-oss:20b)",
    ),
    "gpt-oss-120b": (116_829_156_672, "parameter count of openai/gpt-oss-120b; model card: 116.83B total"),
    "phi-3-mini": (3_821_079_552, "Hub safetensors.total of microsoft/Phi-3-mini-4k-instruct"),
    "olmo-2-7b": (7_298_617_344, "Hub API safetensors.total of allenai/OLMo-2-1124-7B"),
    # Biderman et al. 2023 Table 1: 85,056,000 non-embedding + 2 x 50304 x 768 untied embeddings.
    "pythia-160m": (162_322_944, "Pythia paper Table 1 non-embedding count + embeddings"),
}

# Active parameters per token (routed experts counted top_k/num_experts).
PUBLISHED_ACTIVE: dict[str, tuple[int, float]] = {
    "mixtral-8x7b": (12_879_925_248, 12.9e9),  # Mistral AI: "12.9B active parameters"
    "mixtral-8x22b": (39_152_031_744, 39e9),  # Mistral AI: "39B active parameters"
    "qwen1.5-moe-a2.7b": (2_689_173_504, 2.7e9),  # model card: "2.7B activated parameters"
    "qwen3-30b-a3b": (3_353_032_704, 3.3e9),  # model card: "30.5B total, 3.3B activated"
    "qwen3-235b-a22b": (22_190_763_520, 22e9),  # model card: "235B total, 22B activated"
}


# Hub safetensors.total of google/gemma-3-{4b,12b,27b}-it: the text decoder, the SigLIP vision tower
# and the projector (a vision-width x h matrix; Gemma3MultiModalProjector). What is left after the
# presets' text decoders and the projector matrix must be one and the same tower for all three sizes.
GEMMA3_MULTIMODAL_TOTAL = {
    "gemma-3-4b": 4_300_079_472,
    "gemma-3-12b": 12_187_325_040,
    "gemma-3-27b": 27_432_406_640,
}
SIGLIP_WIDTH = 1152  # vision_config.hidden_size of the Gemma 3 checkpoints


def test_gemma3_text_decoders_leave_one_vision_tower() -> None:
    towers = {
        name: total - count_params(get_preset(name)).total - SIGLIP_WIDTH * get_preset(name).hidden_size
        for name, total in GEMMA3_MULTIMODAL_TOTAL.items()
    }
    assert len(set(towers.values())) == 1, towers
    # SigLIP-So400m at 896 px (27 layers, width 1152, MLP 4304, 4096 patch positions): about 0.417B
    assert abs(next(iter(towers.values())) - 416.87e6) < 0.01e9


def test_gpt_oss_active_parameters_match_the_model_card() -> None:
    """gpt-oss model card Table 1: 3.61B active (20b) and 5.13B (120b), counting the unembedding
    but not the embedding (ParamCounts.active counts both)."""
    for name, card in (("gpt-oss-20b", 3.61e9), ("gpt-oss-120b", 5.13e9)):
        c = count_params(get_preset(name))
        assert abs((c.active - c.embedding) - card) / card < 0.002


def test_gpt_oss_sinks_and_windows() -> None:
    spec = get_preset("gpt-oss-20b")
    no_sinks = dataclasses.replace(spec, attention_sinks=False)
    assert count_params(spec).total - count_params(no_sinks).total == 24 * 64
    assert [spec.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    gemma = get_preset("gemma-3-27b")
    assert [i for i in range(62) if not gemma.is_local_layer(i)] == list(range(5, 62, 6))


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_published_total(name: str) -> None:
    assert count_params(get_preset(name)).total == PUBLISHED_TOTAL[name][0]


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_published_active(name: str) -> None:
    exact, rounded = PUBLISHED_ACTIVE[name]
    active = count_params(get_preset(name)).active
    assert active == exact
    assert abs(active - rounded) / rounded < 0.02


def test_dense_active_equals_total() -> None:
    counts = count_params(get_preset("llama-3.1-8b"))
    assert counts.active == counts.total
    assert counts.moe_experts == counts.moe_router == counts.moe_shared_experts == 0


def test_gpt2_terms() -> None:
    c = count_params(get_preset("gpt2"))
    assert c.embedding == 50257 * 768
    assert c.position_embedding == 1024 * 768
    assert c.lm_head == 0  # tied
    assert c.final_norm == 2 * 768  # LayerNorm weight + bias
    assert c.attention == 12 * (768 * 2304 + 2304 + 768 * 768 + 768)  # c_attn + c_proj
    assert c.mlp_dense == 12 * (768 * 3072 + 3072 + 3072 * 768 + 768)  # c_fc + c_proj
    assert c.attention_norms == c.mlp_norms == 12 * 2 * 768
    assert c.per_layer_dense() == 7_087_872
    assert c.non_embedding == 85_056_000


def test_gemma2_post_norms_double_the_norms() -> None:
    c = count_params(get_preset("gemma-2-9b"))
    assert c.attention_norms == c.mlp_norms == 42 * 2 * 3584
    assert c.lm_head == 0


def test_qk_norm_widths() -> None:
    qwen3 = get_preset("qwen3-30b-a3b")
    olmo = get_preset("olmo-2-7b")
    no_qk = dataclasses.replace(olmo, qk_norm=False, qk_norm_full_width=False)
    assert count_params(qwen3).attention == 48 * (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128)
    assert count_params(olmo).attention - count_params(no_qk).attention == 32 * (4096 + 4096)


def test_mixtral_terms() -> None:
    c = count_params(get_preset("mixtral-8x7b"))
    assert c.moe_router == 32 * 4096 * 8
    assert c.moe_experts == 32 * 8 * 3 * 4096 * 14336
    assert c.moe_experts_active == c.moe_experts // 4
    assert c.mlp_dense == 0
    assert c.per_layer_moe() == 1_451_270_144
    with pytest.raises(ModelError, match="no dense layers"):
        c.per_layer_dense()


def test_qwen2_moe_shared_expert_and_gate() -> None:
    c = count_params(get_preset("qwen1.5-moe-a2.7b"))
    assert c.moe_shared_experts == 24 * (3 * 2048 * 5632 + 2048)  # shared_expert + shared_expert_gate
    assert c.attention == 24 * (4 * 2048 * 2048 + 3 * 2048)  # q, k, v biases; o without


def test_moe_layer_pattern() -> None:
    base = get_preset("mixtral-8x7b")
    assert base.moe is not None
    moe = dataclasses.replace(base.moe, first_dense_layers=1, layer_freq=2)
    spec = dataclasses.replace(base, moe=moe)
    c = count_params(spec)
    assert (c.num_dense_layers, c.num_moe_layers) == (16, 16)  # layers 1, 3, ..., 31 are MoE
    assert c.total == sum(layer_params(spec, i) for i in range(32)) + c.embedding + c.lm_head + c.final_norm
    assert layer_params(spec, 0) == c.per_layer_dense()
    assert layer_params(spec, 1) == c.per_layer_moe()


# Narayanan et al. 2021, Eq. 2 (also Korthikanti et al. 2022): P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)).
MEGATRON = {"gpt-22b": 22e9, "gpt-175b-megatron": 175e9, "gpt-530b": 530e9, "gpt-1t": 1e12}


@pytest.mark.parametrize("name", sorted(MEGATRON))
def test_megatron_eq2(name: str) -> None:
    spec = get_preset(name)
    c = count_params(spec)
    L, h, V, s = spec.num_layers, spec.hidden_size, spec.vocab_size, spec.max_seq_len
    eq2 = 12 * L * h * h + 13 * L * h + (V + s) * h  # Eq. 2 multiplied out, exact in integers
    assert c.total - c.final_norm == eq2  # Eq. 2 leaves out the final LayerNorm (2h)
    assert abs(c.total - MEGATRON[name]) / MEGATRON[name] < 0.01


def test_gpt3_175b() -> None:
    c = count_params(get_preset("gpt3-175b"))
    assert c.total == 174_604_259_328  # Brown et al. 2020 Table 2.1 "175.0B"
    assert abs(c.total - 175.0e9) / 175.0e9 < 0.003


# ----------------------------------------------------------------------------- linear shapes / LoRA
def test_linear_shapes_llama() -> None:
    spec = get_preset("llama-2-70b")
    shapes = linear_shapes(spec, 0)
    assert [s.module for s in shapes] == ["q", "k", "v", "o", "gate", "up", "down"]
    assert shapes[1] == ("k", 8192, 1024)
    assert shapes[6] == ("down", 28672, 8192)


def test_linear_shapes_moe_and_lora() -> None:
    spec = get_preset("mixtral-8x7b")
    shapes = linear_shapes(spec, 5)
    names = [s.module for s in shapes]
    assert names.count("expert.gate") == 8 and "router" in names and "gate" not in names
    # Attention-only LoRA, r=8: 32 layers x 8 x (4096+4096 + 4096+1024 + 4096+1024 + 4096+4096).
    assert lora_params(spec, rank=8, targets=("q", "k", "v", "o")) == 32 * 8 * 26624
    experts = lora_params(spec, rank=16, targets=("expert.gate", "expert.up", "expert.down"))
    assert experts == 32 * 8 * 16 * 3 * (4096 + 14336)
    with pytest.raises(ModelError) as err:
        lora_params(spec, rank=8, targets=("gate",))
    assert err.value.field == "lora_targets"
    with pytest.raises(ModelError) as err:
        lora_params(spec, rank=8, targets=("qkv",))
    assert err.value.field == "lora_targets"


def test_llama_7b_lora_qv() -> None:
    # PEFT on Llama-7B, r=16, q_proj+v_proj: "trainable params: 8,388,608" (32 x 2 x 16 x 8192).
    assert lora_params(get_preset("llama-2-7b"), rank=16, targets=("q", "v")) == 8_388_608


def test_linear_shapes_bad_layer() -> None:
    with pytest.raises(ModelError) as err:
        linear_shapes(get_preset("gpt2"), 12)
    assert err.value.field == "layer"


@st.composite
def specs(draw: st.DrawFn) -> ModelSpec:
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 16))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.integers(1, 6))
        moe = MoESpec(
            num_experts=experts,
            top_k=draw(st.integers(1, experts)),
            expert_ffn_hidden=draw(st.integers(1, 32)),
            num_shared_experts=draw(st.integers(0, 2)),
            shared_expert_gate=draw(st.booleans()),
            first_dense_layers=draw(st.integers(0, 2)),
            layer_freq=draw(st.integers(1, 3)),
            router_bias=draw(st.booleans()),
        )
    qk_norm = draw(st.booleans())
    return ModelSpec(
        name="random",
        family="test",
        num_layers=draw(st.integers(2, 6)),
        hidden_size=draw(st.integers(1, 64)),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden=draw(st.integers(1, 64)),
        vocab_size=draw(st.integers(1, 100)),
        activation=draw(st.sampled_from(["gelu", "swiglu", "geglu", "relu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["rope", "learned"])),
        tied_embeddings=draw(st.booleans()),
        max_seq_len=draw(st.integers(1, 64)),
        qkv_bias=draw(st.booleans()),
        attn_out_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
        qk_norm=qk_norm,
        qk_norm_full_width=qk_norm and draw(st.booleans()),
        post_norms=draw(st.booleans()),
        moe=moe,
    )


@settings(max_examples=60, deadline=None)
@given(specs())
def test_counts_are_consistent(spec: ModelSpec) -> None:
    c = count_params(spec)
    layers = [layer_params(spec, i) for i in range(spec.num_layers)]
    assert c.total == sum(layers) + c.embedding + c.position_embedding + c.lm_head + c.final_norm
    assert c.active <= c.total
    for i in range(spec.num_layers):
        # Linear weights are the layer minus biases and norms.
        weights = sum(s.in_features * s.out_features for s in linear_shapes(spec, i))
        h, q, kv = spec.hidden_size, spec.q_dim, spec.kv_dim
        norms = (4 if spec.post_norms else 2) * norm_params(spec.norm, h)
        if spec.qk_norm:
            norms += (
                norm_params(spec.norm, q) + norm_params(spec.norm, kv)
                if spec.qk_norm_full_width
                else 2 * norm_params(spec.norm, spec.head_dim)
            )
        bias = (q + 2 * kv if spec.qkv_bias else 0) + (h if spec.attn_out_bias else 0)
        n_in = 2 if spec.gated else 1
        if spec.is_moe_layer(i):
            assert spec.moe is not None
            m = spec.moe
            widths = [m.expert_ffn_hidden] * m.num_experts + [m.shared_width] * m.num_shared_experts
            bias += m.num_experts if m.router_bias else 0
        else:
            widths = [spec.ffn_hidden]
        if spec.mlp_bias:
            bias += sum(n_in * w + h for w in widths)
        assert layers[i] == weights + norms + bias


# ----------------------------------------------------------------------------- presets
def test_presets_have_sources_and_lowercase_names() -> None:
    presets = list_presets()
    assert len(presets) >= 25
    for spec in presets:
        assert spec.name == spec.name.lower() and " " not in spec.name
        assert spec.source.startswith("https://"), spec.name


def test_required_presets_exist() -> None:
    required = {
        "gpt2", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
        "llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b",
        "qwen2.5-72b", "gemma-2-9b", "gpt3-175b", "qwen3-30b-a3b", "gpt-22b", "gpt-175b-megatron", "gpt-530b",
        "gpt-1t", "llama-3-8b", "llama-3-70b",
    }  # fmt: skip
    assert required <= set(preset_names())


def test_load_model_case_insensitive_and_cached() -> None:
    assert load_model("Llama-2-7B") is load_model("llama-2-7b")


def test_unknown_preset_suggests() -> None:
    with pytest.raises(ModelError) as err:
        load_model("lama-2-7b")
    assert err.value.field == "model"
    assert "unknown model 'lama-2-7b'; did you mean llama-2-7b?" in str(err.value)
    assert "`trainplan models`" in str(err.value)


# ----------------------------------------------------------------------------- Hugging Face import
CONFIG_FILES = sorted(HF_CONFIGS.glob("*.json"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.stem for p in CONFIG_FILES])
def test_hf_config_matches_preset(path: Path) -> None:
    preset = get_preset(path.stem)
    spec = load_model(str(path))
    assert count_params(spec) == count_params(preset)
    same = dataclasses.replace(spec, name=preset.name, source=preset.source, notes=preset.notes)
    assert same == preset


def _cfg(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    return data


def _field(cfg: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(ModelError) as err:
        from_hf_config(cfg, "x", **kw)
    return err.value.field


def test_hf_unknown_model_type() -> None:
    cfg = _cfg("llama-2-7b") | {"model_type": "mamba2"}
    with pytest.raises(ModelError) as err:
        from_hf_config(cfg, "x")
    assert err.value.field == "model_type"
    assert "supported: llama" in str(err.value)
    del cfg["model_type"]
    assert _field(cfg) == "model_type"


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ("llama-2-7b", "hidden_size"),
        ("llama-2-7b", "vocab_size"),
        ("mistral-7b", "num_key_value_heads"),  # MistralConfig default is the literal 8: required
        ("gemma-2-9b", "head_dim"),  # Gemma2Config default is the literal 256: required
        ("gpt2", "n_positions"),  # sizes the learned position table
        ("mixtral-8x7b", "num_local_experts"),
        ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size"),
        ("qwen3-30b-a3b", "moe_intermediate_size"),
    ],
)
def test_hf_missing_required_field(config: str, key: str) -> None:
    cfg = _cfg(config)
    del cfg[key]
    with pytest.raises(ModelError) as err:
        from_hf_config(cfg, "x")
    assert err.value.field == key
    assert f"missing '{key}'" in str(err.value)


def test_hf_defaults_follow_transformers() -> None:
    cfg = _cfg("llama-2-7b")
    del cfg["num_key_value_heads"]  # LlamaConfig: None -> num_attention_heads
    del cfg["tie_word_embeddings"]  # LlamaConfig default False
    spec = from_hf_config(cfg, "x")
    assert spec.num_kv_heads == 32 and spec.head_dim == 128 and not spec.tied_embeddings
    gpt2 = _cfg("gpt2")
    gpt2["n_inner"] = None  # GPT2Config: None -> 4 * n_embd
    assert from_hf_config(gpt2, "x").ffn_hidden == 3072
    assert from_hf_config(gpt2, "x").tied_embeddings  # PretrainedConfig default True
    mistral = _cfg("mistral-7b") | {"num_key_value_heads": None}  # null -> heads (MistralConfig)
    assert from_hf_config(mistral, "x").num_kv_heads == 32


def test_hf_unknown_and_unmodelled_keys() -> None:
    cfg = _cfg("llama-3.1-8b") | {"frobnicate": 3}
    assert _field(cfg) == "frobnicate"
    spec = from_hf_config(cfg, "x", strict=False)
    assert any("frobnicate" in n for n in spec.notes)
    moe_on_dense = _cfg("llama-3.1-8b") | {"num_experts_per_tok": 2}
    assert _field(moe_on_dense) == "num_experts_per_tok"
    assert _field(moe_on_dense, strict=False) == "num_experts_per_tok"  # never silently ignored
    mla = _cfg("llama-3.1-8b") | {"kv_lora_rank": 512}
    assert _field(mla, strict=False) == "kv_lora_rank"
    assert _field(_cfg("llama-3.1-8b") | {"attention_type": "mla"}) == "attention_type"
    # Neutral values of those keys are accepted.
    from_hf_config(_cfg("qwen2.5-7b") | {"num_experts": 0}, "x")


def test_hf_windows_sinks_and_their_defaults() -> None:
    """An absent sliding_window takes the config class's default (MistralConfig 4096), null means
    none; Gemma 3 without layer_types keeps every sliding_window_pattern-th layer global."""
    mistral = _cfg("mistral-7b")
    del mistral["sliding_window"]
    assert from_hf_config(mistral, "x").attention_window == 4096
    assert from_hf_config(_cfg("mistral-7b") | {"sliding_window": None}, "x").attention_window == 0
    gemma = _cfg("gemma-3-1b")
    del gemma["sliding_window_pattern"]  # Gemma3TextConfig default 6
    assert from_hf_config(gemma, "x").global_every == 6
    every_third = from_hf_config(_cfg("gemma-3-1b") | {"sliding_window_pattern": 3}, "x")
    assert [every_third.is_local_layer(i) for i in range(6)] == [True, True, False, True, True, False]
    assert from_hf_config(_cfg("gemma-3-1b") | {"sliding_window_pattern": 1}, "x").attention_window == 0
    oss = from_hf_config(_cfg("gpt-oss-20b"), "x")
    assert oss.attention_sinks and oss.qkv_bias and oss.attn_out_bias and oss.mlp_bias
    assert oss.moe is not None and oss.moe.router_bias and (oss.moe.num_experts, oss.moe.top_k) == (32, 4)
    assert any("clamped SwiGLU" in a for a in oss.approximations)
    # the checkpoint's legacy keys must agree with the ones transformers reads
    assert _field(_cfg("gpt-oss-20b") | {"experts_per_token": 2}) == "experts_per_token"
    assert _field(_cfg("gpt-oss-20b") | {"num_experts": 16}) == "num_experts"
    wrapper = {"model_type": "gemma3", "text_config": {"hidden_size": 2560}, "vision_config": {}}
    with pytest.raises(ModelError, match="gemma-3-4b, gemma-3-12b or gemma-3-27b"):
        from_hf_config(wrapper, "x")
    # bidirectional attention (EmbeddingGemma) is refused, not costed as causal
    assert _field(_cfg("gemma-3-1b") | {"use_bidirectional_attention": True}) == "use_bidirectional_attention"
    from_hf_config(_cfg("gemma-3-1b") | {"use_bidirectional_attention": False}, "x")


def test_hf_bad_values() -> None:
    assert _field(_cfg("llama-2-7b") | {"hidden_size": "4096"}) == "hidden_size"
    assert _field(_cfg("llama-2-7b") | {"tie_word_embeddings": "no"}) == "tie_word_embeddings"
    assert _field(_cfg("llama-2-7b") | {"hidden_act": "tanh"}) == "hidden_act"
    assert _field(_cfg("qwen3-30b-a3b") | {"mlp_only_layers": [3, 7]}) == "mlp_only_layers"


@pytest.mark.parametrize(
    ("shape", "total"),
    [
        # Qwen/Qwen3-8B config.json shapes; Hub safetensors.total 8,190,735,360.
        ({"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "intermediate_size": 12288,
          "tie_word_embeddings": False}, 8_190_735_360),
        # Qwen/Qwen3-0.6B (tied): num_parameters() 596,049,920. The Hub's safetensors.total (751,632,384)
        # is larger by V·h because that checkpoint also stores the tied lm_head.weight.
        ({"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "intermediate_size": 3072,
          "tie_word_embeddings": True}, 596_049_920),
    ],
)  # fmt: skip
def test_hf_qwen3_dense(shape: dict[str, Any], total: int) -> None:
    cfg = {"model_type": "qwen3", "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936} | shape
    spec = from_hf_config(cfg, "qwen3")
    assert spec.qk_norm and not spec.qk_norm_full_width
    assert count_params(spec).total == total


def test_hf_mlp_only_prefix() -> None:
    spec = from_hf_config(_cfg("qwen3-30b-a3b") | {"mlp_only_layers": [0, 1]}, "x")
    assert spec.num_dense_layers == 2 and not spec.is_moe_layer(1) and spec.is_moe_layer(2)


def test_hf_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found") as err:
        load_model(str(tmp_path / "missing.json"))
    assert err.value.field == "model"
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama",}')
    with pytest.raises(ModelError, match="not valid JSON") as err:
        load_model(str(bad))
    assert err.value.field == "model"
    arr = tmp_path / "array.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ModelError, match="expected an object"):
        load_model(str(arr))
    big = tmp_path / "big.json"
    big.write_text(" " * 1_000_001 + "{}")
    with pytest.raises(ModelError, match="limit"):
        load_model(str(big))


def test_hf_directory_and_name(tmp_path: Path) -> None:
    ckpt = tmp_path / "My-Llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text((HF_CONFIGS / "llama-2-7b.json").read_text())
    spec = load_hf_config(ckpt)
    assert spec.name == "My-Llama"
    assert count_params(spec).total == 6_738_415_616


# ----------------------------------------------------------------------------- docs stay in sync
def test_docs_preset_table_matches_counts() -> None:
    rows: dict[str, tuple[str, str]] = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    assert set(rows) == set(preset_names())
    for spec in list_presets():
        c = count_params(spec)
        assert rows[spec.name] == (f"{c.total:,}", f"{c.active:,}"), spec.name


# --- OPT (DeepSpeed-Chat's actor models) ------------------------------------------------------------
OPT_1_3B_CONFIG = {
    "_name_or_path": "facebook/opt-1.3b",
    "_remove_final_layer_norm": False,
    "activation_dropout": 0.0,
    "activation_function": "relu",
    "architectures": ["OPTForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 2,
    "do_layer_norm_before": True,
    "dropout": 0.1,
    "eos_token_id": 2,
    "ffn_dim": 8192,
    "hidden_size": 2048,
    "init_std": 0.02,
    "layerdrop": 0.0,
    "max_position_embeddings": 2048,
    "model_type": "opt",
    "num_attention_heads": 32,
    "num_hidden_layers": 24,
    "pad_token_id": 1,
    "prefix": "</s>",
    "torch_dtype": "float16",
    "transformers_version": "4.21.0.dev0",
    "use_cache": True,
    "vocab_size": 50272,
    "word_embed_proj_dim": 2048,
}


def test_opt_config_reads_as_its_preset() -> None:
    from trainplan.models import load_model
    from trainplan.models.hf import from_hf_config
    from trainplan.models.params import count_params

    spec = from_hf_config(OPT_1_3B_CONFIG, "opt-1.3b")
    preset = load_model("opt-1.3b")
    assert count_params(spec).total == count_params(preset).total
    assert (spec.activation, spec.position, spec.tied_embeddings, spec.mlp_bias) == (
        "relu",
        "learned",
        True,
        True,
    )
    # facebook/opt-1.3b has 1,315,758,080 parameters, the 2 offset rows of its position table included
    assert count_params(preset).total == 1_315_758_080
    assert spec.position_offset == 2 and spec.final_norm and not spec.embed_projected


OPT_350M_CONFIG = {
    **OPT_1_3B_CONFIG,
    "_name_or_path": "facebook/opt-350m",
    "do_layer_norm_before": False,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "ffn_dim": 4096,
    "word_embed_proj_dim": 512,
}


def test_opt_350m_embedding_projection_is_counted_exactly() -> None:
    """facebook/opt-350m: a 512-wide embedding and tied head, project_in / project_out to the
    1,024-wide blocks, post-LN without a final norm; the checkpoint holds 331,196,416 parameters."""
    from trainplan.flops import gemm_params, logits_forward_flops
    from trainplan.models import load_model
    from trainplan.models.hf import from_hf_config
    from trainplan.models.params import count_params

    spec = from_hf_config(OPT_350M_CONFIG, "opt-350m")
    preset = load_model("opt-350m")
    c = count_params(spec)
    assert c.total == count_params(preset).total == 331_196_416
    assert (c.embedding, c.embed_projection, c.final_norm) == (50272 * 512, 2 * 512 * 1024, 0)
    assert spec.approximations and "post-LN" in spec.approximations[0]
    # the head multiplies by the 512-wide tied matrix; the projections are GEMMs of every token
    assert logits_forward_flops(preset, 1, 1) == 2 * 512 * 50272 + 2 * 2 * 512 * 1024
    unprojected = dataclasses.replace(preset, embed_dim=0)
    assert gemm_params(preset) - gemm_params(unprojected) == 50272 * (512 - 1024) + 2 * 512 * 1024
    # removing the final norm alone keeps every other count
    no_norm = from_hf_config({**OPT_1_3B_CONFIG, "_remove_final_layer_norm": True}, "no-final")
    assert count_params(no_norm).total == 1_315_758_080 - 2 * 2048


def test_presets_parsed_one_table_at_a_time_equal_the_whole_file() -> None:
    """Each preset parsed from its own table's text equals the same table of the whole file."""
    import tomllib
    from importlib import resources

    from trainplan.models.presets import _preset_entry, preset_names

    whole = tomllib.loads(
        resources.files("trainplan.models.data").joinpath("presets.toml").read_text(encoding="utf-8")
    )
    assert preset_names() == list(whole)
    for name in whole:
        assert _preset_entry(name) == whole[name], name
