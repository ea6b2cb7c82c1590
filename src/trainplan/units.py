"""Unit constants. SI inside the code; humans at the edges.

GB = 1e9 bytes (decimal, what accelerator vendors print); GiB = 2**30 bytes (what
``nvidia-smi`` and PyTorch print). Output says which one it uses.
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2.0**10
MiB = 2.0**20
GiB = 2.0**30
TiB = 2.0**40

TFLOPS = 1e12
PFLOPS = 1e15

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


def fmt_bytes(n_bytes: float, *, binary: bool = False) -> str:
    """Human-readable bytes: ``12.3 GB`` (decimal) or ``11.5 GiB`` (binary)."""
    if binary:
        for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
            if abs(n_bytes) >= size:
                return f"{n_bytes / size:.2f} {unit}"
        return f"{n_bytes:.0f} B"
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.2f} {unit}"
    return f"{n_bytes:.0f} B"


def fmt_duration(seconds: float) -> str:
    """Human-readable duration: ``850 ms``, ``12.4 s``, ``3.2 h``, ``4.1 days``."""
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120.0:
        return f"{seconds:.2f} s"
    if seconds < 2 * SECONDS_PER_HOUR:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * SECONDS_PER_DAY:
        return f"{seconds / SECONDS_PER_HOUR:.1f} h"
    return f"{seconds / SECONDS_PER_DAY:.1f} days"


def fmt_count(n: float) -> str:
    """``6.74B``, ``124.4M``."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"
