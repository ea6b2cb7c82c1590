"""Goodput of a long run: interruptions, checkpoints and restarts as named terms of time-to-train.

A run of ``compute_s`` seconds of training steps on ``N`` devices, each failing independently at
a constant rate (exponential inter-arrival times, device MTBF ``M_d``), fails every
``M = M_d / N`` seconds on average. It writes a checkpoint of ``δ`` seconds every ``τ`` seconds of
work and, after each interruption, spends ``R`` seconds restarting (re-scheduling, re-loading the
last checkpoint) and redoes the work since that checkpoint. The expected wall time is Daly's
(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22 (2006) 303-312: its expected wall time for exponentially
distributed failures):

    T_wall = M · e^(R/M) · (e^((τ + δ)/M) − 1) · compute_s / τ

and the interval that minimises it is, to higher order (Daly 2006's estimate; Young's first-order
``sqrt(2δM)``, J. W. Young, CACM 17(9) 1974, is its leading term):

    τ_opt = sqrt(2δM) · (1 + sqrt(δ/(2M))/3 + (δ/(2M))/9) − δ    for δ < 2M,    else τ_opt = M

The wall time splits into named terms that add up to it:

    compute_s                       the training steps themselves
    checkpoint_s = δ · compute_s/τ  writing checkpoints (blocking writes)
    lost_s = T_wall − compute_s − checkpoint_s   redone work and restarts after interruptions

Defaults, each from a published run (override them per run):

* device MTBF: Llama 3 405B pre-training saw 419 unexpected interruptions in a 54-day snapshot on
  16,384 H100 GPUs (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Sec. 3.3.4 and
  Table 5): 16,384 · 54 · 24 / 419 = 50,677 device-hours between interruptions per device.
* checkpoint bandwidth: the same run's Tectonic file system sustains 2 TB/s for 16,384 GPUs
  (Sec. 3.3.1: "a sustainable throughput of 2 TB/s and a peak throughput of 7 TB/s"), 2e12 / 16,384
  = 122 MB/s per device; distributed checkpointing writes every rank's shard in parallel
  (Megatron-Core ``dist_checkpointing``, PyTorch DCP), so the aggregate scales with the devices.
* restart: ``DEFAULT_RESTART_S`` = 10 minutes of re-scheduling and initialisation before the
  checkpoint is read back (an assumption, stated: not measured here); the read itself is added at
  the same bandwidth as the write.

The checkpoint holds what resuming needs: the trained parameters in their weight dtype, their
optimizer states and the FP32 master copy where one is kept (``checkpoint_bytes``); a frozen
base (LoRA, QLoRA) is re-read from the model files, not checkpointed.

Every function takes floats or numpy arrays (:mod:`trainplan.num`): the planner evaluates the
same terms over its candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.errors import TrainplanError
from trainplan.num import Int, Num, maximum, minimum, where

if TYPE_CHECKING:
    from trainplan.recipe import Recipe

SECONDS_PER_HOUR: Final = 3600.0
DEFAULT_DEVICE_MTBF_H: Final = 16_384 * 54 * 24 / 419
"""Device-hours between unexpected interruptions per device (Llama 3, module docstring)."""
DEFAULT_CHECKPOINT_BYTES_PER_S_PER_DEVICE: Final = 2e12 / 16_384
"""Sustained checkpoint write bandwidth per device (Llama 3's 2 TB/s for 16,384 GPUs)."""
DEFAULT_RESTART_S: Final = 600.0
"""Re-scheduling and initialisation after an interruption, before the checkpoint read (assumption)."""


@dataclass(frozen=True, kw_only=True)
class Reliability:
    """How a long run is interrupted and checkpointed (module docstring for the defaults).

    ``checkpoint_interval_s``: seconds of work between checkpoints; ``None`` takes Daly's optimum.
    """

    device_mtbf_h: float = DEFAULT_DEVICE_MTBF_H
    checkpoint_bytes_per_s_per_device: float = DEFAULT_CHECKPOINT_BYTES_PER_S_PER_DEVICE
    restart_s: float = DEFAULT_RESTART_S
    checkpoint_interval_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("device_mtbf_h", "checkpoint_bytes_per_s_per_device"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise TrainplanError(name, f"must be a positive finite number, got {value!r}")
        if (
            isinstance(self.restart_s, bool)
            or not isinstance(self.restart_s, int | float)
            or not math.isfinite(self.restart_s)
            or self.restart_s < 0
        ):
            raise TrainplanError(
                "restart_time", f"must be a finite number of seconds >= 0, got {self.restart_s!r}"
            )
        v = self.checkpoint_interval_s
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0
        ):
            raise TrainplanError(
                "checkpoint_interval", f"must be a positive finite number of seconds, got {v!r}"
            )

    def describe(self) -> str:
        interval = (
            "Young/Daly optimum"
            if self.checkpoint_interval_s is None
            else f"every {self.checkpoint_interval_s / 60:g} min"
        )
        return (
            f"device MTBF {self.device_mtbf_h:,.0f} h, checkpoint write "
            f"{self.checkpoint_bytes_per_s_per_device / 1e6:,.0f} MB/s per device, restart "
            f"{self.restart_s / 60:g} min, checkpoint {interval}"
        )


DEFAULT_RELIABILITY: Final = Reliability()
"""The published defaults of the module docstring, checkpoint interval at Daly's optimum."""


def job_mtbf_s(device_mtbf_h: Num, devices: Int) -> Num:
    """Mean time between interruptions of the whole job: M = M_d / N (independent devices)."""
    return device_mtbf_h * SECONDS_PER_HOUR / devices


def checkpoint_write_s(checkpoint_bytes: Num, devices: Int, bytes_per_s_per_device: Num) -> Num:
    """δ: the checkpoint written by all devices in parallel at the per-device bandwidth."""
    return checkpoint_bytes / (devices * bytes_per_s_per_device)


def daly_interval_s(write_s: Num, mtbf_s: Num) -> Num:
    """Daly 2006's higher-order estimate of the work interval that minimises the wall time."""
    x = write_s / (2.0 * mtbf_s)
    tau = (2.0 * write_s * mtbf_s) ** 0.5 * (1.0 + x**0.5 / 3.0 + x / 9.0) - write_s
    return where(write_s < 2.0 * mtbf_s, maximum(tau, 1e-9 * mtbf_s), mtbf_s)


def expected_wall_s(compute_s: Num, write_s: Num, interval_s: Num, restart_s: Num, mtbf_s: Num) -> Num:
    """Daly 2006's expected wall time of ``compute_s`` seconds of work (module docstring).

    The exponents are capped so that a hopeless configuration (interruptions far more often than
    a checkpoint interval) gives a huge finite time rather than an overflow."""
    a = minimum(restart_s / mtbf_s, 700.0)
    b = minimum((interval_s + write_s) / mtbf_s, 700.0)
    return mtbf_s * _exp(a) * _expm1(b) * compute_s / interval_s


def _exp(x: Num) -> Num:
    if isinstance(x, float | int):
        return math.exp(x)
    import numpy as np

    return np.exp(x)


def _expm1(x: Num) -> Num:
    if isinstance(x, float | int):
        return math.expm1(x)
    import numpy as np

    return np.expm1(x)


def checkpoint_bytes(trainable_params: Num, recipe: Recipe) -> Num:
    """Bytes of a resumable checkpoint: each trained parameter in its weight dtype, its optimizer
    states (:func:`trainplan.memory.optimizer_state_bytes_per_param`) and the FP32 master copy
    where the recipe keeps one (ZeRO Sec. 3.1's 2 + 12 bytes per parameter for mixed-precision
    AdamW). Adafactor's factored moments (a row and a column per matrix) are left out."""
    from trainplan.memory import optimizer_state_bytes_per_param

    per_param = BYTES_PER_ELEMENT[recipe.weight_dtype] + optimizer_state_bytes_per_param(recipe)
    if recipe.keeps_master_weights:
        per_param += 4.0
    return trainable_params * per_param


@dataclass(frozen=True, kw_only=True)
class GoodputTerms:
    """The wall time of a run as a visible sum (module docstring), and what it assumed."""

    compute_s: Num
    checkpoint_s: Num
    lost_s: Num
    wall_s: Num
    interruptions: Num
    checkpoint_write_s: Num
    checkpoint_interval_s: Num
    job_mtbf_s: Num


def goodput_terms(
    compute_s: Num, devices: Int, checkpoint_bytes: Num, reliability: Reliability
) -> GoodputTerms:
    """Wall time of ``compute_s`` seconds of steps on ``devices`` devices, split into named terms.

    The restart re-reads the checkpoint at the write bandwidth: R = restart_s + δ."""
    mtbf = job_mtbf_s(reliability.device_mtbf_h, devices)
    write = checkpoint_write_s(checkpoint_bytes, devices, reliability.checkpoint_bytes_per_s_per_device)
    tau = (
        daly_interval_s(write, mtbf)
        if reliability.checkpoint_interval_s is None
        else reliability.checkpoint_interval_s + 0.0 * write
    )
    restart = reliability.restart_s + write
    wall = expected_wall_s(compute_s, write, tau, restart, mtbf)
    checkpoint = write * compute_s / tau
    lost = maximum(wall - compute_s - checkpoint, 0.0)
    wall = compute_s + checkpoint + lost
    return GoodputTerms(
        compute_s=compute_s,
        checkpoint_s=checkpoint,
        lost_s=lost,
        wall_s=wall,
        interruptions=wall / mtbf,
        checkpoint_write_s=write,
        checkpoint_interval_s=tau,
        job_mtbf_s=mtbf,
    )


__all__ = [
    "DEFAULT_CHECKPOINT_BYTES_PER_S_PER_DEVICE",
    "DEFAULT_DEVICE_MTBF_H",
    "DEFAULT_RELIABILITY",
    "DEFAULT_RESTART_S",
    "GoodputTerms",
    "Reliability",
    "checkpoint_bytes",
    "checkpoint_write_s",
    "daly_interval_s",
    "expected_wall_s",
    "goodput_terms",
    "job_mtbf_s",
]
