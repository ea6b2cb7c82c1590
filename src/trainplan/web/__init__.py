"""The local web page: ``trainplan serve`` (docs/web.md).

A standard-library HTTP server (:mod:`trainplan.web.server`) serves one static page
(``static/``: HTML, CSS and plain JavaScript that draws its plots as inline SVG) and a JSON API
whose keys are the CLI's (:mod:`trainplan.web.api`, documented by ``GET /api/openapi.json``).
:func:`trainplan.web.plots.save_plot` draws the same plots to PNG/SVG files with matplotlib
(the ``plot`` extra) for the CLI's ``--plot``.
"""

from __future__ import annotations

from trainplan.web.server import DEFAULT_HOST, DEFAULT_PORT, ROUTES, TrainplanServer, make_server

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ROUTES", "TrainplanServer", "make_server"]
