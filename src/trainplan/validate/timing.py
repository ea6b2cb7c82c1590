"""Predicted vs published step time / throughput, per row and per dataset (``trainplan validate``).

Each published row becomes an ``estimate`` input: its model (preset or explicit dimensions), its
accelerator, its recipe and its layout. Configuration a source does not publish is filled by a
named assumption listed in the row's ``assumptions`` (never silently): micro-batch 1 when the
table gives none, ZeRO-1 (distributed optimizer) when a Megatron/NeMo row gives none, the
pipeline schedule 1F1B, recompute "none" when unstated, trainplan's default LoRA adapters when a
LoRA row states none.

The recipe follows the row's optional recipe columns (``datasets.TimingRow``): ``optimizer``
(empty: AdamW), ``offload`` (empty: none) and ``recipe_flags`` (paged optimizer, optimizer in
backward, pure 16-bit training without master weights, chunked loss, LoRA rank / alpha /
targets, ``torch_compile``, and the layout's tensor- / pipeline-parallel communication overlap).
``packed`` is a recorded fact of the run with no recipe field: a packed row's ``seq_len`` already
is the tokens per sequence.

Error = predicted / published − 1 of the dataset's metric; a dataset fails when its MAPE exceeds
its stated bound (``datasets.REGISTRY``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trainplan.errors import TrainplanError
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.recipe import RECOMPUTES, Attention, LoRASpec, Recipe
from trainplan.timing import step_time, throughput
from trainplan.validate.datasets import REGISTRY, TimingRow, timing_rows


@dataclass(frozen=True, kw_only=True)
class RowResult:
    name: str
    dataset: str
    split: str
    metric: str
    published: float
    predicted: float | None
    error: float | None  # predicted / published − 1
    assumptions: tuple[str, ...]
    skipped: str = ""  # why the row could not be predicted

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dataset": self.dataset,
            "split": self.split,
            "metric": self.metric,
            "published": self.published,
            "predicted": self.predicted,
            "error": self.error,
            "assumptions": list(self.assumptions),
            "skipped": self.skipped,
        }


@dataclass(frozen=True, kw_only=True)
class DatasetResult:
    name: str
    bound: float
    rows: tuple[RowResult, ...]

    @property
    def scored(self) -> list[RowResult]:
        return [r for r in self.rows if r.error is not None and r.split == "validate"]

    @property
    def mape(self) -> float | None:
        errs = [abs(r.error) for r in self.scored if r.error is not None]
        return statistics.fmean(errs) if errs else None

    @property
    def passed(self) -> bool:
        return self.mape is None or self.mape <= self.bound

    def to_dict(self) -> dict[str, object]:
        return {
            "dataset": self.name,
            "bound": self.bound,
            "mape": self.mape,
            "passed": self.passed,
            "rows_scored": len(self.scored),
            "rows": [r.to_dict() for r in self.rows],
        }


def _model(row: TimingRow) -> ModelSpec:
    if row.preset is not None:
        return load_model(row.preset)
    d = row.dims
    if d is None:
        raise TrainplanError("model", f"row {row.name} names neither a preset nor dimensions")
    if d.arch == "maxtext":
        return ModelSpec(
            name=row.model,
            family="maxtext",
            num_layers=d.layers,
            hidden_size=d.hidden,
            num_heads=d.heads,
            num_kv_heads=d.kv_heads,
            head_dim=d.head_dim,
            ffn_hidden=d.ffn,
            vocab_size=d.vocab,
            activation="gelu",
            norm="rmsnorm",
            position="rope",
            tied_embeddings=True,
            max_seq_len=row.seq_len or 2048,
        )
    gpt = d.arch in ("gpt", "mpt")
    return ModelSpec(
        name=row.model,
        family="megatron" if gpt else "llama",
        num_layers=d.layers,
        hidden_size=d.hidden,
        num_heads=d.heads,
        num_kv_heads=d.kv_heads,
        head_dim=d.head_dim,
        ffn_hidden=d.ffn,
        vocab_size=d.vocab,
        activation="gelu" if gpt else "swiglu",
        norm="layernorm" if gpt else "rmsnorm",
        position="learned" if d.arch == "gpt" else ("alibi" if d.arch == "mpt" else "rope"),
        tied_embeddings=gpt,
        max_seq_len=row.seq_len or 2048,
        qkv_bias=d.arch == "gpt",
        attn_out_bias=d.arch == "gpt",
        mlp_bias=d.arch == "gpt",
    )


def _lora(row: TimingRow, assumptions: list[str]) -> LoRASpec | None:
    """The row's LoRA adapters (``recipe_flags``); trainplan's defaults for what it does not state."""
    if row.method not in ("lora", "qlora"):
        return None
    flags, default = row.recipe_flags, LoRASpec()
    if not flags.has_lora:
        assumptions.append(
            f"LoRA rank {default.rank}, alpha {default.alpha:g} on {'+'.join(default.targets)} "
            "(trainplan default; not published)"
        )
        return default
    missing = [
        f"{name}={value}"
        for name, given, value in (
            ("lora_rank", flags.lora_rank, default.rank),
            ("lora_alpha", flags.lora_alpha, f"{default.alpha:g}"),
            ("lora_targets", flags.lora_targets, "+".join(default.targets)),
        )
        if given is None
    ]
    if missing:
        assumptions.append(f"{', '.join(missing)} (trainplan default; not published)")
    return LoRASpec(
        rank=flags.lora_rank if flags.lora_rank is not None else default.rank,
        alpha=flags.lora_alpha if flags.lora_alpha is not None else default.alpha,
        targets=flags.lora_targets if flags.lora_targets is not None else default.targets,
    )


def row_inputs(row: TimingRow) -> tuple[System, ModelSpec, Recipe, Layout, tuple[str, ...]]:
    """The estimate inputs of a published row and the assumptions that fill its gaps."""
    assumptions: list[str] = []
    micro = row.micro_batch
    if micro is None:
        micro = 1
        assumptions.append("micro_batch=1 (not published)")
    zero = row.zero
    if zero is None:
        zero = 1
        assumptions.append("zero=1 (distributed optimizer; not published)")
    schedule = row.pp_schedule or "1f1b"
    if row.pp > 1 and row.pp_schedule is None:
        assumptions.append("pp_schedule=1f1b (not published)")
    if schedule not in ("1f1b", "interleaved", "zb"):
        schedule = "1f1b"
    v = row.virtual_stages or 1
    if schedule != "interleaved":
        v = 1
    elif row.virtual_stages is None:
        v = 2
        assumptions.append("virtual_stages=2 (interleaved, count not published)")
    recompute = row.recompute if row.recompute in RECOMPUTES else "none"
    if row.recompute == "unstated":
        assumptions.append("recompute=none (not published)")
    precision = row.precision if row.precision in ("fp32", "bf16", "fp16", "fp8", "fp4") else "bf16"
    seq = row.seq_len or 2048
    sp = bool(row.sequence_parallel) and row.tp > 1
    model = _model(row)
    attention: Attention = (
        "eager" if row.dataset.startswith(("megatron2021", "korthikanti", "lumi_mi250x")) else "flash"
    )
    overlap_grad_reduce = True
    if row.dataset.startswith("megatron2021") and zero == 0:
        overlap_grad_reduce = False
        assumptions.append("gradient all-reduce after the backward (Megatron-LM 2021 LocalDDP)")
    if row.dataset.startswith("lumi_mi250x"):
        # DeepSpeed 0.8.1's pipeline engine reduces the accumulated gradients after the last
        # micro-batch (PipelineEngine._exec_reduce_grads); they travel in FP32 there
        # (BF16_Optimizer accumulate_allreduce_grads_in_fp32), costed in the weight dtype
        overlap_grad_reduce = False
        assumptions.append(
            "gradient all-reduce after the backward (DeepSpeed pipeline engine), in bf16 not fp32"
        )
    flags = row.recipe_flags
    recipe = Recipe(
        method="pretrain" if row.method not in ("full", "lora", "qlora") else row.method,  # type: ignore[arg-type]
        precision=precision,  # type: ignore[arg-type]
        optimizer=(row.optimizer or "adamw"),  # type: ignore[arg-type]
        seq_len=seq,
        micro_batch=micro,
        global_batch=row.global_batch,
        recompute=recompute,  # type: ignore[arg-type]
        attention=attention,
        offload=(row.offload or "none"),  # type: ignore[arg-type]
        lora=_lora(row, assumptions),
        dropout=0.1 if attention == "eager" else 0.0,
        master_weights=flags.master_weights,
        loss_chunks=flags.loss_chunks or 1,
        optimizer_in_backward=flags.optimizer_in_backward,
        paged_optimizer=flags.paged_optimizer,
        recompute_early_stop=flags.recompute_early_stop,
        torch_compile=flags.torch_compile,
        triton_attention=flags.triton_attention,
        moe_capacity_factor=flags.moe_capacity_factor,
        moe_dispatch=(flags.moe_dispatch or "gather"),  # type: ignore[arg-type]
        mtp_layers=flags.mtp_layers,
        recompute_layers=flags.recompute_layers,
        fp8_params=flags.fp8_params,
        fp8_activation_store=flags.fp8_activation_store,
        fp8_attention=flags.fp8_attention,
        fused_cross_entropy=flags.fused_cross_entropy,
        recompute_modules=flags.recompute_modules,
        stack=REGISTRY[row.dataset].stack,  # type: ignore[arg-type]
    )
    layout = Layout(
        dp=row.dp,
        tp=row.tp,
        pp=row.pp,
        cp=row.cp,
        ep=row.ep,
        zero=zero,
        sequence_parallel=sp,
        pp_schedule=schedule,  # type: ignore[arg-type]
        virtual_stages=v,
        overlap_grad_reduce=overlap_grad_reduce,
        tp_comm_overlap=flags.tp_comm_overlap,
        pp_comm_overlap=flags.pp_comm_overlap,
        ep_comm_overlap=flags.ep_comm_overlap,
        zero3_granularity="parameter" if flags.zero3_per_parameter else "block",
        grad_accumulation=flags.grad_accumulation or "fused",  # type: ignore[arg-type]
        pp_split_embedding=flags.pp_split_embedding,
        pp_split_head=flags.pp_split_head,
        etp=flags.etp,
    )
    system = System(accelerator=get_accelerator(row.hardware), num_devices=row.num_devices)
    # the MTP modules are layers of the model the run trains (ModelSpec.with_mtp)
    return system, model.with_mtp(recipe.mtp_layers), recipe, layout, tuple(assumptions)


def predict_row(row: TimingRow, *, kappa: float | None = None) -> RowResult:
    metric = REGISTRY[row.dataset].metric
    published: float | None
    if metric in ("step_s", "layer_s"):
        published = row.step_s
    elif metric == "tokens_per_s":
        published = row.tokens_per_s
    else:
        published = row.measured_mfu
    base = {"name": row.name, "dataset": row.dataset, "split": row.split, "metric": metric}
    if published is None:
        return RowResult(
            **base,
            published=float("nan"),
            predicted=None,
            error=None,
            assumptions=(),
            skipped="no published value for the metric",
        )
    try:
        system, model, recipe, layout, assumptions = row_inputs(row)
        t = step_time(system, model, recipe, layout, kappa=kappa)
        if metric == "step_s":
            predicted = t.step_s
        elif metric == "layer_s":
            predicted = (t.forward_s + t.backward_s + t.recompute_s + t.exposed_tp_s) / model.num_layers
        elif metric == "tokens_per_s":
            predicted = throughput(system, model, recipe, layout, t).tokens_per_s
        else:
            predicted = throughput(system, model, recipe, layout, t).mfu
    except TrainplanError as err:
        return RowResult(
            **base, published=published, predicted=None, error=None, assumptions=(), skipped=str(err)
        )
    return RowResult(
        **base,
        published=published,
        predicted=predicted,
        error=predicted / published - 1.0,
        assumptions=assumptions,
    )


def validate_dataset(name: str) -> DatasetResult:
    rows = [r for r in timing_rows(name) if r.is_target]
    return DatasetResult(name=name, bound=REGISTRY[name].mape_bound, rows=tuple(predict_row(r) for r in rows))


TIMING_DATASETS = tuple(n for n, d in REGISTRY.items() if d.kind == "timing")
