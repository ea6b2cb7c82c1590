"""The attention-kernel curves: read as published, interpolated, derived and stated."""

from __future__ import annotations

import math
import tomllib
from importlib import resources
from typing import Any

import pytest

from trainplan.attention import attention_efficiency, kernel_for, kernel_fraction, ring_efficiency
from trainplan.hardware import get_accelerator
from trainplan.hardware.system import System
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.predict import estimate
from trainplan.recipe import Recipe


def _doc() -> dict[str, Any]:
    text = (
        resources.files("trainplan.hardware").joinpath("data", "attention.toml").read_text(encoding="utf-8")
    )
    return tomllib.loads(text)


def test_published_points_are_returned_exactly_on_the_h100() -> None:
    doc = _doc()
    peak = doc["peak_tflops"]
    for curve in doc["curve"]:
        for seq, tflops in zip(doc["seq_len"], curve["tflops"], strict=True):
            got, notes = kernel_fraction(
                curve["kernel"], "hopper", curve["pass"], curve["causal"], curve["head_dim"], seq
            )
            assert got == pytest.approx(tflops / peak, rel=1e-12)
            assert not any("extrapolated" in n for n in notes)


def test_sequence_interpolation_is_linear_in_log_seq_and_held_outside() -> None:
    lo, _ = kernel_fraction("fa3", "hopper", "forward", True, 128, 2048)
    hi, _ = kernel_fraction("fa3", "hopper", "forward", True, 128, 4096)
    mid, _ = kernel_fraction("fa3", "hopper", "forward", True, 128, 2048 * math.sqrt(2))
    assert mid == pytest.approx((lo + hi) / 2, rel=1e-12)
    top, _ = kernel_fraction("fa3", "hopper", "forward", True, 128, 16384)
    beyond, notes = kernel_fraction("fa3", "hopper", "forward", True, 128, 131072)
    assert beyond == top and any("extrapolated" in n for n in notes)


def test_unpublished_panels_are_derived_and_said_so() -> None:
    # causal backward = unmasked backward x the forward's causal / unmasked ratio
    got, notes = kernel_fraction("cudnn", "hopper", "backward", True, 128, 4096)
    bwd, _ = kernel_fraction("cudnn", "hopper", "backward", False, 128, 4096)
    fc, _ = kernel_fraction("cudnn", "hopper", "forward", True, 128, 4096)
    fn, _ = kernel_fraction("cudnn", "hopper", "forward", False, 128, 4096)
    assert got == pytest.approx(bwd * fc / fn, rel=1e-12)
    assert any("causal backward" in n and "not published" in n for n in notes)


def test_head_dim_between_published_ones_lies_between_them() -> None:
    a, _ = kernel_fraction("fa2", "hopper", "forward", False, 64, 8192)
    b, _ = kernel_fraction("fa2", "hopper", "forward", False, 128, 8192)
    c, _ = kernel_fraction("fa2", "hopper", "forward", False, 96, 8192)
    assert min(a, b) < c < max(a, b)


def test_kernel_per_stack_and_generation() -> None:
    assert kernel_for("hopper", "megatron")[0] == "cudnn"
    assert kernel_for("hopper", "pytorch")[0] == "fa2"
    assert kernel_for("ampere", "megatron")[0] == "fa2"
    kernel, gen, assumed = kernel_for("cdna3-750w", "megatron")
    assert kernel == "fa2"
    assert gen == "other" and assumed
    assert not kernel_for("ampere", "pytorch")[2] and kernel_for("ada", "pytorch")[2]
    # Blackwell: the H100 curves times GB200's measured fraction relative to H200's
    assert not kernel_for("blackwell", "megatron")[2]
    b, _ = kernel_fraction("cudnn", "blackwell", "forward", True, 128, 8192)
    h, _ = kernel_fraction("cudnn", "hopper", "forward", True, 128, 8192)
    assert b / h == pytest.approx(0.931)


def test_ampere_is_the_published_maximum_over_the_same_kernel_on_h100() -> None:
    """FlashAttention-2 reaches up to 73% of the A100 peak in the forward (Dao 2023)."""
    best = max(
        kernel_fraction("fa2", "ampere", "forward", c, d, s)[0]
        for c in (True, False)
        for d in (64, 128)
        for s in _doc()["seq_len"]
    )
    assert best == pytest.approx(0.73, abs=0.002)


def test_ring_attention_mixes_masked_and_unmasked_blocks() -> None:
    assert ring_efficiency(0.4, 0.6, 1) == pytest.approx(0.4)
    assert 0.4 < ring_efficiency(0.4, 0.6, 16) < 0.6
    cp16 = attention_efficiency("hopper", "megatron", 128, 131072, 16)
    full, _ = kernel_fraction("cudnn", "hopper", "forward", False, 128, 8192)
    masked, _ = kernel_fraction("cudnn", "hopper", "forward", True, 128, 8192)
    assert cp16.forward == pytest.approx(1 / ((1 / 16) / masked + (15 / 16) / full), rel=1e-12)
    assert any("cp=16" in n for n in cp16.notes)


def test_short_sequences_cost_more_attention_time_per_flop_than_long_ones() -> None:
    short = attention_efficiency("hopper", "pytorch", 128, 512)
    long = attention_efficiency("hopper", "pytorch", 128, 8192)
    assert short.forward < long.forward and short.backward < long.backward
    assert long.backward < long.forward  # the published backward is slower per FLOP


def test_estimate_states_assumed_attention_curves() -> None:
    sysm = System(accelerator=get_accelerator("mi300x"), num_devices=8)
    e = estimate(sysm, load_model("llama-3.1-8b"), Recipe(seq_len=8192, global_batch=8), Layout(dp=8))
    assert any("attention kernel efficiency: assumed" in n for n in e.time.notes)
    sysm = System(accelerator=get_accelerator("h100-sxm"), num_devices=8)
    e = estimate(sysm, load_model("llama-3.1-8b"), Recipe(seq_len=8192, global_batch=8), Layout(dp=8))
    assert not any("attention kernel efficiency" in n for n in e.time.notes)


def test_triton_kernel_is_fa2_times_the_published_ratio_on_ampere() -> None:
    ratio = next(r for r in _doc()["ratio"] if r["kernel"] == "triton")
    # Dao 2023 Sec. 4.1: FlashAttention-2 around 1.3-1.5x the Triton kernel forward, around 2x backward
    assert 1 / 1.5 <= ratio["forward"] <= 1 / 1.3 and ratio["backward"] == pytest.approx(0.5)
    for seq in (512, 2048, 16384):
        fa2 = attention_efficiency("ampere", "pytorch", 128, seq)
        tri = attention_efficiency("ampere", "pytorch", 128, seq, kernel="triton")
        assert tri.forward == pytest.approx(fa2.forward * ratio["forward"])
        assert tri.backward == pytest.approx(fa2.backward * ratio["backward"])
        assert tri.kernel == "triton" and not tri.assumed
        assert any("arXiv:2307.08691" in n for n in tri.notes)


def test_triton_kernel_without_a_published_ratio_is_charged_as_fa2_and_said_so() -> None:
    fa2 = attention_efficiency("hopper", "pytorch", 128, 4096)
    tri = attention_efficiency("hopper", "pytorch", 128, 4096, kernel="triton")
    assert (tri.forward, tri.backward) == (fa2.forward, fa2.backward)
    assert tri.assumed and any("no published figure" in n for n in tri.notes)


def test_triton_attention_slows_the_a100_step_most_at_long_sequences() -> None:
    sysm = System(accelerator=get_accelerator("a100-80gb"), num_devices=8)
    model = load_model("llama-2-7b")
    share = []
    for seq in (1024, 16384):
        base = Recipe(seq_len=seq, global_batch=8, stack="pytorch")
        tri = Recipe(seq_len=seq, global_batch=8, stack="pytorch", triton_attention=True)
        t0 = estimate(sysm, model, base, Layout(dp=8, zero=3)).time.step_s
        t1 = estimate(sysm, model, tri, Layout(dp=8, zero=3)).time.step_s
        assert t1 > t0
        share.append(t1 / t0)
    assert share[1] > share[0]


def test_triton_attention_needs_flash_attention() -> None:
    from trainplan.errors import RecipeError

    with pytest.raises(RecipeError, match="triton_attention"):
        Recipe(attention="eager", triton_attention=True)
