"""Number formats and their storage sizes.

``bytes_per_element`` is the storage size; NF4 and FP4 are 4-bit (0.5 byte) formats whose
per-block scale factors are counted separately where they apply (see ``memory.py``).
"""

from __future__ import annotations

from typing import Final, Literal

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8", "nf4"]

DTYPES: Final[tuple[Dtype, ...]] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8", "nf4")

BYTES_PER_ELEMENT: Final[dict[str, float]] = {
    "fp32": 4.0,
    "tf32": 4.0,  # TF32 is a tensor-core compute mode on fp32 storage
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "fp4": 0.5,
    "nf4": 0.5,
}

# Dense peak keys an accelerator may declare, from widest to narrowest.
PEAK_KEYS: Final[tuple[str, ...]] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")
