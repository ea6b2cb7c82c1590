"""Plain-text views of the catalog. Human units at the edge: GB and TB are decimal
(1e9, 1e12 bytes); GiB (2**30) is shown next to memory capacity."""

from __future__ import annotations

from collections.abc import Sequence

from trainplan.hardware.accelerator import Accelerator, Link
from trainplan.hardware.prices import DEFAULT_RULE, FALLBACK_KINDS
from trainplan.hardware.systems import SystemSpec
from trainplan.units import GB, TB, TFLOPS, GiB

_DASH = "-"


def _tflops(acc: Accelerator, dtype: str) -> str:
    return f"{acc.peak_flops[dtype] / TFLOPS:,.0f}" if dtype in acc.peak_flops else _DASH


def _price(acc: Accelerator) -> str:
    """The default price; ``e`` after it when that price is a reported estimate (kind ``estimate``)."""
    offer = acc.cheapest_offering()
    if offer is None:
        return _DASH
    return f"{offer.usd_per_device_hour:.2f}" + ("e" if offer.kind == "estimate" else "")


def _memory_cell(acc: Accelerator) -> str:
    """Usable GB, with the nominal figure after a slash where the two differ."""
    if acc.usable_memory_bytes is None:
        return f"{acc.memory_bytes / GB:,.0f}"
    return f"{acc.usable_memory_bytes / GB:,.0f}/{acc.memory_bytes / GB:,.0f}"


def render_table(accs: Sequence[Accelerator]) -> str:
    """One row per accelerator: dense TFLOP/s, memory, bandwidth, scale-up, power, price."""
    header = (
        "name",
        "vendor",
        "year",
        "BF16",
        "FP8",
        "FP4",
        "mem GB",
        "HBM TB/s",
        "scale-up GB/s x dom",
        "TDP W",
        "$/dev-h",
    )
    rows = [header]
    for acc in accs:
        up = acc.scale_up
        rows.append(
            (
                acc.name + ("*" if acc.status == "announced" else ""),
                acc.vendor,
                str(acc.year),
                _tflops(acc, "bf16"),
                _tflops(acc, "fp8"),
                _tflops(acc, "fp4"),
                _memory_cell(acc),
                f"{acc.memory_bandwidth_bytes_per_s / TB:.2f}",
                f"{up.bandwidth_bytes_per_s / GB:,.0f} x {up.domain_size}",
                _DASH if acc.tdp_w is None else f"{acc.tdp_w:,.0f}",
                _price(acc),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = {2, 3, 4, 5, 6, 7, 8, 9, 10}

    def fmt(row: Sequence[str]) -> str:
        cells = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)]
    lines.extend(fmt(r) for r in rows[1:])
    lines.append("")
    lines.append(
        "TFLOP/s are dense peaks (vendor sparse figures halved). GB = 1e9 bytes, TB/s = 1e12 bytes/s; "
        "mem GB is usable/nominal where they differ. Scale-up is per chip, one direction. "
        "$/dev-h = the default price (cheapest dated on-demand offering; `hardware show NAME` lists every "
        "offering with its kind and date; e = a rate a named report estimates, no provider's price). "
        "* = announced, not shipping."
    )
    return "\n".join(lines)


def _link_lines(label: str, link: Link | None, *, scale_up: bool) -> list[str]:
    if link is None:
        return [f"  {label:<11} none listed (see notes)"]
    domain = f", domain {link.domain_size} devices" if scale_up else ""
    return [
        f"  {label:<11} {link.name}: {link.bandwidth_bytes_per_s / GB:,.1f} GB/s per direction"
        f" ({link.bandwidth_bytes_per_s:.4g} B/s), latency {link.latency_s * 1e6:.2f} us{domain}",
        f"  {'':<11} source: {link.source}",
    ]


def _dated(acc: Accelerator, group: str) -> str:
    day = acc.dates.get(group)
    return "undated" if day is None else f"as of {day}"


def render_systems(specs: Sequence[SystemSpec]) -> str:
    """One row per rack or pod system: devices, scale-up domain, totals, scale-out network."""
    header = ("name", "accelerator", "devices", "domain", "usable TB", "dense BF16 PF", "FP8 PF", "scale-out")
    rows = [header]
    for spec in specs:
        t = spec.totals()
        bf16 = t.get("peak_flops.bf16")
        fp8 = t.get("peak_flops.fp8")
        rows.append(
            (
                spec.name + ("*" if spec.status == "announced" else ""),
                spec.accelerator.name,
                f"{spec.devices:,}",
                f"{spec.scale_up_domain:,}",
                f"{t['capacity_bytes'] / TB:,.2f}",
                _DASH if bf16 is None else f"{bf16 / 1e15:,.1f}",
                _DASH if fp8 is None else f"{fp8 / 1e15:,.1f}",
                spec.scale_out,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = {2, 3, 4, 5, 6}

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows[1:]), ""]
    lines.append(
        "Totals are computed from the accelerator's per-chip entry (dense peaks, usable memory, TB = 1e12 bytes). "
        "domain = devices on one scale-up fabric (NVLink, ICI, NeuronLink, UALink). * = announced, not shipping. "
        "Plan on a system with --hardware ACCELERATOR and --devices up to its size."
    )
    return "\n".join(lines)


def render_show(acc: Accelerator) -> str:
    """Every figure of one accelerator with its unit and source, then the notes."""
    src = acc.sources
    lines = [
        f"{acc.display_name} ({acc.name})",
        f"  vendor {acc.vendor}, family {acc.family}, {acc.year}, {acc.status}",
    ]
    if acc.aliases:
        lines.append(f"  aliases: {', '.join(acc.aliases)}")
    lines.append("Dense peak compute (FLOP/s; vendor sparse figures halved)")
    for dtype in acc.supported_dtypes:
        value = acc.peak_flops[dtype]
        lines.append(f"  {dtype:<5} {value / TFLOPS:>10,.1f} TFLOP/s  ({value:.4g} FLOP/s)")
    lines.append(f"  source: {src.get('peak_flops', _DASH)} ({_dated(acc, 'peak_flops')})")
    if acc.sparse_peak_flops:
        lines.append("Vendor peaks with structured sparsity (FLOP/s; reference only, never used)")
        for dtype, value in acc.sparse_peak_flops.items():
            lines.append(f"  {dtype:<5} {value / TFLOPS:>10,.1f} TFLOP/s")
    lines.append("Memory")
    lines.append(
        f"  capacity  {acc.memory_bytes / GB:,.2f} GB = {acc.memory_bytes / GiB:,.2f} GiB "
        f"({acc.memory_bytes:.12g} bytes), {acc.memory_type}"
        + ("" if acc.usable_memory_bytes is None else " (nominal)")
    )
    if acc.usable_memory_bytes is not None:
        usable = acc.usable_memory_bytes
        lines.append(
            f"  usable    {usable / GB:,.2f} GB = {usable / GiB:,.2f} GiB ({usable:.12g} bytes): "
            "the fit check uses this"
        )
        lines.append(f"  source: {src.get('usable_memory', _DASH)} ({_dated(acc, 'usable_memory')})")
    lines.append(
        f"  bandwidth {acc.memory_bandwidth_bytes_per_s / TB:,.3f} TB/s ({acc.memory_bandwidth_bytes_per_s:.4g} B/s)"
    )
    lines.append(f"  source: {src.get('memory', _DASH)} ({_dated(acc, 'memory')})")
    lines.append(f"Network (per chip; {_dated(acc, 'links')})")
    lines.extend(_link_lines("scale-up", acc.scale_up, scale_up=True))
    lines.extend(_link_lines("scale-out", acc.scale_out, scale_up=False))
    lines.extend(_link_lines("host link", acc.host_link, scale_up=False))
    lines.append(
        f"  devices per node: {acc.devices_per_node}"
        + (" (the entry is a whole system, priced and powered as one)" if acc.whole_system else "")
    )
    host = acc.host_memory_bytes_per_node
    lines.append(
        f"  host memory per node: {host / 1e9:,.0f} GB ({host / 2**30:,.0f} GiB)"
        if host is not None
        else "  host memory per node: unknown (give --host-memory to check offloaded states)"
    )
    if host is not None:
        lines.append(f"  source: {acc.sources['host_memory']}")
    lines.append("Power")
    lines.append(f"  TDP {_DASH if acc.tdp_w is None else f'{acc.tdp_w:,.0f} W'}")
    lines.append(f"  source: {src.get('power', _DASH)} ({_dated(acc, 'power')})")
    lines.append("Price")
    bought = acc.purchase
    if bought is not None:
        purchase = f"${bought.usd_per_device:,.0f} per device, dated {bought.date} ({bought.label})"
    elif acc.no_public_price is not None:
        purchase = f"none: no public price ({acc.no_public_price})"
    else:
        purchase = _DASH
    lines.append(f"  purchase {purchase}")
    lines.append(f"  source: {src.get('price', _DASH)} ({_dated(acc, 'price')})")
    if not acc.cloud:
        lines.append(
            "  cloud: no dated public rental price listed"
            + ("; cost rentals with --price USD_PER_DEVICE_HOUR" if acc.status == "shipping" else "")
        )
    default = acc.cheapest_offering()
    for offer in sorted(acc.cloud, key=lambda o: (FALLBACK_KINDS.index(o.kind), o.usd_per_device_hour)):
        mark = "  <- default" if offer == default else ""
        lines.append(
            f"  cloud: {offer.provider} {offer.kind} {offer.instance} ${offer.usd_per_device_hour:.3f}/device-hour "
            f"({offer.devices_per_instance} per instance, {offer.date}){mark}"
        )
        lines.append(f"         source: {offer.source}")
    if acc.cloud:
        lines.append(f"  {DEFAULT_RULE}")
    if acc.notes:
        lines.append("Notes")
        lines.extend(f"  - {note}" for note in acc.notes)
    lines.append("Units: GB = 1e9 bytes, GiB = 2^30 bytes, TB/s = 1e12 bytes/s.")
    return "\n".join(lines)


def entries_markdown(accs: Sequence[Accelerator]) -> str:
    """The catalog's entries as a Markdown table (docs/hardware.md): name, device, status, memory in
    GB (usable / nominal where the two differ) and aliases, in catalog order."""
    lines = ["| name | device | status | memory GB (usable/nominal) | aliases |", "|---|---|---|---|---|"]
    for acc in accs:
        mem = f"{acc.capacity_bytes / GB:.0f}"
        if acc.usable_memory_bytes is not None:
            mem += f" / {acc.memory_bytes / GB:.0f}"
        lines.append(
            f"| `{acc.name}` | {acc.display_name} | {acc.status} | {mem} | {', '.join(acc.aliases)} |"
        )
    return "\n".join(lines) + "\n"


def offerings_markdown(accs: Sequence[Accelerator]) -> str:
    """Every dated rental offering as a Markdown table (docs/hardware.md), by accelerator, then kind
    and price; ``default`` marks the one :func:`trainplan.hardware.prices.default_offering` picks."""
    lines = [
        "| name | provider | kind | instance | $/device-h | date | default |",
        "|---|---|---|---|---|---|---|",
    ]
    for acc in accs:
        chosen = acc.cheapest_offering()
        for offer in sorted(acc.cloud, key=lambda o: (o.kind, o.usd_per_device_hour)):
            mark = "yes" if offer is chosen else ""
            lines.append(
                f"| `{acc.name}` | {offer.provider} | {offer.kind} | {offer.instance} | "
                f"{offer.usd_per_device_hour:.3f} | {offer.date} | {mark} |"
            )
    return "\n".join(lines) + "\n"


def unpriced_markdown(accs: Sequence[Accelerator]) -> str:
    """The accelerators without a rental offering (docs/hardware.md): status, the dated purchase
    price where there is one, and the entry's own ``sources.price`` saying why there is no rental
    price."""
    lines = ["| name | status | dated purchase price | why there is no rental price |", "|---|---|---|---|"]
    for acc in accs:
        if acc.cloud:
            continue
        bought = acc.purchase
        price = "—" if bought is None else f"${bought.usd_per_device:,.0f} ({bought.label}, {bought.date})"
        lines.append(f"| `{acc.name}` | {acc.status} | {price} | {acc.sources.get('price', '—')} |")
    return "\n".join(lines) + "\n"
