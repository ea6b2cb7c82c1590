"""RLHF and preference training (trainplan.rlhf): the 7B PPO / DPO / full comparison, the
rollout's roofline regimes, and the properties an RL step must keep."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainplan import estimate
from trainplan.errors import TrainplanError
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.recipe import Recipe
from trainplan.rlhf import RLHFSpec, kv_bytes_per_token, rollout

BASE = dict(hardware="h100-sxm", devices=8, zero=3, recompute="full", seq_len=1024, global_batch=64)


def _est(method: str, **kw: object):
    return estimate("llama-2-7b", method=method, **{**BASE, **kw})


def test_7b_ppo_dpo_full_on_the_same_devices() -> None:
    full, dpo, ppo = _est("full"), _est("dpo"), _est("ppo")
    assert full.rlhf is None and dpo.rlhf is not None and ppo.rlhf is not None
    # DPO doubles the sequences (chosen + rejected) the policy trains on, and adds a frozen reference.
    assert dpo.rlhf.sequences == 2 * 64
    assert dpo.memory.activations_bytes == pytest.approx(2 * full.memory.activations_bytes, rel=0.01)
    assert dpo.memory.model_states_bytes == full.memory.model_states_bytes  # states do not double
    ref = dpo.rlhf.models["reference weights (frozen)"]
    # The frozen reference is bf16 (2 B/param) sharded like the actor; under ZeRO-3 the actor's
    # sharded parameter is its FP32 master (4 B/param).
    assert ref == pytest.approx(full.memory.weights_bytes / 2)
    # PPO: a second trained model (critic) and two frozen ones (reference, reward), plus an engine.
    names = set(ppo.rlhf.models)
    assert {"actor training states", "critic training states", "reference weights (frozen)"} <= names
    assert {"reward model weights (frozen)", "rollout engine weights", "rollout KV cache"} <= names
    assert ppo.rlhf.models["critic training states"] == ppo.rlhf.models["actor training states"]
    assert full.memory.per_device_bytes < dpo.rlhf.per_device_bytes < ppo.rlhf.per_device_bytes
    assert full.time.step_s < dpo.time.step_s < ppo.time.step_s
    # No silent full answer: the stable keys carry the RL job's numbers.
    d = ppo.to_dict()
    assert d["memory"]["per_device_bytes"] == ppo.rlhf.per_device_bytes
    assert d["memory"]["actor_training_bytes"] == ppo.memory.per_device_bytes
    assert d["time"]["step_s"] == ppo.time.step_s and d["rlhf"]["split_s"]["rollout"] > 0


def test_lora_actor_sharing_its_base_with_the_reference_saves() -> None:
    full = _est("ppo")
    lora = _est("ppo", actor="lora", reference="lora-base")
    assert "reference weights (frozen)" not in lora.rlhf.models
    assert lora.rlhf.models["actor training states"] < full.rlhf.models["actor training states"] / 4
    assert lora.rlhf.per_device_bytes < full.rlhf.per_device_bytes


def test_offloading_between_phases_saves_memory_and_costs_the_reloads() -> None:
    resident = _est("ppo")
    offload = _est("ppo", placement="offload-between-phases")
    assert offload.rlhf.per_device_bytes < resident.rlhf.per_device_bytes
    assert offload.rlhf.host_bytes > 0
    # what waits in host memory is checked against the server's (memory.host_fits)
    assert offload.to_dict()["memory"]["host_fits"] is offload.rlhf.host_fits is True
    big = estimate("llama-2-70b", method="ppo", **{**BASE, "placement": "offload-between-phases"})
    assert big.rlhf.host_fits is False and any("host memory" in r for r in big.reasons())
    # The time is the resident step's plus the reloads: every phase's models (not the KV cache)
    # back over the host link once per step.
    models = offload.rlhf.models
    reloaded = sum(v for n, v in models.items() if n != "rollout KV cache")
    link = offload.system.accelerator.host_link
    assert link is not None and resident.time.phase_reload_s == 0
    assert offload.time.phase_reload_s == pytest.approx(reloaded / link.bandwidth_bytes_per_s)
    assert offload.time.step_s == pytest.approx(resident.time.step_s + offload.time.phase_reload_s)
    assert offload.rlhf.split_s(offload.time)["reload"] == offload.time.phase_reload_s


def test_removing_the_reference_never_increases_memory() -> None:
    with_ref = _est("grpo", group_size=4)
    without = _est("grpo", group_size=4, reference="none")
    assert without.rlhf.per_device_bytes < with_ref.rlhf.per_device_bytes
    assert without.time.step_s < with_ref.time.step_s


@settings(max_examples=12, deadline=None)
@given(
    method=st.sampled_from(["ppo", "grpo", "dpo", "rm"]),
    devices=st.sampled_from([4, 8]),
    micro=st.sampled_from([1, 2]),
    offload=st.booleans(),
)
def test_an_rl_step_is_never_cheaper_than_its_actor_alone(
    method: str, devices: int, micro: int, offload: bool
) -> None:
    kw: dict[str, object] = dict(BASE, devices=devices, micro_batch=micro, global_batch=16)
    if offload and method != "rm":
        kw["placement"] = "offload-between-phases"
    est = estimate("llama-3.2-1b", method=method, **kw)
    assert est.rlhf is not None
    assert est.rlhf.per_device_bytes >= est.memory.per_device_bytes
    assert est.time.step_s >= est.rlhf.actor_step_s


def _rollout(
    devices: int, *, model: str = "llama-2-7b", hw: str = "h100-sxm", length: int = 512, **kw: object
):
    spec = RLHFSpec(method="ppo", reward_model=None, prompt_len=length, gen_len=length, **kw)  # type: ignore[arg-type]
    system = System(accelerator=get_accelerator(hw), num_devices=devices)
    layout = Layout.for_devices(devices, tp=1, pp=1, zero=0) if spec.rollout_engine == "trainer" else None
    return rollout(system, load_model(model), Recipe(method="full"), spec, 256, layout)


def test_more_rollout_devices_never_slow_generation() -> None:
    times = [(_rollout(n).prefill_s + _rollout(n).decode_s) for n in (1, 2, 4, 8, 16)]
    assert all(a >= b for a, b in itertools.pairwise(times))
    assert times[0] > times[-1]


def test_decode_is_bytes_over_bandwidth_and_prefill_is_flops() -> None:
    r = _rollout(8, rollout_concurrency=4)
    assert r.decode_bound == "memory"
    model = load_model("llama-2-7b")
    kv_tok = kv_bytes_per_token(model, Recipe(method="full"), 1)
    acc = get_accelerator("h100-sxm")
    from trainplan.efficiency import get_efficiency

    bw = acc.memory_bandwidth_bytes_per_s * get_efficiency(acc.name).memory_bandwidth_efficiency
    expected = (r.engine_weights_bytes + 4 * kv_tok * (512 + 256)) / bw
    assert r.decode_step_s == pytest.approx(expected)
    # Double the bandwidth: decode halves; double the FLOPs peak: prefill halves, decode does not move.
    fast_mem = dataclasses.replace(acc, memory_bandwidth_bytes_per_s=2 * acc.memory_bandwidth_bytes_per_s)
    peaks = {k: 2 * v for k, v in acc.peak_flops.items()}
    fast_flops = dataclasses.replace(acc, peak_flops=peaks)
    spec = RLHFSpec(method="ppo", prompt_len=512, gen_len=512, rollout_concurrency=32)
    sys = lambda a: System(accelerator=a, num_devices=8)  # noqa: E731
    base = rollout(sys(acc), model, Recipe(method="full"), spec, 256)
    m2 = rollout(sys(fast_mem), model, Recipe(method="full"), spec, 256)
    f2 = rollout(sys(fast_flops), model, Recipe(method="full"), spec, 256)
    assert m2.decode_s == pytest.approx(base.decode_s / 2)
    assert f2.decode_s == pytest.approx(base.decode_s)
    assert f2.prefill_s == pytest.approx(base.prefill_s / 2)


def test_little_kv_budget_after_weights_generates_slower() -> None:
    """Llama-2-70B on TP2 engines of A100-80GB, 1024 + 1024 tokens (the OpenRLHF 70B-on-16-GPU
    placement): 69 GB of weights per rank leave a few GB of KV budget, so fewer sequences run at
    once and the same rollout takes more waves."""
    kw: dict[str, object] = dict(model="llama-2-70b", hw="a100-80gb", rollout_tp=2, length=1024)
    tight = _rollout(16, rollout_engine_mem_fraction=0.85, **kw)
    roomy = _rollout(16, rollout_engine_mem_fraction=0.95, **kw)
    assert tight.kv_budget_bytes < 5e9 and tight.engine_weights_bytes > 68e9
    assert tight.concurrent_sequences < roomy.concurrent_sequences == roomy.sequences_per_engine
    assert tight.waves > roomy.waves == 1
    assert tight.prefill_s + tight.decode_s > 1.5 * (roomy.prefill_s + roomy.decode_s)


def test_rlhf_flags_are_refused_with_other_methods_and_groupless_disaggregated_is_refused() -> None:
    with pytest.raises(TrainplanError, match="RLHF setting"):
        _est("full", gen_len=256)
    with pytest.raises(TrainplanError, match="no rollout"):
        _est("dpo", group_size=4)
    with pytest.raises(TrainplanError, match="needs its device groups"):
        _est("ppo", placement="disaggregated")
    with pytest.raises(TrainplanError, match="seq-len 768"):
        _est("ppo", prompt_len=256, gen_len=512)
    with pytest.raises(TrainplanError, match="reference"):
        _est("ppo", reference="none")


def test_every_rlhf_flag_changes_the_answer() -> None:
    base = _est("ppo").to_dict()
    for kw in (
        dict(reward_model="llama-3.2-1b"),
        dict(critic_model="llama-3.2-1b"),
        dict(gen_len=256),
        dict(rollout_tp=2),
        dict(rollout_engine_mem_fraction=0.5),
        dict(rollout_concurrency=2),
        dict(rollout_engine="hybrid"),
        dict(rollout_engine="trainer"),
        dict(actor="lora"),
    ):
        assert _est("ppo", **kw).to_dict() != base, kw
    assert _est("grpo", group_size=2).to_dict() != _est("grpo").to_dict()
    assert _est("dpo", reference="precomputed").to_dict() != _est("dpo").to_dict()


def test_export_refuses_rlhf_methods() -> None:
    from trainplan.export import export_plan

    est = _est("dpo")
    with pytest.raises(TrainplanError, match="TRL, OpenRLHF or verl"):
        export_plan("torchtitan", est.system, est.model, est.recipe, est.layout)


def test_web_api_gives_the_rl_answer_with_its_terms() -> None:
    from trainplan.web.api import estimate as web_estimate

    body = {"model": "llama-2-7b", "method": "ppo", "reference": "model", **BASE}
    got = web_estimate(body)
    terms = got.pop("terms")
    assert got == _est("ppo", reference="model").to_dict()
    assert sum(t["bytes"] for t in terms["memory"]) == pytest.approx(got["memory"]["per_device_bytes"])
    assert sum(t["s"] for t in terms["time"]) == pytest.approx(got["time"]["step_s"])
    assert {t["group"] for t in terms["time"] if t["s"] > 0} >= {"rollout", "scoring", "critic", "sync"}


def test_train_batch_splits_the_step_into_updates() -> None:
    one = _est("ppo")
    four = _est("ppo", train_batch=16)
    assert four.rlhf.updates == 4 and one.rlhf.updates == 1
    assert four.rlhf.models["actor training states"] == one.rlhf.models["actor training states"]
    assert four.memory.activations_bytes <= one.memory.activations_bytes
    assert four.time.optimizer_s == pytest.approx(4 * one.time.optimizer_s)
    with pytest.raises(TrainplanError, match="train-batch"):
        _est("ppo", train_batch=48)


def test_generating_on_zero3_trainer_weights_is_bound_by_the_gathers() -> None:
    """HF generate on a ZeRO-3 module all-gathers every layer at each decode step (OpenRLHF
    without vLLM, DeepSpeed-Chat without the Hybrid Engine): much slower than a vLLM copy."""

    def est(**kw: object):
        return estimate("llama-2-13b", method="ppo", rollout_concurrency=8, **{**BASE, **kw})

    trainer = est(rollout_engine="trainer")
    vllm = est(rollout_engine_mem_fraction=0.6)  # room for the 26 GB copy and its KV cache
    assert trainer.rlhf.rollout.decode_bound == "ZeRO-3 gather"
    assert trainer.time.rollout_decode_s > 3 * vllm.time.rollout_decode_s
    assert "rollout engine weights" not in trainer.rlhf.models and trainer.time.weight_sync_s == 0
    # Without ZeRO-3 nothing is gathered: eager HF generate is then held by its kernel launches.
    no_zero = est(zero=1, rollout_engine="trainer")
    assert no_zero.rlhf.rollout.decode_bound == "kernel launch"
    assert no_zero.time.rollout_decode_s < trainer.time.rollout_decode_s


def test_rlhf_validation_rows_are_predicted_and_the_fit_claim_reproduced() -> None:
    from trainplan.validate.rlhf import RLHF_DATASETS, rows, validate_rlhf_dataset

    all_rows = rows()
    assert {r.dataset for r in all_rows} | {"rlhf_deepspeed_chat", "rlhf_nemo_rl_grpo"} == set(RLHF_DATASETS)
    assert all(r.source.startswith("https://") for r in all_rows)
    assert [r.name for r in all_rows if r.split != "validate"] == ["openrlhf-bench-7b-openrlhf-train"]
    timing = validate_rlhf_dataset("rlhf_openrlhf_colocated")
    assert len(timing.scored) == 8 and timing.passed  # one row calibrates the deepspeed stack
    fits = validate_rlhf_dataset("rlhf_fit_claims")
    # torchtune's 4 × 7B on one A100, and OpenRLHF's 70B on 16 A100 in its own device groups.
    assert [r.name for r in fits.scored] == [
        "torchtune-ppo-mistral7b-1xa100-fits",
        "openrlhf-70b-16xa100-config",
    ]
    assert [r.error for r in fits.scored] == [0.0, 0.0]
    assert not [r for r in fits.rows if r.skipped]
    groups = validate_rlhf_dataset("rlhf_openrlhf_disaggregated")
    assert len(groups.scored) == 15 and groups.passed


def test_cli_shows_memory_per_model_and_phase_and_the_step_split(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainplan.cli import main

    argv = ["estimate", "llama-2-7b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    argv += ["--seq-len", "1024", "--global-batch", "64", "--method", "ppo", "--recompute", "full"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for text in (
        "rollout phase:",
        "scoring phase:",
        "training phase:",
        "critic training states",
        "rollout KV cache",
    ):
        assert text in out
    assert "RL step split: rollout" in out and "<- peak" in out
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["rlhf"]["split_s"]) == {"rollout", "scoring", "training", "sync", "reload"}
    assert d["rlhf"]["per_device_bytes"] == d["memory"]["per_device_bytes"]


@settings(max_examples=10, deadline=None)
@given(
    placement=st.sampled_from(["colocated", "offload-between-phases"]),
    engine=st.sampled_from(["vllm", "hybrid", "trainer"]),
    reward=st.sampled_from(["none", "llama-3.2-1b"]),
)
def test_no_reference_never_needs_more_memory_or_time(placement: str, engine: str, reward: str) -> None:
    kw: dict[str, object] = dict(
        BASE, global_batch=16, group_size=2, placement=placement, rollout_engine=engine, reward_model=reward
    )
    with_ref = estimate("llama-3.2-1b", method="grpo", **kw)
    without = estimate("llama-3.2-1b", method="grpo", reference="none", **kw)
    assert without.rlhf.per_device_bytes <= with_ref.rlhf.per_device_bytes
    assert without.time.step_s <= with_ref.time.step_s


def test_tokens_per_s_counts_every_update_of_the_step() -> None:
    """With --train-batch the step holds several updates; tokens/s is the step's sequences over
    the step's time, in the throughput line as in the RL split."""
    e = _est("ppo", train_batch=16)
    assert e.rlhf is not None and e.rlhf.updates == 4
    d = e.to_dict()
    assert d["throughput"]["tokens_per_s"] == pytest.approx(d["rlhf"]["tokens_per_s"])
    assert e.throughput.tokens_per_s == pytest.approx(64 * 1024 / e.time.step_s)


def test_deepspeed_kappa_is_reproducible_from_its_named_rows() -> None:
    """κ of the deepspeed stack (OpenRLHF, DeepSpeed-Chat) is fitted on the RL rows named in
    calibrate.RLHF_CALIBRATION_SETS (split ``calibrate``) and re-fits to the stored value; the
    other OpenRLHF training rows judge it: their MAPE is below the pytorch κ's."""
    from trainplan.timing import calibrated_kappa, kappa_override
    from trainplan.validate import calibrate
    from trainplan.validate.rlhf import predict, rows

    fit = calibrate.fit_generation("ampere", "deepspeed")
    assert fit.rows == ("openrlhf-bench-7b-openrlhf-train",)
    assert calibrated_kappa("a100-80gb", "deepspeed") == pytest.approx(fit.kappa, abs=2e-3)
    assert calibrated_kappa("a100-80gb", "deepspeed") < calibrated_kappa("a100-80gb", "pytorch")
    judged = [r for r in rows() if r.metric == "train_s" and r.split == "validate"]
    assert len(judged) == 7

    def mape() -> float:
        return sum(abs(predict(r) / r.published - 1) for r in judged) / len(judged)

    with kappa_override("deepspeed", "ampere", calibrated_kappa("a100-80gb", "pytorch") or 1.0):
        as_pytorch = mape()
    assert mape() < as_pytorch - 0.10


def test_eager_decode_floor_reproduces_its_calibration_measurement() -> None:
    """gpt-fast's starting point (PyTorch blog "Accelerating Generative AI with PyTorch II"):
    Llama-2-7B, batch 1, A100-80GB, 25.5 tokens/s, CPU-overhead bound. HF generate on the
    training module (the trainer engine) decodes at that floor; a CUDA-graph engine (vllm) at its
    roofline, several times faster."""
    from trainplan.rlhf import EAGER_DECODE_LAYER_S

    eager = _rollout(1, hw="a100-80gb", rollout_engine="trainer", rollout_concurrency=1)
    graph = _rollout(1, hw="a100-80gb", rollout_concurrency=1)
    assert eager.decode_bound == "kernel launch" and graph.decode_bound == "memory"
    assert 1.0 / eager.decode_step_s == pytest.approx(25.5, rel=1e-6)
    assert eager.decode_step_s == pytest.approx(32 * EAGER_DECODE_LAYER_S)
    assert graph.decode_step_s < eager.decode_step_s / 3
    # The floor scales with the layers launched: a 40-layer 13B model's floor is 40/32 of it.
    big = _rollout(1, model="llama-2-13b", hw="a100-80gb", rollout_engine="trainer", rollout_concurrency=1)
    assert big.decode_step_s == pytest.approx(40 * EAGER_DECODE_LAYER_S)


def test_tensor_parallel_decode_pays_two_all_reduces_per_layer() -> None:
    one = _rollout(8, model="llama-2-13b", rollout_concurrency=8)
    two = _rollout(8, model="llama-2-13b", rollout_concurrency=8, rollout_tp=2)
    assert one.tp_allreduce_s == 0 and two.tp_allreduce_s > 0
    # The all-reduces add to the step's roofline (each waits for its layer).
    assert two.decode_bound == "memory"
    memory_only = two.decode_step_s - two.tp_allreduce_s
    assert memory_only < one.decode_step_s  # half the weights per rank
    assert two.decode_step_s == pytest.approx(memory_only + two.tp_allreduce_s)


def test_response_length_mean_shortens_continuous_batching_only() -> None:
    full = _rollout(2, rollout_concurrency=16)
    assert full.decode_steps == full.waves * 512
    same = _rollout(2, rollout_concurrency=16, response_len_mean=512)
    assert same.decode_s == pytest.approx(full.decode_s)
    short = _rollout(2, rollout_concurrency=16, response_len_mean=128)
    # the slots run their sequences back to back at the mean; the last started run to the maximum
    assert short.decode_steps == (short.waves - 1) * 128 + 512
    assert short.decode_steps >= 512
    assert short.decode_s < full.decode_s
    # shorter responses never slow the rollout
    times = [_rollout(2, rollout_concurrency=16, response_len_mean=m).decode_s for m in (64, 128, 256, 512)]
    assert all(a <= b for a, b in itertools.pairwise(times))
    # a static batch (HF generate) runs until its longest response: refused rather than ignored
    with pytest.raises(TrainplanError, match="static batch"):
        RLHFSpec(method="ppo", prompt_len=512, gen_len=512, rollout_engine="trainer", response_len_mean=128)
    with pytest.raises(TrainplanError, match="exceeds the maximum"):
        RLHFSpec(method="ppo", prompt_len=512, gen_len=512, response_len_mean=600)
    with pytest.raises(TrainplanError, match="no rollout"):
        RLHFSpec(method="dpo", response_len_mean=100)


def test_response_length_mean_through_the_estimate() -> None:
    est = _est("grpo", group_size=4, gen_len=512, response_len_mean=128)
    base = _est("grpo", group_size=4, gen_len=512)
    assert est.rlhf.to_dict(est.time)["response_len_mean"] == 128
    assert est.time.rollout_decode_s < base.time.rollout_decode_s
    assert est.rlhf.model_flops_per_step < base.rlhf.model_flops_per_step
    assert est.time.step_s >= est.rlhf.actor_step_s


def test_deepspeed_chat_step3_rows_run_the_opt_350m_critic() -> None:
    """DeepSpeed-Chat Table 1: every A100 row with a preset actor is scored (OPT-350M as reward
    model and critic), each at the largest per-device batch that fits; rows on accelerators or
    models the catalog lacks are skipped with the reason."""
    from trainplan.validate.rlhf import epoch_rows, predict_epoch, validate_rlhf_dataset

    res = validate_rlhf_dataset("rlhf_deepspeed_chat")
    assert all(r.split == "validate" for r in res.rows)  # nothing here is fitted
    skipped = {r.name: r.skipped for r in res.rows if r.skipped}
    assert all(
        "unknown accelerator" in why or "unknown model" in why or "fits" in why for why in skipped.values()
    )
    scored = {r.name for r in res.scored}
    assert {"dschat-t1-a100-80gb-x8-opt-13b", "dschat-t1-a100-80gb-x64-opt-66b"} <= scored
    assert len(scored) >= 15 and res.passed
    # The V100 and A6000 rows are scored (validation rows, never fitted), in the recipe they ran:
    # fp16 (Volta has no BF16) and eager attention (FlashAttention does not run on Volta).
    assert {
        "dschat-t1-v100-32gb-x1-opt-1.3b",
        "dschat-t1-a6000-48gb-x1-opt-1.3b",
        "dschat-t1-a6000-48gb-x1-opt-6.7b",
    } <= scored
    assert all(r.fields["precision"] == "fp16" and r.fields["attention"] == "eager" for r in epoch_rows())
    # a larger cap never makes the epoch slower: the search only adds larger batches that fit
    row = next(r for r in epoch_rows() if r.name == "dschat-t1-a100-80gb-x8-opt-1.3b")
    seconds, per_device = predict_epoch(row)
    assert per_device >= 1 and seconds > 0
    import dataclasses as dc

    small = dc.replace(row, cap_prompts=8 * per_device // 2)
    assert predict_epoch(small)[1] == per_device // 2
    assert predict_epoch(small)[0] >= seconds


def test_eager_inference_kernels_have_their_own_floor() -> None:
    """DeepSpeed-Chat's log: OPT-1.3B, batch 4, Hybrid Engine, 9.8 ms per decode step: the fused
    kernels' floor (--rollout-eager) is below HF generate's and above a CUDA graph's (none)."""
    from trainplan.rlhf import EAGER_DECODE_LAYER_S, FUSED_EAGER_DECODE_LAYER_S

    assert 0 < FUSED_EAGER_DECODE_LAYER_S < EAGER_DECODE_LAYER_S
    kw: dict[str, object] = dict(
        model="opt-1.3b", hw="a100-80gb", rollout_engine="hybrid", rollout_concurrency=4
    )
    eager = _rollout(1, rollout_eager=True, **kw)  # type: ignore[arg-type]
    graph = _rollout(1, **kw)  # type: ignore[arg-type]
    assert eager.decode_bound == "kernel launch"
    assert eager.decode_step_s == pytest.approx(24 * FUSED_EAGER_DECODE_LAYER_S)
    assert graph.decode_step_s < eager.decode_step_s
    with pytest.raises(TrainplanError, match="no rollout"):
        RLHFSpec(method="dpo", rollout_eager=True)
    with pytest.raises(TrainplanError, match="always launches eagerly"):
        RLHFSpec(method="ppo", prompt_len=8, gen_len=8, rollout_engine="trainer", rollout_eager=True)
