"""The one function everything stands on: ``estimate(system, model, recipe, layout) -> Estimate``.

(:func:`trainplan.estimate` is the keyword form of it, :mod:`trainplan.api`.)

It composes the cost families — memory (``memory.py``), and, where available, step time
(``timing.py``) and run cost (``cost.py``) — into one typed result whose ``to_dict()`` has the
stable JSON keys of the CLI (see docs/cli.md)::

    model.params  model.trainable_params
    memory.per_device_bytes  memory.capacity_bytes  memory.fits  memory.weights_bytes
    memory.gradients_bytes  memory.optimizer_bytes  memory.activations_bytes
    time.step_s  throughput.tokens_per_s  throughput.mfu
    run.time_s  run.device_hours  run.cost_usd

and the prediction bands of :mod:`trainplan.bands` (``[low, high]``, absolute values)::

    time.step_s_band  throughput.tokens_per_s_band  memory.per_device_bytes_band
    memory.fit_verdict  run.time_s_band  run.cost_usd_band  calibration
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.bands import Band, FitVerdict, fit_verdict, memory_band, step_band
from trainplan.cost import DEFAULT_PUE, RunCost, run_cost
from trainplan.errors import RecipeError, TrainplanError
from trainplan.goodput import DEFAULT_RELIABILITY, Reliability, checkpoint_bytes
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import MemoryBreakdown, memory_breakdown
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe
from trainplan.sharding import device_params
from trainplan.timing import Throughput, TimeBreakdown, step_time, throughput


@dataclass(frozen=True, kw_only=True)
class ModelSummary:
    name: str
    params: int
    active_params: int
    trainable_params: int

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "params": self.params,
            "active_params": self.active_params,
            "trainable_params": self.trainable_params,
        }


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Everything trainplan predicts for one (system, model, recipe, layout)."""

    system: System
    model: ModelSpec
    recipe: Recipe
    layout: Layout
    summary: ModelSummary
    memory: MemoryBreakdown
    num_microbatches: int
    time: TimeBreakdown
    throughput: Throughput
    run: RunCost
    step_band: Band  # of step time; also tokens/s (inverted), run time and cost
    memory_band: Band  # of the peak memory per device

    @property
    def feasible(self) -> bool:
        return self.memory.fits

    @property
    def fit_verdict(self) -> FitVerdict:
        """``bands.fit_verdict`` of device memory; offloaded states over the host memory do not fit."""
        if self.memory.host_fits is False:
            return "does not fit"
        return fit_verdict(self.memory.per_device_bytes, self.memory.capacity_bytes, self.memory_band)

    def calibration(self) -> dict[str, object]:
        """``calibration``: the step-time class (``class``, ``rows``, ``calibrated``) and the memory class."""
        return {**self.step_band.to_dict(), "memory": self.memory_band.to_dict()}

    def _run_dict(self) -> dict[str, object]:
        """``run`` with the step-time band carried to run time and cost (both scale with step time)."""
        t, c = self.run.time_s, self.run.cost_usd
        return {
            **self.run.to_dict(),
            "time_s_band": None if t is None else list(self.step_band.around(t)),
            "cost_usd_band": None if c is None else list(self.step_band.around(c)),
        }

    def reasons(self) -> list[str]:
        return self.memory.reasons()

    def to_dict(self) -> dict[str, object]:
        """Stable JSON keys (docs/cli.md); more may be added, none change meaning."""
        return {
            "hardware": self.system.accelerator.name,
            "devices": self.system.num_devices,
            "system": self.system.to_dict(),
            "model": self.summary.to_dict(),
            "recipe": recipe_to_dict(self.recipe),
            "layout": layout_to_dict(self.layout),
            "num_microbatches": self.num_microbatches,
            "memory": {
                **self.memory.to_dict(),
                "per_device_bytes_band": list(self.memory_band.around(self.memory.per_device_bytes)),
                "fit_verdict": self.fit_verdict,
            },
            "time": {**self.time.to_dict(), "step_s_band": list(self.step_band.around(self.time.step_s))},
            "throughput": {
                **self.throughput.to_dict(),
                "tokens_per_s_per_device": self.throughput.tokens_per_s / self.system.num_devices,
                "tokens_per_s_band": list(self.step_band.around_inverse(self.throughput.tokens_per_s)),
            },
            "run": self._run_dict(),
            "calibration": self.calibration(),
            "feasible": self.feasible,
            "reasons": self.reasons(),
        }


def recipe_to_dict(recipe: Recipe) -> dict[str, object]:
    out: dict[str, object] = {
        "method": recipe.method,
        "precision": recipe.precision,
        "optimizer": recipe.optimizer,
        "seq_len": recipe.seq_len,
        "micro_batch": recipe.micro_batch,
        "global_batch": recipe.global_batch,
        "tokens": recipe.tokens,
        "recompute": recipe.recompute,
        "recompute_early_stop": recipe.recompute_early_stop,
        "stack": recipe.stack,
        "attention": recipe.attention,
        "offload": recipe.offload,
        "dropout": recipe.dropout,
        "master_weights": recipe.master_weights,
        "loss_chunks": recipe.loss_chunks,
        "optimizer_in_backward": recipe.optimizer_in_backward,
        "paged_optimizer": recipe.paged_optimizer,
    }
    if recipe.lora is not None:
        out["lora"] = {
            "rank": recipe.lora.rank,
            "alpha": recipe.lora.alpha,
            "targets": list(recipe.lora.targets),
            "double_quant": recipe.lora.double_quant,
        }
    return out


def layout_to_dict(layout: Layout) -> dict[str, object]:
    return {
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "ep": layout.ep,
        "zero": layout.zero,
        "sequence_parallel": layout.sequence_parallel,
        "pp_schedule": layout.pp_schedule,
        "virtual_stages": layout.virtual_stages,
        "overlap_grad_reduce": layout.overlap_grad_reduce,
        "tp_comm_overlap": layout.tp_comm_overlap,
        "pp_comm_overlap": layout.pp_comm_overlap,
        "zero3_granularity": layout.zero3_granularity,
        "grad_accumulation": layout.grad_accumulation,
    }


def trainable_params(model: ModelSpec, recipe: Recipe, layout: Layout) -> int:
    """Trained parameters of the whole model: all of them, or the LoRA adapters (summed over stages)."""
    total = count_params(model).total
    if not recipe.is_peft:
        return total
    single = Layout(dp=1, tp=1, pp=1)
    return device_params(model, single, 0, recipe.lora).lora_adapters


def check_precision(system: System, recipe: Recipe) -> None:
    """A precision whose GEMM dtype the device lacks is an error, never an extrapolation."""
    acc = system.accelerator
    dtype = recipe.gemm_dtype
    if recipe.precision == "fp32" and not acc.supports("tf32"):
        dtype = "fp32"
    if not acc.supports(dtype):
        supported = ", ".join(acc.supported_dtypes)
        raise RecipeError(
            "precision",
            f"{acc.name} has no {dtype} peak (it supports {supported}); choose a precision it supports",
        )


def estimate(
    system: System,
    model: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    *,
    price_usd_per_device_hour: float | None = None,
    provider: str | None = None,
    pue: float = DEFAULT_PUE,
    reliability: Reliability | None = DEFAULT_RELIABILITY,
) -> Estimate:
    """Predict memory, step time, throughput and run cost of one training configuration.

    ``reliability``: interruptions and checkpoints of a long run (goodput.py); ``None`` leaves
    them out (the run's time is its steps alone)."""
    if layout.num_devices != system.num_devices:
        raise TrainplanError(
            "devices",
            f"layout uses dp·tp·pp·cp = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = "
            f"{layout.num_devices} devices but the system has {system.num_devices}",
        )
    layout.check_model(model)
    check_precision(system, recipe)
    nmb = layout.check_batch(
        seq_len=recipe.seq_len, micro_batch=recipe.micro_batch, global_batch=recipe.global_batch
    )
    counts = count_params(model)
    summary = ModelSummary(
        name=model.name,
        params=counts.total,
        active_params=counts.active,
        trainable_params=trainable_params(model, recipe, layout),
    )
    mem = memory_breakdown(
        model,
        recipe,
        layout,
        capacity_bytes=system.accelerator.memory_bytes,
        num_microbatches=nmb,
        host_capacity_bytes_per_node=system.host_memory_bytes_per_node,
        devices_on_node=system.devices_on_a_node,
    )
    time = step_time(system, model, recipe, layout, memory=mem)
    thr = throughput(system, model, recipe, layout, time)
    run = run_cost(
        system,
        time,
        thr,
        tokens=recipe.tokens,
        price_usd_per_device_hour=price_usd_per_device_hour,
        provider=provider,
        pue=pue,
        checkpoint_bytes=float(checkpoint_bytes(summary.trainable_params, recipe)),
        reliability=reliability,
    )
    return Estimate(
        system=system,
        model=model,
        recipe=recipe,
        layout=layout,
        summary=summary,
        memory=mem,
        num_microbatches=nmb,
        time=time,
        throughput=thr,
        run=run,
        step_band=step_band(system.accelerator, recipe, layout),
        memory_band=memory_band(system.accelerator, recipe, layout),
    )
