"""``python -m trainplan.run MODEL --hardware HW --devices N ...`` (same flags as ``trainplan run``)."""

from __future__ import annotations

from trainplan.run.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
