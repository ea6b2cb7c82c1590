"""Exact parameter counts of a :class:`~trainplan.models.spec.ModelSpec`.

Notation (as in :mod:`trainplan.models.spec`)::

    L  num_layers      h  hidden_size     a  num_heads      k  num_kv_heads
    d  head_dim        f  ffn_hidden      V  vocab_size     s  max_seq_len (learned positions only)
    E  moe.num_experts K  moe.top_k       fe moe.expert_ffn_hidden   fs moe.shared_width
    n(x) parameters of one norm over x features: 2x for LayerNorm (weight + bias), x for RMSNorm

Per layer (pre-norm decoder, the module layout of Hugging Face ``modeling_llama.py``,
``modeling_gpt2.py``, ``modeling_gpt_neox.py``, ``modeling_mixtral.py``, ``modeling_qwen2_moe.py``,
``modeling_gemma2.py``)::

    attention        = h·(a·d) + 2·h·(k·d) + (a·d)·h               q, k, v, o weights
                     + [qkv_bias]·(a·d + 2·k·d) + [attn_out_bias]·h
                     + [qk_norm]·(n(d) + n(d))      per head (Qwen3), or n(a·d) + n(k·d) (OLMo 2)
                     + [attention_sinks]·a          one sink logit per head (gpt-oss)
    attention (MLA)  = h·r_q + r_q·a·(d_n+d_r) + h·(r_kv+d_r) + r_kv·a·(d_n+d_v) + a·d_v·h
                     + n(r_q) + n(r_kv)             q_a, q_b, kv_a, kv_b, o; q_a_layernorm, kv_a_layernorm
                                                    (r_q = 0: h·a·(d_n+d_r) and no n(r_q))
    attention_norms  = n(h) · (2 if post_norms else 1)
    mlp (width w)    = m·h·w + [mlp_bias]·(g·w + h)    m = 3, g = 2 gated (SwiGLU/GeGLU); m = 2, g = 1 else
    mlp_norms        = n(h) · (2 if post_norms else 1)
    moe_router       = h·E + [router_bias]·E
    moe_experts      = E · mlp(fe)
    moe_shared       = S · mlp(fs) + [shared_expert_gate]·h

Whole model::

    total = V·e (embedding) + [learned]·(s + o)·h + [untied]·V·e (lm_head) + [final norm]·n(h)
          + [e ≠ h]·2·e·h (project_in, project_out)
          + Σ_layers (attention + norms) + Σ_dense layers mlp(f) + Σ_MoE layers (router + experts + shared)

with e the embedding width (``embed_width``: h unless projected, OPT-350M's 512) and o the
position table's extra rows (OPT: 2). facebook/opt-350m: 331,196,416 (tests/test_models.py).

For GPT-style models (LayerNorm, biases everywhere, MLP 4h, tied, learned positions) this is
Narayanan et al. 2021 Eq. 2, ``P = 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))``, plus the final
LayerNorm (2h) that Eq. 2 leaves out.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

from trainplan.errors import ModelError
from trainplan.models.spec import ModelSpec, Norm

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "LINEAR_MODULES",
    "LinearShape",
    "ParamCounts",
    "count_params",
    "layer_params",
    "linear_shapes",
    "lora_params",
    "norm_params",
]


def norm_params(norm: Norm, features: int) -> int:
    """Parameters of one norm over ``features``: LayerNorm weight + bias (2x), RMSNorm weight (x).

    Sources: ``torch.nn.LayerNorm`` (elementwise_affine, bias=True); ``LlamaRMSNorm`` (weight only).
    Gemma's RMSNorm stores ``w`` and scales by ``1 + w``: still x parameters.
    """
    return 2 * features if norm == "layernorm" else features


def _mlp(spec: ModelSpec, width: int) -> int:
    """One MLP of inner width ``width``: gate/up/down for gated activations, fc1/fc2 otherwise.

    Gated (``LlamaMLP``): ``gate_proj`` h→w, ``up_proj`` h→w, ``down_proj`` w→h: 3·h·w.
    Plain (``GPT2MLP`` c_fc/c_proj, ``GPTNeoXMLP``): 2·h·w, plus biases w + h when ``mlp_bias``.
    """
    h = spec.hidden_size
    n_in = 2 if spec.gated else 1
    weights = (n_in + 1) * h * width
    bias = (n_in * width + h) if spec.mlp_bias else 0
    return weights + bias


def _attention(spec: ModelSpec) -> int:
    """q, k, v, o projections of one layer, their biases, and q/k norms.

    ``LlamaAttention``: q h→a·d, k and v h→k·d, o a·d→h. Qwen2 sets bias on q, k, v only
    (``qkv_bias``); GPT-2 and GPT-NeoX also on the output projection (``attn_out_bias``).
    Qwen3 normalises each head of q and k (``q_norm``/``k_norm`` over d); OLMo 2 normalises
    the whole projection (over a·d and k·d) — ``modeling_olmo2.py``. gpt-oss adds one sink logit
    per head (``GptOssAttention.sinks``, shape ``[num_attention_heads]``). Multi-head latent attention
    (``DeepseekV3Attention``): the matrices of ``spec.attention_projections`` and the two latent
    RMSNorms (``q_a_layernorm`` over r_q, ``kv_a_layernorm`` over r_kv), no bias
    (``attention_bias`` false in every DeepSeek-V2/V3 and Kimi K2 config).
    """
    if spec.mla is not None:
        return spec.attention_weights() + _mla_norm_params(spec)
    h, q, kv = spec.hidden_size, spec.q_dim, spec.kv_dim
    weights = h * q + 2 * h * kv + q * h
    bias = (q + 2 * kv if spec.qkv_bias else 0) + (h if spec.attn_out_bias else 0)
    if not spec.qk_norm:
        qk = 0
    elif spec.qk_norm_full_width:
        qk = norm_params(spec.norm, q) + norm_params(spec.norm, kv)
    else:
        qk = 2 * norm_params(spec.norm, spec.head_dim)
    return weights + bias + qk + (spec.num_heads if spec.attention_sinks else 0)


def _mla_norm_params(spec: ModelSpec) -> int:
    """The latent norms of one MLA block: n(r_q) (with query compression) + n(r_kv)."""
    mla = spec.mla
    if mla is None:
        return 0
    q = norm_params(spec.norm, mla.q_lora_rank) if mla.q_lora_rank else 0
    return q + norm_params(spec.norm, mla.kv_lora_rank)


def _sublayer_norms(spec: ModelSpec) -> int:
    """Norms around one sub-layer (attention or MLP): one pre-norm, two with Gemma 2's post-norms.

    ``Gemma2DecoderLayer`` has input/post_attention and pre/post_feedforward layernorms;
    ``LlamaDecoderLayer`` has input_layernorm and post_attention_layernorm (the pre-MLP norm).
    GPT-NeoX keeps both norms with the parallel residual, so ``parallel_attn_mlp`` changes nothing.
    """
    return norm_params(spec.norm, spec.hidden_size) * (2 if spec.post_norms else 1)


def _moe_parts(spec: ModelSpec) -> tuple[int, int, int, int]:
    """(router, all routed experts, one routed expert, shared experts + gate) of one MoE layer.

    ``MixtralSparseMoeBlock``: gate h→E (no bias), E experts of width fe.
    ``Qwen2MoeSparseMoeBlock``: adds ``shared_expert`` (width fs) and ``shared_expert_gate`` h→1.
    """
    moe = spec.moe
    if moe is None:
        return 0, 0, 0, 0
    h = spec.hidden_size
    router = h * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
    one_expert = _mlp(spec, moe.expert_ffn_hidden)
    shared = moe.num_shared_experts * _mlp(spec, moe.shared_width) + (h if moe.shared_expert_gate else 0)
    return router, moe.num_experts * one_expert, one_expert, shared


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Named parameter counts of a whole model (integers; layer terms summed over all layers).

    ``total`` is what ``sum(p.numel() for p in model.parameters())`` gives for the Hugging Face
    model (tied weights counted once). Non-persistent buffers (rotary ``inv_freq``) are not
    parameters and are not counted.
    """

    embedding: int  # V·e token embedding
    position_embedding: int  # (s + offset)·h, learned positions only (GPT-2, GPT-3, Megatron GPT, OPT)
    lm_head: int  # V·e, 0 when tied to the embedding
    final_norm: int  # n(h), 0 without a final norm (post-LN OPT-350M)
    attention: int  # q, k, v, o weights + biases + q/k norms, all layers
    attention_norms: int  # norm(s) of the attention sub-layer, all layers
    mlp_dense: int  # dense MLPs, dense layers only
    moe_router: int  # routers, all MoE layers
    moe_experts: int  # all routed experts, all MoE layers
    moe_experts_active: int  # routed experts a token passes through: top_k of num_experts per MoE layer
    moe_shared_experts: int  # shared experts (+ their gate), all MoE layers
    mlp_norms: int  # norm(s) of the MLP sub-layer, all layers
    num_dense_layers: int
    num_moe_layers: int
    embed_projection: int = 0  # project_in + project_out, 2·e·h when e ≠ h (OPT-350M)

    @property
    def num_layers(self) -> int:
        return self.num_dense_layers + self.num_moe_layers

    @property
    def total(self) -> int:
        """All parameters, tied embeddings counted once."""
        return (
            self.embedding
            + self.position_embedding
            + self.lm_head
            + self.final_norm
            + self.attention
            + self.attention_norms
            + self.mlp_dense
            + self.moe_router
            + self.moe_experts
            + self.moe_shared_experts
            + self.mlp_norms
            + self.embed_projection
        )

    @property
    def active(self) -> int:
        """Parameters one token uses: routed experts counted top_k/num_experts (Mixtral's "12.9B
        active" convention: embeddings, router and shared experts included)."""
        return self.total - self.moe_experts + self.moe_experts_active

    @property
    def non_embedding(self) -> int:
        """``total`` less token/position embeddings and an untied lm_head (Kaplan et al. 2020's N)."""
        return self.total - self.embedding - self.position_embedding - self.lm_head

    def per_layer_dense(self) -> int:
        """Parameters of one dense layer (attention + norms + dense MLP)."""
        if self.num_dense_layers == 0:
            raise ModelError("model", "has no dense layers (every layer is MoE); use per_layer_moe()")
        return self._per_layer_common() + self.mlp_dense // self.num_dense_layers

    def per_layer_moe(self) -> int:
        """Parameters of one MoE layer (attention + norms + router + all experts + shared experts)."""
        if self.num_moe_layers == 0:
            raise ModelError("model", "has no MoE layers; use per_layer_dense()")
        moe = self.moe_router + self.moe_experts + self.moe_shared_experts
        return self._per_layer_common() + moe // self.num_moe_layers

    def _per_layer_common(self) -> int:
        return (self.attention + self.attention_norms + self.mlp_norms) // self.num_layers

    def to_dict(self) -> dict[str, int]:
        """Every term plus ``total``, ``active`` and ``non_embedding``; stable keys."""
        out = {name: int(getattr(self, name)) for name in self.__dataclass_fields__}
        out.update(total=self.total, active=self.active, non_embedding=self.non_embedding)
        return out


@functools.lru_cache(maxsize=256)
def count_params(spec: ModelSpec) -> ParamCounts:
    """Exact parameter counts of ``spec`` (see the module docstring for each formula); the result
    is immutable and read by every cost family, so it is computed once per spec."""
    h, L = spec.hidden_size, spec.num_layers
    n_moe = spec.num_moe_layers
    n_dense = L - n_moe
    router, experts, one_expert, shared = _moe_parts(spec)
    top_k = spec.moe.top_k if spec.moe is not None else 0
    e = spec.embed_width
    return ParamCounts(
        embedding=spec.vocab_size * e,
        position_embedding=(spec.max_seq_len + spec.position_offset) * h if spec.position == "learned" else 0,
        lm_head=0 if spec.tied_embeddings else spec.vocab_size * e,
        final_norm=norm_params(spec.norm, h) if spec.final_norm else 0,
        embed_projection=2 * e * h if spec.embed_projected else 0,
        attention=L * _attention(spec),
        attention_norms=L * _sublayer_norms(spec),
        mlp_dense=n_dense * _mlp(spec, spec.ffn_hidden),
        moe_router=n_moe * router,
        moe_experts=n_moe * experts,
        moe_experts_active=n_moe * top_k * one_expert,
        moe_shared_experts=n_moe * shared,
        mlp_norms=L * _sublayer_norms(spec),
        num_dense_layers=n_dense,
        num_moe_layers=n_moe,
    )


def _check_layer(spec: ModelSpec, layer: int) -> None:
    if not 0 <= layer < spec.num_layers:
        raise ModelError("layer", f"layer index {layer} is outside 0..{spec.num_layers - 1} of {spec.name}")


def layer_params(spec: ModelSpec, layer: int) -> int:
    """Parameters of decoder layer ``layer`` (0-based): dense or MoE as ``spec`` places it."""
    _check_layer(spec, layer)
    common = _attention(spec) + 2 * _sublayer_norms(spec)
    if spec.is_moe_layer(layer):
        router, experts, _, shared = _moe_parts(spec)
        return common + router + experts + shared
    return common + _mlp(spec, spec.ffn_hidden)


class LinearShape(NamedTuple):
    """One weight matrix ``in_features → out_features`` (``torch.nn.Linear`` convention)."""

    module: str
    in_features: int
    out_features: int


def linear_shapes(spec: ModelSpec, layer: int) -> list[LinearShape]:
    """Every linear weight of decoder layer ``layer``, one entry per matrix (biases excluded).

    Module names: attention ``q k v o`` (MLA: ``q_a q_b kv_a kv_b o``, or ``q kv_a kv_b o`` without
    query compression; :attr:`ModelSpec.attention_projections`); dense MLP ``gate up down`` (``up down`` when not gated);
    MoE layer ``router``, then ``expert.gate expert.up expert.down`` once per routed expert,
    ``shared.gate shared.up shared.down`` once per shared expert, ``shared_gate`` (Qwen2-MoE's
    h→1 gate). Fused checkpoints (GPT-2 ``c_attn``, NeoX ``query_key_value``, Phi-3 ``qkv_proj``)
    are listed unfused: a LoRA of rank r costs r·(in + out) per listed matrix, which for a fused
    matrix differs (r·(h + q + 2kv) instead of Σ r·(h + out)); see :func:`lora_params`.
    """
    _check_layer(spec, layer)
    h = spec.hidden_size
    out = [LinearShape(p.name, p.n_in, p.n_out) for p in spec.attention_projections]

    def mlp(prefix: str, width: int) -> list[LinearShape]:
        up = [LinearShape(prefix + "gate", h, width)] if spec.gated else []
        return [*up, LinearShape(prefix + "up", h, width), LinearShape(prefix + "down", width, h)]

    moe = spec.moe
    if moe is not None and spec.is_moe_layer(layer):
        out.append(LinearShape("router", h, moe.num_experts))
        for _ in range(moe.num_experts):
            out.extend(mlp("expert.", moe.expert_ffn_hidden))
        for _ in range(moe.num_shared_experts):
            out.extend(mlp("shared.", moe.shared_width))
        if moe.shared_expert_gate:
            out.append(LinearShape("shared_gate", h, 1))
    else:
        out.extend(mlp("", spec.ffn_hidden))
    return out


DEFAULT_LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
MLA_MODULES: Final = ("q_a", "q_b", "kv_a", "kv_b")
"""The MLA projections (:class:`~trainplan.models.spec.MLASpec`), PEFT's ``q_a_proj``,
``q_b_proj``, ``kv_a_proj_with_mqa`` and ``kv_b_proj``."""
LINEAR_MODULES = (
    *DEFAULT_LORA_TARGETS,
    *MLA_MODULES,
    "router",
    "expert.gate",
    "expert.up",
    "expert.down",
    "shared.gate",
    "shared.up",
    "shared.down",
    "shared_gate",
)


def lora_modules(spec: ModelSpec, targets: Iterable[str]) -> tuple[str, ...]:
    """The module names LoRA ``targets`` adapt in ``spec``. Without MLA, the targets themselves.
    With MLA, ``q`` names the projections that make the query (``q_a`` and ``q_b``, or ``q``), and
    ``k`` or ``v`` the two that make keys and values together (``kv_a``: the latent and the rotary
    key; ``kv_b``: k_n and v): PEFT's ``q_a_proj``, ``q_b_proj``, ``kv_a_proj_with_mqa``,
    ``kv_b_proj`` on transformers ``DeepseekV3Attention``."""
    names = list(targets)
    if spec.mla is None:
        return tuple(names)
    out: list[str] = []
    for t in names:
        if t == "q":
            out += ["q_a", "q_b"] if spec.mla.q_lora_rank else ["q"]
        elif t in ("k", "v"):
            out += ["kv_a", "kv_b"]
        else:
            out.append(t)
    return tuple(dict.fromkeys(out))


def lora_params(spec: ModelSpec, *, rank: int, targets: Iterable[str] = DEFAULT_LORA_TARGETS) -> int:
    """Parameters of LoRA adapters of rank r on every matrix whose module name is in ``targets``.

    Each adapted W (in→out) gets A (in→r) and B (r→out): r·(in + out) parameters
    (Hu et al. 2021, Sec. 4; PEFT ``LoraLayer``). Module names as in :func:`linear_shapes`;
    "expert.*" must be named to adapt routed experts. Names the model lacks (``gate`` on an
    all-MoE model) adapt nothing, as in PEFT, but at least one matrix must match.
    """
    if rank <= 0:
        raise ModelError("lora_rank", f"must be a positive integer, got {rank}")
    wanted = set(targets)
    unknown = sorted(wanted - set(LINEAR_MODULES))
    if unknown:
        raise ModelError(
            "lora_targets", f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(LINEAR_MODULES)}"
        )
    wanted = set(lora_modules(spec, wanted))
    total = sum(
        rank * (s.in_features + s.out_features)
        for i in range(spec.num_layers)
        for s in linear_shapes(spec, i)
        if s.module in wanted
    )
    if total == 0:
        raise ModelError("lora_targets", f"{', '.join(sorted(wanted))} match no matrix of {spec.name}")
    return total


# Families whose reference implementation fuses the q, k, v projections into one weight (and one
# bias): GPT-2 ``c_attn`` (``modeling_gpt2.py``), GPT-NeoX ``query_key_value``
# (``modeling_gpt_neox.py``), Megatron-LM ``ParallelAttention.query_key_value``
# (``megatron/model/transformer.py``), Phi-3 ``qkv_proj`` (``modeling_phi3.py``).
FUSED_QKV_FAMILIES: Final = frozenset({"gpt2", "gpt_neox", "megatron", "phi3"})


def _norm_tensors(spec: ModelSpec) -> int:
    """Tensors of one norm: LayerNorm weight + bias, RMSNorm weight (see :func:`norm_params`)."""
    return 2 if spec.norm == "layernorm" else 1


def _mlp_tensors(spec: ModelSpec) -> int:
    """Weights (gate, up, down or fc1, fc2) and, with ``mlp_bias``, one bias each."""
    n = 3 if spec.gated else 2
    return 2 * n if spec.mlp_bias else n


def layer_parameter_tensors(spec: ModelSpec, layer: int) -> int:
    """Number of parameter tensors (``len(list(layer.parameters()))``) of decoder layer ``layer``.

    A ZeRO-3 implementation that gathers parameter by parameter issues one collective per tensor
    (see ``comm.data_parallel_collectives``). Attention: q, k, v (one fused weight in
    :data:`FUSED_QKV_FAMILIES`), o, their biases (``qkv_bias``, ``attn_out_bias``) and the q/k
    norms; the sub-layer norms (:func:`_sublayer_norms`); the MLP (:func:`_mlp_tensors`), or for an
    MoE layer the router (+ bias), every routed expert's MLP, the shared experts and their gate.
    Megatron GPT example: qkv w+b, proj w+b, 2 LayerNorms w+b, fc1 w+b, fc2 w+b = 12.
    """
    _check_layer(spec, layer)
    fused = spec.family in FUSED_QKV_FAMILIES
    qkv = 1 if fused else 3
    attn = qkv + 1 + (qkv if spec.qkv_bias else 0) + (1 if spec.attn_out_bias else 0)
    attn += 2 * _norm_tensors(spec) if spec.qk_norm else 0
    attn += 1 if spec.attention_sinks else 0
    if spec.mla is not None:  # the projection weights and the latent norms (no qkv bias, no q/k norm)
        latent_norms = 1 + (1 if spec.mla.q_lora_rank else 0)
        attn = len(spec.attention_projections) + latent_norms * _norm_tensors(spec)
        attn += 1 if spec.attn_out_bias else 0
    norms = 2 * (2 if spec.post_norms else 1) * _norm_tensors(spec)
    moe = spec.moe
    if moe is not None and spec.is_moe_layer(layer):
        ffn = (2 if moe.router_bias else 1) + moe.num_experts * _mlp_tensors(spec)
        ffn += moe.num_shared_experts * _mlp_tensors(spec) + (1 if moe.shared_expert_gate else 0)
    else:
        ffn = _mlp_tensors(spec)
    return attn + norms + ffn


def layer_vector_tensors(spec: ModelSpec, layer: int) -> tuple[int, int]:
    """(tensors, elements) of the one-dimensional parameters of decoder layer ``layer``: its
    biases and norm weights (and an MoE shared-expert gate, a 1 × h weight), unsharded.

    A per-parameter ZeRO-3 gathers each of them in a collective of its own; they are a few
    kilobytes each, latency-bound (``comm.data_parallel_traffic``). Counted as
    :func:`layer_parameter_tensors` counts them: Megatron GPT has 8 (qkv, proj, fc1, fc2 biases,
    two LayerNorms' weight and bias) of its 12 tensors."""
    _check_layer(spec, layer)
    h = spec.hidden_size
    fused = spec.family in FUSED_QKV_FAMILIES
    count = elements = 0
    if spec.qkv_bias:
        count += 1 if fused else 3
        elements += spec.q_dim + 2 * spec.kv_dim
    if spec.attn_out_bias:
        count, elements = count + 1, elements + h
    if spec.qk_norm:
        count += 2 * _norm_tensors(spec)
        if spec.qk_norm_full_width:
            elements += norm_params(spec.norm, spec.q_dim) + norm_params(spec.norm, spec.kv_dim)
        else:
            elements += 2 * norm_params(spec.norm, spec.head_dim)
    if spec.attention_sinks:
        count, elements = count + 1, elements + spec.num_heads
    if spec.mla is not None:
        count += (1 + (1 if spec.mla.q_lora_rank else 0)) * _norm_tensors(spec)
        elements += _mla_norm_params(spec)
    count += 2 * (2 if spec.post_norms else 1) * _norm_tensors(spec)
    elements += 2 * _sublayer_norms(spec)
    n_mlp = 3 if spec.gated else 2
    moe = spec.moe
    if moe is not None and spec.is_moe_layer(layer):
        if moe.router_bias:
            count, elements = count + 1, elements + moe.num_experts
        if spec.mlp_bias:
            count += (moe.num_experts + moe.num_shared_experts) * n_mlp
            elements += moe.num_experts * ((n_mlp - 1) * moe.expert_ffn_hidden + h)
            elements += moe.num_shared_experts * ((n_mlp - 1) * moe.shared_width + h)
        if moe.shared_expert_gate:
            count, elements = count + 1, elements + h
    elif spec.mlp_bias:
        count += n_mlp
        elements += (n_mlp - 1) * spec.ffn_hidden + h
    return count, elements


def root_vector_tensors(spec: ModelSpec) -> tuple[int, int]:
    """(tensors, elements) of the one-dimensional parameters outside the layers: the final norm."""
    return _norm_tensors(spec), norm_params(spec.norm, spec.hidden_size)


def root_parameter_tensors(spec: ModelSpec) -> int:
    """Parameter tensors outside the decoder layers: token embedding, learned positions, final norm,
    an untied LM head and OPT-350M's ``project_in`` / ``project_out``."""
    return (
        1
        + (1 if spec.position == "learned" else 0)
        + (_norm_tensors(spec) if spec.final_norm else 0)
        + (0 if spec.tied_embeddings else 1)
        + (2 if spec.embed_projected else 0)
    )
