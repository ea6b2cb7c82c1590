"""LoRA and QLoRA adapters for the reference models.

LoRA (Hu et al. 2021, Sec. 4.1): a frozen linear ``W`` plus ``(alpha/r) · B·A`` with ``A`` of shape
``r × in`` and ``B`` of shape ``out × r``; only ``A`` and ``B`` train (they carry the gradients and
the optimizer state, in the trainable dtype). As in PEFT's ``lora.Linear``, the adapter runs on
the layer input: ``y = base(x) + B(A(x)) · alpha/r`` (no dropout).

QLoRA (Dettmers et al. 2023, Sec. 3): the frozen base is stored in NF4, two 4-bit codes per byte
(``out·in/2`` bytes of ``uint8``), with one absmax constant per ``quant_block`` weights. Without
double quantization the constants are FP32 (4 bytes per block); with it they are 8-bit (1 byte per
block) with one FP32 constant per ``double_quant_block`` of them plus one FP32 offset, as in
bitsandbytes' ``QuantState`` (``absmax`` uint8, ``state2.absmax`` fp32, ``offset`` fp32). The
matmul follows bitsandbytes' ``MatMul4Bit``: the weight is dequantized into a compute-dtype
temporary in forward, and again in backward for ``grad_input``; only the packed weight is saved.
Under fake tensors the values are irrelevant, so dequantization is an ``empty`` of the right
shape and dtype — the same allocation the CUDA dequantize kernel makes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainplan.recipe import LoRASpec

# Module attribute names in trace.models for each LoRA target name of the recipe.
TARGET_ATTRS = {"q": "q", "k": "k", "v": "v", "o": "o", "gate": "gate", "up": "up", "down": "down"}


class _MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, packed: torch.Tensor, out_features: int, in_features: int
    ) -> torch.Tensor:
        w = torch.empty((out_features, in_features), dtype=x.dtype, device=x.device)  # dequantize_4bit
        ctx.save_for_backward(packed)
        ctx.shape = (out_features, in_features)
        return F.linear(x, w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (_packed,) = ctx.saved_tensors
        w = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)  # dequantize_4bit again
        return grad @ w, None, None, None


class NF4Linear(nn.Module):
    """A frozen linear layer stored in NF4 with (double-)quantized absmax constants."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        quant_block: int,
        double_quant: bool,
        double_quant_block: int,
        bias: nn.Parameter | None,
        device: Any = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        n = in_features * out_features
        blocks = math.ceil(n / quant_block)
        self.register_buffer("packed", torch.empty(math.ceil(n / 2), dtype=torch.uint8, device=device))
        if double_quant:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
            self.register_buffer(
                "absmax_scale",
                torch.empty(math.ceil(blocks / double_quant_block), dtype=torch.float32, device=device),
            )
            self.register_buffer("absmax_offset", torch.empty((), dtype=torch.float32, device=device))
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, device=device))
        self.bias = bias
        if bias is not None:
            bias.requires_grad_(False)

    def base_numel(self) -> int:
        """Weights the packed storage stands for (for parameter counts)."""
        return self.in_features * self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _MatMul4Bit.apply(x, self.packed, self.out_features, self.in_features)
        return y + self.bias if self.bias is not None else y


class LoRALinear(nn.Module):
    def __init__(
        self,
        base: nn.Module,
        in_features: int,
        out_features: int,
        rank: int,
        alpha: float,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(in_features, rank, bias=False, dtype=dtype, device=device)
        self.lora_b = nn.Linear(rank, out_features, bias=False, dtype=dtype, device=device)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scaling


def apply_lora(model: nn.Module, lora: LoRASpec, *, quantize: bool, dtype: torch.dtype) -> None:
    """Freeze ``model`` and wrap its targeted linears with adapters (NF4 bases when ``quantize``).

    QLoRA quantizes every linear of the blocks except the MoE router (bitsandbytes'
    ``load_in_4bit`` skips only ``lm_head``; routers are kept in 16 bit by PEFT MoE recipes); the
    embeddings, norms and head stay in the compute dtype.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    targets = {TARGET_ATTRS[t] for t in lora.targets}
    blocks = getattr(model, "layers", [])
    for block in blocks:
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if not isinstance(child, nn.Linear) or name == "router" or name.startswith("lora_"):
                    continue
                device = child.weight.device
                base: nn.Module = child
                if quantize:
                    base = NF4Linear(
                        child.in_features,
                        child.out_features,
                        quant_block=lora.quant_block,
                        double_quant=lora.double_quant,
                        double_quant_block=lora.double_quant_block,
                        bias=child.bias,
                        device=device,
                    )
                if name in targets:
                    base = LoRALinear(
                        base, child.in_features, child.out_features, lora.rank, lora.alpha, dtype, device
                    )
                if base is not child:
                    setattr(parent, name, base)


def quant_buffers(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(packed NF4 weights, quantization constants) of every :class:`NF4Linear` in ``model``."""
    packed: list[torch.Tensor] = []
    consts: list[torch.Tensor] = []
    for m in model.modules():
        if isinstance(m, NF4Linear):
            for name, buf in m.named_buffers(recurse=False):
                (packed if name == "packed" else consts).append(buf)
    return packed, consts
