"""Alpha-beta collective times, group placement and per-step traffic."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trainplan import comm as C
from trainplan.errors import CatalogError, LayoutError, TrainplanError
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec, MoESpec
from trainplan.recipe import Recipe

GB = 1e9


@dataclass(frozen=True)
class FakeLink:
    bandwidth_bytes_per_s: float
    latency_s: float
    domain_size: int = 8


@dataclass(frozen=True)
class FakeSystem:
    """Duck-typed stand-in for hardware.System (same attribute names)."""

    num_devices: int
    scale_up_domain: int = 8
    devices_per_node: int = 8
    scale_up: FakeLink = FakeLink(450 * GB, 2e-6)
    scale_out: FakeLink | None = FakeLink(50 * GB, 8e-6)


UP = C.LinkLevel(bandwidth_bytes_per_s=400 * GB, latency_s=2e-6)
OUT = C.LinkLevel(bandwidth_bytes_per_s=50 * GB, latency_s=8e-6)


# --- primitives ------------------------------------------------------------------------------
def test_ring_all_reduce_known_value() -> None:
    """1 GB over 8 ranks at 100 GB/s: 2·7/8 · 1e9 / 1e11 = 17.5 ms, plus 2·7 latency steps."""
    assert C.all_reduce_s(1 * GB, 8, 100 * GB, 0.0) == pytest.approx(17.5e-3)
    assert C.all_reduce_s(1 * GB, 8, 100 * GB, 5e-6) == pytest.approx(17.5e-3 + 14 * 5e-6)
    assert C.all_reduce_s(1 * GB, 8, 100 * GB, 0.0, efficiency=0.5) == pytest.approx(35e-3)


def test_half_collectives_and_all_to_all() -> None:
    ar = C.all_reduce_s(1 * GB, 8, 100 * GB, 1e-6)
    rs = C.reduce_scatter_s(1 * GB, 8, 100 * GB, 1e-6)
    ag = C.all_gather_s(1 * GB, 8, 100 * GB, 1e-6)
    assert rs == ag == pytest.approx(ar / 2)
    assert C.all_to_all_s(1 * GB, 8, 100 * GB, 1e-6) == pytest.approx(ag)
    assert C.send_recv_s(1 * GB, 100 * GB, 1e-6) == pytest.approx(10e-3 + 1e-6)
    assert C.all_reduce_s(1 * GB, 1, 100 * GB, 1e-6) == 0.0


def test_monotonicity() -> None:
    sizes = [1e3, 1e6, 1e8, 1e10]
    times = [C.all_reduce_s(x, 8, 100 * GB, 1e-6) for x in sizes]
    assert times == sorted(times)
    groups = [2, 4, 8, 64, 1024]
    times = [C.all_reduce_s(1 * GB, n, 100 * GB, 1e-6) for n in groups]
    assert times == sorted(times)
    bws = [10 * GB, 100 * GB, 1000 * GB]
    times = [C.all_gather_s(1 * GB, 8, bw, 1e-6) for bw in bws]
    assert times == sorted(times, reverse=True)


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(TrainplanError, match="bandwidth_bytes_per_s"):
        C.all_reduce_s(1.0, 8, 0.0, 1e-6)
    with pytest.raises(TrainplanError, match="efficiency"):
        C.all_gather_s(1.0, 8, 1.0, 0.0, efficiency=1.5)


def test_bus_factors_follow_nccl_tests() -> None:
    assert C.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert C.bus_factor("reduce_scatter", 8) == C.bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert C.bus_factor("send_recv", 2) == 1.0


# --- hierarchical ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"])
def test_hierarchical_reduces_to_flat(kind: C.CollectiveKind) -> None:
    n, nb = 8, 3 * GB
    inside = C.hierarchical_s(kind, nb, n, n, UP, OUT)
    flat_up = C._flat_s(
        kind, nb, 2 if kind == "send_recv" else n, UP.bandwidth_bytes_per_s, UP.latency_s, 1.0
    )
    assert inside == pytest.approx(flat_up)
    across = C.hierarchical_s(kind, nb, n, 1, UP, OUT)
    flat_out = C._flat_s(
        kind, nb, 2 if kind == "send_recv" else n, OUT.bandwidth_bytes_per_s, OUT.latency_s, 1.0
    )
    assert across == pytest.approx(flat_out)


def test_hierarchical_all_reduce_formula_and_benefit() -> None:
    nb, n, local = 1 * GB, 64, 8
    t = C.hierarchical_all_reduce_s(
        nb,
        n,
        local,
        scale_up_bandwidth_bytes_per_s=400 * GB,
        scale_up_latency_s=0.0,
        scale_out_bandwidth_bytes_per_s=50 * GB,
        scale_out_latency_s=0.0,
    )
    expected = 2 * 7 / 8 * nb / (400 * GB) + 2 * 7 / 8 * (nb / 8) / (50 * GB)
    assert t == pytest.approx(expected)
    assert t < C.all_reduce_s(nb, n, 50 * GB, 0.0)  # better than a flat ring over scale-out


# --- placement -------------------------------------------------------------------------------
def test_tp8_on_8_gpu_nodes_uses_scale_up_and_dp_scale_out() -> None:
    p = C.group_placement(Layout(dp=4, tp=8), FakeSystem(num_devices=32))
    assert p["tp"].level == "scale_up" and not p["tp"].spans_domains
    assert p["dp"].level == "scale_out" and p["dp"].ranks_per_domain == 1 and p["dp"].domains == 4
    assert p["shard"].level == "scale_out"
    assert p["pp"].level == "none"


def test_tp16_on_8_gpu_nodes_spans_domains() -> None:
    p = C.group_placement(Layout(dp=2, tp=16), FakeSystem(num_devices=32))
    assert p["tp"].spans_domains and p["tp"].level == "hierarchical"
    assert p["tp"].ranks_per_domain == 8 and p["tp"].domains == 2


def test_dp_partly_inside_the_node_is_hierarchical() -> None:
    p = C.group_placement(Layout(dp=8, tp=2), FakeSystem(num_devices=16))
    assert p["dp"].level == "hierarchical" and p["dp"].ranks_per_domain == 4 and p["dp"].domains == 2


def test_nvl72_keeps_dp_inside_the_domain_and_pp_crosses() -> None:
    system = FakeSystem(num_devices=144, scale_up_domain=72, devices_per_node=4)
    p = C.group_placement(Layout(dp=9, tp=8, pp=2), system)
    assert p["dp"].level == "scale_up" and p["pp"].level == "scale_out"


def test_ep_and_cp_strides() -> None:
    p = C.group_placement(Layout(dp=8, tp=2, cp=2, ep=4), FakeSystem(num_devices=32))
    assert p["cp"].stride == 2 and p["cp"].level == "scale_up"
    assert p["ep"].stride == 2 and p["ep"].level == "scale_up"
    assert p["expert_dp"].size == 4 and p["expert_dp"].stride == 8 and p["expert_dp"].level == "scale_out"
    assert p["shard"].size == 16


def test_domain_is_capped_by_device_count_and_mismatch_is_an_error() -> None:
    assert C.domain_size(FakeSystem(num_devices=4)) == 4
    with pytest.raises(LayoutError, match="devices"):
        C.group_placement(Layout(dp=4), FakeSystem(num_devices=8))


def test_network_from_system_defaults_and_overrides() -> None:
    net = C.network_from_system(FakeSystem(num_devices=16))
    assert net.scale_up.efficiency == C.SCALE_UP_EFFICIENCY
    assert net.scale_out is not None and net.scale_out.efficiency == C.SCALE_OUT_EFFICIENCY
    assert net.scale_up.latency_s == 2e-6
    net = C.network_from_system(FakeSystem(num_devices=16), scale_up_efficiency=1.0)
    assert net.scale_up.efficiency == 1.0
    lonely = C.network_from_system(FakeSystem(num_devices=16, scale_out=None))
    with pytest.raises(CatalogError, match="scale_out"):
        lonely.time_s("all_reduce", GB, C.place_group("dp", 2, 8, 8))


# --- traffic -------------------------------------------------------------------------------
NET = C.Network(scale_up=UP, scale_out=OUT)


def _dp_wire(zero: int, m: int = 1) -> float:
    psi = 1e9  # bytes of BF16 weights (and gradients) on the device
    shard = C.place_group("shard", 16, 8, 8)
    cols = C.data_parallel_collectives(
        zero=zero, param_bytes=psi, grad_bytes=psi, micro_batches=m, shard=shard, network=NET
    )
    return sum(c.wire_bytes for c in cols)


def test_zero_volumes_match_the_paper_ratios() -> None:
    """ZeRO Sec. 7: DDP and ZeRO-1/2 move 2Ψ, ZeRO-3 moves 3Ψ (×(n−1)/n on a ring)."""
    ddp = _dp_wire(0)
    assert ddp == pytest.approx(2 * 1e9 * 15 / 16)
    assert _dp_wire(1) == pytest.approx(ddp)
    assert _dp_wire(2) == pytest.approx(ddp)
    assert _dp_wire(3) / ddp == pytest.approx(1.5)
    # with gradient accumulation ZeRO-3 gathers and scatters every micro-batch, DDP once
    assert _dp_wire(3, m=4) == pytest.approx(4 * _dp_wire(3))
    assert _dp_wire(0, m=4) == pytest.approx(ddp)


def test_zero3_overlap_labels() -> None:
    cols = C.data_parallel_collectives(
        zero=3,
        param_bytes=1.0,
        grad_bytes=1.0,
        micro_batches=1,
        shard=C.place_group("s", 8, 1, 8),
        network=NET,
    )
    assert [(c.kind, c.overlappable_with) for c in cols] == [
        ("all_gather", "forward"),
        ("all_gather", "backward"),
        ("reduce_scatter", "backward"),
    ]


def test_tp_sequence_parallel_same_volume_plus_backward_regather() -> None:
    """SP turns each all-reduce into all-gather + reduce-scatter (same volume) and adds the backward
    re-gather of the column-parallel inputs (Korthikanti et al. 2022 Sec. 4.2.2)."""
    tp = C.place_group("tp", 8, 1, 8)
    act = 2 * 4096 * 8192 * 2.0
    ar, sp = (
        C.tensor_parallel_collectives(
            activation_bytes=act,
            layers=4,
            micro_batches=2,
            recompute="none",
            sequence_parallel=seq,
            tp=tp,
            network=NET,
        )
        for seq in (False, True)
    )
    assert len(ar) == 2 and len(sp) == 5
    assert ar[0].calls == 2 * 4 * 2  # 2 per layer per micro-batch
    regather = [c for c in sp if c.name == "tp_backward_input_regather"]
    assert len(regather) == 1 and regather[0].kind == "all_gather" and regather[0].calls == 2 * 4 * 2
    rest = [c for c in sp if c.name != "tp_backward_input_regather"]
    assert sum(c.wire_bytes for c in ar) == pytest.approx(sum(c.wire_bytes for c in rest))
    assert sum(c.time_s for c in ar) == pytest.approx(sum(c.time_s for c in rest))
    full = C.tensor_parallel_collectives(
        activation_bytes=1.0,
        layers=1,
        micro_batches=1,
        sequence_parallel=False,
        recompute="full",
        tp=tp,
        network=NET,
    )
    assert [c.name for c in full] == [
        "tp_forward_all_reduce",
        "tp_backward_all_reduce",
        "tp_recompute_all_reduce",
    ]


def test_step_collectives_for_a_moe_layout() -> None:
    spec = ModelSpec(
        name="moe",
        family="mixtral",
        num_layers=8,
        hidden_size=1024,
        num_heads=16,
        num_kv_heads=4,
        head_dim=64,
        ffn_hidden=0,
        vocab_size=32000,
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=2048),
    )
    layout = Layout(dp=4, tp=2, pp=2, cp=2, ep=4, zero=1, sequence_parallel=True)
    system = FakeSystem(num_devices=32)
    recipe = Recipe(seq_len=4096, micro_batch=1, global_batch=16)
    cols = C.step_collectives(
        spec,
        recipe,
        layout,
        C.network_from_system(system),
        C.group_placement(layout, system),
        dense_params=2e8,
        expert_params=1.6e9,
        micro_batches=4,
    )
    names = {c.name for c in cols}
    assert {"dp_grad_reduce_scatter", "expert_dp_param_all_gather", "pp_send_recv"} <= names
    assert {"ep_forward_all_to_all", "cp_forward_kv", "tp_forward_all_gather"} <= names
    ep = next(c for c in cols if c.name == "ep_forward_all_to_all")
    # local tokens b·s/(cp·tp) · K · h · 2 bytes, 2 all-to-alls per MoE layer (4 per stage) per micro-batch
    assert ep.buffer_bytes == pytest.approx(4096 / 4 * 2 * 1024 * 2)
    assert ep.calls == 2 * 4 * 4
    assert all(c.time_s > 0 for c in cols)
    cp = next(c for c in cols if c.name == "cp_forward_kv")
    assert cp.overlappable_with == "forward" and cp.calls == (2 - 1) * 4 * 4


def test_works_with_the_hardware_catalog_system() -> None:
    hardware = pytest.importorskip("trainplan.hardware")
    system_mod = pytest.importorskip("trainplan.hardware.system")
    try:
        accelerator = hardware.get_accelerator("h100-sxm")
    except CatalogError as err:  # the catalog is data; this test only checks the attribute names
        pytest.skip(f"catalog not loadable: {err}")
    system = system_mod.System(accelerator=accelerator, num_devices=16)
    placement = C.group_placement(Layout(dp=2, tp=8), system)
    assert placement["tp"].level == "scale_up" and placement["dp"].level == "scale_out"
    net = C.network_from_system(system)
    assert net.scale_out is not None
    assert net.time_s("all_reduce", GB, placement["dp"]) > net.time_s("all_reduce", GB, placement["tp"])


# --- NCCL ring latency and ZeRO-3 granularity -------------------------------------------------
@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_spanning_ring_pays_nccls_step_latencies(kind: C.CollectiveKind) -> None:
    """NCCL's ring over n ranks, n_l per domain: (n − n_o)·α_up + (n_o − 1)·α_out (tuning.cc)."""
    fast_up = C.LinkLevel(bandwidth_bytes_per_s=1e30, latency_s=2e-6)
    fast_out = C.LinkLevel(bandwidth_bytes_per_s=1e30, latency_s=8e-6)
    n, n_l = 64, 8
    n_o = n // n_l
    t = C.hierarchical_s(kind, 1.0, n, n_l, fast_up, fast_out)
    assert t == pytest.approx((n - n_o) * 2e-6 + (n_o - 1) * 8e-6, rel=1e-12)
    # one rank per domain or one domain: the flat ring's (n − 1) steps on that link
    assert C.hierarchical_s(kind, 1.0, n, 1, fast_up, fast_out) == pytest.approx((n - 1) * 8e-6)
    assert C.hierarchical_s(kind, 1.0, n_l, n_l, fast_up, fast_up) == pytest.approx((n_l - 1) * 2e-6)


def test_zero3_gather_units() -> None:
    from dataclasses import replace

    from trainplan.models import load_model

    spec = replace(load_model("gpt-22b"), num_layers=10)  # Megatron GPT: biases, LayerNorm, tied
    assert C.zero3_gather_units(spec, Layout(dp=8, zero=3)) == 10 + 1
    assert C.zero3_gather_units(spec, Layout(dp=2, pp=4, zero=3)) == 3 + 1  # ⌈10/4⌉ blocks
    per_param = Layout(dp=8, zero=3, zero3_granularity="parameter")
    # Megatron GPT layer: qkv w+b, proj w+b, 2 LayerNorms w+b, fc1 w+b, fc2 w+b = 12;
    # root: word + position embeddings, final LayerNorm w+b (head tied) = 4
    assert C.zero3_gather_units(spec, per_param) == 12 * 10 + 4


def test_per_parameter_vectors_are_gathered_on_their_own() -> None:
    """Biases and norms are one-dimensional tensors of a few kilobytes, each its own call."""
    from dataclasses import replace

    from trainplan.models import load_model

    spec = replace(load_model("gpt-22b"), num_layers=10)
    h = spec.hidden_size
    # per layer: qkv (3h), proj (h), fc1 (4h), fc2 (h) biases and two LayerNorms (w + b): 8 tensors
    assert C.gather_vectors(spec, 10, "parameter") == (
        8 * 10 + 2,
        10 * (3 * h + h + 4 * h + h + 4 * h) + 2 * h,
    )
    assert C.gather_vectors(spec, 10, "block") == (0, 0.0)
    llama = load_model("llama-3-8b")
    assert C.gather_vectors(llama, 1, "parameter") == (2 + 1, 2 * llama.hidden_size + llama.hidden_size)


def test_splitting_out_the_vectors_keeps_the_volume_and_the_call_count() -> None:
    kw = dict(zero=3, param_bytes=4e9, grad_bytes=4e9, micro_batches=2, shard_size=64, gather_units=122)
    whole = C.data_parallel_traffic(**kw, granularity="parameter")  # type: ignore[arg-type]
    split = C.data_parallel_traffic(
        **kw,  # type: ignore[arg-type]
        granularity="parameter",
        vector_units=82,
        vector_fraction=1e-4,
    )
    for kind in ("all_gather", "reduce_scatter"):
        for agg in (lambda t: float(t.calls) * float(t.buffer_bytes), lambda t: float(t.calls)):
            a = sum(agg(t) for t in whole if t.kind == kind)
            b = sum(agg(t) for t in split if t.kind == kind)
            assert b == pytest.approx(a, rel=1e-12)
    vectors = [t for t in split if "vector" in t.name and float(t.calls) > 0]
    assert vectors and all(float(t.buffer_bytes) == pytest.approx(4e9 * 1e-4 / 82) for t in vectors)


def test_per_parameter_granularity_only_with_zero3() -> None:
    with pytest.raises(LayoutError, match="--zero 3"):
        Layout(dp=8, zero=2, zero3_granularity="parameter")
    with pytest.raises(LayoutError, match="choose block, parameter"):
        Layout(dp=8, zero=3, zero3_granularity="bucket")  # type: ignore[arg-type]


def test_zero3_units_add_latency_not_volume() -> None:
    shard = C.place_group("s", 64, 1, 8)
    kw = dict(zero=3, param_bytes=4e9, grad_bytes=4e9, micro_batches=2, shard=shard, network=NET)
    one = C.data_parallel_collectives(**kw)  # type: ignore[arg-type]
    many = C.data_parallel_collectives(**kw, gather_units=33)  # type: ignore[arg-type]
    for a, b in zip(one, many, strict=True):
        assert b.wire_bytes == pytest.approx(a.wire_bytes)
        assert b.calls == 33 * a.calls
        per_call_latency = NET.time_s(a.kind, 1e-30, shard)
        assert b.time_s - a.time_s == pytest.approx(32 * a.calls * per_call_latency, rel=1e-9)


def test_per_parameter_gathers_are_waited_on_and_regathered_for_recompute() -> None:
    shard = C.place_group("s", 64, 1, 8)
    kw = dict(zero=3, param_bytes=4e9, grad_bytes=4e9, micro_batches=1, shard=shard, network=NET)
    block = C.data_parallel_collectives(**kw, gather_units=100)  # type: ignore[arg-type]
    hbm = 2e12
    per_param = C.data_parallel_collectives(
        **kw,  # type: ignore[arg-type]
        gather_units=100,
        granularity="parameter",
        regather_for_recompute=True,
        device_bytes_per_s=hbm,
    )
    assert [(c.kind, c.overlappable_with) for c in per_param] == [
        ("all_gather", "none"),
        ("all_gather", "none"),  # the reentrant recompute's forward hooks gather again
        ("all_gather", "none"),
        ("reduce_scatter", "none"),  # the next fetch's device synchronize waits for it
    ]
    # each list-based call copies one tensor per rank in or out of the flat buffer, and streams
    # its buffer through device memory (zero-fill / list copies / in-place average)
    extra = per_param[-1].time_s - block[-1].time_s
    streamed = 100 * C.PER_PARAMETER_REDUCE_SCATTER_DEVICE_BYTES * (4e9 / 100) / hbm
    assert extra == pytest.approx(100 * 64 * C.LIST_COLLECTIVE_COPY_S + streamed)
    gathered = per_param[0].time_s - block[0].time_s
    assert gathered == pytest.approx(
        100 * 64 * C.LIST_COLLECTIVE_COPY_S + C.PER_PARAMETER_GATHER_DEVICE_BYTES * 4e9 / hbm
    )


def test_per_parameter_traffic_needs_the_device_memory_bandwidth() -> None:
    shard = C.place_group("s", 64, 1, 8)
    with pytest.raises(TrainplanError, match="device_bytes_per_s"):
        C.data_parallel_collectives(
            zero=3,
            param_bytes=4e9,
            grad_bytes=4e9,
            micro_batches=1,
            shard=shard,
            network=NET,
            gather_units=100,
            granularity="parameter",
        )


# --- NCCL protocols ---------------------------------------------------------------------------
_NV_UP = (300e9, 0.47e-6, 0.8)
_NV_OUT = (25e9, 2.7e-6, 0.85)


def _by_protocol(kind: C.CollectiveKind, n_bytes: float, n: int, n_l: int) -> dict[str, float]:
    out = {}
    for p in C.NCCL_RING_PROTOCOLS:
        up, net = C._protocol_links(p, kind, n, n_l, _NV_UP, _NV_OUT)
        out[p.name] = float(C.collective_time_s(kind, n_bytes, n, n_l, up, net)) + p.base_latency_s
    return out


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_reduce"])
def test_nccl_takes_the_fastest_protocol_per_message_size(kind: C.CollectiveKind) -> None:
    """tuning.cc: the tuner times LL, LL128 and Simple and runs the fastest."""
    n, n_l = 384, 8
    for n_bytes in (2.4e4, 1e6, 3e8, 3e9):
        t = float(C.collective_time_s(kind, n_bytes, n, n_l, _NV_UP, _NV_OUT, True))
        assert t == pytest.approx(min(_by_protocol(kind, n_bytes, n, n_l).values()), rel=1e-12)
    small = _by_protocol(kind, 2.4e4, n, n_l)
    assert min(small, key=small.__getitem__) == "LL"  # a bias: latency-bound
    large = _by_protocol(kind, 3e9, n, n_l)
    assert min(large, key=large.__getitem__) != "LL"  # LL's quarter bandwidth loses on volume


def test_nccl_protocols_raise_the_per_call_latency_of_large_rings() -> None:
    """Against one LL latency per step, a large message pays LL128's or Simple's step latency,
    which grows with the ring: at thousands of ranks it is milliseconds per call."""
    for n in (384, 2240):
        plain = float(C.collective_time_s("all_gather", 3e8, n, 8, _NV_UP, _NV_OUT))
        nccl = float(C.collective_time_s("all_gather", 3e8, n, 8, _NV_UP, _NV_OUT, True))
        assert nccl > plain
    gap = {
        n: float(C.collective_time_s("all_gather", 3e8, n, 8, _NV_UP, _NV_OUT, True))
        - float(C.collective_time_s("all_gather", 3e8, n, 8, _NV_UP, _NV_OUT))
        for n in (384, 2240)
    }
    assert gap[2240] > 3 * gap[384]
    # one domain, one latency per step: the protocols never pay more than LL's latency + Simple's bandwidth
    one = C.collective_time_s("all_gather", 1.0, 8, 8, _NV_UP, _NV_UP, True)
    assert one == pytest.approx(min(_by_protocol("all_gather", 1.0, 8, 8).values()))


def test_nccl_protocols_are_on_for_nvlink_gpus_only() -> None:
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System

    assert C.network_from_system(System(accelerator=get_accelerator("a100-80gb"), num_devices=16)).protocols
    tpu = get_accelerator("tpu-v5p")
    assert not C.network_from_system(System(accelerator=tpu, num_devices=16)).protocols
    # point-to-point and all-to-all keep one latency per step
    for kind in ("send_recv", "all_to_all"):
        assert C.collective_time_s(kind, 1e6, 16, 8, _NV_UP, _NV_OUT, True) == C.collective_time_s(
            kind, 1e6, 16, 8, _NV_UP, _NV_OUT
        )


def test_per_parameter_zero3_is_slower_and_scales_worse() -> None:
    """At fixed global batch, per-parameter ZeRO-3's exposed traffic grows with the rank count."""
    from trainplan.hardware import get_accelerator
    from trainplan.hardware.system import System
    from trainplan.models import load_model
    from trainplan.predict import estimate

    spec = load_model("gpt-22b")
    steps = {}
    for n in (128, 512):
        mb = 512 // n
        r = Recipe(seq_len=2048, micro_batch=mb, global_batch=512, recompute="full", precision="fp16")
        for g in ("block", "parameter"):
            lay = Layout(dp=n, zero=3, zero3_granularity=g)  # type: ignore[arg-type]
            e = estimate(System(accelerator=get_accelerator("a100-80gb"), num_devices=n), spec, r, lay)
            steps[n, g] = e.time.step_s
    for n in (128, 512):
        assert steps[n, "parameter"] > steps[n, "block"]
    # block: 4x the devices cut the step; per parameter the saving is smaller
    assert steps[512, "parameter"] / steps[128, "parameter"] > steps[512, "block"] / steps[128, "block"]


def test_early_stop_skips_the_recomputed_down_projection_reduction() -> None:
    """PyTorch's early stop does not rerun a dense block's down projection, nor its TP reduction."""
    from trainplan.models import load_model

    spec = load_model("llama-3.2-1b")
    system = FakeSystem(num_devices=8)
    layout = Layout(dp=2, tp=4, sequence_parallel=True)
    placements = C.group_placement(layout, system)
    net = C.network_from_system(system)
    whole = Recipe(seq_len=2048, micro_batch=1, global_batch=4, recompute="full")
    early = Recipe(seq_len=2048, micro_batch=1, global_batch=4, recompute="full", recompute_early_stop=True)
    assert C.recompute_skipped_tp_reductions(spec, early, spec.num_layers) == spec.num_layers
    assert C.recompute_skipped_tp_reductions(spec, whole, spec.num_layers) == 0
    fp8 = Recipe(precision="fp8", recompute="full", recompute_early_stop=True)
    assert C.recompute_skipped_tp_reductions(spec, fp8, spec.num_layers) == 0  # the float8 linear saves last

    def calls(recipe: Recipe) -> dict[str, float]:
        cols = C.step_collectives(spec, recipe, layout, net, placements, dense_params=1.2e9, micro_batches=2)
        return {c.name: c.calls for c in cols if c.group == "tp"}

    a, b = calls(whole), calls(early)
    assert a["tp_recompute_reduce_scatter"] - b["tp_recompute_reduce_scatter"] == spec.num_layers * 2
    assert a["tp_recompute_all_gather"] == b["tp_recompute_all_gather"]
    assert a["tp_forward_reduce_scatter"] == b["tp_forward_reduce_scatter"]


def test_zero1_regathers_only_the_trainable_parameters() -> None:
    """ZeRO-1/2 all-gather the parameters the optimizer step changed: with frozen base weights
    (PEFT) only the adapters, with full training every weight; gradients follow the same count."""
    spec = ModelSpec(
        name="dense",
        family="llama",
        num_layers=8,
        hidden_size=1024,
        num_heads=16,
        num_kv_heads=4,
        head_dim=64,
        ffn_hidden=4096,
        vocab_size=32000,
    )
    layout = Layout(dp=8, zero=1)
    system = FakeSystem(num_devices=8)
    recipe = Recipe(seq_len=2048, micro_batch=1, global_batch=8)

    def buffers(trainable: float | None) -> dict[str, float]:
        cols = C.step_collectives(
            spec,
            recipe,
            layout,
            C.network_from_system(system),
            C.group_placement(layout, system),
            dense_params=1e9,
            trainable_dense_params=trainable,
        )
        return {c.name: c.buffer_bytes for c in cols}

    full, peft = buffers(None), buffers(1e7)
    assert full["dp_param_all_gather"] == pytest.approx(1e9 * 2)  # bf16 weights
    assert peft["dp_param_all_gather"] == pytest.approx(1e7 * 2)
    assert peft["dp_param_all_gather"] == pytest.approx(peft["dp_grad_reduce_scatter"])
