"""Disaggregated RLHF placement (trainplan.rlhf_groups): a device group per model, the OpenRLHF
70B-on-16-GPU case, the schedule (sum of phases, longest group within), and the refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainplan import estimate
from trainplan.errors import TrainplanError
from trainplan.rlhf_groups import parse_groups

# OpenRLHF examples/scripts/train_ppo_llama_ray_70b.sh: ref 2, reward 2, actor 4, critic 4, 2 vLLM x TP2.
RUN_70B = dict(
    hardware="a100-80gb",
    devices=16,
    method="ppo",
    zero=3,
    recompute="full",
    micro_batch=1,
    global_batch=1024,
    train_batch=128,
    seq_len=2048,
    gen_len=1024,
    offload="optimizer",
    placement="disaggregated",
    groups="ref=2,reward=2,actor=4,critic=4,rollout=4",
    rollout_tp=2,
    rollout_engine_mem_fraction=0.9,
)
SMALL = dict(
    hardware="h100-sxm",
    method="ppo",
    zero=3,
    recompute="full",
    micro_batch=4,
    global_batch=64,
    seq_len=1024,
    placement="disaggregated",
)


def _small(groups: str, devices: int, **kw: object):
    return estimate("llama-2-7b", devices=devices, groups=groups, **{**SMALL, **kw})


def test_openrlhf_70b_on_16_gpus_fits_with_a_small_kv_budget() -> None:
    est = estimate("llama-2-70b", **RUN_70B)
    rl = est.rlhf
    assert rl is not None and rl.fits
    groups = {g.label: g for g in rl.groups}
    assert [g.devices for g in rl.groups] == [2, 2, 4, 4, 4]
    # Frozen 70B in bf16 over a 2-device ZeRO-3 group: 69 GB of weights per device.
    ref = dict(groups["ref"].terms)["reference weights (frozen)"]
    assert ref == pytest.approx(68.98e9 * 2 / 2, rel=0.01)
    # The engines: 70B over TP2 leaves 0.9 × capacity − 69 GB of KV cache per rank.
    ro = rl.rollout
    assert ro is not None and ro.engines == 2
    cap = est.system.accelerator.capacity_bytes
    assert ro.kv_budget_bytes == pytest.approx(0.9 * cap - ro.engine_weights_bytes)
    kv_seq = (
        2 * 80 * (8 // 2) * 128 * 2 * 2048
    )  # 2 (K,V) × layers × KV heads per rank × head dim × bf16 × tokens
    assert ro.concurrent_sequences == int(ro.kv_budget_bytes // kv_seq) < 32
    # A placement that leaves less KV budget after the weights generates slower.
    tight = estimate("llama-2-70b", **{**RUN_70B, "rollout_engine_mem_fraction": 0.85}).rlhf
    assert tight is not None and tight.rollout is not None
    assert tight.rollout.concurrent_sequences < ro.concurrent_sequences
    assert tight.rollout.decode_s > ro.decode_s
    # Without Adam offload the 4-device actor group cannot hold 70B of mixed-precision Adam states.
    no_offload = estimate("llama-2-70b", **{**RUN_70B, "offload": "none"})
    assert not no_offload.feasible and "actor group" in no_offload.reasons()[0]
    d = est.to_dict()["rlhf"]
    assert [g["group"] for g in d["groups"]] == ["ref", "reward", "actor", "critic", "rollout"]


def test_each_group_is_its_own_system_and_layout() -> None:
    est = _small("actor=4,critic=2,ref=1,reward=1", 8, rollout_engine="trainer")
    assert est.rlhf is not None
    # The actor's training step is the actor group's: dp = 4, not the job's 8.
    alone = estimate("llama-2-7b", devices=4, **{**SMALL, "method": "full", "placement": None})
    assert est.memory.model_states_bytes == pytest.approx(alone.memory.model_states_bytes)
    assert est.rlhf.actor_step_s == pytest.approx(est.rlhf.updates * alone.time.step_s)
    # Per-group layout options: the critic group in tp 2.
    tp = _small("actor=4,critic=2:tp2,ref=1,reward=1", 8, rollout_engine="trainer")
    assert tp.rlhf is not None
    assert {g.label: g.layout for g in tp.rlhf.groups}["critic"].startswith("dp=1 tp=2")


def test_schedule_sum_of_phases_longest_group_within() -> None:
    est = _small("actor=4,critic=1,ref=1,reward=1,rollout=1", 8)
    rl, t = est.rlhf, est.time
    assert rl is not None
    # The critic on 1 device trains slower than the actor on 4: only its excess is added.
    assert t.critic_update_s > 0
    split = rl.split_s(t)
    assert split["training"] == pytest.approx(rl.actor_step_s + t.critic_update_s)
    # Scoring is the longest group's forwards (the actor's old-policy log-probs on 4 devices run
    # while the reference, reward and critic forwards run on 1 each), not their sum.
    # ref, reward and critic are the same 7B forward on one device each: the phase is one of them;
    # the reference and reward model sharing one device run one after the other: twice as long.
    joined = _small("actor=4,critic=1,ref+reward=1,rollout=1", 7).time
    assert joined.scoring_s == pytest.approx(2 * t.scoring_s, rel=0.02)
    assert est.time.step_s == pytest.approx(sum(split.values()), rel=1e-9)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]))
def test_more_rollout_devices_never_slow_generation(a: int, b: int) -> None:
    small, big = sorted((a, b))

    def gen(n: int) -> float:
        rl = _small(f"actor=2,critic=2,ref=1,reward=1,rollout={n}", 6 + n).rlhf
        assert rl is not None
        return rl.time_terms["rollout_prefill_s"] + rl.time_terms["rollout_decode_s"]

    assert gen(big) <= gen(small)


@pytest.mark.parametrize(
    ("groups", "devices", "kw", "field", "words"),
    [
        ("actor=4,critic=2,ref=1", 7, {}, "groups", "reward"),
        ("actor=4,critic=2,ref=1,reward=1", 9, {"rollout_engine": "trainer"}, "groups", "--devices 8"),
        ("actor+critic=4,ref=2,reward=2", 8, {"rollout_engine": "trainer"}, "groups", "concurrently"),
        ("actor=2,critic=2,ref+rollout=2,reward=2", 8, {}, "groups", "own"),
        ("actor=2,critic=2,ref=2,reward=2", 8, {}, "groups", "rollout"),
        (
            "actor=2,critic=2,ref=1,reward=1,rollout=2",
            8,
            {"rollout_engine": "hybrid"},
            "rollout_engine",
            "vllm",
        ),
        ("actor=2,critic=2,ref=1,reward=1,rollout=2", 8, {"method": "dpo"}, "placement", "dpo"),
        (
            "actor=2,critic=2,ref=1,reward=1,rollout=2",
            8,
            {"placement": "colocated"},
            "groups",
            "disaggregated",
        ),
        ("actor=2,critic=2,policy=1,reward=1,rollout=2", 8, {}, "groups", "unknown role"),
        ("actor=2,actor=2", 4, {}, "groups", "two groups"),
    ],
)
def test_refusals_name_the_reason(groups: str, devices: int, kw: dict, field: str, words: str) -> None:
    with pytest.raises(TrainplanError) as err:
        _small(groups, devices, **kw)
    assert err.value.field == field and words in str(err.value)


def test_disaggregated_needs_its_groups() -> None:
    with pytest.raises(TrainplanError, match="needs its device groups"):
        estimate("llama-2-7b", devices=8, **SMALL)


def test_parse_groups_reads_layouts_and_joins() -> None:
    g = parse_groups("actor+ref=4:tp2:zero3, critic=2:pp2,rollout=2")
    assert [x.roles for x in g] == [("actor", "ref"), ("critic",), ("rollout",)]
    assert (g[0].tp, g[0].zero, g[1].pp) == (2, 3, 2)
    assert g[0].describe() == "actor+ref=4:tp2:zero3"


def test_lora_actor_base_as_reference_needs_no_reference_group() -> None:
    """With --reference lora-base the reference is the actor's frozen base: no group of its own,
    its forward runs on the actor's group after the old-policy one."""
    lora = _small("actor=2,critic=2,reward=1,rollout=2", 7, actor="lora", reference="lora-base")
    assert lora.rlhf is not None and "ref" not in {g.label for g in lora.rlhf.groups}
    with pytest.raises(TrainplanError, match="no ref"):
        _small("actor=2,critic=2,ref=1,reward=1,rollout=2", 8, actor="lora", reference="lora-base")
