"""Hardware catalog: built-in entries, look-ups, user files, systems and rendering."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from trainplan.dtypes import PEAK_KEYS
from trainplan.errors import CatalogError, TrainplanError
from trainplan.hardware import (
    Accelerator,
    System,
    get_accelerator,
    list_accelerators,
    load_hardware_file,
    render_show,
    render_table,
)
from trainplan.hardware.catalog import builtin_accelerators
from trainplan.units import GiB, MiB

EXPECTED = {
    "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "b300", "gb200", "gb300",
    "vr200", "rtx-4090", "l40s", "mi250x", "mi300x", "mi325x", "mi350x", "mi355x", "tpu-v4",
    "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "trn1", "trn2", "trn3", "gaudi2", "gaudi3", "wse-3",
    "h800", "h20", "a800", "rtx-5090", "mi455x", "trn2-ultraserver",
    "v100-16gb", "v100-32gb", "rtx-a6000", "rtx-3090", "a10g", "l4",
}  # fmt: skip


def test_every_expected_entry_is_built_in() -> None:
    names = {a.name for a in list_accelerators()}
    assert names == EXPECTED


@pytest.mark.parametrize("acc", builtin_accelerators(), ids=lambda a: a.name)
def test_builtin_entry_is_sourced_and_sane(acc: Accelerator) -> None:
    for group in ("peak_flops", "memory", "power", "price"):
        assert acc.sources.get(group, "").strip(), f"{acc.name} lacks a {group} source"
    for link in (acc.scale_up, acc.scale_out, acc.host_link):
        if link is not None:
            assert link.source.strip()
            assert link.bandwidth_bytes_per_s > 0 and link.latency_s >= 0
    assert set(acc.peak_flops) <= set(PEAK_KEYS)
    # Dense peaks only: a narrower format is never slower than bf16 on the same chip.
    if "bf16" in acc.peak_flops and "fp8" in acc.peak_flops:
        assert acc.peak_flops["fp8"] >= acc.peak_flops["bf16"]
    if "fp32" in acc.peak_flops and "bf16" in acc.peak_flops:
        assert acc.peak_flops["bf16"] > acc.peak_flops["fp32"]
    assert 1e9 < acc.memory_bytes < 1e12
    for offer in acc.cloud:
        assert re.match(r"^\d{4}-\d{2}(-\d{2})?$", offer.date)
        assert offer.source.strip() and offer.usd_per_device_hour > 0
    d = acc.to_dict()
    assert d["name"] == acc.name and d["memory_bytes"] == acc.memory_bytes


def test_nvl72_and_scale_up_domains() -> None:
    for name in ("gb200", "gb300", "vr200"):
        assert get_accelerator(name).scale_up.domain_size == 72
    assert get_accelerator("h100-sxm").scale_up.domain_size == 8
    assert get_accelerator("tpu-v5e").scale_up.domain_size == 256


def test_spot_values() -> None:
    h100 = get_accelerator("h100-sxm")
    assert h100.peak_flops_per_s("bf16") == pytest.approx(989.4e12, rel=0.005)
    assert h100.memory_bytes == 81559 * MiB  # nvidia-smi total
    assert h100.scale_up.bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 GB/s bidirectional / 2
    assert h100.scale_out is not None and h100.scale_out.bandwidth_bytes_per_s == pytest.approx(50e9)
    assert get_accelerator("a100-80gb").memory_bytes == 80 * GiB
    b200 = get_accelerator("b200")
    assert b200.supports("fp4") and b200.peak_flops_per_s("fp4") == pytest.approx(9e15)
    assert get_accelerator("mi300x").peak_flops_per_s("bf16") == pytest.approx(1307.4e12)
    assert get_accelerator("rtx-4090").peak_flops_per_s("bf16") == pytest.approx(165.2e12)  # FP32 accumulate


def test_missing_dtype_is_a_helpful_error() -> None:
    a100 = get_accelerator("a100-80gb")
    assert not a100.supports("fp8")
    with pytest.raises(CatalogError) as exc:
        a100.peak_flops_per_s("fp8")
    msg = str(exc.value)
    assert "a100-80gb has no fp8 peak" in msg and "bf16" in msg and "--precision bf16" in msg


def test_aliases_and_case() -> None:
    assert get_accelerator("H100").name == "h100-sxm"
    assert get_accelerator("  h100_SXM5 ").name == "h100-sxm"
    assert get_accelerator("a100").name == "a100-80gb"
    assert get_accelerator("Trillium").name == "tpu-v6e"
    assert get_accelerator("rubin").name == "vr200"


def test_unknown_name_suggests() -> None:
    with pytest.raises(CatalogError) as exc:
        get_accelerator("h1000")
    assert exc.value.field == "hardware"
    msg = str(exc.value)
    assert "unknown accelerator 'h1000'" in msg
    assert "h100-sxm" in msg and "h100-pcie" in msg and "trainplan hardware list" in msg


def test_lookup_by_name_finds_what_the_whole_catalog_finds() -> None:
    from trainplan.hardware.catalog import find, find_builtin

    catalog = builtin_accelerators()
    for acc in catalog:
        for key in (acc.name, *acc.aliases, acc.name.upper(), f" {acc.name.replace('-', '_')} "):
            assert find_builtin(key) == find(key, catalog), key
    assert find_builtin("no-such-chip") is None
    assert find_builtin("sxm") is None  # a fragment of a name is not a name


def test_builtins_load_fast_and_once() -> None:
    builtin_accelerators.cache_clear()
    t0 = time.perf_counter()
    first = builtin_accelerators()
    assert time.perf_counter() - t0 < 0.25  # ~20 ms warm; generous for slow CI
    assert builtin_accelerators() is first


USER_ENTRY = """
[[accelerator]]
name = "my-npu"
display_name = "My NPU"
vendor = "Acme"
family = "X1"
year = 2025
status = "shipping"
aliases = ["npu1"]
memory_bytes = 64e9
memory_bandwidth_bytes_per_s = 2.0e12
memory_type = "HBM3"
tdp_w = 500.0
devices_per_node = 8
notes = ["measured in-house"]

[accelerator.peak_flops]
bf16 = 500e12
fp8 = 1000e12

[accelerator.sources]
peak_flops = "Acme datasheet rev 1"
memory = "Acme datasheet rev 1"
power = "Acme datasheet rev 1"

[accelerator.scale_up]
name = "AcmeLink"
bandwidth_bytes_per_s = 200e9
latency_s = 1e-6
domain_size = 8
source = "Acme datasheet rev 1"

[[accelerator.cloud]]
provider = "AcmeCloud"
instance = "x1.8"
usd_per_device_hour = 1.5
devices_per_instance = 8
date = "2026-01"
source = "https://example.com/pricing"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_user_file_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path, USER_ENTRY)
    (acc,) = load_hardware_file(path)
    assert acc.name == "my-npu" and acc.peak_flops_per_s("fp8") == 1e15
    assert acc.scale_out is None and acc.purchase_usd is None
    assert get_accelerator("NPU1", extra_files=[path]) == acc
    assert "my-npu" in {a.name for a in list_accelerators(extra_files=[path])}
    assert acc.to_dict()["cloud"] == [
        {
            "provider": "AcmeCloud",
            "instance": "x1.8",
            "kind": "on-demand",
            "usd_per_device_hour": 1.5,
            "devices_per_instance": 8,
            "date": "2026-01",
            "source": "https://example.com/pricing",
        }
    ]


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('memory_type = "HBM3"\n', "", "memory_type"),  # missing key
        ("tdp_w = 500.0", 'tdp_w = 500.0\ncolour = "red"', "colour"),  # unknown key
        ("year = 2025", 'year = "2025"', "year"),  # wrong type
        ("memory_bytes = 64e9", "memory_bytes = -64e9", "memory_bytes"),  # negative
        ('peak_flops = "Acme datasheet rev 1"\n', "", "sources.peak_flops"),  # missing source
        ('power = "Acme datasheet rev 1"\n', "", "sources.power"),  # tdp without a source
        ("bf16 = 500e12", "bf17 = 500e12", "peak_flops.bf17"),  # unknown dtype
        ("bandwidth_bytes_per_s = 200e9", "bandwidth_bytes_per_s = 0", "scale_up.bandwidth_bytes_per_s"),
        ("latency_s = 1e-6\n", "", "scale_up.latency_s"),  # missing link key
        ('date = "2026-01"', 'date = "Jan 2026"', "cloud[0].date"),
        ('status = "shipping"', 'status = "rumoured"', "status"),
        ('name = "my-npu"', 'name = "h100-sxm"', "name"),  # collides with a built-in
    ],
)
def test_malformed_user_file_names_the_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in USER_ENTRY
    path = _write(tmp_path, USER_ENTRY.replace(old, new, 1))
    with pytest.raises(CatalogError) as exc:
        get_accelerator("my-npu", extra_files=[path])
    assert exc.value.field == key
    if key != "name":
        assert "mine.toml" in str(exc.value) and "my-npu" in str(exc.value)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_hardware_file(tmp_path / "absent.toml")
    with pytest.raises(CatalogError, match="not valid TOML"):
        load_hardware_file(_write(tmp_path, "[[accelerator]\nname ="))
    with pytest.raises(CatalogError, match="no \\[\\[accelerator\\]\\] tables"):
        load_hardware_file(_write(tmp_path, "# empty\n"))


def test_system_defaults_and_validation() -> None:
    gb200 = get_accelerator("gb200")
    system = System(accelerator=gb200, num_devices=144)
    assert system.devices_per_node == 4 and system.num_nodes == 36
    assert system.scale_up_domain == 72 and system.num_scale_up_domains == 2
    assert System(accelerator=gb200, num_devices=16).scale_up_domain == 16  # capped
    h100 = get_accelerator("h100")
    s = System(accelerator=h100, num_devices=12)
    assert s.num_nodes == 2
    on_demand = [o for o in h100.cloud if o.kind == "on-demand"]
    cheapest_on_demand = min(o.usd_per_device_hour for o in on_demand)
    assert s.price is not None and s.price.kind == "on-demand"
    assert s.usd_per_hour == pytest.approx(12 * cheapest_on_demand)
    assert System(accelerator=get_accelerator("vr200"), num_devices=72).usd_per_hour is None
    with pytest.raises(TrainplanError, match="num_devices"):
        System(accelerator=h100, num_devices=0)
    with pytest.raises(TrainplanError, match="devices_per_node"):
        System(accelerator=h100, num_devices=8, devices_per_node=-1)
    with pytest.raises(TrainplanError, match="host_memory_bytes_per_node"):
        System(accelerator=h100, num_devices=8, host_memory_bytes_per_node=-1.0)
    assert s.to_dict()["num_nodes"] == 2


def test_render_table_and_show() -> None:
    table = render_table(list_accelerators())
    for name in ("h100-sxm", "mi300x", "tpu-v6e", "gaudi3", "wse-3"):
        assert name in table
    assert "GB = 1e9" in table and "989" in table
    show = render_show(get_accelerator("h100-sxm"))
    assert "NVIDIA H100 SXM5 80GB" in show and "989.4 TFLOP/s" in show
    assert "GiB" in show and "450.0 GB/s per direction" in show and "p5.48xlarge" in show
    assert "https://" in show and "Notes" in show


# Entries without a scale-out link, each for a stated reason (see their notes and docs/hardware.md):
# no per-GPU NIC documented (h100-pcie, rtx-4090, rtx-5090, rtx-3090, rtx-a6000), no DCN figure
# published (tpu-v4), or the wafer-scale system whose SwarmX/MemoryX bandwidth is unpublished (wse-3).
NO_SCALE_OUT = {"h100-pcie", "rtx-4090", "rtx-5090", "rtx-3090", "rtx-a6000", "tpu-v4", "wse-3"}


def test_scale_out_present_unless_explained() -> None:
    for acc in list_accelerators():
        if acc.name in NO_SCALE_OUT:
            assert acc.scale_out is None
            assert any(
                "scale-out" in n.lower() or "scale_out" in n.lower() or "dcn" in n.lower() for n in acc.notes
            )
            continue
        link = acc.scale_out
        assert link is not None, f"{acc.name} lacks a scale-out link"
        assert "latency" in link.source.lower(), acc.name  # the alpha is stated, not silent
        # One direction per chip: 800 Gb/s per device at most, except the announced MI455X
        # (Helios: 43 TB/s of NICs per 72 GPUs, ~300 GB/s per GPU).
        limit = 300e9 if acc.name == "mi455x" else 100e9
        # At least 3 Gb/s per device: AWS p3.16xlarge (8 V100, 25 Gb/s per instance) is the floor.
        assert 0.375e9 <= link.bandwidth_bytes_per_s <= limit, acc.name
        # Scale-out is never faster than the chip's own scale-up link.
        assert link.bandwidth_bytes_per_s <= acc.scale_up.bandwidth_bytes_per_s, acc.name


def test_scale_out_spot_values() -> None:
    expected = {
        "mi250x": 12.5e9,  # 4x Slingshot-11 200 Gb/s per 8-GCD Frontier node
        "mi300x": 50e9,  # Azure ND MI300X v5: 8x 400 Gb/s NDR per 8 GPUs
        "mi325x": 50e9,
        "mi350x": 50e9,
        "mi355x": 50e9,  # 8x Pollara 400 per 8 GPUs
        "tpu-v5e": 3.125e9,  # 2x 100 Gbps per 8-chip host
        "tpu-v5p": 6.25e9,  # 50 Gb/s per chip
        "tpu-v6e": 12.5e9,  # 100 Gb/s per chip
        "tpu-v7": 12.5e9,  # 100 Gb/s per chip
        "l40s": 6.25e9,  # g6e.48xlarge 400 Gb/s per 8 GPUs
        "v100-16gb": 0.390625e9,  # p3.16xlarge 25 Gb/s per 8 GPUs
        "v100-32gb": 1.5625e9,  # p3dn.24xlarge 100 Gb/s per 8 GPUs
        "a10g": 1.5625e9,  # g5.48xlarge 100 Gb/s per 8 GPUs
        "l4": 1.5625e9,  # g6.48xlarge 100 Gb/s per 8 GPUs
    }
    for name, value in expected.items():
        link = get_accelerator(name).scale_out
        assert link is not None and link.bandwidth_bytes_per_s == pytest.approx(value), name
        assert link.latency_s == pytest.approx(2.7e-6), name  # NCCL network class


def test_dated_cloud_offerings() -> None:
    priced = {a.name for a in list_accelerators() if a.cloud}
    for name in ("h100-pcie", "rtx-4090", "l40s", "mi300x", "mi325x", "tpu-v6e", "trn1"):
        assert name in priced, name
    l40s = get_accelerator("l40s")
    g6e = next(o for o in l40s.cloud if o.instance == "g6e.48xlarge")
    assert g6e.usd_per_instance_hour == pytest.approx(30.13118)
    assert g6e.date == "2026-08-26" and "299375be" in g6e.source
    mi300x = get_accelerator("mi300x")
    assert {o.provider for o in mi300x.cloud} >= {"Azure", "TensorWave"}
    cheapest = mi300x.cheapest_offering()
    assert cheapest is not None and cheapest.provider == "TensorWave"
    for acc in list_accelerators():
        for offer in acc.cloud:
            assert "http" in offer.source, (acc.name, offer.instance)
            # a per-device price between 10 cents and $100 per hour; catches per-instance typos
            assert 0.1 < offer.usd_per_device_hour < 100, (acc.name, offer.instance)
        if not acc.cloud:
            # an unpriced entry says why in its price source
            assert acc.sources["price"].strip()


def test_price_notes_have_no_mangled_dollar_figures() -> None:
    # "$3.22" must not lose its "$3" (a shell-expansion artefact once left ".22" behind).
    for acc in list_accelerators():
        for note in acc.notes:
            assert not re.search(r"(^|\s)\.\d", note), (acc.name, note)


def test_volta_has_fp16_tensor_cores_only_and_no_flash_attention() -> None:
    """V100: FP16 tensor cores (125 TFLOPS, no sparsity) and the FP32 vector rate; BF16, TF32 and
    FP8 are absent, never extrapolated, and a recipe needing them is refused with the fix."""
    from trainplan.errors import RecipeError
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.predict import estimate
    from trainplan.recipe import Recipe

    for name in ("v100-16gb", "v100-32gb"):
        v100 = get_accelerator(name)
        assert v100.supported_dtypes == ("fp32", "fp16") and not v100.sparse_peak_flops
        assert v100.peak_flops_per_s("fp16") == pytest.approx(125e12)
        assert v100.scale_up.bandwidth_bytes_per_s == pytest.approx(150e9)  # NVLink 2: 300 GB/s bidir
    system = System(accelerator=get_accelerator("v100-32gb"), num_devices=8)
    model = load_model("llama-3.2-1b")
    layout = Layout(dp=8)

    def run(**kw: object) -> object:
        recipe = Recipe(method="pretrain", global_batch=8, seq_len=1024, **kw)  # type: ignore[arg-type]
        return estimate(system, model, recipe, layout)

    with pytest.raises(RecipeError, match="no bf16 peak"):
        run(attention="eager")
    with pytest.raises(RecipeError, match="--attention eager"):
        run(precision="fp16")
    fp16 = run(precision="fp16", attention="eager")
    fp32 = run(precision="fp32", attention="eager")  # no TF32: the 15.7 TFLOPS vector rate
    assert fp32.time.compute_s > 5 * fp16.time.compute_s  # 125 / 15.7 = 8x peak
    assert fp16.step_band is not None and fp16.step_band.family == "nvidia-volta"
    assert not fp16.step_band.calibrated  # no Volta training row: the uncalibrated band
    assert any("no calibrated" in n for n in fp16.time.notes)


def test_ga102_cards_take_the_ampere_software_but_no_calibrated_band() -> None:
    """RTX A6000, RTX 3090 and A10G (GA102, sm_86) take the A100's Ampere κ and attention curves
    and fall in the consumer band class; GeForce GA102 halves the FP32-accumulate tensor rate."""
    from trainplan.bands import accelerator_family
    from trainplan.layout import Layout
    from trainplan.models import load_model
    from trainplan.predict import estimate
    from trainplan.recipe import Recipe
    from trainplan.timing import GENERATION, OTHER_DIE, calibrated_kappa

    for name in sorted(OTHER_DIE):
        acc = get_accelerator(name)
        assert GENERATION[name] == "ampere" and acc.family == "Ampere"
        assert calibrated_kappa(name, "pytorch") == calibrated_kappa("a100-80gb", "pytorch")
        assert accelerator_family(acc) == "consumer"
        for stack in ("megatron", "pytorch"):
            e = estimate(
                System(accelerator=acc, num_devices=1),
                load_model("llama-3.2-1b"),
                Recipe(method="lora", global_batch=1, seq_len=512, stack=stack),  # type: ignore[arg-type]
                Layout(dp=1),
            )
            assert e.step_band is not None and not e.step_band.calibrated, (name, stack)
    assert accelerator_family(get_accelerator("a100-80gb")) == "nvidia"
    assert accelerator_family(get_accelerator("l4")) == "consumer"
    a6000, rtx3090 = get_accelerator("rtx-a6000"), get_accelerator("rtx-3090")
    assert a6000.peak_flops["bf16"] == pytest.approx(2 * a6000.peak_flops["tf32"])
    assert rtx3090.peak_flops["bf16"] == pytest.approx(2 * rtx3090.peak_flops["tf32"], rel=0.01)
    assert rtx3090.peak_flops["bf16"] < a6000.peak_flops["bf16"] / 2
    assert a6000.scale_up.domain_size == 2 and a6000.scale_up.bandwidth_bytes_per_s == pytest.approx(56.25e9)


@pytest.mark.parametrize("table", ["entries", "offerings", "unpriced"])
def test_docs_hardware_tables_are_current(table: str) -> None:
    """docs/hardware.md's catalog tables equal their generator (scripts/regenerate.py rewrites them)."""
    from pathlib import Path

    from trainplan.hardware import render
    from trainplan.hardware.catalog import builtin_accelerators

    text = (Path(__file__).resolve().parents[1] / "docs" / "hardware.md").read_text(encoding="utf-8")
    committed = text.split(f"<!-- {table}: generated -->\n", 1)[1].split(f"<!-- end of {table} -->", 1)[0]
    build = getattr(render, f"{table}_markdown")
    assert committed == build(builtin_accelerators()), (
        f"docs/hardware.md's {table} table is out of date: run python scripts/regenerate.py"
    )
