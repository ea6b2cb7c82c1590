"""The transformer architecture type.

One frozen, validated dataclass describes every decoder-only model trainplan knows: dense
(GPT-2, Llama, Mistral, Qwen, Gemma), MoE (Mixtral, Qwen-MoE, DeepSeek-style shared experts) and
multi-head latent attention (DeepSeek-V2/V3, Kimi K2). Shapes use the notation of the docs:

    L  num_layers          h  hidden_size        a  num_heads
    k  num_kv_heads        d  head_dim           f  ffn_hidden (dense MLP width)
    V  vocab_size          E  moe.num_experts    K  moe.top_k
    r_q, r_kv  mla.q_lora_rank, mla.kv_lora_rank   d_n, d_r, d_v  mla.qk_nope/qk_rope/v_head_dim
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

from trainplan.errors import ModelError
from trainplan.limits import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH, check_int

Activation = Literal["gelu", "swiglu", "geglu", "relu"]
Norm = Literal["layernorm", "rmsnorm"]
Position = Literal["rope", "learned", "alibi", "none"]


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts feed-forward, replacing the dense MLP on the MoE layers.

    A layer ``i`` is an MoE layer when ``i >= first_dense_layers`` and
    ``(i - first_dense_layers) % layer_freq == 0``; other layers use the dense MLP of width
    ``ModelSpec.ffn_hidden``.
    """

    num_experts: int
    top_k: int
    expert_ffn_hidden: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden: int = 0  # width of each shared expert; 0 = expert_ffn_hidden
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate (h -> 1) on the shared expert
    first_dense_layers: int = 0
    layer_freq: int = 1
    router_bias: bool = False

    def __post_init__(self) -> None:
        for name, high in (
            ("num_experts", MAX_EXPERTS),
            ("top_k", MAX_EXPERTS),
            ("expert_ffn_hidden", MAX_WIDTH),
            ("layer_freq", MAX_LAYERS),
        ):
            check_int(f"moe.{name}", getattr(self, name), high=high, error=ModelError)
        for name, high in (
            ("num_shared_experts", MAX_EXPERTS),
            ("shared_expert_ffn_hidden", MAX_WIDTH),
            ("first_dense_layers", MAX_LAYERS),
        ):
            check_int(f"moe.{name}", getattr(self, name), low=0, high=high, error=ModelError)
        for name in ("shared_expert_gate", "router_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ModelError(f"moe.{name}", f"must be true or false, got {getattr(self, name)!r}")
        if self.top_k > self.num_experts:
            raise ModelError(
                "moe.top_k", f"top_k={self.top_k} exceeds num_experts={self.num_experts}; lower top_k"
            )

    @property
    def shared_width(self) -> int:
        return self.shared_expert_ffn_hidden or self.expert_ffn_hidden


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (MLA) in place of the q, k, v projections.

    DeepSeek-V2 (DeepSeek-AI 2024, arXiv:2405.04434, Sec. 2.1.2-2.1.3, Eqs. 9-19); the shapes of
    transformers ``models/deepseek_v3/modeling_deepseek_v3.py`` ``DeepseekV3Attention`` and
    Megatron-LM ``megatron/core/transformer/multi_latent_attention.py`` ``MLASelfAttention``. Per
    token x (width h):

        c_q  = norm(W_qa · x)            r_q wide      (q_lora_rank 0: q = W_q · x directly)
        q    = W_qb · c_q                a·(d_n + d_r)
        [c_kv, k_r] = W_kva · x          r_kv + d_r    (k_r: one rotary key shared by all heads)
        [k_n, v] = W_kvb · norm(c_kv)    a·(d_n + d_v)
        o    = W_o · attention(q, [k_n, k_r], v)       a·d_v → h

    Each head attends with queries and keys d_n + d_r wide (``ModelSpec.head_dim``) and values
    d_v wide. The down projections W_qa and W_kva are not split by tensor parallelism
    (Megatron-Core builds them ``parallel_mode="duplicated"``).
    """

    q_lora_rank: int  # r_q; 0: the query is projected from x without compression (DeepSeek-V2-Lite)
    kv_lora_rank: int  # r_kv
    qk_nope_head_dim: int  # d_n
    qk_rope_head_dim: int  # d_r
    v_head_dim: int  # d_v

    def __post_init__(self) -> None:
        check_int("mla.q_lora_rank", self.q_lora_rank, low=0, high=MAX_WIDTH, error=ModelError)
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            check_int(f"mla.{name}", getattr(self, name), high=MAX_WIDTH, error=ModelError)

    @property
    def qk_head_dim(self) -> int:
        """d_n + d_r: the width of each head's query and key."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


MTP_NOTE = "multi-token-prediction module"
"""The words that mark :meth:`ModelSpec.with_mtp`'s entry among a spec's approximations."""


@dataclass(frozen=True)
class Projection:
    """One attention weight matrix ``n_in → n_out``. ``split``: how Megatron tensor parallelism
    splits it: ``column`` (output dim), ``row`` (input dim) or ``replicated`` (every rank holds
    and applies all of it: MLA's down projections)."""

    name: str
    n_in: int
    n_out: int
    split: Literal["column", "row", "replicated"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Every field is explicit: nothing is guessed from ratios."""

    name: str
    family: str  # "llama", "gpt2", "mistral", "qwen2", "gemma2", "gpt_neox", "mixtral", ...
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab_size: int
    activation: Activation = "swiglu"
    norm: Norm = "rmsnorm"
    position: Position = "rope"
    tied_embeddings: bool = False
    max_seq_len: int = 4096  # positions the model was trained for (sizes learned position tables)
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm on q and k (Qwen3: per head, weights of size head_dim; OLMo 2: see below)
    qk_norm_full_width: bool = False  # OLMo 2: one norm over all heads, weights a·d (q) and k·d (k)
    post_norms: bool = False  # Gemma 2: extra norm after attention and after the MLP
    parallel_attn_mlp: bool = False  # GPT-NeoX / GPT-J: attention and MLP read the same input
    embed_dim: int = 0
    """Width of the token embedding (and of the LM head tied to it) when it differs from
    ``hidden_size``; 0: the hidden size. OPT-350M (``word_embed_proj_dim`` 512, hidden 1024): the
    embedding output goes through ``project_in`` (e→h) and the last hidden state through
    ``project_out`` (h→e) before the head, two bias-free matrices (transformers
    ``modeling_opt.py`` ``OPTDecoder``)."""
    final_norm: bool = True
    """A norm after the last layer (pre-LN decoders). OPT-350M is post-LN
    (``do_layer_norm_before=false``) and has none (``OPTDecoder.final_layer_norm`` is ``None``)."""
    position_offset: int = 0
    """Rows of a learned position table beyond ``max_seq_len`` (OPT: 2,
    ``OPTLearnedPositionalEmbedding`` offsets positions by 2)."""
    moe: MoESpec | None = None
    mtp_layers: int = 0
    """Of ``num_layers``, the last ``mtp_layers`` are multi-token-prediction modules that training
    adds (:meth:`with_mtp`; ``Recipe.mtp_layers``). 0 for every preset and config.json."""
    mla: MLASpec | None = None
    """Multi-head latent attention (:class:`MLASpec`); then ``num_kv_heads`` = ``num_heads`` and
    ``head_dim`` = d_n + d_r, the query/key width of a head."""
    attention_window: int = 0
    """Sliding-window (local) attention: each query attends to the last ``attention_window`` keys
    (itself included) instead of all earlier ones, on the local layers (:meth:`is_local_layer`);
    0: every layer attends to the whole causal prefix. Mistral-7B-v0.1 and Phi-3 (every layer),
    Gemma 2 and gpt-oss (every other), Gemma 3 (five of six)."""
    global_every: int = 0
    """With ``attention_window``: every ``global_every``-th layer (1-based) attends globally, the
    others locally (Gemma 2 ``is_sliding = not layer_idx % 2``: 2; Gemma 3
    ``sliding_window_pattern``: 6); 0: every layer is local."""
    attention_sinks: bool = False
    """A learned sink logit per head (gpt-oss, ``GptOssAttention.sinks``: one parameter per query
    head, a column the softmax normalises over and no value reads): ``num_heads`` parameters per
    layer, no GEMM work."""
    source: str = ""  # where the architecture came from (config URL, paper table)
    notes: tuple[str, ...] = field(default_factory=tuple)
    approximations: tuple[str, ...] = field(default_factory=tuple)
    """What the cost model approximates for this architecture (sliding-window or banded attention
    costed as full causal attention, soft-capping not costed): every estimate of the model carries
    these among its notes, so an approximate answer says so where it is read."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.family, str):
            raise ModelError("name", f"name and family must be strings, got {self.name!r}, {self.family!r}")
        for name, high in (
            ("num_layers", MAX_LAYERS),
            ("hidden_size", MAX_WIDTH),
            ("num_heads", MAX_HEADS),
            ("num_kv_heads", MAX_HEADS),
            ("head_dim", MAX_WIDTH),
            ("vocab_size", MAX_VOCAB),
            ("max_seq_len", MAX_SEQ_LEN),
        ):
            check_int(name, getattr(self, name), high=high, error=ModelError)
        check_int("ffn_hidden", self.ffn_hidden, low=0, high=MAX_WIDTH, error=ModelError)
        check_int("embed_dim", self.embed_dim, low=0, high=MAX_WIDTH, error=ModelError)
        check_int("position_offset", self.position_offset, low=0, high=MAX_SEQ_LEN, error=ModelError)
        if self.embed_dim == self.hidden_size:
            object.__setattr__(self, "embed_dim", 0)
        if self.position_offset and self.position != "learned":
            raise ModelError(
                "position_offset", "only a learned position table has rows; drop position_offset"
            )
        if self.moe is not None and not isinstance(self.moe, MoESpec):
            raise ModelError("moe", f"must be a MoESpec or None, got {self.moe!r}")
        if self.mla is not None:
            self._check_mla(self.mla)
        check_int("mtp_layers", self.mtp_layers, low=0, high=MAX_LAYERS, error=ModelError)
        check_int("attention_window", self.attention_window, low=0, high=MAX_SEQ_LEN, error=ModelError)
        check_int("global_every", self.global_every, low=0, high=MAX_LAYERS, error=ModelError)
        if self.global_every and not self.attention_window:
            raise ModelError(
                "global_every",
                "global_every names the global layers among local ones: it needs attention_window",
            )
        if self.mtp_layers >= self.num_layers:
            raise ModelError(
                "mtp_layers", f"{self.mtp_layers} MTP modules need more than {self.num_layers} layers"
            )
        for name in ("activation", "norm", "position"):
            choices = get_args({"activation": Activation, "norm": Norm, "position": Position}[name])
            if getattr(self, name) not in choices:
                raise ModelError(
                    name, f"unknown value {getattr(self, name)!r}; choose one of {', '.join(choices)}"
                )
        for name in (
            "tied_embeddings",
            "qkv_bias",
            "attn_out_bias",
            "mlp_bias",
            "qk_norm",
            "qk_norm_full_width",
            "post_norms",
            "parallel_attn_mlp",
            "final_norm",
            "attention_sinks",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ModelError(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in ("notes", "approximations"):
            value = getattr(self, name)
            if not isinstance(value, tuple | list) or not all(isinstance(n, str) for n in value):
                raise ModelError(name, f"must be a tuple of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.ffn_hidden == 0 and self.moe is None:
            raise ModelError("ffn_hidden", f"must be positive for a dense model, got {self.ffn_hidden}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ModelError(
                "num_kv_heads",
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}",
            )
        if self.qk_norm_full_width and not self.qk_norm:
            raise ModelError(
                "qk_norm_full_width", "only meaningful with qk_norm=true; set qk_norm=true or drop it"
            )
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ModelError(
                "moe.first_dense_layers",
                f"{self.moe.first_dense_layers} exceeds num_layers={self.num_layers}",
            )

    def _check_mla(self, mla: object) -> None:
        if not isinstance(mla, MLASpec):
            raise ModelError("mla", f"must be an MLASpec or None, got {mla!r}")
        if self.head_dim != mla.qk_head_dim:
            raise ModelError(
                "head_dim",
                f"with multi-head latent attention head_dim is the query/key width d_n + d_r = "
                f"{mla.qk_nope_head_dim} + {mla.qk_rope_head_dim} = {mla.qk_head_dim}, got {self.head_dim}",
            )
        if self.num_kv_heads != self.num_heads:
            raise ModelError(
                "num_kv_heads",
                f"multi-head latent attention expands keys and values to every head: num_kv_heads must "
                f"equal num_heads ({self.num_heads}), got {self.num_kv_heads}",
            )
        for name in ("qkv_bias", "qk_norm", "parallel_attn_mlp", "attention_sinks"):
            if getattr(self, name):
                raise ModelError(name, f"{name} with multi-head latent attention is not modelled; drop it")
        if self.position != "rope":
            raise ModelError(
                "position", "multi-head latent attention carries its position in a rotary key: use rope"
            )

    def __hash__(self) -> int:
        """The dataclass field hash, computed once: every cached cost function keys on the spec."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(tuple(getattr(self, f.name) for f in fields(self)))
        return int(h)

    def __getstate__(self) -> dict[str, object]:
        """Pickle without the cached hash (string hashes differ between processes)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # -- derived shapes -------------------------------------------------------------------
    @property
    def embed_width(self) -> int:
        """e: width of the token embedding and the (tied) LM head; ``hidden_size`` unless projected."""
        return self.embed_dim or self.hidden_size

    @property
    def embed_projected(self) -> bool:
        """Whether ``project_in`` / ``project_out`` map the embedding width to the hidden size."""
        return self.embed_dim != 0

    @property
    def q_dim(self) -> int:
        """a·d: width of the query projection output."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """k·d: width of the key projection output (and of the value's, without MLA: :attr:`v_dim`)."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_head_dim(self) -> int:
        """Width of one head's value: d, or d_v with MLA."""
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @property
    def v_dim(self) -> int:
        """k·d (a·d_v with MLA): width of the values attention reads."""
        return self.num_kv_heads * self.v_head_dim

    @property
    def attn_out_dim(self) -> int:
        """a·d (a·d_v with MLA): width of the attention output, the output projection's input."""
        return self.num_heads * self.v_head_dim

    @functools.cached_property
    def attention_projections(self) -> tuple[Projection, ...]:
        """The weight matrices of one attention block, in forward order (biases aside).

        Multi/grouped-query: q h→a·d, k and v h→k·d (column-parallel), o a·d→h (row-parallel)
        (transformers ``LlamaAttention``). MLA (:class:`MLASpec`): q_a h→r_q and kv_a h→r_kv+d_r
        (replicated), q_b r_q→a·(d_n+d_r) (or q h→a·(d_n+d_r) without query compression) and kv_b
        r_kv→a·(d_n+d_v) (column-parallel), o a·d_v→h (row-parallel)."""
        h, mla = self.hidden_size, self.mla
        if mla is None:
            return (
                Projection("q", h, self.q_dim, "column"),
                Projection("k", h, self.kv_dim, "column"),
                Projection("v", h, self.kv_dim, "column"),
                Projection("o", self.q_dim, h, "row"),
            )
        a = self.num_heads
        q: tuple[Projection, ...] = (
            (
                Projection("q_a", h, mla.q_lora_rank, "replicated"),
                Projection("q_b", mla.q_lora_rank, a * mla.qk_head_dim, "column"),
            )
            if mla.q_lora_rank
            else (Projection("q", h, a * mla.qk_head_dim, "column"),)
        )
        return (
            *q,
            Projection("kv_a", h, mla.kv_lora_rank + mla.qk_rope_head_dim, "replicated"),
            Projection("kv_b", mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim), "column"),
            Projection("o", self.attn_out_dim, h, "row"),
        )

    def attention_weights(self, split: str | None = None) -> int:
        """Σ n_in·n_out of :attr:`attention_projections` (of one ``split`` kind, or all)."""
        return self._attention_weight_sums[split]

    @functools.cached_property
    def _attention_weight_sums(self) -> dict[str | None, int]:
        sums: dict[str | None, int] = {None: 0, "column": 0, "row": 0, "replicated": 0}
        for p in self.attention_projections:
            sums[None] += p.n_in * p.n_out
            sums[p.split] += p.n_in * p.n_out
        return sums

    @property
    def gated(self) -> bool:
        """SwiGLU / GeGLU MLPs have three matrices (gate, up, down) instead of two."""
        return self.activation in ("swiglu", "geglu")

    @property
    def num_local_layers(self) -> int:
        """Layers that attend through the sliding window (:meth:`is_local_layer`): every layer, or
        all but every ``global_every``-th; 0 without a window."""
        if not self.attention_window:
            return 0
        return self.num_layers - (self.num_layers // self.global_every if self.global_every else 0)

    def is_local_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends through the sliding window
        (:attr:`attention_window`, :attr:`global_every`)."""
        if not self.attention_window:
            return False
        return not (self.global_every and (layer + 1) % self.global_every == 0)

    def is_moe_layer(self, layer: int) -> bool:
        if self.moe is None:
            return False
        rel = layer - self.moe.first_dense_layers
        return rel >= 0 and rel % self.moe.layer_freq == 0

    def with_mtp(self, depth: int) -> ModelSpec:
        """The model a run with ``depth`` multi-token-prediction modules trains (``Recipe.mtp_layers``).

        DeepSeek-V3 (arXiv:2412.19437, Sec. 2.2, Eqs. 21-25) and Megatron-Core
        (``megatron/core/transformer/multi_token_prediction.py``, ``MultiTokenPredictionLayer``):
        module k normalises the previous depth's hidden state and the embedding of token i + k,
        projects their concatenation 2h → h (``eh_proj``), runs one transformer block built like
        the decoder's layers, and feeds the shared output head and a loss of its own. Costed as
        ``depth`` more layers of the kind of the decoder's last layer, placed last (the last
        pipeline stage, where Megatron-Core puts the MTP block), with the extra LM-head passes,
        losses and ``eh_proj`` GEMMs in :func:`trainplan.flops.mtp_head` terms. Idempotent for
        the same depth; a depth of 0 is the model itself."""
        if depth == self.mtp_layers:
            return self
        if self.mtp_layers:
            raise ModelError(
                "mtp_layers",
                f"{self.name} already carries {self.mtp_layers} MTP module(s); start from the model",
            )
        last = self.num_layers - 1
        if any(self.is_moe_layer(last + k) != self.is_moe_layer(last) for k in range(1, depth + 1)):
            raise ModelError(
                "mtp_layers",
                f"{self.name}'s layer pattern would make an MTP block of another kind than its last layer; "
                "MTP is modelled for models whose last layers are all dense or all MoE",
            )
        note = (
            f"{self.name}: {depth} {MTP_NOTE}(s) costed as {depth} more "
            f"{'MoE' if self.is_moe_layer(last) else 'dense'} layer(s) on the last pipeline stage with "
            f"{depth} more LM-head pass(es) and loss(es); the eh_proj GEMM (2h→h) is in the FLOPs, its "
            f"{2 * self.hidden_size**2 * depth:,} weights and the three RMSNorms per module are not in memory"
        )
        return dataclasses.replace(
            self,
            num_layers=self.num_layers + depth,
            mtp_layers=depth,
            approximations=(*self.approximations, note),
        )

    def decoder(self) -> ModelSpec:
        """The model without the MTP modules :meth:`with_mtp` added (itself when there are none):
        what a launch configuration describes as the model, beside its MTP depth."""
        if not self.mtp_layers:
            return self
        return dataclasses.replace(
            self,
            num_layers=self.num_layers - self.mtp_layers,
            mtp_layers=0,
            approximations=tuple(a for a in self.approximations if MTP_NOTE not in a),
        )

    @functools.cached_property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers
