"""Per-op selective activation checkpointing (``recompute="sac"``): which tensors a block keeps.

torchtitan's default activation checkpointing (``[activation_checkpoint] mode = "selective"``,
``selective_ac_option = "op"``) wraps every transformer block in a non-reentrant
``checkpoint_wrapper`` whose ``context_fn`` is ``torch.utils.checkpoint.
create_selective_checkpoint_contexts`` with a per-op policy (``_apply_op_sac`` in
torchtitan/distributed/activation_checkpoint.py at torchtitan 0.2.2; ``_save_list`` and
``_get_custom_policy`` in torchtitan/parallelisms/parallelize_llama.py at pytorch/torchtitan@9dec370,
December 2024, the same rule):

* the outputs of the ops of the save list are kept (``CheckpointPolicy.MUST_SAVE``): ``aten.mm``,
  the SDPA kernels (flash, memory-efficient, cuDNN, math, overrideable), the functional
  ``reduce_scatter_tensor`` and ``aten.max`` (the FP8 amax; 9dec370 also ``aten.abs``);
* except every second ``aten.mm``: a counter of ``aten.mm`` calls starts at 0 for each call of a
  block, and the even-numbered ones are recomputed (``PREFER_RECOMPUTE``);
* every other op is recomputed in the backward from the block input, which the checkpoint keeps.

The op names are those the dispatcher sees below autograd: a linear layer without a bias on a
contiguous 3-D input is ``aten.mm`` (``at::linear`` → ``matmul`` → ``mm`` on the flattened
input), one with a bias is ``aten.addmm`` (``_flatten_nd_linear``), which is not in the save list
and is not counted either. So in a Llama block (q, k, v, o, gate, up, down, no biases) the
outputs of q, v, gate and down are kept and k, o and up are recomputed; in a GPT-2 block (every
linear biased) no projection output is kept and every projection is recomputed; with biases on
q, k, v only (Qwen2) the count starts at o: o and up kept, gate and down recomputed. torchtitan
after 0.2.2 (#2357, 2026-03) saves every op of ``torch._functorch.partitioners.
get_default_op_list().compute_intensive_ops`` as well (``addmm`` and ``bmm`` always, uncounted):
not what ``recompute="sac"`` counts.

What the analytic model needs from this (:func:`block_linears`) is the order of the block's
linear layers, which of them are ``aten.mm`` and which of those are kept. Where the policy's
outcome depends on more than that, the combination is refused (:func:`check_sac`) rather than
guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.errors import LayoutError, RecipeError
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class BlockLinear:
    """One linear layer of a dense block under the per-op policy.

    ``mm``: it runs as ``aten.mm`` (no bias); ``saved``: its output is kept (an odd-numbered
    ``aten.mm`` of the block call). A linear that is not kept is recomputed in the backward.
    """

    name: str  # q, k, v, o, gate, up, down
    n_in: int
    n_out: int
    mm: bool
    saved: bool


def block_linears(model: ModelSpec) -> tuple[BlockLinear, ...]:
    """The linear layers of one dense block in execution order, numbered as the policy counts.

    Order (the reference blocks of ``trainplan.trace.models``, torchtitan's ``Attention`` /
    ``FeedForward`` and Hugging Face's blocks): q, k, v, o, then gate, up, down for a gated MLP
    (``down(act(gate(x)) * up(x))``: gate runs first) or up, down; with parallel attention and
    MLP (GPT-NeoX) the attention still runs first.
    """
    h, q, g, f = model.hidden_size, model.q_dim, model.kv_dim, model.ffn_hidden
    layers: list[tuple[str, int, int, bool]] = [
        ("q", h, q, model.qkv_bias),
        ("k", h, g, model.qkv_bias),
        ("v", h, g, model.qkv_bias),
        ("o", q, h, model.attn_out_bias),
    ]
    if model.gated:
        layers.append(("gate", h, f, model.mlp_bias))
    layers += [("up", h, f, model.mlp_bias), ("down", f, h, model.mlp_bias)]
    out: list[BlockLinear] = []
    count = 0
    for name, n_in, n_out, bias in layers:
        mm = not bias
        count += mm
        out.append(BlockLinear(name=name, n_in=n_in, n_out=n_out, mm=mm, saved=mm and count % 2 == 1))
    return tuple(out)


def check_sac(model: ModelSpec, layout: Layout | None = None) -> None:
    """Refuse the model and layout combinations whose per-op checkpointing is not modelled.

    (The recipe's own combinations — LoRA/QLoRA, FP8/FP4, eager attention, dropout — are refused
    by :class:`trainplan.recipe.Recipe`.)

    * multi-head latent attention: its five projections and latent norms (the policy's
      alternation over matmuls is counted for q, k, v, o);
    * MoE layers: the router's top-k and index ops, the per-expert matmuls (their count decides
      which ones are kept), torchtitan's forced recompute of the router's matmul
      (``per_op_sac_force_recompute_mm_shapes_by_fqns``) and the all-to-all dispatch;
    * tensor parallelism: the policy sees DTensor matmuls whose kept outputs are partial sums
      (row-parallel) and re-runs the all-reduce / all-gather collectives in the recomputation,
      while it keeps the sequence-parallel reduce-scatter;
    * context parallelism: ring attention calls the SDPA kernel once per ring step, and each
      call's output would be kept.
    """
    if model.mla is not None:
        raise RecipeError(
            "recompute",
            f"{model.name} uses multi-head latent attention; per-op selective checkpointing (sac) is "
            "modelled for multi/grouped-query blocks only: use --recompute full or selective",
        )
    if model.num_moe_layers:
        raise RecipeError(
            "recompute",
            f"{model.name} has MoE layers; per-op selective checkpointing (sac) is modelled for dense "
            "blocks only: use --recompute full or selective",
        )
    if layout is None:
        return
    if layout.tp > 1:
        raise LayoutError(
            "tp",
            f"tp={layout.tp}: per-op selective checkpointing (sac) is modelled without tensor parallelism "
            "(the policy would keep DTensor partial sums and re-run the TP collectives); use tp=1 or "
            "--recompute full or selective",
        )
    if layout.cp > 1:
        raise LayoutError(
            "cp",
            f"cp={layout.cp}: per-op selective checkpointing (sac) is modelled without context parallelism "
            "(ring attention keeps one SDPA output per ring step); use cp=1 or --recompute full or selective",
        )


__all__ = ["BlockLinear", "block_linears", "check_sac"]
