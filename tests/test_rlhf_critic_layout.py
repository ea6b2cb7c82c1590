"""The critic's own ZeRO stage and offload on colocated devices (RLHFSpec.critic_zero /
critic_offload: DeepSpeed-Chat's ZeRO-2 actor next to a ZeRO-3 critic)."""

from __future__ import annotations

import pytest

from trainplan import estimate
from trainplan.errors import TrainplanError
from trainplan.rlhf import RLHFSpec

BASE = dict(
    hardware="a100-80gb",
    devices=8,
    zero=2,
    offload="optimizer",
    recompute="full",
    seq_len=1024,
    global_batch=64,
    method="ppo",
)


def _est(**kw: object):
    return estimate("llama-2-7b", **{**BASE, **kw})  # type: ignore[arg-type]


def test_a_zero3_critic_shards_its_states_and_the_actor_keeps_its_own() -> None:
    same, own = _est(), _est(critic_zero=3)
    critic_same = same.rlhf.models["critic training states"]
    critic_own = own.rlhf.models["critic training states"]
    assert critic_own < critic_same  # ZeRO-3 shards the critic's weights too
    assert own.rlhf.models["actor training states"] == same.rlhf.models["actor training states"]
    assert own.memory.peak_bytes == same.memory.peak_bytes  # the actor's training step is unchanged
    assert own.rlhf.peak_bytes < same.rlhf.peak_bytes
    # giving the job's own stage changes nothing
    assert _est(critic_zero=2).rlhf.peak_bytes == same.rlhf.peak_bytes


def test_critic_parameter_offload_moves_its_states_to_the_host() -> None:
    z3 = _est(critic_zero=3)
    off = _est(critic_zero=3, critic_offload="optimizer+params")
    assert off.rlhf.models["critic training states"] < z3.rlhf.models["critic training states"]
    assert off.rlhf.host_bytes > z3.rlhf.host_bytes
    # an RL step is never cheaper than its actor's training step alone
    assert off.time.step_s >= off.rlhf.actor_step_s
    assert off.rlhf.peak_bytes >= off.memory.peak_bytes


def test_critic_layout_is_refused_where_it_has_no_meaning() -> None:
    with pytest.raises(TrainplanError, match="no critic"):
        RLHFSpec(method="grpo", prompt_len=8, gen_len=8, critic_zero=3)
    with pytest.raises(TrainplanError, match="no critic"):
        RLHFSpec(method="dpo", critic_offload="optimizer")
    with pytest.raises(TrainplanError, match="critic=N:zeroK"):
        _est(
            critic_zero=3,
            placement="disaggregated",
            groups="actor=2,critic=2,ref=2,reward=2",
            rollout_engine="trainer",
        )
    with pytest.raises(TrainplanError, match="ZeRO stage"):
        RLHFSpec(method="ppo", prompt_len=8, gen_len=8, critic_zero=4)
    with pytest.raises(TrainplanError, match="RLHF setting"):
        estimate("llama-2-7b", hardware="a100-80gb", devices=8, method="full", critic_zero=3)


def test_deepspeed_chat_rows_run_the_critic_as_its_scripts_launch_it() -> None:
    from trainplan.validate.rlhf import rows

    dschat = [r for r in rows() if "dschat" in r.name]
    assert dschat and all(r.fields["critic_zero"] == 3 for r in dschat)
    assert all(r.fields["critic_offload"] == "optimizer+params" for r in dschat)
    assert all(r.fields["zero"] == 2 for r in dschat)
