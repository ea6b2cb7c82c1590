"""Parameters held by one device: the model split by pipeline stage, tensor and expert parallelism.

Megatron-LM's split (Shoeybi et al. 2019, Sec. 3; Narayanan et al. 2021, Sec. 2.3):

* column-parallel linears (q, k, v, MLP gate/up) shard their output features over ``tp``;
  row-parallel linears (attention out, MLP down) shard their input features; the row-parallel
  bias is added after the all-reduce and so is replicated;
* multi-head latent attention: the down projections (q_a, kv_a) and the latent norms are
  replicated, the up projections column-parallel and o row-parallel (Megatron-Core
  ``MLASelfAttention``: ``linear_q_down_proj`` / ``linear_kv_down_proj`` are ``TELinear`` with
  ``parallel_mode="duplicated"``);
* key/value heads: with ``tp <= k`` each rank holds ``k/tp`` heads; with ``tp > k`` each rank
  holds one replicated kv head (Megatron-LM ``num_query_groups < tp`` case);
* norms, the router and learned position embeddings are replicated on every tp rank;
* the embedding and the untied LM head are vocab-parallel (``V/tp`` rows each);
* routed experts are split over ``ep`` ranks and each expert's linears over ``tp``
  (Megatron-LM's default expert-tensor-parallel size = tp), or over ``etp`` = 1 under parallel
  folding (``Layout.etp``: whole experts per rank);
* pipeline stages take contiguous layer ranges, earlier stages taking the remainder; the
  embedding lives on the first stage, the final norm and LM head on the last (a tied LM head
  keeps its own copy of the embedding on the last stage when ``pp > 1``, as Megatron-LM does).

Parameter *totals* are counted independently in ``models/params.py``; tests check that the
per-device counts here, summed over the tp/ep/pp ranks, give back those totals.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from trainplan.layout import Layout
from trainplan.models.params import lora_modules
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LoRASpec


@dataclass(frozen=True, kw_only=True)
class Linear:
    """One linear layer as seen by one tp rank: ``name``, full (in, out) and the split kind."""

    name: str  # q, k, v, o, gate, up, down (expert.* / shared.* for MoE)
    in_features: int
    out_features: int
    split: str  # "column", "row" or "replicated"
    tp: int
    count: int = 1  # how many identical copies this rank holds (local experts)

    @property
    def local_weight_params(self) -> int:
        if self.split == "column":
            return self.count * self.in_features * (self.out_features // self.tp)
        if self.split == "row":
            return self.count * (self.in_features // self.tp) * self.out_features
        return self.count * self.in_features * self.out_features

    def lora_params(self, rank: int) -> int:
        """A (r × in) and B (out × r) on this tp rank (Hu et al. 2021, Sec. 4.1)."""
        if self.split == "column":
            per = rank * self.in_features + rank * (self.out_features // self.tp)
        elif self.split == "row":
            per = rank * (self.in_features // self.tp) + rank * self.out_features
        else:
            per = rank * (self.in_features + self.out_features)
        return self.count * per


@dataclass(frozen=True, kw_only=True)
class DeviceParams:
    """Parameter counts held by one device of one pipeline stage (elements, not bytes).

    ``dense_*`` are parameters sharded over the dp·cp ZeRO group; ``expert_*`` are routed-expert
    parameters, sharded over the expert-data-parallel group dp·cp/ep.
    """

    stage: int
    layers: tuple[int, ...]
    dense_linear: int  # linear weights (quantizable for QLoRA)
    dense_other: int  # embeddings, norms, biases, router, positions
    expert_linear: int
    lora_adapters: int  # adapter parameters on this device (0 unless LoRA)
    expert_other: int = 0  # the routed experts' biases (gpt-oss): expert-parallel, not quantized
    largest_layer_unsharded: int  # biggest transformer layer on this device, before ZeRO-3 sharding
    largest_layer_adapters: int = 0  # LoRA adapters of that layer (not in largest_layer_unsharded)
    root_params: int = (
        0  # FSDP root unit: embedding (+ learned positions) on stage 0, final norm + LM head last
    )
    head_params: int = (
        0  # final norm + LM head (last stage; one V/t·h shared with the embedding when tied, pp = 1)
    )
    input_embedding_params: int = 0
    """The vocabulary-parallel input embedding (V/t·h) when it is a parameter of its own on this
    device (stage 0, untied or pp > 1); 0 elsewhere and when the LM head is the same tensor."""
    linears: tuple[tuple[Linear, int], ...]  # (linear, how many of the device's layers have it)

    @property
    def total(self) -> int:
        return self.dense_linear + self.dense_other + self.expert_linear + self.expert_other

    @property
    def expert(self) -> int:
        """The routed experts' parameters: weights and biases."""
        return self.expert_linear + self.expert_other

    @property
    def dense(self) -> int:
        return self.dense_linear + self.dense_other


def stage_layers(model: ModelSpec, layout: Layout, stage: int) -> tuple[int, ...]:
    """The layers of pipeline ``stage``: ``layout.stage_layers`` (:func:`trainplan.layout.stage_layers`,
    the assignment FLOPs and timing read too)."""
    return layout.stage_layers(model.num_layers)[stage]


def layer_kinds(model: ModelSpec, layers: tuple[int, ...]) -> list[tuple[int, int]]:
    """(representative layer, count) for each kind of layer (dense, MoE) among ``layers``.

    All layers of one kind have the same shapes, so costs are computed once per kind.
    """
    if model.moe is None:
        return [(layers[0], len(layers))] if layers else []
    out = []
    for is_moe in (False, True):
        members = [i for i in layers if model.is_moe_layer(i) == is_moe]
        if members:
            out.append((members[0], len(members)))
    return out


def _kv_out(model: ModelSpec, tp: int) -> tuple[int, int]:
    """(full kv width, kv width per rank ×tp) so that ``out // tp`` gives the per-rank width."""
    if model.num_kv_heads % tp == 0:
        return model.kv_dim, model.kv_dim
    # tp > k: every rank holds one replicated kv head of width d.
    return model.kv_dim, model.head_dim * tp


def layer_linears(model: ModelSpec, layer: int, tp: int, ep: int, etp: int | None = None) -> list[Linear]:
    """The linears of transformer layer ``layer`` on one tp rank of one ep rank; the routed
    experts' split over ``etp`` ranks (None: tp, Megatron-Core's default)."""
    etp = tp if etp is None else etp
    h, qd = model.hidden_size, model.q_dim
    _, kv_cols = _kv_out(model, tp)
    out: list[Linear]
    if model.mla is None:
        out = [
            Linear(name="q", in_features=h, out_features=qd, split="column", tp=tp),
            Linear(name="k", in_features=h, out_features=kv_cols, split="column", tp=tp),
            Linear(name="v", in_features=h, out_features=kv_cols, split="column", tp=tp),
            Linear(name="o", in_features=qd, out_features=h, split="row", tp=tp),
        ]
    else:  # MLA: the down projections replicated, the up projections and o split
        out = [
            Linear(name=p.name, in_features=p.n_in, out_features=p.n_out, split=p.split, tp=tp)
            for p in model.attention_projections
        ]

    def mlp(prefix: str, width: int, count: int, split_over: int = tp) -> list[Linear]:
        names = ("gate", "up", "down") if model.gated else ("up", "down")
        return [
            Linear(
                name=prefix + n,
                in_features=width if n == "down" else h,
                out_features=h if n == "down" else width,
                split="row" if n == "down" else "column",
                tp=split_over,
                count=count,
            )
            for n in names
        ]

    if model.is_moe_layer(layer):
        assert model.moe is not None
        out += mlp("expert.", model.moe.expert_ffn_hidden, model.moe.num_experts // ep, etp)
        if model.moe.num_shared_experts:
            out += mlp("shared.", model.moe.shared_width, model.moe.num_shared_experts)
    else:
        out += mlp("", model.ffn_hidden, 1)
    return out


def _norm_params(model: ModelSpec) -> int:
    return model.hidden_size * (2 if model.norm == "layernorm" else 1)


def _mlp_bias_params(model: ModelSpec, width: int, split: int) -> int:
    """Biases of one MLP of inner width ``width`` on one of ``split`` ranks: the gate/up (or fc1)
    bias split with its columns, the down (fc2) bias of h whole."""
    return (2 if model.gated else 1) * width // split + model.hidden_size


def layer_other_params(model: ModelSpec, layer: int, tp: int) -> int:
    """Norms, biases, qk-norm and router of one layer on one tp rank."""
    h = model.hidden_size
    norms = 2 * (2 if model.post_norms else 1)
    n = norms * _norm_params(model)
    _, kv_cols = _kv_out(model, tp)
    if model.qkv_bias:
        n += model.q_dim // tp + 2 * (kv_cols // tp)
    if model.attn_out_bias:
        n += h
    if model.qk_norm and model.qk_norm_full_width:
        n += model.q_dim // tp + kv_cols // tp  # OLMo 2: norm over the whole (sharded) projection
    elif model.qk_norm:
        n += 2 * model.head_dim
    if model.attention_sinks:
        n += model.num_heads // tp  # one per query head: split with the heads
    if model.mla is not None:  # the latent RMSNorms, replicated
        n += (2 if model.norm == "layernorm" else 1) * (model.mla.kv_lora_rank + model.mla.q_lora_rank)
    moe_layer = model.is_moe_layer(layer)
    if model.mlp_bias and not moe_layer:
        n += _mlp_bias_params(model, model.ffn_hidden, tp)
    if moe_layer:
        assert model.moe is not None
        n += h * model.moe.num_experts + (model.moe.num_experts if model.moe.router_bias else 0)
        if model.moe.shared_expert_gate:
            n += h
        if model.mlp_bias:  # the shared experts' biases, split with their weights
            n += model.moe.num_shared_experts * _mlp_bias_params(model, model.moe.shared_width, tp)
    return n


def expert_bias_params(model: ModelSpec, layer: int, ep: int, etp: int) -> int:
    """Biases of the routed experts of one MoE layer on one (ep, etp) rank: each local expert's
    gate/up bias split over etp with its columns and its down bias (h) whole (gpt-oss
    ``gate_up_proj_bias`` E×2w, ``down_proj_bias`` E×h); 0 without ``mlp_bias``."""
    moe = model.moe
    if moe is None or not model.mlp_bias or not model.is_moe_layer(layer):
        return 0
    return (moe.num_experts // ep) * _mlp_bias_params(model, moe.expert_ffn_hidden, etp)


@functools.lru_cache(maxsize=4096)
def device_params(model: ModelSpec, layout: Layout, stage: int, lora: LoRASpec | None = None) -> DeviceParams:
    """Parameters on one device of pipeline ``stage`` (before ZeRO sharding over dp·cp).

    Layers of one kind (dense or MoE) are identical, so each kind is counted once and
    multiplied by how many of the stage's layers are of that kind.
    """
    tp, ep, pp = layout.tp, layout.ep, layout.pp
    h, v = model.hidden_size, model.vocab_size
    layers = stage_layers(model, layout, stage)
    kinds = layer_kinds(model, layers)
    dense_linear = expert_linear = expert_other = other = adapters = 0
    largest = largest_adapters = 0
    linears: list[tuple[Linear, int]] = []
    for i, n_layers in kinds:
        lins = layer_linears(model, i, tp, ep, layout.expert_tp)
        linears += [(lin, n_layers) for lin in lins]
        lay_other = layer_other_params(model, i, tp)
        expert_bias = expert_bias_params(model, i, ep, layout.expert_tp)
        expert_other += expert_bias * n_layers  # expert-parallel like the experts' weights
        lay_total = lay_other + expert_bias
        lay_adapters = 0
        adapted = lora_modules(model, lora.targets) if lora is not None else ()
        for lin in lins:
            n = lin.local_weight_params
            if lin.name.startswith("expert."):
                expert_linear += n * n_layers
            else:
                dense_linear += n * n_layers
            lay_total += n
            if lora is not None and lin.name.split(".")[-1] in adapted:
                lay_adapters += lin.lora_params(lora.rank)
        adapters += lay_adapters * n_layers
        other += lay_other * n_layers
        if (lay_total, lay_adapters) > (largest, largest_adapters):
            largest, largest_adapters = lay_total, lay_adapters
    root = head = embedding = 0
    e = model.embed_width
    final_norm = _norm_params(model) if model.final_norm else 0
    # OPT-350M: project_in (e→h) after the embedding, project_out (h→e) before the head (replicated)
    proj = e * h if model.embed_projected else 0
    if stage == 0:
        root += -(-v // tp) * e + proj
        if not model.tied_embeddings or pp > 1:
            embedding = -(-v // tp) * e
        if model.position == "learned":
            root += (model.max_seq_len + model.position_offset) * h
    if stage == pp - 1:
        head = final_norm + proj + -(-v // tp) * e
        root += final_norm + proj
        if not model.tied_embeddings or pp > 1:
            root += -(-v // tp) * e
    other += root
    return DeviceParams(
        stage=stage,
        layers=layers,
        dense_linear=dense_linear,
        dense_other=other,
        expert_linear=expert_linear,
        expert_other=expert_other,
        lora_adapters=adapters,
        largest_layer_unsharded=largest,
        largest_layer_adapters=largest_adapters,
        root_params=root,
        head_params=head,
        input_embedding_params=embedding,
        linears=tuple(linears),
    )
