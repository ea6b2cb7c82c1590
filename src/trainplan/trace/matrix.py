"""The verification matrix: analytic vs traced on many configurations.

``python -m trainplan.trace.matrix --markdown > docs/verify-matrix.md`` regenerates the table in
the docs; ``--json`` prints every result. Reduced-depth entries keep the per-layer structure of
the full model (the analytic model is evaluated on the same reduced depth).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from trainplan.layout import Layout
from trainplan.recipe import LoRASpec, Recipe


@dataclass(frozen=True)
class MatrixEntry:
    model: str
    recipe: Recipe
    layout: Layout
    depth: int | None

    @property
    def world_size(self) -> int:
        return self.layout.num_devices


def _r(**kw: Any) -> Recipe:
    kw.setdefault("seq_len", 1024)
    return Recipe(**kw)


def matrix() -> list[MatrixEntry]:
    """The configurations (dense and MoE, bf16/fp32, FSDP/TP/SP/checkpointing/LoRA/QLoRA/per-op SAC).

    Full recompute is traced as the recipe says: PyTorch's non-reentrant checkpoint with early
    stop (``recompute_early_stop``, the default of ``torch.utils.checkpoint`` and of FSDP2 /
    torchtune setups) or without it (the whole block again, as Megatron-LM's reentrant checkpoint).
    """
    E = MatrixEntry
    out: list[MatrixEntry] = []
    for model in ("llama-3.2-1b", "llama-2-7b", "llama-3-8b", "qwen2.5-7b", "gpt2", "olmo-2-7b"):
        out.append(E(model, _r(), Layout(), 2))
    out += [
        E("llama-3-8b", _r(precision="fp32"), Layout(), 2),
        E("gpt2", _r(precision="fp32", micro_batch=4), Layout(), 2),
        E("llama-3-8b", _r(micro_batch=4, seq_len=2048), Layout(), 2),
        E("llama-3-8b", _r(master_weights=False), Layout(), 2),
        E("llama-3-8b", _r(recompute="full", recompute_early_stop=True, micro_batch=2), Layout(), 3),
        E("llama-2-7b", _r(recompute="full", recompute_early_stop=True, precision="fp32"), Layout(), 3),
        E("llama-3-8b", _r(method="lora"), Layout(), 2),
        E("llama-2-7b", _r(method="lora", micro_batch=4), Layout(), 2),
        E("llama-3-8b", _r(method="qlora"), Layout(), 2),
        E("llama-3-8b", _r(method="qlora", lora=LoRASpec(double_quant=False)), Layout(), 2),
        E("llama-3-70b", _r(method="qlora"), Layout(), 2),
        E("llama-3-8b", _r(), Layout(dp=8, zero=3), 2),
        E("llama-3-8b", _r(precision="fp32"), Layout(dp=8, zero=3), 2),
        E("llama-3-8b", _r(recompute="full", recompute_early_stop=True), Layout(dp=8, zero=3), 3),
        E("llama-3-70b", _r(), Layout(dp=64, zero=3), 2),
        E("llama-3-70b", _r(seq_len=4096), Layout(dp=32, zero=3), 2),
        E("llama-2-13b", _r(method="lora"), Layout(dp=4, zero=3), 2),
        E("llama-3-8b", _r(), Layout(tp=2), 2),
        E("llama-3-8b", _r(), Layout(tp=4), 2),
        E("llama-3-8b", _r(), Layout(tp=4, sequence_parallel=True), 2),
        E("llama-3-70b", _r(), Layout(tp=8, sequence_parallel=True), 2),
        E("llama-3-70b", _r(), Layout(tp=8), 2),
        E(
            "llama-3-8b",
            _r(recompute="full", recompute_early_stop=True),
            Layout(tp=4, sequence_parallel=True),
            3,
        ),
        E("llama-3-8b", _r(), Layout(dp=4, tp=2, zero=3), 2),
        E("llama-3-70b", _r(), Layout(dp=8, tp=8, zero=3, sequence_parallel=True), 2),
        E("mixtral-8x7b", _r(), Layout(), 1),
        E("mixtral-8x7b", _r(precision="fp32"), Layout(), 1),
        E("mixtral-8x7b", _r(recompute="full", recompute_early_stop=True), Layout(), 2),
        E("mixtral-8x7b", _r(), Layout(dp=8, zero=3), 2),
        E("mixtral-8x7b", _r(), Layout(tp=2), 1),
        E("qwen1.5-moe-a2.7b", _r(), Layout(), 2),
        E("qwen1.5-moe-a2.7b", _r(), Layout(dp=8, zero=3), 2),
        E("qwen3-30b-a3b", _r(), Layout(dp=8, zero=3), 1),
        E("gemma-2-9b", _r(), Layout(), 2),
        E("phi-3-mini", _r(), Layout(), 2),
        E("gpt2", _r(), Layout(), None),
        E("llama-3.2-1b", _r(seq_len=2048), Layout(dp=8, zero=3), None),
        E("pythia-160m", _r(precision="fp32"), Layout(), None),
        # full recompute: the whole block again (reentrant semantics), and early stop where the
        # block's last save moves (LoRA B, the NF4 base, a post-norm, a gated shared expert,
        # a parallel block with biases)
        E("llama-3-8b", _r(recompute="full", micro_batch=2), Layout(), 3),
        E("llama-3-8b", _r(method="lora", recompute="full", recompute_early_stop=True), Layout(), 2),
        E(
            "llama-3-8b",
            _r(
                method="qlora",
                lora=LoRASpec(targets=("q", "v")),
                recompute="full",
                recompute_early_stop=True,
            ),
            Layout(),
            2,
        ),
        E("gemma-2-9b", _r(recompute="full", recompute_early_stop=True), Layout(), 2),
        E("qwen1.5-moe-a2.7b", _r(recompute="full", recompute_early_stop=True), Layout(), 2),
        E("pythia-160m", _r(precision="fp32", recompute="full", recompute_early_stop=True), Layout(), None),
        # per-op selective checkpointing (torchtitan's selective_ac_option = "op"): Llama blocks
        # (q, v, gate, down kept), a GPT-2 block (every linear biased: none kept), biases on
        # q/k/v only (the matmul count starts at o), a post-norm block, FSDP2, fp32, early stop
        E("llama-3-8b", _r(recompute="sac", micro_batch=2), Layout(), 3),
        E("llama-3-8b", _r(recompute="sac", precision="fp32"), Layout(), 2),
        E("llama-3-8b", _r(recompute="sac"), Layout(dp=8, zero=3), 3),
        E("llama-3.2-1b", _r(recompute="sac", seq_len=2048), Layout(dp=8, zero=3), 4),
        E("llama-3-70b", _r(recompute="sac", seq_len=4096), Layout(dp=32, zero=3), 2),
        E("llama-2-7b", _r(recompute="sac", recompute_early_stop=True, precision="fp32"), Layout(), 3),
        E("gpt2", _r(recompute="sac", micro_batch=4), Layout(), None),
        E(
            "gpt2",
            _r(recompute="sac", recompute_early_stop=True, precision="fp32"),
            Layout(dp=4, zero=3),
            None,
        ),
        E("qwen2.5-7b", _r(recompute="sac"), Layout(), 2),
        E("gemma-2-9b", _r(recompute="sac", recompute_early_stop=True), Layout(), 2),
        E("pythia-160m", _r(precision="fp32", recompute="sac", recompute_early_stop=True), Layout(), None),
    ]
    # Inside one block's backward under FSDP2 (memory.block_backward_bytes): Llama 2 70B blocks at
    # 4096 tokens on 64 ranks, where the rebuilt block, its first weight gradient and the MLP's
    # gradients meet the gathered blocks and a reduce-scatter input in flight — without recompute,
    # full recompute with and without early stop (``trainplan verify llama-2-70b --devices 64
    # --zero 3 --seq-len 4096 --recompute full`` at 3 of its 80 layers) and per-op sac.
    fsdp64 = Layout(dp=64, zero=3)
    out += [
        E("llama-2-70b", _r(seq_len=4096), fsdp64, 3),
        E("llama-2-70b", _r(seq_len=4096, recompute="full"), fsdp64, 3),
        E("llama-2-70b", _r(seq_len=4096, recompute="full", recompute_early_stop=True), fsdp64, 3),
        E("llama-2-70b", _r(seq_len=4096, recompute="sac"), fsdp64, 3),
    ]
    # Layer-selective checkpointing (torchtitan selective_ac_option = "2": every second block),
    # without and with FSDP2, with and without early stop.
    every2 = {"recompute": "full", "recompute_every": 2}
    out += [
        E("llama-3-8b", _r(micro_batch=2, recompute_early_stop=True, **every2), Layout(), 4),
        E("gpt2", _r(micro_batch=4, **every2), Layout(), 5),
        E("llama-2-70b", _r(seq_len=4096, recompute_early_stop=True, **every2), fsdp64, 4),
        E("llama-2-70b", _r(seq_len=4096, **every2), fsdp64, 5),
    ]
    return out


def run_entry(entry: MatrixEntry) -> Any:
    from trainplan.models import load_model
    from trainplan.trace.verify import run_verify

    return run_verify(
        load_model(entry.model), entry.recipe, entry.layout, world_size=entry.world_size, depth=entry.depth
    )


def _pct(e: float | None) -> str:
    if e is None:
        return "–"
    if e == float("inf"):
        return "∞"
    return f"{e:+.2f}%"


MARKDOWN_TERMS = (
    "model_states",
    "activations",
    "logits",
    "transient",
    "optimizer_temporaries",
    "backward_phase_peak",
    "optimizer_phase_peak",
    "peak",
    "gemm_flops",
    "attention_flops",
)


def markdown(results: list[tuple[MatrixEntry, Any]]) -> str:
    lines = [
        "<!-- generated by `python -m trainplan.trace.matrix --markdown`; do not edit -->",
        "# Verification matrix: analytic vs traced",
        "",
        "Error = (analytic − traced) / traced. Bytes per device; traced peak in GiB (2^30 bytes).",
        "",
        "| # | model | layers | config | traced peak GiB | traced phase | "
        + " | ".join(MARKDOWN_TERMS)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(MARKDOWN_TERMS),
    ]
    for i, (entry, res) in enumerate(results, 1):
        if isinstance(res, str):
            lines.append(f"| {i} | {entry.model} | {entry.depth or 'all'} | unsupported: {res} |")
            continue
        cells = [_pct(res.row(t).error_pct) for t in MARKDOWN_TERMS]
        lines.append(
            f"| {i} | {entry.model} | {res.depth} | {res.config} | {res.row('peak').traced / 2**30:.3f} | "
            f"{res.traced_peak_phase} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", type=int, nargs="*", help="1-based entry numbers to run")
    args = ap.parse_args(argv)
    from trainplan.trace.step import UnsupportedConfig

    entries = matrix()
    chosen = [entries[i - 1] for i in args.only] if args.only else entries
    results: list[tuple[MatrixEntry, Any]] = []
    for e in chosen:
        try:
            results.append((e, run_entry(e)))
        except UnsupportedConfig as exc:
            results.append((e, str(exc)))
        if not args.markdown and not args.json:
            res = results[-1][1]
            print(res if isinstance(res, str) else res.render(), end="\n\n", flush=True)
    if args.markdown:
        sys.stdout.write(markdown(results))
    if args.json:
        print(json.dumps([r if isinstance(r, str) else r.to_dict() for _, r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


KNOWN_GAPS: dict[int, str] = {}
"""Matrix entries (1-based, as numbered in docs/verify-matrix.md) whose traced peak differs from the
analytic one by more than 0.5%, with the mechanism: none. Every entry is held to 0.5% by the tests
(tests/test_verify_matrix.py); the differences that remain are documented in docs/verify.md."""

UNEVEN_SHARDS_GAP = (
    "model states under FSDP2: fully_shard splits every parameter along dim 0 into chunks of "
    "ceil(d0/N) rows, so rank 0 holds more than numel/N of a parameter whose first dimension is not "
    "a multiple of N (Qwen1.5-MoE's 60-row router and 1-row shared-expert gate at N = 8: 90112 "
    "bytes in entry 38); the analytic model divides evenly, and the trace reports the difference "
    "(fsdp_uneven_shard_bytes)"
)
