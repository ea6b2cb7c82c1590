"""Every dataset, predicted vs published, with per-row errors and per-dataset MAPE.

``trainplan validate`` prints this report and exits 1 when a dataset's MAPE (over its validation
rows) exceeds its stated bound; ``--markdown FILE`` writes the generated docs/validation.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from trainplan.errors import TrainplanError
from trainplan.layout import Layout
from trainplan.memory import memory_breakdown
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.recipe import RECOMPUTES, Recipe
from trainplan.sharding import DeviceParams
from trainplan.validate.datasets import REGISTRY, MemoryRow, memory_rows, timing_rows
from trainplan.validate.timing import TIMING_DATASETS, DatasetResult, RowResult, validate_dataset


def zero_model_states_bytes(row: MemoryRow) -> float:
    """Model states of Ψ parameters under the row's ZeRO stage and dp (ZeRO Table 1 setting)."""
    from trainplan.memory import _model_states

    if row.params is None or row.dp is None or row.zero is None:
        raise TrainplanError("params", f"row {row.name} lacks params, dp or zero")
    psi = int(row.params)
    dev = DeviceParams(
        stage=0,
        layers=(),
        dense_linear=psi,
        dense_other=0,
        expert_linear=0,
        lora_adapters=0,
        largest_layer_unsharded=0,
        linears=(),
    )
    recipe = Recipe(method="pretrain", precision="fp16")
    st = _model_states(load_model("gpt2"), recipe, Layout(dp=row.dp, zero=row.zero), dev)
    return st.weights + st.gradients + st.optimizer


def memory_row_inputs(row: MemoryRow) -> tuple[ModelSpec, Recipe, Layout]:
    """The model, recipe and layout of a per-layout memory row (torchtitan_memory)."""
    if row.preset is None or row.seq_len is None or row.micro_batch is None:
        raise TrainplanError("model", "row lacks a preset, sequence length or micro-batch")
    model = load_model(row.preset)
    recompute = row.recompute if row.recompute in RECOMPUTES else "none"
    recipe = Recipe(
        method=row.method if row.method in ("full", "lora", "qlora") else "pretrain",  # type: ignore[arg-type]
        precision="bf16",
        seq_len=row.seq_len,
        micro_batch=row.micro_batch,
        recompute=recompute,  # type: ignore[arg-type]
        stack=REGISTRY[row.dataset].stack,  # type: ignore[arg-type]
    )
    tp = row.tp or 1
    # torchtitan (the only per-layout memory source here) always pairs TP with sequence
    # parallelism on norms and the loss (torchtitan/parallelisms/parallelize_llama.py).
    layout = Layout(
        dp=row.dp or 1,
        tp=tp,
        pp=row.pp or 1,
        cp=row.cp or 1,
        zero=row.zero or 0,
        sequence_parallel=tp > 1,
    )
    return model, recipe, layout


def memory_row_result(row: MemoryRow) -> RowResult:
    base = {"name": row.name, "dataset": row.dataset, "split": row.split, "metric": row.quantity}
    try:
        if row.quantity == "model_states":
            predicted = zero_model_states_bytes(row)
        else:
            model, recipe, layout = memory_row_inputs(row)
            mem = memory_breakdown(model, recipe, layout)
            predicted = mem.per_device_bytes if row.quantity == "peak_reserved" else mem.peak_bytes
    except TrainplanError as err:
        return RowResult(
            **base, published=row.measured_bytes, predicted=None, error=None, assumptions=(), skipped=str(err)
        )
    return RowResult(
        **base,
        published=row.measured_bytes,
        predicted=predicted,
        error=predicted / row.measured_bytes - 1.0,
        assumptions=(),
    )


MEMORY_DATASETS = ("zero2020_table1", "torchtitan_memory")


def validate_memory_dataset(name: str) -> DatasetResult:
    rows = [r for r in memory_rows(name) if r.is_target and r.bound == "eq"]
    return DatasetResult(
        name=name, bound=REGISTRY[name].mape_bound, rows=tuple(memory_row_result(r) for r in rows)
    )


def run_all(names: list[str] | None = None) -> list[DatasetResult]:
    from trainplan.validate.rlhf import RLHF_DATASETS, validate_rlhf_dataset

    out = []
    from trainplan.validate.hf_context import DATASET as HF_CONTEXT
    from trainplan.validate.hf_context import validate_hf_context

    known = (*TIMING_DATASETS, *MEMORY_DATASETS, HF_CONTEXT, *RLHF_DATASETS)
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise TrainplanError(
            "dataset",
            f"unknown dataset {', '.join(map(repr, unknown))}; choose from {', '.join(sorted(known))}",
        )
    for name in known:
        if names and name not in names:
            continue
        if name in RLHF_DATASETS:
            res = validate_rlhf_dataset(name)
        elif name == HF_CONTEXT:
            res = validate_hf_context()
        elif name in MEMORY_DATASETS:
            res = validate_memory_dataset(name)
        else:
            res = validate_dataset(name)
        if res.rows:
            out.append(res)
    return out


def _target(name: str) -> str:
    t = REGISTRY[name].target if name in REGISTRY else None
    return "—" if t is None else f"{100 * t:.0f}%"


def _target_note(res: DatasetResult) -> str:
    t = REGISTRY[res.name].target if res.name in REGISTRY else None
    if t is None or res.mape is None:
        return ""
    return " (target met)" if res.mape <= t else " (target not met)"


@dataclass(frozen=True, kw_only=True)
class FamilySummary:
    """Step-time accuracy of one accelerator family × training stack, calibration rows apart."""

    family: str
    stack: str
    datasets: tuple[str, ...]
    calibration_rows: int
    calibration_mape: float | None  # how well κ fits its own rows (not a validation figure)
    validation_rows: int
    validation_mape: float | None
    validation_bias: float | None


def family_summaries(results: list[DatasetResult]) -> list[FamilySummary]:
    """Per accelerator family (``bands.accelerator_family``) and stack: MAPE of the validation
    rows, and separately the fit error of the calibration rows κ was fitted on."""
    from trainplan.bands import accelerator_family
    from trainplan.hardware import get_accelerator

    groups: dict[tuple[str, str], list[tuple[str, RowResult]]] = {}
    for res in results:
        if res.name not in TIMING_DATASETS:
            continue
        hardware = {r.name: r.hardware for r in timing_rows(res.name)}
        for r in res.rows:
            if r.error is None:
                continue
            key = (accelerator_family(get_accelerator(hardware[r.name])), REGISTRY[res.name].stack)
            groups.setdefault(key, []).append((res.name, r))
    out = []
    for (family, stack), items in sorted(groups.items()):
        cal = [abs(r.error) for _, r in items if r.split == "calibrate" and r.error is not None]
        val = [r.error for _, r in items if r.split == "validate" and r.error is not None]
        out.append(
            FamilySummary(
                family=family,
                stack=stack,
                datasets=tuple(sorted({d for d, _ in items})),
                calibration_rows=len(cal),
                calibration_mape=statistics.fmean(cal) if cal else None,
                validation_rows=len(val),
                validation_mape=statistics.fmean(abs(e) for e in val) if val else None,
                validation_bias=statistics.fmean(val) if val else None,
            )
        )
    return out


def _pct_or_dash(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def render_family_markdown(results: list[DatasetResult]) -> list[str]:
    out = [
        "",
        "## Step time by accelerator family",
        "",
        "Each family × training stack: the MAPE of its **validation** rows, and apart from it the fit",
        "error of the calibration rows its κ was fitted on. A family that is not listed (MI250X,",
        "Cerebras) has no published training run in the package: it runs uncalibrated (κ = 1,",
        "microbenchmark efficiencies only) and carries the uncalibrated band, as does a family with",
        "fewer validation rows than a band needs (Gaudi, whose κ from Gaudi 2 runs also serves",
        "Gaudi 3). Trainium's rows are Trn1 runs: Trn2 and Trn3 take the Trainium κ and band, marked",
        "as measured on Trn1 only (Prediction bands, below). AMD's validation rows are other",
        "submitters' runs of AMD's code on the same chips: they measure how well one run stands for",
        "the others; the out-of-sample AMD check is the cross-vendor order against the H200 rows",
        "of the same benchmark, and Gaudi 2's the per-chip order H100 > Gaudi 2 > A100 that",
        "Databricks published for LLM Foundry (tests/test_timing.py).",
        "",
        "| family | stack | datasets | calibration rows | calibration fit | validation rows | validation MAPE | bias |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in family_summaries(results):
        out.append(
            f"| {f.family} | {f.stack} | {', '.join(f.datasets)} | {f.calibration_rows} | "
            f"{_pct_or_dash(f.calibration_mape)} | {f.validation_rows} | {_pct_or_dash(f.validation_mape)} | "
            f"{_pct_or_dash(f.validation_bias, signed=True)} |"
        )
    return out


def render_text(results: list[DatasetResult], *, rows: bool = False, history: bool = False) -> str:
    """The summary table and the per-family summary; with ``history`` (a run of every dataset),
    the model changes before → now (:mod:`trainplan.validate.history`)."""
    lines = [
        f"{'dataset':28s} {'rows':>5s} {'scored':>6s} {'MAPE':>7s} {'bias':>7s} {'bound':>6s} {'target':>6s}  verdict"
    ]
    for res in results:
        errs = [r.error for r in res.scored if r.error is not None]
        bias = statistics.fmean(errs) if errs else None
        mape = res.mape
        lines.append(
            f"{res.name:28s} {len(res.rows):5d} {len(res.scored):6d} "
            f"{'—' if mape is None else f'{100 * mape:6.1f}%':>7s} "
            f"{'—' if bias is None else f'{100 * bias:+6.1f}%':>7s} {100 * res.bound:5.0f}% "
            f"{_target(res.name):>6s}  {'pass' if res.passed else 'FAIL'}{_target_note(res)}"
        )
        if rows:
            for r in res.rows:
                err = "skipped: " + r.skipped if r.error is None else f"{100 * r.error:+6.1f}%"
                lines.append(f"    {r.name[:60]:60s} [{r.split}] {err}")
    lines += ["", "step time by accelerator family (validation rows; calibration rows apart):"]
    for f in family_summaries(results):
        lines.append(
            f"  {f.family:10s} {f.stack:9s} validation {f.validation_rows:3d} rows "
            f"MAPE {_pct_or_dash(f.validation_mape):>6s}   calibration {f.calibration_rows:3d} rows "
            f"fit {_pct_or_dash(f.calibration_mape):>6s}"
        )
    if history:
        from trainplan.validate.history import render_text as history_text

        lines += history_text(results)
    return "\n".join(lines)


def render_markdown(results: list[DatasetResult], *, history: bool = True) -> str:
    out = [
        "# Validation report",
        "",
        "Generated by `trainplan validate --markdown docs/validation.md`; do not edit by hand.",
        "Error = predicted / published − 1. MAPE and bias are over the **validation** rows only;",
        "calibration rows (see docs/timing.md) are listed but never scored.",
        "",
        "| dataset | rows | scored | MAPE | bias | enforced bound | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        errs = [r.error for r in res.scored if r.error is not None]
        bias = statistics.fmean(errs) if errs else None
        mape = res.mape
        out.append(
            f"| {res.name} | {len(res.rows)} | {len(res.scored)} | "
            f"{'—' if mape is None else f'{100 * mape:.1f}%'} | {'—' if bias is None else f'{100 * bias:+.1f}%'} | "
            f"{100 * res.bound:.0f}% | {_target(res.name)} | {'pass' if res.passed else 'FAIL'}{_target_note(res)} |"
        )
    out += render_family_markdown(results)
    if history:
        from trainplan.validate.history import render_markdown as history_markdown

        out += history_markdown(results)
    for res in results:
        out += [
            "",
            f"## {res.name}",
            "",
            "| row | split | published | predicted | error | assumptions |",
            "|---|---|---|---|---|---|",
        ]
        for r in res.rows:
            if r.error is None:
                out.append(f"| {r.name} | {r.split} | {r.published:.4g} | — | skipped: {r.skipped} | |")
            else:
                pred = 0.0 if r.predicted is None else r.predicted
                out.append(
                    f"| {r.name} | {r.split} | {r.published:.4g} | {pred:.4g} | {100 * r.error:+.1f}% | "
                    f"{'; '.join(r.assumptions)} |"
                )
    from trainplan.validate.bands import render_bands_markdown
    from trainplan.validate.claims import render_claims_markdown
    from trainplan.validate.fits import render_fits_markdown

    out += render_claims_markdown()
    out += render_fits_markdown()
    return "\n".join(out) + "\n\n" + render_bands_markdown()


__all__ = ["render_markdown", "render_text", "replace", "run_all"]
