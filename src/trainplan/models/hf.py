"""Hugging Face ``config.json`` → :class:`~trainplan.models.spec.ModelSpec`.

Policy (documented in docs/models.md, "Hugging Face import"):

* **Shape fields are required.** ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
  ``intermediate_size``, ``vocab_size`` (GPT-2: ``n_embd``, ``n_layer``, ``n_head``,
  ``n_positions``, ``vocab_size``) and the expert counts and widths must be present. The
  transformers config classes do have defaults for them, but those are the shape of one reference
  checkpoint, and a config.json without them is truncated, not "the default model".
* **Derived defaults are applied exactly as transformers does.** ``num_key_value_heads`` absent
  or null → ``num_attention_heads`` where the config class does that (Llama, Phi-3, OLMo 2; null
  only for Mistral, Mixtral and Qwen, whose class default is a literal, so absence is an error);
  ``head_dim`` absent → ``hidden_size // num_attention_heads`` where the modeling code computes it
  (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3-MoE, Phi-3, OLMo 2; required for Qwen3 and
  Gemma, whose class default is a literal 128 / 256); GPT-2 ``n_inner`` null → ``4·n_embd``.
  Flags take the class default: ``tie_word_embeddings`` (true for GPT-2 and Gemma, false
  otherwise), ``attention_bias``, ``mlp_bias``, ``use_parallel_residual``, ``hidden_act``,
  ``decoder_sparse_step`` (1), ``mlp_only_layers`` ([]), ``max_position_embeddings``.
* **Every other key must be known.** Each model type has a list of keys read and keys ignored
  because they do not change the parameter count (dropout, epsilons, RoPE scaling, token ids,
  sliding windows, soft-capping...). An unknown key is an error naming it; ``strict=False`` turns
  that into a note on the spec.
* **Keys that change the architecture in ways not modelled are always errors** (even with
  ``strict=False``) unless their value is neutral: MoE keys on a dense model type, multi-head
  latent attention (``kv_lora_rank``...) outside the DeepSeek model types, multimodal sub-configs.
* **Sliding windows and sinks** (Mistral v0.1, Gemma 2 and 3, Phi-3, gpt-oss): ``sliding_window``
  and ``layer_types`` become ``ModelSpec.attention_window`` / ``global_every`` (:func:`_sliding_window`);
  gpt-oss's per-head sink logits are ``attention_sinks``, its experts and router carry biases.
* **DeepSeek-V2/V3 and Kimi K2** (``deepseek_v2``, ``deepseek_v3``, ``kimi_k2``): multi-head latent
  attention and DeepSeekMoE as transformers builds them (``models/deepseek_v3/modeling_deepseek_v3.py``:
  layer i is MoE iff i >= ``first_k_dense_replace``; ``moe_layer_freq`` other than 1 is refused).
  ``num_nextn_predict_layers`` (multi-token prediction) is accepted and noted: transformers does
  not build those layers, so they are not part of the trained model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from trainplan.errors import ModelError
from trainplan.models.spec import Activation, MLASpec, ModelSpec, MoESpec

__all__ = [
    "MAX_CONFIG_BYTES",
    "SUPPORTED_MODEL_TYPES",
    "from_hf_config",
    "load_hf_config",
    "read_config_json",
]

MAX_CONFIG_BYTES: Final = 1_000_000

# Keys that never change the parameter count, for every model type.
_COMMON_IGNORED: Final = frozenset(
    {
        "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
        "use_cache", "initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
        "rope_theta", "rope_scaling", "rope_parameters", "attention_dropout", "hidden_dropout",
        "pretraining_tp", "auto_map", "output_attentions", "output_hidden_states", "return_dict",
        "torchscript", "tokenizer_class", "task_specific_params", "id2label", "label2id",
        "problem_type", "_attn_implementation_autoset", "_attn_implementation", "max_length",
        "min_length", "do_sample", "temperature", "top_p", "top_k", "num_beams", "bad_words_ids",
        "is_decoder", "is_encoder_decoder", "quantization_config", "sliding_window",
        "use_sliding_window", "max_window_layers", "layer_types", "cache_implementation",
        "sliding_window_size", "sliding_window_pattern", "output_router_logits",
        "router_aux_loss_coef", "router_jitter_noise", "router_z_loss_coef", "norm_topk_prob",
        "embd_pdrop", "resid_pdrop", "attn_pdrop", "original_max_position_embeddings",
        "partial_rotary_factor",
    }
)  # fmt: skip

# Keys whose non-neutral value changes the architecture in a way trainplan does not model.
_UNMODELLED: Final[dict[str, tuple[tuple[object, ...], str]]] = {
    "num_experts_per_tok": ((None, 0), "mixture-of-experts key on a dense model type"),
    "num_local_experts": ((None, 0), "mixture-of-experts key on a dense model type"),
    "num_experts": ((None, 0), "mixture-of-experts key on a dense model type"),
    "n_routed_experts": ((None, 0), "mixture-of-experts key on a dense model type"),
    "n_shared_experts": ((None, 0), "shared experts are not part of this model type"),
    "moe_intermediate_size": ((None, 0), "mixture-of-experts key on a dense model type"),
    "shared_expert_intermediate_size": ((None, 0), "shared experts are not part of this model type"),
    "moe_layer_freq": ((None, 1), "mixture-of-experts layer pattern"),
    "first_k_dense_replace": ((None, 0), "mixture-of-experts layer pattern"),
    "kv_lora_rank": ((None, 0), "multi-head latent attention (MLA) is not modelled"),
    "q_lora_rank": ((None, 0), "multi-head latent attention (MLA) is not modelled"),
    "qk_rope_head_dim": ((None, 0), "multi-head latent attention (MLA) is not modelled"),
    "qk_nope_head_dim": ((None, 0), "multi-head latent attention (MLA) is not modelled"),
    "v_head_dim": ((None,), "a value head width different from head_dim is not modelled"),
    "attention_type": ((None,), "only standard multi/grouped-query attention is modelled"),
    "num_nextn_predict_layers": ((None, 0), "multi-token prediction layers are not modelled"),
    "add_cross_attention": ((None, False), "cross-attention layers are not modelled"),
    "use_mrope": ((None, False), "multimodal rotary embedding marks a vision-language model"),
    "qk_layernorm": ((None, False), "q/k norms are not part of this model type"),
    "use_qk_norm": ((None, False), "q/k norms are not part of this model type"),
    "use_bidirectional_attention": ((None, False), "bidirectional (non-causal) attention is not modelled"),
    "text_config": ((None,), "multimodal config: save its text_config object as its own config.json"),
    "vision_config": ((None,), "multimodal config: the vision tower is not modelled"),
}


class _Reader:
    """Typed access to config keys; remembers which keys were read."""

    def __init__(self, cfg: Mapping[str, Any], model_type: str) -> None:
        self.cfg = cfg
        self.model_type = model_type
        self.used: set[str] = set()

    def _fail(self, key: str, message: str) -> ModelError:
        return ModelError(key, f"config.json (model_type {self.model_type}): {message}")

    def has(self, key: str) -> bool:
        return key in self.cfg

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.cfg.get(key)

    def req_positive(self, key: str) -> int:
        """A required integer that must be > 0 (a count that divides another)."""
        value = self.req_int(key)
        if value == 0:
            raise self._fail(key, f"'{key}' must be a positive integer, got 0")
        return value

    def req_int(self, key: str, why: str = "") -> int:
        self.used.add(key)
        if key not in self.cfg or self.cfg[key] is None:
            extra = f" ({why})" if why else ""
            raise self._fail(key, f"missing '{key}'{extra}; copy the checkpoint's complete config.json")
        return self._as_int(key, self.cfg[key])

    def opt_int(self, key: str, default: int) -> int:
        """``default`` when the key is absent or null."""
        value = self.maybe_int(key)
        return default if value is None else value

    def maybe_int(self, key: str) -> int | None:
        self.used.add(key)
        value = self.cfg.get(key)
        return None if value is None else self._as_int(key, value)

    def opt_bool(self, key: str, default: bool) -> bool:
        self.used.add(key)
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, f"'{key}' must be true or false, got {value!r}")
        return value

    def opt_str(self, key: str, default: str) -> str:
        self.used.add(key)
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(key, f"'{key}' must be a string, got {value!r}")
        return value

    def _as_int(self, key: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, f"'{key}' must be an integer, got {value!r}")
        if value < 0:
            raise self._fail(key, f"'{key}' must be >= 0, got {value}")
        return value


_GELU_NAMES: Final = frozenset(
    {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate", "quick_gelu"}
)


def _activation(r: _Reader, key: str, act: str, *, gated: bool) -> Activation:
    """Map a transformers ``ACT2FN`` name to trainplan's activation (gated MLPs: SwiGLU / GeGLU)."""
    if gated and act in ("silu", "swish"):
        return "swiglu"
    if act in _GELU_NAMES:
        return "geglu" if gated else "gelu"
    if act == "relu" and not gated:
        return "relu"
    kinds = "silu, swish, gelu*" if gated else "gelu*, relu"
    raise r._fail(key, f"activation '{act}' is not modelled for this MLP; supported: {kinds}")


def _head_dim(r: _Reader, hidden: int, heads: int, *, derived: bool) -> int:
    """``head_dim`` key, or ``hidden // heads`` where the modeling file derives it."""
    if not derived:
        return r.req_int("head_dim", "this model type's default is a literal of one checkpoint")
    value = r.maybe_int("head_dim")
    if value is not None:
        return value
    if hidden % heads:
        raise r._fail(
            "head_dim", f"hidden_size {hidden} is not divisible by num_attention_heads {heads}; give head_dim"
        )
    return hidden // heads


def _kv_heads(r: _Reader, heads: int, *, absent_means_heads: bool) -> int:
    if absent_means_heads or r.has("num_key_value_heads"):
        return r.opt_int("num_key_value_heads", heads)
    return r.req_int("num_key_value_heads", "this model type's default is a literal of one checkpoint")


@dataclass(frozen=True, kw_only=True)
class _Family:
    """How one ``model_type`` maps onto ModelSpec (see transformers ``models/<type>/``)."""

    kv_absent_means_heads: bool  # config class default num_key_value_heads=None → heads
    head_dim_derived: bool  # modeling computes hidden // heads when head_dim is absent
    tied_default: bool  # config class default of tie_word_embeddings
    max_pos_default: int  # config class default of max_position_embeddings
    attention_bias: str  # "none" | "qkv" (Qwen2) | "key" (attention_bias → q, k, v, o) | "qkv_key"
    attention_bias_default: bool = False  # the class default of attention_bias (gpt-oss: true)
    mlp_bias_key: bool = False  # Llama's mlp_bias
    act_default: str = "silu"
    qk_norm: str = "none"  # "none" | "head" (Qwen3) | "full" (OLMo 2)
    post_norms: bool = False
    moe: str = "none"  # "none" | "mixtral" | "qwen" | "gpt_oss"
    shared_expert: bool = False
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head
    window_every_default: int = 0  # global_every without layer_types (Gemma 2: 2; Gemma 3: 6)
    window_pattern_key: bool = False  # Gemma 3: sliding_window_pattern overrides window_every_default
    window_default: int | None = None  # the config class's sliding_window default (absent key)
    extra_ignored: frozenset[str] = frozenset()


_LLAMA_LIKE: Final[dict[str, _Family]] = {
    # transformers models/llama/configuration_llama.py, modeling_llama.py
    "llama": _Family(
        kv_absent_means_heads=True, head_dim_derived=True, tied_default=False, max_pos_default=2048,
        attention_bias="key", mlp_bias_key=True,
    ),
    # models/mistral: num_key_value_heads=8 literal, no attention bias
    "mistral": _Family(
        kv_absent_means_heads=False, head_dim_derived=True, tied_default=False, max_pos_default=131072,
        attention_bias="none", window_default=4096,
    ),
    "mixtral": _Family(
        kv_absent_means_heads=False, head_dim_derived=True, tied_default=False, max_pos_default=131072,
        attention_bias="none", moe="mixtral",
    ),
    # models/qwen2: q, k, v bias=True hard-coded, o without bias
    "qwen2": _Family(
        kv_absent_means_heads=False, head_dim_derived=True, tied_default=False, max_pos_default=32768,
        attention_bias="qkv",
    ),
    # models/qwen2_moe: qkv_bias (default true), shared expert with a sigmoid gate
    "qwen2_moe": _Family(
        kv_absent_means_heads=False, head_dim_derived=True, tied_default=False, max_pos_default=32768,
        attention_bias="qkv_key", moe="qwen", shared_expert=True,
    ),
    # models/qwen3: head_dim=128 literal, attention_bias on q, k, v, o, per-head q/k RMSNorm
    "qwen3": _Family(
        kv_absent_means_heads=False, head_dim_derived=False, tied_default=False, max_pos_default=32768,
        attention_bias="key", qk_norm="head",
    ),
    "qwen3_moe": _Family(
        kv_absent_means_heads=False, head_dim_derived=True, tied_default=False, max_pos_default=32768,
        attention_bias="key", qk_norm="head", moe="qwen",
    ),
    # models/gemma: head_dim=256 literal, tied, GeGLU
    "gemma": _Family(
        kv_absent_means_heads=False, head_dim_derived=False, tied_default=True, max_pos_default=8192,
        attention_bias="key", act_default="gelu_pytorch_tanh", extra_ignored=frozenset({"hidden_activation"}),
    ),
    # models/gemma2: + post-attention and post-feedforward norms
    "gemma2": _Family(
        kv_absent_means_heads=False, head_dim_derived=False, tied_default=True, max_pos_default=8192,
        attention_bias="key", act_default="gelu_pytorch_tanh", post_norms=True,
        window_every_default=2, window_default=4096,
        extra_ignored=frozenset(
            {"hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"}
        ),
    ),
    # models/gemma3 (Gemma3TextConfig, the text decoder of Gemma 3): Gemma 2's four norms per layer,
    # per-head q/k RMSNorm (Gemma3Attention q_norm / k_norm over head_dim), head_dim=256 literal,
    # num_key_value_heads=4 literal, five sliding-window layers per global one (sliding_window_pattern 6)
    "gemma3_text": _Family(
        kv_absent_means_heads=False, head_dim_derived=False, tied_default=True, max_pos_default=131072,
        attention_bias="key", act_default="gelu_pytorch_tanh", post_norms=True, qk_norm="head",
        window_every_default=6, window_default=4096, window_pattern_key=True,
        extra_ignored=frozenset(
            {"hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
             "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern"}
        ),
    ),
    # models/gpt_oss: q, k, v, o with bias (attention_bias default true), a sink logit per head, every
    # layer a MoE of num_local_experts experts of intermediate_size with biases (gate_up_proj_bias,
    # down_proj_bias) and a router with bias; top num_experts_per_tok; sliding window on every other
    # layer (layer_types default: sliding on the even layers)
    "gpt_oss": _Family(
        kv_absent_means_heads=True, head_dim_derived=True, tied_default=False, max_pos_default=131072,
        attention_bias="key", attention_bias_default=True, moe="gpt_oss", attention_sinks=True, window_every_default=2, window_default=128,
        extra_ignored=frozenset(
            {"swiglu_limit", "swiglu_alpha", "experts_per_token", "initial_context_length", "rope_ntk_alpha",
             "rope_ntk_beta", "rope_scaling_factor"}
        ),
    ),
    # models/phi3: fused qkv_proj / gate_up_proj without bias; attention_bias is not read by transformers
    "phi3": _Family(
        kv_absent_means_heads=True, head_dim_derived=True, tied_default=False, max_pos_default=4096,
        attention_bias="none", extra_ignored=frozenset({"attention_bias"}),
    ),
    # models/olmo2: q_norm over a·d, k_norm over k·d
    "olmo2": _Family(
        kv_absent_means_heads=True, head_dim_derived=True, tied_default=False, max_pos_default=2048,
        attention_bias="key", qk_norm="full",
    ),
}  # fmt: skip

_GPT2_IGNORED: Final = frozenset(
    {
        "n_ctx", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn",
    }
)  # fmt: skip
_NEOX_IGNORED: Final = frozenset({"rotary_pct", "rotary_emb_base", "classifier_dropout"})

_OPT_IGNORED: Final = frozenset(
    {
        "dropout",
        "activation_dropout",
        "layerdrop",
        "init_std",
        "prefix",
        "output_projection",
        "do_layer_norm_before",
    }
)
"""OPT keys that do not change the parameters read here (``do_layer_norm_before`` is read by
:func:`_read_opt`: the final norm's presence)."""

_DEEPSEEK_TYPES: Final = ("deepseek_v2", "deepseek_v3", "kimi_k2")
_DEEPSEEK_IGNORED: Final = frozenset(
    {
        "routed_scaling_factor", "n_group", "topk_group", "topk_method", "scoring_func", "aux_loss_alpha",
        "seq_aux", "ep_size", "rope_interleave", "num_nextn_predict_layers", "head_dim",
    }
)  # fmt: skip
"""DeepSeek keys that do not change the parameters: the router's scoring and grouping (its score
correction bias is a buffer, not a parameter), expert scaling, the load-balancing loss, the rope
layout; ``head_dim`` (transformers sets it to ``qk_rope_head_dim``, the rotary width; the head's
query/key width is d_n + d_r); ``num_nextn_predict_layers`` (noted, :func:`_notes`)."""

SUPPORTED_MODEL_TYPES: Final = (*_LLAMA_LIKE, *_DEEPSEEK_TYPES, "gpt2", "gpt_neox", "opt")


def _read_llama_like(r: _Reader, fam: _Family) -> dict[str, Any]:
    hidden = r.req_int("hidden_size")
    heads = r.req_positive("num_attention_heads")
    kw: dict[str, Any] = {
        "num_layers": r.req_int("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": _kv_heads(r, heads, absent_means_heads=fam.kv_absent_means_heads),
        "head_dim": _head_dim(r, hidden, heads, derived=fam.head_dim_derived),
        "ffn_hidden": r.req_int("intermediate_size"),
        "vocab_size": r.req_int("vocab_size"),
        "norm": "rmsnorm",
        "position": "rope",
        "tied_embeddings": r.opt_bool("tie_word_embeddings", fam.tied_default),
        "max_seq_len": r.opt_int("max_position_embeddings", fam.max_pos_default),
    }
    if fam.extra_ignored >= {"hidden_activation"} and r.cfg.get("hidden_activation") is not None:
        act_key = "hidden_activation"  # Gemma: hidden_activation wins over the legacy hidden_act
        r.used.add("hidden_act")
    else:
        act_key = "hidden_act"
    kw["activation"] = _activation(r, act_key, r.opt_str(act_key, fam.act_default), gated=True)

    if fam.attention_bias == "key":
        bias = r.opt_bool("attention_bias", fam.attention_bias_default)
        kw["qkv_bias"] = kw["attn_out_bias"] = bias
    elif fam.attention_bias == "qkv":
        kw["qkv_bias"] = True
    elif fam.attention_bias == "qkv_key":
        kw["qkv_bias"] = r.opt_bool("qkv_bias", True)
    if fam.mlp_bias_key:
        kw["mlp_bias"] = r.opt_bool("mlp_bias", False)
    if fam.qk_norm != "none":
        kw["qk_norm"] = True
        kw["qk_norm_full_width"] = fam.qk_norm == "full"
    kw["post_norms"] = fam.post_norms

    if fam.moe == "mixtral":
        kw["moe"] = MoESpec(
            num_experts=r.req_int("num_local_experts"),
            top_k=r.req_int("num_experts_per_tok"),
            expert_ffn_hidden=kw["ffn_hidden"],  # MixtralBlockSparseTop2MLP uses intermediate_size
        )
    elif fam.moe == "qwen":
        kw["moe"] = _read_qwen_moe(r, fam, kw["num_layers"])
    elif fam.moe == "gpt_oss":
        kw["moe"] = _read_gpt_oss_moe(r, kw["ffn_hidden"])
        kw["mlp_bias"] = True
    kw["attention_sinks"] = fam.attention_sinks
    return kw


def _read_gpt_oss_moe(r: _Reader, width: int) -> MoESpec:
    """gpt-oss (transformers models/gpt_oss ``GptOssMLP``): ``GptOssTopKRouter`` (weight E×h and a
    bias of E) and ``GptOssExperts`` (``gate_up_proj`` E×h×2w with ``gate_up_proj_bias`` E×2w,
    ``down_proj`` E×w×h with ``down_proj_bias`` E×h) on every layer, w = ``intermediate_size``.
    The checkpoint's legacy ``experts_per_token`` must agree with ``num_experts_per_tok``."""
    top_k = r.req_int("num_experts_per_tok")
    legacy = r.cfg.get("experts_per_token")
    if legacy is not None and legacy != top_k:
        raise r._fail(
            "experts_per_token",
            f"experts_per_token {legacy!r} disagrees with num_experts_per_tok {top_k}; transformers reads "
            "num_experts_per_tok: make them equal",
        )
    experts = r.req_int("num_local_experts")
    alias = r.raw("num_experts")  # GptOssConfig.attribute_map: num_experts -> num_local_experts
    if alias is not None and alias != experts:
        raise r._fail(
            "num_experts",
            f"num_experts {alias!r} disagrees with num_local_experts {experts}: make them equal",
        )
    return MoESpec(
        num_experts=experts,
        top_k=top_k,
        expert_ffn_hidden=width,
        router_bias=True,
    )


def _read_qwen_moe(r: _Reader, fam: _Family, num_layers: int) -> MoESpec | None:
    """Qwen2-MoE / Qwen3-MoE: layer i is sparse iff i ∉ mlp_only_layers and (i+1) % step == 0."""
    num_experts = r.req_int("num_experts")
    step = r.opt_int("decoder_sparse_step", 1)
    if step < 1:
        raise r._fail("decoder_sparse_step", f"must be >= 1, got {step}")
    only = r.raw("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise r._fail("mlp_only_layers", f"must be a list of layer indices, got {only!r}")
    if num_experts == 0:  # transformers builds a dense MLP everywhere
        return None
    first_dense = step - 1
    if only:
        prefix = sorted(set(only)) == list(range(len(set(only))))
        if not prefix or step != 1:
            raise r._fail(
                "mlp_only_layers",
                f"{only} is not modelled: only a prefix [0..n-1] of dense layers with decoder_sparse_step 1",
            )
        first_dense = len(set(only))
    shared_width = r.req_int("shared_expert_intermediate_size") if fam.shared_expert else 0
    return MoESpec(
        num_experts=num_experts,
        top_k=r.req_int("num_experts_per_tok"),
        expert_ffn_hidden=r.req_int("moe_intermediate_size"),
        num_shared_experts=1 if fam.shared_expert else 0,
        shared_expert_ffn_hidden=shared_width,
        shared_expert_gate=fam.shared_expert,
        first_dense_layers=min(first_dense, num_layers),
        layer_freq=step,
    )


def _read_deepseek(r: _Reader) -> dict[str, Any]:
    """transformers models/deepseek_v2, deepseek_v3 (and Kimi K2, a DeepSeek-V3 model):
    ``DeepseekV3Attention`` (q_a_proj, q_a_layernorm, q_b_proj or q_proj; kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj; o_proj; no bias unless ``attention_bias``), ``DeepseekV3MoE``
    (``n_routed_experts`` experts of ``moe_intermediate_size``, ``n_shared_experts`` shared experts
    run as one MLP of ``n_shared_experts·moe_intermediate_size``, router h→E without bias), a dense
    ``DeepseekV3MLP`` of ``intermediate_size`` on the first ``first_k_dense_replace`` layers."""
    hidden = r.req_int("hidden_size")
    heads = r.req_positive("num_attention_heads")
    kv_heads = r.opt_int("num_key_value_heads", heads)
    if kv_heads != heads:
        raise r._fail(
            "num_key_value_heads",
            f"multi-head latent attention expands keys to every head: {kv_heads} != {heads}",
        )
    if r.opt_bool("attention_bias", False):
        raise r._fail(
            "attention_bias",
            "biases on the latent projections are not modelled; no DeepSeek checkpoint has them",
        )
    mla = MLASpec(
        q_lora_rank=r.opt_int("q_lora_rank", 0),
        kv_lora_rank=r.req_int("kv_lora_rank"),
        qk_nope_head_dim=r.req_int("qk_nope_head_dim"),
        qk_rope_head_dim=r.req_int("qk_rope_head_dim"),
        v_head_dim=r.req_int("v_head_dim"),
    )
    layers = r.req_int("num_hidden_layers")
    kw: dict[str, Any] = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": mla.qk_head_dim,
        "ffn_hidden": r.req_int("intermediate_size"),
        "vocab_size": r.req_int("vocab_size"),
        "activation": _activation(r, "hidden_act", r.opt_str("hidden_act", "silu"), gated=True),
        "norm": "rmsnorm",
        "position": "rope",
        "tied_embeddings": r.opt_bool("tie_word_embeddings", False),
        "max_seq_len": r.opt_int("max_position_embeddings", 4096),
        "mla": mla,
    }
    experts = r.maybe_int("n_routed_experts")
    if experts:
        freq = r.opt_int("moe_layer_freq", 1)
        if freq != 1:
            raise r._fail(
                "moe_layer_freq",
                f"{freq} is not modelled (transformers makes every layer from first_k_dense_replace on MoE)",
            )
        shared = r.opt_int("n_shared_experts", 0)
        width = r.req_int("moe_intermediate_size")
        kw["moe"] = MoESpec(
            num_experts=experts,
            top_k=r.req_int("num_experts_per_tok"),
            expert_ffn_hidden=width,
            num_shared_experts=1 if shared else 0,
            shared_expert_ffn_hidden=shared * width,
            first_dense_layers=min(r.opt_int("first_k_dense_replace", 0), layers),
        )
    else:
        for key in (
            "moe_layer_freq",
            "n_shared_experts",
            "moe_intermediate_size",
            "num_experts_per_tok",
            "first_k_dense_replace",
        ):
            r.used.add(key)
    return kw


def _read_gpt2(r: _Reader) -> dict[str, Any]:
    """transformers models/gpt2: Conv1D c_attn/c_proj/c_fc with biases, learned positions, tied."""
    hidden = r.req_int("n_embd")
    heads = r.req_positive("n_head")
    if hidden % heads:
        raise r._fail("n_head", f"n_embd {hidden} is not divisible by n_head {heads}")
    return {
        "num_layers": r.req_int("n_layer"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "ffn_hidden": r.opt_int("n_inner", 4 * hidden),
        "vocab_size": r.req_int("vocab_size"),
        "activation": _activation(
            r, "activation_function", r.opt_str("activation_function", "gelu_new"), gated=False
        ),
        "norm": "layernorm",
        "position": "learned",
        "tied_embeddings": r.opt_bool("tie_word_embeddings", True),
        "max_seq_len": r.req_int("n_positions", "it sizes the learned position table"),
        "qkv_bias": True,
        "attn_out_bias": True,
        "mlp_bias": True,
    }


def _read_opt(r: _Reader) -> dict[str, Any]:
    """transformers models/opt (Zhang et al. 2022, "OPT", Table 1): ``q/k/v/out_proj`` and
    ``fc1``/``fc2`` with biases (``enable_bias``, default true), ReLU MLP of ``ffn_dim``, two
    LayerNorms per layer and a final one, learned positions, LM head tied to the embedding
    (``OPTForCausalLM._tied_weights_keys``), a position table of ``max_position_embeddings`` + 2
    rows (``OPTLearnedPositionalEmbedding`` offset 2). ``word_embed_proj_dim`` other than
    ``hidden_size`` (OPT-350M: a 512-wide embedding and head with ``project_in`` /
    ``project_out``) is ``embed_dim``; ``do_layer_norm_before=false`` (post-LN, OPT-350M) or
    ``_remove_final_layer_norm`` drop the final LayerNorm (``OPTDecoder.__init__``:
    ``final_layer_norm`` only when ``do_layer_norm_before and not _remove_final_layer_norm``)."""
    hidden = r.req_int("hidden_size")
    heads = r.req_int("num_attention_heads")
    if hidden % heads:
        raise r._fail("num_attention_heads", f"hidden_size {hidden} is not divisible by {heads} heads")
    proj = r.maybe_int("word_embed_proj_dim")
    pre_ln = r.opt_bool("do_layer_norm_before", True)
    removed = r.opt_bool("_remove_final_layer_norm", False)
    final_norm = pre_ln and not removed
    act = r.opt_str("activation_function", "relu")
    bias = r.opt_bool("enable_bias", True)
    if not r.opt_bool("layer_norm_elementwise_affine", True):
        raise r._fail("layer_norm_elementwise_affine", "LayerNorms without weights are not modelled")
    return {
        "num_layers": r.req_int("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "ffn_hidden": r.req_int("ffn_dim"),
        "vocab_size": r.req_int("vocab_size"),
        "activation": _activation(r, "activation_function", act, gated=False),
        "norm": "layernorm",
        "position": "learned",
        "tied_embeddings": r.opt_bool("tie_word_embeddings", True),
        "max_seq_len": r.req_int("max_position_embeddings", "it sizes the learned position table"),
        "qkv_bias": bias,
        "attn_out_bias": bias,
        "mlp_bias": bias,
        "position_offset": 2,
        "embed_dim": proj if proj is not None and proj != hidden else 0,
        "final_norm": final_norm,
    }


OPT_POST_LN_APPROXIMATION: Final = (
    "post-LN (each LayerNorm after its sub-layer, do_layer_norm_before=false): same parameters and "
    "FLOPs as pre-LN; its saved activations are counted as pre-LN's"
)


def _read_gpt_neox(r: _Reader) -> dict[str, Any]:
    """transformers models/gpt_neox: fused query_key_value, biases, two LayerNorms, parallel residual."""
    hidden = r.req_int("hidden_size")
    heads = r.req_positive("num_attention_heads")
    if hidden % heads:
        raise r._fail("num_attention_heads", f"hidden_size {hidden} is not divisible by {heads} heads")
    bias = r.opt_bool("attention_bias", True)
    return {
        "num_layers": r.req_int("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "ffn_hidden": r.req_int("intermediate_size"),
        "vocab_size": r.req_int("vocab_size"),
        "activation": _activation(r, "hidden_act", r.opt_str("hidden_act", "gelu"), gated=False),
        "norm": "layernorm",
        "position": "rope",
        "tied_embeddings": r.opt_bool("tie_word_embeddings", False),
        "max_seq_len": r.opt_int("max_position_embeddings", 2048),
        "qkv_bias": bias,
        "attn_out_bias": bias,
        "mlp_bias": True,
        "parallel_attn_mlp": r.opt_bool("use_parallel_residual", True),
    }


def _notes(cfg: Mapping[str, Any]) -> list[str]:
    notes = []
    if cfg.get("quantization_config") is not None:
        notes.append("quantization_config present: counts are of the unquantized architecture.")
    mtp = cfg.get("num_nextn_predict_layers")
    if cfg.get("model_type") in _DEEPSEEK_TYPES and mtp:
        notes.append(
            f"num_nextn_predict_layers = {mtp}: the multi-token-prediction layers are not part of the model "
            "(transformers does not build them), so they are not costed."
        )
    return notes


def _sliding_window(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[int, int]:
    """(``ModelSpec.attention_window``, ``global_every``) of a config's sliding-window attention.

    ``sliding_window`` (Mistral, Mixtral, Phi-3: every layer; Gemma 2: the even layers,
    ``Gemma2DecoderLayer.is_sliding = not layer_idx % 2``); ``layer_types`` (newer transformers:
    one ``sliding_attention`` / ``full_attention`` per layer) must be every layer local, or every
    n-th global; without ``layer_types``, Gemma 3 keeps every ``sliding_window_pattern``-th layer
    global (default 6) and gpt-oss every other (its default ``layer_types``). An absent
    ``sliding_window`` takes the config class's default (Mistral, Gemma 2 and 3: 4096; gpt-oss:
    128); ``null`` means no window. Qwen's ``use_sliding_window`` slides the layers from ``max_window_layers`` on,
    which is modelled only when that leaves none sliding. A pattern not of this form is an error
    naming the key."""
    fam = _LLAMA_LIKE.get(model_type)
    window = cfg.get("sliding_window", fam.window_default if fam else None)
    if model_type.startswith("qwen"):
        if not cfg.get("use_sliding_window", False):
            return 0, 0
        first = cfg.get("max_window_layers", num_layers)
        if isinstance(first, int) and first >= num_layers:
            return 0, 0
        raise ModelError(
            "use_sliding_window",
            f"config.json (model_type {model_type}): sliding windows on the layers from max_window_layers "
            f"({first}) on are not modelled (a window on every layer or on every n-th is)",
        )
    if window is None or window is False:
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ModelError(
            "sliding_window",
            f"config.json: sliding_window must be a positive integer or null, got {window!r}",
        )
    types = cfg.get("layer_types")
    if types is None:
        every = fam.window_every_default if fam is not None else 0
        if fam is not None and fam.window_pattern_key:
            # Gemma3TextConfig: layer i slides unless (i + 1) % sliding_window_pattern == 0
            pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", every))
            if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
                raise ModelError(
                    "sliding_window_pattern",
                    f"config.json: sliding_window_pattern must be a positive integer, got {pattern!r}",
                )
            if pattern == 1:
                return 0, 0  # every layer global
            every = pattern
        return window, every
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or not set(types) <= {"sliding_attention", "full_attention"}
    ):
        raise ModelError(
            "layer_types",
            "config.json: layer_types must list sliding_attention / full_attention once per layer",
        )
    glob = [i for i, t in enumerate(types) if t == "full_attention"]
    if not glob:
        return window, 0
    if len(glob) == num_layers:
        return 0, 0
    every = glob[0] + 1
    if glob != [i for i in range(num_layers) if (i + 1) % every == 0]:
        raise ModelError(
            "layer_types",
            f"config.json: the full-attention layers {glob[:4]}... are not every {every}-th layer; a sliding "
            "window on every layer or on all but every n-th is modelled",
        )
    return window, every


def _approximations(cfg: Mapping[str, Any], name: str) -> list[str]:
    """What the cost model approximates for this config (:attr:`ModelSpec.approximations`)."""
    out = []
    if cfg.get("model_type") == "opt" and cfg.get("do_layer_norm_before") is False:
        out.append(f"{name}: {OPT_POST_LN_APPROXIMATION}")
    if cfg.get("model_type") == "gpt_oss":
        out.append(
            f"{name}: the experts' clamped SwiGLU (gate clamped, up clamped and shifted by 1, sigmoid gain "
            "swiglu_alpha) costed as SwiGLU, and the attention sinks' extra softmax column not costed "
            "(element-wise work beside the GEMMs)"
        )
    capped = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if cfg.get(k)]
    if capped:
        out.append(
            f"{name}: {' and '.join(capped)} (tanh soft-capping) not costed (element-wise work, small "
            "beside the GEMMs; eager attention materialises the capped scores, which is not counted)"
        )
    return out


def from_hf_config(cfg: Mapping[str, Any], name: str, *, strict: bool = True, source: str = "") -> ModelSpec:
    """Turn a parsed Hugging Face ``config.json`` into a ModelSpec (policy: module docstring).

    Raises :class:`ModelError` naming the key for an unknown ``model_type``, a missing required
    key, a mistyped value, an unknown key (``strict=True``) or an unmodelled architecture key.
    """
    if not isinstance(cfg, Mapping):
        raise ModelError("model", f"config must be a JSON object, got {type(cfg).__name__}")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ModelError("model_type", f"config.json: missing 'model_type'; supported: {supported}")
    if model_type == "gemma3":
        raise ModelError(
            "model_type",
            "config.json: model_type 'gemma3' is Gemma 3's vision-language wrapper (a SigLIP vision tower, "
            "which is not modelled, and a text_config that leaves most keys to Gemma3TextConfig's defaults); "
            "use the text-decoder presets gemma-3-4b, gemma-3-12b or gemma-3-27b",
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            "model_type", f"config.json: model_type {model_type!r} is not supported; supported: {supported}"
        )

    r = _Reader(cfg, model_type)
    ignored = set(_COMMON_IGNORED)
    if model_type == "gpt2":
        ignored |= _GPT2_IGNORED
        kw = _read_gpt2(r)
    elif model_type == "gpt_neox":
        ignored |= _NEOX_IGNORED
        kw = _read_gpt_neox(r)
    elif model_type == "opt":
        ignored |= _OPT_IGNORED
        kw = _read_opt(r)
    elif model_type in _DEEPSEEK_TYPES:
        ignored |= _DEEPSEEK_IGNORED
        kw = _read_deepseek(r)
    else:
        fam = _LLAMA_LIKE[model_type]
        ignored |= fam.extra_ignored
        kw = _read_llama_like(r, fam)

    kw["attention_window"], kw["global_every"] = _sliding_window(cfg, model_type, kw["num_layers"])
    notes = _notes(cfg)
    unknown: list[str] = []
    for key in sorted(set(cfg) - r.used - ignored):
        if key in _UNMODELLED:
            neutral, why = _UNMODELLED[key]
            value = cfg[key]
            if not any(value is n or (type(value) is type(n) and value == n) for n in neutral):
                raise ModelError(
                    key,
                    f"config.json (model_type {model_type}): '{key}' = {value!r} is not modelled ({why}); "
                    f"supported model types: {supported}",
                )
            continue
        unknown.append(key)
    if unknown and strict:
        raise ModelError(
            unknown[0],
            f"config.json (model_type {model_type}): unknown key '{unknown[0]}' may change the architecture; "
            "remove it, or load with strict=False to ignore unknown keys",
        )
    if unknown:
        notes.append(f"ignored unknown config keys: {', '.join(unknown)}")
    return ModelSpec(
        name=name,
        family=model_type,
        source=source,
        notes=tuple(notes),
        approximations=tuple(_approximations(cfg, name)),
        **kw,
    )


MAX_JSON_DEPTH: Final = 64
"""Deepest nesting of objects and arrays read from a config.json (real configs nest 3-4 deep)."""


def _json_depth_ok(text: str) -> bool:
    """Whether brackets outside strings nest at most :data:`MAX_JSON_DEPTH` deep (checked before
    parsing, so that no recursion limit is reached inside the JSON decoder)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _parse_json(text: str, p: Path) -> Any:
    """``text`` parsed as JSON, with typed errors for bad JSON, deep nesting and huge integers."""
    if not _json_depth_ok(text):
        raise ModelError(
            "model", f"'{p}' nests objects or arrays more than {MAX_JSON_DEPTH} deep; pass a config.json"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(
            "model", f"'{p}' is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except (ValueError, RecursionError) as exc:  # an integer of more than 4300 digits
        raise ModelError(
            "model", f"'{p}' holds an integer too long to read (over 4300 digits); pass a config.json"
        ) from exc


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Read a config.json (or a directory holding one) as a JSON object, with clear errors."""
    try:
        return _read_config_file(Path(path).expanduser())
    except OSError as exc:
        raise ModelError(
            "model", f"cannot read '{path}': {exc.strerror or exc}; pass the path of a config.json"
        ) from None


def _read_config_file(p: Path) -> dict[str, Any]:
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ModelError(
            "model",
            f"config file '{p}' not found; pass a preset name (`trainplan models` lists them) "
            "or the path of a Hugging Face config.json",
        )
    if not p.is_file():
        raise ModelError("model", f"'{p}' is not a regular file; pass the path of a config.json")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ModelError(
            "model",
            f"'{p}' is {size:,} bytes, over the {MAX_CONFIG_BYTES:,}-byte limit for a config.json; "
            "pass the model's config.json, not a weights or tokenizer file",
        )
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError("model", f"'{p}' is not UTF-8 text ({exc.reason}); pass a config.json") from exc
    data = _parse_json(text, p)
    if not isinstance(data, dict):
        raise ModelError(
            "model", f"'{p}' holds a JSON {type(data).__name__}, expected an object of config fields"
        )
    return data


def load_hf_config(path: str | Path, *, name: str | None = None, strict: bool = True) -> ModelSpec:
    """Load a Hugging Face config.json file (or a checkpoint directory) as a ModelSpec.

    ``name`` defaults to the checkpoint directory's name (``…/Llama-2-7b-hf/config.json`` →
    ``Llama-2-7b-hf``), or the file's stem when it is not called config.json.
    """
    p = Path(path).expanduser()
    cfg = read_config_json(p)
    file = p / "config.json" if p.is_dir() else p
    if name is None:
        name = file.parent.name if file.name == "config.json" and file.parent.name else file.stem
    return from_hf_config(cfg, name, strict=strict, source=str(file.resolve()))
