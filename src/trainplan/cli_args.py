"""The argparse side of the CLI: a parser that fails in one line, and commands built from the
input schema (:data:`trainplan.inputs.COMMANDS`). Used by :mod:`trainplan.cli` and
``python -m trainplan.run``; it imports neither the commands nor the numeric core."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    """argparse that reports bad flags as one line and exit status 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"trainplan: error: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def add_command(
    subparsers: Any,
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` with the fields :data:`trainplan.inputs.COMMANDS` lists for it."""
    from trainplan.inputs import COMMANDS, add_arguments

    p: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    add_arguments(p, COMMANDS[name])
    p.set_defaults(func=func)
    return p
