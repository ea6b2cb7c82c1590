"""``python -m trainplan.web``: the same as ``trainplan serve``."""

from __future__ import annotations

from trainplan.web.cli import main

raise SystemExit(main())
