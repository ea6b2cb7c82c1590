"""The planner: bulk == scalar, best == brute force, feasibility, the must-show cases, the CLI."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.hardware import get_accelerator
from trainplan.hardware.accelerator import Accelerator
from trainplan.hardware.prices import OPEN
from trainplan.hardware.system import System
from trainplan.layout import LayoutOptions
from trainplan.models import load_model
from trainplan.models.spec import ModelSpec
from trainplan.planner import (
    BulkEvaluator,
    BulkResult,
    Candidates,
    Core,
    SearchSpace,
    compare,
    enumerate_candidates,
    enumerate_cores,
    plan,
)
from trainplan.planner.bulk import TIME_FIELDS
from trainplan.planner.search import _price
from trainplan.predict import Estimate, estimate, hardware_refusal
from trainplan.recipe import Method, Recipe

SMALL = SearchSpace(micro_batches=(1, 2), max_devices=16)


Bulk = tuple[ModelSpec, list[Accelerator], list[Core], Candidates, list[float | None], BulkResult]


def _bulk(model_name: str, recipe: Recipe, names: tuple[str, ...], space: SearchSpace) -> Bulk:
    model = load_model(model_name)
    accs = sorted((get_accelerator(n) for n in names), key=lambda a: a.name)
    cores, _ = enumerate_cores(model, recipe, space, max(a.scale_up.domain_size for a in accs))
    cand = enumerate_candidates(cores, accs, space, {}, {}, recipe.global_batch)
    prices = [_price(a, OPEN, {}).usd_per_device_hour for a in accs]
    ev = BulkEvaluator(model, recipe, cores, accs, prices, pue=1.2, options=space.layout_options)
    res = ev.evaluate(cand)
    return model, accs, cores, cand, prices, res


def _scalar(
    model: ModelSpec,
    accs: list[Accelerator],
    cores: list[Core],
    cand: Candidates,
    prices: list[float | None],
    recipe: Recipe,
    i: int,
    options: LayoutOptions | None = None,
) -> Estimate:
    core = cores[int(cand.core[i])]
    return estimate(
        System(accelerator=accs[int(cand.acc[i])], num_devices=int(cand.devices[i])),
        model,
        core.recipe(recipe),
        core.layout(int(cand.dp[i]), int(cand.zero[i]), options or LayoutOptions()),
        price_usd_per_device_hour=prices[int(cand.acc[i])],
    )


def _fields_equal_scalar(model, accs, cores, cand, prices, recipe, res, picked, options=None) -> int:  # type: ignore[no-untyped-def]
    """Every reported field of the picked candidates equals the scalar estimate; how many were checked."""
    checked = 0
    for i in picked:
        d = _scalar(model, accs, cores, cand, prices, recipe, i, options).to_dict()
        for key, value in res.row(i).items():
            group, name = key.split(".")
            expected = d[group][name]
            if expected is None:
                assert math.isnan(value), key
                continue
            assert value == pytest.approx(expected, rel=1e-9, abs=1e-12), key
            checked += 1
    return checked


@pytest.mark.parametrize(
    ("model_name", "method", "seq_len"),
    [
        ("llama-3.2-1b", "pretrain", 4096),
        ("llama-3.2-1b", "qlora", 4096),
        ("qwen1.5-moe-a2.7b", "full", 8192),
        ("deepseek-v2-lite", "pretrain", 4096),  # a dense first layer: stages of two kinds
    ],
)
def test_bulk_equals_scalar_on_every_reported_field(model_name: str, method: Method, seq_len: int) -> None:
    recipe = Recipe(method=method, tokens=1e9, global_batch=32, seq_len=seq_len)
    names = ("h100-sxm", "mi300x", "tpu-v5p", "rtx-4090", "gb200")
    # the planner skips the accelerators the scalar path refuses outright (QLoRA on a TPU) before
    # it evaluates anything (test_plan_skips_refused_accelerators_with_the_reason)
    names = tuple(
        n
        for n in names
        if hardware_refusal(System(accelerator=get_accelerator(n), num_devices=1), recipe) is None
    )
    model, accs, cores, cand, prices, res = _bulk(model_name, recipe, names, SMALL)
    rng = np.random.default_rng(1)
    feasible = np.nonzero(res.feasible)[0]
    assert feasible.size > 100
    picked = rng.choice(feasible, 60, replace=False).tolist()
    assert _fields_equal_scalar(model, accs, cores, cand, prices, recipe, res, picked) > 1000
    # memory of candidates that do not fit agrees too, and they really do not fit
    nofit = np.nonzero(res.valid & ~res.fits)[0]
    for i in rng.choice(nofit, min(20, nofit.size), replace=False).tolist():
        e = _scalar(model, accs, cores, cand, prices, recipe, i)
        assert res.per_device_bytes[i] == pytest.approx(e.memory.per_device_bytes, rel=1e-9)
        assert not e.memory.fits
    # invalid candidates are exactly those the scalar path rejects
    bad = np.nonzero(~res.valid)[0]
    for i in rng.choice(bad, min(20, bad.size), replace=False).tolist():
        with pytest.raises(TrainplanError):
            _scalar(model, accs, cores, cand, prices, recipe, i)


def test_bulk_equals_scalar_for_the_hugging_face_qlora_terms() -> None:
    """The PEFT FP32 upcast and the transformers loss copy (the loss-forward moment) are the same
    terms in the planner's arrays as in the estimate."""
    recipe = Recipe(
        method="qlora",
        tokens=1e9,
        global_batch=32,
        seq_len=8192,
        kbit_fp32_upcast=True,
        logits_shift_copy=True,
        stack="pytorch",
    )
    space = SearchSpace(micro_batches=(1, 2), recomputes=("none", "full"), max_devices=16)
    model, accs, cores, cand, prices, res = _bulk("llama-3.2-1b", recipe, ("h100-sxm", "a100-80gb"), space)
    feasible = np.nonzero(res.feasible)[0]
    assert feasible.size > 20
    rng = np.random.default_rng(3)
    picked = rng.choice(feasible, min(40, feasible.size), replace=False).tolist()
    assert _fields_equal_scalar(model, accs, cores, cand, prices, recipe, res, picked) > 500


@pytest.mark.parametrize("model_name", ["llama-3.2-1b", "qwen2.5-7b"])
def test_bulk_equals_scalar_for_per_op_selective_checkpointing(model_name: str) -> None:
    """recompute="sac" candidates: every reported field equals the scalar estimate; the cores the
    scalar path refuses (tensor or context parallelism) are not searched."""
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=32, seq_len=8192, recompute_early_stop=True)
    space = SearchSpace(micro_batches=(1, 2), recomputes=("sac", "full"), max_devices=16)
    model, accs, cores, cand, prices, res = _bulk(model_name, recipe, ("h100-sxm", "mi300x"), space)
    sac = {i for i, c in enumerate(cores) if c.recompute == "sac"}
    assert sac and all(cores[i].tp == 1 and cores[i].cp == 1 for i in sac)
    assert any(c.tp > 1 for c in cores)  # full recompute is searched with tensor parallelism
    rows = np.nonzero(res.feasible & np.isin(cand.core, sorted(sac)))[0]
    assert rows.size > 20
    rng = np.random.default_rng(2)
    picked = rng.choice(rows, min(40, rows.size), replace=False).tolist()
    assert _fields_equal_scalar(model, accs, cores, cand, prices, recipe, res, picked) > 500
    _, invalid = enumerate_cores(model, recipe, space, 8)
    assert invalid.get("recompute: sac", 0) > 0
    moe_cores, moe_invalid = enumerate_cores(load_model("mixtral-8x7b"), recipe, space, 8)
    assert not any(c.recompute == "sac" for c in moe_cores) and moe_invalid["recompute: sac"] > 0


def test_bulk_equals_scalar_where_accelerators_share_efficiency_figures() -> None:
    # tpu-v5e/tpu-v5p and a100-40gb/a100-80gb have equal GEMM-efficiency figures: the bulk path
    # computes their stage efficiency once per pair; each must still match its own estimate.
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=32, seq_len=4096)
    names = ("tpu-v5e", "tpu-v5p", "a100-40gb", "a100-80gb")
    model, accs, cores, cand, prices, res = _bulk("llama-3.2-1b", recipe, names, SMALL)
    for a in range(len(accs)):
        sel = np.nonzero(res.feasible & (cand.acc == a))[0]
        assert sel.size
        for i in sel[:: max(1, sel.size // 4)].tolist():
            e = _scalar(model, accs, cores, cand, prices, recipe, i)
            assert res.step_s[i] == pytest.approx(e.time.step_s, rel=1e-9)
            assert res.per_device_bytes[i] == pytest.approx(e.memory.per_device_bytes, rel=1e-9)


def test_segmented_and_flat_candidates_evaluate_the_same() -> None:
    # enumerate_candidates shares one block of rows between accelerators (Segments); the same
    # candidates as flat arrays give the same result, field by field
    recipe = Recipe(method="full", tokens=1e9, global_batch=32, seq_len=8192)
    names = ("h100-sxm", "mi300x", "gb200")
    space = SearchSpace(micro_batches=(1, 2), max_devices=32)
    model = load_model("qwen1.5-moe-a2.7b")
    accs = sorted((get_accelerator(n) for n in names), key=lambda a: a.name)
    cores, _ = enumerate_cores(model, recipe, space, max(a.scale_up.domain_size for a in accs))
    cand = enumerate_candidates(cores, accs, space, {}, {}, recipe.global_batch)
    flat = cand.take(np.arange(len(cand)))
    assert len(flat) == len(cand) and np.array_equal(flat.core, cand.core)
    for i in (0, len(cand) // 3, len(cand) - 1):
        assert cand.at(i) == tuple(int(x[i]) for x in (cand.acc, cand.devices, cand.dp, cand.zero, cand.core))
    mask = cand.zero == 3
    assert np.array_equal(cand.take(mask).dp, cand.dp[mask])
    ev = BulkEvaluator(
        model, recipe, cores, accs, [_price(a, OPEN, {}).usd_per_device_hour for a in accs], pue=1.2
    )
    fields = ("invalid", "fits", "dominated", "slower", "micro_batches", "capacity_bytes", "per_device_bytes")
    for prune in (False, True):
        a, b = ev.evaluate(cand, prune_slower=prune), ev.evaluate(flat, prune_slower=prune)
        assert a.counts() == b.counts()
        assert np.array_equal(a.timed, b.timed)
        for name in (*fields, *TIME_FIELDS):
            x, y = getattr(a, name), getattr(b, name)
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


def test_planner_best_equals_brute_force_over_scalar_estimate() -> None:
    model = load_model("llama-3.2-1b")
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=16, seq_len=2048)
    space = SearchSpace(
        micro_batches=(1, 2),
        recomputes=("none", "full"),
        offloads=("none",),
        device_counts=(1, 2, 4),
        pp_schedules=("1f1b",),
        max_devices=4,
    )
    names = ("a100-80gb", "h100-sxm")
    accs = [get_accelerator(n) for n in names]
    result = plan(model, recipe, accs, space=space, objective="time", top=3)
    best, best_cfg = _brute_force_best(model, recipe, accs, (1, 2, 4))
    assert result.fastest is not None
    got = result.fastest.estimate
    assert got.run.time_s == pytest.approx(best, rel=1e-9), best_cfg
    assert result.plans[0].estimate.run.time_s == pytest.approx(best, rel=1e-9)


def test_every_printed_plan_is_feasible_and_deterministic() -> None:
    model = load_model("llama-3.2-1b")
    recipe = Recipe(method="full", tokens=2e9)
    accs = [get_accelerator(n) for n in ("h100-sxm", "a100-40gb", "tpu-v6e", "trn1", "mi250x")]
    a = plan(model, recipe, accs, space=SMALL, objective="balanced", top=8)
    b = plan(model, recipe, list(reversed(accs)), space=SMALL, objective="balanced", top=8)
    da, db = a.to_dict(), b.to_dict()
    da["search"]["seconds"] = db["search"]["seconds"] = 0.0  # type: ignore[index]
    assert json.dumps(da, sort_keys=True, default=str) == json.dumps(db, sort_keys=True, default=str)
    shown = [*a.plans, *a.pareto, a.fastest, a.cheapest]
    assert len(a.plans) == 8
    for p in shown:
        assert p is not None
        assert p.estimate.feasible
        assert p.explanation.binds
    # the Pareto front is non-dominated and sorted by time
    times = [p.estimate.run.time_s for p in a.pareto]
    costs = [p.estimate.run.cost_usd for p in a.pareto]
    assert times == sorted(times)  # type: ignore[type-var]
    assert costs == sorted(costs, reverse=True)  # type: ignore[type-var]
    assert a.cheapest is not None and a.cheapest.estimate.run.cost_usd == min(costs)  # type: ignore[type-var]
    # devices without a price are planned for time, never as free
    assert "mi250x" in a.unpriced
    assert all(p.estimate.system.accelerator.name != "mi250x" for p in a.pareto)


def test_qlora_7b_single_consumer_gpu_is_among_cheapest() -> None:
    model = load_model("llama-2-7b")
    recipe = Recipe(method="qlora", tokens=1e8)
    accs = [get_accelerator(n) for n in ("rtx-4090", "a100-80gb", "h100-sxm", "h200")]
    space = SearchSpace(micro_batches=(1, 2), max_devices=8)
    # RTX 4090 rented per GPU at a fixed $0.40 (community clouds list ~$0.3-0.7/h), so the
    # comparison does not move with the catalog's dated prices.
    res = plan(model, recipe, accs, space=space, objective="cost", top=10, prices={"rtx-4090": 0.40})
    assert res.min_devices["rtx-4090"] == 1
    cheapest = res.cheapest
    assert cheapest is not None and cheapest.estimate.run.cost_usd is not None
    # objective cost ranks one plan per accelerator; the single-card plan is searched on its own
    one = plan(
        model,
        recipe,
        [get_accelerator("rtx-4090")],
        space=replace(space, device_counts=(1,)),
        objective="cost",
        prices={"rtx-4090": 0.40},
    )
    single = [p for p in one.plans if p.label == "1×rtx-4090"]
    assert single, [p.label for p in one.plans]
    e = single[0].estimate
    assert e.feasible and e.memory.capacity_bytes < 30e9
    assert e.run.cost_usd is not None and e.run.cost_usd <= 1.02 * cheapest.estimate.run.cost_usd


def test_llama_70b_full_finetune_minimum_devices_follow_the_memory_model() -> None:
    model = load_model("llama-3.1-70b")
    recipe = Recipe(method="full", tokens=1e9, global_batch=64)
    names = ("h100-sxm", "h200", "b200", "mi300x")
    # without CPU offload (with ZeRO-Infinity parameter offload one device "fits" any of them)
    space = SearchSpace(
        micro_batches=(1,),
        recomputes=("full",),
        offloads=("none",),
        device_counts=(1, 2, 4, 8, 16, 32, 64),
        max_devices=64,
    )
    res = plan(model, recipe, [get_accelerator(n) for n in names], space=space, top=4)
    mins = res.min_devices
    assert all(mins[n] is not None for n in names), mins
    # more memory per device never needs more devices
    assert mins["h100-sxm"] >= mins["h200"] >= mins["b200"]  # type: ignore[operator]
    assert mins["h200"] >= mins["mi300x"]  # type: ignore[operator]
    # 16 bytes per parameter of model states alone: 70.6e9 * 16 / capacity is a lower bound
    for n in names:
        acc = get_accelerator(n)
        assert mins[n] * acc.memory_bytes >= 70.6e9 * 16  # type: ignore[operator]
    # check against the scalar estimate at n (fits) and at the previous count (the leanest does not)
    _, accs, cores, cand, prices, bulk = _bulk("llama-3.1-70b", recipe, names, space)
    for a, acc in enumerate(accs):
        least = mins[acc.name]
        at_n = np.nonzero((cand.acc == a) & (cand.devices == least) & bulk.feasible)[0]
        assert at_n.size
        assert _scalar(model, accs, cores, cand, prices, recipe, int(at_n[0])).feasible
        prev = [c for c in space.device_counts or () if least is not None and c < least]
        if prev:
            sel = np.nonzero((cand.acc == a) & (cand.devices == prev[-1]) & bulk.valid)[0]
            assert not bulk.fits[sel].any()
            lean = int(sel[np.argmin(bulk.per_device_bytes[sel])])
            e = _scalar(model, accs, cores, cand, prices, recipe, lean)
            assert not e.feasible
            assert e.memory.per_device_bytes == pytest.approx(bulk.per_device_bytes[lean], rel=1e-9)


def test_unmeetable_budget_and_deadline_are_explained_with_numbers() -> None:
    model = load_model("llama-3.2-1b")
    recipe = Recipe(method="pretrain", tokens=1e10)
    accs = [get_accelerator("h100-sxm"), get_accelerator("a100-80gb")]
    res = plan(model, recipe, accs, space=SMALL, budget_usd=1.0)
    assert not res.constraints_met
    assert res.plans == ()
    assert res.closest is not None
    text = " ".join(res.constraint_failures)
    assert "budget $1.00 cannot be met" in text and "over" in text
    cost = res.closest.estimate.run.cost_usd
    assert (cost is not None and f"{cost:,.0f}" in text) or "$" in text
    res2 = plan(model, recipe, accs, space=SMALL, deadline_h=0.01)
    assert not res2.constraints_met
    assert "deadline 0.01 h cannot be met" in " ".join(res2.constraint_failures)
    assert res2.closest is not None
    ok = plan(model, recipe, accs, space=SMALL, budget_usd=1e6, deadline_h=1e4)
    assert ok.constraints_met and ok.plans
    assert all(p.estimate.run.cost_usd is not None and p.estimate.run.cost_usd <= 1e6 for p in ok.plans)


def test_explanation_names_the_memory_reason_for_too_few_devices() -> None:
    model = load_model("llama-3.1-8b")
    recipe = Recipe(method="full", tokens=1e9, global_batch=32)
    space = SearchSpace(micro_batches=(1,), offloads=("none",), device_counts=(1, 2, 4, 8), max_devices=8)
    res = plan(model, recipe, [get_accelerator("a100-40gb")], space=space, objective="cost", top=1)
    assert res.plans
    alt = " ".join(res.plans[0].explanation.alternatives)
    n = res.min_devices["a100-40gb"]
    assert n is not None and n > 1
    assert f"{n // 2}×a100-40gb does not fit" in alt and "per device >" in alt


def test_compare_each_accelerator_at_its_best_layout() -> None:
    model = load_model("llama-3.2-1b")
    recipe = Recipe(method="pretrain", tokens=1e9)
    res = compare(model, recipe, [get_accelerator(n) for n in ("h100-sxm", "h200", "wse-3")], space=SMALL)
    by = {b.hardware: b for b in res.per_accelerator}
    assert set(by) == {"h100-sxm", "h200", "wse-3"}
    assert by["h100-sxm"].plan is not None and by["h200"].plan is not None
    assert by["wse-3"].plan is None and by["wse-3"].reason


# --- CLI --------------------------------------------------------------------------------------
def test_cli_plan_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "plan",
            "llama-3.2-1b",
            "--method",
            "pretrain",
            "--tokens",
            "1e9",
            "--hardware",
            "h100-sxm,a100-80gb",
            "--max-devices",
            "8",
            "--micro-batch",
            "1",
            "--top",
            "2",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("fastest", "cheapest", "pareto", "plans", "constraints", "search", "min_devices"):
        assert key in out
    p = out["plans"][0]
    for key in (
        "hardware",
        "devices",
        "layout",
        "recipe",
        "memory",
        "time",
        "throughput",
        "run",
        "explanation",
    ):
        assert key in p
    assert p["recipe"]["micro_batch"] == 1  # a given flag is a fixed choice
    for key in ("per_device_bytes", "fits", "weights_bytes", "optimizer_bytes", "activations_bytes"):
        assert key in p["memory"]
    for key in ("time_s", "device_hours", "cost_usd", "energy_kwh"):
        assert key in p["run"]
    assert p["memory"]["fits"] is True
    assert set(p["explanation"]) == {"binds", "alternatives"}


def test_cli_plan_and_compare_human(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan", "llama-3.2-1b", "--tokens", "1e9", "--hardware", "h100-sxm", "--max-devices", "8"]) == 0
    )
    out = capsys.readouterr().out
    assert "fastest:" in out and "why:" in out and "binds:" in out
    args = ["compare", "llama-3.2-1b", "--tokens", "1e9", "--hardware", "h100-sxm,h200", "--devices", "8"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [h["hardware"] for h in out["hardware"]] == ["h100-sxm", "h200"]
    assert all(h["plan"]["devices"] == 8 for h in out["hardware"])


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["plan", "llama-3.2-1b", "--hardware", "nope-9000"], "hardware"),
        (["plan", "llama-3.2-1b", "--hardware", "h100-sxm", "--device-price", "h100-sxm"], "device_price"),
        (["plan", "llama-3.2-1b", "--hardware", "h100-sxm", "--devices", "x,8"], "devices"),
        (["plan", "llama-3.2-1b", "--hardware", "h100-sxm", "--precisions", "fp7"], "precisions"),
        (["plan", "llama-3.2-1b", "--hardware", "h100-sxm", "--budget", "10"], "tokens"),
        (["plan", "llama-3.2-1b", "--objective", "fast"], "objective"),
        (["compare", "llama-3.2-1b"], "hardware"),
    ],
)
def test_cli_bad_input_exit_2_one_line(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err


def test_step_time_pruning_keeps_the_fastest_layout_at_every_hardware_and_count() -> None:
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=32, seq_len=4096)
    names = ("h100-sxm", "mi300x", "tpu-v5p", "rtx-4090", "gb200")
    model, accs, cores, cand, prices, full = _bulk("llama-3.2-1b", recipe, names, SMALL)
    cut = BulkEvaluator(model, recipe, cores, accs, prices, pue=1.2).evaluate(cand, prune_slower=True)
    assert cut.slower.any()
    # only candidates that fit and are not offload-dominated are cut; nothing else changes
    assert np.array_equal(cut.feasible | cut.slower, full.feasible)
    assert not (cut.feasible & cut.slower).any()
    kept = np.nonzero(cut.feasible)[0]
    assert np.array_equal(cut.step_s[kept], full.step_s[kept])
    assert np.array_equal(cut.per_device_bytes, full.per_device_bytes, equal_nan=True)
    group = cand.acc * 100_000 + cand.devices
    for g in np.unique(group[full.feasible]).tolist():
        at = (group == g) & full.feasible
        best = float(np.min(full.step_s[at]))
        assert float(np.min(cut.step_s[at & cut.feasible])) == best
        # every cut candidate is strictly slower than the fastest there
        assert (full.step_s[at & cut.slower] > best).all()


def test_step_time_bound_is_a_lower_bound() -> None:
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=32, seq_len=4096)
    names = ("h100-sxm", "mi300x", "tpu-v5p", "rtx-4090", "gb200")
    model, accs, cores, cand, prices, res = _bulk("llama-3.2-1b", recipe, names, SMALL)
    ev = BulkEvaluator(model, recipe, cores, accs, prices, pue=1.2)
    sub = np.nonzero(res.feasible)[0]
    key, u_core, u_zero, u_dp = ev._memory_keys(cand.dp, cand.zero, cand.core)
    mem = ev._memory(u_core, u_zero, u_dp)
    args = (cand.take(sub), res.micro_batches[sub], mem["trainable"][key[sub]], mem["params_dev"][key[sub]])
    bound = ev._time(*args, bound_only=True)["bound"]
    assert sub.size and (bound <= res.step_s[sub]).all()


OPTION_VARIANTS = (
    LayoutOptions(tp_comm_overlap=True),
    LayoutOptions(pp_comm_overlap=True, overlap_grad_reduce=False),
    LayoutOptions(grad_accumulation="autograd"),
    LayoutOptions(grad_accumulation="main_grad"),
    LayoutOptions(zero3_granularity="parameter"),
)


@pytest.mark.parametrize("options", OPTION_VARIANTS, ids=lambda o: o.describe())
def test_bulk_equals_scalar_with_every_layout_option(options: LayoutOptions) -> None:
    """The engine options the estimate models are evaluated by the planner with the same terms:
    every reported field of sampled candidates equals the scalar estimate of the same layout."""
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=32, seq_len=4096)
    names = ("h100-sxm", "mi300x", "gb200")
    space = replace(SMALL, layout_options=options)
    model, accs, cores, cand, prices, res = _bulk("llama-3.2-1b", recipe, names, space)
    plain = BulkEvaluator(model, recipe, cores, accs, prices, pue=1.2).evaluate(cand)
    feasible = np.nonzero(res.feasible)[0]
    picked = np.random.default_rng(3).choice(feasible, 40, replace=False).tolist()
    assert _fields_equal_scalar(model, accs, cores, cand, prices, recipe, res, picked, options) > 500
    # the option changes some step times (it is not ignored)
    both = np.nonzero(res.feasible & plain.feasible)[0]
    assert (res.step_s[both] != plain.step_s[both]).any()


@pytest.mark.parametrize("options", OPTION_VARIANTS, ids=lambda o: o.describe())
def test_planner_best_equals_brute_force_with_layout_options(options: LayoutOptions) -> None:
    """With every engine option in the space, the planner's fastest plan is the brute-force best
    over ``estimate`` of every layout with those options."""
    model = load_model("llama-3.2-1b")
    recipe = Recipe(method="pretrain", tokens=1e9, global_batch=16, seq_len=2048)
    space = SearchSpace(
        micro_batches=(1, 2),
        recomputes=("none", "full"),
        offloads=("none",),
        device_counts=(4,),
        pp_schedules=("1f1b",),
        max_devices=4,
        layout_options=options,
    )
    acc = get_accelerator("h100-sxm")
    result = plan(model, recipe, [acc], space=space, objective="time", top=3)
    best, _ = _brute_force_best(model, recipe, [acc], (4,), options)
    assert result.fastest is not None
    assert result.fastest.estimate.run.time_s == pytest.approx(best, rel=1e-9)
    assert result.fastest.estimate.layout == replace(
        result.fastest.estimate.layout,
        **options.for_candidate(  # type: ignore[arg-type]
            sequence_parallel=result.fastest.estimate.layout.sequence_parallel,
            pp=result.fastest.estimate.layout.pp,
            zero=result.fastest.estimate.layout.zero,
        ),
    )
    assert any("not searched" in n and options.describe() in n for n in result.notes)


def test_cli_plan_applies_the_engine_options_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan` takes the engine options the estimate models, applies them to the chosen layout and
    names them; the same request without them gives another step time."""
    args = ["plan", "llama-3.2-1b", "--tokens", "1e9", "--hardware", "h100-sxm", "--devices", "8"]
    args += ["--global-batch", "64", "--json"]
    assert main([*args, "--grad-accumulation", "autograd", "--no-overlap-grad-reduce"]) == 0
    with_opts = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    layout = with_opts["fastest"]["layout"]
    assert layout["grad_accumulation"] == "autograd" and layout["overlap_grad_reduce"] is False
    assert any("grad_accumulation=autograd" in n for n in with_opts["notes"])
    # the default engine (Megatron-Core) overlaps pipeline sends on interleaved schedules only
    assert any("(pp_comm_overlap on interleaved schedules)" in n for n in plain["notes"])
    assert any(n.startswith("engine: megatron (default engine") for n in plain["notes"])


def _brute_force_best(
    model: ModelSpec,
    recipe: Recipe,
    accs: list[Accelerator],
    counts: tuple[int, ...],
    options: LayoutOptions | None = None,
) -> tuple[float, tuple[object, ...]]:
    """The shortest time to train over ``estimate`` of every layout (tp, pp, ZeRO, sequence
    parallelism), micro-batch 1-2 and recompute none/full, with the engine options applied."""
    best, best_cfg = math.inf, ()
    for acc, n, tp, pp, zero, sp, mb, rc in itertools.product(
        accs, counts, (1, 2, 4), (1, 2, 4), (0, 1, 2, 3), (False, True), (1, 2), ("none", "full")
    ):
        if n % (tp * pp):
            continue
        core = Core(
            tp=tp,
            pp=pp,
            cp=1,
            ep=1,
            sequence_parallel=sp,
            micro_batch=mb,
            recompute=rc,  # type: ignore[arg-type]
            offload="none",
            precision="bf16",
            pp_schedule="1f1b",
            virtual_stages=1,
        )
        try:
            lay = core.layout(n // (tp * pp), zero, options or LayoutOptions())
            e = estimate(System(accelerator=acc, num_devices=n), model, core.recipe(recipe), lay)
        except TrainplanError:
            continue
        if e.feasible and e.run.time_s is not None and e.run.time_s < best:
            best, best_cfg = e.run.time_s, (acc.name, n, lay, mb, rc)
    return best, best_cfg


def test_bulk_equals_scalar_with_the_fp8_switches() -> None:
    """Transformer Engine's FP8 weights, SwiGLU input and attention in the planner's arrays."""
    recipe = Recipe(
        precision="fp8",
        tokens=1e9,
        global_batch=32,
        seq_len=4096,
        fp8_params=True,
        fp8_activation_store=True,
        fp8_attention=True,
    )
    space = SearchSpace(micro_batches=(1, 2), max_devices=16, precisions=("fp8",), zero_stages=(1, 2, 3))
    model, accs, cores, cand, prices, res = _bulk("llama-3.2-1b", recipe, ("h100-sxm", "b200"), space)
    feasible = np.nonzero(res.feasible)[0]
    picked = np.random.default_rng(3).choice(feasible, 40, replace=False).tolist()
    assert _fields_equal_scalar(model, accs, cores, cand, prices, recipe, res, picked) > 500
