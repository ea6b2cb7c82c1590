"""Reading the data files shipped inside the package (catalog, presets, efficiencies, bands).

A package installed by pip lies on the file system, so its files are read from the package's
directory. Only a package without one (imported from a zip archive) goes through
:mod:`importlib.resources`, whose readers import :mod:`zipfile` and its dependencies: about
5 ms of every start of ``trainplan estimate`` that a plain file read does not need
(``benchmarks/bench_cli.py``).

TOML is parsed by :mod:`tomllib`, in pure Python: the catalog's NVIDIA file alone takes about
9 ms. :func:`data_toml` keeps each parsed document beside the file, in ``__pycache__``, as
:mod:`marshal` data (what CPython's own bytecode cache is made of), keyed by a digest of the
file's bytes: a changed file is parsed again, whatever its time stamps say, and a cache that
cannot be read or written is ignored. Like bytecode, nothing is written under
``PYTHONDONTWRITEBYTECODE`` (``sys.dont_write_bytecode``), and under ``PYTHONPYCACHEPREFIX``
(``sys.pycache_prefix``) the caches go to its mirror tree.
"""

from __future__ import annotations

import marshal
import os
import sys
import tomllib
from importlib import import_module
from typing import Any


def _package_dir(package: str) -> str | None:
    """The directory of ``package`` on the file system (a namespace package's first), or None."""
    module = sys.modules.get(package) or import_module(package)
    init = getattr(module, "__file__", None)
    if init:
        return os.path.dirname(str(init))
    dirs = list(getattr(module, "__path__", ()))
    return str(dirs[0]) if dirs and os.path.isdir(str(dirs[0])) else None


def _file(package: str, parts: tuple[str, ...]) -> str | None:
    root = _package_dir(package)
    if root is None:
        return None
    path = os.path.join(root, *parts)
    return path if os.path.isfile(path) else None


def data_bytes(package: str, *parts: str) -> bytes:
    """The bytes of the file ``parts`` (path components) inside ``package``."""
    path = _file(package, parts)
    if path is not None:
        with open(path, "rb") as fh:
            return fh.read()
    from importlib import resources

    return resources.files(package).joinpath(*parts).read_bytes()


def data_text(package: str, *parts: str) -> str:
    """UTF-8 text of the file ``parts`` (path components) inside ``package``."""
    return data_bytes(package, *parts).decode("utf-8")


def data_path(package: str, *parts: str) -> str:
    """File system path of ``parts`` inside ``package`` (for writers: a calibration or bands
    file regenerated in a source checkout)."""
    root = _package_dir(package)
    if root is not None:
        return os.path.join(root, *parts)
    from importlib import resources

    return str(resources.files(package).joinpath(*parts))


def _digest(raw: bytes) -> bytes:
    try:
        from _blake2 import blake2b  # CPython's own module: hashlib would load OpenSSL (~8 ms)
    except ImportError:  # pragma: no cover - other interpreters
        from hashlib import blake2b
    return blake2b(raw, digest_size=16).digest()


def cache_file(path: str) -> str | None:
    """Where :func:`data_toml` keeps the parsed ``path`` (None where the interpreter has no
    bytecode cache tag)."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    folder, name = os.path.split(os.path.abspath(path))
    if sys.pycache_prefix:  # PYTHONPYCACHEPREFIX: a mirror tree, as importlib puts bytecode there
        return os.path.join(
            sys.pycache_prefix, os.path.splitdrive(folder)[1].lstrip(os.sep), f"{name}.{tag}.marshal"
        )
    return os.path.join(folder, "__pycache__", f"{name}.{tag}.marshal")


def parse_cached(raw: bytes, path: str | None) -> dict[str, Any]:
    """``tomllib.loads`` of ``raw``, through the cache of ``path`` (see the module docstring);
    ``path`` None: parsed, not cached."""
    cache = cache_file(path) if path is not None else None
    digest = _digest(raw) if cache is not None else b""
    if cache is not None:
        try:
            with open(cache, "rb") as fh:
                stored = marshal.load(fh)
            if isinstance(stored, tuple) and len(stored) == 2 and stored[0] == digest:
                doc: dict[str, Any] = stored[1]
                return doc
        except (OSError, EOFError, ValueError, TypeError):
            pass  # missing, unreadable or from another build: parse the file
    doc = tomllib.loads(raw.decode("utf-8"))
    if cache is not None and not sys.dont_write_bytecode:
        try:
            data = marshal.dumps((digest, doc))
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            tmp = f"{cache}.{os.getpid()}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, cache)  # atomic: a concurrent reader sees the old file or the new
        except (OSError, ValueError):
            pass  # a read-only install, or a value marshal cannot hold: parse next time too
    return doc


def data_toml(package: str, *parts: str) -> dict[str, Any]:
    """The parsed TOML file ``parts`` inside ``package`` (cached: see the module docstring)."""
    return parse_cached(data_bytes(package, *parts), _file(package, parts))
