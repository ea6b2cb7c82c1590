"""Colours of the named memory terms, shared by the web page (via the API) and ``--plot``.

A memory bar has up to about twenty named parts (the training step's terms at its peak phase, or
an RLHF phase's terms for every model it holds). Each bar gets one colour per term, all distinct,
from :data:`MEMORY_PALETTE`: Tableau 10 (Tableau Software, "Tableau 10" palette, 2016; the
matplotlib ``tab10`` successor) followed by ten colours from Kelly's 22 colours of maximum
contrast (K. L. Kelly, "Twenty-two colors of maximum contrast", Color Engineering 3(6), 1965),
the near-duplicates of the first ten left out. The common terms keep a fixed colour
(:data:`PREFERRED`) so that "weights" is the same blue in every bar; any other term takes the next
colour not yet used in its bar, so no two terms of one bar, adjacent or not, share a colour while
the bar has at most ``len(MEMORY_PALETTE)`` terms (beyond that, colours repeat but never side by
side).

No dependency: the page, the API and the plots import it without the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MEMORY_PALETTE: Final[tuple[str, ...]] = (
    # Tableau 10
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    # Kelly 1965 (those far from the ten above)
    "#222222",
    "#875692",
    "#a1caf1",
    "#882d17",
    "#8db600",
    "#654522",
    "#b3446c",
    "#2b3d26",
    "#c2b280",
    "#e25822",
)
"""Twenty distinct colours (hex sRGB), the order they are handed out in."""

PREFERRED: Final[dict[str, int]] = {
    "weights": 0,
    "gradients": 1,
    "optimizer states (incl. master)": 2,
    "quantization constants": 3,
    "communication buffers": 4,
    "activations": 5,
    "logits / loss": 6,
    "transient (backward)": 8,
    "optimizer-step temporaries": 7,
    "CUDA context / runtime": 10,
    "allocator fragmentation": 9,
}
"""Palette index of the terms most bars have, by name (an RLHF term ``"phase: name"`` by its name)."""


def _base(name: str) -> str:
    """``"rollout: weights"`` -> ``"weights"``: an RLHF phase's term by its own name."""
    return name.split(": ", 1)[1] if ": " in name else name


def memory_colors(names: Sequence[str]) -> list[str]:
    """One colour per term of a bar, in order: the term's preferred colour when no earlier term of
    the bar took it, else the first palette colour unused in the bar (cycling past twenty, never
    the colour of the term before)."""
    used: set[int] = set()
    out: list[int] = []
    for name in names:
        want = PREFERRED.get(_base(name))
        if want is None or want in used:
            free = [i for i in range(len(MEMORY_PALETTE)) if i not in used]
            if not free:  # more terms than colours: restart, avoiding the neighbour's colour
                used.clear()
                free = [i for i in range(len(MEMORY_PALETTE)) if not out or i != out[-1]]
            want = free[0]
        used.add(want)
        out.append(want)
    return [MEMORY_PALETTE[i] for i in out]
