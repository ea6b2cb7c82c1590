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

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from trainplan.attention import fp8_generations
from trainplan.bands import Band, FitVerdict, fit_verdict, memory_band, step_band
from trainplan.cost import DEFAULT_PUE, RunCost, run_cost
from trainplan.errors import RecipeError, TrainplanError
from trainplan.flops import check_fp8_layout, mfu_definition
from trainplan.goodput import DEFAULT_RELIABILITY, Reliability, checkpoint_bytes
from trainplan.hardware.prices import OPEN, PriceQuery
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import MemoryBreakdown, memory_breakdown
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe, check_model_recipe
from trainplan.rlhf import (
    RLHFEstimate,
    RLHFSpec,
    estimate_rlhf,
    is_rlhf,
    seq_lengths,
    timed_recipe,
    update_recipe,
    updates_per_step,
)
from trainplan.rlhf_groups import actor_placement
from trainplan.sharding import device_params
from trainplan.terms import RLHF_TERM_KEYS, TIME_TERMS
from trainplan.timing import GENERATION, Throughput, TimeBreakdown, step_time, throughput

if TYPE_CHECKING:
    from trainplan.engines import Applied


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
    rlhf: RLHFEstimate | None = None
    """PPO / GRPO / DPO / reward-model training: memory per phase and the RL step's terms
    (:mod:`trainplan.rlhf`). Then ``memory`` is the actor's own training step, ``time`` the whole
    RL step (its RL terms filled in) and ``feasible`` the RL job's fit."""
    engine: Applied | None = None
    """The engine that filled the settings the request left unset, where the estimate was built
    from input fields (``trainplan.engines.resolve``); ``None`` for typed inputs."""

    @property
    def feasible(self) -> bool:
        return self.rlhf.fits if self.rlhf is not None else self.memory.fits

    @property
    def fit_verdict(self) -> FitVerdict:
        """``bands.fit_verdict`` of device memory against the usable memory (the capacity less
        ``memory_margin``, as ``memory.fits`` judges); offloaded states over the host memory do
        not fit."""
        if self.memory.host_fits is False:
            return "does not fit"
        return fit_verdict(self.memory.per_device_bytes, self.memory.usable_bytes, self.memory_band)

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
        return self.rlhf.reasons() if self.rlhf is not None else self.memory.reasons()

    def to_dict(self) -> dict[str, object]:
        """Stable JSON keys (docs/cli.md); more may be added, none change meaning."""
        out = {
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
                "mfu_definition": mfu_definition(self.recipe),
            },
            "run": self._run_dict(),
            "calibration": self.calibration(),
            "feasible": self.feasible,
            "reasons": self.reasons(),
            **({"engine": self.engine.to_dict()} if self.engine is not None else {}),
        }
        if self.rlhf is not None:
            memory = dict(self.memory.to_dict())
            memory["actor_training_bytes"] = memory["per_device_bytes"]
            memory.update(
                per_device_bytes=self.rlhf.per_device_bytes,
                fits=self.rlhf.fits,
                peak_bytes=self.rlhf.peak_bytes,
                peak_phase=self.rlhf.peak_phase,
                host_bytes=self.rlhf.host_bytes,
                host_fits=self.rlhf.host_fits,
                device_fits=self.rlhf.device_fits,
                host_bytes_per_node=self.rlhf.host_bytes_per_node,
            )
            out["memory"] = memory
            out["rlhf"] = self.rlhf.to_dict(self.time)
        return out


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
        "recompute_every": recipe.recompute_every,
        "recompute_layers": recipe.recompute_layers,
        "recompute_modules": list(recipe.recompute_modules) if recipe.recompute_modules is not None else None,
        "mtp_layers": recipe.mtp_layers,
        "stack": recipe.stack,
        "attention": recipe.attention,
        "offload": recipe.offload,
        "dropout": recipe.dropout,
        "master_weights": recipe.master_weights,
        "loss_chunks": recipe.loss_chunks,
        "optimizer_in_backward": recipe.optimizer_in_backward,
        "paged_optimizer": recipe.paged_optimizer,
        "torch_compile": recipe.torch_compile,
        "kbit_fp32_upcast": recipe.kbit_fp32_upcast,
        "logits_shift_copy": recipe.logits_shift_copy,
        "softmax_fp32": recipe.softmax_fp32,
        "moe_capacity_factor": recipe.moe_capacity_factor,
        "moe_dispatch": recipe.moe_dispatch,
        "triton_attention": recipe.triton_attention,
        "fused_cross_entropy": recipe.fused_cross_entropy,
        "fp8_params": recipe.fp8_params,
        "fp8_activation_store": recipe.fp8_activation_store,
        "fp8_attention": recipe.fp8_attention,
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
        "ep_comm_overlap": layout.ep_comm_overlap,
        "zero3_granularity": layout.zero3_granularity,
        "grad_accumulation": layout.grad_accumulation,
        "pp_split_embedding": layout.pp_split_embedding,
        "pp_split_head": layout.pp_split_head,
        "etp": layout.etp,
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


QLORA_BACKENDS: Final[dict[str, str]] = {
    "NVIDIA": "CUDA",
    "AMD": "ROCm (bitsandbytes >= 0.48, official from 0.50)",
    "Intel": "Gaudi HPU (bitsandbytes >= 0.48)",
}
"""Vendors with a 4-bit (NF4) kernel library for QLoRA: bitsandbytes' backends. Sources: the
bitsandbytes installation guide, v0.48.1 ("official support for NVIDIA GPUs, CPUs, Intel XPUs,
and Intel Gaudi platforms ... experimental support for ... AMD ROCm",
https://huggingface.co/docs/bitsandbytes/v0.48.1/installation) and v0.50.2 ("official support for
NVIDIA GPUs, AMD GPUs, Intel XPUs, Apple Silicon, and Intel Gaudi",
https://huggingface.co/docs/bitsandbytes/v0.50.2/en/installation.md). Google TPUs, AWS Trainium
and Cerebras have none."""

NO_FLASH_ATTENTION_FAMILIES: Final = ("Volta",)
"""NVIDIA generations FlashAttention does not run on: FlashAttention-2 supports "Ampere, Ada, or
Hopper GPUs" (README, https://github.com/Dao-AILab/flash-attention/blob/main/README.md) and
FlashAttention 1 Turing and Ampere; PyTorch's SDPA flash backend likewise needs sm_80. The V100
(sm_70) runs attention as batched GEMMs (eager) or SDPA's memory-efficient kernel, whose speed no
curve here describes."""

WEIGHT_STREAMING_FAMILIES: Final = ("WSE",)
"""Accelerator families that train by weight streaming (Cerebras WSE: weights and optimizer
states in external MemoryX, streamed layer by layer, activations on the wafer; the catalog's
notes): the device-memory fit and the GPU step-time model do not describe them."""


def hardware_refusal(system: System, recipe: Recipe) -> TrainplanError | None:
    """Why ``recipe`` cannot be estimated on ``system``'s accelerator, or ``None``: an
    execution model trainplan does not have, or a kernel library the accelerator lacks."""
    acc = system.accelerator
    if acc.family in WEIGHT_STREAMING_FAMILIES:
        return TrainplanError(
            "hardware",
            f"{acc.name} trains by weight streaming (weights and optimizer states stream from external "
            "MemoryX memory layer by layer; only activations live on the wafer), which trainplan does not "
            f"model: its {acc.memory_bytes / 1e9:.0f} GB of on-wafer SRAM is not a GPU's device memory; "
            "choose another accelerator",
        )
    if recipe.attention == "flash" and acc.vendor == "NVIDIA" and acc.family in NO_FLASH_ATTENTION_FAMILIES:
        return RecipeError(
            "attention",
            f"FlashAttention does not run on {acc.family} ({acc.name}): FlashAttention-2 and PyTorch's "
            "flash SDPA kernel need an Ampere or newer GPU (sm_80+); use --attention eager",
        )
    if recipe.stack == "neuron" and acc.vendor != "AWS":
        return RecipeError(
            "stack",
            f"the Neuron SDK trains on AWS Trainium only, not on {acc.vendor}'s {acc.name}; "
            "name the stack that runs there (--stack megatron, pytorch, deepspeed or maxtext)",
        )
    if recipe.fp8_attention and GENERATION.get(acc.name) not in fp8_generations():
        return RecipeError(
            "fp8_attention",
            f"--fp8-attention is costed from cuDNN's measured FP8 / BF16 attention ratio, published for "
            f"{', '.join(fp8_generations())} GPUs; none for {acc.name}: drop --fp8-attention",
        )
    if recipe.method == "qlora" and acc.vendor not in QLORA_BACKENDS:
        return RecipeError(
            "method",
            f"qlora needs a 4-bit (NF4) kernel library; bitsandbytes has backends for "
            f"{', '.join(QLORA_BACKENDS)} accelerators, not {acc.vendor} ({acc.name}); "
            "use --method lora, or an accelerator with a bitsandbytes backend",
        )
    return None


def check_hardware(system: System, recipe: Recipe) -> None:
    """Raise :func:`hardware_refusal`'s error, if any."""
    refusal = hardware_refusal(system, recipe)
    if refusal is not None:
        raise refusal


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
    rlhf: RLHFSpec | None = None,
    memory_margin: float = 0.0,
    price_query: PriceQuery = OPEN,
) -> Estimate:
    """Predict memory, step time, throughput and run cost of one training configuration.

    ``reliability``: interruptions and checkpoints of a long run (goodput.py); ``None`` leaves
    them out (the run's time is its steps alone).

    PPO, GRPO, DPO and ``rm`` are RL / preference steps (:mod:`trainplan.rlhf`): ``rlhf`` gives
    their models and rollout (default: every model the policy's architecture, the sequence split
    half prompt, half generation).

    ``memory_margin``: the fraction of device memory a fitting plan leaves free.

    The price: ``price_usd_per_device_hour``, else the system's offering, else the catalog's
    offering that ``price_query`` and ``provider`` pick (:mod:`trainplan.hardware.prices`).

    With ``recipe.mtp_layers`` the model trained is ``model.with_mtp(recipe.mtp_layers)`` (its
    multi-token-prediction modules as its last layers), and that is the ``model`` of the result."""
    model = model.with_mtp(recipe.mtp_layers)
    if layout.num_devices != system.num_devices:
        raise TrainplanError(
            "devices",
            f"layout uses dp·tp·pp·cp = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = "
            f"{layout.num_devices} devices but the system has {system.num_devices}",
        )
    layout.check_model(model)
    check_fp8_layout(recipe, layout)
    check_model_recipe(model, recipe)
    check_hardware(system, recipe)
    check_precision(system, recipe)
    spec = rlhf_spec(model, recipe, rlhf)
    if spec is not None and spec.group_size > 1 and recipe.global_batch is None:
        raise RecipeError(
            "global_batch",
            f"--group-size {spec.group_size} samples each prompt {spec.group_size} times, so the step's "
            "sequences are prompts × group size: give --global-batch (prompts per step); without it the "
            "step is one micro-batch per rank and the group size would change nothing",
        )
    if spec is not None and memory_margin:
        raise TrainplanError(
            "memory_margin",
            f"{recipe.method}: the margin is not applied to the RL phases' memory (actor, critic, reward, "
            "reference, rollout), so it would be ignored there; plan RL jobs with --memory-margin 0",
        )
    policy_recipe = recipe
    # The actor trains on the whole system, or on its own group when disaggregated.
    train_system, train_layout = system, layout
    if spec is not None and spec.placement == "disaggregated":
        if recipe.global_batch is None:
            raise RecipeError(
                "global_batch",
                "disaggregated placement needs --global-batch (prompts per step): no device count sets it",
            )
        train_system, train_layout = actor_placement(system, layout, spec.groups, model)
    if spec is not None:
        recipe = update_recipe(recipe, spec, train_layout)
    nmb = train_layout.check_batch(
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
        train_layout,
        capacity_bytes=system.accelerator.capacity_bytes,
        num_microbatches=nmb,
        host_capacity_bytes_per_node=system.host_memory_bytes_per_node,
        devices_on_node=train_system.devices_on_a_node,
        memory_margin=memory_margin,
    )
    # RL with sequence packing times its updates at the real tokens; memory stays at seq_len
    timed = timed_recipe(recipe, spec, train_layout)
    time = step_time(train_system, model, timed, train_layout, memory=mem)
    rl: RLHFEstimate | None = None
    if spec is not None:
        rl = estimate_rlhf(
            system,
            model,
            policy_recipe,
            layout,
            spec,
            actor_memory=mem,
            actor_time=time,
            num_microbatches=nmb,
        )
        t = rl.time_terms
        n = updates_per_step(policy_recipe, spec, train_layout)
        scaled = {k.key: n * getattr(time, k.key) for k in TIME_TERMS if k.key not in RLHF_TERM_KEYS}
        time = dataclasses.replace(
            time,
            **scaled,
            compute_s=n * time.compute_s,
            rollout_prefill_s=t["rollout_prefill_s"],
            rollout_decode_s=t["rollout_decode_s"],
            scoring_s=t["scoring_s"],
            critic_update_s=t["critic_update_s"],
            weight_sync_s=t["weight_sync_s"],
            phase_reload_s=t["phase_reload_s"],
            notes=(*time.notes, *rl.notes),
        )
    thr = throughput(system, model, timed, layout, time)
    if rl is not None:
        thr = dataclasses.replace(
            thr,
            # every sequence of the RL step (all its updates), as the RL split counts them
            tokens_per_s=rl.tokens_per_step / time.step_s,
            model_flops_per_step=rl.model_flops_per_step,
            hardware_flops_per_step=thr.hardware_flops_per_step
            + rl.model_flops_per_step
            - thr.model_flops_per_step,
            hfu=(thr.hardware_flops_per_step + rl.model_flops_per_step - thr.model_flops_per_step)
            / (system.num_devices * thr.peak_flops_per_s * time.step_s),
            mfu=rl.model_flops_per_step / (system.num_devices * thr.peak_flops_per_s * time.step_s),
        )
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
        price_query=price_query,
    )
    return Estimate(
        system=system,
        model=model,
        recipe=policy_recipe,
        layout=layout,
        summary=summary,
        memory=mem,
        num_microbatches=nmb,
        time=time,
        throughput=thr,
        run=run,
        step_band=step_band(system.accelerator, model, policy_recipe, layout),
        memory_band=memory_band(system.accelerator, model, policy_recipe, layout),
        rlhf=rl,
    )


def rlhf_spec(model: ModelSpec, recipe: Recipe, given: RLHFSpec | None) -> RLHFSpec | None:
    """The RL job of an RLHF method: ``given``, else every model the policy's architecture and the
    sequence half prompt, half generation. RLHF settings with another method are an error."""
    if not is_rlhf(recipe.method):
        if given is not None:
            raise RecipeError(
                "method", f"RLHF settings given but the method is {recipe.method}; use ppo, grpo, dpo or rm"
            )
        return None
    if given is not None:
        if given.method != recipe.method:
            raise RecipeError(
                "method", f"the RLHF settings are for {given.method}, the recipe for {recipe.method}"
            )
        if given.prompt_len + given.gen_len not in (0, recipe.seq_len):
            raise RecipeError(
                "seq_len",
                f"prompt + generation = {given.prompt_len + given.gen_len} tokens but the sequence is "
                f"{recipe.seq_len}; give --seq-len {given.prompt_len + given.gen_len}",
            )
        return given
    prompt, gen = seq_lengths(recipe.method, recipe.seq_len, None, None)
    return RLHFSpec(
        method=recipe.method,
        reward_model=model if recipe.method in ("ppo", "grpo") else None,
        reference="none" if recipe.method == "rm" else "model",
        prompt_len=prompt,
        gen_len=gen,
    )
