"""RLHF and preference training: PPO, GRPO, DPO and reward-model training, colocated on one set of devices.

An RL step (PPO, GRPO) has three phases on the same devices, as DeepSpeed-Chat, OpenRLHF
(``--colocate_all_models``), verl and TRL (vLLM ``colocate``) run it:

* **rollout** — an inference engine (vLLM / DeepSpeed-Inference) generates ``gen_len`` tokens for
  each of ``prompts × group_size`` sequences: a prefill of the prompt (FLOPs-bound) and
  ``gen_len`` decode steps (bound by the engine's weight and KV-cache bytes over HBM bandwidth at
  the number of sequences its KV budget holds at once);
* **scoring** — forward passes over prompt + response: the old policy (log-probs), the frozen
  reference (KL), the frozen reward model and the critic (values);
* **training** — the actor's (and PPO's critic's) update through the training model of
  ``memory.py`` / ``timing.py``, then the weight sync from trainer to rollout engine.

DPO (Rafailov et al. 2023, Eq. 7) has no rollout: each preference pair is a chosen and a rejected
sequence, both run through the policy (TRL ``DPOTrainer.concatenated_forward`` concatenates them:
the batch doubles) and, unless its log-probs are precomputed or the policy is LoRA on a frozen
base, through the reference. ``rm`` trains a reward model on pairs (Ouyang et al. 2022, Eq. 1):
chosen + rejected, the batch doubles, no reference.

Memory per device is a sum of named terms per phase. With ``placement="colocated"`` every model
stays resident, so every phase holds all of them (peak = the resident sum plus the largest phase's
own transients); with ``"offload-between-phases"`` each phase holds only its own models (vLLM
sleep mode, DeepSpeed / OpenRLHF ``--deepspeed_enable_sleep``, verl ``param_offload``), so the peak
is the largest phase. The critic may take its own ZeRO stage and offload on the shared devices
(DeepSpeed-Chat's ZeRO-3 critic next to a ZeRO-2 actor); disaggregated placement (a device group
per model, each with its own layout) is :func:`estimate_disaggregated`.

Sources: DeepSpeed-Chat (Yao et al. 2023, arXiv:2308.01320, Sec. 4 Hybrid Engine); OpenRLHF (Hu et
al. 2024, arXiv:2405.11143, Sec. 3); vLLM (Kwon et al. 2023, Sec. 4: PagedAttention KV cache,
``gpu_memory_utilization``); GRPO (Shao et al. 2024, arXiv:2402.03300, Sec. 4.1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Final

from trainplan.comm import domain_size, place_group
from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.efficiency import get_efficiency
from trainplan.errors import RecipeError
from trainplan.flops import step_flops, step_sequences
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import (
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION_FRACTION,
    MemoryBreakdown,
    host_bytes_per_node,
    host_fits,
    logits_bytes,
    memory_breakdown,
)
from trainplan.models.params import count_params
from trainplan.models.spec import ModelSpec
from trainplan.recipe import (
    OFFLOADS,
    RLHF_ACTORS,
    RLHF_ENGINES,
    RLHF_METHODS,
    RLHF_PLACEMENTS,
    RLHF_REFERENCES,
    LoRASpec,
    Offload,
    Recipe,
    RLHFActor,
    RLHFPlacement,
    RLHFReference,
    RolloutEngine,
)
from trainplan.rlhf_groups import DeviceGroup, check_groups, group_layout, group_of, group_system
from trainplan.timing import TimeBreakdown, recipe_peaks, step_time

ROLLOUT_METHODS: Final = ("ppo", "grpo")
PAIR_METHODS: Final = ("dpo", "rm")

Reference = RLHFReference
Placement = RLHFPlacement
ActorTraining = RLHFActor
REFERENCES: Final = RLHF_REFERENCES
PLACEMENTS: Final = RLHF_PLACEMENTS
ACTOR_TRAININGS: Final = RLHF_ACTORS
ROLLOUT_ENGINES: Final = RLHF_ENGINES

DEFAULT_ENGINE_MEM_FRACTION: Final = 0.3
"""TRL's default ``vllm_gpu_memory_utilization`` for a vLLM engine colocated with training
(``trl/trainer/grpo_config.py``): the share of device memory the engine takes for its weights and
KV cache (vLLM ``gpu_memory_utilization``, whose own default, 0.9, leaves no room for training)."""

RUNTIMES: Final = "TRL, OpenRLHF or verl"

EAGER_DECODE_LAYER_S: Final = 1.0 / (25.5 * 32)
"""Host time to launch one decoder layer of one decode step in eager PyTorch (seconds): the floor
of a decode step of an engine that launches every kernel from Python each step (Hugging Face
``generate`` on the training module: ``rollout_engine="trainer"``). Fitted on one named
measurement, the gpt-fast starting point: Llama-2-7B (32 layers), batch 1, A100-80GB, "25.5 tok/s
... heavily CPU overhead bound" (PyTorch blog "Accelerating Generative AI with PyTorch II: GPT,
Fast", Nov 2023, https://pytorch.org/blog/accelerating-generative-ai-2/): 1 / (25.5 × 32) s. The
roofline of that step is ~7 ms of weight reads, a fifth of the 39 ms measured. Validated on the
OpenRLHF benchmark's DeepSpeed-Chat generation rows (``validate/data/rlhf_colocated.csv``), which
were not fitted."""

FUSED_EAGER_DECODE_LAYER_S: Final = 2.52 / (256 * 24)
"""The same floor for an inference engine's fused kernels launched eagerly, without a captured
CUDA graph (the DeepSpeed Hybrid Engine's DeepSpeed-Inference kernels; vLLM / verl with
``enforce_eager``, assumed alike): ``--rollout-eager``. Fitted on one named measurement,
DeepSpeed-Chat's published step-3 log (``training_log_output/actor_opt-1.3b_critic_opt-350m_
globalBatchSize64.log``, DeepSpeedExamples @91863475): OPT-1.3B (24 layers) on 16 V100-32GB, Hybrid
Engine, ZeRO-2 (nothing gathered), 4 prompts per device, 256 new tokens: median ``Generate time``
2.52 s over 476 steps, i.e. 9.8 ms per decode step where the V100 roofline is ~3.6 ms; each batch
is taken to decode its maximum (HF ``generate`` stops early only when every sequence of the batch
has). Engines that replay CUDA graphs (vLLM's default) have no floor here; their scheduler's host
time is not modelled. Validated on DeepSpeed-Chat's Table 1 step-3 times
(``validate/data/rlhf_deepspeed_chat.csv``)."""


def is_rlhf(method: str) -> bool:
    return method in RLHF_METHODS


@dataclass(frozen=True, kw_only=True)
class RLHFSpec:
    """The models and the rollout of one RLHF / preference-training job.

    ``reward_model``: the frozen reward model's architecture (``None``: a rule-based reward, PPO
    and GRPO only). ``critic_model``: PPO's value model, initialised from the reward model by
    default (DeepSpeed-Chat step 3, OpenRLHF ``--critic_pretrain`` = the reward model).
    ``reference``: ``model`` (a frozen copy), ``precomputed`` (DPO: TRL
    ``precompute_ref_log_probs``), ``none`` (GRPO without a KL term), ``lora-base`` (the LoRA
    actor's frozen base with the adapters disabled, TRL / Unsloth: no second copy, a forward
    still). ``group_size``: GRPO samples per prompt. The training sequence is ``prompt_len +
    gen_len`` tokens. ``rollout_tp``: tensor-parallel size of each rollout engine (engines =
    devices / rollout_tp). ``rollout_engine_mem_fraction``: vLLM ``gpu_memory_utilization``.
    ``rollout_concurrency``: most sequences an engine generates at once (HF ``generate`` micro
    batch; ``None`` = as many as the KV budget holds, continuous batching).
    ``rollout_engine``: ``vllm`` — an inference engine with its own weight copy in its TP layout
    (OpenRLHF / TRL / verl with vLLM); ``hybrid`` — the trainer's weights gathered once per rollout
    into the engine's layout (DeepSpeed Hybrid Engine, verl 3D-HybridEngine, Unsloth's shared
    weights); ``trainer`` — Hugging Face ``generate`` on the training engine's module (OpenRLHF
    without vLLM, DeepSpeed-Chat with the Hybrid Engine off): in the training layout, and under
    ZeRO-3 every decode step gathers the sharded weights again (DeepSpeed stage-3 forward hooks).
    """

    method: str
    actor: ActorTraining = "full"
    lora: LoRASpec | None = None
    reward_model: ModelSpec | None = None
    critic_model: ModelSpec | None = None
    reference: Reference = "model"
    group_size: int = 1
    prompt_len: int = 0
    gen_len: int = 0
    rollout_tp: int = 1
    rollout_engine_mem_fraction: float = DEFAULT_ENGINE_MEM_FRACTION
    rollout_concurrency: int | None = None
    response_len_mean: int | None = None
    """Mean generated tokens per response (responses stop at EOS); ``None``: every response runs to
    ``gen_len``, the maximum. Read by the continuous-batching engines (``vllm``, ``hybrid``), whose
    freed slots take the next sequence (Kwon et al. 2023, Sec. 4.5; Yu et al. 2022, Orca, iteration-
    level scheduling); a static batch (``trainer``: HF ``generate``) runs until its longest response
    stops and is timed at the maximum."""
    rollout_engine: RolloutEngine = "vllm"
    rollout_eager: bool = False
    """The inference engine (``vllm``, ``hybrid``) launches its kernels eagerly each decode step
    instead of replaying a CUDA graph (DeepSpeed Hybrid Engine; vLLM ``enforce_eager``, verl
    ``rollout.enforce_eager``): a host-side floor per layer (:data:`FUSED_EAGER_DECODE_LAYER_S`).
    HF ``generate`` (``trainer``) is always eager."""
    sequence_packing: bool = False
    """Scoring and training run over each sequence's real tokens, packed into the micro-batch with
    a variable-length attention kernel (OpenRLHF ``--packing_samples``, verl
    ``use_remove_padding``, NeMo RL ``policy.sequence_packing``): their passes are timed at
    ``prompt_len + response_len_mean`` tokens a sequence (:func:`timed_recipe`), their memory at
    ``prompt_len + gen_len`` (a micro-batch whose responses all reach the maximum). ``False``: padded
    to the maximum length (DeepSpeed-Chat, TRL, torchtune PPO)."""
    critic_zero: int | None = None
    """PPO, colocated placements: the critic's ZeRO stage when it is not the actor's (DeepSpeed-Chat
    ``--critic_zero_stage``, ``--actor_zero_stage``: its Llama benchmark scripts train a ZeRO-2 actor
    next to a ZeRO-3 critic). ``None``: the job's ``--zero``. Disaggregated groups give it as
    ``critic=N:zeroK``."""
    critic_offload: Offload | None = None
    """PPO, colocated placements: what the critic keeps in host memory when not the actor's
    ``--offload`` (DeepSpeed-Chat's ``--offload`` puts a ZeRO-3 critic's parameters and optimizer on
    the CPU, ``dschat/utils/ds_utils.py`` ``get_train_ds_config``: ``offload_param`` and
    ``offload_optimizer``, while its ZeRO-2 actor offloads the optimizer only). ``None``: the
    job's."""
    placement: Placement = "colocated"
    train_batch: int | None = None
    """Sequences (PPO, GRPO) or pairs (DPO, RM) per optimizer update; the step's batch is cut into
    ``global_batch × group_size / train_batch`` updates (OpenRLHF ``--train_batch_size``, TRL
    ``num_mini_batches``, torchtune ``ppo_batch_size``). ``None``: one update per step."""
    groups: tuple[DeviceGroup, ...] = ()
    """``placement="disaggregated"``: the device group of each model and of the rollout engine
    (:mod:`trainplan.rlhf_groups`)."""

    def __post_init__(self) -> None:
        m = self.method
        if m not in RLHF_METHODS:
            raise RecipeError("method", f"{m!r} is not an RLHF method ({', '.join(RLHF_METHODS)})")
        if self.placement == "disaggregated":
            if m not in ROLLOUT_METHODS:
                raise RecipeError(
                    "placement",
                    f"disaggregated placement is the schedule of RL with a rollout (OpenRLHF Ray, NeMo RL, verl); "
                    f"{m} runs its models on one device set: use colocated or offload-between-phases",
                )
            if not self.groups:
                raise RecipeError(
                    "groups",
                    "disaggregated placement needs its device groups, e.g. "
                    "--groups actor=4,critic=4,ref=2,reward=2,rollout=4",
                )
            check_groups(
                self.groups, method=m, roles_needed=self.group_roles, rollout_engine=self.rollout_engine
            )
        elif self.groups:
            raise RecipeError(
                "groups", "device groups are for --placement disaggregated; add it or drop --groups"
            )
        if self.actor != "full" and self.lora is None:
            object.__setattr__(self, "lora", LoRASpec())
        if self.actor == "full" and self.lora is not None:
            raise RecipeError("lora_rank", "LoRA settings given for a fully trained actor; use --actor lora")
        if self.reference == "precomputed" and m != "dpo":
            raise RecipeError(
                "reference", f"precomputed reference log-probs are a DPO option, not {m}: use model or none"
            )
        if self.reference == "none" and m not in ("grpo", "rm"):
            raise RecipeError(
                "reference",
                f"{m} needs a reference (its KL penalty or its loss reads it); use none with grpo only",
            )
        if self.reference == "lora-base" and self.actor == "full":
            raise RecipeError("reference", "lora-base needs a LoRA actor (--actor lora or qlora)")
        if m == "rm" and self.reference != "none":
            raise RecipeError("reference", "reward-model training has no reference policy; drop --reference")
        if m == "rm" and self.placement != "colocated":
            raise RecipeError(
                "placement", "reward-model training is one model in one phase; drop --placement"
            )
        if m == "rm" and self.actor != "full":
            raise RecipeError("actor", "reward-model training trains the whole model here; use --actor full")
        if m not in ROLLOUT_METHODS:
            for name, value, default in (
                ("group_size", self.group_size, 1),
                ("rollout_tp", self.rollout_tp, 1),
                (
                    "rollout_engine_mem_fraction",
                    self.rollout_engine_mem_fraction,
                    DEFAULT_ENGINE_MEM_FRACTION,
                ),
                ("rollout_concurrency", self.rollout_concurrency, None),
                ("response_len_mean", self.response_len_mean, None),
                ("rollout_eager", self.rollout_eager, False),
                ("sequence_packing", self.sequence_packing, False),
                ("rollout_engine", self.rollout_engine, "vllm"),
                ("gen_len", self.gen_len, 0),
            ):
                if value != default:
                    raise RecipeError(name, f"{m} has no rollout; drop --{name.replace('_', '-')}")
        if m in PAIR_METHODS and self.reward_model is not None:
            raise RecipeError("reward_model", f"{m} uses no reward model; drop --reward-model")
        if m != "ppo" and self.critic_model is not None:
            raise RecipeError("critic_model", f"{m} has no critic (PPO only); drop --critic-model")
        for name in ("critic_zero", "critic_offload"):
            if getattr(self, name) is None:
                continue
            flag = f"--{name.replace('_', '-')}"
            if m != "ppo":
                raise RecipeError(name, f"{m} has no critic (PPO only); drop {flag}")
            if self.placement == "disaggregated":
                raise RecipeError(
                    name,
                    f"{flag} sets the critic's layout on the shared devices; disaggregated, the critic's "
                    "group has its own (--groups critic=N:zeroK, the job's --offload): drop it",
                )
        if self.critic_zero is not None and self.critic_zero not in (0, 1, 2, 3):
            raise RecipeError("critic_zero", f"ZeRO stage must be 0, 1, 2 or 3, got {self.critic_zero!r}")
        if self.critic_offload is not None and self.critic_offload not in OFFLOADS:
            raise RecipeError(
                "critic_offload",
                f"unknown value {self.critic_offload!r}; choose one of {', '.join(OFFLOADS)}",
            )
        if m != "grpo" and self.group_size != 1:
            raise RecipeError("group_size", "samples per prompt is a GRPO setting; use --method grpo")
        if self.train_batch is not None and self.train_batch <= 0:
            raise RecipeError("train_batch", f"must be a positive integer, got {self.train_batch!r}")
        if not isinstance(self.group_size, int) or self.group_size <= 0:
            raise RecipeError("group_size", f"must be a positive integer, got {self.group_size!r}")
        if not 0.0 < self.rollout_engine_mem_fraction <= 1.0:
            raise RecipeError(
                "rollout_engine_mem_fraction", f"must be in (0, 1], got {self.rollout_engine_mem_fraction}"
            )
        for name, choices in (
            ("actor", ACTOR_TRAININGS),
            ("reference", REFERENCES),
            ("placement", PLACEMENTS),
            ("rollout_engine", ROLLOUT_ENGINES),
        ):
            if getattr(self, name) not in choices:
                raise RecipeError(
                    name, f"unknown value {getattr(self, name)!r}; choose one of {', '.join(choices)}"
                )
        if self.rollout_tp <= 0:
            raise RecipeError("rollout_tp", f"must be a positive integer, got {self.rollout_tp}")
        if m in ROLLOUT_METHODS and (self.prompt_len <= 0 or self.gen_len <= 0):
            raise RecipeError("gen_len", "prompt and generation lengths must be positive")
        if self.rollout_eager and self.rollout_engine == "trainer":
            raise RecipeError(
                "rollout_eager",
                "HF generate (--rollout-engine trainer) always launches eagerly and has its own floor; "
                "drop --rollout-eager, or give an inference engine (vllm, hybrid)",
            )
        if self.response_len_mean is not None:
            if not isinstance(self.response_len_mean, int) or self.response_len_mean <= 0:
                raise RecipeError(
                    "response_len_mean", f"must be a positive integer, got {self.response_len_mean!r}"
                )
            if self.response_len_mean > self.gen_len:
                raise RecipeError(
                    "response_len_mean",
                    f"a mean of {self.response_len_mean} tokens exceeds the maximum --gen-len {self.gen_len}; "
                    "give a mean no larger than the maximum",
                )
            if self.rollout_engine == "trainer" and not self.sequence_packing:
                raise RecipeError(
                    "response_len_mean",
                    "HF generate runs a static batch until its longest response stops (under ZeRO-3, every "
                    "rank's batch): the maximum --gen-len times it; drop --response-len-mean, use an engine "
                    "with continuous batching (--rollout-engine vllm or hybrid), or add --sequence-packing "
                    "for the mean to time the packed scoring and training passes",
                )
        if self.sequence_packing and self.response_len_mean is None:
            raise RecipeError(
                "sequence_packing",
                "packing removes the padding of responses shorter than --gen-len; without "
                "--response-len-mean every response runs to the maximum and packing changes nothing: "
                "give --response-len-mean",
            )

    @property
    def mean_response_len(self) -> float:
        """Mean generated tokens per sequence (``gen_len`` unless ``response_len_mean`` is given)."""
        return float(self.gen_len if self.response_len_mean is None else self.response_len_mean)

    @property
    def rollout_response_len(self) -> float:
        """Mean decode steps a response takes in the rollout: :attr:`mean_response_len` for the
        continuous-batching engines; HF ``generate`` (``trainer``) runs its static batch to the
        longest response, ``gen_len``."""
        return float(self.gen_len) if self.rollout_engine == "trainer" else self.mean_response_len

    @property
    def group_roles(self) -> tuple[str, ...]:
        """The models that need a device group when disaggregated (``rollout`` is optional)."""
        roles = ["actor"]
        if self.method == "ppo":
            roles.append("critic")
        if self.reference == "model":
            roles.append("ref")
        if self.reward_model is not None:
            roles.append("reward")
        return tuple(roles)


def seq_lengths(method: str, seq_len: int, prompt_len: int | None, gen_len: int | None) -> tuple[int, int]:
    """(prompt, generation) tokens of a rollout sequence of ``seq_len`` = prompt + response.

    Unset lengths split the sequence (``gen_len`` defaults to half of it); both given must add up
    to ``seq_len`` (the training sequence), else the error names the ``--seq-len`` to use."""
    if method not in ROLLOUT_METHODS:
        if prompt_len is not None or gen_len is not None:
            raise RecipeError("gen_len", f"{method} has no rollout; drop --prompt-len/--gen-len")
        return 0, 0
    if prompt_len is not None and gen_len is not None:
        if prompt_len + gen_len != seq_len:
            raise RecipeError(
                "seq_len",
                f"the trained sequence is prompt + generation = {prompt_len + gen_len} tokens; "
                f"give --seq-len {prompt_len + gen_len}",
            )
        return prompt_len, gen_len
    if gen_len is None:
        gen_len = seq_len - prompt_len if prompt_len is not None else seq_len // 2
    prompt = seq_len - gen_len
    if prompt <= 0 or gen_len <= 0:
        raise RecipeError("gen_len", f"--gen-len {gen_len} leaves no prompt in --seq-len {seq_len}")
    return prompt, gen_len


# --- the models of a job ------------------------------------------------------------------------
def actor_recipe(recipe: Recipe, spec: RLHFSpec) -> Recipe:
    """The policy's training recipe: trained as ``spec.actor`` on ``prompts × group_size``
    sequences (PPO, GRPO) or on chosen + rejected (DPO, reward model: micro and global batch ×2,
    TRL ``concatenated_forward``)."""
    pairs = spec.method in PAIR_METHODS
    factor = 2 if pairs else spec.group_size
    return dataclasses.replace(
        recipe,
        method=spec.actor if spec.method != "rm" else "full",
        lora=spec.lora if spec.actor != "full" else None,
        micro_batch=recipe.micro_batch * (2 if pairs else 1),
        global_batch=None if recipe.global_batch is None else recipe.global_batch * factor,
    )


def update_recipe(recipe: Recipe, spec: RLHFSpec, layout: Layout) -> Recipe:
    """The recipe of one optimizer update of the policy: :func:`actor_recipe` with ``train_batch``
    sequences (pairs ×2) per update, when given."""
    step = actor_recipe(recipe, spec)
    if spec.train_batch is None:
        return step
    per_update = spec.train_batch * (2 if spec.method in PAIR_METHODS else 1)
    total = step_sequences(step, layout)
    if per_update > total or total % per_update:
        raise RecipeError(
            "train_batch",
            f"{total} sequences per step do not split into updates of {per_update}; "
            "give a --train-batch that divides the step's batch",
        )
    return dataclasses.replace(step, global_batch=per_update)


def updates_per_step(recipe: Recipe, spec: RLHFSpec, layout: Layout) -> int:
    """Optimizer updates of the actor (and critic) per RL step."""
    step = step_sequences(actor_recipe(recipe, spec), layout)
    return step // step_sequences(update_recipe(recipe, spec, layout), layout)


def frozen_recipe(recipe: Recipe) -> Recipe:
    """A frozen model's forward recipe: full-model weights in the recipe's dtype, no adapters,
    nothing offloaded, no optimizer and no FP32 master copy (a frozen model is loaded in the
    weight dtype: DeepSpeed eval engines and TRL's reference ``create_reference_model`` hold bf16
    weights; under ZeRO-3 / FSDP the sharded parameter is then 16-bit, not the FP32 master)."""
    return dataclasses.replace(
        recipe,
        method="full",
        lora=None,
        offload="none",
        paged_optimizer=False,
        optimizer_in_backward=False,
        master_weights=False,
    )


def packed_seq_len(spec: RLHFSpec, layout: Layout) -> int:
    """Tokens a packed sequence is timed at: ``prompt_len + response_len_mean``, rounded up to a
    multiple of 2·cp·tp (the split a context- and sequence-parallel layout needs; NeMo RL pads each
    packed sequence to ``make_sequence_length_divisible_by``)."""
    step = 2 * layout.cp * layout.tp if (layout.cp > 1 or layout.sequence_parallel) else 1
    tokens = spec.prompt_len + math.ceil(spec.mean_response_len)
    return min(spec.prompt_len + spec.gen_len, step * math.ceil(tokens / step))


def timed_recipe(recipe: Recipe, spec: RLHFSpec | None, layout: Layout) -> Recipe:
    """The recipe whose passes time the scoring forwards and the actor / critic updates: ``recipe``
    itself (padded to ``seq_len``), or with ``spec.sequence_packing`` each sequence at its real
    tokens (:func:`packed_seq_len`) — the same number of sequences, the padding removed. A packed
    micro-batch concatenates its sequences (``cu_seqlens``) and needs a variable-length attention
    kernel so that no sequence attends to another: OpenRLHF runs ``--packing_samples`` with
    ``--attn_implementation flash_attention_2`` (``examples/scripts/train_ppo_llama_with_reward_fn.sh``),
    NeMo RL packs with its Megatron backend's THD (packed) layout (``grpo_math_1B.yaml``
    ``policy.sequence_packing``), verl removes padding for flash-attention's varlen kernel. Attention is timed
    at the mean length: the mean of the squares of varying lengths is larger (a lower bound on
    that term). Memory stays at ``seq_len``: the largest micro-batch holds maximum-length responses."""
    if spec is None or not spec.sequence_packing:
        return recipe
    if recipe.attention != "flash":
        raise RecipeError(
            "sequence_packing",
            "packed sequences need a variable-length attention kernel (flash attention: OpenRLHF "
            "--packing_samples, verl use_remove_padding); with --attention eager the framework pads "
            "to --seq-len: drop --sequence-packing or use --attention flash",
        )
    return dataclasses.replace(recipe, seq_len=packed_seq_len(spec, layout))


@dataclass(frozen=True, kw_only=True)
class ScoredModel:
    """One forward pass of the scoring phase: ``role`` names it, ``resident`` whether it holds
    weights of its own (the reference of a LoRA actor is its base: no copy)."""

    role: str
    model: ModelSpec
    resident: bool


def scored_models(policy: ModelSpec, spec: RLHFSpec) -> tuple[ScoredModel, ...]:
    """The forwards before the update: old-policy log-probs (PPO, GRPO: OpenRLHF / verl compute
    them in ``make_experience``), the reference, the reward model and PPO's critic values."""
    out: list[ScoredModel] = []
    if spec.method in ROLLOUT_METHODS:
        out.append(ScoredModel(role="old-policy log-probs", model=policy, resident=False))
    if spec.method != "rm" and spec.reference in ("model", "lora-base"):
        out.append(ScoredModel(role="reference", model=policy, resident=spec.reference == "model"))
    if spec.method in ROLLOUT_METHODS and spec.reward_model is not None:
        out.append(ScoredModel(role="reward model", model=spec.reward_model, resident=True))
    if spec.method == "ppo":
        out.append(ScoredModel(role="critic values", model=critic_of(policy, spec), resident=False))
    return tuple(out)


def critic_layout(layout: Layout, spec: RLHFSpec) -> Layout:
    """The critic's layout on the colocated devices: the job's, with ``spec.critic_zero`` when
    given (the same devices and data parallelism; only the sharding of its states differs)."""
    if spec.critic_zero is None or spec.critic_zero == layout.zero:
        return layout
    return dataclasses.replace(layout, zero=spec.critic_zero)


def critic_recipe(update: Recipe, spec: RLHFSpec) -> Recipe:
    """The critic's training recipe: one update of :func:`update_recipe`, fully trained (a LoRA
    actor's adapters are not the critic's), with ``spec.critic_offload`` when given."""
    rec = dataclasses.replace(update, method="full", lora=None)
    if spec.critic_offload is not None:
        rec = dataclasses.replace(rec, offload=spec.critic_offload)
    return rec


def critic_of(policy: ModelSpec, spec: RLHFSpec) -> ModelSpec:
    """PPO's critic: given, else the reward model's architecture, else the policy's."""
    if spec.critic_model is not None:
        return spec.critic_model
    return spec.reward_model if spec.reward_model is not None else policy


# --- the rollout engine ---------------------------------------------------------------------------
def kv_bytes_per_token(model: ModelSpec, recipe: Recipe, tp: int) -> float:
    """KV cache of one token on one engine rank: 2 (K, V) × layers × KV heads × head dim × bytes,
    the KV heads split over the engine's tensor parallelism (at least one per rank: vLLM replicates
    KV heads when tp exceeds them). vLLM PagedAttention (Kwon et al. 2023, Sec. 4.1)."""
    heads = math.ceil(model.num_kv_heads / tp)
    return 2.0 * model.num_layers * heads * model.head_dim * BYTES_PER_ELEMENT[recipe.weight_dtype]


def preallocates_kv(spec: RLHFSpec) -> bool:
    """Whether the engine reserves its whole KV budget up front (vLLM / an inference engine) rather
    than growing the cache with the sequences it holds (HF ``generate``)."""
    return spec.rollout_engine != "trainer"


def engine_weights_bytes(model: ModelSpec, recipe: Recipe, tp: int) -> float:
    """The rollout engine's weights on one rank: all parameters in the weight dtype over its TP
    size (vLLM shards every linear layer and the vocabulary, Shoeybi et al. 2019 Sec. 3)."""
    return count_params(model).total * BYTES_PER_ELEMENT[recipe.weight_dtype] / tp


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """The generation of one RL step on each engine (seconds, bytes per device)."""

    engines: int
    sequences_per_engine: int
    concurrent_sequences: int
    waves: int
    kv_budget_bytes: float
    kv_cache_bytes: float
    engine_weights_bytes: float  # the engine's own weight copy per rank (vllm; 0 otherwise)
    gathered_weights_bytes: float  # hybrid: the trainer's weights gathered into the engine layout
    prefill_s: float
    decode_s: float
    decode_step_s: float
    decode_steps: float  # decode steps of one engine (:func:`decode_steps`)
    tp_allreduce_s: float  # of one decode step (:func:`decode_tp_allreduce_s`)
    prefill_flops_per_engine: float
    decode_bound: str  # "memory", "compute", "ZeRO-3 gather" or "kernel launch"
    fits_one_sequence: bool


def rollout(
    system: System,
    model: ModelSpec,
    recipe: Recipe,
    spec: RLHFSpec,
    sequences: int,
    layout: Layout | None = None,
) -> Rollout:
    """Prefill and decode time of ``sequences`` generated sequences over the system's engines.

    Concurrency: C = min(sequences per engine, ``rollout_concurrency``, ⌊KV budget / KV of one
    sequence⌋) with KV budget = ``rollout_engine_mem_fraction`` × device memory − engine weights (vLLM
    ``gpu_memory_utilization``; Kwon et al. 2023 Sec. 4) and one sequence's KV = (prompt + gen) ×
    :func:`kv_bytes_per_token`. The sequences run in ⌈S/C⌉ waves of C.

    Prefill of a wave (roofline, Williams et al. 2009): the forward FLOPs of C prompts
    (``flops.step_flops``) over the engine's ranks at the dense peak × large-GEMM efficiency, and
    never faster than reading the weights once. Decode: :func:`decode_steps` steps (``waves ×
    gen_len`` when every response runs to the maximum), each the largest of (engine weights + KV
    of C sequences at the mean context prompt + mean response / 2) / (HBM bandwidth × measured
    streaming efficiency), 2 · active params · C / tp FLOPs at the GEMM rate — the memory-bound
    regime of small batches (Pope et al. 2022, "Efficiently Scaling Transformer Inference", Sec.
    2-3) — and the host's kernel-launch floor of an eager engine (:func:`decode_launch_floor_s`),
    plus the step's tensor-parallel all-reduces (:func:`decode_tp_allreduce_s`).

    ``rollout_engine="trainer"`` generates in the training ``layout`` (engines = devices / tp, no
    weight copy); under ZeRO-3 each decode step (and each wave's prefill) all-gathers the
    sharded weights over the shard group (:func:`gather_s`), overlapped with the step's own
    roofline by DeepSpeed's prefetch: the step is the larger of the two.
    """
    acc = system.accelerator
    tp = spec.rollout_tp
    trainer = spec.rollout_engine == "trainer"
    if trainer:
        if layout is None:
            raise RecipeError(
                "rollout_engine", "the trainer engine generates in the training layout: pass it"
            )
        if tp not in (1, layout.tp):
            raise RecipeError(
                "rollout_tp",
                f"--rollout-engine trainer generates in the training layout (tp {layout.tp}); drop --rollout-tp",
            )
        tp = layout.tp
    if system.num_devices % tp:
        raise RecipeError(
            "rollout_tp", f"--rollout-tp {tp} does not divide the {system.num_devices} devices into engines"
        )
    engines = system.num_devices // tp
    per_engine = math.ceil(sequences / engines)
    weights = engine_weights_bytes(model, recipe, tp)
    own_copy = 0.0 if spec.rollout_engine != "vllm" else weights
    seq_tokens = spec.prompt_len + spec.gen_len
    kv_seq = kv_bytes_per_token(model, recipe, tp) * seq_tokens
    budget = max(0.0, spec.rollout_engine_mem_fraction * acc.capacity_bytes - own_copy)
    held = int(budget // kv_seq)
    cap = spec.rollout_concurrency if spec.rollout_concurrency is not None else per_engine
    concurrent = max(1, min(per_engine, cap, held))
    waves = math.ceil(per_engine / concurrent)
    eff = get_efficiency(acc.name)
    pk = recipe_peaks(acc, recipe, eff)
    flops_per_s = pk.peak * eff.gemm_max(pk.dtype)
    bw = acc.memory_bandwidth_bytes_per_s * eff.memory_bandwidth_efficiency
    prompt = dataclasses.replace(
        frozen_recipe(recipe), seq_len=spec.prompt_len, micro_batch=concurrent, global_batch=concurrent
    )
    prefill_flops = step_flops(model, prompt).forward.flops
    gather = 0.0
    if trainer and layout is not None and layout.zero == 3:
        gather = gather_s(system, weights, layout.shard_group)
    prefill_wave_s = max(prefill_flops / tp / flops_per_s, weights / bw, gather)
    mean_len = spec.rollout_response_len
    mean_context = spec.prompt_len + mean_len / 2.0
    kv_read = concurrent * kv_bytes_per_token(model, recipe, tp) * mean_context
    memory_s = (weights + kv_read) / bw
    compute_s = 2.0 * count_params(model).active * concurrent / tp / flops_per_s
    launch_s = decode_launch_floor_s(model, spec.rollout_engine, eager=spec.rollout_eager)
    allreduce_s = decode_tp_allreduce_s(system, model, recipe, concurrent, tp)
    step_s = max(memory_s, compute_s, gather, launch_s) + allreduce_s
    steps = decode_steps(waves, spec.gen_len, spec.rollout_response_len)
    bound = max(
        (memory_s, "memory"), (compute_s, "compute"), (gather, "ZeRO-3 gather"), (launch_s, "kernel launch")
    )[1]
    return Rollout(
        engines=engines,
        sequences_per_engine=per_engine,
        concurrent_sequences=concurrent,
        waves=waves,
        kv_budget_bytes=budget,
        kv_cache_bytes=budget if preallocates_kv(spec) else min(concurrent * kv_seq, budget),
        engine_weights_bytes=own_copy,
        gathered_weights_bytes=weights if spec.rollout_engine == "hybrid" else 0.0,
        prefill_s=waves * prefill_wave_s,
        decode_s=steps * step_s,
        decode_step_s=step_s,
        decode_steps=steps,
        tp_allreduce_s=allreduce_s,
        prefill_flops_per_engine=waves * prefill_flops,
        decode_bound=bound,
        fits_one_sequence=held >= 1,
    )


def decode_steps(waves: int, gen_len: int, mean_len: float) -> float:
    """Decode steps of one engine over ``waves`` batches of its concurrent sequences.

    Every response at the maximum (``mean_len == gen_len``): ``waves × gen_len``. With a shorter
    mean, continuous batching (Yu et al. 2022, Orca, iteration-level scheduling; vLLM, Kwon et al.
    2023 Sec. 4.5) gives a finished sequence's slot to the next one, so each slot runs its
    sequences back to back at the mean length; the rollout ends when the last ones started finish,
    and the longest of them runs to the maximum: ``(waves − 1) × mean + gen_len``. The last wave's
    batch shrinks as its sequences stop; its steps are counted at the full batch's cost (an upper
    bound on that wave)."""
    return (waves - 1) * mean_len + gen_len


def decode_launch_floor_s(model: ModelSpec, engine: str, *, eager: bool = False) -> float:
    """The host-side floor of one decode step: ``num_layers × EAGER_DECODE_LAYER_S`` for HF
    ``generate``'s module-by-module launches (``trainer``), ``num_layers ×
    FUSED_EAGER_DECODE_LAYER_S`` for an inference engine's fused kernels launched eagerly
    (``eager``), 0 for an engine that replays a CUDA graph. The GPU runs behind the host, so the
    step is the larger of this and its roofline (gpt-fast: "heavily CPU overhead bound")."""
    if engine == "trainer":
        return model.num_layers * EAGER_DECODE_LAYER_S
    return model.num_layers * FUSED_EAGER_DECODE_LAYER_S if eager else 0.0


def decode_tp_allreduce_s(
    system: System, model: ModelSpec, recipe: Recipe, concurrent: int, tp: int
) -> float:
    """Tensor-parallel all-reduces of one decode step: two per layer (after the attention output
    and the MLP down projection, Shoeybi et al. 2019 Sec. 3) of ``concurrent × hidden`` activations
    in the weight dtype, over the engine's ``tp`` ranks (``comm.Network.time_s``: the per-step
    latency dominates these small messages). Each waits for its layer, so none overlaps."""
    if tp <= 1:
        return 0.0
    nbytes = concurrent * model.hidden_size * BYTES_PER_ELEMENT[recipe.weight_dtype]
    net = system.network
    one = net.time_s("all_reduce", nbytes, place_group("rollout_tp", tp, 1, domain_size(system)))
    return 2.0 * model.num_layers * one


def phase_reload_s(system: System, reloaded_bytes_per_device: float) -> float:
    """Offload between phases: the bytes each phase loads back onto a device (its models' weights
    or training states; the KV cache is freed and reallocated, not copied) over the host link,
    once per step (vLLM ``LLM.sleep(level=1)`` / ``wake_up``: weights to CPU memory and back;
    DeepSpeed ``offload_states`` / ``reload_states`` in OpenRLHF ``--deepspeed_enable_sleep``).
    The copy out of one phase runs in the other direction of the full-duplex link while the next
    phase's copy comes in: the loads alone are timed."""
    link = system.accelerator.host_link
    if link is None or reloaded_bytes_per_device == 0:
        return 0.0
    return reloaded_bytes_per_device / link.bandwidth_bytes_per_s


def gather_s(system: System, gathered_bytes: float, group: int) -> float:
    """All-gather of ``gathered_bytes`` (the output: the whole engine shard) over ``group``
    consecutive ranks: ``comm.Network.time_s`` (NCCL ring, two levels when the group spans
    scale-up domains; Thakur et al. 2005)."""
    if group <= 1 or gathered_bytes == 0:
        return 0.0
    net = system.network
    return net.time_s("all_gather", gathered_bytes, place_group("rollout", group, 1, domain_size(system)))


def weight_sync_s(system: System, bytes_per_device: float, group: int) -> float:
    """Trainer → rollout engine weight sync on each device: its engine shard gathered from the
    trainer's ZeRO shards (:func:`gather_s`; OpenRLHF's NCCL broadcast / CUDA-IPC, verl's
    in-process reshard, NeMo RL "refit"), or, with nothing sharded, one copy at HBM bandwidth."""
    if group <= 1:
        return bytes_per_device / system.accelerator.memory_bandwidth_bytes_per_s
    return gather_s(system, bytes_per_device, group)


# --- the estimate -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RLHFEstimate:
    """Memory per device per phase (named terms) and the RL step's time terms."""

    spec: RLHFSpec
    placement: str
    phases: dict[str, list[tuple[str, float]]]
    capacity_bytes: float
    host_bytes: float  # per device: offloaded models and states (``memory.host_bytes_per_node`` × devices)
    host_capacity_bytes_per_node: float | None
    devices_on_node: int
    models: dict[str, float]  # resident bytes per model (weights or training states)
    rollout: Rollout | None
    time_terms: dict[str, float]  # the RL terms of timing.TimeBreakdown (terms.RLHF groups)
    actor_step_s: float  # the actor's updates of one RL step
    updates: int  # optimizer updates per RL step
    sequences: int
    tokens_per_step: float
    model_flops_per_step: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    groups: tuple[GroupMemory, ...] = ()
    """Disaggregated placement: each device group's memory (then ``phases`` holds one entry per
    group, its fullest phase's terms, and the peak is the fullest group)."""

    def phase_bytes(self, phase: str) -> float:
        return sum(v for _, v in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak_bytes(self) -> float:
        return self.phase_bytes(self.peak_phase)

    @property
    def per_device_bytes(self) -> float:
        """Peak live bytes + CUDA context + allocator fragmentation (the constants of ``memory.py``)."""
        return self.peak_bytes * (1.0 + FRAGMENTATION_FRACTION) + CUDA_CONTEXT_BYTES

    @property
    def host_fits(self) -> bool | None:
        """What waits in host memory fits the server (``memory.host_fits``); ``None``: unknown host."""
        if not self.host_bytes:
            return True
        if self.host_capacity_bytes_per_node is None:
            return None
        if self.groups:
            return self.host_bytes_per_node <= self.host_capacity_bytes_per_node
        return bool(host_fits(self.host_bytes, self.devices_on_node, self.host_capacity_bytes_per_node))

    @property
    def device_fits(self) -> bool:
        return self.per_device_bytes <= self.capacity_bytes and (
            self.rollout is None or self.rollout.fits_one_sequence
        )

    @property
    def host_bytes_per_node(self) -> float:
        """Host memory of the fullest server; disaggregated, the groups take consecutive ranks in
        the order given (``--groups``) and each device's offloaded states wait on its own server
        (``memory.host_bytes_per_node``, summed over the ranks of each server)."""
        if self.groups:
            ranks = [g.host_bytes for g in self.groups for _ in range(g.devices)]
            n = self.devices_on_node
            return max(sum(ranks[i : i + n]) for i in range(0, len(ranks), n))
        return float(host_bytes_per_node(self.host_bytes, self.devices_on_node))

    @property
    def fits(self) -> bool:
        return self.device_fits and self.host_fits is not False

    def reasons(self) -> list[str]:
        from trainplan.units import fmt_bytes

        out: list[str] = []
        if self.rollout is not None and not self.rollout.fits_one_sequence:
            out.append(
                f"the rollout engine's KV budget ({fmt_bytes(self.rollout.kv_budget_bytes)} after its weights) "
                "holds no whole sequence; raise --rollout-engine-mem-fraction or --rollout-tp, or shorten the sequence"
            )
        if self.per_device_bytes > self.capacity_bytes:
            top = sorted(self.phases[self.peak_phase], key=lambda kv: kv[1], reverse=True)[:3]
            named = ", ".join(f"{n} {fmt_bytes(v)}" for n, v in top if v > 0)
            where = f"in the {self.peak_phase} phase ({self.placement})"
            if self.groups:
                g = next(g for g in self.groups if f"{g.label} group" == self.peak_phase)
                where = f"on the {g.label} group ({g.devices} devices, {g.phase} phase)"
            out.append(
                f"needs {fmt_bytes(self.per_device_bytes)} per device > {fmt_bytes(self.capacity_bytes)} "
                f"{where}; largest terms: {named}"
            )
        if self.host_fits is False:
            out.append(
                f"keeps {fmt_bytes(self.host_bytes_per_node)} per server in host memory "
                + (
                    "(the fullest server, groups on consecutive ranks) "
                    if self.groups
                    else f"({self.devices_on_node} device(s) × {fmt_bytes(self.host_bytes)}) "
                )
                + f"> {fmt_bytes(float(self.host_capacity_bytes_per_node or 0))}; "
                "keep models resident (--placement colocated), offload less, or give the server's --host-memory"
            )
        return out

    def split_s(self, time: TimeBreakdown) -> dict[str, float]:
        """The RL step as rollout / scoring / training (actor + critic) / sync / reload seconds."""
        t = self.time_terms
        return {
            "rollout": t["rollout_prefill_s"] + t["rollout_decode_s"],
            "scoring": t["scoring_s"],
            "training": time.step_s - sum(t.values()) + t["critic_update_s"],
            "sync": t["weight_sync_s"],
            "reload": t["phase_reload_s"],
        }

    def to_dict(self, time: TimeBreakdown) -> dict[str, object]:
        r = self.rollout
        s = self.spec
        return {
            "method": s.method,
            "actor": s.actor,
            "reference": s.reference,
            "reward_model": s.reward_model.name if s.reward_model is not None else None,
            "critic_model": critic_of_name(s),
            "placement": self.placement,
            "group_size": s.group_size,
            "prompt_len": s.prompt_len,
            "gen_len": s.gen_len,
            "response_len_mean": s.mean_response_len,
            "sequence_packing": s.sequence_packing,
            "sequences_per_step": self.sequences,
            "updates_per_step": self.updates,
            "train_batch": s.train_batch,
            "per_device_bytes": self.per_device_bytes,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "fits": self.fits,
            "capacity_bytes": self.capacity_bytes,
            "host_bytes": self.host_bytes,
            "host_fits": self.host_fits,
            "models_bytes": dict(self.models),
            "phases": {p: {n: v for n, v in terms} for p, terms in self.phases.items()},
            "phase_bytes": {p: self.phase_bytes(p) for p in self.phases},
            "time": {**self.time_terms, "actor_update_s": self.actor_step_s},
            "split_s": self.split_s(time),
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_step / time.step_s,
            "tokens_per_s_definition": (
                "(prompt + response) tokens of every sequence of the step (responses at --response-len-mean "
                "when given) per second of the RL step "
                "(DeepSpeed-Chat: samples × (prompt + generation) per epoch); DPO / RM: chosen + rejected tokens"
            ),
            "model_flops_per_step": self.model_flops_per_step,
            "rollout": None
            if r is None
            else {
                "engines": r.engines,
                "rollout_tp": s.rollout_tp,
                "sequences_per_engine": r.sequences_per_engine,
                "concurrent_sequences": r.concurrent_sequences,
                "waves": r.waves,
                "kv_budget_bytes": r.kv_budget_bytes,
                "kv_cache_bytes": r.kv_cache_bytes,
                "engine": s.rollout_engine,
                "engine_weights_bytes": r.engine_weights_bytes,
                "gathered_weights_bytes": r.gathered_weights_bytes,
                "decode_step_s": r.decode_step_s,
                "decode_steps": r.decode_steps,
                "decode_tp_allreduce_s": r.tp_allreduce_s,
                "decode_bound": r.decode_bound,
                "fits_one_sequence": r.fits_one_sequence,
            },
            "notes": list(self.notes),
            "groups": [
                {
                    "group": g.label,
                    "devices": g.devices,
                    "layout": g.layout,
                    "peak_phase": g.phase,
                    "per_device_bytes": sum(v for _, v in g.terms) * (1.0 + FRAGMENTATION_FRACTION)
                    + CUDA_CONTEXT_BYTES,
                    "terms": dict(g.terms),
                    "host_bytes_per_device": g.host_bytes,
                }
                for g in self.groups
            ],
        }


@dataclass(frozen=True, kw_only=True)
class GroupMemory:
    """One device group of a disaggregated job: its devices, layout, and the phase in which its
    devices hold the most (``terms``, per device)."""

    label: str
    devices: int
    layout: str
    phase: str
    terms: tuple[tuple[str, float], ...]
    host_bytes: float = 0.0  # per device: the trained model's offloaded states


def estimate_disaggregated(
    system: System,
    policy: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    spec: RLHFSpec,
    *,
    actor_memory: MemoryBreakdown,
    actor_time: TimeBreakdown,
) -> RLHFEstimate:
    """A PPO / GRPO step with a device group per model (:mod:`trainplan.rlhf_groups`).

    ``layout`` is the job's (its tp / pp / ZeRO are each group's default); ``actor_memory`` /
    ``actor_time`` are the actor's training step on its own group. Every term is the colocated
    model's — a frozen model's weights (``memory_breakdown(...).weights_bytes``), its forward
    (``timing.step_time(...).forward_s``), the critic's training step, the engine's
    :func:`rollout` — evaluated on the group's system and layout; the phases combine them as the
    module docstring of :mod:`trainplan.rlhf_groups` says (sum of phases, longest group within)."""
    groups = spec.groups
    cap = system.accelerator.capacity_bytes
    arec = actor_recipe(recipe, spec)
    frozen = frozen_recipe(arec)
    g_actor = group_of(groups, "actor")
    assert g_actor is not None  # RLHFSpec checked the roles
    lay_actor = group_layout(layout, g_actor)
    sys_actor = group_system(system, g_actor)
    sequences = step_sequences(arec, lay_actor)
    updates = updates_per_step(recipe, spec, lay_actor)

    def on(role: str) -> tuple[DeviceGroup, System, Layout]:
        g = group_of(groups, role)
        assert g is not None
        lay = group_layout(layout, g)
        return g, group_system(system, g), lay

    # Per group: resident terms, each phase's transients, and the forwards it runs while scoring.
    resident: dict[str, list[tuple[str, float]]] = {g.label: [] for g in groups}
    transient: dict[str, dict[str, list[tuple[str, float]]]] = {g.label: {} for g in groups}
    forwards_s: dict[str, float] = {g.label: 0.0 for g in groups}
    scoring_flops = 0.0
    resident[g_actor.label].append(("actor training states", actor_memory.model_states_bytes))
    transient[g_actor.label]["training"] = [
        (
            "actor training step (peak live, beyond its states)",
            actor_memory.peak_bytes - actor_memory.model_states_bytes,
        )
    ]
    models: dict[str, float] = {"actor training states": actor_memory.model_states_bytes}
    critic_s = 0.0
    critic_flops_trained = False
    host = actor_memory.host_bytes
    host_of: dict[str, float] = {g_actor.label: actor_memory.host_bytes}
    if spec.method == "ppo":
        g, sys_c, lay_c = on("critic")
        critic = critic_of(policy, spec)
        lay_c.check_model(critic)
        crec = dataclasses.replace(update_recipe(recipe, spec, lay_c), method="full", lora=None)
        nmb_c = lay_c.check_batch(
            seq_len=crec.seq_len, micro_batch=crec.micro_batch, global_batch=crec.global_batch
        )
        cmem = memory_breakdown(critic, crec, lay_c, capacity_bytes=cap, num_microbatches=nmb_c)
        critic_s = (
            updates_per_step(recipe, spec, lay_c)
            * step_time(sys_c, critic, timed_recipe(crec, spec, lay_c), lay_c, memory=cmem).step_s
        )
        critic_flops_trained = True
        resident[g.label].append(("critic training states", cmem.model_states_bytes))
        transient[g.label]["training"] = [
            ("critic training step (peak live, beyond its states)", cmem.peak_bytes - cmem.model_states_bytes)
        ]
        models["critic training states"] = cmem.model_states_bytes
        host = max(host, cmem.host_bytes)
        host_of[g.label] = cmem.host_bytes
    for sm in scored_models(policy, spec):
        g, sys_g, lay_g = on(group_role(sm))
        lay_g.check_model(sm.model)
        lay_g.check_batch(
            seq_len=frozen.seq_len, micro_batch=frozen.micro_batch, global_batch=frozen.global_batch
        )
        if sm.resident:
            w = memory_breakdown(sm.model, frozen, lay_g).weights_bytes
            resident[g.label].append((f"{sm.role} weights (frozen)", w))
            models[f"{sm.role} weights (frozen)"] = w
        scored_recipe = timed_recipe(frozen, spec, lay_g)
        forwards_s[g.label] += _forward_s(sys_g, sm.model, scored_recipe, lay_g)
        scoring_flops += _forward_flops(sm.model, scored_recipe, lay_g)
        logits = logits_bytes(sm.model, frozen, lay_g)[0]
        held = transient[g.label].get("scoring", [("", 0.0)])[0][1]
        transient[g.label]["scoring"] = [("log-prob logits (FP32, one micro-batch)", max(logits, held))]
    g_roll = group_of(groups, "rollout")
    sync_s = 0.0
    if g_roll is not None:
        sys_r = group_system(system, g_roll)
        ro = rollout(sys_r, policy, frozen, spec, sequences)
        resident[g_roll.label] += [
            ("rollout engine weights", ro.engine_weights_bytes),
            ("rollout KV cache", ro.kv_cache_bytes),
        ]
        models["rollout engine weights"] = ro.engine_weights_bytes
        models["rollout KV cache"] = ro.kv_cache_bytes
        sync_s = broadcast_sync_s(
            system, sys_actor, lay_actor, engine_weights_bytes(policy, frozen, 1), g_roll.devices
        )
    else:
        ro = rollout(sys_actor, policy, frozen, spec, sequences, lay_actor)
        gen = [("rollout KV cache (generate)", ro.kv_cache_bytes)]
        if lay_actor.zero == 3:
            gen.append(
                (
                    "ZeRO-3 gathered layers (generate)",
                    actor_memory.fsdp_root_bytes + 2 * actor_memory.fsdp_block_bytes,
                )
            )
        transient[g_actor.label]["rollout"] = gen
    actor_step_s = updates * actor_time.step_s
    terms = {
        "rollout_prefill_s": ro.prefill_s,
        "rollout_decode_s": ro.decode_s,
        "scoring_s": max(forwards_s.values()),
        # critic.fit.remote() runs while the actor trains and syncs (ActorPPOTrainer.ppo_train)
        "critic_update_s": max(0.0, critic_s - actor_step_s - sync_s),
        "weight_sync_s": sync_s,
        "phase_reload_s": 0.0,
    }
    group_mem: list[GroupMemory] = []
    phases: dict[str, list[tuple[str, float]]] = {}
    for g in groups:
        own = transient[g.label] or {"rollout": []}
        phase = max(own, key=lambda p: sum(v for _, v in own[p]))
        terms_g = (*resident[g.label], *own[phase])
        if g is g_roll:
            described = f"{ro.engines} engine(s) × tp {spec.rollout_tp}"
        else:
            described = group_layout(layout, g).describe()
        group_mem.append(
            GroupMemory(
                label=g.label,
                devices=g.devices,
                layout=described,
                phase=phase,
                terms=terms_g,
                host_bytes=host_of.get(g.label, 0.0),
            )
        )
        phases[f"{g.label} group"] = list(terms_g)
    notes = [
        "disaggregated: each model on its own device group, resident; the step is rollout + scoring "
        "(the longest group) + actor update + sync + the critic's update beyond them (concurrent, "
        "OpenRLHF Ray PPO)",
        *step_notes(spec, updates),
    ]
    return RLHFEstimate(
        spec=spec,
        placement=spec.placement,
        phases=phases,
        capacity_bytes=cap,
        host_bytes=host,
        host_capacity_bytes_per_node=system.host_memory_bytes_per_node,
        devices_on_node=system.devices_on_a_node,
        models=models,
        rollout=ro,
        time_terms=terms,
        actor_step_s=actor_step_s,
        updates=updates,
        sequences=sequences,
        tokens_per_step=tokens_per_step(spec, arec, sequences),
        model_flops_per_step=model_flops_per_step(
            policy,
            spec,
            timed_recipe(arec, spec, lay_actor),
            lay_actor,
            ro,
            sequences,
            scoring_flops,
            trains_critic=critic_flops_trained,
        ),
        notes=tuple(notes),
        groups=tuple(group_mem),
    )


def group_role(sm: ScoredModel) -> str:
    """The device group (``rlhf_groups.ROLES``) that runs a scoring forward: the reference's and
    the reward model's own, the critic's values on the critic, the old-policy log-probs and a
    LoRA actor's base-as-reference (adapters disabled) on the actor."""
    if sm.role == "reference":
        return "ref" if sm.resident else "actor"
    return {"reward model": "reward", "critic values": "critic"}.get(sm.role, "actor")


def broadcast_sync_s(
    system: System, actor_system: System, actor_layout: Layout, full_weights_bytes: float, engine_devices: int
) -> float:
    """OpenRLHF's ``_broadcast_to_vllm``: each parameter gathered over the actor's ZeRO-3 group
    (:func:`gather_s`), then broadcast from actor rank 0 to the engines' ranks over one NCCL group
    (actor rank 0 + every engine rank, consecutive ranks of the job's system). A ring broadcast
    moves the whole buffer over each link once (nccl-tests ``doc/PERFORMANCE.md``: broadcast bus
    bandwidth = algorithm bandwidth), the time of an all-gather of the same output to within
    (p − 1)/p: :func:`gather_s` of the full weights over the p = engine ranks + 1."""
    gather = (
        gather_s(actor_system, full_weights_bytes, actor_layout.shard_group)
        if actor_layout.zero == 3
        else 0.0
    )
    return gather + gather_s(system, full_weights_bytes, engine_devices + 1)


def model_flops_per_step(
    policy: ModelSpec,
    spec: RLHFSpec,
    arec: Recipe,
    layout: Layout,
    ro: Rollout | None,
    sequences: int,
    scoring_flops: float,
    *,
    trains_critic: bool,
) -> float:
    """Model FLOPs of one RL step: the actor's training step (``flops.step_flops``), the critic's,
    the scoring forwards, the rollout's prefill and its decode (2 · active params per generated
    token, Kaplan et al. 2020 Sec. 2.1)."""
    actor = step_flops(policy, arec, layout).model_flops
    critic = (
        step_flops(critic_of(policy, spec), frozen_recipe(arec), layout).model_flops if trains_critic else 0.0
    )
    rollout_flops = 0.0
    if ro is not None:
        decode_flops = 2.0 * count_params(policy).active * sequences * spec.rollout_response_len
        rollout_flops = ro.prefill_flops_per_engine * ro.engines + decode_flops
    return actor + critic + scoring_flops + rollout_flops


def tokens_per_step(spec: RLHFSpec, arec: Recipe, sequences: int) -> float:
    """Tokens of one RL step as the frameworks count them: PPO / GRPO every sequence's prompt +
    its response (``response_len_mean`` when given: NeMo RL's Tokens/sec/GPU counts the tokens
    processed, docs/about/performance-summary.md; DeepSpeed-Chat samples × (prompt + generation),
    its generation running to the maximum); DPO / RM the chosen + rejected sequences at ``seq_len``."""
    if spec.method in ROLLOUT_METHODS:
        return sequences * (spec.prompt_len + spec.mean_response_len)
    return float(sequences * arec.seq_len)


def step_notes(spec: RLHFSpec, updates: int) -> list[str]:
    notes: list[str] = []
    if spec.method in ROLLOUT_METHODS:
        notes.append(
            f"{updates} actor{' and critic' if spec.method == 'ppo' else ''} update(s) per step "
            "(ppo_epochs = 1); the rollout is the engine's roofline, an eager engine's kernel-launch floor and "
            "its TP all-reduces (no scheduler or sampling overheads)"
        )
    if spec.sequence_packing:
        notes.append(
            f"sequence packing: scoring and updates timed at {spec.prompt_len} + {spec.mean_response_len:.0f} "
            f"tokens a sequence (memory at the {spec.prompt_len + spec.gen_len}-token maximum); attention at "
            "the mean length, a lower bound on that term when lengths vary"
        )
    if spec.method in ("rm", "ppo") or spec.reward_model is not None:
        notes.append("reward and value heads are counted as the model's LM head (a scalar head is smaller)")
    return notes


def critic_of_name(spec: RLHFSpec) -> str | None:
    if spec.method != "ppo":
        return None
    if spec.critic_model is not None:
        return spec.critic_model.name
    return spec.reward_model.name if spec.reward_model is not None else "the policy"


def _forward_s(system: System, model: ModelSpec, recipe: Recipe, layout: Layout) -> float:
    """Forward time of ``recipe``'s sequences through ``model`` — the forward term of the training
    step of ``timing.step_time`` (roofline per op class, calibrated κ), nothing else."""
    return step_time(system, model, recipe, layout).forward_s


def _forward_flops(model: ModelSpec, recipe: Recipe, layout: Layout) -> float:
    return step_flops(model, recipe, layout).forward.flops


def estimate_rlhf(
    system: System,
    policy: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    spec: RLHFSpec,
    *,
    actor_memory: MemoryBreakdown,
    actor_time: TimeBreakdown,
    num_microbatches: int,
) -> RLHFEstimate:
    """Memory per phase and the RL time terms; ``actor_memory`` / ``actor_time`` are the actor's
    own training step (``memory.memory_breakdown`` and ``timing.step_time`` of
    :func:`actor_recipe`)."""
    if spec.placement == "disaggregated":
        return estimate_disaggregated(
            system,
            policy,
            recipe,
            layout,
            spec,
            actor_memory=actor_memory,
            actor_time=actor_time,
        )
    cap = system.accelerator.capacity_bytes
    arec = actor_recipe(recipe, spec)
    frozen = frozen_recipe(arec)
    sequences = step_sequences(arec, layout)
    updates = updates_per_step(recipe, spec, layout)
    urec = update_recipe(recipe, spec, layout)
    notes: list[str] = []

    def frozen_weights(model: ModelSpec) -> float:
        """A frozen model's weights per device, sharded as the trained models are (ZeRO-3, TP, PP):
        the ``weights_bytes`` of ``memory.memory_breakdown``."""
        return memory_breakdown(model, frozen, layout).weights_bytes

    # Resident bytes of every model, and the transient of each phase.
    persistent: list[tuple[str, float]] = [("actor training states", actor_memory.model_states_bytes)]
    critic_mem: MemoryBreakdown | None = None
    critic_time: TimeBreakdown | None = None
    clay = critic_layout(layout, spec)
    if spec.method == "ppo":
        critic = critic_of(policy, spec)
        crec = critic_recipe(urec, spec)
        clay.check_model(critic)
        critic_mem = memory_breakdown(
            critic, crec, clay, capacity_bytes=cap, num_microbatches=num_microbatches
        )
        critic_time = step_time(system, critic, timed_recipe(crec, spec, clay), clay, memory=critic_mem)
        persistent.append(("critic training states", critic_mem.model_states_bytes))
    rollout_only: list[tuple[str, float]] = []
    scored = scored_models(policy, spec)
    for sm in scored:
        if sm.resident:
            persistent.append((f"{sm.role} weights (frozen)", frozen_weights(sm.model)))
    ro: Rollout | None = None
    if spec.method in ROLLOUT_METHODS:
        ro = rollout(system, policy, frozen, spec, sequences, layout)
        if ro.engine_weights_bytes:
            persistent.append(("rollout engine weights", ro.engine_weights_bytes))
        if ro.gathered_weights_bytes and (layout.zero == 3 or layout.tp != spec.rollout_tp):
            rollout_only.append(("actor weights gathered into the engine layout", ro.gathered_weights_bytes))
        if spec.rollout_engine == "trainer" and layout.zero == 3:
            rollout_only.append(
                (
                    "ZeRO-3 gathered layers (generate)",
                    actor_memory.fsdp_root_bytes + 2 * actor_memory.fsdp_block_bytes,
                )
            )
        kv = ("rollout KV cache", ro.kv_cache_bytes)
        (persistent if preallocates_kv(spec) else rollout_only).append(kv)
    # Scoring: the FP32 log-softmax of one micro-batch (the log-prob logits; memory.logits_bytes).
    logits = logits_bytes(policy, frozen, layout)[0] if scored else 0.0
    by_name = dict(persistent)
    resident_sum = sum(by_name.values())

    def trained_phase(own: MemoryBreakdown, states_name: str) -> list[tuple[str, float]]:
        return [(f"{states_name.split(' training')[0]} training step (peak live)", own.peak_bytes)]

    phases: dict[str, list[tuple[str, float]]] = {}
    colocated = spec.placement == "colocated"
    reload_s = 0.0
    trainers = [(actor_memory, "actor training states")]
    if critic_mem is not None:
        trainers.append((critic_mem, "critic training states"))
    if colocated:
        others = [(n, v) for n, v in persistent]
        if ro is not None:
            phases["rollout"] = [*others, *rollout_only]
        if scored:
            phases["scoring"] = [*others, ("log-prob logits (FP32, one micro-batch)", logits)]
        for own, name in trainers:
            phase = "training" if name.startswith("actor") else "critic training"
            phases[phase] = [
                *[(n, v) for n, v in persistent if n != name],
                *trained_phase(own, name),
            ]
        host = actor_memory.host_bytes + (critic_mem.host_bytes if critic_mem is not None else 0.0)
    else:
        if ro is not None:
            copy = ("rollout engine weights", ro.engine_weights_bytes)
            shared = ("actor weights (the engine runs on them)", actor_memory.weights_bytes)
            phases["rollout"] = [
                copy if ro.engine_weights_bytes else shared,
                *rollout_only,
                ("rollout KV cache", ro.kv_cache_bytes),
            ]
        if scored:
            phases["scoring"] = [
                *[
                    (f"{sm.role} weights", frozen_weights(sm.model))
                    for sm in scored
                    if sm.resident or sm.role != "reference" or spec.method == "dpo"
                ],
                ("log-prob logits (FP32, one micro-batch)", logits),
            ]
        for own, name in trainers:
            phase = "training" if name.startswith("actor") else "critic training"
            phases[phase] = trained_phase(own, name)
        # Host memory: the resident models a phase does not load wait there; the largest such set.
        loaded = {
            "rollout": ("rollout engine weights", "rollout KV cache"),
            "scoring": tuple(n for n in by_name if n.endswith("(frozen)")),
            "training": ("actor training states",),
            "critic training": ("critic training states",),
        }
        waiting = max(resident_sum - sum(by_name.get(n, 0.0) for n in loaded[p]) for p in phases)
        host = waiting + actor_memory.host_bytes + (critic_mem.host_bytes if critic_mem else 0.0)
        reloaded = sum(by_name.get(n, 0.0) for p in phases for n in loaded[p] if n != "rollout KV cache")
        if ro is not None and not ro.engine_weights_bytes:
            reloaded += actor_memory.weights_bytes  # the engine runs on the actor's weights
        reload_s = phase_reload_s(system, reloaded)
        notes.append(
            "offload-between-phases: each phase loads only its own models; the others wait in host "
            "memory (vLLM sleep mode, DeepSpeed / OpenRLHF sleep, verl param offload); reloads over the "
            "host link are a term of their own"
            + (
                ""
                if system.accelerator.host_link is not None
                else " (no host link in the catalog: not timed)"
            )
        )

    # Time terms.
    scoring_s = 0.0
    scoring_flops = 0.0
    for sm in scored:
        lay_s = clay if sm.role == "critic values" else layout
        scored_recipe = timed_recipe(frozen, spec, lay_s)
        scoring_s += _forward_s(system, sm.model, scored_recipe, lay_s)
        scoring_flops += _forward_flops(sm.model, scored_recipe, lay_s)
    critic_s = updates * critic_time.step_s if critic_time is not None else 0.0
    sync_bytes = 0.0
    if ro is not None and spec.rollout_engine != "trainer":
        # vllm: refresh the engine's copy; hybrid: gather ZeRO-3 shards into the engine's TP shards
        sync_bytes = ro.engine_weights_bytes or ro.gathered_weights_bytes
        if spec.rollout_engine == "hybrid" and layout.zero != 3 and layout.tp == spec.rollout_tp:
            sync_bytes = 0.0
    terms = {
        "rollout_prefill_s": ro.prefill_s if ro is not None else 0.0,
        "rollout_decode_s": ro.decode_s if ro is not None else 0.0,
        "scoring_s": scoring_s,
        "critic_update_s": critic_s,
        "weight_sync_s": weight_sync_s(system, sync_bytes, layout.shard_group if layout.zero == 3 else 1)
        if sync_bytes
        else 0.0,
        "phase_reload_s": reload_s,
    }
    notes.extend(step_notes(spec, updates))
    return RLHFEstimate(
        spec=spec,
        placement=spec.placement,
        phases=phases,
        capacity_bytes=cap,
        host_bytes=host,
        host_capacity_bytes_per_node=system.host_memory_bytes_per_node,
        devices_on_node=system.devices_on_a_node,
        models=by_name,
        rollout=ro,
        time_terms=terms,
        actor_step_s=updates * actor_time.step_s,
        updates=updates,
        sequences=sequences,
        tokens_per_step=tokens_per_step(spec, arec, sequences),
        model_flops_per_step=model_flops_per_step(
            policy,
            spec,
            timed_recipe(arec, spec, layout),
            layout,
            ro,
            sequences,
            scoring_flops,
            trains_critic=critic_time is not None,
        ),
        notes=tuple(notes),
    )


__all__ = [
    "ACTOR_TRAININGS",
    "PLACEMENTS",
    "REFERENCES",
    "RLHF_METHODS",
    "RLHFEstimate",
    "RLHFSpec",
    "Rollout",
    "actor_recipe",
    "estimate_rlhf",
    "is_rlhf",
    "kv_bytes_per_token",
    "rollout",
    "seq_lengths",
    "timed_recipe",
    "update_recipe",
    "updates_per_step",
]
