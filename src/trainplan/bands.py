"""Prediction bands: the 90% error range of each predicted number, from ``trainplan validate``.

Every estimate falls in one **validation class**, the product of four named axes::

    family       accelerator family of the catalog entry: nvidia (NVIDIA data-centre GPUs of a
                 calibrated generation: Ampere, Hopper, Blackwell), consumer (Ada / RTX cards and
                 the GA102 parts of ``timing.OTHER_DIE``: RTX A6000, RTX 3090, A10G),
                 amd, tpu, trainium, gaudi, cerebras; other NVIDIA generations are
                 ``nvidia-<generation>``, and AMD / TPU / Trainium parts outside the generations
                 with a κ (``timing.GENERATION``) ``<family>-<architecture>`` (e.g. amd-cdna2):
                 no calibrated κ, no validated rows
    stack        ``Recipe.stack``: megatron, pytorch, maxtext, neuron
    method       pre-train, full (full fine-tune), lora (LoRA and QLoRA), rlhf (PPO, GRPO, DPO,
                 reward models: never pooled with the others, see OWN_ROWS_ONLY)
    parallelism  data (data parallel, ZeRO 0-2, one device), zero-3 (fully sharded, no model
                 parallelism), model (tensor, pipeline or context parallel)
    arch         dense or moe (the model has routed experts): routing, expert GEMMs and
                 all-to-alls err differently from dense blocks, so an MoE estimate never borrows
                 dense rows (see OWN_ARCH_ONLY); a dense one pools MoE rows only after its own
                 chain

The band table (``data/bands.json``) is generated from the validation rows by
``trainplan validate --bands`` (:mod:`trainplan.validate.bands`); a test regenerates it and
compares. An estimate takes the band of the first class in this fallback order that holds at
least :data:`MIN_ROWS` validation rows of the quantity (``*`` = pooled over that axis)::

    family/stack/method/parallelism/arch → family/stack/method/*/arch → family/*/method/*/arch
        → family/stack/*/*/arch → family/*/*/*/arch
        → (dense only) the same five with the architecture pooled (no ``/arch`` part)

so a dense estimate's band never includes MoE rows while dense rows suffice, and an MoE
estimate takes an MoE class where one holds enough rows, else the uncalibrated band: held out,
the NVIDIA MoE runs fell inside the dense bands 70% of the time, not 90%.

A calibrated band also names the catalog parts its family's rows ran on (those of the widest
class of the chain) and whether the estimated part is one of them (``Band.on_part``): Trn2 and
Trn3 take the Trainium band measured on Trn1, TPU v4 the band measured on v5e, v5p, v6e and TPU7x. Every
surface marks such a band ("no validated run on this part"), since how far the part departs
from its family's measured parts is not measured.

A family with no row at all is **uncalibrated**: its band is the table's ``uncalibrated`` band,
derived in :func:`uncalibrated_band` from the calibrated classes and the spread between the
calibrated datasets: wider than every calibrated band, never tight.

Method (:func:`log_band`). Residuals are r = log(published / predicted), so the true value of
a prediction p lies in [p·e^lo, p·e^hi]. For n residuals with mean m and standard deviation s::

    conformal   lo = r_(⌊(n+1)·α/2⌋), hi = r_(⌈(n+1)·(1−α/2)⌉)   (split-conformal order statistics,
                Vovk et al. 2005; Lei et al. 2018 Eq. 2), an index outside 1..n = ∓∞
    normal      m ∓ t_{1−α/2, n−1} · s · √(1 + 1/n)              (the normal prediction interval
                of a new observation, e.g. Hahn & Meeker 1991 Sec. 4.4)
    shift       ± the standard deviation of the per-dataset mean residuals, of the class or of
                every dataset of the quantity, the larger (a new run is a new dataset: its bias
                is one more draw of the dataset biases, and a class of one dataset cannot show it)

and the band is the union of the conformal and normal intervals, each end widened outward by
the dataset shift. α = 0.1 (a 90% band). A class whose rows come from one dataset is widened at
lookup to envelope the first pooled class of its fallback order that holds two datasets or more
(:meth:`BandTable.lookup`): one dataset shows neither the bias nor the spread of the next. The held-out coverage of this rule (bands derived
without a dataset, scored on it) is in docs/validation.md.

Step time carries the band of the step-time class; tokens/s = tokens per step / step time takes
the same band inverted; run time and cost scale with step time and carry its band. Peak memory
carries the band of the memory class.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, Final, Literal

from trainplan.data_files import data_text
from trainplan.hardware.accelerator import Accelerator
from trainplan.layout import Layout
from trainplan.models.spec import ModelSpec
from trainplan.recipe import Recipe
from trainplan.timing import GENERATION, OTHER_DIE

Quantity = Literal["step_s", "memory_bytes"]
QUANTITIES: Final[tuple[Quantity, ...]] = ("step_s", "memory_bytes")
ALPHA: Final = 0.1
"""Miscoverage of a band: 90% of true values inside it."""
MIN_ROWS: Final = 5
"""Fewest validation rows for a class to carry its own band (fewer: the next class in the order)."""

FAMILY_BY_VENDOR: Final[dict[str, str]] = {
    "AMD": "amd",
    "Google": "tpu",
    "AWS": "trainium",
    "Intel": "gaudi",
    "Cerebras": "cerebras",
}
CALIBRATED_NVIDIA_GENERATIONS: Final = ("ampere", "hopper", "blackwell")
"""Generations with a fitted κ (hardware/data/calibration.toml)."""
METHOD_CLASS: Final[dict[str, str]] = {
    "pretrain": "pre-train",
    "full": "full",
    "lora": "lora",
    "qlora": "lora",
    "ppo": "rlhf",
    "grpo": "rlhf",
    "dpo": "rlhf",
    "rm": "rlhf",
}
OWN_ROWS_ONLY: Final = frozenset({"rlhf"})
"""Method classes that never borrow a band from other methods: an RL or preference step adds
rollout, scoring and several models to the training step, so training rows say nothing about its
error; without validated rows of its own it is uncalibrated."""
OWN_ARCH_ONLY: Final = frozenset({"moe"})
"""Architecture classes that never borrow dense rows: with ``megatron_bridge_moe`` held out, its
MoE runs fell inside the dense NVIDIA bands for 14 of 20 rows (docs/validation.md, held-out
coverage), so dense errors do not bound MoE errors; without MoE rows of its own an MoE estimate
is uncalibrated. Nor does one MoE dataset bound another: with ``megatron_bridge_moe`` held out,
the band of ``megatron_bridge_deepseek`` alone held 17 of its 24 runs; so an MoE class whose rows
come from one dataset takes the uncalibrated band's width (:meth:`BandTable.lookup`)."""


@dataclass(frozen=True, kw_only=True)
class ClassKey:
    """One validation class: accelerator family × stack × method × parallelism × architecture
    ("*" = any)."""

    family: str
    stack: str
    method: str
    parallelism: str
    arch: str = "*"

    @property
    def name(self) -> str:
        base = f"{self.family}/{self.stack}/{self.method}/{self.parallelism}"
        return base if self.arch == "*" else f"{base}/{self.arch}"

    def fallbacks(self) -> tuple[ClassKey, ...]:
        """This class, then the pooled classes in the documented fallback order."""
        f, s, m, a = self.family, self.stack, self.method, self.arch

        def chain(arch: str) -> tuple[ClassKey, ...]:
            own = (
                ClassKey(family=f, stack=s, method=m, parallelism=self.parallelism, arch=arch),
                ClassKey(family=f, stack=s, method=m, parallelism="*", arch=arch),
                ClassKey(family=f, stack="*", method=m, parallelism="*", arch=arch),
            )
            if m in OWN_ROWS_ONLY:
                return own
            return (
                *own,
                ClassKey(family=f, stack=s, method="*", parallelism="*", arch=arch),
                ClassKey(family=f, stack="*", method="*", parallelism="*", arch=arch),
            )

        if a == "*" or a in OWN_ARCH_ONLY:
            return chain(a)
        return (*chain(a), *chain("*"))

    def matches(self, other: ClassKey) -> bool:
        """True when ``other`` (an exact class) falls in this (possibly pooled) class."""
        return all(
            mine in ("*", theirs)
            for mine, theirs in (
                (self.family, other.family),
                (self.stack, other.stack),
                (self.method, other.method),
                (self.parallelism, other.parallelism),
                (self.arch, other.arch),
            )
        )


def accelerator_family(acc: Accelerator) -> str:
    """The band family of a catalog entry (module docstring)."""
    if acc.vendor == "NVIDIA":
        gen = GENERATION.get(acc.name)
        if gen == "ada" or acc.name.startswith("rtx") or acc.name in OTHER_DIE:
            return "consumer"
        if gen in CALIBRATED_NVIDIA_GENERATIONS:
            return "nvidia"
        return "nvidia-" + acc.family.lower().replace(" ", "-")
    family = FAMILY_BY_VENDOR.get(acc.vendor, acc.vendor.lower().replace(" ", "-"))
    if acc.name not in GENERATION:
        return family + "-" + acc.family.lower().replace(" ", "-")
    return family


def parallelism_kind(layout: Layout) -> str:
    """data, zero-3 or model (module docstring)."""
    if layout.tp > 1 or layout.pp > 1 or layout.cp > 1:
        return "model"
    return "zero-3" if layout.zero == 3 else "data"


def classify(
    acc: Accelerator, model: ModelSpec, recipe: Recipe, layout: Layout, *, stack: str | None = None
) -> ClassKey:
    """The exact validation class of one configuration (``stack`` overrides ``recipe.stack``)."""
    return ClassKey(
        family=accelerator_family(acc),
        stack=stack or recipe.stack,
        method=METHOD_CLASS.get(recipe.method, recipe.method),
        parallelism=parallelism_kind(layout),
        arch="dense" if model.moe is None else "moe",
    )


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile by the Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5), df ≥ 1."""
    import statistics  # only where bands are derived or quantiles computed

    z = statistics.NormalDist().inv_cdf(p)
    n = float(df)
    g1 = (z**3 + z) / 4.0
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96.0
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384.0
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160.0
    return z + g1 / n + g2 / n**2 + g3 / n**3 + g4 / n**4


def conformal_interval(residuals: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """Split-conformal order statistics (module docstring); ∓inf when n is too small for an end."""
    r = sorted(residuals)
    n = len(r)
    k_lo = math.floor((n + 1) * alpha / 2.0)
    k_hi = math.ceil((n + 1) * (1.0 - alpha / 2.0))
    lo = r[k_lo - 1] if k_lo >= 1 else -math.inf
    hi = r[k_hi - 1] if k_hi <= n else math.inf
    return lo, hi


def normal_interval(residuals: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """Normal prediction interval of one new residual: m ∓ t·s·√(1+1/n) (module docstring)."""
    import statistics  # only where bands are derived or quantiles computed

    n = len(residuals)
    m = statistics.fmean(residuals)
    s = statistics.stdev(residuals)
    half = t_quantile(1.0 - alpha / 2.0, n - 1) * s * math.sqrt(1.0 + 1.0 / n)
    return m - half, m + half


def dataset_shift(residuals: Sequence[float], datasets: Sequence[str]) -> float:
    """Standard deviation of the per-dataset mean residuals (0 with one dataset)."""
    import statistics  # only where bands are derived or quantiles computed

    groups: dict[str, list[float]] = {}
    for r, d in zip(residuals, datasets, strict=True):
        groups.setdefault(d, []).append(r)
    means = [statistics.fmean(g) for g in groups.values()]
    return statistics.stdev(means) if len(means) > 1 else 0.0


def log_band(
    residuals: Sequence[float], datasets: Sequence[str], *, shift_floor: float = 0.0, alpha: float = ALPHA
) -> tuple[float, float]:
    """The band of a class in log space: union of conformal and normal, widened by the dataset
    shift of the class or ``shift_floor`` (that of every dataset of the quantity), the larger."""
    c_lo, c_hi = conformal_interval(residuals, alpha)
    n_lo, n_hi = normal_interval(residuals, alpha)
    lo = n_lo if math.isinf(c_lo) else min(c_lo, n_lo)
    hi = n_hi if math.isinf(c_hi) else max(c_hi, n_hi)
    shift = max(dataset_shift(residuals, datasets), shift_floor)
    return lo - shift, hi + shift


def uncalibrated_band(
    class_bands: Sequence[tuple[float, float]], biases: Sequence[float]
) -> tuple[float, float]:
    """Band (log space) of a family without rows: the envelope of every calibrated class band,
    widened on each side by the range of the per-dataset mean residuals (how far one calibrated
    dataset's bias is from another's — the least a family nobody measured can be off by)."""
    spread = max(biases) - min(biases)
    return min(lo for lo, _ in class_bands) - spread, max(hi for _, hi in class_bands) + spread


@dataclass(frozen=True, kw_only=True)
class ClassBand:
    """One row of the band table: a class, its row count and its band as relative errors."""

    quantity: str
    name: str
    rows: int
    datasets: tuple[str, ...]
    parts: tuple[str, ...]  # the catalog accelerators the class's rows ran on
    low: float  # true / predicted − 1 at the low end
    high: float

    def to_dict(self) -> dict[str, object]:
        return {
            "quantity": self.quantity,
            "class": self.name,
            "rows": self.rows,
            "datasets": list(self.datasets),
            "parts": list(self.parts),
            "low": self.low,
            "high": self.high,
        }


@dataclass(frozen=True, kw_only=True)
class BandTable:
    classes: tuple[ClassBand, ...]
    uncalibrated: dict[str, tuple[float, float]]  # quantity -> (low, high) relative

    def to_json(self) -> str:
        doc = {
            "generated_by": "trainplan validate --bands",
            "coverage": 1.0 - ALPHA,
            "min_rows": MIN_ROWS,
            "classes": [c.to_dict() for c in self.classes],
            "uncalibrated": {q: list(v) for q, v in self.uncalibrated.items()},
        }
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BandTable:
        doc = json.loads(text)
        classes = tuple(
            ClassBand(
                quantity=c["quantity"],
                name=c["class"],
                rows=c["rows"],
                datasets=tuple(c["datasets"]),
                parts=tuple(c["parts"]),
                low=c["low"],
                high=c["high"],
            )
            for c in doc["classes"]
        )
        unc = {q: (float(v[0]), float(v[1])) for q, v in doc["uncalibrated"].items()}
        return cls(classes=classes, uncalibrated=unc)

    @cached_property
    def _by_name(self) -> dict[str, dict[str, ClassBand]]:
        return {q: {c.name: c for c in self.classes if c.quantity == q} for q in QUANTITIES}

    def lookup(self, quantity: Quantity, key: ClassKey, *, part: str) -> Band:
        """The band of the first class in the fallback order with rows; else uncalibrated.
        ``part`` is the catalog accelerator estimated: the band records the parts the family's
        rows ran on (those of the widest class of the chain, which holds every row of the
        others) and whether ``part`` is one of them (:attr:`Band.on_part`).

        A class whose rows all come from one dataset cannot show how the rows of another
        dataset spread around their bias: its band is widened to envelope the band of the first
        pooled class of the fallback order that holds two datasets or more, where there is one
        (never narrowed by it). An architecture class that borrows no other rows
        (:data:`OWN_ARCH_ONLY`: MoE) has no such class to learn the spread from: with one dataset
        its band envelopes the uncalibrated band (it stays calibrated: its κ and centre are
        measured, its width is not)."""
        by_name = self._by_name[quantity]
        chain = [c for c in (by_name.get(k.name) for k in key.fallbacks()) if c is not None]
        if chain:
            c = chain[0]
            low, high = c.low, c.high
            if len(c.datasets) < 2:
                pooled = next((p for p in chain if len(p.datasets) >= 2), None)
                if pooled is not None:
                    low, high = min(low, pooled.low), max(high, pooled.high)
                elif key.arch in OWN_ARCH_ONLY:
                    unc_lo, unc_hi = self.uncalibrated[quantity]
                    low, high = min(low, unc_lo), max(high, unc_hi)
            return Band(
                quantity=quantity,
                class_name=c.name,
                family=key.family,
                rows=c.rows,
                calibrated=True,
                low=low,
                high=high,
                part=part,
                parts=chain[-1].parts,
                arch=key.arch,
            )
        lo, hi = self.uncalibrated[quantity]
        return Band(
            quantity=quantity,
            class_name=key.name,
            family=key.family,
            rows=0,
            calibrated=False,
            low=lo,
            high=hi,
            part=part,
            parts=(),
            arch=key.arch,
        )


@cache
def band_table() -> BandTable:
    """The packaged band table (``data/bands.json``)."""
    text = data_text("trainplan", "data", "bands.json")
    return BandTable.from_json(text)


@dataclass(frozen=True, kw_only=True)
class Band:
    """The 90% band of one predicted quantity: true / predicted − 1 lies in [low, high]."""

    quantity: str
    class_name: str
    family: str
    rows: int
    calibrated: bool
    low: float
    high: float
    part: str  # the catalog accelerator estimated
    parts: tuple[str, ...]  # the accelerators the family's validation rows ran on (widest class)
    arch: str = "*"  # the estimated model's architecture class: dense or moe

    @property
    def on_part(self) -> bool:
        """True when at least one validation row of the family ran on the estimated accelerator.
        False for a calibrated band of a family measured only on its other parts (Trn2 from Trn1
        runs, TPU v4 from v5e-TPU7x runs): the band is that family's error on those parts, and
        how far this part departs from them is not measured."""
        return self.part in self.parts

    def family_error_text(self) -> str:
        """How a band with no run on this part reads: ``"its family's error on trn1; how far trn2
        departs from those parts is not measured"``."""
        return (
            f"its family's error on {', '.join(self.parts)}; how far {self.part} departs from those "
            "parts is not measured"
        )

    def part_note(self) -> str:
        """``""``, or ``"; none on trn2 (runs on trn1)"`` when the family was never measured on this part."""
        if not self.calibrated or self.on_part:
            return ""
        return f"; none on {self.part} (runs on {', '.join(self.parts)})"

    def around(self, value: float) -> tuple[float, float]:
        """[low, high] absolute bounds of a quantity proportional to this one (step time, memory, cost)."""
        return value * (1.0 + self.low), value * (1.0 + self.high)

    def around_inverse(self, value: float) -> tuple[float, float]:
        """[low, high] of a quantity inversely proportional to this one (tokens/s from step time)."""
        return value / (1.0 + self.high), value / (1.0 + self.low)

    def percent_text(self) -> str:
        """``−5% … +9%``."""
        return f"{_pct(self.low)} … {_pct(self.high)}"

    def inverse_percent_text(self) -> str:
        return f"{_pct(1.0 / (1.0 + self.high) - 1.0)} … {_pct(1.0 / (1.0 + self.low) - 1.0)}"

    def label(self, *, inverse: bool = False) -> str:
        """``(−5% … +9%, 90% of 113 validated nvidia/pytorch/pre-train/zero-3 runs)`` or
        ``(uncalibrated: −40% … +60%)``."""
        pct = self.inverse_percent_text() if inverse else self.percent_text()
        if not self.calibrated:
            return f"(uncalibrated: {pct})"
        return f"({pct}, {100 * (1 - ALPHA):.0f}% of {self.rows} validated {self.class_name} runs{self.part_note()})"

    def to_dict(self) -> dict[str, object]:
        return {
            "class": self.class_name,
            "rows": self.rows,
            "calibrated": self.calibrated,
            "low": self.low,
            "high": self.high,
            "quantity": self.quantity,
            "family": self.family,
            "part": self.part,
            "parts": list(self.parts),
            "on_part": self.on_part,
            "arch": self.arch,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Band:
        """The band back from :meth:`to_dict` (the JSON ``calibration`` object)."""
        return cls(
            quantity=str(d["quantity"]),
            class_name=str(d["class"]),
            family=str(d["family"]),
            rows=int(d["rows"]),
            calibrated=bool(d["calibrated"]),
            low=float(d["low"]),
            high=float(d["high"]),
            part=str(d["part"]),
            parts=tuple(str(x) for x in d["parts"]),
            arch=str(d.get("arch", "*")),
        )


def _pct(x: float) -> str:
    v = round(100 * x)
    return f"+{v}%" if v > 0 else (f"−{-v}%" if v < 0 else "0%")


def step_band(acc: Accelerator, model: ModelSpec, recipe: Recipe, layout: Layout) -> Band:
    """The step-time band of a configuration (also that of tokens/s, run time and cost)."""
    return _band("step_s", classify(acc, model, recipe, layout), acc.name)


def memory_band(acc: Accelerator, model: ModelSpec, recipe: Recipe, layout: Layout) -> Band:
    """The peak-memory band of a configuration."""
    return _band("memory_bytes", classify(acc, model, recipe, layout), acc.name)


@cache
def _band(quantity: Quantity, key: ClassKey, part: str) -> Band:
    """The committed table's band of a class on one part (the table is read once, so is each band)."""
    return band_table().lookup(quantity, key, part=part)


FitVerdict = Literal["fits", "fits only at the optimistic edge", "does not fit"]


def fit_verdict(per_device_bytes: float, capacity_bytes: float, band: Band) -> FitVerdict:
    """fits: even the band's high end fits; optimistic edge: the prediction does not fit but the
    band's low end does, or the prediction fits and the high end does not; does not fit: even the
    low end exceeds the capacity. ``memory.fits`` (the prediction itself) stays the boolean."""
    low, high = band.around(per_device_bytes)
    if high <= capacity_bytes:
        return "fits"
    if low <= capacity_bytes:
        return "fits only at the optimistic edge"
    return "does not fit"
