// longhaul dashboard: a hand-written single-page app. Pages by the URL's
// hash (#/live, #/history, #/run/ID, #/doctor, #/matrix, #/jobs); live data from the
// Server-Sent Events at /api/live; everything else from /api/*. Charts are
// SVG drawn here. Data never goes into innerHTML: text nodes only.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
  "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
const TOTAL_COLORS = { up: "#111827", down: "#7c3aed", send: "#111827" };
const LIMIT_COLORS = {
  cwnd: "#ef4444", receiver_window: "#f97316", sender_window: "#f59e0b", network: "#eab308",
  storage_read: "#22c55e", storage_write: "#14b8a6", source_read: "#22c55e", dest_write: "#14b8a6",
  cpu: "#8b5cf6", cpu_send: "#8b5cf6", cpu_recv: "#a855f7", rate_limit: "#64748b", pacing: "#64748b",
  loss: "#dc2626", latency: "#0ea5e9", streams: "#3b82f6",
};

const state = { live: null, liveCount: 0, page: null, timer: null, es: null };

// ---- helpers -------------------------------------------------------------

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    // Through the CSSOM: the page's CSP forbids style attributes.
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined) continue;
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return el;
}

function s(tag, attrs) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

function rate(bps) {
  if (bps === null || bps === undefined || !isFinite(bps)) return "–";
  const units = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
  let v = bps, i = 0;
  while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " " + units[i];
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + " " + units[i];
}

function when(unix) {
  if (!unix) return "–";
  const d = new Date(unix * 1000);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

function secs(x) {
  if (x === null || x === undefined) return "–";
  return x < 120 ? x.toFixed(1) + " s" : x < 7200 ? (x / 60).toFixed(1) + " min" : (x / 3600).toFixed(1) + " h";
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (!r.ok) throw new Error((body && body.error) || `${url}: HTTP ${r.status}`);
  return body;
}

function statusSpan(st) { return h("span", { class: "status-" + st }, st); }
function kindSpan(k) { return h("span", { class: "kind" }, k); }
function runLink(id, text) { return h("a", { href: `#/run/${id}` }, text === undefined ? `#${id}` : text); }

function colorOf(key, i) { return PALETTE[i % PALETTE.length]; }

// ---- charts --------------------------------------------------------------

// series: [{name, color, total, pts: [[x, y], ...]}]; marks: [{x0, x1, limit}]
function lineChart(series, marks, opts) {
  opts = opts || {};
  const W = 1000, H = opts.height || 300, L = 70, R = 12, T = 10, B = marks && marks.length ? 44 : 28;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart" + (opts.small ? " small" : ""),
    preserveAspectRatio: "none", role: "img" });
  const all = series.flatMap((x) => x.pts);
  svg.setAttribute("data-points", String(all.length));
  if (opts.id) svg.setAttribute("id", opts.id);
  if (!all.length) {
    const t = s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" });
    t.textContent = opts.empty || "no intervals yet";
    svg.append(t);
    return svg;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  for (const m of marks || []) { x0 = Math.min(x0, m.x0); x1 = Math.max(x1, m.x1); }
  if (x1 <= x0) x1 = x0 + 1;
  let y1 = Math.max(...all.map((p) => p[1]));
  if (!(y1 > 0)) y1 = 1;
  const step = niceStep(y1 / 4);
  y1 = Math.ceil(y1 / step) * step;
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - y / y1) * (H - T - B);
  for (let y = 0; y <= y1 + step / 2; y += step) {
    svg.append(s("line", { x1: L, x2: W - R, y1: py(y), y2: py(y), class: "grid" }));
    const t = s("text", { x: L - 6, y: py(y) + 4, "text-anchor": "end" });
    t.textContent = rate(y);
    svg.append(t);
  }
  const xstep = niceStep((x1 - x0) / 8);
  for (let x = Math.ceil(x0 / xstep) * xstep; x <= x1; x += xstep) {
    const t = s("text", { x: px(x), y: H - B + 14, "text-anchor": "middle" });
    t.textContent = (Math.round(x * 10) / 10) + " s";
    svg.append(t);
  }
  svg.append(s("line", { x1: L, x2: W - R, y1: py(0), y2: py(0), class: "axis" }));
  svg.append(s("line", { x1: L, x2: L, y1: T, y2: py(0), class: "axis" }));
  // Streams first, totals on top.
  const ordered = series.filter((x) => !x.total).concat(series.filter((x) => x.total));
  for (const ser of ordered) {
    if (!ser.pts.length) continue;
    const d = ser.pts.map((p, i) => (i ? "L" : "M") + px(p[0]).toFixed(1) + " " + py(p[1]).toFixed(1)).join(" ");
    const path = s("path", { d, stroke: ser.color, class: ser.total ? "total" : "stream",
      "vector-effect": "non-scaling-stroke", "data-series": ser.name });
    const title = s("title");
    title.textContent = ser.name;
    path.append(title);
    svg.append(path);
  }
  // Each interval's limit, as a band under the axis.
  for (const m of marks || []) {
    if (!m.limit) continue;
    const r = s("rect", { x: px(m.x0), width: Math.max(1, px(m.x1) - px(m.x0)), y: H - 22, height: 10,
      fill: LIMIT_COLORS[m.limit] || "#94a3b8", class: "limit-mark", "data-limit": m.limit });
    const title = s("title");
    title.textContent = `${m.x0.toFixed(1)}–${m.x1.toFixed(1)} s: limited by ${m.limit}`;
    r.append(title);
    svg.append(r);
  }
  return svg;
}

function niceStep(raw) {
  if (!(raw > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
}

function legend(series, marks) {
  const items = series.map((x) => h("span", {}, h("i", { style: `background:${x.color}` }), x.name));
  const limits = [...new Set((marks || []).map((m) => m.limit).filter(Boolean))];
  for (const l of limits) {
    items.push(h("span", {}, h("i", { style: `background:${LIMIT_COLORS[l] || "#94a3b8"}; height: 10px` }),
      "limit: " + l));
  }
  return h("div", { class: "legend" }, items);
}

// rows: [{dir, stream, x0, x1, bps, limit}] -> series (totals and streams) and marks
function toSeries(rows, maxStreams) {
  const byKey = new Map();
  const dirs = [...new Set(rows.map((r) => r.dir))];
  for (const r of rows) {
    const key = r.dir + "/" + r.stream;
    if (!byKey.has(key)) byKey.set(key, { dir: r.dir, stream: r.stream, pts: [] });
    byKey.get(key).pts.push([r.x1, r.bps]);
  }
  const series = [];
  let i = 0;
  const keys = [...byKey.keys()].sort((a, b) => {
    const A = byKey.get(a), B = byKey.get(b);
    return A.dir === B.dir ? A.stream - B.stream : A.dir < B.dir ? -1 : 1;
  });
  for (const k of keys) {
    const v = byKey.get(k);
    v.pts.sort((a, b) => a[0] - b[0]);
    const total = v.stream < 0;
    if (!total && i >= (maxStreams || 32)) continue;
    const label = (dirs.length > 1 || v.dir !== "send" ? v.dir + " " : "") + (total ? "total" : "stream " + v.stream);
    series.push({ name: label, total, pts: v.pts,
      color: total ? (TOTAL_COLORS[v.dir] || "#111827") : colorOf(k, i++) });
  }
  // A total that is the only stream is drawn once.
  const firstDir = dirs[0];
  const marks = rows.filter((r) => r.stream < 0 && r.dir === firstDir && r.limit)
    .map((r) => ({ x0: r.x0, x1: r.x1, limit: r.limit }));
  return { series, marks };
}

// ---- live ----------------------------------------------------------------

function connectLive() {
  if (state.es) state.es.close();
  const es = new EventSource("/api/live");
  state.es = es;
  const conn = document.getElementById("conn");
  es.addEventListener("open", () => { conn.textContent = "live"; conn.className = "conn on"; });
  es.addEventListener("error", () => { conn.textContent = "reconnecting"; conn.className = "conn off"; });
  es.addEventListener("live", (ev) => {
    let data;
    try { data = JSON.parse(ev.data); } catch (_) { return; }
    state.live = data;
    state.liveCount++;
    document.body.setAttribute("data-live-seq", String(data.seq));
    document.body.setAttribute("data-updated", String(state.liveCount));
    showArchiveNote(data);
    if (state.page === "live") renderLive();
  });
}

function showArchiveNote(d) {
  const note = document.getElementById("archive-note");
  if (d.archive === "ok" || d.archive === "starting" || !d.error) { note.hidden = true; return; }
  note.hidden = false;
  note.textContent = d.error;
}

function renderLive() {
  const main = document.getElementById("main");
  const d = state.live;
  if (!d) { main.replaceChildren(h("p", { class: "muted" }, "Waiting for the live feed…")); return; }
  const running = d.running || [];
  const kids = [h("h2", {}, `Running now (${running.length})`)];
  if (!running.length) {
    kids.push(h("p", { class: "muted", id: "no-running" },
      d.archive === "ok" ? "Nothing is running. Runs of cp, sync, perf, doctor and bench disk appear here while they go."
        : "No archive yet."));
  }
  for (const r of running) kids.push(liveCard(r));
  const recent = d.recent || [];
  if (recent.length) {
    kids.push(h("h2", {}, "Just finished"));
    kids.push(runTable(recent));
  }
  main.replaceChildren(...kids);
}

function liveCard(r) {
  const rows = (r.points || []).map((p) => ({ dir: p.dir, stream: p.stream, x0: p.t - 1, x1: p.t, bps: p.bps, limit: p.limit }));
  // Interval starts: the previous end of the same series.
  const prev = new Map();
  for (const row of rows) {
    const k = row.dir + "/" + row.stream;
    if (prev.has(k)) row.x0 = prev.get(k);
    prev.set(k, row.x1);
  }
  const { series, marks } = toSeries(rows, 16);
  const elapsed = (state.live.at || 0) - r.started_at;
  // A run whose process died still says running until the next run settles it.
  const stale = (state.live.at || 0) - r.updated_at;
  return h("div", { class: "card live-run", id: "live-" + r.id, "data-run": r.id },
    h("div", { class: "card-head" },
      runLink(r.id, `#${r.id}`), kindSpan(r.kind),
      h("span", { class: "title" }, r.remote_host || r.dest || r.command),
      h("span", { class: "live-rate", "data-run": r.id, "data-updated": String(state.liveCount),
        "data-bps": r.rate_bps === null ? "" : String(r.rate_bps) }, rate(r.rate_bps)),
      h("span", { class: "stat live-bytes", "data-run": r.id }, bytes(r.live_bytes)),
      r.live_files ? h("span", { class: "stat" }, `${r.live_files} files`) : null,
      h("span", { class: "muted" }, "for " + secs(Math.max(0, elapsed))),
      stale > 10 ? h("span", { class: "warn" }, `no update for ${secs(stale)}: its process may be gone`) : null),
    h("div", { class: "muted" }, r.command),
    lineChart(series, marks, { small: true, height: 190, id: "live-chart-" + r.id }),
    legend(series, marks));
}

// ---- history -------------------------------------------------------------

function runTable(runs) {
  return h("table", { class: "runs" },
    h("thead", {}, h("tr", {}, ["run", "kind", "status", "started", "remote / path", "export", "bytes", "files", "time", "rate", "verdict"]
      .map((x, i) => h("th", { class: i >= 6 && i <= 9 ? "num" : null }, x)))),
    h("tbody", {}, runs.map((r) => h("tr", { "data-run": r.id, "data-kind": r.kind },
      h("td", {}, runLink(r.id)),
      h("td", {}, kindSpan(r.kind)),
      h("td", {}, statusSpan(r.status)),
      h("td", {}, when(r.started_at)),
      h("td", {}, r.remote_host || "–"),
      h("td", {}, r.export || "–"),
      h("td", { class: "num" }, bytes(r.bytes !== null ? r.bytes : r.live_bytes)),
      h("td", { class: "num" }, r.files !== null ? r.files : r.live_files || "–"),
      h("td", { class: "num" }, secs(r.seconds)),
      h("td", { class: "num" }, rate(r.bits_per_second !== null ? r.bits_per_second : r.live_bps)),
      h("td", {}, r.verdict || (r.error ? h("span", { class: "error", title: r.error }, "error") : "–"))))));
}

async function renderHistory(params) {
  const main = document.getElementById("main");
  const f = (name, label, input) => h("label", {}, label, input);
  const val = (k) => params.get(k) || "";
  const kind = h("select", { name: "kind" }, ["", "perf", "cp", "sync", "doctor", "bench-disk", "served", "matrix", "job"]
    .map((k) => h("option", { value: k, selected: val("kind") === k ? "selected" : null }, k || "any")));
  const status = h("select", { name: "status" }, ["", "running", "ok", "partial", "failed", "interrupted"]
    .map((k) => h("option", { value: k, selected: val("status") === k ? "selected" : null }, k || "any")));
  const form = h("form", { class: "filters", id: "history-filters" },
    f("kind", "kind", kind),
    f("host", "host", h("input", { name: "host", value: val("host"), placeholder: "part of a name" })),
    f("since", "since", h("input", { name: "since", value: val("since"), placeholder: "2h, 7d, 2026-11-01", size: 12 })),
    f("export", "export", h("input", { name: "export", value: val("export"), size: 10 })),
    f("status", "status", status),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) q.set(k, v);
    location.hash = "#/history" + (q.toString() ? "?" + q : "");
  });
  const out = h("div", { id: "history-out" }, h("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(h("h2", {}, "History"), form, out);
  try {
    const q = new URLSearchParams();
    for (const k of ["kind", "host", "since", "export", "status", "limit"]) if (params.get(k)) q.set(k, params.get(k));
    const d = await getJSON("/api/history?" + q);
    if (d.missing) out.replaceChildren(h("p", { class: "muted" }, "No archive yet."));
    else if (!d.runs.length) out.replaceChildren(h("p", { class: "muted" }, "No run matches."));
    else out.replaceChildren(h("p", { class: "muted" }, `${d.runs.length} runs, newest first`), runTable(d.runs));
  } catch (e) {
    out.replaceChildren(h("p", { class: "error" }, e.message));
  }
}

// ---- a run ---------------------------------------------------------------

async function renderRun(id) {
  const main = document.getElementById("main");
  let d;
  try {
    d = await getJSON("/api/run/" + encodeURIComponent(id));
  } catch (e) {
    main.replaceChildren(h("h2", {}, `Run ${id}`), h("p", { class: "error" }, e.message));
    return;
  }
  if (state.page !== "run") return;
  const rows = (d.intervals || [])
    .map((r) => ({ dir: r.direction, stream: r.stream, x0: r.start_s, x1: r.end_s, bps: r.bits_per_second, limit: r.limit }));
  const { series, marks } = toSeries(rows, 64);
  const kv = (k, v) => (v === null || v === undefined || v === "" ? null : h("tr", {}, h("td", {}, k), h("td", {}, v)));
  const info = h("table", { class: "kv" }, h("tbody", {},
    kv("kind", kindSpan(d.kind)), kv("status", statusSpan(d.status)), kv("command", d.command),
    kv("started", when(d.started_at)), kv("ended", d.ended_at ? when(d.ended_at) : null),
    kv("host", d.local_host), kv("remote / path", d.remote_host), kv("export", d.export), kv("grant", d.grant),
    kv("source", d.source), kv("destination", d.dest),
    kv("bytes", bytes(d.bytes !== null ? d.bytes : d.live_bytes)),
    kv("files", d.files !== null ? d.files : d.live_files),
    kv("time", d.seconds !== null ? secs(d.seconds) : null),
    kv("rate", rate(d.bits_per_second !== null ? d.bits_per_second : d.live_bps)),
    kv("verified", d.verified === null ? null : d.verified ? "yes" : "no"),
    kv("verdict", d.verdict), kv("error", d.error ? h("span", { class: "error" }, d.error) : null),
    kv("lost rows", d.lost ? String(d.lost) : null)));
  const kids = [
    h("h2", {}, `Run #${d.id} `, kindSpan(d.kind), " ", statusSpan(d.status)),
    h("div", { class: "card" }, h("h3", {}, "Intervals"),
      lineChart(series, marks, { id: "run-chart",
        empty: d.status === "running" ? "no intervals yet" : "no intervals recorded (a run shorter than an interval)" }), legend(series, marks)),
  ];
  if (d.stages) kids.push(h("div", { class: "card" }, h("h3", {}, "Stage rates"), stages(d.stages)));
  kids.push(h("div", { class: "grid2" },
    h("div", { class: "card" }, h("h3", {}, "Run"), info),
    h("div", { class: "card" }, h("h3", {}, "Parameters"), h("pre", { id: "run-params" }, d.params ? JSON.stringify(d.params, null, 2) : "none"))));
  if (d.warnings && d.warnings.length) {
    kids.push(h("div", { class: "card" }, h("h3", {}, "Warnings"),
      h("ul", {}, d.warnings.map((w) => h("li", { class: "warn" }, w)))));
  }
  kids.push(h("div", { class: "card" }, h("h3", {}, "Summary"), h("pre", { id: "run-summary" }, d.summary ? JSON.stringify(d.summary, null, 2) : "none yet")));
  if (d.file_count) {
    kids.push(h("div", { class: "card" }, h("h3", {}, `Files (${d.files_first.length} of ${d.file_count})`),
      h("table", {}, h("thead", {}, h("tr", {}, ["path", "size", "verified", "digest"].map((x) => h("th", {}, x)))),
        h("tbody", {}, d.files_first.map((f) => h("tr", {}, h("td", {}, f.path), h("td", { class: "num" }, bytes(f.size)),
          h("td", {}, f.verified ? "yes" : "no"), h("td", { class: "muted" }, f.digest ? f.digest.slice(0, 16) + "…" : "–")))))));
  }
  main.replaceChildren(...kids);
  if (d.status === "running") {
    clearTimeout(state.timer);
    state.timer = setTimeout(() => { if (state.page === "run" && state.runId === id) renderRun(id); }, 1000);
  }
}

function stages(st) {
  const list = [["source read", st.source_read_bps], ["network", st.network_bps], ["destination write", st.dest_write_bps]]
    .filter((x) => x[1] !== null && x[1] !== undefined);
  const max = Math.max(...list.map((x) => x[1]), 1);
  const min = Math.min(...list.map((x) => x[1]));
  return h("table", { class: "stages" }, h("tbody", {}, list.map(([name, v]) => h("tr", {},
    h("td", { style: "width:150px" }, name),
    h("td", {}, h("div", { class: "bar" + (v === min && list.length > 1 ? " slowest" : ""),
      style: `width:${Math.max(1, (100 * v) / max).toFixed(1)}%` })),
    h("td", { class: "num", style: "width:120px" }, rate(v))))));
}

// ---- doctor --------------------------------------------------------------

async function renderDoctor() {
  const main = document.getElementById("main");
  main.replaceChildren(h("h2", {}, "Doctor verdicts by path"), h("p", { class: "muted" }, "Loading…"));
  let d;
  try { d = await getJSON("/api/doctor"); } catch (e) {
    main.replaceChildren(h("h2", {}, "Doctor verdicts by path"), h("p", { class: "error" }, e.message));
    return;
  }
  if (state.page !== "doctor") return;
  const kids = [h("h2", {}, "Doctor verdicts by path")];
  if (!d.paths.length) kids.push(h("p", { class: "muted" }, "No doctor runs yet: `longhaul doctor HOST:EXPORT` measures every stage of a path and names the slowest."));
  for (const p of d.paths) {
    const runs = p.runs.slice().reverse(); // oldest first on the timeline
    kids.push(h("div", { class: "card doctor-path" },
      h("h3", {}, p.path),
      h("div", { class: "timeline" }, runs.map((r) => h("a", {
        class: "chip", href: `#/run/${r.id}`, title: `${when(r.started_at)}: ${r.verdict || r.status}`,
        style: `background:${LIMIT_COLORS[r.verdict] || (r.status === "ok" ? "#64748b" : "#cf222e")}`,
      }, r.verdict || r.status))),
      h("table", {}, h("thead", {}, h("tr", {}, ["run", "when", "status", "verdict", "rate"].map((x) => h("th", {}, x)))),
        h("tbody", {}, p.runs.map((r) => h("tr", {}, h("td", {}, runLink(r.id)), h("td", {}, when(r.started_at)),
          h("td", {}, statusSpan(r.status)), h("td", {}, r.verdict || "–"), h("td", { class: "num" }, rate(r.bits_per_second))))))));
  }
  main.replaceChildren(...kids);
}

// ---- matrix --------------------------------------------------------------

// Tool names and settings come from a user's --tools-file: text nodes only,
// like everything else here.
const PATH_COLORS = ["#1f4ea0", "#d55e00", "#23783c", "#6e3c96", "#008ca0", "#966e14"];

function gbit(bytesPerSecond) {
  if (bytesPerSecond === null || bytesPerSecond === undefined || !isFinite(bytesPerSecond)) return "–";
  return (bytesPerSecond * 8 / 1e9).toFixed(2);
}

function cellText(c) {
  if (!c) return ["–", null];
  if (!c.rate) return [c.error ? "failed" : "–", c.error ? "error" : null];
  const r = c.rate;
  let t = gbit(r.median_bytes_per_second);
  let cls = null;
  if (c.verified === false) { t += " NOT VERIFIED"; cls = "error"; }
  else if (c.error) { t += " (some runs failed)"; cls = "warn"; }
  return [t, cls];
}

// A cell's rate over the matrix runs, oldest first: a small line.
function sparkline(points) {
  const W = 160, H = 28, P = 3;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "spark", role: "img" });
  const pts = points.filter((p) => p.bits_per_second !== null && p.bits_per_second !== undefined);
  svg.setAttribute("data-points", String(pts.length));
  if (!pts.length) return svg;
  const max = Math.max(...pts.map((p) => p.bits_per_second), 1);
  const n = points.length;
  const px = (i) => (n > 1 ? P + (i * (W - 2 * P)) / (n - 1) : W / 2);
  const py = (v) => H - P - (v / max) * (H - 2 * P);
  const xy = points.map((p, i) => [i, p]).filter(([, p]) => p.bits_per_second !== null && p.bits_per_second !== undefined);
  const d = xy.map(([i, p], k) => (k ? "L" : "M") + px(i).toFixed(1) + " " + py(p.bits_per_second).toFixed(1)).join(" ");
  svg.append(s("path", { d, class: "spark-line" }));
  for (const [i, p] of xy) {
    const dot = s("circle", { cx: px(i), cy: py(p.bits_per_second), r: 2,
      class: p.verified === false ? "spark-bad" : "spark-dot" });
    const title = s("title");
    title.textContent = `run #${p.run}, ${when(p.started_at)}: ${rate(p.bits_per_second)}`;
    dot.append(title);
    svg.append(dot);
  }
  return svg;
}

async function renderMatrix(params) {
  const main = document.getElementById("main");
  main.replaceChildren(h("h2", {}, "Matrix"), h("p", { class: "muted" }, "Loading…"));
  const q = new URLSearchParams();
  if (params.get("run")) q.set("run", params.get("run"));
  let d;
  try { d = await getJSON("/api/matrix" + (q.toString() ? "?" + q : "")); } catch (e) {
    main.replaceChildren(h("h2", {}, "Matrix"), h("p", { class: "error", id: "matrix-error" }, e.message));
    return;
  }
  if (state.page !== "matrix") return;
  if (!d.matrix) {
    main.replaceChildren(h("h2", {}, "Matrix"), h("p", { class: "muted", id: "matrix-none" },
      d.missing ? "No archive yet." : "No matrix archived yet: `longhaul matrix --quick` runs one."));
    return;
  }
  const m = d.matrix, run = d.run;
  const kids = [h("h2", {}, `Matrix run #${run.id} `, statusSpan(run.status), " ",
    h("span", { class: "muted" }, when(run.started_at)))];
  kids.push(h("p", { class: "muted" }, run.command));
  if (d.runs.length > 1) {
    kids.push(h("p", { class: "matrix-runs" }, "Archived matrices: ",
      d.runs.map((r) => h("a", { class: "chip" + (r.id === run.id ? " current" : ""), href: `#/matrix?run=${r.id}`,
        title: `${when(r.started_at)}, ${r.cells} cells, ${r.status}` }, `#${r.id}`))));
  }
  const cols = m.paths.flatMap((p) => ["put", "get"].map((dir) => [p, dir]));
  const hist = new Map();
  for (const c of d.history) hist.set([c.tool, c.settings, c.path, c.workload, c.direction].join("\u0000"), c);
  for (const w of m.workloads) {
    const cells = m.cells.filter((c) => c.workload === w);
    if (!cells.length) continue;
    const rows = [];
    for (const c of cells) if (!rows.some(([t, st]) => t === c.tool && st === c.settings)) rows.push([c.tool, c.settings]);
    const used = cols.filter(([p, dir]) => cells.some((c) => c.path === p && c.direction === dir));
    const table = h("table", { class: "matrix", "data-workload": w },
      h("thead", {}, h("tr", {}, h("th", {}, "tool (settings)"),
        used.map(([p, dir]) => h("th", { class: "num" }, `${p} ${dir}`)))),
      h("tbody", {}, rows.map(([t, st]) => h("tr", {},
        h("td", { class: "matrix-tool" }, `${t} (${st})`),
        used.map(([p, dir]) => {
          const c = cells.find((x) => x.tool === t && x.settings === st && x.path === p && x.direction === dir);
          const [text, cls] = cellText(c);
          const title = c && c.rate ? `median ${gbit(c.rate.median_bytes_per_second)} Gbit/s, runs ${gbit(c.rate.min_bytes_per_second)}–${gbit(c.rate.max_bytes_per_second)}` +
            (c.cpu_seconds ? `; CPU ${c.cpu_seconds.client_seconds.toFixed(2)} s client, ${c.cpu_seconds.server_seconds.toFixed(2)} s server` : "") +
            (c.note ? `; ${c.note}` : "") : (c && c.error ? c.error : null);
          return h("td", { class: "num" + (cls ? " " + cls : ""), title }, text);
        })))));
    const histRows = cells.map((c) => {
      const hc = hist.get([c.tool, c.settings, c.path, c.workload, c.direction].join("\u0000"));
      return h("tr", {}, h("td", {}, `${c.tool} (${c.settings})`), h("td", {}, c.path), h("td", {}, c.direction),
        h("td", { class: "num" }, cellText(c)[0]),
        h("td", {}, sparkline(hc ? hc.points : [])));
    });
    kids.push(h("div", { class: "card" }, h("h3", {}, `${w}: median Gbit/s`), table,
      h("details", {}, h("summary", {}, "History of each cell (rate over the archived matrices, oldest first)"),
        h("table", { class: "matrix-history" }, h("thead", {}, h("tr", {}, ["tool (settings)", "path", "dir", "now", "history"]
          .map((x) => h("th", {}, x)))), h("tbody", {}, histRows)))));
  }
  const l = m.limits || {};
  const lim = [];
  for (const [p, v] of Object.entries(l.mem_to_mem_bytes_per_second || {})) lim.push(`memory to memory on ${p} ${gbit(v)} Gbit/s`);
  for (const [w, v] of Object.entries(l.local_copy_bytes_per_second || {})) lim.push(`local copy of ${w} ${gbit(v)} Gbit/s`);
  if (l.destination_write_bytes_per_second) lim.push(`destination write ${gbit(l.destination_write_bytes_per_second)} Gbit/s`);
  if (lim.length) kids.push(h("p", { class: "muted" }, "Limits in the same run: " + lim.join("; ")));
  const missing = (m.tools || []).filter((t) => !t.installed);
  if (missing.length) kids.push(h("ul", { class: "muted" }, missing.map((t) => h("li", {}, `${t.name}: ${t.note || "not installed"}`))));
  main.replaceChildren(...kids);
}

// ---- jobs ----------------------------------------------------------------

// A job server's jobs, from their archived attempts: each job's latest status
// and its attempts, each a link to its run.
async function renderJobs() {
  const main = document.getElementById("main");
  main.replaceChildren(h("h2", {}, "Jobs"), h("p", { class: "muted" }, "Loading…"));
  let d;
  try { d = await getJSON("/api/jobs"); } catch (e) {
    main.replaceChildren(h("h2", {}, "Jobs"), h("p", { class: "error", id: "jobs-error" }, e.message));
    return;
  }
  if (state.page !== "jobs") return;
  const kids = [h("h2", {}, "Jobs")];
  if (!d.jobs.length) kids.push(h("p", { class: "muted", id: "jobs-none" },
    d.missing ? "No archive yet." : "No job attempts archived on this host: a server started with `longhaul serve --jobs` archives each attempt of the jobs it runs."));
  for (const j of d.jobs) {
    kids.push(h("div", { class: "card job", "data-job": j.job },
      h("h3", {}, "job ", j.job, " ", statusSpan(j.status)),
      h("p", {}, j.source || "", " → ", j.dest || "", h("span", { class: "muted" }, ` (${bytes(j.bytes)} moved in all)`)),
      h("table", {}, h("thead", {}, h("tr", {}, ["run", "attempt", "when", "status", "bytes", "rate"].map((x) => h("th", {}, x)))),
        h("tbody", {}, j.attempts.map((a) => h("tr", {},
          h("td", {}, runLink(a.id)), h("td", { class: "num" }, a.run_number > 1 ? `${a.run_number}.${a.attempt}` : String(a.attempt)),
          h("td", {}, when(a.started_at)), h("td", {}, statusSpan(a.status)),
          h("td", { class: "num" }, bytes(a.bytes)), h("td", { class: "num" }, rate(a.bits_per_second))))))));
  }
  main.replaceChildren(...kids);
  clearTimeout(state.timer);
  state.timer = setTimeout(() => { if (state.page === "jobs") renderJobs(); }, 5000);
}

// ---- routing -------------------------------------------------------------

function route() {
  clearTimeout(state.timer);
  const hash = location.hash || "#/live";
  const [path, query] = hash.slice(1).split("?");
  const parts = path.split("/").filter(Boolean);
  const page = parts[0] || "live";
  state.page = page;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  if (page === "history") renderHistory(new URLSearchParams(query || ""));
  else if (page === "run" && parts[1]) { state.runId = parts[1]; renderRun(parts[1]); }
  else if (page === "doctor") renderDoctor();
  else if (page === "matrix") renderMatrix(new URLSearchParams(query || ""));
  else if (page === "jobs") renderJobs();
  else { state.page = "live"; renderLive(); }
}

async function start() {
  window.addEventListener("hashchange", route);
  connectLive();
  route();
  try {
    const st = await getJSON("/api/status");
    document.getElementById("archive-path").textContent = "archive: " + st.archive;
  } catch (_) { /* shown by the live feed */ }
}

document.addEventListener("DOMContentLoaded", start);
