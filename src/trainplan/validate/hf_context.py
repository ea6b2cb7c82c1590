"""The longest sequence that fits: Hugging Face Transformers + PEFT QLoRA, as the Unsloth README measured it.

``memory_rows("unsloth_hf_context")`` gives, per device memory, the longest padded sequence the
"Hugging Face + FA2" baseline trained (4-bit QLoRA on every linear layer, rank 32, batch size 1).
This module rebuilds each run as the Hugging Face Trainer runs it and predicts the longest
sequence whose per-device memory (``MemoryBreakdown.per_device_bytes``: live tensors, CUDA
context and allocator fragmentation) fits the row's memory, by bisection over the sequence
length; the error compared is that of the context length (predicted / published − 1).

The run, from the sources the README names (Hugging Face transformers + PEFT + TRL, Dec 2024 -
Jan 2025):

* PEFT ``prepare_model_for_kbit_training`` (huggingface/peft v0.14.0, 2024-12-06,
  src/peft/utils/other.py lines 124-179): every 16-bit parameter that is not 4-bit cast to FP32,
  and gradient checkpointing turned on (``use_gradient_checkpointing=True`` by default, reentrant:
  ``model.enable_input_require_grads`` makes the embedding output require a gradient) —
  ``Recipe.kbit_fp32_upcast`` and ``recompute="full"``;
* transformers 4.46-4.49 (the releases of those months) ``ForCausalLMLoss``: the FP32 upcast and
  the contiguous FP32 copy of the shifted logits — ``Recipe.logits_shift_copy``;
* FlashAttention-2 (``attn_implementation="flash_attention_2"``): no s² tensor — ``attention="flash"``.

What is not modelled, and why it is small here: PEFT keeps the adapters in FP32 with FP32
gradients and AdamW moments and no separate master copy (16 bytes per adapter parameter, as the
16-bit adapter, its FP32 master and moments and its 16-bit gradient count); the bitsandbytes
backward dequantises one weight at a time (one matrix, not per token).

``before`` is the same run without the two Hugging Face terms (the package's answer before they
existed), reported beside the answer with them. ``python -m trainplan.validate.hf_context`` prints
the table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Final

from trainplan.layout import Layout
from trainplan.memory import memory_breakdown
from trainplan.models import load_model
from trainplan.recipe import LoRASpec, Recipe
from trainplan.validate.datasets import REGISTRY, MemoryRow, memory_rows
from trainplan.validate.timing import DatasetResult, RowResult

DATASET: Final = "unsloth_hf_context"
MAX_SEARCH_LEN: Final = 1 << 21
"""Upper end of the bisection (2M tokens, far beyond any row)."""


def hf_qlora_recipe(seq_len: int, *, hf_terms: bool = True) -> Recipe:
    """The README's run at ``seq_len``: QLoRA rank 32 on q, k, v, o, gate, up, down (alpha is not
    published and changes no memory), batch size 1, BF16 compute, AdamW, gradient checkpointing,
    FlashAttention-2; with ``hf_terms`` the PEFT FP32 upcast and the transformers loss copy."""
    return Recipe(
        method="qlora",
        precision="bf16",
        seq_len=seq_len,
        micro_batch=1,
        recompute="full",
        attention="flash",
        lora=LoRASpec(rank=32, alpha=64.0),
        kbit_fp32_upcast=hf_terms,
        logits_shift_copy=hf_terms,
        stack="pytorch",
    )


def _bytes(row: MemoryRow, seq_len: int, hf_terms: bool) -> float:
    assert row.preset is not None
    return memory_breakdown(
        load_model(row.preset), hf_qlora_recipe(seq_len, hf_terms=hf_terms), Layout()
    ).per_device_bytes


def max_context(row: MemoryRow, *, hf_terms: bool = True) -> int:
    """The longest sequence whose per-device memory fits ``row.measured_bytes``; 0 when none does."""
    cap = row.measured_bytes
    if _bytes(row, 1, hf_terms) > cap:
        return 0
    lo, hi = 1, MAX_SEARCH_LEN
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _bytes(row, mid, hf_terms) <= cap:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, kw_only=True)
class Comparison:
    row: MemoryRow
    predicted: int  # with the Hugging Face terms
    before: int  # without them

    @property
    def oom(self) -> bool:
        """The published run did not fit at any length (``bound = gt``)."""
        return self.row.bound == "gt"

    def error(self, predicted: int) -> float | None:
        if self.oom or self.row.seq_len is None:
            return None
        return predicted / self.row.seq_len - 1.0


def comparisons() -> list[Comparison]:
    return [
        Comparison(row=r, predicted=max_context(r), before=max_context(r, hf_terms=False))
        for r in memory_rows(DATASET)
        if r.is_target
    ]


def validate_hf_context() -> DatasetResult:
    """The rows as a validation dataset: the context-length error of each; a published OOM row
    is listed with whether the model agrees (a fit at any length would be a miss)."""
    out = []
    for c in comparisons():
        base = {"name": c.row.name, "dataset": DATASET, "split": c.row.split, "metric": "max_seq_len"}
        if c.oom:
            verdict = "agrees" if c.predicted == 0 else f"DISAGREES: predicted to fit {c.predicted} tokens"
            out.append(
                RowResult(
                    **base,
                    published=0.0,
                    predicted=float(c.predicted),
                    error=None,
                    assumptions=(),
                    skipped=f"published OOM at every length; predicted OOM at every length: {verdict}",
                )
            )
            continue
        assert c.row.seq_len is not None
        out.append(
            RowResult(
                **base,
                published=float(c.row.seq_len),
                predicted=float(c.predicted),
                error=c.error(c.predicted),
                assumptions=(
                    f"without the Hugging Face terms {c.before} tokens ({100 * (c.error(c.before) or 0.0):+.1f}%)",
                ),
            )
        )
    return DatasetResult(name=DATASET, bound=REGISTRY[DATASET].mape_bound, rows=tuple(out))


def render_markdown() -> str:
    lines = [
        "| row | split | memory | published context | predicted | error | without the HF terms | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons():
        pub = "OOM" if c.oom else f"{c.row.seq_len:,}"
        pred = "OOM" if c.predicted == 0 else f"{c.predicted:,}"
        bef = "OOM" if c.before == 0 else f"{c.before:,}"
        e1, e0 = c.error(c.predicted), c.error(c.before)
        f1 = "—" if e1 is None else f"{100 * e1:+.1f}%"
        f0 = "—" if e0 is None else f"{100 * e0:+.1f}%"
        lines.append(
            f"| {c.row.name} | {c.row.split} | {c.row.measured_value:g} {c.row.unit} | {pub} | {pred} | {f1} | {bef} | {f0} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render_markdown())

__all__ = [
    "comparisons",
    "hf_qlora_recipe",
    "max_context",
    "render_markdown",
    "replace",
    "validate_hf_context",
]
