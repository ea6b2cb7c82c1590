"""The registry of named step-time terms: each declared once with its key, label, group and source.

``timing.step_terms`` computes them (over floats for ``estimate``, over arrays for the planner);
everything that shows them reads this registry: the human breakdown (``TimeBreakdown.terms``),
the JSON (``time.<key>``), the planner's explanations, the web page's grouping and the plots.
``step_s`` is their sum in this order.

Groups (what a user asks "where does the time go?" in):

=================  ==============================================================
compute            the stage's forward, backward and recompute passes (roofline)
communication      collectives on the critical path after overlap
bubble             pipeline fill and drain
optimizer          gradient accumulation and the optimizer update on the device
offload            host-link transfers and the CPU optimizer step
rollout            RLHF generation: prefill and decode of the rollout engine
scoring            RLHF forwards before the update (reference, reward, critic, old policy)
critic             PPO's critic update (the actor's update is the terms above)
sync               RLHF weight sync from the trainer to the rollout engine
=================  ==============================================================

The last four groups are 0 for a training step; ``rlhf.estimate_rlhf`` fills them for PPO, GRPO,
DPO and reward-model training.

No dependency: the web page and the plots import it without the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

TermGroup = Literal[
    "compute", "communication", "bubble", "optimizer", "offload", "rollout", "scoring", "critic", "sync"
]


@dataclass(frozen=True, kw_only=True)
class Term:
    """One named term of the step time."""

    key: str  # JSON field of ``time`` (seconds per step)
    label: str  # human label
    group: TermGroup
    source: str  # paper + section / equation, or the repository file the formula follows


TIME_TERMS: Final[tuple[Term, ...]] = (
    Term(
        key="forward_s",
        label="compute (forward)",
        group="compute",
        source="Williams et al. 2009 (roofline) per op class; FLOPs: Narayanan et al. 2021 Eq. 3; attention "
        "kernel rates: Shah et al. 2024 (FlashAttention-3) Figs. 5-6, Dao 2023 (FlashAttention-2) Sec. 4.1",
    ),
    Term(
        key="backward_s",
        label="compute (backward)",
        group="compute",
        source="Williams et al. 2009 (roofline); backward = 2× forward GEMM FLOPs (Narayanan et al. 2021 Sec. 5.1); "
        "attention backward rates: Shah et al. 2024 (FlashAttention-3) Fig. 6",
    ),
    Term(
        key="recompute_s",
        label="compute (recompute)",
        group="compute",
        source="Korthikanti et al. 2022 Sec. 5 (full and selective recompute)",
    ),
    Term(
        key="exposed_tp_s",
        label="tensor-parallel comm (exposed)",
        group="communication",
        source="Shoeybi et al. 2019 Sec. 3; Korthikanti et al. 2022 Sec. 4.2.2; TE userbuffers overlap",
    ),
    Term(
        key="exposed_ep_s",
        label="expert dispatch comm (exposed)",
        group="communication",
        source="Lepikhin et al. 2020 (GShard); Fedus et al. 2021 Sec. 2.2; Megatron-Core token_dispatcher.py (expert-TP gathers)",
    ),
    Term(
        key="exposed_cp_s",
        label="context-parallel comm (exposed)",
        group="communication",
        source="Liu et al. 2023 (Ring Attention) Sec. 3",
    ),
    Term(
        key="pp_p2p_s",
        label="pipeline send/recv",
        group="communication",
        source="Narayanan et al. 2021 Sec. 2.2 and 4.1",
    ),
    Term(
        key="exposed_dp_s",
        label="data-parallel / ZeRO comm (exposed)",
        group="communication",
        source="Rajbhandari et al. 2020 Sec. 7; Li et al. 2020 (PyTorch DDP) Sec. 3.2.3",
    ),
    Term(
        key="bubble_s",
        label="pipeline bubble",
        group="bubble",
        source="Narayanan et al. 2021 Sec. 2.2.1 (1F1B, interleaved); Qi et al. 2023 Sec. 3 (ZB-H1)",
    ),
    Term(
        key="grad_accum_s",
        label="gradient accumulation",
        group="optimizer",
        source="PyTorch AccumulateGrad; Megatron-LM megatron/model/distributed.py main_grad hook",
    ),
    Term(
        key="optimizer_s",
        label="optimizer step",
        group="optimizer",
        source="memory-bound update: bytes read and written per parameter (flops.optimizer_update_bytes)",
    ),
    Term(
        key="offload_s",
        label="offload transfers + CPU step",
        group="offload",
        source="Ren et al. 2021 (ZeRO-Offload) Sec. 5; Rajbhandari et al. 2021 (ZeRO-Infinity)",
    ),
    Term(
        key="rollout_prefill_s",
        label="rollout prefill",
        group="rollout",
        source="roofline (Williams et al. 2009) of the prompt forward FLOPs; rlhf.rollout",
    ),
    Term(
        key="rollout_decode_s",
        label="rollout decode",
        group="rollout",
        source="(weights + KV-cache bytes) / HBM bandwidth per decode step (Pope et al. 2022 Sec. 2-3); rlhf.rollout",
    ),
    Term(
        key="scoring_s",
        label="scoring forwards (ref, reward, critic, old policy)",
        group="scoring",
        source="forward term of timing.step_time per scored model (Ouyang et al. 2022; OpenRLHF make_experience)",
    ),
    Term(
        key="critic_update_s",
        label="critic update",
        group="critic",
        source="timing.step_time of the critic's training step (PPO, Schulman et al. 2017)",
    ),
    Term(
        key="weight_sync_s",
        label="weight sync (trainer to rollout engine)",
        group="sync",
        source="ring all-gather of the engine shard over the scale-up link (Thakur et al. 2005); rlhf.weight_sync_s",
    ),
    Term(
        key="phase_reload_s",
        label="models reloaded between phases (host link)",
        group="offload",
        source="bytes each phase loads back over the host link (vLLM sleep / wake_up, DeepSpeed reload_states); "
        "rlhf.phase_reload_s",
    ),
)
"""The step-time terms in the order ``step_s`` adds them."""

TERM_GROUPS: Final[tuple[TermGroup, ...]] = (
    "compute",
    "communication",
    "bubble",
    "optimizer",
    "offload",
    "rollout",
    "scoring",
    "critic",
    "sync",
)
RLHF_TERM_KEYS: Final = (
    "rollout_prefill_s",
    "rollout_decode_s",
    "scoring_s",
    "critic_update_s",
    "weight_sync_s",
    "phase_reload_s",
)
"""The terms only an RLHF step has (0 in a training step)."""

BY_KEY: Final[dict[str, Term]] = {t.key: t for t in TIME_TERMS}
BY_LABEL: Final[dict[str, Term]] = {t.label: t for t in TIME_TERMS}


def group_of(label_or_key: str) -> TermGroup:
    """The group of a term named by its label or its key (KeyError names the unknown term)."""
    term = BY_LABEL.get(label_or_key) or BY_KEY.get(label_or_key)
    if term is None:
        raise KeyError(f"no step-time term {label_or_key!r}; terms: {', '.join(BY_KEY)}")
    return term.group


__all__ = [
    "BY_KEY",
    "BY_LABEL",
    "RLHF_TERM_KEYS",
    "TERM_GROUPS",
    "TIME_TERMS",
    "Term",
    "TermGroup",
    "group_of",
]
