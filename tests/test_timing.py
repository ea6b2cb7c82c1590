"""Step time, throughput, MFU and run cost: invariants, published data, calibration."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import trainplan
from trainplan.flops import megatron2021_eq3_flops
from trainplan.hardware import get_accelerator, list_accelerators
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.predict import estimate
from trainplan.recipe import LoRASpec, Recipe
from trainplan.timing import calibrated_kappa, kappa_source, step_time
from trainplan.validate import calibrate
from trainplan.validate.datasets import TimingRow, scheme_pairs, timing_rows
from trainplan.validate.report import run_all
from trainplan.validate.timing import TIMING_DATASETS, predict_row, validate_dataset


def est(hw: str, n: int, layout: Layout, recipe: Recipe, model: str = "llama-3.1-8b"):  # type: ignore[no-untyped-def]
    return estimate(System(accelerator=get_accelerator(hw), num_devices=n), load_model(model), recipe, layout)


def test_step_time_is_the_visible_sum() -> None:
    e = est("h100-sxm", 64, Layout(dp=2, tp=8, pp=4, sequence_parallel=True, zero=1), Recipe(global_batch=64))
    assert e.time.step_s == pytest.approx(sum(v for _, v in e.time.terms()), rel=1e-12)
    assert e.time.bubble_s > 0 and e.time.exposed_tp_s > 0 and e.time.pp_p2p_s > 0


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["a100-80gb", "h100-sxm", "b200", "mi300x", "tpu-v5p", "rtx-4090"]),
    st.sampled_from(["gpt2", "llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b"]),
    st.sampled_from([512, 2048, 8192]),
    st.sampled_from(["none", "selective", "full"]),
)
def test_mfu_is_below_one(hw: str, model: str, seq: int, recompute: str) -> None:
    assume(not (model == "gpt2" and seq > 1024))  # GPT-2's learned position table has 1024 rows
    e = est(hw, 1, Layout(), Recipe(seq_len=seq, recompute=recompute), model)  # type: ignore[arg-type]
    assert 0 < e.throughput.mfu < 1
    assert 0 < e.throughput.hfu < 1


@pytest.mark.parametrize("hw", ["h100-sxm", "a100-80gb", "b200"])
def test_data_parallel_scales_at_most_linearly(hw: str) -> None:
    recipe = Recipe(seq_len=2048, micro_batch=2)
    base = est(hw, 8, Layout(dp=8, zero=1), recipe).throughput.tokens_per_s
    for n in (16, 64, 256):
        tps = est(hw, n, Layout(dp=n, zero=1), recipe).throughput.tokens_per_s
        assert tps <= base * n / 8 * (1 + 1e-9)


def test_fp8_beats_bf16_only_with_an_fp8_peak() -> None:
    for acc in list_accelerators():
        if not acc.supports("bf16"):
            continue
        system = System(accelerator=acc, num_devices=1)
        model = load_model("llama-3.2-1b")
        bf16 = step_time(system, model, Recipe(seq_len=2048), Layout()).step_s
        if acc.supports("fp8"):
            fp8 = step_time(system, model, Recipe(seq_len=2048, precision="fp8"), Layout()).step_s
            if acc.peak_flops_per_s("fp8") > acc.peak_flops_per_s("bf16"):
                assert fp8 < bf16, acc.name
        else:
            with pytest.raises(Exception, match="fp8"):
                estimate(system, model, Recipe(seq_len=2048, precision="fp8"), Layout())


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.sampled_from(["1f1b", "interleaved", "zb"]), st.integers(1, 4))
def test_more_microbatches_never_increase_the_bubble_fraction(pp: int, schedule: str, k: int) -> None:
    model = load_model("llama-3.1-8b")
    v = 2 if schedule == "interleaved" else 1
    fractions = []
    for m in (pp * k, pp * k * 2, pp * k * 4):
        layout = Layout(pp=pp, pp_schedule=schedule, virtual_stages=v)  # type: ignore[arg-type]
        t = step_time(
            System(accelerator=get_accelerator("h100-sxm"), num_devices=pp),
            model,
            Recipe(seq_len=2048, global_batch=m),
            layout,
        )
        fractions.append(t.bubble_s / t.step_s)
    assert fractions[0] >= fractions[1] >= fractions[2]


def test_run_cost_arithmetic() -> None:
    recipe = Recipe(seq_len=2048, global_batch=64, tokens=1e10)
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    e = estimate(
        system, load_model("llama-3.1-8b"), recipe, Layout(dp=8, zero=3), price_usd_per_device_hour=2.0
    )
    assert e.run.compute_time_s == pytest.approx(1e10 / e.throughput.tokens_per_s)
    g = e.run.goodput
    assert g is not None and e.run.time_s == pytest.approx(g.compute_s + g.checkpoint_s + g.lost_s)
    assert e.run.time_s > e.run.compute_time_s
    assert e.run.device_hours == pytest.approx(8 * e.run.time_s / 3600)
    assert e.run.cost_usd == pytest.approx(2.0 * e.run.device_hours)
    tdp = get_accelerator("h100-sxm").tdp_w
    assert tdp is not None and e.run.energy_kwh is not None
    assert e.run.energy_kwh <= 8 * tdp * e.run.time_s / 3.6e6 * 1.2 + 1e-9


# --- published data ------------------------------------------------------------------------------
def test_megatron_table1_beats_a_constant_efficiency() -> None:
    """A constant 50% of peak scores ~7.9% MAPE on Megatron-LM 2021 Table 1; the model must do better."""
    rows = [r for r in timing_rows("megatron2021_table1") if r.is_target]
    constant = []
    for r in rows:
        assert (
            r.dims is not None
            and r.global_batch is not None
            and r.seq_len is not None
            and r.step_s is not None
        )
        flops = megatron2021_eq3_flops(r.global_batch, r.seq_len, r.dims.layers, r.dims.hidden, r.dims.vocab)
        constant.append(abs(flops / (r.num_devices * 0.5 * 312e12) / r.step_s - 1))
    ours = validate_dataset("megatron2021_table1").mape
    assert ours is not None
    assert 0.07 < statistics.fmean(constant) < 0.09  # 8.3% here; 7.9% as quoted with other rounding
    assert ours < statistics.fmean(constant)
    assert ours <= 0.05  # the stated target


def test_korthikanti_table5_each_row_and_the_ratio() -> None:
    res = validate_dataset("korthikanti2022_table5")
    by_name = {r.name: r for r in res.rows}
    for r in res.rows:
        assert r.error is not None and abs(r.error) <= 0.10, r.name
    for size in ("22b", "175b", "530b", "1t"):
        full = by_name[f"korthikanti2022-{size}-full-recompute"]
        sel = by_name[f"korthikanti2022-{size}-sp-selective"]
        assert full.predicted is not None and sel.predicted is not None
        ratio_err = (full.predicted / sel.predicted) / (full.published / sel.published) - 1
        assert abs(ratio_err) <= 0.05, size


KNOWN_MISRANKED: dict[tuple[str, str], str] = {}
"""Published pairs the model ranks the wrong way round, each with its reason (docs/timing.md)."""


def test_faster_scheme_comes_out_faster() -> None:
    rows = [r for ds in TIMING_DATASETS for r in timing_rows(ds)]
    pairs = scheme_pairs(rows)
    assert len(pairs) > len(KNOWN_MISRANKED)
    misranked = set()
    for fast, slow in pairs:
        f, s = predict_row(fast), predict_row(slow)
        assert f.predicted is not None and s.predicted is not None
        right = f.predicted > s.predicted if f.metric == "tokens_per_s" else f.predicted < s.predicted
        if not right:
            misranked.add((fast.name, slow.name))
    # Every other pair is ranked right; a known misranking that gets fixed must leave the list.
    assert misranked == set(KNOWN_MISRANKED)


def test_every_dataset_within_its_stated_bound() -> None:
    for res in run_all():
        assert res.passed, f"{res.name}: MAPE {res.mape} > bound {res.bound}"


def test_calibration_is_reproducible_from_its_split() -> None:
    """κ is fitted on the calibration split only; re-fitting gives the stored value."""
    for stack, gen in calibrate.CALIBRATION_SETS:
        fit = calibrate.fit_generation(gen, stack)
        stored = {
            "ampere": "a100-80gb",
            "hopper": "h100-sxm",
            "blackwell": "b200",
            "cdna2": "mi250x",
            "cdna3-750w": "mi300x",
            "cdna3-1000w": "mi325x",
            "cdna4-1000w": "mi350x",
            "cdna4-1400w": "mi355x",
            "tpu": "tpu-v5p",
            "trainium": "trn1",
            "gaudi": "gaudi2",
        }[gen]
        assert calibrated_kappa(stored, stack) == pytest.approx(fit.kappa, abs=2e-3), (stack, gen)
        for name in fit.rows:
            row = next(
                r
                for ds, _ in calibrate.CALIBRATION_SETS[(stack, gen)]
                for r in timing_rows(ds)
                if r.name == name
            )
            assert row.split == "calibrate", name
    for judged in ("megatron2021_table1", "korthikanti2022_table5"):
        assert all(r.split == "validate" for r in timing_rows(judged))


def test_kappa_ignores_validation_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing every validation row of a family's datasets leaves its fitted κ unchanged;
    changing a calibration row moves it."""
    from dataclasses import replace as dc_replace

    real = timing_rows
    for stack, gen in (("maxtext", "tpu"), ("neuron", "trainium"), ("megatron", "hopper")):
        before = calibrate.fit_generation(gen, stack).kappa

        def halved(name: str, split: str) -> list[TimingRow]:
            return [
                dc_replace(
                    r,
                    derived_step_s=(r.step_s or 1.0) * 0.5,
                    measured_step_s=None,
                    measured_tokens_per_s=None
                    if r.measured_tokens_per_s is None
                    else r.measured_tokens_per_s * 2,
                    measured_tokens_per_s_per_device=None
                    if r.measured_tokens_per_s_per_device is None
                    else r.measured_tokens_per_s_per_device * 2,
                )
                if r.split == split
                else r
                for r in real(name)
            ]

        monkeypatch.setattr(calibrate, "timing_rows", lambda name: halved(name, "validate"))
        assert calibrate.fit_generation(gen, stack).kappa == before, (stack, gen)
        monkeypatch.setattr(calibrate, "timing_rows", lambda name: halved(name, "calibrate"))
        assert calibrate.fit_generation(gen, stack).kappa != pytest.approx(before, rel=0.05), (stack, gen)
        monkeypatch.setattr(calibrate, "timing_rows", real)


def test_tpu_and_trainium_take_their_native_stack() -> None:
    """κ on TPU and Trainium is the XLA (MaxText) and Neuron κ; asking for a CUDA stack there
    takes the native κ and says so."""
    from trainplan.timing import kappa_source

    for hw, native in (
        ("tpu-v5p", "maxtext"),
        ("tpu-v6e", "maxtext"),
        ("trn1", "neuron"),
        ("trn2", "neuron"),
    ):
        k = calibrated_kappa(hw, native)
        assert k is not None and 0.3 < k < 1.0
        assert kappa_source(hw, native) == "fitted"
        assert calibrated_kappa(hw, "megatron") == k and kappa_source(hw, "megatron") == "native"
    t = est("tpu-v5p", 64, Layout(dp=64, zero=3), Recipe(seq_len=2048, global_batch=64)).time
    assert t.kappa == calibrated_kappa("tpu-v5p", "maxtext")
    assert any("--stack maxtext" in n for n in t.notes)
    own = est(
        "tpu-v5p", 64, Layout(dp=64, zero=3), Recipe(seq_len=2048, global_batch=64, stack="maxtext")
    ).time
    assert not any("--stack" in n for n in own.notes)
    assert calibrated_kappa("h100-sxm", "maxtext") is None  # no MaxText runs on GPUs in the package


def test_uncalibrated_devices_say_so() -> None:
    e = est(
        "v100-32gb",
        8,
        Layout(dp=8, zero=3),
        Recipe(seq_len=2048, global_batch=8, precision="fp16", attention="eager"),
    )
    assert e.time.kappa == 1.0
    assert any("no calibrated" in n for n in e.time.notes)
    assert math.isfinite(e.time.step_s)


def test_offload_adds_host_transfer_time() -> None:
    base = Recipe(method="full", seq_len=2048, global_batch=8)
    on = est("h100-sxm", 8, Layout(dp=8, zero=3), replace(base, offload="optimizer"))
    off = est("h100-sxm", 8, Layout(dp=8, zero=3), base)
    assert on.time.offload_s > 0 and off.time.offload_s == 0
    assert on.time.optimizer_s == 0 and off.time.optimizer_s > 0


# ---------------------------------------------------------------- communication overlap options


def _tp_layout(**kw: object) -> Layout:
    base: dict[str, object] = {"dp": 2, "tp": 4, "pp": 8, "sequence_parallel": True}
    base.update(kw)
    return Layout(**base)  # type: ignore[arg-type]


def test_tp_comm_overlap_leaves_only_the_last_pipelined_chunk_when_gemms_are_longer() -> None:
    recipe = Recipe(seq_len=8192, global_batch=64, recompute="full")
    plain = est("h100-sxm", 64, _tp_layout(), recipe, "llama-3.1-70b")
    over = est("h100-sxm", 64, _tp_layout(tp_comm_overlap=True), recipe, "llama-3.1-70b")
    colls = plain.time.collectives
    # TP inside an NVLink node: every pass's collectives are shorter than its GEMMs, so what stays
    # exposed is the last of the four chunks of the forward (and recompute) reduce-scatters.
    rs = sum(
        c.time_s for c in colls if c.group == "tp" and c.kind == "reduce_scatter" and "backward" not in c.name
    )
    assert over.time.exposed_tp_s == pytest.approx(rs / 4, rel=1e-12)
    assert 0 < over.time.exposed_tp_s < plain.time.exposed_tp_s
    assert over.time.step_s < plain.time.step_s
    assert over.time.compute_s == plain.time.compute_s
    assert over.time.bubble_s < plain.time.bubble_s  # a pipeline slot carries less communication


def test_tp_comm_overlap_exposes_what_exceeds_the_gemms_across_nodes() -> None:
    """tp = 32 spans four 8-GPU NVLink domains: the collectives outlast the GEMMs, the excess shows."""
    from trainplan.flops import device_flops

    recipe = Recipe(seq_len=2048, global_batch=16)
    layout = Layout(dp=1, tp=32, sequence_parallel=True)
    plain = est("h100-sxm", 32, layout, recipe, "llama-3.2-1b")
    over = est("h100-sxm", 32, replace(layout, tp_comm_overlap=True), recipe, "llama-3.2-1b")
    t = plain.time
    (stage,) = device_flops(load_model("llama-3.2-1b"), recipe, layout)
    peak = get_accelerator("h100-sxm").peak_flops_per_s("bf16")
    expected = 0.0
    for name, cost in (("forward", stage.forward), ("backward", stage.backward)):
        gemm_s = t.micro_batches * cost.gemm_flops / (peak * t.gemm_efficiency) / t.kappa
        # (the backward's collectives include the weight-gradient input re-gather)
        tp = [c for c in t.collectives if c.group == "tp" and c.name.startswith(f"tp_{name}_")]
        comm_s = sum(c.time_s for c in tp)
        assert comm_s > gemm_s, name  # the case this test is about
        expected += comm_s - gemm_s
        if name == "forward":
            expected += sum(c.time_s for c in tp if c.kind == "reduce_scatter") / 4
    assert over.time.exposed_tp_s == pytest.approx(expected, rel=1e-12)
    assert over.time.exposed_tp_s < t.exposed_tp_s


def test_pp_comm_overlap_hides_sends_behind_compute() -> None:
    recipe = Recipe(seq_len=4096, global_batch=64)
    layout = _tp_layout(pp_schedule="interleaved", virtual_stages=5)
    plain = est("h100-sxm", 64, layout, recipe, "llama-3.1-70b")
    over = est("h100-sxm", 64, replace(layout, pp_comm_overlap=True), recipe, "llama-3.1-70b")
    assert plain.time.pp_p2p_s > 0 and over.time.pp_p2p_s == 0.0
    assert over.time.step_s < plain.time.step_s


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["a100-80gb", "h100-sxm", "b200", "mi300x"]),
    st.sampled_from([(2, 1), (4, 2), (8, 4), (16, 1)]),
    st.sampled_from(["none", "full"]),
    st.sampled_from([2048, 8192]),
)
def test_overlap_options_never_slow_a_step(hw: str, tp_pp: tuple[int, int], recompute: str, seq: int) -> None:
    tp, pp = tp_pp
    devices = 16 * max(1, tp * pp // 16)
    layout = Layout.for_devices(devices, tp=tp, pp=pp, sequence_parallel=True)
    recipe = Recipe(seq_len=seq, global_batch=devices * 2, recompute=recompute)  # type: ignore[arg-type]
    plain = est(hw, devices, layout, recipe, "llama-3.1-70b")
    over = est(
        hw, devices, replace(layout, tp_comm_overlap=True, pp_comm_overlap=pp > 1), recipe, "llama-3.1-70b"
    )
    assert over.time.step_s <= plain.time.step_s * (1 + 1e-12)
    assert over.time.step_s == pytest.approx(sum(v for _, v in over.time.terms()), rel=1e-12)


def test_overlap_options_are_validated() -> None:
    from trainplan.errors import LayoutError

    with pytest.raises(LayoutError, match="--sequence-parallel"):
        Layout(tp=2, tp_comm_overlap=True)
    with pytest.raises(LayoutError, match="pp > 1"):
        Layout(dp=2, pp_comm_overlap=True)


def test_low_precision_recipes_keep_attention_and_lm_head_at_the_activation_dtype() -> None:
    """FP8 / FP4 recipes quantize the block's linear layers only: FlashAttention and the LM head
    stay BF16, so they are charged the BF16 peak (and the BF16 large-GEMM efficiency)."""
    from trainplan.efficiency import get_efficiency
    from trainplan.flops import device_flops
    from trainplan.timing import attention_etas, recipe_peaks

    h100 = get_accelerator("h100-sxm")
    eff = get_efficiency("h100-sxm")
    bf16, fp8 = Recipe(seq_len=8192), Recipe(seq_len=8192, precision="fp8")
    p16, p8 = recipe_peaks(h100, bf16, eff), recipe_peaks(h100, fp8, eff)
    assert p16.peak == p16.peak_hp == p16.peak_attn == h100.peak_flops_per_s("bf16")
    assert p8.peak == h100.peak_flops_per_s("fp8") > 1.9 * p8.peak_attn
    assert p8.peak_attn == h100.peak_flops_per_s("bf16")
    assert p8.peak_hp == pytest.approx(p8.peak_attn * eff.gemm_max("bf16") / eff.gemm_max("fp8"))
    # The LM head is the only GEMM kept in BF16, and only on the last stage.
    model = load_model("llama-3.1-8b")
    (stage,) = device_flops(model, fp8, Layout())
    head = 2 * 8192 * model.hidden_size * model.vocab_size
    assert stage.forward.hp_gemm_flops == head and stage.backward.hp_gemm_flops == 2 * head
    # Attention time does not shrink with FP8: the forward pass saves at most the GEMM share.
    t16 = est("h100-sxm", 1, Layout(), bf16).time
    t8 = est("h100-sxm", 1, Layout(), fp8).time
    eta_attn = attention_etas(h100, fp8, eff, model, 1).forward
    attn_s = stage.forward.attention_flops / (p8.peak_attn * eta_attn) / t8.kappa
    assert t8.forward_s > attn_s and t16.forward_s > attn_s
    assert t16.step_s / t8.step_s < 2 * eff.gemm_max("fp8") / eff.gemm_max("bf16")


def test_grad_accumulation_bytes_per_mode() -> None:
    from trainplan.timing import grad_accumulation_bytes

    p, m = 1.5e9, 16
    bf16, fp16 = Recipe(precision="bf16"), Recipe(precision="fp16")
    assert grad_accumulation_bytes(p, bf16, Layout(dp=8), m) == 0.0  # fused into the wgrad GEMM
    auto = Layout(dp=8, grad_accumulation="autograd")
    assert grad_accumulation_bytes(p, fp16, auto, m) == (m - 1) * 3 * 2 * p
    assert grad_accumulation_bytes(p, fp16, auto, 1) == 0.0  # one micro-batch: nothing to add
    # ZeRO-2/3 reduce-scatter every micro-batch: only the shard is summed
    sharded = Layout(dp=8, zero=3, grad_accumulation="autograd")
    assert grad_accumulation_bytes(p, fp16, sharded, m) == (m - 1) * 3 * 2 * p / 8
    hook = Layout(dp=8, grad_accumulation="main_grad")
    assert grad_accumulation_bytes(p, fp16, hook, m) == m * (2 + 2 * 2) * p
    assert grad_accumulation_bytes(p, bf16, hook, m) == m * (2 + 2 * 4) * p  # FP32 main grads


def test_grad_accumulation_is_a_named_term_of_the_step() -> None:
    r = Recipe(seq_len=2048, micro_batch=1, global_batch=64, precision="bf16")
    fused = est("h100-sxm", 8, Layout(dp=8), r)
    auto = est("h100-sxm", 8, Layout(dp=8, grad_accumulation="autograd"), r)
    assert fused.time.grad_accum_s == 0.0
    assert auto.time.grad_accum_s > 0
    assert auto.time.step_s == pytest.approx(fused.time.step_s + auto.time.grad_accum_s, rel=1e-12)
    assert ("gradient accumulation", auto.time.grad_accum_s) in auto.time.terms()


def test_stack_kappa_fitted_or_derived_from_the_ratio() -> None:
    """PyTorch stacks reach less of the microbenchmark rate than Megatron-Core on the same GPU; a
    generation without PyTorch rows takes the Megatron κ times the fitted ratio."""
    from trainplan.timing import GENERATION, kappa_source, stack_ratio

    for hw in ("a100-80gb", "h100-sxm"):
        mega, torch_k = calibrated_kappa(hw, "megatron"), calibrated_kappa(hw, "pytorch")
        assert mega is not None and torch_k is not None and torch_k < mega
        assert kappa_source(hw, "pytorch") == "fitted"
    ratio = stack_ratio("pytorch", GENERATION["b200"])  # NVIDIA's own: Ampere and Hopper
    assert ratio is not None and 0.8 < ratio < 1.0
    amd = stack_ratio("pytorch", GENERATION["mi355x"])  # AMD's own: CDNA 3 (MI300X)
    amd_mega = calibrated_kappa("mi355x", "megatron")
    assert amd is not None and amd < ratio and amd_mega is not None  # ROCm's PyTorch trails further
    assert calibrated_kappa("mi355x", "pytorch") == pytest.approx(amd_mega * amd)
    b200 = calibrated_kappa("b200", "megatron")
    assert b200 is not None
    assert calibrated_kappa("b200", "pytorch") == pytest.approx(b200 * ratio)
    assert kappa_source("b200", "pytorch") == "ratio"
    assert calibrated_kappa("v100-32gb", "pytorch") is None  # no Megatron κ to scale either
    r = Recipe(seq_len=2048, global_batch=8)
    mega_t = est("b200", 8, Layout(dp=8, zero=3), r).time
    # compiled: the same fused kernels, so only κ differs (eager kernels cost more: test_compile.py)
    torch_t = est("b200", 8, Layout(dp=8, zero=3), replace(r, stack="pytorch", torch_compile=True)).time
    assert torch_t.compute_s == pytest.approx(mega_t.compute_s * mega_t.kappa / torch_t.kappa)
    assert any("ratio" in n for n in torch_t.notes)


def test_pytorch_stack_validates_out_of_sample() -> None:
    """κ_pytorch is fitted on llm-foundry's single-node A100-80GB and H100 rows only; torchtitan and
    torchtune (other PyTorch stacks) and llm-foundry's other rows judge it."""
    fitted_on = {ds for sets in calibrate.CALIBRATION_SETS.values() for ds, _ in sets}
    assert not fitted_on & {"torchtitan_llama3", "torchtune_throughput"}
    for name, bound in (
        ("torchtitan_llama3", 0.15),
        ("torchtune_throughput", 0.16),
        ("llmfoundry_mpt", 0.12),
    ):
        res = validate_dataset(name)  # MAPE over the validate split
        assert res.mape is not None and res.mape <= bound, (name, res.mape)


def test_cross_vendor_order_on_published_comparisons() -> None:
    """MLPerf Training v5.1 Llama 2 70B LoRA, one node of 8, same model, sequence, batch, LoRA and
    FP8 recipe (FP8 attention off) on both vendors: the faster accelerator must come out faster.
    H200's κ comes from NeMo pre-training rows, not from this benchmark. Left out: B200, whose
    run used FP8 attention (Dell config_common.sh FP8_DPA=1) where AMD's runs did not — not the
    same settings."""
    rows = [r for r in timing_rows("mlperf51_llama2_70b_lora") if r.is_target]

    def median_step(hw: str, which: str) -> float:
        values = []
        for r in rows:
            if r.hardware != hw:
                continue
            if which == "published":
                assert r.step_s is not None
                values.append(r.step_s)
            else:
                res = predict_row(r)
                assert res.predicted is not None, res.skipped
                values.append(res.predicted)
        return statistics.median(values)

    for nvidia, amd in (("h200", "mi300x"), ("h200", "mi325x"), ("h200", "mi350x"), ("h200", "mi355x")):
        published = median_step(nvidia, "published") < median_step(amd, "published")
        predicted = median_step(nvidia, "predicted") < median_step(amd, "predicted")
        assert published == predicted, (nvidia, amd)
    # the case the seed asks about: MI300X trains slower than H200 despite higher peaks
    assert median_step("mi300x", "predicted") > median_step("h200", "predicted")
    mi300x, h200 = get_accelerator("mi300x"), get_accelerator("h200")
    assert mi300x.peak_flops_per_s("fp8") > h200.peak_flops_per_s("fp8")
    assert mi300x.memory_bandwidth_bytes_per_s > h200.memory_bandwidth_bytes_per_s


def test_per_chip_order_published_for_gaudi2_on_llm_foundry() -> None:
    """Databricks, "LLM Training and Inference with Intel Gaudi 2 AI Accelerators" (2024-01,
    https://databricks.com/blog/llm-training-and-inference-intel-gaudi2-ai-accelerators): with LLM
    Foundry, BF16, MPT models on 8 devices, Gaudi 2 has "the 2nd best training performance-per-chip
    we've tested (only bested by the NVIDIA H100)", ahead of A100-40GB and A100-80GB. The same
    8-device MPT-7B settings (a published H100 llm-foundry row) on each accelerator must keep that
    order. Gaudi 2's κ is fitted on Intel's Megatron-DeepSpeed rows only: the PyTorch-stack κ used
    here is that κ times the stack ratio, and no LLM Foundry run on Gaudi is fitted, so this is
    judged out of sample."""
    base = next(
        r
        for r in timing_rows("llmfoundry_mpt")
        if r.name == "llmfoundry-mpt-7b-h10080gb-8gpu-s4096-bf16-gbs256"
    )
    tokens_per_s = {}
    for hw in ("h100-sxm", "gaudi2", "a100-80gb", "a100-40gb"):
        res = predict_row(replace(base, hardware=hw))
        assert res.predicted is not None, (hw, res.skipped)
        tokens_per_s[hw] = res.predicted
    assert tokens_per_s["h100-sxm"] > tokens_per_s["gaudi2"] > tokens_per_s["a100-80gb"]
    assert tokens_per_s["gaudi2"] > tokens_per_s["a100-40gb"]
    assert kappa_source("gaudi2", "pytorch") == "ratio" and kappa_source("gaudi2", "megatron") == "fitted"
    fitted_on = {
        ds for (stack, _), sets in calibrate.CALIBRATION_SETS.items() for ds, _ in sets if stack == "pytorch"
    }
    assert all(r.hardware != "gaudi2" for ds in fitted_on for r in timing_rows(ds))


def test_torchtitan_h100_ahead_of_mi300x_as_published() -> None:
    """pytorch/ao ``torchao/float8/README.md`` @9519bebb, "Training benchmarks": Llama 3 8B in
    torchtitan, 8 GPUs, FSDP2, local batch 1, sequence 8192, torch.compile, BF16: 6150 tokens/s on
    8 × H100 against 5376.5 on 8 × MI300X, H100 1.14× faster. The MI300X row fits AMD's PyTorch κ;
    the H100 row is predicted with the κ fitted on llm-foundry, so the order is not fitted."""
    rows = {r.hardware: r for r in timing_rows("torchao_float8_llama3")}
    assert rows["mi300x"].split == "calibrate" and rows["h100-sxm"].split == "validate"
    tokens_per_s = {}
    for hw, r in rows.items():
        res = predict_row(r)
        assert res.predicted is not None, res.skipped
        tokens_per_s[hw] = res.predicted
    ratio = tokens_per_s["h100-sxm"] / tokens_per_s["mi300x"]
    assert 1.0 < ratio < 1.14 * 1.25, ratio


def test_mlperf40_lora_h100_ahead_of_gaudi2() -> None:
    """MLPerf Training v4.0 Llama 2 70B LoRA on 8 devices (mlcommons/training_results_v4.0
    @62f111b7): both runs at sequence 8192, global batch 8, LoRA r 16, FP8. Gaudi 2 (Intel,
    HabanaAI DeepSpeed 1.15 + optimum-habana, ZeRO-3 DP 8, full recompute, LoRA on q, k, v, o):
    10.21 s a step, derived from the log's train_loss timestamps; H100 (NVIDIA Eos, NeMo 24.04,
    TP 4 × DP 2, sequence parallel): 3.71 s (8 / 2.1557 samples/s). H100 is 2.75× faster. Gaudi's
    κ comes from Intel's Megatron-DeepSpeed pre-training rows and the DeepSpeed/Megatron ratio
    measured on Ampere; none of this benchmark is fitted. Modelled: Gaudi 2 18.2 s (+78%: the
    Ampere DeepSpeed ratio, from an RL step on eager modules, overshoots Habana's fused kernels),
    H100 4.3 s (+16%; its recompute setting is not read, none assumed)."""
    lora = LoRASpec(rank=16, targets=("q", "k", "v", "o"))
    common = {"method": "lora", "precision": "fp8", "seq_len": 8192, "micro_batch": 1, "global_batch": 8}
    gaudi = trainplan.estimate(
        "llama-2-70b",
        hardware="gaudi2",
        recipe=Recipe(**common, recompute="full", lora=lora, stack="deepspeed"),
        layout=Layout(dp=8, zero=3),
    )
    h100 = trainplan.estimate(
        "llama-2-70b",
        hardware="h100-sxm",
        recipe=Recipe(**common, lora=lora),
        layout=Layout(dp=2, tp=4, sequence_parallel=True),
    )
    assert gaudi.time.step_s > 1.5 * h100.time.step_s  # published 10.21 s / 3.71 s = 2.75
    assert kappa_source("gaudi2", "deepspeed") == "ratio"


def test_seed_claims_follow_from_the_numbers() -> None:
    """The claims section of docs/validation.md: verdicts derived from estimates, not written."""
    from trainplan.validate import claims

    by_claim = {c.claim: c for c in claims.claims()}
    assert len(by_claim) == 5
    mi = claims.mi300x_against_h200()
    assert mi.verdict.startswith("reproduced")
    dgx = claims.dgx_b200_memory()
    assert dgx.verdict.startswith("refuted") and "not unified" in dgx.verdict
    ft = claims.full_finetune_70b()
    assert ft.verdict.startswith("partly refuted") and "8× mi300x" in ft.verdict
    assert "20.78 PFLOP/s" in " ".join(claims.trn2_instance().evidence)
    assert claims.qlora_7b_on_rtx4090().verdict == "reproduced"


def test_docs_kappa_table_quotes_calibration_toml() -> None:
    """docs/timing.md's κ column equals calibration.toml (scripts/regenerate.py rewrites it)."""
    from pathlib import Path

    from trainplan.validate.calibrate import rewrite_kappa_cells

    text = (Path(__file__).resolve().parents[1] / "docs" / "timing.md").read_text(encoding="utf-8")
    table = text.split("<!-- kappa: generated -->\n", 1)[1].split("<!-- end of kappa -->", 1)[0]
    assert table.count("\n| ") >= 10
    assert table == rewrite_kappa_cells(table), (
        "docs/timing.md's κ column is stale: run python scripts/regenerate.py"
    )


def test_stage_gemm_efficiency_weights_every_layer_of_the_stage() -> None:
    """A stage of 1 dense and 26 MoE layers (DeepSeek-V2-Lite) is charged the FLOP-weighted harmonic
    mean over all 27 layers, not over one layer of each kind."""
    from trainplan.efficiency import get_efficiency
    from trainplan.flops import layer_gemms
    from trainplan.timing import _stage_gemm_efficiency

    model = load_model("deepseek-v2-lite")
    layout = Layout(dp=8)
    eff = get_efficiency("tpu-v7")  # packed-group experts: the two kinds differ a lot
    layers = tuple(range(model.num_layers))
    tokens = 8192
    per_layer = []
    for i in layers:
        flops = sum(g.flops for g in layer_gemms(model, i, tokens))
        per_layer.append((flops, _stage_gemm_efficiency(model, (i,), tokens, layout, eff, "bf16")))
    expected = sum(f for f, _ in per_layer) / sum(f / e for f, e in per_layer)
    got = _stage_gemm_efficiency(model, layers, tokens, layout, eff, "bf16")
    assert got == pytest.approx(expected, rel=1e-12)
    dense, moe = per_layer[0][1], per_layer[1][1]
    assert dense != pytest.approx(moe, rel=1e-3)
    one_of_each = (per_layer[0][0] + per_layer[1][0]) / (per_layer[0][0] / dense + per_layer[1][0] / moe)
    assert got != pytest.approx(one_of_each, rel=1e-3)


def test_window_layers_run_at_the_causal_curve_of_their_window() -> None:
    """A banded kernel of window w wastes the masked tile pairs of a causal kernel of length w: with
    every layer local (Mistral 7B v0.1, w 4096) the attention η at s 8192 is the causal curve's at
    4096; with five of six local (Gemma 3) it is the FLOP-weighted harmonic blend of the two."""
    from trainplan.attention import attention_efficiency
    from trainplan.efficiency import get_efficiency
    from trainplan.timing import GENERATION, attention_etas

    h100, eff = get_accelerator("h100-sxm"), get_efficiency("h100-sxm")
    recipe = Recipe(seq_len=8192)
    gen = GENERATION["h100-sxm"]
    at = {n: attention_efficiency(gen, recipe.stack, 128, n) for n in (1024, 4096, 8192)}
    mistral = attention_etas(h100, recipe, eff, load_model("mistral-7b"), 1)
    assert mistral.forward == pytest.approx(at[4096].forward, rel=1e-12)
    assert mistral.backward == pytest.approx(at[4096].backward, rel=1e-12)
    assert any("at length 4096" in n for n in mistral.notes)
    full = attention_etas(h100, recipe, eff, load_model("mistral-7b-v0.2"), 1)
    assert full.forward == pytest.approx(at[8192].forward, rel=1e-12)
    gemma = attention_etas(h100, recipe, eff, load_model("gemma-3-27b"), 1)  # head dim 128, w 1024
    f_local, f_global = 52 * (8192 * 1024 - 1024**2 / 2), 10 * 8192**2 / 2
    blend = (f_local + f_global) / (f_local / at[1024].forward + f_global / at[8192].forward)
    assert gemma.forward == pytest.approx(blend, rel=1e-12)
    assert at[1024].forward < gemma.forward < at[8192].forward
