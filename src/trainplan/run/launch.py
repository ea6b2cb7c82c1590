"""The launcher of ``trainplan run``: predict, spawn ``torchrun``, compare.

1. The plan (model, accelerator, recipe, layout) is validated and estimated exactly as
   ``trainplan estimate`` does (:func:`trainplan.predict.estimate`), then checked against what the
   worker can execute (:func:`trainplan.run.config.check_supported`). Bad input stops here.
2. ``python -m torch.distributed.run --standalone --nproc-per-node N -m trainplan.run.worker``
   (``torch/distributed/run.py``, the module behind the ``torchrun`` script) starts one process
   per device on this machine; the worker uses gloo on CPU and NCCL on CUDA.
3. Rank 0's measurements come back through a JSON file and are put beside the prediction.

What is comparable: on CUDA, ``torch.cuda.max_memory_allocated`` is the quantity the estimate's
``memory.peak_bytes`` predicts (allocated tensors, without the CUDA context and allocator
fragmentation that ``memory.per_device_bytes`` adds), and step time and tokens/s are comparable
when the GPU is the ``--hardware`` accelerator. On CPU nothing is: the prediction is for the
named accelerator, and the memory figure is the process's resident set.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.predict import Estimate, layout_to_dict, recipe_to_dict
from trainplan.run.config import RunConfig
from trainplan.units import fmt_bytes, fmt_count, fmt_duration

TORCH_INSTALL_HINT = "pip install torch==2.13.0 -e '.[torch]'"
LOG_TAIL_LINES = 40


class RunFailed(RuntimeError):
    """The distributed run started but did not finish; the message holds the end of its log."""


@dataclass(frozen=True, kw_only=True)
class RunReport:
    """Measured beside predicted, with the configuration that produced both."""

    config: RunConfig
    estimate: Estimate
    hardware: str
    measured: dict[str, Any]

    @property
    def on_cpu(self) -> bool:
        return self.config.device == "cpu"

    def notes(self) -> list[str]:
        out: list[str] = []
        if self.on_cpu:
            out.append(
                f"measured on CPU with gloo: step time and tokens/s are not comparable with the "
                f"{self.hardware} prediction"
            )
            out.append(
                "CPU peak memory is the process RSS high-water mark (interpreter, libraries, allocator "
                "caches included): not comparable with device memory"
            )
        else:
            out.append(
                "peak memory: torch.cuda.max_memory_allocated vs the estimate's memory.peak_bytes "
                "(allocated tensors; CUDA context and fragmentation excluded from both)"
            )
            name = str(self.measured.get("device_name", ""))
            out.append(
                f"measured on {name}; the prediction is for {self.hardware}: compare times only when they are "
                "the same accelerator"
            )
        if self.config.precision == "bf16" and not (
            self.config.layout.zero >= 2 and self.config.layout.dp > 1
        ):
            out.append(
                "bf16 without FSDP runs FP32 weights under torch.autocast (4 + 4 + 8 bytes of state per "
                "parameter instead of the recipe's 2 + 2 + 12)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """Stable keys: ``measured.{step_s,tokens_per_s,peak_bytes,peak_reserved_bytes,losses}``,
        ``predicted.{step_s,tokens_per_s,peak_bytes}``, ``config``."""
        m = self.measured
        est = self.estimate
        cfg = self.config
        return {
            "measured": {
                "step_s": m["step_s"],
                "tokens_per_s": m["tokens_per_s"],
                "peak_bytes": m["peak_bytes"],
                "peak_kind": m["peak_kind"],
                "peak_reserved_bytes": m.get("peak_reserved_bytes"),
                "peak_bytes_per_rank": m["peak_bytes_per_rank"],
                "losses": m["losses"],
                "step_times_s": m["step_times_s"],
                "tokens_per_step": m["tokens_per_step"],
                "params": m["params"],
                "backend": m["backend"],
                "device": cfg.device,
                "device_name": m["device_name"],
                "torch_version": m["torch_version"],
                "comparable_time": not self.on_cpu,
                "comparable_memory": not self.on_cpu,
            },
            "predicted": {
                "step_s": est.time.step_s,
                "tokens_per_s": est.throughput.tokens_per_s,
                "peak_bytes": est.memory.peak_bytes,
                "per_device_bytes": est.memory.per_device_bytes,
                "peak_phase": est.memory.peak_phase,
                "hardware": self.hardware,
            },
            "config": {
                "model": cfg.model.name,
                "params": est.summary.params,
                "hardware": self.hardware,
                "devices": cfg.layout.num_devices,
                "device": cfg.device,
                "layout": layout_to_dict(cfg.layout),
                "recipe": recipe_to_dict(est.recipe),
                "grad_accum": cfg.grad_accum,
                "tokens_per_step": cfg.tokens_per_step,
                "steps": cfg.steps,
                "warmup": cfg.warmup,
                "lr": cfg.lr,
                "seed": cfg.seed,
            },
            "notes": self.notes(),
        }


def spawn(cfg: RunConfig, *, verbose: bool = False, timeout_s: float | None = None) -> dict[str, Any]:
    """Run the worker under ``torch.distributed.run`` on this machine; return rank 0's measurements."""
    import json

    nproc = cfg.layout.num_devices
    with tempfile.TemporaryDirectory(prefix="trainplan-run-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        result_path = Path(tmp) / "result.json"
        cfg_path.write_text(cfg.to_json(), encoding="utf-8")
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "trainplan.run.worker",
            "--config",
            str(cfg_path),
            "--result",
            str(result_path),
        ]
        env = dict(os.environ)
        if cfg.device == "cpu" and "OMP_NUM_THREADS" not in env:
            # torchrun would set 1 and warn; give each rank its share of the cores instead.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=None if verbose else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, so a timeout can stop every rank
        )
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            _stop(proc)
            raise RunFailed(f"the run did not finish within {timeout_s:g} s") from err
        except KeyboardInterrupt:
            _stop(proc)
            raise
        if proc.returncode != 0 or not result_path.exists():
            tail = "\n".join((log or "").splitlines()[-LOG_TAIL_LINES:])
            raise RunFailed(f"torchrun exited with status {proc.returncode}\n{tail}".rstrip())
        data = json.loads(result_path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise RunFailed("the worker wrote no measurements")
    return data


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the launcher's process group (torchrun and its workers), SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _ratio(measured: float, predicted: float, comparable: bool) -> str:
    if not comparable:
        return "not comparable"
    if predicted <= 0 or not math.isfinite(measured):
        return "-"
    return f"{measured / predicted:.2f}×"


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return fmt_duration(seconds)


def render(report: RunReport) -> str:
    """A small table: measured beside predicted, the losses, and what is not comparable."""
    cfg, est, m = report.config, report.estimate, report.measured
    where = f"{cfg.device}/{m['backend']}"
    timed = cfg.steps - cfg.warmup
    losses: list[float] = [float(x) for x in m["losses"]]
    comparable = not report.on_cpu
    peak_label = "peak memory (RSS)" if report.on_cpu else "peak memory (allocated)"
    rows = [
        (
            "step time",
            _fmt_time(m["step_s"]),
            _fmt_time(est.time.step_s),
            _ratio(m["step_s"], est.time.step_s, comparable),
        ),
        (
            "tokens/s",
            f"{m['tokens_per_s']:,.0f}",
            f"{est.throughput.tokens_per_s:,.0f}",
            _ratio(m["tokens_per_s"], est.throughput.tokens_per_s, comparable),
        ),
        (
            peak_label,
            fmt_bytes(m["peak_bytes"]),
            fmt_bytes(est.memory.peak_bytes),
            _ratio(m["peak_bytes"], est.memory.peak_bytes, comparable),
        ),
    ]
    head_m = f"measured ({where})"
    head_p = f"predicted ({report.hardware})"
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(head_m), *(len(r[1]) for r in rows))
    w2 = max(len(head_p), *(len(r[2]) for r in rows))
    lines = [
        f"{cfg.model.name} ({fmt_count(est.summary.params)} params) on {cfg.layout.num_devices} process(es), "
        f"{where}; layout {cfg.layout.describe()}",
        f"recipe: {cfg.precision}, adamw, seq {cfg.seq_len}, micro-batch {cfg.micro_batch}, "
        f"{cfg.grad_accum} micro-batch(es)/step, recompute {cfg.recompute}"
        f"{' (early stop)' if cfg.recompute in ('full', 'sac') and cfg.recompute_early_stop else ''}; "
        f"{cfg.tokens_per_step:,} tokens/step",
        f"{cfg.steps} steps: median of the {timed} after {cfg.warmup} warm-up step(s); slowest rank per step",
        "",
        f"  {'':{w0}s}  {head_m:>{w1}s}  {head_p:>{w2}s}  measured/predicted",
    ]
    for name, meas, pred, ratio in rows:
        lines.append(f"  {name:{w0}s}  {meas:>{w1}s}  {pred:>{w2}s}  {ratio}")
    trend = "falling" if losses and losses[-1] < losses[0] else "not falling"
    finite = all(math.isfinite(x) for x in losses)
    lines.append("")
    lines.append(
        "loss: "
        + " ".join(f"{x:.3f}" for x in losses)
        + f"  ({'finite' if finite else 'NOT FINITE'}, {trend})"
    )
    for note in report.notes():
        lines.append(f"note: {note}")
    return "\n".join(lines)


def check_loss(losses: list[float]) -> None:
    """Raise :class:`RunFailed` when a loss is not finite (the run diverged)."""
    bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        raise RunFailed(f"loss is not finite at step(s) {', '.join(str(i) for i in bad)}")


def require_steps(steps: int, warmup: int) -> None:
    if steps < 2:
        raise TrainplanError("steps", f"need at least 2 steps (one warm-up, one timed), got {steps}")
    if not 0 <= warmup < steps:
        raise TrainplanError(
            "warmup", f"warm-up steps must be in [0, {steps - 1}] for {steps} steps, got {warmup}"
        )


__all__ = ["TORCH_INSTALL_HINT", "RunFailed", "RunReport", "check_loss", "render", "require_steps", "spawn"]
