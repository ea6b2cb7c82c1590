"""The torchtune README peak-memory rows, each rebuilt from the recipe config it measured.

``memory_rows("torchtune_memory")`` gives the published numbers; this module records, per row,
the torchtune config behind it (file and commit of pytorch/torchtune) and the recipe trainplan
builds from it, predicts the peak and reports the error. ``python -m
trainplan.validate.torchtune_memory --markdown`` prints the table of docs/memory.md.

What the README measures: torchtune's ``training.get_memory_stats``
(``torchtune/training/memory.py`` at 30b8519e8; ``torchtune/utils/memory.py`` at 0217d44c2)
reports ``peak_memory_active`` (``active_bytes.all.peak``), ``peak_memory_alloc``
(``max_memory_allocated``) and ``peak_memory_reserved``; the README's later "Optimization flags"
table is headed "Peak Memory Active". Active and allocated bytes differ only by blocks awaiting
stream synchronisation, so the prediction compared is ``MemoryBreakdown.peak_bytes`` (live
tensors), not ``per_device_bytes`` (which adds the CUDA context and allocator fragmentation).
Units: the 2024-09 table divides by 2³⁰ (GiB), the 2024-05 table by 10⁹ (GB); each row is compared
in its published unit.

Conventions of every torchtune recipe at these commits: ``dtype: bf16`` trains in pure bf16
(no FP32 master weights; AdamW moments in the parameter dtype, i.e. ``master_weights=False``);
``enable_activation_checkpointing: True`` wraps every transformer layer (``recompute="full"``);
attention is PyTorch SDPA (flash); the distributed recipes shard with FSDP (``zero=3``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from trainplan.layout import Layout
from trainplan.memory import MemoryBreakdown, memory_breakdown
from trainplan.models import load_model
from trainplan.recipe import LoRASpec, Recipe
from trainplan.validate.datasets import UNIT_BYTES, MemoryRow, memory_rows

DATASET: Final = "torchtune_memory"
ERROR_BOUND: Final = 0.15
"""Relative error within which a row needs no explanation."""

README_2024_09: Final = "30b8519e86d2094879576e16ab1f8d21a6f6f9f7"
"""pytorch/torchtune commit that added the Llama 3.1 "Memory and training speed" table (#1664)."""
README_2024_05: Final = "0217d44c2"
"""pytorch/torchtune commit of the Llama 2 "Peak Memory per GPU (GB)" table (#955)."""

ATTN: Final = ("q", "k", "v", "o")
MLP: Final = ("gate", "up", "down")


@dataclass(frozen=True, kw_only=True)
class TorchtuneRun:
    """One README row's configuration: the torchtune config it measured and the recipe built from it."""

    row: str  # row name in the torchtune_memory dataset
    config: str  # recipes/configs/... at ``commit``
    commit: str
    recipe: Recipe
    zero: int  # 3 for the FSDP (distributed) recipes, 0 on one device
    settings: str  # what the config sets that matters for memory
    assumptions: str = ""  # what the README and config leave open, and the choice made


def _full(**kw: object) -> Recipe:
    base: dict[str, object] = {
        "method": "full",
        "precision": "bf16",
        "master_weights": False,
        "attention": "flash",
        "recompute": "full",
        "stack": "pytorch",  # torchtune: PyTorch modules (what each saves: memory.layer_activations)
    }
    base.update(kw)
    return Recipe(**base)  # type: ignore[arg-type]


def _lora(method: str, rank: int, targets: tuple[str, ...], **kw: object) -> Recipe:
    lora = LoRASpec(rank=rank, alpha=2.0 * rank, targets=targets)
    return _full(method=method, lora=lora, **kw)


_L31_8B = dict(seq_len=2048, micro_batch=2, loss_chunks=8)
_NO_AC_A6000 = (
    "activation checkpointing off: the README gives no per-GPU settings, but the A6000 (154.8 "
    "TFLOP/s dense BF16) reports 1.56x (full) and 1.52x (LoRA) the tokens/s of the 4090 (165.2 "
    "TFLOP/s) with the same batch, which rules out the recompute the config enables"
)
_PACKED = "README: batch 2, packed to 2048 tokens, no gradient accumulation (config default overridden)"

RUNS: Final[tuple[TorchtuneRun, ...]] = (
    TorchtuneRun(
        row="torchtune-00-llama-3.1-8b-full-1xrtx-4090",
        config="recipes/configs/llama3_1/8B_full_single_device.yaml",
        commit=README_2024_09,
        recipe=_full(optimizer="adamw-8bit", paged_optimizer=True, optimizer_in_backward=True, **_L31_8B),
        zero=0,
        settings="PagedAdamW8bit, optimizer_in_bwd, activation checkpointing, CEWithChunkedOutputLoss (8)",
        assumptions=_PACKED,
    ),
    TorchtuneRun(
        row="torchtune-01-llama-3.1-8b-full-1xrtx-a6000",
        config="recipes/configs/llama3_1/8B_full_single_device.yaml",
        commit=README_2024_09,
        recipe=_full(
            optimizer="adamw-8bit",
            paged_optimizer=True,
            optimizer_in_backward=True,
            recompute="none",
            **_L31_8B,
        ),
        zero=0,
        settings="PagedAdamW8bit, optimizer_in_bwd, CEWithChunkedOutputLoss (8)",
        assumptions=_PACKED + "; " + _NO_AC_A6000,
    ),
    TorchtuneRun(
        row="torchtune-02-llama-3.1-8b-lora-1xrtx-4090",
        config="recipes/configs/llama3_1/8B_lora_single_device.yaml",
        commit=README_2024_09,
        recipe=_lora("lora", 8, ("q", "v"), **_L31_8B),
        zero=0,
        settings="LoRA r=8 alpha=16 on q,v; fused AdamW; activation checkpointing; chunked CE (8)",
        assumptions=_PACKED,
    ),
    TorchtuneRun(
        row="torchtune-03-llama-3.1-8b-lora-1xrtx-a6000",
        config="recipes/configs/llama3_1/8B_lora_single_device.yaml",
        commit=README_2024_09,
        recipe=_lora("lora", 8, ("q", "v"), recompute="none", **_L31_8B),
        zero=0,
        settings="LoRA r=8 alpha=16 on q,v; fused AdamW; chunked CE (8)",
        assumptions=_PACKED + "; " + _NO_AC_A6000,
    ),
    TorchtuneRun(
        row="torchtune-04-llama-3.1-8b-qlora-1xrtx-4090",
        config="recipes/configs/llama3_1/8B_qlora_single_device.yaml",
        commit=README_2024_09,
        recipe=_lora("qlora", 8, ATTN + MLP, **_L31_8B),
        zero=0,
        settings="QLoRA (torchao NF4, block 64, scalers in 8 bit per 256) r=8 on q,k,v,o + MLP; fused AdamW; "
        "activation checkpointing; chunked CE (8)",
        assumptions=_PACKED,
    ),
    TorchtuneRun(
        row="torchtune-05-llama-3.1-70b-full-8xa100-80gb-cpu-offload",
        config="recipes/configs/llama3_1/70B_full.yaml",
        commit=README_2024_09,
        recipe=_full(offload="optimizer+params", **_L31_8B),
        zero=3,
        settings="FSDP with fsdp_cpu_offload (parameters, gradients and the AdamW step on the CPU); "
        "activation checkpointing; chunked CE (8)",
        assumptions=_PACKED,
    ),
    TorchtuneRun(
        row="torchtune-06-llama-3.1-70b-lora-8xa100-80gb",
        config="recipes/configs/llama3_1/70B_lora.yaml",
        commit=README_2024_09,
        recipe=_lora("lora", 16, ("q", "k", "v"), **_L31_8B),
        zero=3,
        settings="FSDP; LoRA r=16 alpha=32 on q,k,v; fused AdamW; activation checkpointing; chunked CE (8)",
        assumptions=_PACKED,
    ),
    TorchtuneRun(
        row="torchtune-07-llama-3.1-405b-qlora-8xa100-80gb",
        config="recipes/configs/llama3_1/405B_qlora.yaml",
        commit=README_2024_09,
        recipe=_lora("qlora", 16, ATTN + MLP, seq_len=2048, micro_batch=2),
        zero=3,
        settings="FSDP; QLoRA r=16 alpha=32 on q,k,v,o + MLP; fused AdamW; activation checkpointing; "
        "nn.CrossEntropyLoss (unchunked) on the model's FP32 logits",
        assumptions="README batch 2 (the config says 1); the README prints 'GB' for this row only, "
        "but get_memory_stats at this commit divides by 2^30",
    ),
    TorchtuneRun(
        row="torchtune-08-llama-2-7b-qlora-1xrtx-4090",
        config="recipes/configs/llama2/7B_qlora_single_device.yaml",
        commit=README_2024_05,
        recipe=_lora("qlora", 8, ATTN + MLP, seq_len=2048, micro_batch=4),
        zero=0,
        settings="QLoRA r=8 on q,k,v,o + MLP; AdamW; activation checkpointing; nn.CrossEntropyLoss on FP32 "
        "logits (TransformerDecoder returns output(h).float())",
        assumptions="README: batch 4, seq 2048, torch.compile",
    ),
    TorchtuneRun(
        row="torchtune-09-llama-2-7b-lora-1xrtx-4090",
        config="recipes/configs/llama2/7B_lora_single_device.yaml",
        commit=README_2024_05,
        recipe=_lora("lora", 8, ("q", "v"), seq_len=2048, micro_batch=4),
        zero=0,
        settings="LoRA r=8 on q,v; AdamW; activation checkpointing; unchunked CE on FP32 logits",
        assumptions="README: batch 4, seq 2048",
    ),
    TorchtuneRun(
        row="torchtune-10-llama-2-7b-lora-2xrtx-4090",
        config="recipes/configs/llama2/7B_lora.yaml",
        commit=README_2024_05,
        recipe=_lora("lora", 8, ("q", "v"), seq_len=2048, micro_batch=4),
        zero=3,
        settings="FSDP; LoRA r=8 on q,v; AdamW; activation checkpointing; unchunked CE",
        assumptions="README: batch 4, seq 2048; the config sets enable_activation_checkpointing: False, "
        "but without it the batch needs about 43 GB per GPU (trainplan) and could not have run on a "
        "24 GB RTX 4090, so the measured run had checkpointing on",
    ),
    TorchtuneRun(
        row="torchtune-11-llama-2-7b-full-1xrtx-4090",
        config="recipes/configs/llama2/7B_full_low_memory.yaml",
        commit=README_2024_05,
        recipe=_full(
            optimizer="adamw", paged_optimizer=True, optimizer_in_backward=True, seq_len=2048, micro_batch=4
        ),
        zero=0,
        settings="bitsandbytes PagedAdamW (32-bit states), optimizer_in_bwd, activation checkpointing, "
        "unchunked CE",
        assumptions="README: batch 4, seq 2048",
    ),
    TorchtuneRun(
        row="torchtune-12-llama-2-7b-full-4xrtx-4090",
        config="recipes/configs/llama2/7B_full.yaml",
        commit=README_2024_05,
        recipe=_full(optimizer="adamw", seq_len=2048, micro_batch=4),
        zero=3,
        settings="FSDP; AdamW (states in bf16); activation checkpointing; unchunked CE",
        assumptions="README: batch 4, seq 2048",
    ),
    TorchtuneRun(
        row="torchtune-13-llama-2-70b-lora-8xa100-80gb",
        config="recipes/configs/llama2/70B_lora.yaml",
        commit=README_2024_05,
        recipe=_lora("lora", 16, ("q", "k", "v"), seq_len=4096, micro_batch=4),
        zero=3,
        settings="FSDP; LoRA r=16 on q,k,v; AdamW; activation checkpointing; unchunked CE",
        assumptions="README: batch 4, seq 4096",
    ),
    TorchtuneRun(
        row="torchtune-14-llama-2-70b-full-8xa100-80gb",
        config="recipes/full_finetune_distributed.py (no llama2/70B_full.yaml at this commit)",
        commit=README_2024_05,
        recipe=_full(optimizer="adamw", paged_optimizer=True, seq_len=4096, micro_batch=4),
        zero=3,
        settings="FSDP; bitsandbytes PagedAdamW (README footnote); activation checkpointing; unchunked CE",
        assumptions="README: batch 4, seq 4096; no published config: settings of llama2/7B_full.yaml "
        "(activation checkpointing on) with the README's PagedAdamW; the distributed recipe has no "
        "optimizer_in_bwd",
    ),
)

_MAY_2024 = (
    "The 2024-05 table (README at 0217d44c2) predates sample packing (issue #925, 2024-05-09: "
    "'on the verge of landing sample packing'): its 'Seq Length' is the max_seq_len truncation of "
    "Alpaca samples padded to the longest sample of each batch, not the tokens processed; it does "
    "not say which of get_memory_stats' active/allocated/reserved peaks it reports; and it was not "
    "reproduced (PR #961: 20.2 GB allocated on a single-device full fine-tune with every input "
    "forced to 2048 tokens, 22.3 GB on an A100, for the row published as 24.1 GB)."
)

EXPLAINED: Final[dict[str, str]] = {
    "torchtune-05-llama-3.1-70b-full-8xa100-80gb-cpu-offload": (
        "Llama-3.1-70B full fine-tune with fsdp_cpu_offload, 8x A100: CPU offload is not traced "
        "(docs/verify.md), so the FSDP2 moments applied here are the ones verified without it. The "
        "published 13.9 GiB is below even the moment after a block's backward (15.7 GiB, +12.6%); the "
        "peak predicted inside a block's backward (17.7 GiB) adds the rebuilt block, its first weight "
        "gradient and the later block's FP32 reduce-scatter input in flight (5.3 GiB with the "
        "prefetched block), and whether FSDP2 under CPUOffloadPolicy keeps that input in flight is "
        "not verified by a trace or a measurement."
    ),
    "torchtune-14-llama-2-70b-full-8xa100-80gb": (
        "Llama-2-70B full fine-tune with PagedAdamW, 8x A100: " + _MAY_2024 + " No config was "
        "published for this row; with the paged states outside PyTorch's allocator, what is left is "
        "the sharded bf16 weights and gradients and the working set, and gradients are not alive at "
        "the start of the only backward (trace-confirmed), so the prediction stays below the "
        "published figure by the unknown token count and peak kind."
    ),
    "torchtune-07-llama-3.1-405b-qlora-8xa100-80gb": (
        "405B QLoRA: the README prints GB for this row only, while "
        "get_memory_stats at 30b8519e8 divides by 2^30 like every other row of the table; read as "
        "44.8 GiB (48.1 GB) the error is +28%. The largest terms are the checkpointed layer inputs "
        "(126 layers x 2 x 2048 x 16384 x 2 bytes = 17 GB) and the FSDP2 root unit, unsharded from "
        "forward to the end of backward (untied embedding and LM head, 2 x 128256 x 16384 x 2 bytes = "
        "8.4 GB); the 405B config itself sets batch_size 1, which would halve the layer inputs."
    ),
    "torchtune-08-llama-2-7b-qlora-1xrtx-4090": (
        "Llama-2-7B QLoRA, 1x RTX 4090: " + _MAY_2024 + " This row also compiles the whole model "
        "(utils.wrap_compile at 0217d44c2), whose workspace trainplan does not model."
    ),
    "torchtune-10-llama-2-7b-lora-2xrtx-4090": (
        "Llama-2-7B LoRA, 2x RTX 4090: " + _MAY_2024 + " The FSDP1 recipe of that commit wraps "
        "only the decoder layers, so the root unit (embedding, final norm, LM head: 0.26 B parameters) "
        "stays unsharded from forward to backward; trainplan counts it unsharded only while FSDP2 "
        "holds it gathered (from the first forward to the end of backward), not its unsharded storage."
    ),
    "torchtune-11-llama-2-7b-full-1xrtx-4090": (
        "Llama-2-7B full fine-tune with PagedAdamW, 1x RTX 4090: " + _MAY_2024 + " trainplan's "
        "18.9 GB is within 7% of that reproduction."
    ),
    "torchtune-12-llama-2-7b-full-4xrtx-4090": (
        "Llama-2-7B full fine-tune, 4x RTX 4090: " + _MAY_2024 + " As for the 2-GPU LoRA row, "
        "the FSDP1 root unit (embedding and LM head, and their gradients) stays unsharded, while "
        "trainplan's FSDP2 moments count its weights and gradients unsharded only while gathered; and with one micro-batch no gradient is alive at the start of "
        "backward (trace-confirmed), which removes the 3.4 GB of gradient shards from the peak."
    ),
    "torchtune-13-llama-2-70b-lora-8xa100-80gb": (
        "Llama-2-70B LoRA, 8x A100: " + _MAY_2024 + " Here it decides the row: checkpointed "
        "layer inputs for 4 x 4096 tokens alone are 21.7 GB, while the published 26.4 GB leaves about "
        "9 GB beyond the 17.3 GB of sharded bf16 weights, so the measured batches held far fewer "
        "than 4 x 4096 tokens."
    ),
}
"""Rows outside ``ERROR_BOUND``, each with why (the same text is in docs/memory.md)."""


@dataclass(frozen=True, kw_only=True)
class RowComparison:
    run: TorchtuneRun
    row: MemoryRow
    memory: MemoryBreakdown

    @property
    def predicted_bytes(self) -> float:
        return self.memory.peak_bytes

    @property
    def published_bytes(self) -> float:
        return self.row.measured_bytes

    @property
    def unit_bytes(self) -> float:
        return UNIT_BYTES[self.row.unit]

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: predicted / published − 1."""
        return self.predicted_bytes / self.published_bytes - 1.0


def compare(run: TorchtuneRun, row: MemoryRow) -> RowComparison:
    """Predict the peak of live tensors for one README row."""
    if row.preset is None or row.num_devices is None:
        raise ValueError(f"{row.name}: the dataset row lacks a model preset or a device count")
    model = load_model(row.preset)
    layout = Layout.for_devices(row.num_devices, zero=run.zero)
    mem = memory_breakdown(model, run.recipe, layout)
    return RowComparison(run=run, row=row, memory=mem)


def comparisons() -> list[RowComparison]:
    """Every configured row of the dataset, in dataset order."""
    rows = {r.name: r for r in memory_rows(DATASET)}
    return [compare(run, rows[run.row]) for run in RUNS]


def _short(row: MemoryRow) -> str:
    return f"{row.model} {row.method}, {row.hardware_variant}, b={row.micro_batch} s={row.seq_len}"


def text_table(items: Sequence[RowComparison]) -> str:
    lines = [f"{'row':58s} {'predicted':>10s} {'published':>10s} {'unit':>4s} {'error':>7s}"]
    for c in items:
        lines.append(
            f"{c.row.name:58s} {c.predicted_bytes / c.unit_bytes:10.2f} {c.row.measured_value:10.2f} "
            f"{c.row.unit:>4s} {100 * c.error:+6.1f}%"
        )
    return "\n".join(lines)


def _replace_block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->\n", f"\n<!-- {name}:end -->"
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i] + body + text[j:]


def write_docs(path: Path, items: Sequence[RowComparison]) -> None:
    """Regenerate the torchtune table and the explained-rows list inside their markers."""
    text = path.read_text(encoding="utf-8")
    text = _replace_block(text, "torchtune-table", markdown_table(items))
    text = _replace_block(
        text, "torchtune-explained", "**Rows outside 15%**, and why:\n\n" + markdown_explained(items)
    )
    path.write_text(text, encoding="utf-8")


def markdown_explained(items: Sequence[RowComparison]) -> str:
    """The "rows outside the bound" list of docs/memory.md, errors computed, reasons from EXPLAINED."""
    lines = []
    for c in items:
        if c.row.name in EXPLAINED:
            lines.append(f"- `{c.row.name}` ({100 * c.error:+.0f}%): {EXPLAINED[c.row.name]}")
    return "\n".join(lines)


def markdown_table(items: Sequence[RowComparison]) -> str:
    lines = [
        "| row | config (pytorch/torchtune) | settings | predicted | published | error |",
        "|---|---|---|---:|---:|---:|",
    ]
    for c in items:
        unit = c.row.unit
        config = f"`{c.run.config.split('/')[-1]}` @ {c.run.commit[:9]}"
        lines.append(
            f"| {_short(c.row)} | {config} | {c.run.settings} | "
            f"{c.predicted_bytes / c.unit_bytes:.1f} {unit} | {c.row.measured_value:g} {unit} | "
            f"{100 * c.error:+.1f}% |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="torchtune README peak memory vs trainplan")
    parser.add_argument("--markdown", action="store_true", help="print the docs/memory.md table")
    parser.add_argument("--write-docs", metavar="PATH", help="regenerate the marked blocks of docs/memory.md")
    args = parser.parse_args(argv)
    items = comparisons()
    if args.write_docs:
        write_docs(Path(args.write_docs), items)
        return 0
    if args.markdown:
        sys.stdout.write(
            markdown_table(items)
            + "\n\n**Rows outside 15%**, and why:\n\n"
            + markdown_explained(items)
            + "\n"
        )
    else:
        sys.stdout.write(text_table(items) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
