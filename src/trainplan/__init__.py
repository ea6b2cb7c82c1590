"""trainplan: memory, step time and cost of transformer training on any accelerator."""

from __future__ import annotations

__version__ = "0.1.0"
