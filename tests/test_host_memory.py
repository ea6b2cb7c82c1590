"""Offloaded states are checked against the server's CPU memory (memory.host_fits)."""

from __future__ import annotations

import dataclasses

import pytest

import trainplan
from trainplan.errors import CatalogError
from trainplan.hardware import get_accelerator
from trainplan.hardware.catalog import builtin_accelerators
from trainplan.hardware.system import System
from trainplan.memory import host_bytes_per_node, host_fits

# 405B fully offloaded (ZeRO-Infinity) on one 8-GPU server: ~16 bytes of states per parameter
# in host memory, 6.5 TB, against a 2 TiB p5.48xlarge.
BIG = dict(
    devices=8,
    zero=3,
    offload="optimizer+params",
    method="full",
    seq_len=1024,
    global_batch=8,
    recompute="full",
)


def test_every_catalog_host_figure_has_a_source() -> None:
    known = [a for a in builtin_accelerators() if a.host_memory_bytes_per_node is not None]
    assert len(known) >= 10
    for acc in known:
        assert acc.sources["host_memory"].strip()


def test_a_host_figure_without_source_is_refused() -> None:
    acc = get_accelerator("h100-sxm")
    sources = {k: v for k, v in acc.sources.items() if k != "host_memory"}
    with pytest.raises(CatalogError, match="host_memory"):
        dataclasses.replace(acc, sources=sources)


def test_per_node_is_the_partition_times_the_devices_on_the_server() -> None:
    assert host_bytes_per_node(100.0, 8) == 800.0
    assert host_fits(100.0, 8, 800.0) and not host_fits(100.0, 8, 799.0)
    system = System(accelerator=get_accelerator("h100-sxm"), num_devices=4)
    assert system.devices_on_a_node == 4  # a 4-GPU job shares one server
    assert System(accelerator=get_accelerator("h100-sxm"), num_devices=32).devices_on_a_node == 8


def test_offload_beyond_host_memory_does_not_fit() -> None:
    est = trainplan.estimate("llama-3.1-405b", hardware="h100-sxm", **BIG)
    mem = est.memory
    assert mem.device_fits and mem.host_fits is False and not est.feasible
    assert mem.host_bytes_per_node == pytest.approx(8 * mem.host_bytes)
    assert mem.host_bytes_per_node > get_accelerator("h100-sxm").host_memory_bytes_per_node
    d = est.to_dict()["memory"]
    assert d["fits"] is False and d["device_fits"] is True and d["host_fits"] is False
    assert any("host memory" in r for r in est.reasons())


def test_host_memory_flag_overrides_the_catalog() -> None:
    est = trainplan.estimate("llama-3.1-405b", hardware="h100-sxm", host_memory=8000, **BIG)
    assert est.memory.host_fits is True and est.feasible
    assert est.system.host_memory_source.startswith("given")


def test_unknown_host_memory_is_unchecked_and_says_so() -> None:
    acc = dataclasses.replace(
        get_accelerator("h100-sxm"),
        host_memory_bytes_per_node=None,
        sources={k: v for k, v in get_accelerator("h100-sxm").sources.items() if k != "host_memory"},
    )
    est = trainplan.estimate("llama-3.1-405b", hardware=acc, **BIG)
    assert est.memory.host_fits is None and est.feasible
    assert any("host memory unchecked" in n for n in est.memory.notes())


def test_no_offload_needs_no_host_check() -> None:
    est = trainplan.estimate("llama-3.1-8b", hardware="h100-sxm", devices=8, zero=3, method="full")
    assert est.memory.host_bytes == 0 and est.memory.host_fits is True


def test_planner_rejects_what_the_host_cannot_hold() -> None:
    kw = dict(method="full", seq_len=1024, global_batch=16, tokens=1e8, max_devices=16)
    small = trainplan.plan("llama-3.1-405b", hardware="h100-sxm", **kw)
    for row in small.plans:
        assert row.estimate.memory.host_fits is not False
    # 405B on at most 16 H100 needs offload beyond two 2 TiB servers; with room on the host the
    # same offload plans become feasible
    roomy = trainplan.plan("llama-3.1-405b", hardware="h100-sxm", host_memory=20000, **kw)
    assert small.min_devices["h100-sxm"] is None and not small.plans
    assert roomy.plans and roomy.min_devices["h100-sxm"] is not None
    cap = get_accelerator("h100-sxm").host_memory_bytes_per_node
    assert all(p.estimate.memory.host_bytes_per_node > cap for p in roomy.plans)
