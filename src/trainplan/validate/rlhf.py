"""Published RLHF runs, predicted through ``trainplan.estimate`` (:mod:`trainplan.rlhf`).

``data/rlhf_colocated.csv`` holds one row per published number with the configuration it was run
under: the OpenRLHF benchmark (``benchmark/README.md`` @0baf3dd4, March 2024: generation,
training and end-to-end seconds of one 1,024-prompt PPO rollout batch, every model on the same 8
A800-80GB, or a device group per model) and fit claims (a config said to run on its devices).
Three datasets:

* ``rlhf_openrlhf_colocated`` (metric seconds): ``gen_s`` is compared with rollout + scoring (the
  benchmark's generation phase is OpenRLHF's ``make_experience``: generation and the reference,
  reward and critic forwards), ``train_s`` with the actor and critic updates (+ weight sync),
  ``step_s`` with the whole RL step;
* ``rlhf_openrlhf_disaggregated``: the same metrics for the benchmark's Ray runs, a device group
  per model (:mod:`trainplan.rlhf_groups`);
* ``rlhf_fit_claims``: predicted fits or not, error 0 when the claim is reproduced, −1 when not.

``data/rlhf_deepspeed_chat.csv`` holds DeepSpeed-Chat's Table 1 step-3 times (one epoch per
row, OPT actors with an OPT-350M reward model and critic): the ``rlhf_deepspeed_chat`` dataset,
every row a validation row (:class:`EpochRow`, :func:`predict_epoch`).

One row is a ``calibrate`` row: ``openrlhf-bench-7b-openrlhf-train`` fits the ``deepspeed``
stack's κ (``validate/calibrate.py`` ``RLHF_CALIBRATION_SETS``; OpenRLHF and DeepSpeed-Chat train
with DeepSpeed ZeRO-3 on transformers modules); every other row validates. The A800 is an
A100-80GB with NVLink cut to 400 GB/s (200 GB/s one direction, NVIDIA A800 datasheet):
``scale_up_bytes_per_s`` overrides the catalog link.
Generation lengths are the benchmark's maxima (1,024); responses that stop at EOS make the
published generation faster than a maximum-length rollout. The decode floors of eager engines are
fitted outside these tables (``rlhf.EAGER_DECODE_LAYER_S``: gpt-fast; ``rlhf.FUSED_EAGER_DECODE_LAYER_S``:
DeepSpeed-Chat's published step-3 log).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from trainplan.data_files import data_text
from trainplan.errors import TrainplanError
from trainplan.validate.timing import DatasetResult, RowResult

RLHF_DATASETS: Final[dict[str, tuple[float, str]]] = {
    "rlhf_openrlhf_colocated": (
        0.4,
        "OpenRLHF benchmark (Mar 2024): PPO generation / training / end-to-end seconds, every model colocated",
    ),
    "rlhf_openrlhf_disaggregated": (
        0.3,
        "OpenRLHF benchmark (Mar 2024): PPO generation / training / end-to-end seconds, a device group per model (Ray)",
    ),
    "rlhf_fit_claims": (0.0, "RLHF configs published as running on their devices (fit claims)"),
    "rlhf_deepspeed_chat": (
        0.3,
        "DeepSpeed-Chat README Table 1 (Apr 2023): step-3 (PPO) hours per epoch, OPT actors with an "
        "OPT-350M reward model and critic, Hybrid Engine",
    ),
    "rlhf_nemo_rl_grpo": (
        0.4,
        "NeMo RL performance summary (v0.4-v0.6): on-policy GRPO seconds per step, colocated vLLM and "
        "Megatron, sequence packing, responses at the published mean length",
    ),
}
"""Each dataset's enforced MAPE bound (a regression guard a little above today's accuracy: 31%,
25%, 20% and 35% on the four timed sets) and description."""

SOURCE: Final = (
    "OpenRLHF benchmark/README.md @0baf3dd4; OpenRLHF examples/scripts/train_ppo_llama_ray_70b.sh @391e1de4; "
    "torchtune mistral/7B_full_ppo_low_memory.yaml @000bb70f; DeepSpeedExamples DeepSpeed-Chat README.md "
    "@00906a77 (Table 1) and training_scripts/opt @4bf1924b; NVIDIA-NeMo/RL docs/about/performance-summary.md "
    "@cff17f83 (v0.4), @108bffda (v0.5) and @69c7ca11 (v0.6) with examples/configs/recipes/llm/performance"
)


@dataclass(frozen=True, kw_only=True)
class RLHFRow:
    """One published RLHF number and the configuration it was measured under."""

    name: str
    dataset: str
    split: str
    verification: str
    metric: str
    published: float
    fields: dict[str, object]
    scale_up_bytes_per_s: float | None
    source: str
    notes: str


_INT = (
    "devices",
    "zero",
    "micro_batch",
    "train_batch",
    "global_batch",
    "seq_len",
    "gen_len",
    "rollout_concurrency",
)


def _csv_rows(file: str) -> list[dict[str, str]]:
    """The rows of ``data/<file>`` as column -> text."""
    text = data_text("trainplan.validate", "data", file)
    return list(csv.DictReader(io.StringIO(text)))


def _identity(c: Mapping[str, str]) -> dict[str, Any]:
    """The columns every RLHF row carries as they stand: its name, dataset, split, verification,
    metric, published value, source and notes."""
    return {
        "name": c["name"],
        "dataset": c["dataset"],
        "split": c["split"],
        "verification": c["verification"],
        "metric": c["metric"],
        "published": float(c["published"]),
        "source": c["source"],
        "notes": c["notes"],
    }


def rows() -> list[RLHFRow]:
    """Every row of ``data/rlhf_colocated.csv``."""
    out: list[RLHFRow] = []
    for c in _csv_rows("rlhf_colocated.csv"):
        fields: dict[str, object] = {
            "method": "ppo",
            "hardware": c["hardware"],
            "recompute": c["recompute"],
            "rollout_engine": c["rollout_engine"],
            "rollout_engine_mem_fraction": float(c["rollout_engine_mem_fraction"]),
            "no_master_weights": c["master_weights"] == "false",
            "paged_optimizer": c["paged_optimizer"] == "true",
            "optimizer_in_backward": c["optimizer_in_backward"] == "true",
            "stack": c["stack"],
            "placement": c["placement"],
            "offload": c["offload"],
            **{k: int(c[k]) for k in _INT},
        }
        if c["groups"]:
            fields["groups"] = c["groups"]
        if int(c["rollout_tp"]) != 1:
            fields["rollout_tp"] = int(c["rollout_tp"])
        if c["critic_zero"]:
            fields["critic_zero"] = int(c["critic_zero"])
        if c["critic_offload"]:
            fields["critic_offload"] = c["critic_offload"]
        out.append(
            RLHFRow(
                **_identity(c),
                fields={**fields, "model": c["model"]},
                scale_up_bytes_per_s=float(c["scale_up_bytes_per_s"]) if c["scale_up_bytes_per_s"] else None,
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class EpochRow:
    """One DeepSpeed-Chat Table 1 step-3 time (``data/rlhf_deepspeed_chat.csv``): an epoch of
    ``samples`` prompts, each step the largest per-device batch that fits, at most ``cap_prompts``
    prompts a step (BenckmarkSetting.md: "the largest training batch size that [does not] result in
    an out-of-memory error", capped at 1,024 pairs)."""

    name: str
    dataset: str
    split: str
    verification: str
    metric: str
    published: float
    fields: dict[str, object]
    samples: int
    cap_prompts: int
    source: str
    notes: str


def epoch_rows() -> list[EpochRow]:
    """Every row of ``data/rlhf_deepspeed_chat.csv``, in fp16 mixed precision: DeepSpeed-Chat's
    training config enables ``"fp16"`` for every model (``training/utils/ds_utils.py``,
    ``get_train_ds_config`` / ``get_eval_ds_config``, https://github.com/microsoft/DeepSpeedExamples/blob/0ac7a6d432082bd094d2fb2376181bfc5e94dccd/applications/DeepSpeed-Chat/training/utils/ds_utils.py)
    and its step-3 scripts set no other dtype (the V100 rows depend on it: Volta has no BF16); eager
    attention: the OPT models train through transformers' ``OPTAttention`` of the benchmark's time
    (batched ``torch.bmm`` of queries and keys, softmax, ``torch.bmm`` with values; v4.28,
    https://github.com/huggingface/transformers/blob/v4.28.1/src/transformers/models/opt/modeling_opt.py),
    which also runs on the V100, where FlashAttention does not."""
    out: list[EpochRow] = []
    for c in _csv_rows("rlhf_deepspeed_chat.csv"):
        prompt, gen = int(c["prompt_len"]), int(c["gen_len"])
        fields: dict[str, object] = {
            "method": "ppo",
            "model": c["model"],
            "reward_model": c["reward_model"],
            "hardware": c["hardware"],
            "devices": int(c["devices"]),
            "zero": int(c["zero"]),
            "recompute": c["recompute"],
            "seq_len": prompt + gen,
            "gen_len": gen,
            "rollout_engine": "hybrid",
            "rollout_eager": True,
            "stack": "deepspeed",
            "precision": "fp16",
            "attention": "eager",
        }
        if c["actor"] != "full":
            fields.update(actor=c["actor"], lora_rank=int(c["lora_rank"]))
        if int(c["rollout_tp"]) != 1:
            fields["rollout_tp"] = int(c["rollout_tp"])
        out.append(
            EpochRow(
                **_identity(c),
                fields=fields,
                samples=int(c["samples"]),
                cap_prompts=int(c["cap_prompts"]),
            )
        )
    return out


def predict_epoch(row: EpochRow) -> tuple[float, int]:
    """(seconds of one epoch, prompts per device per step): the largest power-of-two per-device
    batch up to ``cap_prompts / devices`` whose RL step fits (``RLHFEstimate.fits``), each device
    generating its own batch at once (DeepSpeed-Chat ``per_device_generation_batch_size`` =
    ``per_device_training_batch_size``); the epoch is ``samples / global batch`` steps."""
    from trainplan import estimate
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.models import load_model
    from trainplan.recipe import Recipe
    from trainplan.rlhf import kv_bytes_per_token

    n = int(str(row.fields["devices"]))
    system = System(accelerator=get_accelerator(str(row.fields["hardware"])), num_devices=n)
    kw = {k: v for k, v in row.fields.items() if k not in ("model", "hardware", "devices")}
    per_device = max(1, row.cap_prompts // n)
    per_device = 1 << (per_device.bit_length() - 1)
    model = load_model(str(row.fields["model"]))
    tp = int(str(row.fields.get("rollout_tp", 1)))
    seq_kv = kv_bytes_per_token(model, Recipe(method="full"), tp) * int(str(row.fields["seq_len"]))
    while per_device >= 1:
        # DeepSpeed-Inference sizes its KV workspace for the batch it generates ("Requested memory"
        # in the step-3 log), not for a memory fraction: the engine's fraction is that workspace.
        workspace = per_device * seq_kv / system.accelerator.capacity_bytes
        est = estimate(
            model,
            hardware=system,
            micro_batch=per_device,
            global_batch=per_device * n,
            rollout_concurrency=per_device,
            rollout_engine_mem_fraction=min(1.0, workspace),
            **kw,  # type: ignore[arg-type]
        )
        if est.rlhf is not None and est.rlhf.fits:
            return row.samples / (per_device * n) * est.time.step_s, per_device
        per_device //= 2
    raise TrainplanError(
        "micro_batch",
        f"row {row.name}: no per-device batch fits (the published run does): the memory model misses it",
    )


def epoch_row_result(row: EpochRow) -> RowResult:
    base = {"name": row.name, "dataset": row.dataset, "split": row.split, "metric": row.metric}
    try:
        predicted, per_device = predict_epoch(row)
    except TrainplanError as err:
        return RowResult(
            **base, published=row.published, predicted=None, error=None, assumptions=(), skipped=str(err)
        )
    f = row.fields
    assumptions = (
        f"{per_device} prompts per device (largest that fits)",
        f"ZeRO-{f['zero']}",
        f"actor {f.get('actor', 'full')}" + (f" r{f['lora_rank']}" if "lora_rank" in f else ""),
        f"inference tp {f.get('rollout_tp', 1)}",
        "hybrid engine, eager kernels",
    )
    return RowResult(
        **base,
        published=row.published,
        predicted=predicted,
        error=predicted / row.published - 1.0,
        assumptions=assumptions,
    )


def nemo_rows() -> list[RLHFRow]:
    """Every row of ``data/rlhf_nemo_rl.csv``: NeMo RL's published on-policy GRPO step times
    (``docs/about/performance-summary.md``, each row's commit in its ``source``) with the recipe each
    was run from (``examples/configs/recipes/llm/performance/*.yaml`` over ``grpo_math_1B.yaml``).
    NeMo RL's colocated generation puts vLLM to sleep while Megatron trains and offloads the
    policy while vLLM generates (``offload-between-phases``); it packs sequences (``sequence_packing``)
    and publishes the mean response length ("G-Average Seq len"), so the rows give
    ``--response-len-mean``. The mean prompt is not published: it is the tokens the table's
    Tokens/sec/GPU counts per sample (× GPUs × step time / samples) less the mean response. The
    1-step off-policy rows overlap generation with training, which is not modelled: not included."""
    out: list[RLHFRow] = []
    for c in _csv_rows("rlhf_nemo_rl.csv"):
        seq, prompt = int(c["seq_len"]), int(c["prompt_len"])
        fields: dict[str, object] = {
            "method": "grpo",
            "model": c["model"],
            "hardware": c["hardware"],
            "devices": int(c["devices"]),
            "pp": int(c["pp"]),
            "zero": int(c["zero"]),
            "recompute": c["recompute"],
            "micro_batch": int(c["micro_batch"]),
            "global_batch": int(c["global_batch"]),
            "group_size": int(c["group_size"]),
            "train_batch": int(c["train_batch"]),
            "seq_len": seq,
            "gen_len": seq - prompt,
            "response_len_mean": int(c["response_len_mean"]),
            "rollout_engine_mem_fraction": float(c["rollout_engine_mem_fraction"]),
            "placement": c["placement"],
            "sequence_packing": c["sequence_packing"] == "true",
            "reward_model": "none",
            "stack": "megatron",
            "rollout_engine": "vllm",
        }
        if int(c["rollout_tp"]) != 1:
            fields["rollout_tp"] = int(c["rollout_tp"])
        if int(c["ep"]) != 1:
            fields["ep"] = int(c["ep"])
        out.append(
            RLHFRow(
                **_identity(c),
                fields=fields,
                scale_up_bytes_per_s=None,
            )
        )
    return out


def _system(row: RLHFRow) -> object:
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System

    acc = get_accelerator(str(row.fields["hardware"]))
    if row.scale_up_bytes_per_s is not None:
        acc = dataclasses.replace(
            acc, scale_up=dataclasses.replace(acc.scale_up, bandwidth_bytes_per_s=row.scale_up_bytes_per_s)
        )
    return System(accelerator=acc, num_devices=int(str(row.fields["devices"])))


def predict(row: RLHFRow) -> float:
    """The row's metric as ``trainplan.estimate`` predicts it (seconds, or 1.0 / 0.0 for fits)."""
    from trainplan import estimate

    kw = {k: v for k, v in row.fields.items() if k not in ("model", "hardware", "devices")}
    est = estimate(str(row.fields["model"]), hardware=_system(row), **kw)  # type: ignore[arg-type]
    rl = est.rlhf
    if rl is None:
        raise TrainplanError("method", f"row {row.name} is not an RLHF job")
    split = rl.split_s(est.time)
    if row.metric == "gen_s":
        return split["rollout"] + split["scoring"]
    if row.metric == "train_s":
        return split["training"] + split["sync"]
    if row.metric == "step_s":
        return est.time.step_s
    if row.metric == "fits":
        return 1.0 if rl.fits else 0.0
    raise TrainplanError("metric", f"unknown RLHF metric {row.metric!r}")


def _assumptions(row: RLHFRow) -> tuple[str, ...]:
    out = [
        f"{row.fields['stack']} stack",
        f"{row.fields['rollout_engine']} engine",
        f"train batch {row.fields['train_batch']}",
    ]
    if "groups" in row.fields:
        out.append(f"groups {row.fields['groups']}")
    if "critic_zero" in row.fields:
        out.append(
            f"critic ZeRO-{row.fields['critic_zero']}, offload {row.fields.get('critic_offload', 'as the actor')}"
        )
    if row.scale_up_bytes_per_s is not None:
        out.append(f"A800 NVLink {row.scale_up_bytes_per_s / 1e9:.0f} GB/s one direction")
    if row.metric != "fits":
        out.append(
            f"max lengths {int(str(row.fields['seq_len'])) - int(str(row.fields['gen_len']))}+{row.fields['gen_len']}"
        )
    if "response_len_mean" in row.fields:
        out.append(f"mean response {row.fields['response_len_mean']}")
    if row.fields.get("sequence_packing"):
        out.append("packed")
    return tuple(out)


def row_result(row: RLHFRow) -> RowResult:
    base = {"name": row.name, "dataset": row.dataset, "split": row.split, "metric": row.metric}
    try:
        predicted = predict(row)
    except TrainplanError as err:
        return RowResult(
            **base, published=row.published, predicted=None, error=None, assumptions=(), skipped=str(err)
        )
    error = predicted / row.published - 1.0
    return RowResult(
        **base, published=row.published, predicted=predicted, error=error, assumptions=_assumptions(row)
    )


def validate_rlhf_dataset(name: str) -> DatasetResult:
    bound, _ = RLHF_DATASETS[name]
    if name == "rlhf_deepspeed_chat":
        epochs = [r for r in epoch_rows() if r.verification in ("VERBATIM", "DERIVED")]
        return DatasetResult(name=name, bound=bound, rows=tuple(epoch_row_result(r) for r in epochs))
    every = nemo_rows() if name == "rlhf_nemo_rl_grpo" else rows()
    chosen = [r for r in every if r.dataset == name and r.verification in ("VERBATIM", "DERIVED")]
    return DatasetResult(name=name, bound=bound, rows=tuple(row_result(r) for r in chosen))


__all__ = [
    "RLHF_DATASETS",
    "EpochRow",
    "RLHFRow",
    "epoch_row_result",
    "epoch_rows",
    "nemo_rows",
    "predict",
    "predict_epoch",
    "row_result",
    "rows",
    "validate_rlhf_dataset",
]
