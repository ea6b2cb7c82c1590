// Small SVG charts for the trainplan page: no library, no network.
// Each function clears its container and draws one <svg> into it.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const FONT = 12;

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, str, attrs) {
    const t = el("text", Object.assign({ x, y, "font-size": FONT }, attrs || {}), parent);
    t.textContent = str;
    return t;
  }

  function tip(node, str) {
    el("title", {}, node).textContent = str;
  }

  function svg(container, width, height, label) {
    container.replaceChildren();
    const s = el("svg", {
      viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img", "aria-label": label,
      class: "svg-chart", preserveAspectRatio: "xMinYMin meet",
    }, container);
    return s;
  }

  function niceTicks(max, count) {
    if (!(max > 0)) return [0];
    const raw = max / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let v = 0; v <= max + 1e-9 * step; v += step) out.push(v);
    return out;
  }

  // Boxes of two drawn SVG elements overlap (in user units), with a margin.
  function overlaps(a, b, margin) {
    const m = margin || 0, p = a.getBBox(), q = b.getBBox();
    if (!(p.width > 0 && q.width > 0)) return false;  // not laid out (hidden): nothing to compare
    return p.x < q.x + q.width + m && q.x < p.x + p.width + m && p.y < q.y + q.height && q.y < p.y + p.height;
  }

  // The legend of a stacked bar: a swatch, the name and the value per part, in two columns, or in
  // one when a name would run into its value; a name too long even for one column is shortened
  // with an ellipsis (the full name stays in its tooltip). Returns the legend's height.
  function legend(s, segs, x0, y0, width, fmt) {
    const draw = (cols) => {
      const g = el("g", { class: "legend" }, s);
      const colW = width / cols;
      const rows = segs.map((seg, i) => {
        const gx = x0 + (i % cols) * colW, gy = y0 + Math.floor(i / cols) * 20;
        el("rect", { x: gx, y: gy - 10, width: 12, height: 12, fill: seg.color, rx: 2, class: "swatch" }, g);
        const name = text(g, gx + 18, gy, seg.name, { class: "legend-name" });
        tip(name, seg.name);
        const value = text(g, gx + colW - 16, gy, fmt(seg.value), { "text-anchor": "end", class: "num legend-value" });
        return { name, value, full: seg.name };
      });
      return { g, rows, height: Math.ceil(segs.length / cols) * 20 };
    };
    let out = draw(2);
    if (out.rows.some((r) => overlaps(r.name, r.value, 6))) {
      out.g.remove();
      out = draw(1);
      for (const r of out.rows) {
        let n = r.full.length;
        while (n > 4 && overlaps(r.name, r.value, 6)) {
          n -= 2;
          r.name.firstChild.nodeValue = r.full.slice(0, n) + "…";
        }
      }
    }
    return out.height;
  }

  // One horizontal stacked bar of named parts, with a limit line (device memory) when given.
  // opts: {segments: [{name, value, color}], total, limit, limitLabel, fmt, unit, label}
  // The parts are named in the legend, never on the bar (small parts have no room for a label).
  function stackedBar(container, opts) {
    const W = 760, padL = 24, padR = 24, barY = 46, barH = 42;
    const segs = opts.segments.filter((s) => s.value > 0);
    const s = svg(container, W, barY + barH + 40 + segs.length * 20 + 8, opts.label);
    const maxV = Math.max(opts.total, opts.limit || 0) * 1.06 || 1;
    const scale = (v) => padL + (v / maxV) * (W - padL - padR);
    // axis ticks
    for (const t of niceTicks(maxV, 6)) {
      const x = scale(t);
      el("line", { x1: x, x2: x, y1: barY - 4, y2: barY + barH + 4, class: "grid" }, s);
      text(s, x, barY + barH + 18, (opts.tickFmt || opts.fmt)(t), { "text-anchor": "middle", class: "tick" });
    }
    let x0 = 0;
    for (const seg of segs) {
      const r = el("rect", {
        x: scale(x0), y: barY, width: Math.max(0.5, scale(x0 + seg.value) - scale(x0)), height: barH,
        fill: seg.color, class: "seg",
      }, s);
      r.dataset.name = seg.name;
      tip(r, `${seg.name}: ${opts.fmt(seg.value)} (${(100 * seg.value / opts.total).toFixed(1)}%)`);
      x0 += seg.value;
    }
    const totalText = text(s, padL, barY - 10, `total ${opts.fmt(opts.total)}`, { class: "strong" });
    if (opts.limit) {
      const x = scale(opts.limit);
      const line = el("line", { x1: x, x2: x, y1: barY - 18, y2: barY + barH + 6, class: "limit" }, s);
      const over = opts.total > opts.limit;
      const lt = text(s, x - 4, barY - 10, opts.limitLabel, { "text-anchor": "end", class: over ? "limit-text over" : "limit-text" });
      if (overlaps(lt, totalText, 8)) {  // no room beside the total: the line above it
        lt.setAttribute("y", String(barY - 28));
        lt.setAttribute("x", String(Math.max(x - 4, padL + lt.getBBox().width)));
        line.setAttribute("y1", String(barY - 38));
      }
    }
    const lh = legend(s, segs, padL, barY + barH + 38, W - padL - padR, opts.fmt);
    s.setAttribute("viewBox", `0 0 ${W} ${barY + barH + 38 + lh + 4}`);
    return s;
  }

  // Horizontal bars, one per row, for the compare view: rows [{label, value, text, color, muted}]
  function barPanel(parent, x, y, w, rows, opts) {
    const rowH = 26, labelW = opts.labelW || 0;
    const maxV = Math.max(...rows.map((r) => (r.value > 0 ? r.value : 0)), opts.limit || 0) * 1.1 || 1;
    const scale = (v) => x + labelW + (v / maxV) * (w - labelW - (opts.limit ? 110 : 70));
    text(parent, x + labelW, y - 8, opts.title, { class: "strong" });
    rows.forEach((r, i) => {
      const ry = y + i * rowH;
      if (labelW) text(parent, x + labelW - 8, ry + 15, r.label, { "text-anchor": "end" });
      if (r.value > 0) {
        const rect = el("rect", {
          x: scale(0), y: ry + 3, width: Math.max(1, scale(r.value) - scale(0)), height: rowH - 8,
          fill: r.color, class: r.muted ? "seg muted" : "seg",
        }, parent);
        tip(rect, `${r.label}: ${r.text}`);
        const tx = opts.limit ? Math.max(scale(r.value), scale(opts.limit)) : scale(r.value);
        text(parent, tx + 5, ry + 15, r.text, { class: "num" });
      } else {
        text(parent, scale(0) + 2, ry + 15, r.text, { class: "hint-text" });
      }
    });
    if (opts.limit) {
      const lx = scale(opts.limit);
      el("line", { x1: lx, x2: lx, y1: y - 2, y2: y + rows.length * rowH, class: "limit" }, parent);
      text(parent, lx, y + rows.length * rowH + 12, opts.limitLabel, { "text-anchor": "middle", class: "limit-text" });
    }
  }

  // Side-by-side panels sharing row labels. panels: [{title, rows, limit, limitLabel}]
  function panels(container, labels, panelsSpec, label) {
    const W = 760, rowH = 26;
    const H = 40 + labels.length * rowH + 24;
    const s = svg(container, W, H, label);
    // the row labels set the left margin: the longest one fits (up to a third of the width)
    const names = labels.map((name, i) => text(s, 0, 32 + i * rowH + 15, name, { "text-anchor": "end", class: "strong" }));
    const widest = Math.max(0, ...names.map((t) => t.getComputedTextLength()));
    const labelW = Math.min(W / 3, Math.max(110, widest + 14));
    for (const t of names) t.setAttribute("x", String(labelW - 8));
    const pw = (W - labelW) / panelsSpec.length;
    panelsSpec.forEach((p, k) => {
      barPanel(s, labelW + k * pw, 32, pw - 10, p.rows.map((r, i) => Object.assign({ label: labels[i] }, r)), p);
    });
    return s;
  }

  function logTicks(lo, hi) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
      for (const m of [1, 2, 5]) {
        const v = m * Math.pow(10, e);
        if (v >= lo && v <= hi) out.push(v);
      }
    }
    return out;
  }

  // Scatter with optional log axes and a joined front. points: [{x, y, label, cls, info}]
  function scatter(container, opts) {
    const W = 760, H = 380, padL = 78, padR = 20, padT = 16, padB = 48;
    const s = svg(container, W, H, opts.label);
    const pts = opts.points.filter((p) => p.x > 0 && p.y > 0 && Number.isFinite(p.x) && Number.isFinite(p.y));
    if (!pts.length) {
      text(s, W / 2, H / 2, opts.empty || "nothing to plot", { "text-anchor": "middle", class: "hint-text" });
      return s;
    }
    const axis = (vals, a, b, forceLog) => {
      let lo = Math.min(...vals), hi = Math.max(...vals);
      const log = forceLog !== false && hi / lo > 20;
      if (log) { lo /= 1.3; hi *= 1.3; } else { const pad = (hi - lo) * 0.08 || hi * 0.1; lo = Math.max(0, lo - pad); hi += pad; }
      const f = log ? (v) => a + (Math.log(v) - Math.log(lo)) / (Math.log(hi) - Math.log(lo)) * (b - a)
                    : (v) => a + (v - lo) / (hi - lo) * (b - a);
      const ticks = log ? logTicks(lo, hi) : niceTicks(hi, 5).filter((t) => t >= lo);
      return { f, ticks, log };
    };
    const ax = axis(pts.map((p) => p.x), padL, W - padR);
    const ay = axis(pts.map((p) => p.y), H - padB, padT);
    for (const t of ax.ticks) {
      const x = ax.f(t);
      el("line", { x1: x, x2: x, y1: padT, y2: H - padB, class: "grid" }, s);
      text(s, x, H - padB + 16, opts.fmtX(t), { "text-anchor": "middle", class: "tick" });
    }
    for (const t of ay.ticks) {
      const y = ay.f(t);
      el("line", { x1: padL, x2: W - padR, y1: y, y2: y, class: "grid" }, s);
      text(s, padL - 6, y + 4, opts.fmtY(t), { "text-anchor": "end", class: "tick" });
    }
    text(s, (padL + W - padR) / 2, H - 8, opts.xLabel + (ax.log ? " (log)" : ""), { "text-anchor": "middle" });
    const yl = text(s, 14, (padT + H - padB) / 2, opts.yLabel + (ay.log ? " (log)" : ""), { "text-anchor": "middle" });
    yl.setAttribute("transform", `rotate(-90 14 ${(padT + H - padB) / 2})`);
    const front = pts.filter((p) => p.front).sort((a, b) => a.x - b.x);
    if (front.length > 1) {
      el("polyline", { points: front.map((p) => `${ax.f(p.x)},${ay.f(p.y)}`).join(" "), class: "front" }, s);
    }
    for (const p of pts) {
      const c = el("circle", { cx: ax.f(p.x), cy: ay.f(p.y), r: p.front ? 6 : 4, class: "pt " + (p.cls || "") }, s);
      tip(c, p.info || p.label);
    }
    // labels: the front first, then the others where they do not overlap a placed label
    const placed = [];
    const order = pts.filter((p) => p.tag).sort((a, b) => (b.front ? 1 : 0) - (a.front ? 1 : 0));
    for (const p of order) {
      const w = 6.2 * p.tag.length, x = Math.min(ax.f(p.x) + 8, W - padR - w), y = ay.f(p.y) - 8;
      const box = { x0: x, x1: x + w, y0: y - 11, y1: y + 2 };
      if (placed.some((b) => box.x0 < b.x1 && b.x0 < box.x1 && box.y0 < b.y1 && b.y0 < box.y1)) continue;
      placed.push(box);
      text(s, x, y, p.tag, { class: p.front ? "pt-label strong" : "pt-label" });
    }
    return s;
  }

  return { stackedBar, panels, scatter };
})();
