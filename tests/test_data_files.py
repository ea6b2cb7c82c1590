"""The package's data files: read from the package directory, TOML parsed through a cache that is
keyed by the file's bytes (trainplan.data_files)."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

from trainplan import data_files
from trainplan.data_files import cache_file, data_text, data_toml, parse_cached

DATA = Path(data_files.__file__).parent / "hardware" / "data"


def test_reads_the_package_files_as_importlib_resources_does() -> None:
    from importlib import resources

    for package, parts in (
        ("trainplan.hardware", ("data", "nvidia.toml")),
        ("trainplan.models.data", ("presets.toml",)),  # a namespace package: no __init__.py
        ("trainplan", ("data", "bands.json")),
    ):
        expected = resources.files(package).joinpath(*parts).read_text(encoding="utf-8")
        assert data_text(package, *parts) == expected


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.toml")))
def test_every_shipped_toml_file_parses_as_tomllib_parses_it(name: str) -> None:
    assert data_toml("trainplan.hardware", "data", name) == tomllib.loads((DATA / name).read_text("utf-8"))


@pytest.fixture
def writable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


def _forbid_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(_: str) -> None:
        raise AssertionError("parsed although the cache holds this document")

    monkeypatch.setattr(data_files.tomllib, "loads", fail)


def test_a_second_read_comes_from_the_cache(
    tmp_path: Path, writable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.toml"
    raw = b'a = 1\n[t]\nb = ["c", 2.5, true]\n'
    path.write_bytes(raw)
    first = parse_cached(raw, str(path))
    cache = cache_file(str(path))
    assert cache is not None and os.path.isfile(cache)
    _forbid_parsing(monkeypatch)
    assert parse_cached(raw, str(path)) == first == {"a": 1, "t": {"b": ["c", 2.5, True]}}


def test_changed_bytes_are_parsed_again_whatever_the_time_stamps(tmp_path: Path, writable: None) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(b"a = 1\n")
    parse_cached(b"a = 1\n", str(path))
    path.write_bytes(b"a = 2\n")
    stamp = os.stat(cache_file(str(path)) or "").st_mtime_ns
    os.utime(path, ns=(stamp, stamp))
    assert parse_cached(b"a = 2\n", str(path)) == {"a": 2}


def test_a_corrupt_cache_is_ignored(tmp_path: Path, writable: None) -> None:
    path = tmp_path / "x.toml"
    parse_cached(b"a = 1\n", str(path))
    Path(cache_file(str(path)) or "").write_bytes(b"\x00not marshal data")
    assert parse_cached(b"a = 1\n", str(path)) == {"a": 1}


def test_nothing_is_written_under_dont_write_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = tmp_path / "x.toml"
    assert parse_cached(b"a = 1\n", str(path)) == {"a": 1}
    assert not (tmp_path / "__pycache__").exists()


def test_a_value_marshal_cannot_hold_is_parsed_every_time(tmp_path: Path, writable: None) -> None:
    path = tmp_path / "x.toml"
    raw = b"date = 2026-12-06\n"  # a TOML date: a datetime.date, which marshal does not store
    assert str(parse_cached(raw, str(path))["date"]) == "2026-12-06"
    assert not os.path.exists(cache_file(str(path)) or "")
    assert str(parse_cached(raw, str(path))["date"]) == "2026-12-06"


def test_a_read_only_folder_is_no_error(tmp_path: Path, writable: None) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
        assert parse_cached(b"a = 1\n", str(folder / "x.toml")) == {"a": 1}
    finally:
        folder.chmod(0o700)


def test_the_cache_follows_pycache_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under PYTHONPYCACHEPREFIX the parsed files go to its mirror tree, as bytecode does."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    path = tmp_path / "data" / "x.toml"
    path.parent.mkdir()
    path.write_bytes(b"a = 1\n")
    cache = cache_file(str(path)) or ""
    assert cache.startswith(str(tmp_path / "prefix")) and "__pycache__" not in cache
    assert parse_cached(b"a = 1\n", str(path)) == {"a": 1}
    assert os.path.isfile(cache) and not (path.parent / "__pycache__").exists()
