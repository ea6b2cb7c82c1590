"""Expert all-to-all overlap (``Layout.ep_comm_overlap``, Megatron-Core
``overlap_moe_expert_parallel_comm``): the unpaired share by hand, the exposed term, the extra
chunk in flight, where it applies, and the plan and export that carry it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from trainplan.errors import LayoutError, TrainplanError
from trainplan.export import export_plan
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout, LayoutOptions
from trainplan.memory import held_microbatches
from trainplan.models import load_model
from trainplan.planner import SearchSpace, plan
from trainplan.predict import estimate
from trainplan.recipe import Recipe
from trainplan.timing import StepInputs, ep_overlap_unpaired_fraction, exposed_ep_s

QWEN = load_model("qwen3-30b-a3b")


@dataclass(frozen=True)
class _Coll:
    """A collective as the step terms read it (timing.TimedCollective)."""

    group: str
    kind: str
    phase: str | None
    overlappable_with: str
    calls: float
    time_s: float


SYSTEM = System(accelerator=get_accelerator("h100-sxm"), num_devices=16)


def test_unpaired_share_by_hand() -> None:
    # no pipeline: the first forward and the last backward run alone
    assert ep_overlap_unpaired_fraction(1, 1, 8) == pytest.approx(1 / 8)
    # interleaved p = 4, v = 4: warmup 2·3 + 3·4 + 1 = 19 chunks of 64·4
    assert ep_overlap_unpaired_fraction(4, 4, 64) == pytest.approx(19 / 256)
    # more warmup than chunks: everything unpaired
    assert ep_overlap_unpaired_fraction(8, 2, 2) == 1.0


def _inputs(ep_s: float, compute_s: float, u: float, on: bool) -> StepInputs:
    coll = _Coll(
        group="ep", kind="all_to_all", phase="forward", overlappable_with="none", calls=1.0, time_s=ep_s
    )
    return StepInputs(
        micro_batches=1, t_f=compute_s / 3, t_b=2 * compute_s / 3, t_r=0.0, gemm_f=0.0, gemm_b=0.0, gemm_r=0.0,
        attn_f=0.0, attn_b=0.0, collectives=(coll,), pp=1, bubble_divisor=1.0, zero=0, shard=1,
        trainable_params_on_device=0.0, params_on_device=0.0, update_bytes_per_param=0.0, hbm_bytes_per_s=1.0,
        host_bytes_per_s=0.0, offload=0, weight_refetches=2, grad_accum_bytes=0.0,
        ep_comm_overlap=on, ep_unpaired=u,
    )  # fmt: skip


def test_exposed_share() -> None:
    assert exposed_ep_s(_inputs(2.0, 10.0, 0.25, False)) == 2.0
    assert exposed_ep_s(_inputs(2.0, 10.0, 0.25, True)) == pytest.approx(0.5)  # the paired part hides
    # the paired all-to-alls exceed the compute they hide behind: the excess shows
    assert exposed_ep_s(_inputs(12.0, 10.0, 0.25, True)) == pytest.approx(0.25 * 12 + 0.75 * 2)


def test_estimate_with_overlap() -> None:
    recipe = Recipe(seq_len=4096, global_batch=128, micro_batch=1)
    base = Layout(dp=16, ep=8, zero=1)
    off = estimate(SYSTEM, QWEN, recipe, base)
    on = estimate(SYSTEM, QWEN, recipe, replace(base, ep_comm_overlap=True))
    assert off.time.exposed_ep_s > 0
    assert on.time.exposed_ep_s < off.time.exposed_ep_s
    assert on.to_dict()["layout"]["ep_comm_overlap"] is True  # type: ignore[index]
    # one more micro-batch in flight without a pipeline, one more chunk with the interleaved one
    assert held_microbatches(replace(base, ep_comm_overlap=True), 0) == 2.0
    inter = Layout(dp=4, pp=4, ep=4, pp_schedule="interleaved", virtual_stages=2, ep_comm_overlap=True)
    assert held_microbatches(inter, 0) == pytest.approx(
        held_microbatches(replace(inter, ep_comm_overlap=False), 0) + 0.5
    )


def test_where_it_applies() -> None:
    with pytest.raises(LayoutError, match="expert parallelism"):
        Layout(dp=8, ep_comm_overlap=True)
    with pytest.raises(LayoutError, match="interleaved"):
        Layout(dp=8, pp=2, ep=8, ep_comm_overlap=True)
    with pytest.raises(LayoutError, match="full recompute"):
        estimate(
            SYSTEM,
            QWEN,
            Recipe(global_batch=128, recompute="full"),
            Layout(dp=16, ep=8, ep_comm_overlap=True),
        )
    opts = LayoutOptions(ep_comm_overlap=True)
    assert opts.for_candidate(sequence_parallel=False, pp=1, zero=1, ep=8)["ep_comm_overlap"] is True
    assert (
        opts.for_candidate(sequence_parallel=False, pp=1, zero=1, ep=8, recompute="full")["ep_comm_overlap"]
        is False
    )
    assert opts.for_candidate(sequence_parallel=False, pp=2, zero=1, ep=8)["ep_comm_overlap"] is False


def test_plan_applies_it_and_the_plans_re_estimate_equal() -> None:
    space = SearchSpace(device_counts=(16,), layout_options=LayoutOptions(ep_comm_overlap=True))
    result = plan(QWEN, Recipe(global_batch=128, tokens=1e9), [get_accelerator("h100-sxm")], space=space)
    assert any(p.estimate.layout.ep_comm_overlap for p in result.plans)
    for p in result.plans:
        e = p.estimate
        again = estimate(e.system, e.model, e.recipe, e.layout)
        assert again.time.step_s == pytest.approx(e.time.step_s, rel=1e-9)
        if e.recipe.recompute == "full" or e.layout.ep == 1:
            assert not e.layout.ep_comm_overlap


def test_export() -> None:
    layout = Layout(dp=16, ep=8, zero=1, ep_comm_overlap=True)
    text = export_plan("megatron", SYSTEM, QWEN, Recipe(global_batch=128), layout).text
    assert "--overlap-moe-expert-parallel-comm" in text and "--delay-wgrad-compute" in text
    with pytest.raises(TrainplanError, match="all-to-all overlap"):
        export_plan("torchtitan", SYSTEM, QWEN, Recipe(global_batch=128, stack="pytorch"), layout)
