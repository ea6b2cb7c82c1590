"""Analytic memory/FLOPs (``trainplan.memory``, ``trainplan.flops``) against a traced step.

Term mapping (analytic field ← traced category, see :mod:`trainplan.trace.tracer`)::

    weights_bytes               ← parameters (incl. QLoRA packed NF4 storage), end of step
    gradients_bytes             ← gradients (all ``param.grad``), end of step
    optimizer_bytes             ← optimizer (moments, FP32 masters)
    quant_constants_bytes       ← quant_constants
    model states (sum)          ← parameters + gradients + optimizer + quant_constants
    activations_bytes           ← activations saved by the blocks, at the end of forward
    logits_bytes                ← saved by the final norm, head and loss, at the end of forward
    gather_buffers_bytes        ← gather_buffers (FSDP2 unsharded blocks) at the backward peak
    transient_bytes             ← temporaries at the backward-phase peak
    optimizer_temporaries_bytes ← temporaries at the optimizer-step peak
    states + backward phase     ← max(forward, backward) peak of live bytes
    states + optimizer temp     ← optimizer-step peak of live bytes
    peak_bytes                  ← peak of live bytes (the CUDA ``max_memory_allocated`` analogue)

Both sides are per device, one micro-batch, no pipeline. Overhead terms of the analytic model
(CUDA context, fragmentation, communication buffers) are not traced and are not compared.

FLOPs are compared for the whole model over one micro-batch: the analytic
``step_flops(model, recipe)`` (GEMM and attention, forward + backward + recompute, i.e. hardware
FLOPs) against the traced ``mm/addmm/bmm`` and flash-attention counts. Under tensor
parallelism ``FlopCounterMode`` sees the DTensor-level matmuls (global shapes) but the local
attention (``a/t`` heads), so traced attention is multiplied by ``tp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import LORA_TARGETS, Recipe


def compare_memory(mem: Any, tr: Any) -> list[TermRow]:
    """Rows of the memory comparison (see the module docstring for the mapping).

    Model states are compared as held at the end of the step (every gradient present);
    activations and logits at the end of the forward pass (all saved tensors alive); gather
    buffers and the backward transient at the traced backward-phase peak (the larger of the
    forward and backward peaks); optimizer temporaries at the optimizer-step peak.
    """
    st = tr.state_bytes
    eof = tr.end_of_forward_breakdown_bytes
    fwd = tr.phase_peaks_bytes.get("forward", 0)
    bwd = tr.phase_peaks_bytes.get("backward", 0)
    bwd_phase = "backward" if bwd >= fwd else "forward"
    at_bwd = tr.phase_breakdowns_bytes.get(bwd_phase, {})
    at_opt = tr.phase_breakdowns_bytes.get("optimizer", {})
    states = sum(st[c] for c in ("parameters", "gradients", "optimizer", "quant_constants"))
    return [
        TermRow("weights", float(mem.weights_bytes), float(st["parameters"])),
        TermRow("gradients", float(mem.gradients_bytes), float(st["gradients"])),
        TermRow("optimizer", float(mem.optimizer_bytes), float(st["optimizer"])),
        TermRow("quant_constants", float(mem.quant_constants_bytes), float(st["quant_constants"])),
        TermRow("model_states", float(mem.model_states_bytes), float(states)),
        TermRow("activations", float(mem.activations_bytes), float(eof.get("activations", 0))),
        TermRow("logits", float(mem.logits_bytes), float(eof.get("logits", 0))),
        TermRow("gather_buffers", float(mem.gather_buffers_bytes), float(at_bwd.get("gather_buffers", 0))),
        TermRow("transient", float(mem.transient_bytes), float(at_bwd.get("temporaries", 0))),
        TermRow(
            "optimizer_temporaries",
            float(mem.optimizer_temporaries_bytes),
            float(at_opt.get("temporaries", 0)),
        ),
        TermRow(
            "backward_phase_peak",
            float(max(mem.phase_bytes(p) for p in mem.phases if p != "optimizer step")),
            float(max(fwd, bwd)),
        ),
        TermRow(
            "optimizer_phase_peak",
            float(mem.phase_bytes("optimizer step")),
            float(tr.phase_peaks_bytes.get("optimizer", 0)),
        ),
        TermRow("peak", float(mem.peak_bytes), float(tr.peak_bytes)),
    ]


@dataclass(frozen=True)
class TermRow:
    name: str
    analytic: float
    traced: float

    @property
    def error_pct(self) -> float | None:
        """(analytic - traced) / traced in percent; None when the traced value is 0."""
        if self.traced == 0:
            return None if self.analytic == 0 else float("inf")
        return 100.0 * (self.analytic - self.traced) / self.traced

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "analytic": self.analytic,
            "traced": self.traced,
            "error_pct": self.error_pct,
        }


@dataclass(frozen=True)
class VerifyResult:
    """Per-term analytic vs traced bytes and FLOPs of one configuration (per device)."""

    model: str
    config: str
    depth: int
    world_size: int
    memory: tuple[TermRow, ...]
    flops: tuple[TermRow, ...]
    traced_peak_phase: str
    analytic_peak_phase: str
    trace_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    fsdp_uneven_shard_bytes: float = 0.0
    """Traced model-state bytes from FSDP2's uneven dim-0 chunks (``step.fsdp_uneven_shard_bytes``),
    which the analytic model does not count: part of the traced ``model_states``."""

    def row(self, name: str) -> TermRow:
        for r in (*self.memory, *self.flops):
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def peak_error_pct(self) -> float:
        e = self.row("peak").error_pct
        return 0.0 if e is None else e

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "config": self.config,
            "depth": self.depth,
            "world_size": self.world_size,
            "memory": [r.to_dict() for r in self.memory],
            "flops": [r.to_dict() for r in self.flops],
            "traced_peak_phase": self.traced_peak_phase,
            "analytic_peak_phase": self.analytic_peak_phase,
            "trace_s": self.trace_s,
            "notes": list(self.notes),
            "fsdp_uneven_shard_bytes": self.fsdp_uneven_shard_bytes,
        }

    def render(self) -> str:
        """A plain-text table: term, analytic, traced, error (bytes in GiB = 2**30, FLOPs in TFLOP)."""
        lines = [
            f"{self.model} ({self.depth} layers)  {self.config}  world={self.world_size}",
            f"peak phase: traced {self.traced_peak_phase}, analytic {self.analytic_peak_phase}; "
            f"traced in {self.trace_s:.1f} s",
            f"{'term':<22}{'analytic GiB':>14}{'traced GiB':>14}{'error':>10}",
        ]
        for r in self.memory:
            lines.append(
                f"{r.name:<22}{r.analytic / 2**30:>14.4f}{r.traced / 2**30:>14.4f}{_pct(r.error_pct):>10}"
            )
        lines.append(f"{'FLOPs':<22}{'analytic TFLOP':>14}{'traced TFLOP':>14}{'error':>10}")
        for r in self.flops:
            lines.append(
                f"{r.name:<22}{r.analytic / 1e12:>14.4f}{r.traced / 1e12:>14.4f}{_pct(r.error_pct):>10}"
            )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _pct(e: float | None) -> str:
    if e is None:
        return "-"
    if e == float("inf"):
        return "inf"
    return f"{e:+.2f}%"


def describe(recipe: Recipe, layout: Layout) -> str:
    parts = [recipe.method, recipe.precision, f"b={recipe.micro_batch}", f"s={recipe.seq_len}"]
    if recipe.recompute != "none":
        early = " early-stop" if recipe.recompute in ("full", "sac") and recipe.recompute_early_stop else ""
        every = f" every={recipe.recompute_every}" if recipe.recompute_every > 1 else ""
        parts.append(f"recompute={recipe.recompute}{every}{early}")
    if not recipe.master_weights:
        parts.append("pure16")
    if recipe.lora is not None and recipe.method == "qlora" and not recipe.lora.double_quant:
        parts.append("no-dq")
    if recipe.lora is not None and recipe.lora.targets != LORA_TARGETS:
        parts.append("targets=" + "+".join(recipe.lora.targets))
    return " ".join(parts) + "; " + layout.describe()


def run_verify(
    model: ModelSpec, recipe: Recipe, layout: Layout, *, world_size: int, depth: int | None = None
) -> VerifyResult:
    """Trace one step of ``model`` (``depth`` layers, all by default) and compare with the analytic model.

    ``world_size`` must equal ``layout.num_devices`` (the fake process group has that many ranks;
    rank 0 is traced). Raises :class:`trainplan.trace.step.UnsupportedConfig` for layouts the
    tracer cannot build.
    """
    from trainplan.flops import step_flops
    from trainplan.memory import memory_breakdown
    from trainplan.trace.step import reduced_model, trace_step

    if world_size != layout.num_devices:
        raise ValueError(f"world_size={world_size} but the layout has {layout.num_devices} devices")
    spec = reduced_model(model, depth)
    tr = trace_step(model, recipe, layout, depth=depth)
    # the traced modules are eager PyTorch ones: compare with what the pytorch stack saves
    # (the megatron stack's Transformer Engine modules save less, memory.te_saved_set)
    one_mb = replace(recipe, global_batch=None, stack="pytorch")
    mem = memory_breakdown(spec, one_mb, layout, num_microbatches=1)
    rows = compare_memory(mem, tr)
    sf = step_flops(spec, one_mb, Layout())
    tp = layout.tp
    flops = (
        TermRow("gemm_flops", float(sf.gemm_flops), float(tr.gemm_flops)),
        TermRow("attention_flops", float(sf.attention_flops), float(tr.attention_flops * tp)),
    )
    return VerifyResult(
        model=model.name,
        config=describe(recipe, layout),
        depth=spec.num_layers,
        world_size=world_size,
        memory=tuple(rows),
        flops=flops,
        traced_peak_phase=tr.peak_phase,
        analytic_peak_phase=mem.peak_phase,
        trace_s=tr.trace_s,
        notes=tuple(tr.notes),
        fsdp_uneven_shard_bytes=float(tr.state_bytes.get("fsdp_uneven_shards", 0)),
    )


__all__ = ["TermRow", "VerifyResult", "compare_memory", "describe", "run_verify"]
