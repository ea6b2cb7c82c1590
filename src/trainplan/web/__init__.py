"""The local web page: ``trainplan serve`` (docs/web.md).

A standard-library HTTP server (:mod:`trainplan.web.server`) serves one static page
(``static/``: HTML, CSS and plain JavaScript that draws its plots as inline SVG) and a JSON API
whose keys are the CLI's (:mod:`trainplan.web.api`, documented by ``GET /api/openapi.json``).
:func:`trainplan.web.plots.save_plot` draws the same plots to PNG/SVG files with matplotlib
(the ``plot`` extra) for the CLI's ``--plot``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from trainplan.web.server import ROUTES, TrainplanServer, make_server

DEFAULT_HOST: Final = "127.0.0.1"
"""Where ``trainplan serve`` listens unless told: this machine only."""
DEFAULT_PORT: Final = 8321

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ROUTES", "TrainplanServer", "make_server"]


def __getattr__(name: str) -> Any:
    """The server's names, imported on first use (``trainplan serve`` registers without them)."""
    if name in ("ROUTES", "TrainplanServer", "make_server"):
        from trainplan.web import server

        return getattr(server, name)
    raise AttributeError(f"module 'trainplan.web' has no attribute {name!r}")
