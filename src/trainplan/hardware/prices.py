"""Which dated price an accelerator is costed at: the default rule, the filters, the refusals.

Every catalog price is a :class:`~trainplan.hardware.accelerator.CloudOffering` with its provider,
kind (:data:`~trainplan.hardware.accelerator.PRICE_KINDS`), date and source. A request may narrow
them by kind (``--price-kind``), provider (``--provider``) and age (``--max-price-age`` days);
what remains is ranked by :data:`DEFAULT_RULE`:

* the kind asked for, else on-demand; an accelerator with no on-demand price falls back to its
  other kinds in :data:`FALLBACK_KINDS` order, and the row names the kind it got (``estimate``, a
  rate a named report states as its own estimate, comes last: it is used only where no provider
  publishes a rate, and every row priced by it says ``estimate``);
* among those, the lowest $/device-hour, whatever the provider (ties: the newer date, then the
  provider's name).

The rule never mixes silently: every estimate, plan and compare row names the provider, kind and
date of its price, and a plan whose accelerators are priced by different providers says so in its
notes (fix one provider with ``--provider``). A filter that leaves an accelerator nothing raises
:class:`PriceError` naming what the catalog has for it.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from trainplan.errors import TrainplanError
from trainplan.hardware.accelerator import PRICE_KINDS, PURCHASE_KINDS, CloudOffering

DEFAULT_KIND: Final = "on-demand"
FALLBACK_KINDS: Final[tuple[str, ...]] = (
    "on-demand",
    "reserved",
    "committed",
    "capacity-block",
    "spot",
    "estimate",
)
"""Kinds tried in turn when no kind is asked for: commitment-free first, preemptible next, and a
reported estimate (no provider's price) last."""
assert set(FALLBACK_KINDS) == set(PRICE_KINDS)

DEFAULT_RULE: Final = (
    "default price: the cheapest on-demand offering of each accelerator in the catalog, any provider "
    "(no on-demand price: reserved, committed, capacity-block, spot, then a reported estimate); each row "
    "names its provider, kind and date; narrow with --provider, --price-kind, --max-price-age"
)


class PriceError(TrainplanError):
    """No catalog price satisfies the requested kind, provider or age."""


@dataclass(frozen=True, kw_only=True)
class PriceQuery:
    """The price filters of a request. ``None`` leaves a filter open; ``today`` is the date the
    age is measured from (``None``: the machine's date)."""

    kind: str | None = None
    provider: str | None = None
    max_age_days: int | None = None
    today: datetime.date | None = None

    def __post_init__(self) -> None:
        if self.kind in PURCHASE_KINDS:
            raise PriceError(
                "price_kind",
                "a purchase price is a capital cost, not a rate per device-hour; compare buying with "
                f"renting with `trainplan cost`, or choose a rental kind: {', '.join(PRICE_KINDS)}",
            )
        if self.kind is not None and self.kind not in PRICE_KINDS:
            raise PriceError(
                "price_kind", f"unknown price kind {self.kind!r}; choose from {', '.join(PRICE_KINDS)}"
            )
        if self.provider is not None and not self.provider.strip():
            raise PriceError("provider", "name a provider, e.g. AWS, or leave --provider out")
        if self.max_age_days is not None and (
            isinstance(self.max_age_days, bool)
            or not isinstance(self.max_age_days, int)
            or self.max_age_days < 0
        ):
            raise PriceError(
                "max_price_age", f"must be a whole number of days >= 0, got {self.max_age_days!r}"
            )

    @property
    def is_open(self) -> bool:
        return self.kind is None and self.provider is None and self.max_age_days is None

    def reference_day(self) -> datetime.date:
        return self.today if self.today is not None else datetime.date.today()


OPEN: Final = PriceQuery()


def _rank(offer: CloudOffering) -> tuple[float, int, str]:
    return (offer.usd_per_device_hour, -offer.day.toordinal(), offer.provider.lower())


def default_offering(offers: Sequence[CloudOffering]) -> CloudOffering | None:
    """:data:`DEFAULT_RULE` over ``offers``; ``None`` when there is none."""
    for kind in FALLBACK_KINDS:
        same = [o for o in offers if o.kind == kind]
        if same:
            return min(same, key=_rank)
    return None


def _listing(offers: Sequence[CloudOffering], today: datetime.date | None) -> str:
    """Each offer with its date, and its age on ``today`` when an age was asked for."""
    return "; ".join(
        f"{o.provider} {o.kind} ${o.usd_per_device_hour:.2f} ({o.date}"
        + ("" if today is None else f", {o.age_days(today)} days old")
        + ")"
        for o in sorted(offers, key=lambda o: (o.provider.lower(), o.kind, o.usd_per_device_hour))
    )


def matching(offers: Sequence[CloudOffering], query: PriceQuery) -> list[CloudOffering]:
    """The offers the query's provider, kind and age filters keep."""
    today = query.reference_day()
    kept = list(offers)
    if query.provider is not None:
        kept = [o for o in kept if o.provider.lower() == query.provider.strip().lower()]
    if query.kind is not None:
        kept = [o for o in kept if o.kind == query.kind]
    if query.max_age_days is not None:
        kept = [o for o in kept if o.age_days(today) <= query.max_age_days]
    return kept


def refusal(name: str, offers: Sequence[CloudOffering], query: PriceQuery) -> PriceError:
    """Why ``query`` leaves accelerator ``name`` without a price, naming what the catalog has."""
    today = query.reference_day()
    if not offers:
        return PriceError(
            "price", f"the catalog has no dated price for {name}; give one with --price USD_PER_DEVICE_HOUR"
        )
    wanted = []
    if query.provider is not None:
        wanted.append(f"provider {query.provider!r}")
    if query.kind is not None:
        wanted.append(f"kind {query.kind!r}")
    if query.max_age_days is not None:
        wanted.append(f"a date at most {query.max_age_days} days before {today.isoformat()}")
    field = (
        "provider"
        if query.provider is not None
        and not matching(offers, PriceQuery(provider=query.provider, today=today))
        else "price_kind"
        if query.kind is not None
        and not matching(offers, PriceQuery(kind=query.kind, provider=query.provider, today=today))
        else "max_price_age"
    )
    return PriceError(
        field,
        f"no price for {name} with {', '.join(wanted)}; the catalog has: "
        f"{_listing(offers, today if query.max_age_days is not None else None)}. "
        "Relax the filter or give --price USD_PER_DEVICE_HOUR",
    )


def select_offering(
    name: str, offers: Sequence[CloudOffering], query: PriceQuery = OPEN
) -> CloudOffering | None:
    """The offering ``query`` picks for accelerator ``name``: ``None`` when the catalog has no
    price and no filter was asked for; :class:`PriceError` when a filter excludes every offer."""
    if query.is_open:
        return default_offering(offers)
    kept = matching(offers, query)
    if not kept:
        raise refusal(name, offers, query)
    if query.kind is not None:
        return min(kept, key=_rank)
    return default_offering(kept)


def known_providers(offer_lists: Sequence[Sequence[CloudOffering]]) -> list[str]:
    """Every provider named in ``offer_lists``, sorted case-insensitively."""
    names = {o.provider for offers in offer_lists for o in offers}
    return sorted(names, key=str.lower)


def check_provider(provider: str | None, offer_lists: Sequence[Sequence[CloudOffering]]) -> None:
    """Refuse a provider that prices none of the accelerators asked about, naming those that do."""
    if provider is None:
        return
    known = known_providers(offer_lists)
    if provider.strip().lower() not in {k.lower() for k in known}:
        raise PriceError(
            "provider",
            f"unknown provider {provider!r} for these accelerators; the catalog prices them at: "
            f"{', '.join(known) or 'none'}",
        )
