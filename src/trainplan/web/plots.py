"""The page's plots as files, for the CLI's ``--plot FILE.png|svg`` (matplotlib, the ``plot`` extra).

``save_plot(kind, data, path)`` draws:

* ``"estimate"`` — per-device memory as a stacked bar against the device's memory, and the step
  time split into compute / exposed communication / pipeline bubble / optimizer (two panels);
  ``"memory"`` and ``"time"`` draw one panel each. ``data``: an :class:`~trainplan.predict.Estimate`
  or its web payload (``Estimate.to_dict()`` plus ``terms``, see :func:`trainplan.web.api.estimate_payload`).
* ``"plan"`` — time vs cost of the reported plans with the Pareto front joined. ``data``: a
  :class:`~trainplan.planner.PlanResult` or its ``to_dict()``.
* ``"compare"`` — accelerators side by side: step time, memory / capacity, cost. ``data``: a
  compare result (:func:`trainplan.planner.compare`, its ``to_dict()`` or ``trainplan compare
  --json``), a plan result (its ranked plans), or a sequence of estimates.

The figure is built with :class:`matplotlib.figure.Figure` (no pyplot, no global backend change)
and the format follows the file's suffix. Without matplotlib it raises a one-line
:class:`~trainplan.errors.TrainplanError` naming the extra (the CLI prints it and exits 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from trainplan.bands import Band
from trainplan.errors import TrainplanError

KINDS: Final = ("estimate", "memory", "time", "plan", "compare")
FORMATS: Final = (".png", ".svg")
GB: Final = 1e9

TIME_COLORS: Final = {
    "compute": ("#1f5fbf", "#4f86d9", "#8fb3ea"),
    "communication": ("#e0701f", "#f09a4f", "#f6bd86", "#c85a12", "#f8d3ae"),
    "bubble": ("#9aa1ab",),
    "optimizer": ("#2e9b5f",),
    "offload": ("#8e5fd1",),
    "rollout": ("#c0392b", "#e57368"),
    "scoring": ("#b7950b",),
    "critic": ("#17a2b8",),
    "sync": ("#6d4c41",),
}


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise TrainplanError(
            "plot", "plots need matplotlib: pip install 'trainplan[plot]' (the plot extra)"
        ) from None
    return Figure(figsize=(width, height), layout="constrained")


def _payload(data: Any) -> dict[str, Any]:
    """An estimate payload (``to_dict()`` plus ``terms``) from an Estimate or a payload dict."""
    from trainplan.predict import Estimate
    from trainplan.web.api import estimate_payload

    if isinstance(data, Estimate):
        return estimate_payload(data)
    if isinstance(data, Mapping) and "memory" in data and "time" in data:
        return dict(data)
    raise TrainplanError("plot", f"expected an estimate, got {type(data).__name__}")


def _fmt_duration(s: float) -> str:
    from trainplan.units import fmt_duration

    return fmt_duration(s)


def _bands(e: Mapping[str, Any]) -> tuple[Band, Band]:
    """(step-time band, memory band) of an estimate or plan dict (its ``calibration`` object)."""
    cal = e["calibration"]
    return Band.from_dict(cal), Band.from_dict(cal["memory"])


def _tag(label: str, e: Mapping[str, Any] | None) -> str:
    """A row label, with "(uncalibrated)" when its step-time class has no validated rows and
    "(no run on this part)" when its class has rows on other parts of the family only."""
    if e is None:
        return label
    band = _bands(e)[0]
    if not band.calibrated:
        return f"{label} (uncalibrated)"
    return label if band.on_part else f"{label} (no run on this part)"


def _span(band: Band, value: float) -> list[list[float]]:
    """Error-bar lengths ([[below], [above]]) of ``value`` for matplotlib's ``xerr`` / ``yerr``."""
    low, high = band.around(value)
    return [[value - low], [high - value]]


def _memory_panel(ax: Any, est: Mapping[str, Any]) -> None:
    terms = est.get("terms", {}).get("memory")
    if terms is None:
        raise TrainplanError("plot", "the memory plot needs the estimate's terms (pass the Estimate itself)")
    from trainplan.palette import memory_colors

    mem = est["memory"]
    shown = [t for t in terms if float(t["bytes"]) > 0]
    colors = [t.get("color") for t in shown]
    if not all(colors):  # a payload from before terms carried their colour
        colors = memory_colors([str(t["name"]) for t in shown])
    left = 0.0
    for term, color in zip(shown, colors, strict=True):
        value = float(term["bytes"]) / GB
        ax.barh(
            0,
            value,
            left=left,
            height=0.5,
            color=color,
            edgecolor="white",
            label=f"{term['name']} {value:.2f} GB",
        )
        left += value
    cap = float(mem["capacity_bytes"]) / GB
    total = float(mem["per_device_bytes"]) / GB
    ax.axvline(cap, color="#d03c3c", linestyle="--", linewidth=2)
    ax.text(
        cap,
        0.32,
        f" device memory {cap:.2f} GB",
        color="#d03c3c",
        va="bottom",
        ha="right" if total < cap else "left",
    )
    band = _bands(est)[1]
    ax.errorbar(total, 0, xerr=_span(band, total), color="#222222", capsize=6, linewidth=1.5)
    ax.set_xlim(0, max(cap, band.around(total)[1]) * 1.08)
    ax.set_ylim(-0.45, 0.6)
    ax.set_yticks([])
    ax.set_xlabel("GB per device (10^9 bytes); bar: 90% band")
    verdict = str(mem.get("fit_verdict") or ("fits" if mem["fits"] else "does not fit"))
    ax.set_title(
        f"Memory per device: {total:.2f} GB {band.label()} at the {mem['peak_phase']} — {verdict}",
        loc="left",
        fontsize=9,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False, fontsize=8)


def _time_panel(ax: Any, est: Mapping[str, Any]) -> None:
    from trainplan.terms import group_of

    terms = est.get("terms", {}).get("time")
    if terms is None:
        raise TrainplanError(
            "plot", "the step-time plot needs the estimate's terms (pass the Estimate itself)"
        )
    step = float(est["time"]["step_s"])
    scale, unit = (1e3, "ms") if step < 1.0 else (1.0, "s")
    left = 0.0
    used: dict[str, int] = {}
    for term in terms:
        value = float(term["s"])
        if value <= 0:
            continue
        group = str(term.get("group") or group_of(str(term["name"])))
        shades = TIME_COLORS.get(group, ("#888888",))
        i = used[group] = used.get(group, -1) + 1
        ax.barh(
            0,
            value * scale,
            left=left,
            height=0.5,
            color=shades[i % len(shades)],
            edgecolor="white",
            label=f"{term['name']} {_fmt_duration(value)} ({100 * value / step:.1f}%)",
        )
        left += value * scale
    band = _bands(est)[0]
    ax.errorbar(step * scale, 0, xerr=_span(band, step * scale), color="#222222", capsize=6, linewidth=1.5)
    ax.set_xlim(0, band.around(step)[1] * scale * 1.05)
    ax.set_ylim(-0.45, 0.6)
    ax.set_yticks([])
    ax.set_xlabel(f"step time ({unit}); bar: 90% band")
    ax.set_title(f"Step time: {_fmt_duration(step)} {band.label()} (busiest device)", loc="left", fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False, fontsize=8)


def _plan_dict(data: Any) -> dict[str, Any]:
    if isinstance(data, Mapping):
        return dict(data)
    to_dict = getattr(data, "to_dict", None)
    if callable(to_dict):
        out = to_dict()
        if isinstance(out, dict):
            return out
    raise TrainplanError("plot", f"expected a plan result, got {type(data).__name__}")


def _cost(e: Mapping[str, Any]) -> float | None:
    run = e["run"]
    if run.get("cost_usd") is not None:
        return float(run["cost_usd"])
    per_hour = e.get("system", {}).get("usd_per_hour")
    return None if per_hour is None else float(per_hour) * float(e["time"]["step_s"]) / 3600.0


def _plan_figure(data: Any) -> Any:
    plan = _plan_dict(data)
    plans = list(plan.get("plans", []))
    front = list(plan.get("pareto", []))
    have_run = plan.get("tokens") is not None
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()

    def xy(p: Mapping[str, Any]) -> tuple[float, float] | None:
        c = _cost(p)
        x = (
            float(p["run"]["time_s"]) / 3600.0
            if have_run and p["run"].get("time_s") is not None
            else float(p["time"]["step_s"])
        )
        return None if c is None or not math.isfinite(x) else (x, c)

    def key(p: Mapping[str, Any]) -> tuple[object, ...]:
        return (
            p.get("label"),
            tuple(sorted(p["layout"].items())),
            p["recipe"].get("micro_batch"),
            p["recipe"].get("recompute"),
        )

    front_keys = {key(p) for p in front}
    others = [(xy(p), p) for p in plans if key(p) not in front_keys]
    pts = [(q, p) for q, p in others if q is not None]
    for q, p in [(xy(p), p) for p in plans + front]:
        if q is not None:  # time and cost both scale with step time: the band is a segment along both
            b = _bands(p)[0]
            (x0, x1), (y0, y1) = b.around(q[0]), b.around(q[1])
            ax.plot([x0, x1], [y0, y1], color="#c8cdd4", linewidth=2.5, solid_capstyle="round", zorder=1)
    if pts:
        ax.scatter(
            [q[0] for q, _ in pts], [q[1] for q, _ in pts], color="#9fb4d3", s=30, label="other ranked plans"
        )
        for q, p in pts:
            ax.annotate(
                _tag(str(p.get("label", "")), p),
                q,
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
                color="#555555",
            )
    fpts = sorted((q, p) for q, p in ((xy(p), p) for p in front) if q is not None) if front else []
    if fpts:
        ax.plot([q[0] for q, _ in fpts], [q[1] for q, _ in fpts], "-o", color="#1f5fbf", label="Pareto front")
        for q, p in fpts:
            ax.annotate(
                _tag(str(p.get("label", "")), p), q, textcoords="offset points", xytext=(6, 6), fontsize=8
            )
    if not pts and not fpts:
        ax.text(0.5, 0.5, "no priced plan to plot", ha="center", va="center", transform=ax.transAxes)
    else:
        xs = [q[0] for q, _ in pts + fpts]
        ys = [q[1] for q, _ in pts + fpts]
        from matplotlib.ticker import FuncFormatter

        plain = FuncFormatter(lambda v, _pos: f"{v:,.6g}")
        if max(xs) / min(xs) > 20:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(plain)
        if max(ys) / min(ys) > 20:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
        ax.legend(frameon=False, fontsize=8)
    ax.grid(True, color="#e9ecf0")
    ax.set_xlabel("time to train (hours)" if have_run else "step time (s)")
    ax.set_ylabel("cost of the run (USD)" if have_run else "cost per step (USD)")
    fastest = plan.get("fastest")
    cheapest = plan.get("cheapest")
    title = f"Plans for {plan.get('model', '')} (bars: 90% bands)"
    if fastest:
        title += f" — fastest {fastest.get('label')}"
    if cheapest:
        title += f", cheapest {cheapest.get('label')}"
    ax.set_title(title, loc="left", fontsize=10)
    return fig


def _compare_rows(data: Any) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(label, plan or estimate dict or None, why not) per accelerator."""
    if not isinstance(data, Mapping) and callable(getattr(data, "to_dict", None)):
        return _compare_rows(data.to_dict())
    if isinstance(data, Mapping):
        best = data.get("per_accelerator") or data.get("hardware")
        if isinstance(best, list):  # trainplan compare --json, or PlanResult.to_dict()
            rows: list[tuple[str, dict[str, Any] | None, str]] = []
            for b in best:
                p = b.get("plan")
                label = str(p.get("label", b["hardware"])) if p else str(b["hardware"])
                rows.append((label, dict(p) if p else None, str(b.get("reason") or "")))
            return rows
        if "plans" in data:
            return [(str(p.get("label", p["hardware"])), dict(p), "") for p in data["plans"]]
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        out: list[tuple[str, dict[str, Any] | None, str]] = []
        for item in data:
            e = _payload(item)
            out.append((f"{e['devices']}×{e['hardware']}", e, ""))
        return out
    raise TrainplanError("plot", f"expected compare results, got {type(data).__name__}")


def _compare_figure(data: Any) -> Any:
    rows = _compare_rows(data)
    if not rows:
        raise TrainplanError("plot", "nothing to compare")
    fig = _figure(10.0, 1.2 + 0.42 * len(rows))
    axes = fig.subplots(1, 3, sharey=True)
    labels = [_tag(r[0], r[1]) for r in rows]
    ypos = list(range(len(rows)))
    have_run = any(e is not None and e["run"].get("cost_usd") is not None for _, e, _ in rows)
    panels: tuple[tuple[str, Callable[[Mapping[str, Any]], float | None], str, int], ...] = (
        ("step time (s)", lambda e: float(e["time"]["step_s"]), "#4e79a7", 0),
        (
            "memory per device / capacity (%)",
            lambda e: 100.0 * float(e["memory"]["per_device_bytes"]) / float(e["memory"]["capacity_bytes"]),
            "#59a14f",
            1,
        ),
        ("cost of the run (USD)" if have_run else "cost per step (USD)", _cost, "#f28e2b", 0),
    )
    for ax, (title, value, color, which) in zip(axes, panels, strict=True):
        for y, (_, e, err) in zip(ypos, rows, strict=True):
            v = None if e is None else value(e)
            if v is None:
                ax.text(0, y, " " + (err[:40] if err else "n/a"), va="center", fontsize=7, color="#777777")
                continue
            fits = bool(e is not None and e["memory"]["fits"])
            bar_color = color if fits or "memory" not in title else "#e15759"
            ax.barh(y, v, color=bar_color, alpha=1.0 if fits else 0.45, height=0.6)
            band = _bands(e)[which] if e is not None else None
            if band is not None:
                ax.errorbar(v, y, xerr=_span(band, v), color="#222222", capsize=3, linewidth=1)
            ax.text(v, y, f" {v:,.0f}" if v >= 100 else f" {v:.3g}", va="center", fontsize=7)
        if "memory" in title:
            ax.axvline(100.0, color="#d03c3c", linestyle="--", linewidth=1.5)
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(True, axis="x", color="#e9ecf0")
        ax.margins(x=0.25)
    axes[0].set_yticks(ypos, labels)
    axes[0].invert_yaxis()
    fig.suptitle(
        "Accelerators side by side (faded: does not fit; bars: 90% bands)", fontsize=10, x=0.01, ha="left"
    )
    return fig


def check_plot_path(path: str | Path) -> str:
    """The format of a plot file name (``png`` or ``svg``); refused otherwise, so a command can
    check ``--plot`` before it computes anything."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in FORMATS:
        raise TrainplanError("plot", f"'{p}': the file name must end in .png or .svg")
    return suffix[1:]


def save_plot(kind: str, data: Any, path: str | Path) -> Path:
    """Draw plot ``kind`` (:data:`KINDS`) of ``data`` to ``path`` (``.png`` or ``.svg``); returns the path."""
    p = Path(path)
    suffix = "." + check_plot_path(p)
    fig = figure(kind, data)
    try:
        fig.savefig(p, format=suffix[1:], dpi=120)
    except OSError as exc:
        raise TrainplanError("plot", f"cannot write '{p}': {exc.strerror}") from None
    return p


def figure(kind: str, data: Any) -> Any:
    """The :class:`matplotlib.figure.Figure` of plot ``kind`` (:data:`KINDS`) of ``data``."""
    if kind not in KINDS:
        raise TrainplanError("plot", f"unknown plot {kind!r}; choose {', '.join(KINDS)}")
    if kind in ("estimate", "memory", "time"):
        est = _payload(data)
        if kind == "estimate":
            fig = _figure(9.0, 6.4)
            top, bottom = fig.subplots(2, 1)
            _memory_panel(top, est)
            _time_panel(bottom, est)
        else:
            fig = _figure(9.0, 3.4)
            ax = fig.add_subplot()
            (_memory_panel if kind == "memory" else _time_panel)(ax, est)
        fig.suptitle(
            f"{est['model']['name']} on {est['devices']} × {est['hardware']}", fontsize=11, x=0.01, ha="left"
        )
    elif kind == "plan":
        fig = _plan_figure(data)
    else:
        fig = _compare_figure(data)
    return fig
