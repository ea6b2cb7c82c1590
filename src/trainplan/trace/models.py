"""Reference PyTorch decoder-only transformers built from a :class:`~trainplan.models.spec.ModelSpec`.

The modules follow the eager training code of torchtitan (``torchtitan/models/llama3``) and
Hugging Face ``transformers`` (``LlamaForCausalLM``, ``GPT2LMHeadModel``, ``MixtralForCausalLM``),
so that the tensors autograd keeps alive are the ones those frameworks keep:

* norms: ``torch.rms_norm`` / ``torch.layer_norm`` (the fused aten kernels ``nn.RMSNorm`` and
  ``nn.LayerNorm`` call), keeping the FP32 statistics the CUDA kernels save, optional per-head q/k
  RMSNorm and Gemma-2 post-norms;
* attention: separate q/k/v/o projections, rotary embeddings in the rotate-half form of
  ``transformers`` (cos/sin computed once per forward, in the compute dtype), grouped-query
  attention through ``scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` (the flash
  kernel; no dropout), learned absolute positions for GPT-style models;
* MLP: SwiGLU/GeGLU ``down(act(gate(x)) * up(x))`` or ``down(act(up(x)))``; GeLU uses the tanh
  approximation of GPT-2;
* MoE: token-choice top-k router (softmax then top-k, as Mixtral), routed tokens gathered into
  one ``T·K × h`` buffer, experts run on static, perfectly balanced chunks of it (fake tensors
  cannot take data-dependent shapes), outputs weighted by the router scores and scattered back
  (torchtitan ``MoE`` with the for-loop expert path); shared experts as one dense MLP each;
* loss: logits in the compute dtype, upcast to fp32, ``cross_entropy`` (both torchtitan's
  ``cross_entropy_loss`` and ``transformers``' ``ForCausalLMLoss`` upcast).

The parameter set (and so the parameter count) follows the architecture exactly:
embeddings ``V·h``, learned positions ``max_seq_len·h``, per layer q ``h·a·d``, k and v
``h·k·d``, o ``a·d·h`` (+ biases when the spec has them), norms ``h`` (+``h`` LayerNorm bias),
MLP ``2 or 3 · h·f`` (+ biases), router ``h·E`` (+ E), final norm, untied head ``V·h``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainplan.models.spec import ModelSpec


class _FusedRMSNorm(torch.autograd.Function):
    """``torch.rms_norm`` as CUDA runs it since torch 2.8: the fused ``aten::_fused_rms_norm`` kernel.

    Its autograd formula (``tools/autograd/derivatives.yaml``, entry ``_fused_rms_norm``) saves the
    input (compute dtype), ``rstd`` (fp32, one per row) and the weight. On CPU ``rms_norm`` is a
    composite that upcasts and saves fp32 copies instead, which no GPU run does, so the reference
    model uses this function to keep the CUDA saved set under fake-CPU tracing. Its backward is
    the fused ``_fused_rms_norm_backward`` where that kernel exists (CUDA, fake tensors), so a
    trace sees its two outputs and not the FP32 temporaries of the explicit formula, which real
    CPU tensors and DTensor inputs (no sharding rule for the fused op is relied on) still use.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        out = (xf * rstd).to(x.dtype) * weight
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, rstd, weight = ctx.saved_tensors
        fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
        if fused is not None and (x.device.type != "cpu" or _is_fake(x)):
            # The fused kernel (CUDA, and fake tensors through its meta function; no CPU kernel):
            # it allocates its two outputs only, not the FP32 temporaries of the formula below.
            gx, gw = fused(
                grad, x, [x.shape[-1]], rstd, weight, [ctx.needs_input_grad[0], ctx.needs_input_grad[1]]
            )
            return gx, gw, None
        xhat = x.float() * rstd
        gw = grad.float() * weight.float()
        grad_x = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        grad_w = (grad.float() * xhat).sum(dim=tuple(range(grad.dim() - 1)))
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class _LayerNormFP32Stats(torch.autograd.Function):
    """``layer_norm`` with the saved set of the CUDA kernel: input, FP32 mean and FP32 rstd.

    ``aten::native_layer_norm`` on CUDA computes mean and rstd in the accumulation type (FP32 for
    16-bit inputs; ``aten/src/ATen/native/cuda/layer_norm_kernel.cu``) and autograd saves them
    with the input, weight and bias (``tools/autograd/derivatives.yaml``). The CPU kernel returns
    them in the input dtype, so for 16-bit inputs under fake-CPU tracing the statistics are kept
    as FP32 copies here; the CPU kernel still runs both passes.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
    ) -> torch.Tensor:
        shape = [x.shape[-1]]
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)
        mean, rstd = mean.float(), rstd.float()
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, mean, rstd, weight, bias = ctx.saved_tensors
        mask = [
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[2],
        ]
        gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
            grad, x, [x.shape[-1]], mean.to(x.dtype), rstd.to(x.dtype), weight, bias, mask
        )
        return gx, gw, gb, None


class Norm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019) or LayerNorm (Ba et al. 2016), both with a weight."""

    def __init__(self, dim: int, kind: str, eps: float = 1e-5) -> None:
        super().__init__()
        self.kind = kind
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "rmsnorm":
            return _FusedRMSNorm.apply(x, self.weight, self.eps)
        if x.device.type == "cpu" and x.dtype != torch.float32:
            return _LayerNormFP32Stats.apply(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(seq_len: int, head_dim: int, dtype: torch.dtype, theta: float = 10000.0) -> tuple[Any, Any]:
    """cos/sin tables ``[s, d]`` (Su et al. 2021), in the compute dtype as ``transformers`` does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.n_heads = spec.num_heads
        self.n_kv_heads = spec.num_kv_heads
        self.head_dim = d
        self.q = nn.Linear(h, spec.q_dim, bias=spec.qkv_bias)
        self.k = nn.Linear(h, spec.kv_dim, bias=spec.qkv_bias)
        self.v = nn.Linear(h, spec.kv_dim, bias=spec.qkv_bias)
        self.o = nn.Linear(spec.q_dim, h, bias=spec.attn_out_bias)
        # Qwen3 normalises each head (over d); OLMo 2 the whole projection (over a·d and k·d).
        self.qk_full = bool(getattr(spec, "qk_norm_full_width", False))
        qn, kn = (spec.q_dim, spec.kv_dim) if self.qk_full else (d, d)
        self.q_norm = Norm(qn, spec.norm) if spec.qk_norm else None
        self.k_norm = Norm(kn, spec.norm) if spec.qk_norm else None
        self.rope = spec.position == "rope"

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        # Head counts come from the projection widths so that tensor-parallel shards
        # (which hold a/tp query heads and k/tp key/value heads) reuse this code.
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.qk_full and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, s, -1, self.head_dim)
        k = k.view(b, s, -1, self.head_dim)
        v = v.view(b, s, -1, self.head_dim)
        if not self.qk_full and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rope and cos is not None and sin is not None:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.o(out)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ffn: int, *, bias: bool | None = None) -> None:
        super().__init__()
        h = spec.hidden_size
        bias = spec.mlp_bias if bias is None else bias
        self.gated = spec.gated
        self.activation = spec.activation
        self.gate = nn.Linear(h, ffn, bias=bias) if self.gated else None
        self.up = nn.Linear(h, ffn, bias=bias)
        self.down = nn.Linear(ffn, h, bias=bias)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation in ("swiglu",):
            return F.silu(x)
        if self.activation in ("gelu", "geglu"):
            return F.gelu(x, approximate="tanh")
        return F.relu(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))


class MoE(nn.Module):
    """Token-choice top-k MoE with balanced static dispatch (see the module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        assert spec.moe is not None
        m = spec.moe
        self.num_experts = m.num_experts
        self.top_k = m.top_k
        self.router = nn.Linear(spec.hidden_size, m.num_experts, bias=m.router_bias)
        self.experts = nn.ModuleList(MLP(spec, m.expert_ffn_hidden, bias=False) for _ in range(m.num_experts))
        self.shared = nn.ModuleList(
            MLP(spec, m.shared_width, bias=False) for _ in range(m.num_shared_experts)
        )
        self.shared_gate = (
            nn.Linear(spec.hidden_size, 1, bias=False)
            if m.shared_expert_gate and m.num_shared_experts
            else None
        )

    @staticmethod
    def chunk_sizes(tokens: int, parts: int) -> list[int]:
        """Balanced split of ``tokens`` routed rows over ``parts`` experts (sizes differ by at most 1)."""
        base, extra = divmod(tokens, parts)
        return [base + (1 if i < extra else 0) for i in range(parts)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        xt = x.reshape(b * s, h)
        scores = F.softmax(self.router(xt), dim=-1, dtype=torch.float32)
        top_scores, selected = torch.topk(scores, self.top_k, dim=-1)
        order = torch.argsort(selected.view(-1), stable=True)
        token_idx = order // self.top_k
        routed = xt.index_select(0, token_idx)
        outs = []
        for expert, chunk in zip(
            self.experts, routed.split(self.chunk_sizes(routed.shape[0], self.num_experts)), strict=True
        ):
            outs.append(expert(chunk))
        routed_out = torch.cat(outs, dim=0)
        routed_out = routed_out * top_scores.view(-1).index_select(0, order).unsqueeze(-1).to(x.dtype)
        out = torch.zeros_like(xt).index_add(0, token_idx, routed_out)
        for shared in self.shared:
            y = shared(xt)
            if self.shared_gate is not None:
                y = torch.sigmoid(self.shared_gate(xt)) * y
            out = out + y
        return out.view(b, s, h)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.attn_norm = Norm(spec.hidden_size, spec.norm)
        self.attn = Attention(spec)
        self.parallel = spec.parallel_attn_mlp
        self.mlp_norm = Norm(spec.hidden_size, spec.norm)
        self.mlp: nn.Module = MoE(spec) if spec.is_moe_layer(layer) else MLP(spec, spec.ffn_hidden)
        self.post_attn_norm = Norm(spec.hidden_size, spec.norm) if spec.post_norms else None
        self.post_mlp_norm = Norm(spec.hidden_size, spec.norm) if spec.post_norms else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        a = self.attn(self.attn_norm(x), cos, sin)
        if self.post_attn_norm is not None:
            a = self.post_attn_norm(a)
        if self.parallel:
            m = self.mlp(self.mlp_norm(x))
            return x + a + m
        x = x + a
        m = self.mlp(self.mlp_norm(x))
        if self.post_mlp_norm is not None:
            m = self.post_mlp_norm(m)
        return x + m


class ReferenceLM(nn.Module):
    """Embeddings → blocks → final norm → head → fp32 cross-entropy loss."""

    def __init__(self, spec: ModelSpec, *, num_layers: int | None = None) -> None:
        super().__init__()
        self.spec = spec
        n = spec.num_layers if num_layers is None else num_layers
        e, h = spec.embed_width, spec.hidden_size
        self.embed = nn.Embedding(spec.vocab_size, e)
        self.pos_embed = (
            nn.Embedding(spec.max_seq_len + spec.position_offset, h) if spec.position == "learned" else None
        )
        # OPT-350M: project_in / project_out between the e-wide embedding and head and the blocks
        self.project_in = nn.Linear(e, h, bias=False) if spec.embed_projected else None
        self.project_out = nn.Linear(h, e, bias=False) if spec.embed_projected else None
        self.layers = nn.ModuleList(Block(spec, i) for i in range(n))
        self.norm = Norm(h, spec.norm) if spec.final_norm else None
        self.head = nn.Linear(e, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        _b, s = tokens.shape
        x = self.embed(tokens)
        if self.project_in is not None:
            x = self.project_in(x)
        cos = sin = None
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(s, device=tokens.device) + self.spec.position_offset)
        if self.spec.position == "rope":
            cos, sin = rope_cos_sin(s, self.spec.head_dim, x.dtype)
            cos, sin = cos.to(x.device), sin.to(x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        logits = self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def retie(model: ReferenceLM) -> None:
    """Re-tie the head to the embedding (``to_empty`` under fake tensors swaps each parameter)."""
    if model.spec.tied_embeddings:
        model.head.weight = model.embed.weight


def model_layers(spec: ModelSpec, depth: int | None) -> int:
    """Layers to build: all of them, or ``depth`` (for per-layer checks on reduced-depth models)."""
    if depth is None:
        return spec.num_layers
    if depth <= 0:
        raise ValueError(f"depth must be positive, got {depth}")
    return min(depth, spec.num_layers)


def build_model(
    spec: ModelSpec, *, dtype: torch.dtype, depth: int | None = None, device: str = "meta"
) -> ReferenceLM:
    """Build on ``device`` (``meta`` by default: no memory) with parameters in ``dtype``."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return ReferenceLM(spec, num_layers=model_layers(spec, depth))
    finally:
        torch.set_default_dtype(prev)


def num_params(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once), QLoRA NF4 bases counted as unpacked weights."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    for m in module.modules():
        extra = getattr(m, "base_numel", None)
        if callable(extra):
            total += int(extra())
    return total


__all__ = ["MLP", "Attention", "Block", "MoE", "Norm", "ReferenceLM", "build_model", "num_params"]
