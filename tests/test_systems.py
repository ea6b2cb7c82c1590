"""Rack and pod systems: each names its accelerator, scale-up domain and scale-out network, and its
totals are the accelerator's per-chip figures times its device count."""

from __future__ import annotations

import json

import pytest

from trainplan.cli import main
from trainplan.errors import CatalogError
from trainplan.hardware import get_accelerator
from trainplan.hardware.systems import builtin_systems, get_system
from trainplan.units import GiB

REQUIRED = {
    "gb200-nvl72", "gb300-nvl72", "vr200-nvl72", "mi455x-helios", "tpu-v5p-pod", "tpu-v6e-pod",
    "tpu7x-pod", "trn2-ultraserver", "dgx-b200",
}  # fmt: skip


@pytest.mark.parametrize("spec", builtin_systems(), ids=lambda s: s.name)
def test_system_is_sourced_and_consistent(spec) -> None:  # type: ignore[no-untyped-def]
    acc = spec.accelerator
    assert spec.source.startswith("http") or "http" in spec.source
    assert spec.scale_up and spec.scale_out and spec.date
    assert spec.scale_up_domain <= acc.scale_up.domain_size
    assert acc.scale_out is not None  # every system names a scale-out network with a modelled link
    t = spec.totals()
    assert t["capacity_bytes"] == acc.capacity_bytes * spec.devices
    for dtype, flops in acc.peak_flops.items():
        assert t[f"peak_flops.{dtype}"] == flops * spec.devices
    whole = spec.system()
    assert whole.num_devices == spec.devices and whole.scale_up_domain == spec.scale_up_domain
    assert spec.system(4).scale_up_domain == min(4, spec.scale_up_domain)
    with pytest.raises(CatalogError):
        spec.system(spec.devices + 1)


def test_the_published_systems_are_present() -> None:
    assert {s.name for s in builtin_systems()} >= REQUIRED
    assert get_system("vr200-nvl72").status == "announced"
    assert get_system("mi455x-helios").status == "announced"
    with pytest.raises(CatalogError, match="gb200-nvl72"):
        get_system("nvl576")


def test_published_totals_are_reproduced() -> None:
    # Trn2: 16 chips = 20.8 PF FP8 and 1,536 GiB; the UltraServer 64 chips = 83.2 PF and 6 TiB.
    trn2 = get_system("trn2-48xlarge").totals()
    assert trn2["peak_flops.fp8"] == pytest.approx(20.8e15, rel=0.002)
    assert trn2["memory_bytes"] == 1536 * GiB
    ultra = get_system("trn2-ultraserver")
    assert ultra.totals()["peak_flops.fp8"] == pytest.approx(83.2e15, rel=0.002)
    assert ultra.totals()["memory_bytes"] == 6144 * GiB
    assert ultra.accelerator.scale_up.domain_size == 64 > get_accelerator("trn2").scale_up.domain_size
    # DGX B200: 8 x 179 GiB usable (the "1.44 TB" of 8 x 180 GB), 1.65 TB nominal.
    dgx = get_system("dgx-b200").totals()
    assert dgx["capacity_bytes"] / GiB == pytest.approx(8 * 179.06, rel=0.001)
    # GB300 NVL72: ~20 TB of HBM usable (72 x 279 GB).
    assert get_system("gb300-nvl72").totals()["capacity_bytes"] == 72 * 279e9


def test_cli_lists_systems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware", "systems"]) == 0
    out = capsys.readouterr().out
    assert "gb300-nvl72" in out and "mi455x-helios*" in out
    assert main(["hardware", "systems", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {d["name"] for d in data} >= REQUIRED
