"""Loading and validating accelerator catalog files (TOML).

A catalog file holds ``[[accelerator]]`` tables with exactly the keys of
:class:`~trainplan.hardware.accelerator.Accelerator` (nested ``peak_flops``, ``sources``,
``scale_up``, ``scale_out``, ``host_link`` tables and ``[[accelerator.cloud]]`` arrays).
Built-in files live in ``trainplan/hardware/data/`` (one per vendor family) and are read once
through :mod:`importlib.resources`; user files go through the same validation, so a missing,
unknown or mistyped key fails with a :class:`CatalogError` naming the file, the entry and the
key. The schema is documented in ``docs/hardware.md``.
"""

from __future__ import annotations

import difflib
import functools
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from trainplan.data_files import data_text, data_toml
from trainplan.errors import CatalogError
from trainplan.hardware.accelerator import Accelerator, CloudOffering, Link

MAX_HARDWARE_FILE_BYTES: Final = 1_000_000
"""Largest user catalog file read (the built-in vendor files are about 20 kB each)."""

# Built-in files, listed in this order (others after them, alphabetically).
_FILE_ORDER: Final = ("nvidia.toml", "amd.toml", "google.toml", "aws.toml", "intel.toml", "cerebras.toml")

_NUM: Final = "number"
_INT: Final = "integer"
_STR: Final = "string"
_STRS: Final = "list of strings"
_TABLE: Final = "table"
_LINK: Final = "link table"
_CLOUD: Final = "array of cloud tables"
_BOOL: Final = "boolean"

# key -> (kind, required)
_ACCELERATOR_KEYS: Final[dict[str, tuple[str, bool]]] = {
    "name": (_STR, True),
    "display_name": (_STR, True),
    "vendor": (_STR, True),
    "family": (_STR, True),
    "year": (_INT, True),
    "status": (_STR, True),
    "aliases": (_STRS, False),
    "peak_flops": (_TABLE, True),
    "sparse_peak_flops": (_TABLE, False),
    "memory_bytes": (_NUM, True),
    "memory_bandwidth_bytes_per_s": (_NUM, True),
    "memory_type": (_STR, True),
    "usable_memory_bytes": (_NUM, False),
    "scale_up": (_LINK, True),
    "scale_out": (_LINK, False),
    "host_link": (_LINK, False),
    "tdp_w": (_NUM, False),
    "purchase_usd": (_NUM, False),
    "purchase_date": (_STR, False),
    "purchase_kind": (_STR, False),
    "no_public_price": (_STR, False),
    "cloud": (_CLOUD, False),
    "devices_per_node": (_INT, True),
    "whole_system": (_BOOL, False),
    "host_memory_bytes_per_node": (_NUM, False),
    "sources": (_TABLE, True),
    "dates": (_TABLE, False),
    "notes": (_STRS, False),
}
_LINK_KEYS: Final[dict[str, tuple[str, bool]]] = {
    "name": (_STR, True),
    "bandwidth_bytes_per_s": (_NUM, True),
    "latency_s": (_NUM, True),
    "domain_size": (_INT, False),
    "source": (_STR, True),
}
_CLOUD_KEYS: Final[dict[str, tuple[str, bool]]] = {
    "provider": (_STR, True),
    "instance": (_STR, True),
    "usd_per_device_hour": (_NUM, True),
    "date": (_STR, True),
    "source": (_STR, True),
    "devices_per_instance": (_INT, True),
    "kind": (_STR, False),
}


def _check_type(key: str, value: object, kind: str, where: str) -> None:
    ok: bool
    if kind == _NUM:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == _INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == _STR:
        ok = isinstance(value, str)
    elif kind == _BOOL:
        ok = isinstance(value, bool)
    elif kind == _STRS:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif kind in (_TABLE, _LINK):
        ok = isinstance(value, dict)
    else:  # _CLOUD
        ok = isinstance(value, list) and all(isinstance(v, dict) for v in value)
    if not ok:
        article = "an" if kind[0] in "aeiou" else "a"
        raise CatalogError(key, f"{where}: must be {article} {kind}, got {type(value).__name__} {value!r}")


def _check_keys(
    table: Mapping[str, object], spec: Mapping[str, tuple[str, bool]], prefix: str, where: str
) -> None:
    for key in table:
        if key not in spec:
            close = difflib.get_close_matches(key, list(spec), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; allowed keys: {', '.join(spec)}"
            raise CatalogError(prefix + key, f"{where}: unknown key '{key}'{hint}")
    for key, (kind, required) in spec.items():
        if key not in table:
            if required:
                raise CatalogError(prefix + key, f"{where}: missing required key '{key}' ({kind})")
            continue
        _check_type(prefix + key, table[key], kind, where)


def _rethrow(err: CatalogError, prefix: str, where: str) -> CatalogError:
    return CatalogError(prefix + err.field, f"{where}: {err.message}")


def _link(table: dict[str, object], prefix: str, where: str) -> Link:
    _check_keys(table, _LINK_KEYS, prefix, where)
    try:
        return Link(**table)  # type: ignore[arg-type]
    except CatalogError as err:
        raise _rethrow(err, prefix, where) from None


def _offering(table: dict[str, object], prefix: str, where: str) -> CloudOffering:
    _check_keys(table, _CLOUD_KEYS, prefix, where)
    try:
        return CloudOffering(**table)  # type: ignore[arg-type]
    except CatalogError as err:
        raise _rethrow(err, prefix, where) from None


def parse_entry(entry: Mapping[str, object], where: str) -> Accelerator:
    """Validate one ``[[accelerator]]`` table and build the :class:`Accelerator`."""
    _check_keys(entry, _ACCELERATOR_KEYS, "", where)
    kwargs: dict[str, object] = dict(entry)
    peaks = entry["peak_flops"]
    assert isinstance(peaks, dict)
    for key, value in peaks.items():
        _check_type(f"peak_flops.{key}", value, _NUM, where)
    sparse = entry.get("sparse_peak_flops", {})
    assert isinstance(sparse, dict)
    for key, value in sparse.items():
        _check_type(f"sparse_peak_flops.{key}", value, _NUM, where)
    sources = entry["sources"]
    assert isinstance(sources, dict)
    for key, value in sources.items():
        _check_type(f"sources.{key}", value, _STR, where)
    dates = entry.get("dates", {})
    assert isinstance(dates, dict)
    for key, value in dates.items():
        _check_type(f"dates.{key}", value, _STR, where)
    for key in ("scale_up", "scale_out", "host_link"):
        if key in entry:
            table = entry[key]
            assert isinstance(table, dict)
            kwargs[key] = _link(table, f"{key}.", where)
    if "cloud" in entry:
        tables = entry["cloud"]
        assert isinstance(tables, list)
        kwargs["cloud"] = tuple(_offering(t, f"cloud[{i}].", where) for i, t in enumerate(tables))
    for key in ("aliases", "notes"):
        if key in entry:
            value = entry[key]
            assert isinstance(value, list)
            kwargs[key] = tuple(value)
    try:
        return Accelerator(**kwargs)  # type: ignore[arg-type]
    except CatalogError as err:
        raise _rethrow(err, "", where) from None


def parse_document(doc: Mapping[str, object], file_label: str) -> list[Accelerator]:
    """Validate a parsed TOML document (``{"accelerator": [...]}``)."""
    for key in doc:
        if key != "accelerator":
            raise CatalogError(
                key, f"{file_label}: unknown top-level key '{key}'; use [[accelerator]] tables"
            )
    entries = doc.get("accelerator")
    if not isinstance(entries, list) or not entries:
        raise CatalogError("accelerator", f"{file_label}: no [[accelerator]] tables found")
    result: list[Accelerator] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise CatalogError("accelerator", f"{file_label}: entry #{i + 1} must be a table")
        label = entry.get("name", f"#{i + 1}")
        result.append(parse_entry(entry, f"{file_label}, accelerator '{label}'"))
    _check_unique(result, file_label)
    return result


def _check_unique(accs: Iterable[Accelerator], label: str) -> None:
    seen: dict[str, str] = {}
    for acc in accs:
        for key in (acc.name, *acc.aliases):
            if key in seen and seen[key] != acc.name:
                raise CatalogError(
                    "name",
                    f"{label}: '{key}' of accelerator '{acc.name}' is already used by '{seen[key]}'; "
                    "choose a different name or alias",
                )
            if key in seen and key == acc.name:
                raise CatalogError("name", f"{label}: accelerator '{acc.name}' is defined twice")
            seen[key] = acc.name


def load_hardware_file(path: str | Path) -> list[Accelerator]:
    """Read and validate a user catalog file of the built-in schema."""
    if not isinstance(path, str | Path):
        raise CatalogError("hardware_file", f"expected the path of a TOML file, got {path!r}")
    p = Path(path)
    try:
        info = p.stat()  # stat, not open: opening a FIFO would wait for a writer
        if not stat.S_ISREG(info.st_mode):
            raise CatalogError("hardware_file", f"{p} is not a regular file; pass the path of a TOML file")
        if info.st_size > MAX_HARDWARE_FILE_BYTES:
            raise CatalogError(
                "hardware_file",
                f"{p} is {info.st_size:,} bytes, over the {MAX_HARDWARE_FILE_BYTES:,}-byte limit of a catalog file",
            )
        raw = p.read_bytes()
    except CatalogError:
        raise
    except OSError as err:
        raise CatalogError(
            "hardware_file", f"cannot read {p}: {err.strerror or err}; check the path"
        ) from None
    except ValueError as err:  # a NUL byte in the path
        raise CatalogError("hardware_file", f"cannot read {path!r}: {err}; check the path") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise CatalogError("hardware_file", f"{p} is not valid TOML: {err}") from None
    except RecursionError:
        raise CatalogError(
            "hardware_file", f"{p} nests arrays or tables too deep to be a catalog file"
        ) from None
    return parse_document(doc, str(p))


def _builtin_text(name: str) -> str:
    return data_text("trainplan.hardware", "data", name)


@functools.cache
def builtin_file(name: str) -> tuple[Accelerator, ...]:
    """The entries of one built-in vendor file (``_FILE_ORDER``), parsed once per process."""
    return tuple(parse_document(data_toml("trainplan.hardware", "data", name), f"built-in {name}"))


_ENTRY_START = re.compile(r"^(?=\[\[accelerator\]\])", re.MULTILINE)


@functools.cache
def _builtin_entries_text(name: str) -> tuple[str, ...]:
    """The ``[[accelerator]]`` tables of a built-in file as text, one TOML document each (a
    table's sub-tables follow it up to the next ``[[accelerator]]``; the header comments drop)."""
    parts = _ENTRY_START.split(_builtin_text(name))
    return tuple(p for p in parts if p.startswith("[[accelerator]]"))


@functools.cache
def _builtin_entry(name: str, index: int) -> Accelerator:
    doc = tomllib.loads(_builtin_entries_text(name)[index])
    return parse_document(doc, f"built-in {name}")[0]


@functools.cache
def builtin_accelerators() -> tuple[Accelerator, ...]:
    """All built-in entries, parsed once per process."""
    # Exactly the vendor family files: other data files (e.g. efficiency.toml) have other schemas.
    accs = [acc for name in _FILE_ORDER for acc in builtin_file(name)]
    _check_unique(accs, "built-in catalog")
    return tuple(accs)


def find_builtin(name: str) -> Accelerator | None:
    """The built-in entry named (or aliased) ``name`` — the entry :func:`find` picks in the whole
    catalog — parsing only the ``[[accelerator]]`` tables whose text quotes the name (a whole
    vendor file takes milliseconds to parse); ``None`` when none has it."""
    check_name(name)
    q = _normalise(name)
    quoted = (f'"{q}"', f"'{q}'")
    for file in _FILE_ORDER:
        for i, text in enumerate(_builtin_entries_text(file)):
            # Only a table whose text has the name as a quoted string can be named by it.
            if any(s in text.lower() for s in quoted):
                acc = _builtin_entry(file, i)
                if q == acc.name or q in acc.aliases:
                    return acc
    return None


def check_name(name: object) -> None:
    """An accelerator name is a string (``get_accelerator(2)`` is a typed error)."""
    if not isinstance(name, str):
        raise CatalogError(
            "hardware", f"expected an accelerator name (a string), got {name!r}; `trainplan hardware list`"
        )


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def all_accelerators(extra_files: Sequence[str | Path] = ()) -> tuple[Accelerator, ...]:
    """Built-ins followed by the entries of ``extra_files`` (names must not collide); one path
    given alone is a list of one."""
    if isinstance(extra_files, str | Path):
        extra_files = [extra_files]
    accs = list(builtin_accelerators())
    for path in extra_files:
        accs.extend(load_hardware_file(path))
    if extra_files:
        _check_unique(accs, "catalog with user files")
    return tuple(accs)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def suggest(query: str, accs: Sequence[Accelerator], limit: int = 4) -> list[str]:
    """Canonical names closest to ``query``: longest shared prefix first, then similarity."""
    q = _normalise(query)
    scored: list[tuple[int, float, str]] = []
    for acc in accs:
        keys = (acc.name, *acc.aliases)
        prefix = max(_common_prefix(q, k) for k in keys)
        ratio = max(difflib.SequenceMatcher(None, q, k).ratio() for k in keys)
        scored.append((prefix, ratio, acc.name))
    best_prefix = max((s[0] for s in scored), default=0)
    if best_prefix >= 2:
        picked = [s for s in scored if s[0] == best_prefix]
    else:
        picked = [s for s in scored if s[1] >= 0.5]
    picked.sort(key=lambda s: (-s[0], -s[1], s[2]))
    return [s[2] for s in picked[:limit]]


def find(name: str, accs: Sequence[Accelerator]) -> Accelerator:
    """Look ``name`` up among names and aliases, case-insensitively."""
    check_name(name)
    q = _normalise(name)
    for acc in accs:
        if q == acc.name or q in acc.aliases:
            return acc
    close = suggest(name, accs)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise CatalogError("hardware", f"unknown accelerator '{name}'; {hint}`trainplan hardware list` shows all")
