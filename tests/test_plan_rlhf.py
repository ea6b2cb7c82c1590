"""``plan`` and ``compare`` for RL jobs (trainplan.planner.rlhf): placements searched, every plan
the scalar RL estimate, never a fine-tune's answer."""

from __future__ import annotations

import pytest

from trainplan import compare, estimate, plan
from trainplan.errors import TrainplanError
from trainplan.planner.rlhf import group_splits
from trainplan.rlhf import RLHFSpec

JOB = dict(method="ppo", seq_len=1024, global_batch=64)


def _same_as_estimate(p) -> None:
    """A plan's numbers are those of ``estimate`` with its settings."""
    e = p.estimate
    s = e.rlhf.spec
    kw = dict(
        hardware=e.system.accelerator.name,
        devices=e.system.num_devices,
        zero=e.layout.zero,
        micro_batch=e.recipe.micro_batch,
        recompute=e.recipe.recompute,
        offload=e.recipe.offload,
        placement=s.placement,
        rollout_tp=s.rollout_tp,
        rollout_engine_mem_fraction=s.rollout_engine_mem_fraction,
        **JOB,
    )
    if s.groups:
        kw["groups"] = ",".join(g.describe() for g in s.groups)
    direct = estimate("llama-2-7b", **kw)
    assert direct.time.step_s == pytest.approx(e.time.step_s)
    assert direct.rlhf is not None and direct.rlhf.per_device_bytes == pytest.approx(e.rlhf.per_device_bytes)


def test_plan_searches_placements_and_answers_with_the_rl_estimate() -> None:
    result = plan("llama-2-7b", hardware="h100-sxm", devices="8", **JOB)
    assert result.plans
    for p in result.plans:
        assert p.estimate.rlhf is not None and p.estimate.feasible
        full = estimate(
            "llama-2-7b", hardware="h100-sxm", devices=8, method="full", seq_len=1024, global_batch=64
        )
        assert p.estimate.time.step_s > full.time.step_s  # never the fine-tune's step
    _same_as_estimate(result.plans[0])
    times = [p.estimate.time.step_s for p in result.plans]
    assert times == sorted(times)
    d = result.to_dict()
    assert d["plans"][0]["rlhf"]["placement"] in ("colocated", "offload-between-phases", "disaggregated")


def test_fixed_placement_and_groups_are_kept() -> None:
    result = plan(
        "llama-2-7b",
        hardware="h100-sxm",
        devices="8",
        placement="disaggregated",
        groups="actor=2,critic=2,ref=1,reward=1,rollout=2",
        **JOB,
    )
    assert result.plans
    for p in result.plans:
        rl = p.estimate.rlhf
        assert rl.placement == "disaggregated"
        assert [g.devices for g in rl.groups] == [2, 2, 1, 1, 2]
    _same_as_estimate(result.plans[0])
    only = plan("llama-2-7b", hardware="h100-sxm", devices="8", placement="colocated", **JOB)
    assert {p.estimate.rlhf.placement for p in only.plans} == {"colocated"}


BIG = dict(
    method="ppo",
    seq_len=2048,
    gen_len=1024,
    global_batch=1024,
    train_batch=128,
    recompute="full",
    micro_batch=1,
    offload="optimizer",
)


def test_70b_ppo_on_16_gpus_plans_fit_and_a_one_gpu_engine_never_does() -> None:
    """Four 70B models on 16 A100-80GB: the plans found fit; with --rollout-tp 1 each engine
    needs 138 GB of weights on one device, so no placement fits and no plan is offered."""
    result = plan("llama-2-70b", hardware="a100-80gb", devices="16", top=3, **BIG)
    assert result.plans
    for p in result.plans:
        assert p.estimate.feasible and p.estimate.rlhf.rollout.engine_weights_bytes < 80e9
    none = plan("llama-2-70b", hardware="a100-80gb", devices="16", rollout_tp=1, **BIG)
    assert not none.plans and none.stats.does_not_fit > 0
    assert none.min_devices == {"a100-80gb": None}


def test_compare_gives_each_accelerator_its_rl_plan() -> None:
    result = compare("llama-2-7b", hardware="h100-sxm,a100-80gb", devices=8, **JOB)
    names = [b.hardware for b in result.per_accelerator]
    assert sorted(names) == ["a100-80gb", "h100-sxm"]
    for b in result.per_accelerator:
        assert b.plan is not None and b.plan.estimate.rlhf is not None


def test_group_splits_add_up_and_hold_every_model() -> None:
    spec = RLHFSpec(method="ppo", prompt_len=512, gen_len=512, reward_model=None)
    splits = list(group_splits(spec, 8))
    assert splits
    for groups in splits:
        assert sum(g.devices for g in groups) == 8
        assert {r for g in groups for r in g.roles} == {"actor", "critic", "ref", "rollout"}


def test_groups_without_disaggregated_are_refused_in_plan() -> None:
    with pytest.raises(TrainplanError, match="disaggregated"):
        plan("llama-2-7b", hardware="h100-sxm", devices="8", placement="colocated", groups="actor=8", **JOB)


def test_choose_ranks_rl_placements(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainplan.cli import main

    argv = ["choose", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "8", "--tokens", "1e8"]
    argv += ["--method", "ppo", "--seq-len", "1024", "--global-batch", "64", "--placement", "colocated"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "coloc dp8 z3" in out and "RL candidates" in out
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_memory_margin_is_refused_for_rl_plans() -> None:
    with pytest.raises(TrainplanError) as err:
        plan("llama-2-7b", hardware="h100-sxm", devices="8", memory_margin=0.1, **JOB)
    assert err.value.field == "memory_margin"
