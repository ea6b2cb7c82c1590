"""Sequence packing in RL scoring and training (trainplan.rlhf.timed_recipe) and NeMo RL's
published GRPO step times (validate/data/rlhf_nemo_rl.csv)."""

from __future__ import annotations

import itertools

import pytest

from trainplan import estimate
from trainplan.errors import TrainplanError
from trainplan.layout import Layout
from trainplan.recipe import Recipe
from trainplan.rlhf import RLHFSpec, timed_recipe

BASE = dict(
    hardware="h100-sxm",
    devices=8,
    zero=3,
    recompute="full",
    seq_len=2048,
    gen_len=1536,
    global_batch=32,
    method="grpo",
    group_size=4,
)


def _est(**kw: object):
    return estimate("llama-3.1-8b", **{**BASE, **kw})  # type: ignore[arg-type]


def test_packing_times_scoring_and_training_at_the_real_tokens_and_keeps_memory() -> None:
    padded = _est(response_len_mean=512)
    packed = _est(response_len_mean=512, sequence_packing=True)
    # the rollout is the same generation either way
    assert packed.time.rollout_decode_s == pytest.approx(padded.time.rollout_decode_s)
    assert packed.time.rollout_prefill_s == pytest.approx(padded.time.rollout_prefill_s)
    # scoring and the update run over 512 + 512 tokens a sequence, not 2,048
    assert packed.time.scoring_s < 0.7 * padded.time.scoring_s
    assert packed.rlhf.actor_step_s < 0.7 * padded.rlhf.actor_step_s
    # memory is sized for the largest micro-batch: every response at the maximum
    assert packed.rlhf.peak_bytes == pytest.approx(padded.rlhf.peak_bytes)
    assert packed.memory.peak_bytes == pytest.approx(padded.memory.peak_bytes)
    # the same sequences and tokens are counted; only the padding's compute is gone
    assert packed.rlhf.tokens_per_step == padded.rlhf.tokens_per_step == 32 * 4 * (512 + 512)
    assert packed.rlhf.model_flops_per_step < padded.rlhf.model_flops_per_step
    # the RL step is still never cheaper than its actor's own (packed) updates
    assert packed.time.step_s >= packed.rlhf.actor_step_s
    assert packed.rlhf.to_dict(packed.time)["sequence_packing"] is True


def test_packed_time_grows_with_the_mean_response_and_reaches_padded_at_the_maximum() -> None:
    times = [_est(response_len_mean=m, sequence_packing=True).time.step_s for m in (128, 512, 1024, 1536)]
    assert all(a < b for a, b in itertools.pairwise(times))
    at_max = _est(response_len_mean=1536, sequence_packing=True)
    padded = _est()
    assert at_max.time.step_s == pytest.approx(padded.time.step_s, rel=1e-9)


def test_packing_in_ppo_packs_the_critic_too() -> None:
    kw = dict(method="ppo", group_size=None, response_len_mean=256)
    padded, packed = _est(**kw), _est(**kw, sequence_packing=True)
    assert packed.time.critic_update_s < 0.6 * padded.time.critic_update_s


def test_packed_length_is_split_evenly_over_context_and_sequence_parallel_ranks() -> None:
    spec = RLHFSpec(method="grpo", prompt_len=100, gen_len=900, response_len_mean=333, sequence_packing=True)
    rec = Recipe(method="full", seq_len=1000)
    assert timed_recipe(rec, spec, Layout.for_devices(8, tp=1, pp=1, zero=1)).seq_len == 433
    sp = Layout.for_devices(8, tp=4, pp=1, zero=1, sequence_parallel=True)
    assert timed_recipe(rec, spec, sp).seq_len == 440  # a multiple of 2·cp·tp = 8
    # never longer than the padded sequence
    spec_max = RLHFSpec(
        method="grpo", prompt_len=100, gen_len=900, response_len_mean=899, sequence_packing=True
    )
    assert timed_recipe(rec, spec_max, sp).seq_len == 1000
    assert timed_recipe(rec, None, sp) is rec


def test_packing_is_refused_where_it_cannot_apply() -> None:
    with pytest.raises(TrainplanError, match="give --response-len-mean"):
        RLHFSpec(method="grpo", prompt_len=512, gen_len=512, sequence_packing=True)
    with pytest.raises(TrainplanError, match="no rollout"):
        RLHFSpec(method="dpo", sequence_packing=True)
    # a framework without a variable-length attention kernel pads
    with pytest.raises(TrainplanError, match="variable-length attention"):
        _est(response_len_mean=512, sequence_packing=True, attention="eager")
    with pytest.raises(TrainplanError, match="RLHF setting"):
        estimate("llama-3.1-8b", hardware="h100-sxm", devices=8, method="full", sequence_packing=True)


def test_hf_generate_with_packing_reads_the_mean_for_training_only() -> None:
    kw = dict(rollout_engine="trainer", zero=1)
    with pytest.raises(TrainplanError, match="static batch"):
        _est(**kw, response_len_mean=512)
    packed = _est(**kw, response_len_mean=512, sequence_packing=True)
    padded = _est(**kw)
    # the static batch still runs to the longest response
    assert packed.time.rollout_decode_s == pytest.approx(padded.time.rollout_decode_s)
    assert packed.rlhf.rollout.decode_steps == padded.rlhf.rollout.decode_steps
    assert packed.rlhf.actor_step_s < padded.rlhf.actor_step_s


def test_nemo_rl_grpo_rows_validate_within_their_bound() -> None:
    from trainplan.validate.rlhf import RLHF_DATASETS, nemo_rows, predict, validate_rlhf_dataset

    rows = nemo_rows()
    assert len(rows) == 7 and all(r.split == "validate" for r in rows)  # nothing fitted on them
    assert all(r.source.startswith("https://github.com/NVIDIA-NeMo/RL/blob/") for r in rows)
    assert all(r.fields["sequence_packing"] is True for r in rows)
    res = validate_rlhf_dataset("rlhf_nemo_rl_grpo")
    assert len(res.scored) == 7 and res.passed
    assert res.bound == RLHF_DATASETS["rlhf_nemo_rl_grpo"][0]
    # packing is what brings the published step in reach: padded to 4,096 every row is slower
    for r in rows:
        padded = dict(r.fields, sequence_packing=False, response_len_mean=None)
        assert predict(type(r)(**{**r.__dict__, "fields": padded})) > predict(r)
