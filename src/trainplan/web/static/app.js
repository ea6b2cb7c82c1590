// The trainplan page: builds the form from the API's own OpenAPI document, calls the JSON API,
// draws the answers with charts.js. Nothing here talks to any host but the page's own.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const GB = 1e9;
  const MAX_CONFIG_BYTES = 1000000;

  const LAYOUT = ["devices", "tp", "pp", "cp", "ep", "zero", "sequence_parallel", "pp_schedule", "virtual_stages"];
  const RECIPE = ["method", "precision", "optimizer", "seq_len", "micro_batch", "global_batch", "tokens",
    "recompute", "attention", "offload", "lora_rank", "stack"];
  const PLAN_OPTIONS = ["objective", "top", "budget", "deadline", "max_devices"];
  const SEARCHED = ["micro_batch", "recompute", "offload"];
  const LABELS = { devices: "devices", tp: "tensor parallel (tp)", pp: "pipeline stages (pp)",
    cp: "context parallel (cp)", ep: "expert parallel (ep)", zero: "ZeRO stage", seq_len: "sequence length",
    micro_batch: "micro-batch", global_batch: "global batch", tokens: "tokens to train",
    budget: "budget (USD)", deadline: "deadline (hours)", max_devices: "max devices", top: "plans shown",
    price: "price (USD/device-hour)", pue: "PUE", stack: "training stack" };
  const PLACEHOLDERS = { tokens: "e.g. 1e11", global_batch: "dp × micro", price: "catalog", provider: "cheapest",
    lora_rank: "16", budget: "none", deadline: "none", lora_targets: "q,k,v,o,gate,up,down" };
  const TIME_COLORS = {
    compute: ["#1f5fbf", "#4f86d9", "#8fb3ea"],
    communication: ["#e0701f", "#f09a4f", "#f6bd86", "#c85a12", "#f8d3ae"],
    bubble: ["#9aa1ab"], optimizer: ["#2e9b5f", "#7cc79f"], offload: ["#8e5fd1"],
    rollout: ["#c0392b", "#e57368"], scoring: ["#b7950b"], critic: ["#17a2b8"], sync: ["#6d4c41"],
  };
  const GROUP_NAMES = { compute: "compute", communication: "exposed communication", bubble: "pipeline bubble",
    optimizer: "optimizer step, gradient accumulation", offload: "offload", rollout: "RL rollout (generation)",
    scoring: "RL scoring forwards", critic: "PPO critic update", sync: "RL weight sync" };

  const state = { schema: null, planSchema: null, fields: [], planFields: [], config: null, configName: "",
    hardware: [], seq: 0, timer: null, lastEstimate: null, shown: {}, formError: false };

  // --- formatting ---------------------------------------------------------------------------
  const gb = (b) => `${(b / GB).toFixed(2)} GB`;
  const pct = (x) => `${(100 * x).toFixed(1)}%`;
  const int = (x) => Math.round(x).toLocaleString("en-US");
  // The price a row is costed at and where it comes from: provider, kind and date of the offering.
  function priceLabel(run) {
    if (run.usd_per_device_hour === null || run.usd_per_device_hour === undefined) return "no price";
    const o = run.offering;
    const usdh = `$${run.usd_per_device_hour.toFixed(2)}/device-hour`;
    return o ? `${usdh} ${o.provider} ${o.kind} (${o.date})` : `${usdh} user price`;
  }

  function duration(s) {
    if (s < 1) return `${(s * 1e3).toFixed(1)} ms`;
    if (s < 120) return `${s.toFixed(2)} s`;
    if (s < 7200) return `${(s / 60).toFixed(1)} min`;
    if (s < 3 * 86400) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} days`;
  }
  function usd(x) {
    if (x >= 100) return `$${int(x)}`;
    if (x >= 0.01) return `$${x.toFixed(2)}`;
    return `$${x.toPrecision(2)}`;
  }
  // a band (the JSON ``calibration`` object): true / predicted − 1 in [low, high]
  const signed = (x) => { const v = Math.round(100 * x); return v > 0 ? `+${v}%` : (v < 0 ? `−${-v}%` : "0%"); };
  function bandText(b, inverse) {
    const lo = inverse ? 1 / (1 + b.high) - 1 : b.low, hi = inverse ? 1 / (1 + b.low) - 1 : b.high;
    const span = `${signed(lo)} … ${signed(hi)}`;
    const note = b.calibrated && !b.on_part ? `; none on ${b.part} (runs on ${b.parts.join(", ")})` : "";
    return b.calibrated ? `${span}, 90% of ${b.rows} validated ${b.class} runs${note}` : `uncalibrated: ${span}`;
  }
  const tagged = (label, p) => (p.calibration.calibrated
    ? (p.calibration.on_part ? label : `${label} (no run on this part)`) : `${label} (uncalibrated)`);
  function showRanking(list, lines) {
    list.replaceChildren();
    for (const line of lines || []) { const li = document.createElement("li"); li.textContent = line; list.appendChild(li); }
  }
  function count(n) {
    for (const [u, s] of [["T", 1e12], ["B", 1e9], ["M", 1e6], ["K", 1e3]]) if (n >= s) return `${(n / s).toFixed(2)}${u}`;
    return String(n);
  }

  // --- API ----------------------------------------------------------------------------------
  async function call(method, path, body) {
    const init = { method, headers: {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    let data;
    try { data = await res.json(); } catch (e) { data = { error: { field: null, message: `HTTP ${res.status}` } }; }
    if (!res.ok) {
      const err = new Error((data.error && data.error.message) || `HTTP ${res.status}`);
      err.field = data.error ? data.error.field : null;
      throw err;
    }
    return data;
  }

  // --- the form, from the OpenAPI request schemas --------------------------------------------
  function label(name) { return LABELS[name] || name.replace(/_/g, " "); }

  function makeField(name, spec, parent, prefix) {
    const id = `${prefix}${name}`;
    const wrap = document.createElement("label");
    wrap.className = "field";
    wrap.title = spec.description || "";
    const types = Array.isArray(spec.type) ? spec.type : [spec.type];
    let input;
    const unset = types.includes("null");  // left open: the engine (or the server) decides
    if (types.includes("boolean") && unset) {
      // a setting the engine decides unless given: engine's / on / off
      input = document.createElement("select");
      for (const [v, text] of [["", "engine's"], ["true", "on"], ["false", "off"]]) {
        const o = document.createElement("option");
        o.value = v; o.textContent = text;
        input.appendChild(o);
      }
      wrap.append(document.createTextNode(label(name)), input);
    } else if (types.includes("boolean")) {
      wrap.classList.add("check");
      input = document.createElement("input");
      input.type = "checkbox";
      input.checked = !!spec.default;
      wrap.append(input, document.createTextNode(" " + label(name)));
    } else {
      if (spec.enum) {
        input = document.createElement("select");
        if (spec.default === undefined || spec.default === null) {
          const o = document.createElement("option");  // not given: the default (the engine's)
          o.value = ""; o.textContent = "default";
          input.appendChild(o);
        }
        for (const v of spec.enum) {
          const o = document.createElement("option");
          o.value = String(v); o.textContent = String(v);
          input.appendChild(o);
        }
      } else {
        input = document.createElement("input");
        input.type = "text";
        if (types.includes("integer") || types.includes("number")) input.inputMode = "decimal";
      }
      if (spec.default !== undefined && spec.default !== null) input.value = String(spec.default);
      if (PLACEHOLDERS[name]) input.placeholder = PLACEHOLDERS[name];
      wrap.append(document.createTextNode(label(name)), input);
    }
    input.id = id;
    input.name = name;
    parent.appendChild(wrap);
    const kind = types.includes("boolean") ? (unset ? "tri" : "bool") : (types.includes("integer") || types.includes("number")) ? "num" : "str";
    return { name, spec, input, kind };
  }

  function readField(f) {
    if (f.kind === "bool") return f.input.checked;
    if (f.kind === "tri") return f.input.value === "" ? undefined : f.input.value === "true";
    const v = f.input.value.trim();
    if (v === "") return undefined;
    if (f.kind === "num" && !(f.spec.enum)) {
      const n = Number(v);
      return Number.isFinite(n) ? n : v;  // the server names the field when it is not a number
    }
    if (f.spec.enum && f.kind === "num") return Number(v);
    return v;
  }

  function buildForm(openapi) {
    const schemas = openapi.components.schemas;
    state.schema = schemas.EstimateRequest.properties;
    state.planSchema = schemas.PlanRequest.properties;
    state.compareSchema = schemas.CompareRequest.properties;
    const skip = new Set(["model", "config", "config_name", "strict", "hardware"]);
    for (const name of Object.keys(state.schema)) {
      if (skip.has(name)) continue;
      const spec = state.schema[name];
      const group = LAYOUT.includes(name) ? "group-layout" : RECIPE.includes(name) ? "group-recipe"
        : spec["x-group"] === "rlhf" ? "group-rlhf" : "group-advanced";
      state.fields.push(makeField(name, state.schema[name], $(group), "f-"));
    }
    for (const name of PLAN_OPTIONS) {
      if (state.planSchema[name]) state.planFields.push(makeField(name, state.planSchema[name], $("plan-options"), "p-"));
    }
  }

  function modelPart() {
    if (state.config) return { config: state.config, config_name: state.configName, strict: false };
    return { model: $("model").value };
  }

  function estimateBody() {
    const body = Object.assign(modelPart(), { hardware: $("hardware").value });
    for (const f of state.fields) {
      const v = readField(f);
      if (v !== undefined) body[f.name] = v;
    }
    return body;
  }

  function showError(box, err) {
    document.querySelectorAll(".bad").forEach((n) => n.classList.remove("bad"));
    if (!err) { box.hidden = true; box.textContent = ""; return; }
    box.hidden = false;
    box.textContent = err.field ? `${err.field}: ${err.message}` : err.message;
    if (err.field) {
      const input = $(`f-${err.field}`) || $(`p-${err.field}`) || (err.field === "model" ? $("model") : null)
        || (err.field === "hardware" ? $("hardware") : null);
      if (input) input.classList.add("bad");
    }
  }

  // --- stale results -----------------------------------------------------------------------
  // Each shown result keeps the request it answers; it is marked stale (class "stale" on its
  // panel and a banner) while the form differs from that request or has an error.
  const RESULT_PANELS = { estimate: "estimate-panel", compare: "compare-panel", plan: "plan-panel" };
  function requestKey(kind) {
    if (kind === "estimate") return JSON.stringify(estimateBody());
    if (kind === "plan") return JSON.stringify(searchBody(state.planSchema, false));
    return JSON.stringify(searchBody(state.compareSchema, $("cmp-keep-devices").checked));
  }
  function markStale() {
    for (const [kind, id] of Object.entries(RESULT_PANELS)) {
      const shown = state.shown[kind];
      const stale = shown !== undefined && (state.formError || shown.error || requestKey(kind) !== shown.key);
      $(id).classList.toggle("stale", stale);
      $(`${kind}-stale`).hidden = !stale;
    }
    document.body.dataset.stale = Object.keys(RESULT_PANELS).filter((k) => $(RESULT_PANELS[k]).classList.contains("stale")).join(" ");
  }
  function resultShown(kind, key) { state.shown[kind] = { key, error: false }; markStale(); }
  function resultFailed(kind) { if (state.shown[kind]) state.shown[kind].error = true; markStale(); }

  // --- estimate -----------------------------------------------------------------------------
  async function runEstimate() {
    clearTimeout(state.timer);
    state.timerPending = false;
    const seq = ++state.seq;
    $("busy").hidden = false;
    document.body.dataset.pending = "1";
    const key = requestKey("estimate");
    try {
      const d = await call("POST", "/api/estimate", estimateBody());
      if (seq !== state.seq) return;
      showError($("error"), null);
      state.formError = false;
      renderEstimate(d);
      resultShown("estimate", key);
    } catch (err) {
      if (seq !== state.seq) return;
      showError($("error"), err);
      state.formError = true;
      resultFailed("estimate");
      document.body.dataset.estimate = "error";
    } finally {
      if (seq === state.seq) {
        $("busy").hidden = true;
        if (!state.timerPending) document.body.dataset.pending = "0";
      }
    }
  }

  function schedule() {
    clearTimeout(state.timer);
    state.timerPending = true;
    document.body.dataset.pending = "1";
    state.timer = setTimeout(runEstimate, 250);
  }

  function renderEstimate(d) {
    state.lastEstimate = d;
    const m = d.memory, t = d.time, thr = d.throughput, run = d.run;
    $("headline").textContent = `${d.model.name} (${count(d.model.params)} params) on ${d.devices} × ${d.hardware}`;
    $("subline").textContent = `${layoutText(d.layout)} · ${d.recipe.method}, ${d.recipe.precision}, ${d.recipe.optimizer}, `
      + `seq ${d.recipe.seq_len}, micro-batch ${d.recipe.micro_batch}, recompute ${d.recipe.recompute}`;
    const total = $("mem-total");
    total.textContent = gb(m.per_device_bytes);
    total.dataset.bytes = String(m.per_device_bytes);
    $("mem-capacity").textContent = `of ${gb(m.capacity_bytes)} (${pct(m.per_device_bytes / m.capacity_bytes)})`;
    $("fits").textContent = m.fits ? "fits" : "does not fit";
    $("card-memory").classList.toggle("over", !m.fits);
    $("fits").className = "v " + (m.fits ? "ok" : "over");
    $("fits-detail").textContent = m.fits ? `${gb(m.capacity_bytes - m.per_device_bytes)} free` : `over by ${gb(m.per_device_bytes - m.capacity_bytes)}`;
    $("step-time").textContent = duration(t.step_s);
    const cal = d.calibration;
    $("step-band").textContent = bandText(cal, false);
    $("tokens-band").textContent = bandText(cal, true);
    $("mem-band").textContent = bandText(cal.memory, false);
    $("fit-verdict").textContent = m.fit_verdict ? `within the memory band: ${m.fit_verdict}` : "";
    $("calibration").textContent = cal.calibrated && cal.memory.calibrated
      ? `calibrated: step time from ${cal.rows} validated ${cal.class} runs, memory from ${cal.memory.rows} ${cal.memory.class} runs`
      : `uncalibrated: no validated ${cal.family} runs; the bands are the spread between the calibrated families`;
    $("calibration").classList.toggle("over", !cal.calibrated);
    $("microbatches").textContent = `${d.num_microbatches} micro-batch(es) per step`;
    $("tokens-s").textContent = `${int(thr.tokens_per_s)} tok/s`;
    $("mfu").textContent = `MFU ${pct(thr.mfu)}, ${int(thr.tokens_per_s_per_device)} per device`;
    if (run.time_s !== null && run.time_s !== undefined) {
      $("run-time").textContent = duration(run.time_s);
      $("device-hours").textContent = `${int(run.device_hours)} device-hours`;
    } else {
      $("run-time").textContent = "–";
      $("device-hours").textContent = "give tokens to train";
    }
    if (run.cost_usd !== null && run.cost_usd !== undefined) {
      $("cost").textContent = usd(run.cost_usd);
      $("price").textContent = priceLabel(run);
    } else {
      $("cost").textContent = "–";
      $("price").textContent = run.time_s == null ? "give tokens to train" : "no price known: set one";
    }
    const reasons = $("reasons");
    reasons.hidden = !d.reasons.length;
    reasons.textContent = d.reasons.join("; ");
    $("peak-phase").textContent = m.peak_phase;
    Charts.stackedBar($("memory-chart"), {
      label: "memory per device",
      segments: d.terms.memory.map((x) => ({ name: x.name, value: x.bytes, color: x.color })),
      total: m.per_device_bytes, limit: m.capacity_bytes, limitLabel: `device memory ${gb(m.capacity_bytes)}`,
      fmt: (b) => gb(b), tickFmt: (b) => `${+(b / GB).toFixed(1)} GB`,
    });
    const used = {};
    Charts.stackedBar($("time-chart"), {
      label: "step time",
      segments: d.terms.time.filter((x) => x.s > 0).map((x) => {
        const shades = TIME_COLORS[x.group] || ["#888"];
        const i = used[x.group] = (used[x.group] === undefined ? 0 : used[x.group] + 1);
        return { name: `${x.name}`, value: x.s, color: shades[i % shades.length] };
      }),
      total: t.step_s, fmt: duration,
    });
    const groups = {};
    for (const x of d.terms.time) groups[x.group] = (groups[x.group] || 0) + x.s;
    const parts = Object.entries(groups).filter(([, v]) => v > 0).map(([g, v]) => `${GROUP_NAMES[g] || g} ${pct(v / t.step_s)}`);
    $("notes").textContent = [parts.join(" · "), ...(t.notes || [])].join(" — ");
    document.body.dataset.estimate = "done";
  }

  // --- compare ------------------------------------------------------------------------------
  function checkedHardware() {
    return [...document.querySelectorAll("#compare-list input:checked")].map((n) => n.value);
  }

  function searchBody(schema, keepDevices) {
    const body = Object.assign(modelPart(), { hardware: checkedHardware() });
    for (const f of state.fields) {
      if (!(f.name in schema) || SEARCHED.includes(f.name) || f.name === "devices") continue;
      const v = readField(f);
      // a field left at the estimate's default takes the search's own default (the CLI's):
      // e.g. precision, searched over --precisions unless given
      const ownDefault = schema[f.name].default === undefined ? null : schema[f.name].default;
      if (v === f.spec.default && ownDefault !== f.spec.default) continue;
      if (v !== undefined) body[f.name] = v;
    }
    for (const f of state.planFields) {
      if (!(f.name in schema)) continue;
      const v = readField(f);
      if (v !== undefined) body[f.name] = v;
    }
    if (keepDevices) body.devices = readField(state.fields.find((f) => f.name === "devices"));
    return body;
  }

  async function runCompare() {
    $("compare-summary").textContent = "searching…";
    $("compare-btn").disabled = true;
    const key = requestKey("compare");
    try {
      const d = await call("POST", "/api/compare", searchBody(state.compareSchema, $("cmp-keep-devices").checked));
      showError($("compare-error"), null);
      renderCompare(d);
      resultShown("compare", key);
    } catch (err) {
      $("compare-summary").textContent = "";
      showError($("compare-error"), err);
      resultFailed("compare");
      document.body.dataset.compare = "error";
    } finally {
      $("compare-btn").disabled = false;
    }
  }

  function costOf(e) {
    if (e.run.cost_usd !== null) return e.run.cost_usd;
    return e.system.usd_per_hour !== null ? e.system.usd_per_hour * e.time.step_s / 3600 : null;
  }

  function renderCompare(d) {
    const rows = d.hardware;
    const labels = rows.map((r) => (r.plan ? tagged(r.plan.label, r.plan) : r.hardware));
    const haveRun = d.tokens !== null;
    Charts.panels($("compare-chart"), labels, [
      { title: "step time", rows: rows.map((r) => r.plan
          ? { value: r.plan.time.step_s, text: duration(r.plan.time.step_s), color: "#4e79a7" }
          : { value: 0, text: (r.reason || "no plan").slice(0, 44) }) },
      { title: "memory / capacity", limit: 100, limitLabel: "100%", rows: rows.map((r) => {
          if (!r.plan) return { value: 0, text: "" };
          const m = r.plan.memory, p = 100 * m.per_device_bytes / m.capacity_bytes;
          return { value: p, text: `${p.toFixed(0)}% of ${(m.capacity_bytes / GB).toFixed(0)} GB`, color: "#59a14f" };
        }) },
      { title: haveRun ? "cost of the run" : "cost per step", rows: rows.map((r) => {
          if (!r.plan) return { value: 0, text: "" };
          const c = costOf(r.plan);
          return c === null ? { value: 0, text: "no price" } : { value: c, text: usd(c), color: "#f28e2b" };
        }) },
    ], "accelerator comparison");
    const table = $("compare-table");
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const h of ["system", "layout", "micro-batch · recompute · offload", "tokens/s", "MFU", haveRun ? "time" : "",
      haveRun ? "cost" : "cost per step", "step-time band", "price (provider kind, date)", "why", ""]) {
      const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    }
    const tb = table.createTBody();
    for (const r of rows) {
      const row = tb.insertRow();
      if (!r.plan) {
        row.insertCell().textContent = r.hardware;
        const c = row.insertCell(); c.colSpan = 10; c.textContent = r.reason || "no plan";
        continue;
      }
      const p = r.plan;
      for (const c of [p.label, layoutText(p.layout), `${p.recipe.micro_batch} · ${p.recipe.recompute} · ${p.recipe.offload}`,
        int(p.throughput.tokens_per_s), pct(p.throughput.mfu), haveRun ? duration(p.run.time_s) : "",
        costOf(p) === null ? "no price" : usd(costOf(p)),
        bandText(p.calibration, false) + (p.tie_within_error ? " · tie within error" : ""),
        priceLabel(p.run)]) row.insertCell().textContent = String(c);
      whyCell(row, p);
      row.insertCell().appendChild(loadButton(p));
    }
    const ok = rows.filter((r) => r.plan);
    const s = [];
    if (ok.length) {
      const fastest = ok.reduce((a, b) => (b.plan.time.step_s < a.plan.time.step_s ? b : a));
      s.push(`fastest: ${fastest.plan.label}`);
      const priced = ok.filter((r) => costOf(r.plan) !== null);
      if (priced.length) s.push(`cheapest: ${priced.reduce((a, b) => (costOf(b.plan) < costOf(a.plan) ? b : a)).plan.label}`);
    } else {
      s.push("no accelerator fits");
    }
    $("compare-summary").textContent = s.join(" · ");
    const first = ok.length ? ok.reduce((a, b) => (b.plan.time.step_s < a.plan.time.step_s ? b : a)).plan : null;
    showWhy($("compare-why"), first, d.notes);
    showRanking($("compare-ranking"), d.ranking);
    document.body.dataset.compare = "done";
  }

  // The reasons of one plan, as the JSON carries them: why it cannot run (reasons), what binds it
  // (explanation.binds) and the alternatives it was weighed against (explanation.alternatives).
  function whyItems(p) {
    const e = p.explanation || {};
    return [...(p.reasons || []).map((t) => ["reason", t]), ...(e.binds || []).map((t) => ["binds", t]),
      ...(e.alternatives || []).map((t) => ["alternative", t])];
  }
  function whyList(p) {
    const ul = document.createElement("ul");
    ul.className = "why";
    for (const [kind, line] of whyItems(p)) {
      const li = document.createElement("li");
      li.className = kind;
      li.textContent = kind === "alternative" ? `vs ${line}` : line;
      ul.appendChild(li);
    }
    return ul;
  }
  function whyCell(row, p) {
    const cell = row.insertCell();
    cell.className = "why-cell";
    if (!whyItems(p).length) return;
    const det = document.createElement("details");
    const sum = document.createElement("summary");
    sum.textContent = "why";
    det.append(sum, whyList(p));
    cell.appendChild(det);
  }
  function showWhy(box, p, notes) {
    box.replaceChildren();
    if (p) {
      const h = document.createElement("p");
      h.className = "why-head";
      h.textContent = `Why #1, ${tagged(p.label, p)} (${layoutText(p.layout)}): step time ${bandText(p.calibration, false)}`;
      box.append(h, whyList(p));
    }
    if (notes && notes.length) {
      const ul = document.createElement("ul");
      ul.className = "notes";
      for (const n of notes) { const li = document.createElement("li"); li.textContent = n; ul.appendChild(li); }
      box.appendChild(ul);
    }
  }

  function loadButton(p) {
    const btn = document.createElement("button");
    btn.type = "button"; btn.className = "link"; btn.textContent = "load";
    btn.title = "put this plan into the form and estimate it";
    btn.addEventListener("click", () => loadPlan(p));
    return btn;
  }

  // --- plan ---------------------------------------------------------------------------------
  async function runPlan() {
    $("plan-summary").textContent = "searching…";
    $("plan-btn").disabled = true;
    const key = requestKey("plan");
    try {
      const d = await call("POST", "/api/plan", searchBody(state.planSchema, false));
      showError($("plan-error"), null);
      renderPlan(d);
      resultShown("plan", key);
    } catch (err) {
      $("plan-summary").textContent = "";
      showError($("plan-error"), err);
      resultFailed("plan");
      document.body.dataset.plan = "error";
    } finally {
      $("plan-btn").disabled = false;
    }
  }

  function layoutText(l) {
    const parts = [`dp ${l.dp}`, `tp ${l.tp}`, `pp ${l.pp}`];
    if (l.cp > 1) parts.push(`cp ${l.cp}`);
    if (l.ep > 1) parts.push(`ep ${l.ep}`);
    parts.push(`ZeRO ${l.zero}`);
    if (l.sequence_parallel) parts.push("SP");
    if (l.pp > 1) parts.push(l.pp_schedule + (l.virtual_stages > 1 ? `×${l.virtual_stages}` : ""));
    return parts.join(" ");
  }

  function renderPlan(d) {
    const byLabel = new Map();
    const key = (p) => `${p.label} ${layoutText(p.layout)} ${p.recipe.micro_batch} ${p.recipe.recompute} ${p.recipe.offload}`;
    for (const p of d.plans) byLabel.set(key(p), { p, front: false });
    for (const p of d.pareto) byLabel.set(key(p), { p, front: true });
    const haveRun = d.tokens !== null;
    const cost = costOf;
    const points = [...byLabel.values()].map(({ p, front }) => ({
      x: haveRun ? p.run.time_s / 3600 : p.time.step_s, y: cost(p), front, label: tagged(p.label, p),
      cls: front ? "front-pt" : "",
      tag: (d.fastest && key(p) === key(d.fastest) ? "fastest " : "") + (d.cheapest && key(p) === key(d.cheapest) ? "cheapest " : "") + p.label,
      info: `${p.label}, ${layoutText(p.layout)}: ${haveRun ? duration(p.run.time_s) : duration(p.time.step_s) + "/step"}, ${cost(p) === null ? "no price" : usd(cost(p))}`,
    }));
    $("pareto-caption").textContent = haveRun
      ? "Time to train vs cost of the run, best layout per accelerator and device count; the Pareto front is joined"
      : "Step time vs cost per step (give tokens to train for the run's time and cost)";
    Charts.scatter($("pareto-chart"), {
      label: "time versus cost", points,
      xLabel: haveRun ? "time to train (hours)" : "step time (s)", yLabel: haveRun ? "cost (USD)" : "cost per step (USD)",
      fmtX: (v) => (v >= 100 ? int(v) : v.toPrecision(2)), fmtY: (v) => usd(v),
      empty: "no priced plan to plot",
    });
    const table = $("plan-table");
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const h of ["#", "system", "layout", "micro-batch · recompute · offload", "memory", "step", "tokens/s", "MFU", haveRun ? "time" : "", haveRun ? "cost" : "", "step-time band", "price (provider kind, date)", "why", ""]) {
      const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    }
    const body = table.createTBody();
    for (const p of d.plans) {
      const row = body.insertRow();
      const cells = [p.rank, p.label, layoutText(p.layout), `${p.recipe.micro_batch} · ${p.recipe.recompute} · ${p.recipe.offload}`,
        gb(p.memory.per_device_bytes), duration(p.time.step_s), int(p.throughput.tokens_per_s), pct(p.throughput.mfu),
        haveRun ? duration(p.run.time_s) : "", haveRun ? (p.run.cost_usd === null ? "no price" : usd(p.run.cost_usd)) : "",
        bandText(p.calibration, false) + (p.tie_within_error ? " · tie within error with the row above" : ""),
        priceLabel(p.run)];
      for (const c of cells) row.insertCell().textContent = String(c);
      whyCell(row, p);
      row.insertCell().appendChild(loadButton(p));
    }
    const s = [`${d.search.feasible.toLocaleString("en-US")} of ${d.search.candidates.toLocaleString("en-US")} candidates fit`];
    if (d.fastest) s.push(`fastest: ${d.fastest.label}`);
    if (d.cheapest) s.push(`cheapest: ${d.cheapest.label}`);
    if (!d.constraints.met) s.push("constraints not met: " + d.constraints.failures.join("; "));
    $("plan-summary").textContent = s.join(" · ");
    showWhy($("plan-why"), d.plans[0] || null, d.notes);
    showRanking($("plan-ranking"), d.ranking);
    document.body.dataset.plan = "done";
  }

  function setField(name, value) {
    const f = state.fields.find((x) => x.name === name);
    if (!f || value === undefined) return;
    if (f.kind === "bool") f.input.checked = !!value;
    else if (f.kind === "tri") f.input.value = value === null ? "" : String(!!value);
    else f.input.value = value === null ? "" : String(value);
  }

  function loadPlan(p) {
    $("hardware").value = p.hardware;
    setField("devices", p.devices);
    for (const k of ["tp", "pp", "cp", "ep", "zero", "sequence_parallel", "pp_schedule", "virtual_stages"]) setField(k, p.layout[k]);
    setField("no_overlap_grad_reduce", !p.layout.overlap_grad_reduce);
    for (const k of ["precision", "micro_batch", "global_batch", "recompute", "offload"]) setField(k, p.recipe[k]);
    runEstimate();
    window.scrollTo({ top: 0, behavior: "smooth" });
  }

  // --- model upload -------------------------------------------------------------------------
  function onUpload(ev) {
    const file = ev.target.files[0];
    if (!file) return;
    if (file.size > MAX_CONFIG_BYTES) {
      showError($("error"), { field: "config", message: `${file.name} is ${int(file.size)} bytes, over the 1,000,000-byte limit for a config.json` });
      ev.target.value = "";
      state.formError = true;
      markStale();
      return;
    }
    const reader = new FileReader();
    reader.onload = () => {
      let cfg;
      try { cfg = JSON.parse(String(reader.result)); } catch (e) {
        showError($("error"), { field: "config", message: `${file.name} is not valid JSON (${e.message})` });
        state.formError = true;
        markStale();
        return;
      }
      state.config = cfg;
      const named = cfg && typeof cfg === "object" && typeof cfg._name_or_path === "string" && cfg._name_or_path.trim();
      state.configName = (named ? cfg._name_or_path.split("/").pop() : file.name.replace(/\.json$/i, "")) || "uploaded";
      $("config-label").textContent = `uploaded: ${state.configName} (${file.name})`;
      $("config-status").hidden = false;
      $("model").disabled = true;
      markStale();
      runEstimate();
    };
    reader.readAsText(file);
  }

  function clearUpload() {
    state.config = null;
    $("config-file").value = "";
    $("config-status").hidden = true;
    $("model").disabled = false;
    markStale();
    runEstimate();
  }

  // --- start --------------------------------------------------------------------------------
  async function start() {
    const [openapi, models, hardware] = await Promise.all([
      call("GET", "/api/openapi.json"), call("GET", "/api/models"), call("GET", "/api/hardware")]);
    buildForm(openapi);
    for (const m of models) {
      const o = document.createElement("option");
      o.value = m.name; o.textContent = `${m.name} (${count(m.params)})`;
      $("model").appendChild(o);
    }
    $("model").value = models.some((m) => m.name === "llama-3.1-8b") ? "llama-3.1-8b" : models[0].name;
    state.hardware = hardware;
    for (const a of hardware) {
      const o = document.createElement("option");
      o.value = a.name; o.textContent = a.name;
      $("hardware").appendChild(o);
      const lab = document.createElement("label");
      lab.className = "check";
      const cb = document.createElement("input");
      cb.type = "checkbox"; cb.value = a.name; cb.id = `c-${a.name}`;
      cb.checked = ["h100-sxm", "h200", "b200", "mi300x", "a100-80gb"].includes(a.name);
      lab.append(cb, document.createTextNode(" " + a.name));
      $("compare-list").appendChild(lab);
    }
    $("hardware").value = hardware.some((a) => a.name === "h100-sxm") ? "h100-sxm" : hardware[0].name;
    $("form").addEventListener("submit", (ev) => { ev.preventDefault(); runEstimate(); });
    $("form").addEventListener("change", (ev) => { if (ev.target.id !== "config-file") { markStale(); schedule(); } });
    $("form").addEventListener("input", (ev) => { if (ev.target.tagName === "INPUT" && ev.target.type === "text") { markStale(); schedule(); } });
    for (const id of ["plan-options", "compare-list", "cmp-keep-devices"]) {
      $(id).addEventListener("input", markStale);
      $(id).addEventListener("change", markStale);
    }
    $("config-file").addEventListener("change", onUpload);
    $("config-clear").addEventListener("click", clearUpload);
    $("compare-btn").addEventListener("click", runCompare);
    $("plan-btn").addEventListener("click", runPlan);
    document.body.dataset.ready = "yes";
    await runEstimate();
  }

  window.addEventListener("DOMContentLoaded", () => {
    start().catch((err) => showError($("error"), err));
  });
})();
