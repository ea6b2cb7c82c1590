"""Fit the one calibrated constant of the step-time model: κ per accelerator generation.

Microbenchmark efficiencies (``efficiency.py``) say what a kernel can reach alone; a training
stack reaches less (launch gaps, unfused kernels, synchronisation, clocks under sustained load).
κ is that ratio, one number per accelerator generation, applied to every compute pass::

    compute time = roofline time / κ

κ belongs to a training stack (``Recipe.stack``) as much as to a device: the same GEMMs run
slower under one stack's kernels and scheduling than another's. It is fitted per (stack,
generation) on the **calibration split only**: single-node runs, where communication across nodes
and pipeline bubbles do not blur the compute term —

    megatron  ampere     Korthikanti et al. 2022 Table 4 (per-layer forward+backward times, 22B layer)
    megatron  hopper     NeMo 24.07 and Megatron-Bridge single-node (8 × H100) rows
    megatron  blackwell  Megatron-Bridge single-node (8 × B200 / GB200 / GB300) rows
    pytorch   ampere     llm-foundry single-node 8 × A100-80GB rows (FSDP, Composer)
    pytorch   hopper     llm-foundry single-node 8 × H100 rows
    megatron  cdna3-750w, cdna3-1000w, cdna4-1000w, cdna4-1400w
                         AMD's own MLPerf Training v5.1 Llama 2 70B LoRA run on 8 × MI300X,
                         MI325X, MI350X, MI355X (NeMo / Megatron-Core / Transformer Engine on
                         ROCm), one row each; the partners' runs of the same code (Dell, ASUS,
                         Supermicro, MiTAC, Quanta, GIGABYTE, Cisco, Krai) only validate
    maxtext   tpu        MaxText on one TPU slice: Llama 3.1 8B on v6e-256, Llama 2 70B and the
                         32B reference model on v5p (XLA on TPU; every TPU generation)
    pytorch   cdna3-750w torchtitan (FSDP2, per-op SAC, torch.compile, BF16) Llama 3.1 8B on 8 × MI300X
                         (pytorch/ao's float8 README): the one PyTorch-native AMD run published with
                         its configuration; its H100 twin and ROCm/MAD's Accelerate + Transformer
                         Engine FP8 runs only validate
    neuron    trainium   NeuronX Distributed Llama 2 7B on 16 trn1.32xlarge (every Trainium chip)
    megatron  gaudi      Intel Gaudi Megatron-DeepSpeed, FP8, one node of 8 Gaudi 2: Llama 2 7B and
                         Llama 3.1 8B (Intel's Gaudi 2 model performance page; every Gaudi chip)

AMD publishes no pre-training run with its full configuration in the package: its κ is fitted on
MLPerf LoRA fine-tuning, one node each. On TPU and Trainium no single-node run is published: the calibration rows are the smallest
published runs, one slice (TPU) or 16 instances (Trainium).

A stack without rows on a generation takes the Megatron κ of that generation times the stack's
mean ratio to Megatron over the generations of the same vendor fitted for both (AMD's PyTorch
stack trails AMD's Megatron stack further than NVIDIA's trails NVIDIA's), or over every such
generation when the vendor has none (``timing.stack_ratio``, ``timing.calibrated_kappa``).

as the least-squares fit of log(predicted / published) (the κ that makes the geometric-mean ratio
one). Every other row — Megatron-LM 2021 Table 1, Korthikanti Table 5, all multi-node runs, llm-foundry's
A100-40GB and multi-node rows, torchtitan, torchtune — only validates. ``python -m trainplan.validate.calibrate`` prints the fit and, with
``--write``, stores it in ``hardware/data/calibration.toml``; a test re-fits and compares, so the
stored numbers are always reproducible from the split.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainplan.data_files import data_path
from trainplan.validate.datasets import TimingRow, timing_rows

CALIBRATION_SETS: dict[tuple[str, str], tuple[tuple[str, Callable[[TimingRow], bool]], ...]] = {
    ("megatron", "ampere"): (("korthikanti2022_table4", lambda r: True),),
    ("megatron", "hopper"): (
        ("nemo2407_h100", lambda r: r.split == "calibrate"),
        ("megatron_bridge_llama3", lambda r: r.split == "calibrate" and r.hardware in ("h100-sxm", "h200")),
    ),
    ("megatron", "blackwell"): (
        (
            "megatron_bridge_llama3",
            lambda r: r.split == "calibrate" and r.hardware in ("b200", "b300", "gb200", "gb300"),
        ),
    ),
    ("pytorch", "ampere"): (
        ("llmfoundry_mpt", lambda r: r.split == "calibrate" and r.hardware == "a100-80gb"),
    ),
    ("pytorch", "hopper"): (
        ("llmfoundry_mpt", lambda r: r.split == "calibrate" and r.hardware == "h100-sxm"),
    ),
    ("pytorch", "cdna3-750w"): (
        ("torchao_float8_llama3", lambda r: r.split == "calibrate" and r.hardware == "mi300x"),
    ),
    ("megatron", "cdna3-750w"): (
        ("mlperf51_llama2_70b_lora", lambda r: r.split == "calibrate" and r.hardware == "mi300x"),
    ),
    ("megatron", "cdna3-1000w"): (
        ("mlperf51_llama2_70b_lora", lambda r: r.split == "calibrate" and r.hardware == "mi325x"),
    ),
    ("megatron", "cdna4-1000w"): (
        ("mlperf51_llama2_70b_lora", lambda r: r.split == "calibrate" and r.hardware == "mi350x"),
    ),
    ("megatron", "cdna4-1400w"): (
        ("mlperf51_llama2_70b_lora", lambda r: r.split == "calibrate" and r.hardware == "mi355x"),
    ),
    ("maxtext", "tpu"): (("maxtext_tpu", lambda r: r.split == "calibrate"),),
    ("neuron", "trainium"): (("neuron_trn1", lambda r: r.split == "calibrate"),),
    ("megatron", "gaudi"): (("gaudi2_megatron_deepspeed", lambda r: r.split == "calibrate"),),
    ("megatron", "cdna2"): (("lumi_mi250x_megatron_deepspeed", lambda r: r.split == "calibrate"),),
}
"""(stack, generation) -> the datasets and rows κ is fitted on (the calibration split)."""

RLHF_CALIBRATION_SETS: dict[tuple[str, str], tuple[str, ...]] = {
    ("deepspeed", "ampere"): ("openrlhf-bench-7b-openrlhf-train",),
}
"""(stack, generation) -> RL rows of ``validate/data/rlhf_colocated.csv`` (split ``calibrate``)
κ is fitted on. DeepSpeed: OpenRLHF's colocated Llama-2-7B training phase on one 8-GPU server
(actor and critic ZeRO-3 updates, no cross-node communication); every other OpenRLHF and
DeepSpeed-Chat row judges it. There are no DeepSpeed training-throughput rows outside RL
here; generations without rows take the Megatron κ times the deepspeed/Megatron ratio."""


@dataclass(frozen=True, kw_only=True)
class Fit:
    stack: str
    generation: str
    kappa: float
    rows: tuple[str, ...]
    residual_log_rms: float


def calibration_rows(generation: str, stack: str = "megatron") -> list[TimingRow]:
    out: list[TimingRow] = []
    for dataset, keep in CALIBRATION_SETS[(stack, generation)]:
        out += [r for r in timing_rows(dataset) if r.is_target and keep(r)]
    return out


def _log_errors(rows: Sequence[TimingRow], kappa: float) -> list[float]:
    from trainplan.validate.timing import predict_row

    errs = []
    for row in rows:
        res = predict_row(row, kappa=kappa)
        if res.error is not None:
            errs.append(math.log(1.0 + res.error))
    return errs


def _golden(loss: Callable[[float], float]) -> float:
    """The κ in [0.2, 1.5] minimising ``loss`` (golden-section search, 40 steps), to 4 decimals."""
    lo, hi = 0.2, 1.5
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(40):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return round((lo + hi) / 2.0, 4)


def _rlhf_log_errors(stack: str, generation: str, kappa: float) -> list[float]:
    from trainplan.timing import kappa_override
    from trainplan.validate.rlhf import predict, rows

    chosen = [r for r in rows() if r.name in RLHF_CALIBRATION_SETS[(stack, generation)]]
    with kappa_override(stack, generation, kappa):
        return [math.log(predict(r) / r.published) for r in chosen]


def fit_rlhf_generation(generation: str, stack: str) -> Fit:
    """κ of ``stack`` minimising Σ log²(predicted/published) over its RL calibration rows, each
    predicted through the whole RL estimate (``validate.rlhf.predict``) under
    :func:`trainplan.timing.kappa_override`."""
    kappa = _golden(lambda k: sum(e * e for e in _rlhf_log_errors(stack, generation, k)))
    errs = _rlhf_log_errors(stack, generation, kappa)
    return Fit(
        stack=stack,
        generation=generation,
        kappa=kappa,
        rows=RLHF_CALIBRATION_SETS[(stack, generation)],
        residual_log_rms=math.sqrt(sum(e * e for e in errs) / len(errs)),
    )


def fit_generation(generation: str, stack: str = "megatron") -> Fit:
    """κ minimising Σ log²(predicted/published) over the generation's calibration rows (golden section)."""
    if (stack, generation) in RLHF_CALIBRATION_SETS:
        return fit_rlhf_generation(generation, stack)
    rows = calibration_rows(generation, stack)

    def loss(kappa: float) -> float:
        return sum(e * e for e in _log_errors(rows, kappa))

    kappa = _golden(loss)
    errs = _log_errors(rows, kappa)
    rms = math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0
    return Fit(
        stack=stack,
        generation=generation,
        kappa=kappa,
        rows=tuple(r.name for r in rows),
        residual_log_rms=rms,
    )


def render_toml(fits: Sequence[Fit]) -> str:
    lines = [
        "# Generated by `python -m trainplan.validate.calibrate --write`; do not edit by hand.",
        "# kappa = achieved / microbenchmark compute efficiency of the training stack, per stack and generation,",
        "# fitted on the calibration split named in trainplan/validate/calibrate.py.",
        "",
    ]
    for f in fits:
        lines += [
            "[[generation]]",
            f'stack = "{f.stack}"',
            f'name = "{f.generation}"',
            f"kappa = {f.kappa}",
            f"residual_log_rms = {f.residual_log_rms:.4f}",
            "rows = [" + ", ".join(f'"{r}"' for r in f.rows) + "]",
            "",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainplan.validate.calibrate")
    parser.add_argument(
        "--write", action="store_true", help="store the fit in hardware/data/calibration.toml"
    )
    args = parser.parse_args(argv)
    fits = [fit_generation(g, st) for st, g in (*CALIBRATION_SETS, *RLHF_CALIBRATION_SETS)]
    for f in fits:
        print(
            f"{f.stack:9s} {f.generation:10s} kappa={f.kappa:.4f}  rows={len(f.rows)}  "
            f"residual log-rms={f.residual_log_rms:.3f}"
        )
    if args.write:
        target = Path(data_path("trainplan.hardware", "data", "calibration.toml"))
        target.write_text(render_toml(fits), encoding="utf-8")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _generation_key(cell: str) -> str:
    """``"CDNA 3, 1,000 W (MI325X)"`` -> ``"cdna31000w"``, the generation name without punctuation."""
    return "".join(ch for ch in cell.split("(", 1)[0].lower() if ch.isalnum())


def rewrite_kappa_cells(table: str) -> str:
    """docs/timing.md's κ table (``| stack | generation | calibration rows | κ |`` rows) with each
    κ cell set from ``calibration.toml``; a row whose (stack, generation) has no κ is an error."""
    from trainplan.timing import _calibration

    fitted = {
        (stack, "".join(ch for ch in name if ch.isalnum())): k for (stack, name), k in _calibration().items()
    }
    out = []
    for line in table.split("\n"):
        cells = line.split(" | ")
        if len(cells) == 4 and line.startswith("| ") and not line.startswith(("| stack", "|---")):
            key = (cells[0][2:].strip(), _generation_key(cells[1]))
            if key not in fitted:
                raise ValueError(f"docs/timing.md κ table: no κ in calibration.toml for {key}")
            cells[3] = f"{fitted[key]:.3f} |"
            line = " | ".join(cells)
        out.append(line)
    return "\n".join(out)
