"""Expert tensor parallelism (``Layout.etp``): Megatron-Core's parallel folding, whole experts per
rank with the expert-parallel group carved from the tp·cp·dp ranks of a pipeline stage."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trainplan.cli import main
from trainplan.comm import group_placement
from trainplan.errors import LayoutError, TrainplanError
from trainplan.export import export_plan
from trainplan.flops import device_flops, layer_gemms
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.memory import layer_activations, memory_breakdown
from trainplan.models import load_model
from trainplan.models.params import count_params
from trainplan.predict import estimate
from trainplan.recipe import Recipe
from trainplan.sharding import device_params

QWEN = load_model("qwen3-30b-a3b")  # 128 experts, no shared expert
CLI = ("estimate", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--devices", "16", "--tp", "2")
RECIPE = Recipe(method="pretrain", seq_len=4096, micro_batch=1, global_batch=64, precision="bf16")
# 16 ranks per stage: tp 2 · dp 8; ep 16 only folds (ep·etp = 16 divides tp·dp = 16)
FOLDED = Layout(dp=8, tp=2, ep=16, etp=1, sequence_parallel=True, zero=1)
DEFAULT = Layout(dp=8, tp=2, ep=8, sequence_parallel=True, zero=1)


def test_the_default_is_tp_and_folding_needs_the_tp_ranks() -> None:
    assert DEFAULT.expert_tp == 2 and DEFAULT.expert_dp == 1
    assert FOLDED.expert_tp == 1 and FOLDED.expert_dp == 1
    with pytest.raises(LayoutError, match="does not divide dp·cp"):
        Layout(dp=8, tp=2, ep=16, sequence_parallel=True)  # etp = tp: ep must divide dp·cp
    with pytest.raises(LayoutError, match="tp·cp·dp"):
        Layout(dp=8, tp=2, ep=32, etp=1, sequence_parallel=True)
    with pytest.raises(LayoutError, match="--sequence-parallel"):
        Layout(dp=8, tp=2, ep=16, etp=1)
    with pytest.raises(LayoutError, match=r"tp \(the default"):
        Layout(dp=8, tp=4, ep=8, etp=2, sequence_parallel=True)
    with pytest.raises(LayoutError, match="dense"):
        Layout(dp=8, tp=2, etp=1, sequence_parallel=True).check_model(load_model("llama-3.1-8b"))
    assert "etp=1" in FOLDED.describe() and "etp" not in DEFAULT.describe()


def test_whole_experts_per_rank_and_the_ep_ranks_hold_every_expert() -> None:
    dev = device_params(QWEN, FOLDED, 0)
    moe = QWEN.moe
    assert moe is not None
    per_expert = (3 * QWEN.hidden_size * moe.expert_ffn_hidden) * QWEN.num_moe_layers
    assert dev.expert_linear == per_expert * moe.num_experts // 16  # 8 whole experts, no tp split
    assert dev.expert_linear * 16 == count_params(QWEN).moe_experts
    # the default splits each of 16 experts over tp = 2: the same count per device
    assert device_params(QWEN, DEFAULT, 0).expert_linear == per_expert * 16 // 2


def test_the_flops_per_device_are_those_of_the_default_split() -> None:
    """Balanced routing: 1/tp of the tokens at the full expert width, or all the tp group's
    tokens at 1/tp of it; the same FLOPs, other GEMM shapes."""
    folded, default = (
        device_flops(QWEN, RECIPE, lay)[0] for lay in (FOLDED, replace(FOLDED, etp=None, ep=8))
    )
    assert folded.forward.gemm_flops == pytest.approx(default.forward.gemm_flops, rel=1e-12)
    g1 = {g.name: g for g in layer_gemms(QWEN, 0, 4096.0, tp=2, ep=16, etp=1)}
    g2 = {g.name: g for g in layer_gemms(QWEN, 0, 4096.0, tp=2, ep=8)}
    assert g1["expert_up"].n == 2 * g2["expert_up"].n and g1["expert_up"].m == g2["expert_up"].m
    assert sum(g.flops for g in g1.values()) == pytest.approx(sum(g.flops for g in g2.values()), rel=1e-12)


def test_the_expert_inputs_are_the_rank_s_own_shard() -> None:
    folded = layer_activations(QWEN, RECIPE, FOLDED, 0).terms
    default = layer_activations(QWEN, RECIPE, DEFAULT, 0).terms
    assert folded["expert_inputs"] * 2 == pytest.approx(default["expert_inputs"])
    assert (
        memory_breakdown(QWEN, RECIPE, FOLDED).activations_bytes
        < memory_breakdown(QWEN, RECIPE, DEFAULT).activations_bytes
    )


def _collectives(layout: Layout, recipe: Recipe = RECIPE, model: str = "qwen3-30b-a3b") -> list[Any]:
    spec = load_model(model)
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=layout.num_devices)
    return list(estimate(system, spec, recipe, layout).time.collectives)


def _calls(collectives: list[Any], group: str) -> float:
    return sum(c.calls for c in collectives if c.group == group)


def test_megatron_s_moe_layers_have_no_dense_tp_region_and_split_experts_gather_routed_tokens() -> None:
    """Megatron-Core's MoE layer: the experts are fed by the dispatcher, which all-gathers the
    routed tokens over the expert-TP group (and reduce-scatters them back) when experts are split
    over tp; folded, it gathers nothing. Without shared experts no dense MLP region is left."""
    default = _collectives(replace(FOLDED, etp=None, ep=8))
    folded = _collectives(FOLDED)
    assert _calls(folded, "tp") == _calls(default, "tp")  # the attention region alone
    assert _calls(folded, "etp") == 0
    gathers = [c for c in default if c.group == "etp"]
    assert gathers and {c.buffer_bytes for c in gathers} == {4096 * 8 * 2048 * 2.0}  # T·K·h·e
    assert _calls(default, "etp") == 2 * 2 * 48 * 8  # AG + RS, forward + backward, 48 layers, 8 mb
    # PyTorch's MoE layers (no dispatcher gathers): costed as a dense MLP region of b·s·h
    titan = _collectives(replace(FOLDED, etp=None, ep=8), replace(RECIPE, stack="pytorch"))
    assert _calls(titan, "etp") == 0 and _calls(titan, "tp") == 2 * _calls(default, "tp")
    # shared experts keep their tensor-parallel region, folded or not
    shared = load_model("qwen1.5-moe-a2.7b")
    assert shared.moe is not None and shared.moe.num_shared_experts
    lay = Layout(dp=4, tp=2, ep=4, etp=1, sequence_parallel=True, zero=1)
    with_region = _collectives(lay, replace(RECIPE, global_batch=32), "qwen1.5-moe-a2.7b")
    dense = _collectives(
        Layout(dp=4, tp=2, sequence_parallel=True, zero=1), replace(RECIPE, global_batch=32), "llama-3.1-8b"
    )
    assert _calls(with_region, "tp") == pytest.approx(_calls(dense, "tp") * 24 / 32)  # two regions per layer


def test_the_expert_groups_follow_megatron_s_expert_rank_order() -> None:
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=16)
    folded = group_placement(FOLDED, system)
    default = group_placement(DEFAULT, system)
    assert (folded["ep"].size, folded["ep"].stride) == (16, 1)
    assert (default["ep"].size, default["ep"].stride) == (8, 2)
    assert folded["ep"].level == "hierarchical"  # 16 consecutive ranks span two 8-GPU nodes
    assert (folded["expert_dp"].size, default["expert_dp"].size) == (1, 1)


def test_the_expert_gradients_reduce_over_the_folded_expert_dp_group() -> None:
    lay = Layout(dp=16, tp=2, ep=8, etp=1, sequence_parallel=True, zero=1)  # edp = 32 / 8 = 4
    assert lay.expert_dp == 4
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=32)
    est = estimate(system, QWEN, replace(RECIPE, global_batch=128), lay)
    sizes = {c.group_size for c in est.time.collectives if c.group == "expert_dp"}
    assert sizes == {4}


def test_exports() -> None:
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=16)
    text = export_plan("megatron", system, QWEN, RECIPE, FOLDED).text
    assert "--expert-tensor-parallel-size 1 \\\n" in text
    assert "expert_tensor_parallel_size" in export_plan("nemo", system, QWEN, RECIPE, FOLDED).text
    assert "--expert-tensor-parallel-size" not in export_plan("megatron", system, QWEN, RECIPE, DEFAULT).text
    with pytest.raises(TrainplanError, match="megatron"):
        export_plan("torchtitan", system, QWEN, RECIPE, FOLDED)


def test_the_cli_estimates_it_and_the_planner_finds_folded_plans(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*CLI, "--ep", "16"]
    assert main([*args, "--etp", "1", "--sequence-parallel", "--global-batch", "64"]) == 0
    assert "etp=1" in capsys.readouterr().out
    assert main([*args, "--global-batch", "64", "--sequence-parallel"]) == 2  # ep 16 without folding
    assert "--etp" not in capsys.readouterr().out
    # qwen3-30b-a3b on 16 GPUs at tp 2: ep 16 only folds; the planner keeps folded layouts
    from trainplan.planner import SearchSpace, enumerate_cores

    cores, _ = enumerate_cores(QWEN, RECIPE, SearchSpace(micro_batches=(1,), max_devices=16), 8)
    assert any(c.etp == 1 and c.ep == 16 and c.tp == 2 for c in cores)


def test_the_folded_megatron_bridge_rows_are_scored() -> None:
    from trainplan.validate.datasets import timing_rows
    from trainplan.validate.timing import predict_row

    rows = [r for r in timing_rows("megatron_bridge_moe") if "235b" in r.name and "tp2" in r.name]
    assert len(rows) == 3
    for row in rows:
        assert row.verification == "VERBATIM" and row.recipe_flags.etp == 1
        res = predict_row(row)
        assert not res.skipped and res.error is not None and abs(res.error) < 0.5, res


def test_the_planner_searches_folding_and_its_best_equals_brute_force() -> None:
    """The planner's fastest plan over a space with etp (0: tp, 1: folded) equals the best
    ``estimate`` over every layout of the same space, folding included."""
    import itertools
    import math

    from trainplan.planner import Core, SearchSpace, plan

    model = load_model("qwen1.5-moe-a2.7b")  # 60 experts: ep in 1, 2, 4
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=16, seq_len=2048)
    space = SearchSpace(
        micro_batches=(1,),
        recomputes=("none", "full"),
        offloads=("none",),
        device_counts=(8,),
        pp_schedules=("1f1b",),
        max_pp=2,
        max_devices=8,
    )
    acc = get_accelerator("h100-sxm")
    result = plan(model, recipe, [acc], space=space, objective="time", top=3)
    best, best_cfg, folded = math.inf, None, 0
    for tp, pp, cp, ep, etp, sp, zero, rc in itertools.product(
        (1, 2, 4, 8), (1, 2), (1, 2), (1, 2, 4), (0, 1), (False, True), (0, 1, 2, 3), ("none", "full")
    ):
        if 8 % (tp * pp * cp):
            continue
        core = Core(
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            sequence_parallel=sp,
            micro_batch=1,
            recompute=rc,  # type: ignore[arg-type]
            offload="none",
            precision="bf16",
            pp_schedule="1f1b",
            virtual_stages=1,
            etp=etp,
        )
        try:
            lay = core.layout(8 // (tp * pp * cp), zero)
            e = estimate(System(accelerator=acc, num_devices=8), model, core.recipe(recipe), lay)
        except TrainplanError:
            continue
        folded += bool(etp)
        if e.feasible and e.run.time_s is not None and e.run.time_s < best:
            best, best_cfg = e.run.time_s, lay
    assert folded > 0 and result.fastest is not None
    assert result.fastest.estimate.run.time_s == pytest.approx(best, rel=1e-9), best_cfg


def test_megatron_trains_moe_with_tp_only_under_sequence_parallelism(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*CLI, "--ep", "8"]
    assert main(args) == 2
    assert "--sequence-parallel" in capsys.readouterr().err
    assert main([*args, "--sequence-parallel"]) == 0
    capsys.readouterr()


def test_folding_is_modelled_on_the_megatron_stack_only(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*CLI, "--ep", "16"]
    args += ["--etp", "1", "--sequence-parallel", "--global-batch", "64"]
    for engine in ("torchtitan", "deepspeed"):
        assert main([*args, "--engine", engine]) == 2
        assert "--etp" in capsys.readouterr().err
    assert main([*args, "--engine", "nemo"]) == 0
    capsys.readouterr()


def test_ep_overlap_does_not_hide_the_expert_tp_gathers() -> None:
    """They run inside the experts' compute node, on the compute stream (fine_grained_callables.py)."""
    lay = replace(FOLDED, etp=None, ep=8, ep_comm_overlap=True)
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=16)
    est = estimate(system, QWEN, RECIPE, lay)
    etp_s = sum(c.time_s for c in est.time.collectives if c.group == "etp")
    assert etp_s > 0 and est.time.exposed_ep_s >= etp_s
