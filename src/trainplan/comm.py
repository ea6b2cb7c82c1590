"""Collective communication times on a two-level network, and the traffic of each parallelism.

Cost model
----------
Alpha-beta (Hockney) model per collective: ``time = steps·α + volume / (β_peak·efficiency)``,
with ``α`` the per-step latency (``latency_s``), ``β_peak`` the link bandwidth per chip in one
direction (``bandwidth_bytes_per_s``) and ``efficiency`` the fraction of it a collective library
achieves. ``n_bytes`` is always the **full, unsharded buffer** of one rank (the nccl-tests
convention: the all-reduce buffer, the all-gather output, the reduce-scatter input, the all-to-all
send buffer), and ``group`` the number of ranks ``n``:

    kind            per-rank volume on the wire        steps        source
    all-reduce      2(n−1)/n · n_bytes                 2(n−1)       ring = reduce-scatter + all-gather
    reduce-scatter  (n−1)/n · n_bytes                  n−1          ring / pairwise
    all-gather      (n−1)/n · n_bytes                  n−1          ring
    all-to-all      (n−1)/n · n_bytes                  n−1          pairwise exchange
    send/recv       n_bytes                            1            point to point

Sources: Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations
in MPICH" (IJHPCA 19(1)), Sec. 4 (ring all-gather, pairwise reduce-scatter and all-to-all,
all-reduce as reduce-scatter + all-gather); Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations" (JPDC 69(2)): 2(n−1)/n·n_bytes is the lower bound the ring
attains; the volume factors are the "bus bandwidth" factors of NVIDIA/nccl-tests
``doc/PERFORMANCE.md`` (all-reduce 2(n−1)/n; reduce-scatter, all-gather, all-to-all (n−1)/n).

Two levels
----------
A *scale-up domain* (NVLink/NVSwitch node, NVL72 rack, TPU ICI slice, NeuronLink, xGMI) is a set of
consecutive ranks with fast links; *scale-out* (InfiniBand, EFA, RoCE) joins domains, each chip
through its own NIC (rail-optimised). A group that lies inside one domain uses scale-up; a group
with one rank per domain uses scale-out; a group with ``n_local > 1`` ranks in each of several
domains uses the **hierarchical** (2D) algorithm: reduce-scatter inside the domain, all-reduce of
the ``1/n_local`` shard across domains (each rank over its own NIC, concurrently), all-gather inside
the domain (Jia et al. 2018, "Highly Scalable Deep Learning Training System with Mixed-Precision",
hierarchical all-reduce; Ying et al. 2018, 2D all-reduce on TPU pods). NCCL chooses between ring,
tree, NVLS and CollNet at run time; modelling every collective as ring / hierarchical ring is a
simplification (NVLS all-reduce on 8 H100 reaches a higher bus bandwidth than the ring).

Protocols (NCCL)
----------------
On a network that NCCL drives (``Network.protocols``: NVIDIA GPUs with NVLink), every ring
all-reduce, all-gather and reduce-scatter is timed under each of NCCL's three protocols and the
fastest is taken, as NCCL's own tuner does per message size (NVIDIA/nccl ``src/graph/tuning.cc``
``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``, @01afd20; protocols described in Hu et al. 2025,
"Demystifying NCCL", arXiv:2507.04786, Sec. 4): ``LL`` (8-byte flag+data lines: lowest latency,
a quarter of the bandwidth across nodes, a third inside one), ``LL128`` (128-byte lines, 120 bytes
of data: 0.92 of the bandwidth, 0.7 with one rank per node) and ``Simple`` (full bandwidth, the
highest per-step latency). Per step the latency of a protocol is the catalog's (NCCL's LL value)
times ``hwLat[protocol] / hwLat[LL]`` of that link type, plus the protocol's base latency
(:data:`NCCL_RING_PROTOCOLS`). Small messages are latency-bound and go LL; large ones pay the
higher per-step latency of LL128 or Simple, which at hundreds of ranks is milliseconds per call.
Not modelled: the per-channel LL128 bandwidth cap (``ll128MaxBwPerCh``), tree all-reduce, the
Simple ring "plateau" factor. Send/recv and all-to-all (grouped point-to-point) keep one latency.

Rank order
----------
Megatron-LM's default order ``tp-cp-ep-dp-pp``: tp varies fastest, then cp, then dp (ep is carved
out of dp·cp, inner-most first), then pp. So tp groups are consecutive ranks, cp groups have stride
tp, the ZeRO/FSDP shard group dp·cp has stride tp, the ep group (ep consecutive members of dp·cp)
stride tp, the expert-data group stride tp·ep, the dp group stride tp·cp and pp stride tp·cp·dp.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from trainplan.dtypes import BYTES_PER_ELEMENT
from trainplan.errors import CatalogError, LayoutError, TrainplanError
from trainplan.flops import expert_slot_ratio
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.num import Bool, Int, Num, as_float, ceil_div, logical_not, maximum, minimum, where
from trainplan.recipe import Recipe, repeats_attention, reruns_forward_hooks

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]
Level = Literal["none", "scale_up", "scale_out", "hierarchical"]
Overlap = Literal["forward", "backward", "none"]

# Fraction of the one-direction link peak that NCCL reaches as bus bandwidth on large messages.
# Scale-up: NVIDIA/nccl-tests#149 (A100 NVLink3: 12 links x 25 GB/s = 300 GB/s line rate, ~240 GB/s
# effective with 128-byte payloads, ~230 GB/s busbw reached -> 0.77) and NVIDIA/nccl-tests#212 /
# NVIDIA/nccl#1455 (H100 NVLink4: 450 GB/s line rate, 365-370 GB/s ring busbw -> 0.82). 0.80 is
# their mean. NVLink SHARP all-reduce (H100: ~480 GB/s busbw on 8 GPUs) is not modelled.
SCALE_UP_EFFICIENCY: Final = 0.80
# Scale-out: NVIDIA/nccl-tests#119 (3 nodes x 8 A100, 4x HDR 200 Gb/s per node: ~85 % of line rate
# on average, 96 % at peak, all-reduce busbw). 0.85 is that average; for EFA / RoCE it is an
# assumption, to override per system.
SCALE_OUT_EFFICIENCY: Final = 0.85
# Per-step latencies used only when the hardware catalog gives none. ASSUMPTIONS (order of magnitude
# of NCCL per-hop latency: a few microseconds on NVLink, ~10 us across an IB fabric), kept explicit.
DEFAULT_SCALE_UP_LATENCY_S: Final = 3e-6
DEFAULT_SCALE_OUT_LATENCY_S: Final = 10e-6


@dataclass(frozen=True, kw_only=True)
class NcclProtocol:
    """One NCCL ring protocol: its base latency, its per-step latency relative to LL on NVLink
    and on the network, and the fraction of the link bandwidth it carries as data."""

    name: str
    base_latency_s: float
    scale_up_step_ratio: float  # hwLat[NVLINK][RING][p] / hwLat[NVLINK][RING][LL]
    scale_out_step_ratio: float  # hwLat[NET][RING][p] / hwLat[NET][RING][LL]


_NCCL_TUNING_SRC: Final = (
    "NVIDIA/nccl src/graph/tuning.cc @01afd20a77b5804e0ecf1042509dd9d20ebf9e93: baseLat Ring "
    "{LL 3.6, LL128 10.0, Simple 8.4} us; hwLat Ring NVLINK {.47, 1.9, 3.4}, NET {2.7, 4.0, 9.6} us"
)
NCCL_RING_PROTOCOLS: Final = (
    NcclProtocol(name="LL", base_latency_s=3.6e-6, scale_up_step_ratio=1.0, scale_out_step_ratio=1.0),
    NcclProtocol(
        name="LL128", base_latency_s=10.0e-6, scale_up_step_ratio=1.9 / 0.47, scale_out_step_ratio=4.0 / 2.7
    ),
    NcclProtocol(
        name="Simple", base_latency_s=8.4e-6, scale_up_step_ratio=3.4 / 0.47, scale_out_step_ratio=9.6 / 2.7
    ),
)
"""NCCL's ring protocols (:data:`_NCCL_TUNING_SRC`); bandwidth fractions in :func:`_protocol_links`."""
# tuning.cc: LL carries 1/4 of the bus bandwidth across nodes or in an all-reduce, 1/3 otherwise;
# LL128 0.92 (120 of 128 bytes), 0.7 with fewer than 2 ranks per node; an LL step inside a node
# costs 1.8x its NVLink latency once the communicator spans nodes.
LL_BANDWIDTH_MULTI_NODE: Final = 1.0 / 4.0
LL_BANDWIDTH_ONE_NODE: Final = 1.0 / 3.0
LL128_BANDWIDTH: Final = 0.92
LL128_BANDWIDTH_ONE_PER_NODE: Final = 0.7
LL_INTRA_LATENCY_MULTI_NODE: Final = 1.8


# --------------------------------------------------------------------------------------------
# Flat collectives (one level)
# --------------------------------------------------------------------------------------------
def _check(
    n_bytes: float, group: int, bandwidth_bytes_per_s: float, latency_s: float, efficiency: float
) -> None:
    if n_bytes < 0:
        raise TrainplanError("n_bytes", f"must be >= 0, got {n_bytes}")
    if group < 1:
        raise TrainplanError("group", f"must be a positive number of ranks, got {group}")
    if group > 1 and n_bytes > 0 and not bandwidth_bytes_per_s > 0:
        raise TrainplanError("bandwidth_bytes_per_s", f"must be positive, got {bandwidth_bytes_per_s}")
    if latency_s < 0:
        raise TrainplanError("latency_s", f"must be >= 0, got {latency_s}")
    if not 0 < efficiency <= 1:
        raise TrainplanError("efficiency", f"must be in (0, 1], got {efficiency}")


def bus_factor(kind: CollectiveKind, group: Int) -> Num:
    """Bytes each rank sends per byte of buffer (nccl-tests ``doc/PERFORMANCE.md`` busbw factors)."""
    if kind == "send_recv":
        return 1.0
    n = as_float(group)
    f = 2.0 * (n - 1) / maximum(n, 1.0) if kind == "all_reduce" else (n - 1) / maximum(n, 1.0)
    return where(group <= 1, 0.0, f)


def _steps(kind: CollectiveKind, group: Int) -> Int:
    """Latency steps: ring all-reduce 2(n−1), the others n−1, a send 1."""
    if kind == "send_recv":
        return 1
    return cast(Int, where(group <= 1, 0, 2 * (group - 1) if kind == "all_reduce" else group - 1))


Link = tuple[Num, Num, Num]
"""(bandwidth_bytes_per_s, latency_s, efficiency) of one network level, floats or arrays."""


def flat_time_s(kind: CollectiveKind, n_bytes: Num, group: Int, link: Link) -> Num:
    """One-level collective: ``steps·α + bus_factor·n_bytes / (β·efficiency)``; 0 when nothing moves.

    Over ``Num``: the estimate calls it on floats, the planner on candidate arrays."""
    bw, lat, eff = link
    volume = bus_factor(kind, group) * n_bytes
    return where(volume == 0.0, 0.0, _steps(kind, group) * lat + volume / (bw * eff))


def _protocol_links(
    p: NcclProtocol, kind: CollectiveKind, group: Int, n_local: Int, up: Link, out: Link
) -> tuple[Link, Link]:
    """``up`` and ``out`` as protocol ``p`` sees them: per-step latency scaled by the protocol's
    ratio, efficiency by its bandwidth fraction (tuning.cc ``ncclTopoTuneModel``)."""
    multi = n_local < group
    if p.name == "LL":
        frac: Num = (
            LL_BANDWIDTH_MULTI_NODE
            if kind == "all_reduce"
            else where(multi, LL_BANDWIDTH_MULTI_NODE, LL_BANDWIDTH_ONE_NODE)
        )
        up_ratio: Num = where(multi, LL_INTRA_LATENCY_MULTI_NODE, 1.0)
    elif p.name == "LL128":
        frac = where(n_local < 2, LL128_BANDWIDTH_ONE_PER_NODE, LL128_BANDWIDTH)
        up_ratio = p.scale_up_step_ratio
    else:
        frac, up_ratio = 1.0, p.scale_up_step_ratio
    return (
        (up[0], up[1] * up_ratio, up[2] * frac),
        (out[0], out[1] * p.scale_out_step_ratio, out[2] * frac),
    )


def collective_time_s(
    kind: CollectiveKind,
    n_bytes: Num,
    group: Int,
    n_local: Int,
    up: Link,
    out: Link,
    protocols: Bool = False,
) -> Num:
    """A collective over ``group`` ranks, ``n_local`` of them in each scale-up domain (the two-level
    formulas of :func:`hierarchical_s`, which documents them), over ``Num``.

    ``protocols`` (NCCL networks, module docstring "Protocols"): an all-reduce, all-gather or
    reduce-scatter takes the fastest of :data:`NCCL_RING_PROTOCOLS`, each adding its base latency
    to the two-level time under its own per-step latency and bandwidth fraction.

    ``out`` may be any link when the group stays in one domain (``n_local == group``): no term
    reads it then. 0 for a group of one rank or an empty buffer.
    """
    if (protocols is False) or kind in ("send_recv", "all_to_all"):
        return _two_level_s(kind, n_bytes, group, n_local, up, out)
    parts = _ring_parts(kind, n_bytes, group, n_local)
    idle = (group <= 1) | (n_bytes == 0.0)
    plain = where(idle, 0.0, _ring_time_s(parts, up, out))
    best: Num | None = None
    for p in NCCL_RING_PROTOCOLS:  # the same steps and bytes, each protocol's latency and bandwidth
        up_p, out_p = _protocol_links(p, kind, group, n_local, up, out)
        t = where(idle, 0.0, _ring_time_s(parts, up_p, out_p) + p.base_latency_s)
        best = t if best is None else minimum(best, t)
    assert best is not None
    return where(protocols, best, plain)


RingParts = tuple[Num, Num, Num, Num]
"""(scale-up latency steps, scale-out latency steps, scale-up bus bytes, scale-out bus bytes)."""


def _ring_parts(kind: CollectiveKind, n_bytes: Num, group: Int, n_local: Int) -> RingParts:
    """The two-level ring all-reduce, all-gather or reduce-scatter of :func:`hierarchical_s` as its
    latency steps and bus bytes per level (the steps and ``bus_factor · bytes`` of the flat phases).

    All-reduce: reduce-scatter over the ``n_l`` ranks of a domain, all-reduce of the ``1/n_l`` shard
    over the ``n_o`` domains, all-gather over the domain. All-gather / reduce-scatter: NCCL runs them
    as one ring through every rank: its n−1 steps are (n − n_o) hops inside a domain and (n_o − 1)
    between domains (NVIDIA/nccl ``src/graph/tuning.cc``, ``nInterSteps``), i.e. (n_l − 1)(n_o − 1)
    more scale-up steps than the two phases count."""
    n_l = n_local
    n_o = ceil_div(group, n_l)
    shard = n_bytes / n_l
    if kind == "all_reduce":
        up_steps = 2 * _steps("reduce_scatter", n_l)
        up_bytes = 2.0 * bus_factor("reduce_scatter", n_l) * n_bytes
        return up_steps, _steps(kind, n_o), up_bytes, bus_factor(kind, n_o) * shard
    up_steps = _steps(kind, n_l) + (n_l - 1) * (n_o - 1)
    return up_steps, _steps(kind, n_o), bus_factor(kind, n_l) * n_bytes, bus_factor(kind, n_o) * shard


def _ring_time_s(parts: RingParts, up: Link, out: Link) -> Num:
    """``steps·α + bus_bytes / (β·efficiency)`` summed over both levels (a level moving nothing adds
    its latency steps only, themselves 0 then)."""
    up_steps, out_steps, up_bytes, out_bytes = parts
    up_s = where(up_bytes == 0.0, 0.0, up_steps * up[1] + up_bytes / (up[0] * up[2]))
    out_s = where(out_bytes == 0.0, 0.0, out_steps * out[1] + out_bytes / (out[0] * out[2]))
    return up_s + out_s


def _two_level_s(kind: CollectiveKind, n_bytes: Num, group: Int, n_local: Int, up: Link, out: Link) -> Num:
    """:func:`collective_time_s` under one latency and efficiency per level."""
    n_l = n_local
    if kind in ("all_reduce", "all_gather", "reduce_scatter"):
        t = _ring_time_s(_ring_parts(kind, n_bytes, group, n_l), up, out)
        return where((group <= 1) | (n_bytes == 0.0), 0.0, t)
    n_o = ceil_div(group, n_l)
    inside = n_o == 1
    one: Link = (where(inside, up[0], out[0]), where(inside, up[1], out[1]), where(inside, up[2], out[2]))
    if kind == "send_recv":
        t = one[1] + n_bytes / (one[0] * one[2])
    else:
        flat = flat_time_s(kind, n_bytes, group, one)
        g = as_float(group)
        intra = (n_l - 1) / g * n_bytes / (up[0] * up[2])
        inter = (group - n_l) / g * n_bytes / (out[0] * out[2])
        two = maximum(intra, inter) + (n_l - 1) * up[1] + (group - n_l) * out[1]
        t = where(inside | (n_l == 1), flat, two)
    return where((group <= 1) | (n_bytes == 0.0), 0.0, t)


def _flat_s(
    kind: CollectiveKind,
    n_bytes: float,
    group: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
    efficiency: float,
) -> float:
    _check(n_bytes, group, bandwidth_bytes_per_s, latency_s, efficiency)
    return float(flat_time_s(kind, n_bytes, group, (bandwidth_bytes_per_s, latency_s, efficiency)))


def all_reduce_s(
    n_bytes: float, group: int, bandwidth_bytes_per_s: float, latency_s: float, *, efficiency: float = 1.0
) -> float:
    """Ring all-reduce: ``2(n−1)/n · n_bytes / bw + 2(n−1)·α``.

    Reduce-scatter then all-gather around a ring (Patarasuk & Yuan 2009; Thakur et al. 2005 Sec. 4).
    Example: 1 GB over 8 ranks at 100 GB/s = 2·7/8·1e9/1e11 = 17.5 ms + 14α.
    """
    return _flat_s("all_reduce", n_bytes, group, bandwidth_bytes_per_s, latency_s, efficiency)


def reduce_scatter_s(
    n_bytes: float, group: int, bandwidth_bytes_per_s: float, latency_s: float, *, efficiency: float = 1.0
) -> float:
    """Ring reduce-scatter of an ``n_bytes`` input: ``(n−1)/n · n_bytes / bw + (n−1)·α`` (Thakur et al. 2005)."""
    return _flat_s("reduce_scatter", n_bytes, group, bandwidth_bytes_per_s, latency_s, efficiency)


def all_gather_s(
    n_bytes: float, group: int, bandwidth_bytes_per_s: float, latency_s: float, *, efficiency: float = 1.0
) -> float:
    """Ring all-gather of an ``n_bytes`` output: ``(n−1)/n · n_bytes / bw + (n−1)·α`` (Thakur et al. 2005)."""
    return _flat_s("all_gather", n_bytes, group, bandwidth_bytes_per_s, latency_s, efficiency)


def all_to_all_s(
    n_bytes: float, group: int, bandwidth_bytes_per_s: float, latency_s: float, *, efficiency: float = 1.0
) -> float:
    """Pairwise-exchange all-to-all of an ``n_bytes`` send buffer: ``(n−1)/n · n_bytes / bw + (n−1)·α``.

    Thakur et al. 2005 Sec. 4 (pairwise exchange for long messages); nccl-tests busbw factor (n−1)/n.
    """
    return _flat_s("all_to_all", n_bytes, group, bandwidth_bytes_per_s, latency_s, efficiency)


def send_recv_s(
    n_bytes: float, bandwidth_bytes_per_s: float, latency_s: float, *, efficiency: float = 1.0
) -> float:
    """Point-to-point send (and the matching receive on full-duplex links): ``α + n_bytes / bw``."""
    return _flat_s("send_recv", n_bytes, 2, bandwidth_bytes_per_s, latency_s, efficiency)


# --------------------------------------------------------------------------------------------
# Hierarchical (two-level) collectives
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LinkLevel:
    """One level of the network as seen by one chip: one-direction bandwidth, per-step latency, efficiency."""

    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float = 1.0

    @property
    def link(self) -> Link:
        """(bandwidth, latency, efficiency): the level as :func:`collective_time_s` reads it."""
        return (self.bandwidth_bytes_per_s, self.latency_s, self.efficiency)

    def __post_init__(self) -> None:
        _check(0.0, 1, self.bandwidth_bytes_per_s, self.latency_s, self.efficiency)
        if not self.bandwidth_bytes_per_s > 0:
            raise TrainplanError(
                "bandwidth_bytes_per_s", f"must be positive, got {self.bandwidth_bytes_per_s}"
            )


def _split_levels(group: int, n_local: int) -> tuple[int, int]:
    if n_local < 1 or n_local > group:
        raise TrainplanError("n_local", f"ranks per domain must be in 1..{group}, got {n_local}")
    return n_local, math.ceil(group / n_local)


def hierarchical_s(
    kind: CollectiveKind, n_bytes: float, group: int, n_local: int, scale_up: LinkLevel, scale_out: LinkLevel
) -> float:
    """A collective over ``group`` ranks, ``n_local`` of them in each scale-up domain.

    With ``n_out = ⌈group / n_local⌉`` domains and ``S = n_bytes``:

    * reduce-scatter: RS of S inside the domain (scale-up), then RS of the S/n_local shard across
      domains (scale-out).
    * all-gather: the reverse — AG of S/n_local across domains, then AG of S inside the domain.
      Latency of both: NCCL's ring, ``(n − n_o)·α_up + (n_o − 1)·α_out`` for its n − 1 steps.
    * all-reduce: intra RS + inter all-reduce of the S/n_local shard + intra AG, i.e.
      ``2(n_l−1)/n_l·S/B_up + 2(n_o−1)/n_o·(S/n_l)/B_out`` + latencies (Jia et al. 2018; Ying et al. 2018).
    * all-to-all: the ``(n_l−1)/n`` share of the buffer bound to peers in the same domain goes over
      scale-up while the ``(n−n_l)/n`` share goes over scale-out, concurrently: the slower one bounds
      the bandwidth term; latencies ``(n_l−1)·α_up + (n−n_l)·α_out`` (pairwise exchange).
    * send/recv: the slowest hop, scale-out.

    ``n_local == group`` reduces to the flat scale-up formulas, ``n_local == 1`` to flat scale-out.
    """
    n_l, _ = _split_levels(group, n_local)
    up, out = scale_up, scale_out
    for level in (up, out):
        _check(n_bytes, group, level.bandwidth_bytes_per_s, level.latency_s, level.efficiency)
    return float(collective_time_s(kind, n_bytes, group, n_l, up.link, out.link))


def hierarchical_all_reduce_s(
    n_bytes: float,
    group: int,
    n_local: int,
    *,
    scale_up_bandwidth_bytes_per_s: float,
    scale_up_latency_s: float,
    scale_out_bandwidth_bytes_per_s: float,
    scale_out_latency_s: float,
    scale_up_efficiency: float = 1.0,
    scale_out_efficiency: float = 1.0,
) -> float:
    """Two-level all-reduce from plain numbers (see :func:`hierarchical_s`)."""
    up = LinkLevel(
        bandwidth_bytes_per_s=scale_up_bandwidth_bytes_per_s,
        latency_s=scale_up_latency_s,
        efficiency=scale_up_efficiency,
    )
    out = LinkLevel(
        bandwidth_bytes_per_s=scale_out_bandwidth_bytes_per_s,
        latency_s=scale_out_latency_s,
        efficiency=scale_out_efficiency,
    )
    return hierarchical_s("all_reduce", n_bytes, group, n_local, up, out)


# --------------------------------------------------------------------------------------------
# Placement of the parallel groups
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class GroupPlacement:
    """Where one parallel group's ranks sit relative to the scale-up domains.

    ``ranks_per_domain`` is how many of the group's ranks share the scale-up domain of its first
    rank; ``domains`` how many domains the group touches. ``uniform`` is False when the group does
    not split evenly over its domains (the hierarchical formula is then approximate).
    """

    name: str
    size: int
    stride: int
    ranks_per_domain: int
    domains: int
    level: Level
    uniform: bool = True

    @property
    def spans_domains(self) -> bool:
        return self.domains > 1


def ranks_per_domain(size: Int, stride: Int, domain_size: Int) -> Int:
    """How many of the ranks ``0, stride, …, (size − 1)·stride`` lie in the first domain of
    ``domain_size`` consecutive ranks: ``min(size, ⌈domain_size / stride⌉)`` (1 when the stride
    reaches past the domain). Over ``Num``."""
    return cast(Int, minimum(size, ceil_div(domain_size, stride)))


@functools.lru_cache(maxsize=4096)
def place_group(name: str, size: int, stride: int, domain_size: int) -> GroupPlacement:
    """Placement of a group of ``size`` ranks ``r0, r0+stride, …`` on domains of ``domain_size`` ranks.

    Ranks are numbered so that consecutive ranks share a domain (devices ``0..D−1`` form the first
    domain). Computed for the group that contains rank 0; the standard layouts are translation
    invariant so every group of the kind looks the same.
    """
    if size < 1 or stride < 1 or domain_size < 1:
        raise TrainplanError(
            "group", f"size, stride and domain size must be positive ({size}, {stride}, {domain_size})"
        )
    local = int(ranks_per_domain(size, stride, domain_size))
    domains = math.ceil(size / local)
    level: Level
    if size == 1:
        level = "none"
    elif domains == 1:
        level = "scale_up"
    elif local == 1:
        level = "scale_out"
    else:
        level = "hierarchical"
    return GroupPlacement(
        name=name,
        size=size,
        stride=stride,
        ranks_per_domain=local,
        domains=domains,
        level=level,
        uniform=size % local == 0,
    )


def _attr(obj: Any, name: str) -> Any:
    return getattr(obj, name, None)


def _system_link(system: Any, name: str) -> Any:
    link = _attr(system, name)
    if link is None:
        link = _attr(_attr(system, "accelerator"), name)
    return link


def domain_size(system: Any) -> int:
    """Ranks per scale-up domain: ``min(system.scale_up_domain, system.num_devices)``.

    Duck-typed: reads ``scale_up_domain`` (falling back to ``accelerator.scale_up.domain_size``, then
    ``devices_per_node``) and ``num_devices``.
    """
    size = _attr(system, "scale_up_domain")
    if size is None:
        size = _attr(_system_link(system, "scale_up"), "domain_size")
    if size is None:
        size = _attr(system, "devices_per_node")
    if size is None:
        raise CatalogError("scale_up_domain", "the system gives no scale-up domain size")
    devices = _attr(system, "num_devices")
    return int(min(int(size), int(devices))) if devices is not None else int(size)


def group_placement(layout: Layout, system: Any) -> dict[str, GroupPlacement]:
    """Placement of every parallel group of ``layout`` on ``system`` (Megatron-LM rank order).

    Keys: ``tp`` (stride 1), ``cp`` (stride tp), ``dp`` (stride tp·cp), ``shard`` (the ZeRO/FSDP and
    gradient-reduction group dp·cp, stride tp), ``ep`` (stride tp), ``expert_dp`` (dp·cp/ep, stride
    tp·ep: reduces expert gradients), ``pp`` (stride tp·cp·dp). Domain size = min(scale-up domain,
    devices). ``system`` is duck-typed (``scale_up_domain``, ``num_devices``).
    """
    devices = _attr(system, "num_devices")
    if devices is not None and int(devices) != layout.num_devices:
        raise LayoutError(
            "devices",
            f"layout uses dp·tp·pp·cp = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = {layout.num_devices} "
            f"devices but the system has {devices}",
        )
    d = domain_size(system)
    shapes = group_shapes(layout.tp, layout.cp, layout.dp, layout.ep, layout.pp, layout.expert_tp)
    return {name: place_group(name, int(size), int(stride), d) for name, (size, stride) in shapes.items()}


def group_shapes(
    tp: Int, cp: Int, dp: Int, ep: Int, pp: Int, etp: Int | None = None
) -> dict[str, tuple[Int, Int]]:
    """(size, stride) of every parallel group in Megatron-LM's rank order ``tp-cp-ep-dp-pp``
    (module docstring), over ``Num``: ``tp`` (stride 1), ``cp`` (stride tp), ``dp`` (stride
    tp·cp), ``shard`` (the ZeRO/FSDP group dp·cp, stride tp), ``ep`` (stride tp), ``expert_dp``
    (dp·cp/ep, stride tp·ep), ``pp`` (stride tp·cp·dp).

    The expert groups follow Megatron-Core's expert rank order ``etp-ep-edp-pp``
    (``parallel_state.initialize_model_parallel``, ``expert_decoder_rank_generator``): ``ep``
    (stride etp) and ``expert_dp`` (tp·cp·dp / (ep·etp), stride etp·ep). With ``etp`` None or
    tp they are the groups above; with etp = 1 (parallel folding) the expert-parallel group is
    ``ep`` consecutive ranks."""
    shard = dp * cp
    et = tp if etp is None else etp
    return {
        "tp": (tp, 1),
        "cp": (cp, tp),
        "dp": (dp, tp * cp),
        "shard": (shard, tp),
        "ep": (ep, et),
        "etp": (et, 1),
        "expert_dp": (tp * shard // (ep * et), et * ep),
        "pp": (pp, tp * cp * dp),
    }


# --------------------------------------------------------------------------------------------
# The network of a system
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Network:
    """The two levels a chip sees. ``scale_out`` is None for a single-domain system.

    ``protocols``: NCCL drives the links and picks its ring protocol per message size
    (:func:`collective_time_s`); False: one latency per step, the catalog's."""

    scale_up: LinkLevel
    scale_out: LinkLevel | None = None
    protocols: bool = False

    def time_s(self, kind: CollectiveKind, n_bytes: float, placement: GroupPlacement) -> float:
        """Time of one collective of ``kind`` with an ``n_bytes`` buffer over the placed group."""
        if placement.level == "none" or n_bytes == 0:
            return 0.0
        if n_bytes < 0:
            raise TrainplanError("n_bytes", f"must be >= 0, got {n_bytes}")
        up = self.scale_up.link
        if placement.level == "scale_up":  # the links were checked when built (LinkLevel)
            return float(
                collective_time_s(kind, n_bytes, placement.size, placement.size, up, up, self.protocols)
            )
        if self.scale_out is None:
            raise CatalogError(
                "scale_out",
                f"the {placement.name} group spans {placement.domains} scale-up domains but the system has "
                "no scale-out network; keep the group inside one domain or add a scale-out link",
            )
        return float(
            collective_time_s(
                kind,
                n_bytes,
                placement.size,
                placement.ranks_per_domain,
                up,
                self.scale_out.link,
                self.protocols,
            )
        )


def _level_from_link(
    link: Any, default_latency_s: float, efficiency: float | None, default_eff: float
) -> LinkLevel:
    bw = _attr(link, "bandwidth_bytes_per_s")
    if bw is None or not float(bw) > 0:
        raise CatalogError("bandwidth_bytes_per_s", "the link gives no positive bandwidth")
    latency = _attr(link, "latency_s")
    eff = efficiency if efficiency is not None else _attr(link, "efficiency")
    return LinkLevel(
        bandwidth_bytes_per_s=float(bw),
        latency_s=float(latency) if latency is not None else default_latency_s,
        efficiency=float(eff) if eff is not None else default_eff,
    )


def network_from_system(
    system: Any, *, scale_up_efficiency: float | None = None, scale_out_efficiency: float | None = None
) -> Network:
    """Build the :class:`Network` of a system (duck-typed on ``scale_up`` / ``scale_out`` links).

    Links are looked up on the system, then on ``system.accelerator``; each needs
    ``bandwidth_bytes_per_s`` (per chip, one direction) and may give ``latency_s`` and ``efficiency``.
    Efficiency precedence: argument, then the link's own, then :data:`SCALE_UP_EFFICIENCY` /
    :data:`SCALE_OUT_EFFICIENCY`. A system without scale-up links (PCIe-only cards) should describe
    PCIe as its scale-up link.

    ``protocols`` (NCCL's per-size protocol choice) is on for NVIDIA accelerators whose scale-up
    link is NVLink: NCCL is their collective library, and it enables LL128 only over NVLink
    (tuning.cc: ``typeIntra <= PATH_NVL``); PCIe-only cards and other vendors keep one latency.
    """
    up_link = _system_link(system, "scale_up")
    if up_link is None:
        raise CatalogError("scale_up", "the system gives no scale-up link")
    up = _level_from_link(up_link, DEFAULT_SCALE_UP_LATENCY_S, scale_up_efficiency, SCALE_UP_EFFICIENCY)
    out_link = _system_link(system, "scale_out")
    out = None
    if out_link is not None and (_attr(out_link, "bandwidth_bytes_per_s") or 0) > 0:
        out = _level_from_link(
            out_link, DEFAULT_SCALE_OUT_LATENCY_S, scale_out_efficiency, SCALE_OUT_EFFICIENCY
        )
    vendor = str(_attr(_attr(system, "accelerator"), "vendor") or _attr(system, "vendor") or "")
    nvlink = "nvlink" in str(_attr(up_link, "name") or "").lower()
    return Network(scale_up=up, scale_out=out, protocols=vendor.upper() == "NVIDIA" and nvlink)


# --------------------------------------------------------------------------------------------
# Per-step traffic of each parallelism
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Collective:
    """One recurring collective of a training step, as seen by one device.

    ``buffer_bytes`` is the per-call buffer in the convention of the primitives (full, unsharded),
    ``calls`` how many times it runs per step, ``wire_bytes`` what the device sends per step
    (``bus_factor · buffer_bytes · calls``), ``time_s`` the total time per step if nothing overlaps,
    and ``overlappable_with`` the compute phase it can hide behind ("none": on the critical path).
    """

    name: str
    kind: CollectiveKind
    group: str
    group_size: int
    level: Level
    buffer_bytes: float
    calls: float
    wire_bytes: float
    time_s: float
    overlappable_with: Overlap
    source: str
    phase: Phase | None = None


Phase = Literal["forward", "backward", "recompute"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Traffic:
    """One recurring collective of a step, declared once over ``Num`` (a float for one estimate, an
    array for many planner candidates): what it moves and how often, not yet how long it takes.

    ``group``: the parallel group it runs on (a key of :func:`group_placement`); ``phase``: the
    pass it belongs to (tensor / expert / context parallelism); ``calls`` is 0 where the layout or
    recipe does not issue it; ``copies_per_call_s``: host-side per-call cost added to a non-zero
    per-call time (list-based collectives). :func:`timed_collectives` turns it into a
    :class:`Collective` on one network; the planner times it per candidate array.
    """

    name: str
    kind: CollectiveKind
    group: str
    overlap: Overlap
    source: str
    buffer_bytes: Num
    calls: Num
    copies_per_call_s: Num = 0.0
    phase: Phase | None = None
    device_bytes_per_byte: float = 0.0
    """Device-memory bytes the call's own kernels stream per buffer byte (zero-fills, the
    flatten / unflatten copies of list-based collectives), timed at the device's achievable
    memory bandwidth by :func:`call_time_s`."""


def call_time_s(t: Traffic, network_s: Num, buffer_bytes: Num, device_bytes_per_s: Num) -> Num:
    """Seconds of one call of ``t``: its network time plus ``device_bytes_per_byte · buffer /
    device_bytes_per_s`` (memory-bound kernels, roofline: Williams et al. 2009); 0 stays 0."""
    if t.device_bytes_per_byte == 0.0:
        return network_s
    return where(
        network_s > 0.0, network_s + t.device_bytes_per_byte * buffer_bytes / device_bytes_per_s, 0.0
    )


def traffic_time_s(t: Traffic, per_call_s: Num) -> Num:
    """Seconds per step of ``t`` given the network time of one call (0 stays 0)."""
    if t.copies_per_call_s.__class__ is float and t.copies_per_call_s == 0.0:
        return per_call_s * t.calls  # per-call times are >= 0: nothing to guard
    return where(per_call_s > 0.0, per_call_s + t.copies_per_call_s, 0.0) * t.calls


def timed_collectives(
    traffic: tuple[Traffic, ...],
    network: Network,
    placements: Mapping[str, GroupPlacement],
    device_bytes_per_s: float = 0.0,
) -> tuple[Collective, ...]:
    """The traffic a scalar layout issues (calls > 0 on a group of more than one rank), timed.

    ``device_bytes_per_s``: achievable device-memory bandwidth, needed by traffic that streams
    device memory of its own (:attr:`Traffic.device_bytes_per_byte`)."""
    out: list[Collective] = []
    per_call_s: dict[tuple[str, float, str, float], float] = {}  # equal calls (one per pass) timed once
    for t in traffic:
        pl = placements[t.group]
        calls = float(t.calls)
        if calls <= 0 or pl.size <= 1:
            continue
        buffer = float(t.buffer_bytes)
        if t.device_bytes_per_byte and not device_bytes_per_s > 0:
            raise TrainplanError(
                "device_bytes_per_s",
                f"{t.name} streams device memory of its own: give the device's memory bandwidth",
            )
        key = (t.kind, buffer, t.group, t.device_bytes_per_byte)
        per_call = per_call_s.get(key)
        if per_call is None:
            per_call = per_call_s[key] = float(
                call_time_s(t, network.time_s(t.kind, buffer, pl), buffer, device_bytes_per_s)
            )
        out.append(
            Collective(
                name=t.name,
                kind=t.kind,
                group=pl.name,
                group_size=pl.size,
                level=pl.level,
                buffer_bytes=buffer,
                calls=calls,
                wire_bytes=float(bus_factor(t.kind, pl.size)) * buffer * calls,
                time_s=float(traffic_time_s(t, per_call)),
                overlappable_with=t.overlap,
                source=t.source,
                phase=t.phase,
            )
        )
    return tuple(out)


_ZERO_SRC = "Rajbhandari et al. 2020 (ZeRO), Sec. 7: DDP/ZeRO-1/2 move 2Ψ per step, ZeRO-3 3Ψ"
_PER_PARAMETER_SRC = (
    "DeepSpeed 2021 ZeRO-3 (microsoft/DeepSpeed@429dfa6, deepspeed/runtime/zero/stage3.py "
    "fetch_sub_module, partition_parameters.py _allgather_param / _reduce_scatter_gradient): one "
    "list-based collective per parameter tensor, gathers waited on before the module runs; "
    "torch.cuda.synchronize() before each gather (_allgather_param) and after each fetch "
    "(_synchronize_communication) also waits for the reduce-scatters on the reduction stream"
)

# Host-side cost per rank of a list-based collective: ``torch.distributed.all_gather`` with a list
# of outputs copies each of the n outputs out of the flat NCCL buffer, ``reduce_scatter`` with a
# list of inputs copies each of the n inputs in (pytorch/pytorch
# ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``: "Copy the flattened output tensors to
# the outputs", one ``copy_`` kernel per rank). Each is a small kernel launched back to back:
# 3.8 us per kernel, launch included (NVIDIA Technical Blog, A. Gray, "Getting Started with CUDA
# Graphs", 2019: 3.8 us per short kernel when launches overlap execution).
LIST_COLLECTIVE_COPY_S: Final = 3.8e-6

# Device-memory bytes per buffer byte that DeepSpeed 2021's per-parameter path streams around each
# collective (microsoft/DeepSpeed@429dfa6), besides the network transfer:
# * gather, 4: ``_allgather_param`` zero-fills the flat output (``torch.zeros``: write S) and
#   synchronizes the device before launching; ProcessGroupNCCL's list ``all_gather`` copies the
#   flat NCCL output out to the n per-rank views (read S, write S); ``fetch_sub_module`` then
#   evaluates ``param.norm()`` of every fetched parameter inside a debug f-string that is built
#   whether or not it is printed (stage3.py, "Param id ... norm {param.norm()}": read S);
# * reduce-scatter, 4: ``average_tensor`` divides the bucket by the group size in place
#   (``tensor.div_``: read S, write S) and ProcessGroupNCCL's list ``reduce_scatter`` flattens the
#   n per-rank inputs into one NCCL input (read S, write S). The copy into the contiguous gradient
#   bucket is left out (DeepSpeed skips it for tensors above ``reduce_bucket_size``).
PER_PARAMETER_GATHER_DEVICE_BYTES: Final = 4.0
PER_PARAMETER_REDUCE_SCATTER_DEVICE_BYTES: Final = 4.0


def data_parallel_traffic(
    *,
    zero: Int,
    param_bytes: Num,
    grad_bytes: Num,
    micro_batches: Int,
    shard_size: Int,
    group: str = "shard",
    prefix: str = "dp",
    overlap_param_gather: bool = False,
    gather_units: Int = 1,
    granularity: str = "block",
    regather_for_recompute: Bool = False,
    vector_units: Int = 0,
    vector_fraction: Num = 0.0,
    updated_param_bytes: Num | None = None,
) -> tuple[Traffic, ...]:
    """Gradient / parameter traffic of data parallelism on one device per step.

    ``param_bytes``: the device's (tp/pp/ep-sharded but not ZeRO-sharded) weights in their storage
    dtype; ``grad_bytes``: its trainable gradients (PEFT: adapters only); ``updated_param_bytes``:
    the weights the optimizer step changes (None: all of ``param_bytes``; PEFT: the adapters, since
    frozen weights are never sharded by ZeRO-1/2 and never re-gathered, Megatron-Core
    ``DistributedOptimizer`` builds its buffers from the parameters with ``requires_grad`` only).
    Per ZeRO stage (Rajbhandari et al. 2020, Sec. 5 and 7):

    * 0 (DDP): all-reduce of the gradients once per step, bucketed behind backward (Li et al. 2020,
      PyTorch DDP, Sec. 3.2): 2Ψ.
    * 1: reduce-scatter of gradients once per step (behind backward) + all-gather of the updated
      (trainable) parameters after the optimizer step (exposed unless ``overlap_param_gather``, as Megatron's
      ``--overlap-param-gather`` hides it behind the next forward): 2Ψ.
    * 2: as 1, but gradients are partitioned, so they are reduce-scattered every micro-batch.
    * 3 (FSDP FULL_SHARD): all-gather of the parameters before each micro-batch's forward and again
      before its backward, reduce-scatter of the gradients after each backward: 3Ψ per micro-batch.
      The traffic goes in ``gather_units`` equal collectives per pass, so the latency is paid
      ``gather_units`` times while the volume stays 3Ψ:

      - ``granularity="block"`` (PyTorch FSDP/FSDP2 wrapping each block; ``gather_units`` =
        blocks on the stage + 1 root unit): prefetching hides them behind compute.
      - ``granularity="parameter"`` (DeepSpeed ZeRO-3 as of 2021; ``gather_units`` = parameter
        tensors): each gather is waited on before the module runs, so gathers are exposed
        ("none"); with ``regather_for_recompute`` (reentrant full recompute re-runs the module's
        forward hooks, which gather and release again) there is a third gather per micro-batch;
        each list-based call adds n · :data:`LIST_COLLECTIVE_COPY_S` of per-rank copies and
        streams :data:`PER_PARAMETER_GATHER_DEVICE_BYTES` (gathers) or
        :data:`PER_PARAMETER_REDUCE_SCATTER_DEVICE_BYTES` (reduce-scatters) bytes of device memory
        per buffer byte (zero-fill, list copies, a debug ``param.norm()``, the in-place average). The
        gradient reduce-scatters run on a side stream (stage3.py ``reduction_stream``) but are on
        the critical path all the same: the next module's fetch synchronizes the whole device
        (``torch.cuda.synchronize()`` in ``_allgather_param`` and ``_synchronize_communication``),
        which waits for them, and they share the data-parallel group's one NCCL stream with the
        gathers (``torch.distributed`` ProcessGroupNCCL: one stream per device per group), so no
        compute of the backward hides them ("none"). The one-parameter prefetch
        (``stage3_prefetch_bucket_size`` = 5e7 elements, reached by the first weight matrix) is
        not credited. Of the ``gather_units`` tensors, ``vector_units`` are one-dimensional
        (biases, norms: :func:`trainplan.models.params.layer_vector_tensors`) and hold
        ``vector_fraction`` of the bytes: they are gathered and reduced in calls of their own
        (``*_vector_*``, a few kilobytes each, in the latency regime), the weight matrices share
        the rest of the volume.
    """
    m = micro_batches
    u = gather_units
    per_param = granularity == "parameter"
    z12 = (zero == 1) | (zero == 2)
    z3 = zero == 3
    src3 = _PER_PARAMETER_SRC if per_param else _ZERO_SRC
    copies_s = shard_size * LIST_COLLECTIVE_COPY_S if per_param else 0.0
    v = vector_units if per_param else 0
    f = vector_fraction if per_param else 0.0
    calls3 = where(z3, m * (u - v), 0)
    vector_calls3 = where(z3, m * v, 0)
    out: list[Traffic] = []  # what the layout issues: a scalar call count of 0 is not declared

    def gather3(phase: str, overlap: Overlap, calls: Num, vector: bool = False) -> None:
        if _never(calls):
            return
        share = f / maximum(v, 1) if vector else (1.0 - f) / maximum(u - v, 1)
        out.append(
            Traffic(
                name=f"{prefix}_fsdp_{phase}_{'vector_' if vector else ''}all_gather",
                kind="all_gather",
                group=group,
                overlap=overlap,
                source=src3,
                buffer_bytes=param_bytes * share,
                calls=calls,
                copies_per_call_s=copies_s,
                device_bytes_per_byte=PER_PARAMETER_GATHER_DEVICE_BYTES if per_param else 0.0,
            )
        )

    def reduce3(calls: Num, vector: bool = False) -> None:
        if _never(calls):
            return
        share = f / maximum(v, 1) if vector else (1.0 - f) / maximum(u - v, 1)
        out.append(
            Traffic(
                name=f"{prefix}_fsdp_grad_{'vector_' if vector else ''}reduce_scatter",
                kind="reduce_scatter",
                group=group,
                overlap="none" if per_param else "backward",
                source=src3,
                buffer_bytes=grad_bytes * share,
                calls=calls,
                copies_per_call_s=copies_s,
                device_bytes_per_byte=PER_PARAMETER_REDUCE_SCATTER_DEVICE_BYTES if per_param else 0.0,
            )
        )

    def zero12(name: str, kind: CollectiveKind, overlap: Overlap, nbytes: Num, calls: Num) -> None:
        if _never(calls):
            return
        out.append(
            Traffic(
                name=f"{prefix}_{name}",
                kind=kind,
                group=group,
                overlap=overlap,
                source=_ZERO_SRC,
                buffer_bytes=nbytes,
                calls=calls,
            )
        )

    zero12("grad_all_reduce", "all_reduce", "backward", grad_bytes, where(zero == 0, 1, 0))
    zero12(
        "grad_reduce_scatter",
        "reduce_scatter",
        "backward",
        grad_bytes,
        where(zero == 1, 1, where(zero == 2, m, 0)),
    )
    zero12(
        "param_all_gather",
        "all_gather",
        "forward" if overlap_param_gather else "none",
        param_bytes if updated_param_bytes is None else updated_param_bytes,
        where(z12, 1, 0),
    )
    gather3("forward", "none" if per_param else "forward", calls3)
    gather3("recompute", "none", where(regather_for_recompute, calls3, 0) if per_param else 0)
    gather3("backward", "none" if per_param else "backward", calls3)
    reduce3(calls3)
    if per_param:
        gather3("forward", "none", vector_calls3, vector=True)
        gather3("recompute", "none", where(regather_for_recompute, vector_calls3, 0), vector=True)
        gather3("backward", "none", vector_calls3, vector=True)
        reduce3(vector_calls3, vector=True)
    return tuple(out)


def data_parallel_collectives(
    *,
    zero: int,
    param_bytes: float,
    grad_bytes: float,
    micro_batches: int,
    shard: GroupPlacement,
    network: Network,
    prefix: str = "dp",
    overlap_param_gather: bool = False,
    gather_units: int = 1,
    granularity: str = "block",
    regather_for_recompute: bool = False,
    device_bytes_per_s: float = 0.0,
    vector_units: int = 0,
    vector_fraction: float = 0.0,
) -> tuple[Collective, ...]:
    """:func:`data_parallel_traffic` of one layout, timed on ``network`` over the ``shard`` group
    (``device_bytes_per_s``: the device's memory bandwidth, needed by per-parameter ZeRO-3)."""
    if gather_units < 1:
        raise TrainplanError("gather_units", f"must be a positive integer, got {gather_units}")
    traffic = data_parallel_traffic(
        zero=zero,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        micro_batches=micro_batches,
        shard_size=shard.size,
        prefix=prefix,
        overlap_param_gather=overlap_param_gather,
        gather_units=gather_units,
        granularity=granularity,
        regather_for_recompute=regather_for_recompute,
        vector_units=vector_units,
        vector_fraction=vector_fraction,
    )
    return timed_collectives(traffic, network, {"shard": shard}, device_bytes_per_s)


_TP_SRC = (
    "Shoeybi et al. 2019 (Megatron-LM), Sec. 3: 2 all-reduces per layer forward, 2 backward; "
    "Korthikanti et al. 2022, Sec. 4.2.2: with SP each becomes all-gather + reduce-scatter, same volume"
)
_TP_REGATHER_SRC = _TP_SRC + "; Korthikanti et al. 2022 Sec. 4.2.2 (backward re-gather)"


def tensor_parallel_traffic(
    *,
    activation_bytes: Num,
    layers: Int,
    micro_batches: Int,
    sequence_parallel: Bool,
    recompute_full: Bool,
    overlap: Overlap = "none",
    recompute_skipped_reductions: Int = 0,
    entry_fraction: Num = 1.0,
    mlp_free_layers: Int = 0,
) -> tuple[Traffic, ...]:
    """Tensor-parallel activation collectives of the layers on one device per step.

    ``activation_bytes`` = b·(s/cp)·h·e, the full layer activation of one micro-batch. Each layer
    has two TP regions (attention, MLP): forward ends each with an all-reduce (``g``), backward
    starts each with one (``f``), so 2 + 2 per layer; with sequence parallelism the forward pair
    becomes all-gather (entering the region) + reduce-scatter (leaving it), and backward the mirror,
    with the same bandwidth (AR = RS + AG). Full recompute re-runs the forward collectives, less
    the closing reduction of the ``recompute_skipped_reductions`` layers whose recompute stops
    before it (PyTorch's early stop: :func:`recompute_skipped_tp_reductions`); selective
    recompute of the attention core needs none. Not overlapped by default (Megatron's TP comm sits
    on the critical path unless ``--tp-comm-overlap``). Omitted: the vocab-parallel embedding
    all-reduce and the cross-entropy reductions (one b·s·h and a few b·s per micro-batch).

    The all-gathered input of the two column-parallel linears is not saved (only the sequence
    shard is): backward gathers it again for the weight gradients (Korthikanti et al. 2022 Sec.
    4.2.2). Megatron issues it asynchronously beside the input-gradient GEMM, yet their Table 4
    shows sequence parallelism saving 0.5 ms of a 7.7 ms forward but only 0.1 ms of an 11.9 ms
    backward: the re-gather is paid.

    ``entry_fraction`` (:func:`tp_entry_fraction`): the width of the attention region's entry
    collectives over h. The entry side of both regions (forward and recompute all-gather,
    backward reduce-scatter and re-gather under SP; backward all-reduce without it) then carries
    ``(1 + entry_fraction) / 2`` of the activation bytes per call (the two regions' calls
    averaged: the ring time is affine in the bytes, so the sum is the same); the exit side
    (the reductions after the row-parallel layers) carries h.

    ``mlp_free_layers``: layers whose MLP side has no tensor-parallel region: Megatron-Core's MoE
    layers without shared experts, whose experts the token dispatcher feeds
    (:func:`expert_tp_traffic`, :func:`moe_layer_dispatches`); their attention region remains.
    """
    regions = 2 * layers - mlp_free_layers
    per_pass = regions * micro_batches
    sp = sequence_parallel
    # the entry width averaged over the regions: attention (entry_fraction) on every layer, the
    # MLP (1) on those that keep one
    entry_width: Num = (1.0 + entry_fraction) / 2.0
    if not _never(mlp_free_layers):
        entry_width = where(
            mlp_free_layers == 0,
            entry_width,
            (layers * entry_fraction + (layers - mlp_free_layers)) / regions,
        )
    out: list[Traffic] = []
    for phase in ("forward", "backward", "recompute"):
        ph: Phase = phase
        on: Bool = recompute_full if phase == "recompute" else True
        closing = per_pass - (recompute_skipped_reductions * micro_batches if phase == "recompute" else 0)

        def tp(
            name: str,
            kind: CollectiveKind,
            calls: Num,
            src: str = _TP_SRC,
            ph: Phase = ph,
            entry: bool = False,
        ) -> None:
            if _never(calls):
                return
            out.append(
                Traffic(
                    name=f"tp_{name}",
                    kind=kind,
                    group="tp",
                    overlap=overlap,
                    source=src,
                    buffer_bytes=activation_bytes * entry_width if entry else activation_bytes,
                    calls=calls,
                    phase=ph,
                )
            )

        bwd = phase == "backward"
        # forward: the all-gather enters a region, the reduction leaves it; backward the mirror
        tp(f"{phase}_all_gather", "all_gather", where(on & sp, per_pass, 0), entry=not bwd)
        tp(f"{phase}_reduce_scatter", "reduce_scatter", where(on & sp, closing, 0), entry=bwd)
        if bwd:
            tp("backward_input_regather", "all_gather", where(sp, per_pass, 0), _TP_REGATHER_SRC, entry=True)
        tp(f"{phase}_all_reduce", "all_reduce", where(on & logical_not(sp), closing, 0), entry=bwd)
    return tuple(out)


def tensor_parallel_collectives(
    *,
    activation_bytes: float,
    layers: int,
    micro_batches: int,
    sequence_parallel: bool,
    recompute: str,
    tp: GroupPlacement,
    network: Network,
    overlap: Overlap = "none",
    recompute_skipped_reductions: int = 0,
) -> tuple[Collective, ...]:
    """:func:`tensor_parallel_traffic` of one layout, timed on ``network`` over the ``tp`` group."""
    traffic = tensor_parallel_traffic(
        activation_bytes=activation_bytes,
        layers=layers,
        micro_batches=micro_batches,
        sequence_parallel=sequence_parallel,
        recompute_full=recompute == "full",
        overlap=overlap,
        recompute_skipped_reductions=recompute_skipped_reductions,
    )
    return timed_collectives(traffic, network, {"tp": tp})


def tp_entry_fraction(spec: ModelSpec) -> float:
    """Width of the attention region's tensor-parallel entry collectives over h: 1, or with MLA
    ``(q_in + r_kv + d_r) / h``. Megatron-Core ``MLASelfAttention`` (multi_latent_attention.py,
    ``get_query_key_value_tensors``) runs the replicated down projections on the local sequence
    shard and gathers their outputs, the query latent (r_q; without query compression the hidden
    state itself, h, for the column-parallel q), the key/value latent (r_kv) and the rotary key
    (d_r), for the up projections; their gradients return the same way. The TP all-reduce of the
    replicated down projections' weight gradients under SP (once per step, h·(r_q + r_kv + d_r)
    per layer) is not counted."""
    mla = spec.mla
    if mla is None:
        return 1.0
    q_in = mla.q_lora_rank or spec.hidden_size
    return (q_in + mla.kv_lora_rank + mla.qk_rope_head_dim) / spec.hidden_size


def recompute_skipped_tp_reductions(spec: ModelSpec, recipe: Recipe, layers: int) -> int:
    """Of the first ``layers`` layers, how many stop their full recompute before the block's closing
    tensor-parallel reduction (the down projection's all-reduce / reduce-scatter).

    PyTorch's early stop (``Recipe.recompute_early_stop``) does not rerun the ops after a block's
    last saved tensor; on a dense layer whose down-projection GEMM is among them
    (``flops.early_stop_skip``), the row-parallel reduction of its output is not rerun either.
    LoRA/QLoRA layers are not counted (which of the adapter and base partial sums is reduced is
    implementation-specific), nor MoE layers.
    """
    if recipe.recompute != "full" or not recipe.recompute_early_stop or recipe.is_peft:
        return 0
    from trainplan.flops import early_stop_skip

    b, s = float(recipe.micro_batch), float(recipe.seq_len)
    return sum(
        1
        for i in range(min(layers, spec.num_layers))
        if not spec.is_moe_layer(i) and early_stop_skip(spec, i, recipe, b, s).gemm_flops > 0
    )


_PP_SRC = (
    "Narayanan et al. 2021, Sec. 2.2 and 4.1: one activation send forward and one gradient send backward per "
    "micro-batch per stage boundary, split over the tp ranks (scatter/gather optimisation)"
)


def pipeline_traffic(
    *, activation_bytes: Num, tp_size: Int, micro_batches: Int, virtual_stages: Int
) -> tuple[Traffic, ...]:
    """Pipeline send/recv of one device per step.

    Each micro-batch leaves a stage once forward (activations) and once backward (gradients);
    with ``virtual_stages`` v the device runs v chunks, so 2·v·m sends of
    ``activation_bytes / tp`` (b·(s/cp)·h·e split by the scatter/gather optimisation, which SP
    gives for free). Neighbour stages sit on different domains once pp spans domains, so the send
    uses the level of the slowest hop. Exposed (on the 1F1B critical path); it is small.
    """
    return (
        Traffic(
            name="pp_send_recv",
            kind="send_recv",
            group="pp",
            overlap="none",
            source=_PP_SRC,
            buffer_bytes=activation_bytes / tp_size,
            calls=2 * virtual_stages * micro_batches,
        ),
    )


def pipeline_collectives(
    *,
    activation_bytes: float,
    tp_size: int,
    micro_batches: int,
    virtual_stages: int,
    pp: GroupPlacement,
    network: Network,
) -> tuple[Collective, ...]:
    """:func:`pipeline_traffic` of one layout, timed on ``network`` over the ``pp`` group."""
    traffic = pipeline_traffic(
        activation_bytes=activation_bytes,
        tp_size=tp_size,
        micro_batches=micro_batches,
        virtual_stages=virtual_stages,
    )
    return timed_collectives(traffic, network, {"pp": pp})


_EP_SRC = (
    "Lepikhin et al. 2020 (GShard) and Fedus et al. 2021 (Switch), Sec. 2.2: dispatch and combine all-to-all of "
    "the routed tokens per MoE layer, forward and backward"
)


def expert_parallel_traffic(
    *, routed_bytes: Num, moe_layers: Int, micro_batches: Int, recompute_full: Bool
) -> tuple[Traffic, ...]:
    """Expert-parallel all-to-alls of one device per step.

    ``routed_bytes`` = local tokens · K · h · e · capacity factor: each token goes to K experts
    (dispatch) and comes back (combine). Per MoE layer per micro-batch: 2 all-to-alls forward,
    2 backward, 2 more with full recompute. Not overlapped by default (DualPipe-style schedules
    hide them; DeepSeek-V3 report, Sec. 3.2.1).
    """
    calls = 2 * moe_layers * micro_batches
    return tuple(
        Traffic(
            name=f"ep_{phase}_all_to_all",
            kind="all_to_all",
            group="ep",
            overlap="none",
            source=_EP_SRC,
            buffer_bytes=routed_bytes,
            calls=where(recompute_full, calls, 0) if phase == "recompute" else calls,
            phase=phase,
        )
        for phase in ("forward", "backward", "recompute")
    )


_ETP_SRC = (
    "NVIDIA/Megatron-LM@d98e8a6 megatron/core/transformer/moe/token_dispatcher.py "
    "MoEAlltoAllTokenDispatcher (L741-750, L824-833): with an expert tensor-parallel group of more "
    "than one rank the routed tokens are all-gathered over it after the dispatch all-to-all and "
    "reduce-scattered before the combine"
)


def moe_layer_dispatches(recipe: Recipe) -> bool:
    """Whether the MoE layer is Megatron-Core's (the megatron stack): its token dispatcher feeds the
    experts, gathering the routed tokens over the expert-TP group when experts are split
    (:func:`expert_tp_traffic`), and no dense tensor-parallel region surrounds its MLP
    (:attr:`TrafficInputs.moe_tp_dispatch`)."""
    return recipe.stack == "megatron"


def expert_tp_traffic(
    *, gathered_bytes: Num, moe_layers: Int, micro_batches: Int, recompute_full: Bool
) -> tuple[Traffic, ...]:
    """The expert tensor-parallel gathers of Megatron-Core's all-to-all token dispatcher when each
    expert is split over tp ranks (``Layout.etp`` = tp > 1): per MoE layer per micro-batch an
    all-gather of the routed tokens over the expert-TP group after the dispatch all-to-all and a
    reduce-scatter before the combine; backward the mirror; full recompute runs the forward pair
    again. ``gathered_bytes`` is the gathered buffer, the tp group's routed tokens · K · h · e ·
    capacity factor. The grouped fc1 saves the gathered input (``memory.layer_activations``
    ``expert_inputs``), so backward gathers nothing again (:data:`_ETP_SRC`)."""
    calls = moe_layers * micro_batches
    out: list[Traffic] = []
    for phase in ("forward", "backward", "recompute"):
        ph: Phase = phase
        n = where(recompute_full, calls, 0) if phase == "recompute" else calls
        for kind in ("all_gather", "reduce_scatter"):
            out.append(
                Traffic(
                    name=f"etp_{phase}_{kind}",
                    kind=kind,
                    group="etp",
                    overlap="none",
                    source=_ETP_SRC,
                    buffer_bytes=gathered_bytes,
                    calls=n,
                    phase=ph,
                )
            )
    return tuple(out)


def expert_parallel_collectives(
    *,
    routed_bytes: float,
    moe_layers: int,
    micro_batches: int,
    recompute: str,
    ep: GroupPlacement,
    network: Network,
) -> tuple[Collective, ...]:
    """:func:`expert_parallel_traffic` of one layout, timed on ``network`` over the ``ep`` group."""
    traffic = expert_parallel_traffic(
        routed_bytes=routed_bytes,
        moe_layers=moe_layers,
        micro_batches=micro_batches,
        recompute_full=recompute == "full",
    )
    return timed_collectives(traffic, network, {"ep": ep})


_CP_SRC = (
    "Liu et al. 2023 (Ring Attention), Sec. 3: cp−1 ring steps per layer pass the local K,V block while the "
    "current block's attention is computed; backward also passes dK,dV (Megatron-LM context parallelism)"
)


def context_parallel_traffic(
    *, kv_bytes: Num, cp_size: Int, layers: Int, micro_batches: Int, recompute_repeats_ring: Bool
) -> tuple[Traffic, ...]:
    """Ring-attention K/V exchange of one device per step.

    ``kv_bytes`` = 2·b·(s/cp)·(k·d/tp)·e, the local K and V. Forward: cp−1 send/recv steps of it per
    layer, overlappable with the attention of the block in hand; backward: cp−1 steps of K,V plus
    dK,dV (2× the bytes); full and selective recompute repeat the forward ring
    (``recompute_repeats_ring``), behind the backward's attention.
    """
    steps = (cp_size - 1) * layers * micro_batches

    def ring(name: str, nbytes: Num, overlap: Overlap, phase: Phase, calls: Num) -> Traffic:
        return Traffic(
            name=name,
            kind="send_recv",
            group="cp",
            overlap=overlap,
            source=_CP_SRC,
            buffer_bytes=nbytes,
            calls=calls,
            phase=phase,
        )

    return (
        ring("cp_forward_kv", kv_bytes, "forward", "forward", steps),
        ring("cp_backward_kv", 2 * kv_bytes, "backward", "backward", steps),
        ring("cp_recompute_kv", kv_bytes, "backward", "recompute", where(recompute_repeats_ring, steps, 0)),
    )


def context_parallel_collectives(
    *,
    kv_bytes: float,
    layers: int,
    micro_batches: int,
    recompute: str,
    cp: GroupPlacement,
    network: Network,
) -> tuple[Collective, ...]:
    """:func:`context_parallel_traffic` of one layout, timed on ``network`` over the ``cp`` group."""
    traffic = context_parallel_traffic(
        kv_bytes=kv_bytes,
        cp_size=cp.size,
        layers=layers,
        micro_batches=micro_batches,
        recompute_repeats_ring=repeats_attention(recompute),
    )
    return timed_collectives(traffic, network, {"cp": cp})


def zero3_gather_units(spec: ModelSpec, layout: Layout) -> int:
    """Collectives per pass of a ZeRO-3 stage on the busiest pipeline stage (the most layers of
    ``layout.stage_layers``: ⌈L/pp⌉ for an even split).

    ``"block"``: one per block plus one root unit (embeddings, final norm, head: torchtitan
    ``apply_fsdp`` shards each block and then the whole model). ``"parameter"``: one per parameter
    tensor of the stage's layers plus the root's (:func:`trainplan.models.params.layer_parameter_tensors`),
    the busiest stage taken to hold the root.
    """
    return int(gather_units(spec, most_stage_layers(spec, layout), layout.zero3_granularity))


def most_stage_layers(spec: ModelSpec, layout: Layout) -> int:
    """Layers of the pipeline stage that holds the most (``layout.stage_layers``)."""
    return max(map(len, layout.stage_layers(spec.num_layers)))


def gather_units(spec: ModelSpec, layers: Int, granularity: str) -> Int:
    """:func:`zero3_gather_units` of a stage of ``layers`` layers (``Num``: one per candidate)."""
    if granularity == "block":
        return layers + 1
    from trainplan.models.params import layer_parameter_tensors, root_parameter_tensors

    per_layer = max(layer_parameter_tensors(spec, i) for i in range(spec.num_layers))
    return layers * per_layer + root_parameter_tensors(spec)


def gather_vectors(spec: ModelSpec, layers: Int, granularity: str) -> tuple[Int, Num]:
    """(tensors, elements) of the one-dimensional parameters among :func:`gather_units`: biases
    and norms of ``layers`` layers (the layer with the most tensors, as :func:`gather_units`
    counts) and the final norm; (0, 0) for ``"block"``, whose units hold whole blocks."""
    if granularity == "block":
        return 0, 0.0
    from trainplan.models.params import layer_parameter_tensors, layer_vector_tensors, root_vector_tensors

    widest = max(range(spec.num_layers), key=lambda i: layer_parameter_tensors(spec, i))
    count, elements = layer_vector_tensors(spec, widest)
    root_count, root_elements = root_vector_tensors(spec)
    return layers * count + root_count, as_float(layers) * float(elements) + float(root_elements)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrafficInputs:
    """The numbers :func:`step_traffic` reads, floats for one layout or arrays for many.

    Layout degrees and per-candidate choices are ``Num``; the model's dimensions and the options
    the planner holds fixed for a whole search (``granularity``, ``overlap_param_gather``) are
    plain values."""

    tp: Int
    pp: Int
    cp: Int
    ep: Int
    dp: Int
    zero: Int
    micro_batches: Int
    micro_batch: Int
    sequence_parallel: Bool
    recompute_full: Bool
    recompute_repeats_ring: Bool  # full or selective: the context-parallel ring runs again
    regather_for_recompute: Bool  # full or sac: per-parameter ZeRO-3 gathers run again
    skipped_reductions: Int  # recompute_skipped_tp_reductions of the stage
    virtual_stages: Int
    weight_bytes: Num  # bytes per element of the weight dtype (gradients, activations)
    stored_weight_bytes: Num  # bytes per stored weight element (QLoRA: NF4)
    dense_params: Num
    expert_params: Num
    trainable_dense_params: Num
    trainable_expert_params: Num
    granularity: str = "block"
    overlap_param_gather: bool = False
    capacity_factor: float = 1.0  # routed-expert slots per routed token (flops.expert_slot_ratio)
    etp: Int | None = None  # expert tensor parallelism (Layout.etp, an array in the planner; None: tp)
    moe_tp_dispatch: bool = False
    """Megatron-Core's MoE layer (the megatron stack): the routed tokens reach split experts through
    the dispatcher's expert-TP gathers (:func:`expert_tp_traffic`) and the layer has no dense
    tensor-parallel MLP region but its shared experts'. False: the MoE MLP is costed as a dense
    MLP region of b·s·h."""


def step_traffic(
    spec: ModelSpec, seq_len: int, x: TrafficInputs, *, with_buffers: bool = True
) -> tuple[Traffic, ...]:
    """Every collective of one step on a device of the busiest pipeline stage, over ``Num``.

    Parameter counts are whole-model numbers: dense (everything but routed experts) and routed
    experts. Per device they divide by tp·pp (dense) and tp·pp·ep (experts; expert tensor
    parallelism = tp). Weights travel in their storage dtype (QLoRA: NF4, 0.5 B), gradients in the
    weight dtype of the trained parameters. Layers per stage = ⌈L/pp⌉ (the busiest stage).

    ``with_buffers=False``: the buffer sizes are left 0 (a caller that has them per key and wants
    only each candidate's calls).
    """
    tp, pp, cp, ep = x.tp, x.pp, x.cp, x.ep
    e, w = x.weight_bytes, x.stored_weight_bytes
    m = x.micro_batches
    layers = ceil_div(spec.num_layers, pp)
    units = gather_units(spec, layers, x.granularity)
    vector_units, vector_elements = gather_vectors(spec, layers, x.granularity)
    shard = x.dp * cp
    sized = with_buffers
    tpp = as_float(tp * pp) if sized else 1.0
    # the stage's share of the model's dense parameters that are biases and norms (tp-sharded
    # like the rest: an approximation for the replicated norms)
    dense_on_stage = x.dense_params / as_float(pp)
    vector_fraction = (
        minimum(1.0, vector_elements / maximum(dense_on_stage, 1.0)) if x.granularity != "block" else 0.0
    )
    out: list[Traffic] = []
    out += data_parallel_traffic(
        zero=x.zero,
        param_bytes=x.dense_params / tpp * w if sized else 0.0,
        grad_bytes=x.trainable_dense_params / tpp * e if sized else 0.0,
        # PEFT (trainable < dense): ZeRO-1/2 re-gather only the adapters, in the weight dtype
        updated_param_bytes=where(
            x.trainable_dense_params < x.dense_params,
            x.trainable_dense_params / tpp * e,
            x.dense_params / tpp * w,
        )
        if sized
        else 0.0,
        micro_batches=m,
        shard_size=shard,
        overlap_param_gather=x.overlap_param_gather,
        gather_units=units,
        granularity=x.granularity,
        regather_for_recompute=x.regather_for_recompute,
        vector_units=vector_units,
        vector_fraction=vector_fraction,
    )
    et = tp if x.etp is None else x.etp
    if spec.moe is not None:
        tppe = as_float(et * pp * ep) if sized else 1.0
        out += data_parallel_traffic(
            zero=x.zero,
            param_bytes=x.expert_params / tppe * w if sized else 0.0,
            grad_bytes=x.trainable_expert_params / tppe * e if sized else 0.0,
            updated_param_bytes=where(
                x.trainable_expert_params < x.expert_params,
                x.trainable_expert_params / tppe * e,
                x.expert_params / tppe * w,
            )
            if sized
            else 0.0,
            micro_batches=m,
            shard_size=tp * shard // (ep * et),
            group="expert_dp",
            prefix="expert_dp",
            overlap_param_gather=x.overlap_param_gather,
            gather_units=units,
            granularity=x.granularity,
            regather_for_recompute=x.regather_for_recompute,
        )
    b, s, h = x.micro_batch, float(seq_len), float(spec.hidden_size)
    act = b * (s / cp) * h * e if sized else 0.0
    moe_layers = ceil_div(spec.num_moe_layers, pp) if spec.moe is not None else 0
    if _may_span(tp):
        # Megatron-Core's MoE layer has no dense tensor-parallel region around its MLP: its experts
        # are fed by the dispatcher (expert_tp_traffic), its shared experts keep one. Parallel
        # folding is modelled on that stack only (flops.check_moe_tp).
        dispatched = spec.moe is not None and x.moe_tp_dispatch and not spec.moe.num_shared_experts
        out += tensor_parallel_traffic(
            activation_bytes=act,
            layers=layers,
            micro_batches=m,
            sequence_parallel=x.sequence_parallel,
            recompute_full=x.recompute_full,
            recompute_skipped_reductions=x.skipped_reductions,
            entry_fraction=tp_entry_fraction(spec),
            mlp_free_layers=moe_layers if dispatched else 0,
        )
    if _may_span(pp):
        out += pipeline_traffic(
            activation_bytes=act, tp_size=tp, micro_batches=m, virtual_stages=x.virtual_stages
        )
    if spec.moe is not None and _may_span(ep):
        local_tokens = b * s / cp / where(x.sequence_parallel, tp, 1) if sized else 0.0
        out += expert_parallel_traffic(
            routed_bytes=local_tokens * spec.moe.top_k * h * e * x.capacity_factor if sized else 0.0,
            moe_layers=moe_layers,
            micro_batches=m,
            recompute_full=x.recompute_full,
        )
    if spec.moe is not None and x.moe_tp_dispatch and _may_span(et):
        out += expert_tp_traffic(
            gathered_bytes=b * (s / cp) * spec.moe.top_k * h * e * x.capacity_factor if sized else 0.0,
            moe_layers=moe_layers,
            micro_batches=m,
            recompute_full=x.recompute_full,
        )
    if _may_span(cp):
        kv_heads_local = maximum(spec.num_kv_heads / as_float(tp), 1.0) if sized else 0.0
        out += context_parallel_traffic(
            # K (d per head) and V (d_v per head; d without MLA, whose ring passes the expanded K, V)
            kv_bytes=b * (s / cp) * kv_heads_local * (spec.head_dim + spec.v_head_dim) * e if sized else 0.0,
            cp_size=cp,
            layers=layers,
            micro_batches=m,
            recompute_repeats_ring=x.recompute_repeats_ring,
        )
    return tuple(out)


def _never(calls: Num) -> bool:
    """True only for a scalar call count of 0: a collective one layout does not issue is not
    declared (an array may issue it on some candidates: declared)."""
    return (calls.__class__ is int or calls.__class__ is float) and calls == 0


def _may_span(group_size: Int) -> bool:
    """False only for a group known to be one rank (a scalar 1): it issues no collective, so
    its traffic need not be declared. An array may hold larger groups: declared."""
    return not (group_size.__class__ is int and group_size == 1)


def step_collectives(
    spec: ModelSpec,
    recipe: Recipe,
    layout: Layout,
    network: Network,
    placements: dict[str, GroupPlacement],
    *,
    dense_params: float,
    expert_params: float = 0.0,
    trainable_dense_params: float | None = None,
    trainable_expert_params: float | None = None,
    micro_batches: int = 1,
    overlap_param_gather: bool = False,
    device_bytes_per_s: float = 0.0,
) -> tuple[Collective, ...]:
    """Every collective of one step on a device of the busiest pipeline stage (:func:`step_traffic`
    of the layout, timed on ``network``). Trainable counts default to the full counts (PEFT: pass
    the adapter counts); ``device_bytes_per_s``: the device's achievable memory bandwidth
    (:func:`timed_collectives`)."""
    e = BYTES_PER_ELEMENT[recipe.weight_dtype]
    traffic = step_traffic(
        spec,
        recipe.seq_len,
        TrafficInputs(
            tp=layout.tp,
            pp=layout.pp,
            cp=layout.cp,
            ep=layout.ep,
            dp=layout.dp,
            zero=layout.zero,
            micro_batches=micro_batches,
            micro_batch=recipe.micro_batch,
            sequence_parallel=layout.sequence_parallel,
            recompute_full=recipe.recompute == "full",
            recompute_repeats_ring=repeats_attention(recipe.recompute),
            regather_for_recompute=reruns_forward_hooks(recipe.recompute),
            skipped_reductions=recompute_skipped_tp_reductions(spec, recipe, most_stage_layers(spec, layout)),
            virtual_stages=layout.virtual_stages,
            weight_bytes=e,
            stored_weight_bytes=recipe.gathered_weight_bytes,
            dense_params=dense_params,
            expert_params=expert_params,
            trainable_dense_params=dense_params if trainable_dense_params is None else trainable_dense_params,
            trainable_expert_params=expert_params
            if trainable_expert_params is None
            else trainable_expert_params,
            granularity=layout.zero3_granularity,
            overlap_param_gather=overlap_param_gather,
            capacity_factor=expert_slot_ratio(spec, recipe),
            etp=layout.etp,
            moe_tp_dispatch=moe_layer_dispatches(recipe),
        ),
    )
    return timed_collectives(traffic, network, placements, device_bytes_per_s)
