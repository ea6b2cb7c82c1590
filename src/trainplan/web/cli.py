"""``trainplan serve``: the local web page (docs/web.md).

:func:`register` adds the subcommand to the main parser (``register(sub)`` in the ``trainplan``
command); ``python -m trainplan.web`` runs the same command on its own. Registering imports
neither the server nor the numeric core.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from trainplan.web import DEFAULT_HOST, DEFAULT_PORT


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 exposes it to the network)",
    )
    p.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0 = any free)"
    )
    p.add_argument("--log", action="store_true", help="log every request to stderr")


def cmd_serve(args: argparse.Namespace) -> int:
    from trainplan.web.server import make_server

    try:
        server = make_server(args.host, args.port, log_requests=args.log)
    except OSError as exc:
        sys.stderr.write(
            f"trainplan: error: port: cannot listen on {args.host}:{args.port} ({exc.strerror})\n"
        )
        return 2
    if not server.loopback_only:
        sys.stderr.write(
            f"trainplan: note: listening on {args.host}, reachable from other machines; "
            "the page has no authentication\n"
        )
    sys.stderr.write(f"trainplan: serving the page at {server.url} (Ctrl-C to stop)\n")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to a ``parser.add_subparsers()`` object; returns the new sub-parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="the local web page: estimate, compare and plan with plots"
    )
    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainplan serve", description="the local web page (docs/web.md)")
    add_serve_arguments(parser)
    return cmd_serve(parser.parse_args(argv))
