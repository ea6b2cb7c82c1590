"""Dated prices: every figure sourced and dated, the default rule, filters by kind, provider and
age, the refusals, and the offering named on every estimate, plan and compare row."""

from __future__ import annotations

import datetime
import json

import pytest

from trainplan.cli import main
from trainplan.errors import CatalogError
from trainplan.hardware import System, get_accelerator, list_accelerators
from trainplan.hardware.accelerator import (
    NO_PUBLIC_PRICE_REASONS,
    PRICE_KINDS,
    PURCHASE_ESTIMATE_KIND,
    PURCHASE_KIND,
    PURCHASE_KINDS,
    SOURCE_KEYS,
    Accelerator,
    CloudOffering,
)
from trainplan.hardware.catalog import builtin_accelerators
from trainplan.hardware.prices import (
    FALLBACK_KINDS,
    PriceError,
    PriceQuery,
    default_offering,
    select_offering,
)
from trainplan.layout import Layout
from trainplan.models import load_model
from trainplan.planner.search import SearchSpace, compare, plan
from trainplan.predict import estimate
from trainplan.recipe import Recipe

TODAY = datetime.date(2026, 12, 1)

# Shipping accelerators for which no dated public price (rental or purchase) has been found yet;
# each says so, and what was searched, in ``sources.price`` (docs/hardware.md lists the searches).
# The set is held exactly: a price found removes a name, and no accelerator may join it (a new
# catalog entry comes with a dated price or, announced, the marker).
PRICE_GAPS = {"trn3", "trn2-ultraserver"}

# Accelerators with no dated per-hour rental price (a purchase price at most): estimates and plans
# need --price for them.
UNRENTED = PRICE_GAPS | {"vr200", "mi455x", "h20", "a800", "mi250x", "wse-3"}

# Accelerators whose only per-hour rate is a named report's own estimate (kind ``estimate``): no
# provider publishes one. h800: the DeepSeek-V3 report's assumed $2 per GPU-hour.
ESTIMATED_ONLY = {"h800"}


@pytest.mark.parametrize("acc", builtin_accelerators(), ids=lambda a: a.name)
def test_every_figure_group_has_a_source_and_a_date(acc: Accelerator) -> None:
    groups = ["peak_flops", "memory", "price", "links"]
    if acc.tdp_w is not None:
        groups.append("power")
    if acc.usable_memory_bytes is not None:
        groups.append("usable_memory")
    for group in groups:
        assert group in SOURCE_KEYS
        assert acc.dates.get(group), f"{acc.name}: no date for {group}"
        datetime.date.fromisoformat(acc.dates[group] + ("-01" if len(acc.dates[group]) == 7 else ""))
        if group != "links":
            assert acc.sources.get(group, "").strip(), f"{acc.name}: no source for {group}"
    for link in (acc.scale_up, acc.scale_out, acc.host_link):
        if link is not None:
            assert link.source.strip()
    for offer in acc.cloud:
        assert offer.kind in PRICE_KINDS
        assert "http" in offer.source and offer.date
        assert offer.day <= TODAY, (acc.name, offer.instance, offer.date)


def test_every_accelerator_has_a_dated_price_or_the_announced_marker() -> None:
    accs = list_accelerators()
    gaps = set()
    for acc in accs:
        prices = acc.dated_prices
        for price in prices:
            assert "http" in price.source, (acc.name, price)
            assert price.day <= TODAY, (acc.name, price)
        if acc.purchase_usd is not None:
            assert acc.purchase is not None and acc.purchase.kind == acc.purchase_kind
            assert acc.purchase.kind in PURCHASE_KINDS
            assert acc.purchase.date == acc.purchase_date
        if prices:
            assert acc.no_public_price is None, acc.name
            continue
        if acc.no_public_price is not None:
            # the marker: only for announced parts, with a source saying no price is published
            assert acc.status == "announced", acc.name
            assert acc.no_public_price in NO_PUBLIC_PRICE_REASONS
            assert acc.sources["price"].startswith("no public price (announced, unshipped)")
            assert "http" in acc.sources["price"], acc.name
            continue
        assert acc.status == "shipping", f"{acc.name} is announced: give the marker or a dated price"
        assert acc.sources["price"].strip(), f"{acc.name} lacks the reason it has no price"
        gaps.add(acc.name)
    assert gaps == PRICE_GAPS
    assert {a.name for a in accs if a.status == "announced"} <= {
        a.name for a in accs if a.no_public_price
    } | {a.name for a in accs if a.dated_prices}
    assert {a.name for a in accs if not a.cloud} == UNRENTED
    assert {a.name for a in accs if a.cloud and all(o.kind == "estimate" for o in a.cloud)} == ESTIMATED_ONLY
    rented = [a for a in accs if a.cloud]
    assert len(rented) >= 18
    assert {o.kind for a in rented for o in a.cloud} >= {"on-demand", "spot", "reserved", "capacity-block"}
    providers = {o.provider for a in rented for o in a.cloud}
    assert providers >= {"AWS", "GCP", "Azure", "CoreWeave", "Lambda", "Nebius", "Together", "RunPod"}
    for acc in accs:
        if acc.status == "announced":
            assert not acc.cloud, f"{acc.name} is announced but has a rental price"


def test_the_marker_and_the_purchase_date_are_refused_where_they_do_not_belong() -> None:
    base = get_accelerator("vr200")
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    with pytest.raises(CatalogError, match="announced part"):
        Accelerator(**{**fields, "status": "shipping"})
    with pytest.raises(CatalogError, match="a shipping part needs a dated price"):
        Accelerator(**{**fields, "no_public_price": "too expensive"})
    with pytest.raises(CatalogError, match="purchase_date"):
        Accelerator(**{**fields, "no_public_price": None, "purchase_usd": 1000.0})
    with pytest.raises(CatalogError, match="remove it or the prices"):
        Accelerator(
            **{**fields, "purchase_usd": 1000.0, "purchase_date": "2026-01", "purchase_kind": PURCHASE_KIND}
        )
    gaudi3 = get_accelerator("gaudi3")
    g = {f: getattr(gaudi3, f) for f in gaudi3.__dataclass_fields__}
    with pytest.raises(CatalogError, match="needs a purchase_usd"):
        Accelerator(**{**g, "purchase_usd": None})
    for kind in PURCHASE_KINDS:
        with pytest.raises(PriceError, match="trainplan cost"):
            PriceQuery(kind=kind)
    # a purchase price states whether it is a list price or a reported estimate, and nothing else
    for bad in (None, "street", "estimate"):
        with pytest.raises(CatalogError, match="purchase_kind"):
            Accelerator(**{**g, "purchase_kind": bad})
    with pytest.raises(CatalogError, match="purchase_kind"):
        Accelerator(**{**fields, "purchase_kind": PURCHASE_ESTIMATE_KIND})


def test_usable_memory_bounds_the_fit_and_sits_beside_nominal() -> None:
    gb300 = get_accelerator("gb300")
    assert gb300.memory_bytes == 288e9 and gb300.usable_memory_bytes == 279e9
    assert gb300.capacity_bytes == 279e9
    b200 = get_accelerator("b200")
    assert b200.usable_memory_bytes is not None and b200.usable_memory_bytes < b200.memory_bytes
    assert 8 * b200.capacity_bytes == pytest.approx(1.54e12, rel=0.01)  # 8 x 179 GiB
    assert b200.memory_bandwidth_bytes_per_s == 7.7e12
    h100 = get_accelerator("h100-sxm")
    assert h100.usable_memory_bytes is None and h100.capacity_bytes == h100.memory_bytes
    e = estimate(
        System(accelerator=gb300, num_devices=8),
        load_model("llama-3.1-8b"),
        Recipe(method="pretrain", global_batch=8, seq_len=4096),
        Layout(dp=8, zero=3),
    )
    assert e.memory.capacity_bytes == 279e9


def test_sparse_peaks_are_kept_apart_from_dense() -> None:
    for acc in list_accelerators():
        for dtype, sparse in acc.sparse_peak_flops.items():
            dense = acc.peak_flops.get(dtype)
            assert dense is None or sparse >= dense
    h800 = get_accelerator("h800")
    assert h800.sparse_peak_flops["bf16"] == pytest.approx(2 * h800.peak_flops["bf16"], rel=0.001)


def _brute_default(offers: tuple[CloudOffering, ...]) -> CloudOffering | None:
    for kind in FALLBACK_KINDS:
        same = [o for o in offers if o.kind == kind]
        if same:
            return min(same, key=lambda o: (o.usd_per_device_hour, -o.day.toordinal(), o.provider.lower()))
    return None


def test_default_rule_is_the_cheapest_on_demand_price() -> None:
    for acc in list_accelerators():
        assert default_offering(acc.cloud) == _brute_default(acc.cloud)
        assert acc.cheapest_offering() == _brute_default(acc.cloud)
    h100 = get_accelerator("h100-sxm")
    chosen = h100.cheapest_offering()
    assert chosen is not None and chosen.kind == "on-demand"
    cheaper = [o for o in h100.cloud if o.usd_per_device_hour < chosen.usd_per_device_hour]
    assert cheaper and all(o.kind != "on-demand" for o in cheaper)  # spot and reserved are cheaper


@pytest.mark.parametrize("kind", PRICE_KINDS)
def test_selection_by_kind(kind: str) -> None:
    for acc in list_accelerators():
        same = [o for o in acc.cloud if o.kind == kind]
        query = PriceQuery(kind=kind, today=TODAY)
        if same:
            picked = select_offering(acc.name, acc.cloud, query)
            assert picked is not None and picked.kind == kind
            assert picked.usd_per_device_hour == min(o.usd_per_device_hour for o in same)
        elif acc.cloud:
            with pytest.raises(PriceError, match="the catalog has"):
                select_offering(acc.name, acc.cloud, query)


def test_selection_by_provider_and_age() -> None:
    h100 = get_accelerator("h100-sxm")
    for provider in {o.provider for o in h100.cloud}:
        picked = select_offering(h100.name, h100.cloud, PriceQuery(provider=provider.upper(), today=TODAY))
        assert picked is not None and picked.provider == provider
        assert picked == _brute_default(tuple(o for o in h100.cloud if o.provider == provider))
    for days in (30, 120, 300, 800):
        fresh = tuple(o for o in h100.cloud if (TODAY - o.day).days <= days)
        query = PriceQuery(max_age_days=days, today=TODAY)
        if fresh:
            picked = select_offering(h100.name, h100.cloud, query)
            assert picked == _brute_default(fresh) and picked is not None
            assert picked.age_days(TODAY) <= days
        else:
            with pytest.raises(PriceError) as err:
                select_offering(h100.name, h100.cloud, query)
            assert err.value.field == "max_price_age"
            for o in h100.cloud:  # the refusal names what the catalog has
                assert o.date in err.value.message


def test_refusals_name_the_available_offers() -> None:
    h100 = get_accelerator("h100-sxm")
    with pytest.raises(PriceError) as err:
        select_offering(h100.name, h100.cloud, PriceQuery(provider="Oracle", today=TODAY))
    assert err.value.field == "provider" and "Nebius" in err.value.message and "AWS" in err.value.message
    with pytest.raises(PriceError, match="unknown price kind"):
        PriceQuery(kind="free")
    with pytest.raises(PriceError):
        PriceQuery(max_age_days=-1)
    # no price at all and no filter: unpriced (None), never an invented number
    assert select_offering("vr200", (), PriceQuery()) is None
    with pytest.raises(PriceError, match="no dated price for vr200"):
        select_offering("vr200", (), PriceQuery(kind="spot"))


def test_estimate_names_its_offering(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "llama-3.1-8b", "--hardware", "h100-sxm", "--devices", "8", "--zero", "3"]
    assert main([*argv, "--tokens", "1e9", "--price-kind", "spot", "--provider", "nebius", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    offer = next(o for o in get_accelerator("h100-sxm").cloud if o.provider == "Nebius" and o.kind == "spot")
    assert run["usd_per_device_hour"] == offer.usd_per_device_hour
    assert run["offering"]["provider"] == "Nebius" and run["price_kind"] == "spot"
    assert run["price_date"] == offer.date and run["price_provider"] == "Nebius"
    assert run["cost_usd"] == pytest.approx(run["device_hours"] * offer.usd_per_device_hour)
    assert main([*argv, "--tokens", "1e9", "--price-kind", "spot", "--provider", "nebius"]) == 0
    assert f"Nebius spot H100 SXM (per GPU) ({offer.date})" in capsys.readouterr().out
    assert main([*argv, "--provider", "oracle"]) == 2
    assert "Nebius" in capsys.readouterr().err
    assert main([*argv, "--max-price-age", "1"]) == 2
    assert "2026-08-26" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--price-kind", "free"])
    assert exit_.value.code == 2


RECIPE = Recipe(method="pretrain", tokens=1e10, global_batch=64, seq_len=4096)
SPACE = SearchSpace(micro_batches=(1,), recomputes=("none",), offloads=("none",), max_devices=64)


def test_plan_rows_carry_offering_price_and_date() -> None:
    names = ("h100-sxm", "mi300x", "b200", "a100-80gb")
    accs = [get_accelerator(n) for n in names]
    result = plan(load_model("llama-3.1-8b"), RECIPE, accs, space=SPACE, objective="cost", top=10)
    rows = result.to_dict()["plans"]
    assert rows
    for row in rows:
        acc = get_accelerator(row["system"]["accelerator"])
        expected = acc.cheapest_offering()
        assert expected is not None
        assert row["offering"] == expected.to_dict()
        assert row["usd_per_device_hour"] == expected.usd_per_device_hour
        assert row["price_date"] == expected.date
        assert row["run"]["price_kind"] == expected.kind
    # objective cost: accelerators compete, one row each, in cost order
    hw = [r["system"]["accelerator"] for r in rows]
    assert len(hw) == len(set(hw)) == len(names)
    costs = [r["run"]["cost_usd"] for r in rows]
    assert costs == sorted(costs)
    assert any("different providers" in n for n in result.notes)
    assert any("default price" in n for n in result.notes)


def test_plan_price_filters_and_refusals() -> None:
    accs = [get_accelerator(n) for n in ("h100-sxm", "mi300x")]
    model = load_model("llama-3.1-8b")
    spot = plan(model, RECIPE, accs, space=SPACE, objective="cost", price_query=PriceQuery(kind="spot"))
    for p in spot.plans:
        assert p.estimate.run.offering is not None and p.estimate.run.offering.kind == "spot"
    only_aws = plan(model, RECIPE, accs, space=SPACE, provider="aws")
    assert only_aws.unpriced == ("mi300x",)  # no AWS offering: planned for time, named
    assert all(
        p.estimate.run.offering is not None and p.estimate.run.offering.provider == "AWS"
        for p in only_aws.plans
        if p.estimate.system.accelerator.name == "h100-sxm"
    )
    with pytest.raises(PriceError) as err:
        plan(model, RECIPE, accs, space=SPACE, provider="nowhere")
    assert "TensorWave" in err.value.message and "AWS" in err.value.message
    with pytest.raises(PriceError):
        compare(model, RECIPE, accs, space=SPACE, price_query=PriceQuery(max_age_days=1, today=TODAY))


def test_cost_command_prices_rent_by_the_same_rule(capsys: pytest.CaptureFixture[str]) -> None:
    h100 = get_accelerator("h100-sxm")
    spot = select_offering(h100.name, h100.cloud, PriceQuery(kind="spot"))
    assert spot is not None
    assert main(["cost", "h100-sxm", "--price-kind", "spot", "--json"]) == 0
    out = capsys.readouterr().out
    assert str(spot.usd_per_device_hour) in out and spot.provider in out and "spot" in out
    assert main(["cost", "h100-sxm", "--provider", "oracle"]) == 2
    assert "Nebius" in capsys.readouterr().err


def test_a_reported_estimate_is_ranked_last_and_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    assert FALLBACK_KINDS[-1] == "estimate"
    h800 = get_accelerator("h800")
    offer = h800.cheapest_offering()
    assert offer is not None and offer.kind == "estimate" and "arxiv.org/abs/2412.19437" in offer.source
    assert "estimate" in offer.describe()
    # any sold kind, however dear, comes before an estimate
    sold = CloudOffering(
        provider="X",
        instance="x",
        usd_per_device_hour=99.0,
        date="2026-01",
        source="http://x",
        devices_per_instance=8,
    )
    for kind in FALLBACK_KINDS[:-1]:
        dear = CloudOffering(**{**sold.to_dict(), "kind": kind})  # type: ignore[arg-type]
        assert default_offering((offer, dear)) == dear
    assert select_offering(h800.name, h800.cloud, PriceQuery(kind="estimate")) == offer
    with pytest.raises(PriceError, match="the catalog has"):
        select_offering("h100-sxm", get_accelerator("h100-sxm").cloud, PriceQuery(kind="estimate"))
    argv = [
        "estimate",
        "llama-3.1-8b",
        "--hardware",
        "h800",
        "--devices",
        "8",
        "--zero",
        "3",
        "--tokens",
        "1e9",
    ]
    assert main([*argv, "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    assert run["price_kind"] == "estimate" and run["price_provider"] == "DeepSeek-V3 report"
    assert run["usd_per_device_hour"] == offer.usd_per_device_hour == 2.0
    assert main(argv) == 0
    assert "DeepSeek-V3 report estimate" in capsys.readouterr().out
    assert main(["hardware", "list"]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("h800 "))
    assert row.rstrip().endswith("2.00e") and "e = a rate a named report estimates" in table


def test_a_purchase_price_says_whether_it_is_a_list_price_or_an_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainplan.hardware.render import render_show, unpriced_markdown

    bought = [a for a in list_accelerators() if a.purchase is not None]
    assert {a.purchase.kind for a in bought if a.purchase is not None} == set(PURCHASE_KINDS)
    for acc in bought:
        p = acc.purchase
        assert p is not None
        assert p.label in p.describe() and p.label in render_show(acc)
        assert acc.to_dict()["purchase_kind"] == p.kind == p.to_dict()["kind"]
    assert get_accelerator("h100-sxm").purchase.kind == PURCHASE_ESTIMATE_KIND  # type: ignore[union-attr]
    assert get_accelerator("rtx-4090").purchase.kind == PURCHASE_KIND  # type: ignore[union-attr]
    assert "reported estimate, not a list price, 2024-07" in unpriced_markdown([get_accelerator("h20")])
    assert main(["cost", "h100-sxm"]) == 0
    assert "reported estimate, not a list price" in capsys.readouterr().out
    assert main(["cost", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    assert "list price" in out and "estimate" not in out.split("purchase price")[1].split(")")[0]
