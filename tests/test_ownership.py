"""Buy or rent (trainplan.ownership): break-even utilisation and months, every input stated."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from trainplan.cli import main
from trainplan.errors import TrainplanError
from trainplan.hardware import get_accelerator
from trainplan.ownership import Ownership, default_node_price


def _own(**kw: object) -> Ownership:
    acc = get_accelerator("h100-sxm")
    price, source = default_node_price(acc)
    args: dict[str, object] = dict(
        accelerator=acc,
        devices=16,
        node_price_usd=price,
        node_price_source=source,
        rent_usd_per_device_hour=4.0,
        rent_source="test",
    )
    args.update(kw)
    return Ownership(**args)  # type: ignore[arg-type]


def test_break_even_utilisation_equalises_the_yearly_costs() -> None:
    own = _own()
    u = own.break_even_utilisation
    assert 0 < u < 1
    assert own.owned_usd_per_year(u) == pytest.approx(own.rented_usd_per_year(u))
    assert own.owned_usd_per_year(u + 0.05) < own.rented_usd_per_year(u + 0.05)  # above: buying wins
    assert own.owned_usd_per_year(u - 0.05) > own.rented_usd_per_year(u - 0.05)


def test_break_even_months_pay_back_the_purchase() -> None:
    own = _own(utilisation=0.8)
    m = own.break_even_months(0.8)
    rent = own.rented_usd_per_year(0.8) / 12
    running = (own.power_usd_per_year(0.8) + own.facility_usd_per_year) / 12
    assert rent * m == pytest.approx(own.capex_usd + running * m)
    assert own.verdict().startswith("buy")


def test_cheap_rent_means_rent() -> None:
    own = _own(rent_usd_per_device_hour=0.5)
    assert own.break_even_utilisation > 1 or math.isinf(own.break_even_utilisation)
    assert math.isinf(own.break_even_months(own.utilisation)) or own.break_even_months(own.utilisation) > 48
    assert own.verdict().startswith("rent")


def test_nodes_and_power_follow_the_catalog() -> None:
    own = _own(devices=12)
    assert own.nodes == 2  # 8 per server
    assert own.node_kw == pytest.approx(10.2)  # DGX H100 maximum system power


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(TrainplanError, match="utilisation"):
        _own(utilisation=1.5)
    with pytest.raises(TrainplanError, match="years"):
        _own(years=0.0)
    acc = dataclasses.replace(
        get_accelerator("h100-sxm"),
        purchase_usd=None,
        purchase_date=None,
        purchase_kind=None,
        sources={k: v for k, v in get_accelerator("h100-sxm").sources.items() if k != "price"},
    )
    with pytest.raises(TrainplanError, match="--node-price"):
        default_node_price(acc)


def test_cli_states_every_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "b200", "--devices", "16", "--utilisation", "0.5", "--price", "3"]) == 0
    out = capsys.readouterr().out
    for flag in ("--node-price", "--network-fraction", "--usd-per-kwh", "--usd-per-kw-month", "--pue"):
        assert flag in out
    assert "2 server(s)" in out and "$3.00/device-hour (given (--price))" in out
    assert main(["cost", "b200", "--node-price", "300000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["inputs"]["node_price_usd"] == 300000 and d["capex_usd"] == pytest.approx(300000 * 1.15)
    assert d["verdict"].split(":")[0] in ("buy", "rent")


def test_a_whole_system_entry_is_priced_and_powered_as_itself() -> None:
    """A CS-3 entry is the system: its price and ~23 kW carry no server overhead or power ratio;
    a GPU entry's server adds both."""
    wse = get_accelerator("wse-3")
    price, source = default_node_price(wse)
    assert wse.purchase is not None and price == wse.purchase.usd_per_device
    assert "whole system" in source
    own = _own(
        accelerator=wse,
        devices=2,
        node_price_usd=price,
        node_price_source=source,
        rent_usd_per_device_hour=40.0,
    )
    assert own.node_kw == pytest.approx(wse.tdp_w / 1000.0)
    gpu_price, _ = default_node_price(get_accelerator("h100-sxm"))
    h100 = get_accelerator("h100-sxm")
    assert h100.purchase is not None and gpu_price > 8 * h100.purchase.usd_per_device


def test_an_unreachable_break_even_is_said_so() -> None:
    """Above 100% utilisation there is no break-even: the JSON says none, the verdict never."""
    own = _own(devices=1)  # a whole server bought for one device
    assert own.break_even_utilisation > 1
    assert own.to_dict()["break_even_utilisation"] is None
    assert "never" in own.verdict() and "no utilisation" not in own.verdict()
