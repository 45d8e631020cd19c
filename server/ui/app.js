// rbd dashboard: one page, no dependencies, served from the binary.
//
// It reads only the HTTP API (docs/http-api.md): /v1/buffers, /v1/activity,
// /v1/buffers/{name}/stats, /v1/buffers/{name}/rows, /v1/collectors. Every
// value from the server reaches the page as text (textContent, SVG text
// nodes, canvas pixels), never as markup: buffer names, stream names and
// error messages can hold anything a client sent.

const POLL_MS = 1000;
const WINDOW_S = 600; // the server's activity window
const main = document.getElementById("main");
const statusEl = document.getElementById("status");

// ---- DOM helpers -----------------------------------------------------------

// el builds an element; string children become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v; // CSSOM: allowed by the page's CSP, unlike a style attribute
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmt(n, digits = 0) {
  if (n === undefined || n === null || Number.isNaN(n)) return "-";
  if (!Number.isFinite(n)) return String(n);
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return n.toFixed(digits);
}

function fmtBytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

// ---- API access and the token ---------------------------------------------

const tokenKey = "rbd.token";
let tokenWaiters = null; // resolvers waiting for the token dialog

class HTTPError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

// api fetches path with the token, if one was given. A 401 opens the token
// dialog and retries once a token is entered.
async function api(path, { binary = false } = {}) {
  for (;;) {
    const headers = {};
    const tok = sessionStorage.getItem(tokenKey);
    if (tok) headers.Authorization = "Bearer " + tok;
    if (!binary) headers.Accept = "application/json";
    const res = await fetch(path, { headers, cache: "no-store" });
    if (res.status === 401) {
      await askToken(tok ? "That token was not accepted." : "");
      continue;
    }
    if (!res.ok) {
      let msg = res.status + " " + res.statusText;
      try { const body = await res.json(); if (body.error) msg = body.error; } catch (_) { /* not JSON */ }
      throw new HTTPError(res.status, msg);
    }
    return binary ? res.arrayBuffer() : res.json();
  }
}

function askToken(why) {
  const dlg = document.getElementById("token-dialog");
  document.getElementById("token-error").textContent = why;
  if (!dlg.open) {
    document.getElementById("token-input").value = "";
    dlg.showModal();
  }
  return new Promise((resolve) => {
    (tokenWaiters ||= []).push(resolve);
  });
}

document.getElementById("token-form").addEventListener("submit", () => {
  const v = document.getElementById("token-input").value.trim();
  if (v) sessionStorage.setItem(tokenKey, v);
  const ws = tokenWaiters || [];
  tokenWaiters = null;
  ws.forEach((r) => r());
});

function setStatus(text, isError) {
  statusEl.textContent = text;
  statusEl.classList.toggle("error", !!isError);
}

// ---- safetensors ---------------------------------------------------------

// parseSafetensors returns {name: {dtype, shape, data}} where data is a
// typed array (int64 as Number-valued Float64Array: seqs fit in 2^53).
function parseSafetensors(buf) {
  const dv = new DataView(buf);
  const hlen = Number(dv.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, hlen)));
  const base = 8 + hlen;
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [a, b] = t.data_offsets;
    const bytes = buf.slice(base + a, base + b); // aligned copy
    let data;
    switch (t.dtype) {
      case "F32": data = new Float32Array(bytes); break;
      case "F64": data = new Float64Array(bytes); break;
      case "I32": data = new Int32Array(bytes); break;
      case "I16": data = new Int16Array(bytes); break;
      case "U16": data = new Uint16Array(bytes); break;
      case "I8": data = new Int8Array(bytes); break;
      case "U8": case "BOOL": data = new Uint8Array(bytes); break;
      case "I64": data = Float64Array.from(new BigInt64Array(bytes), Number); break;
      case "U64": data = Float64Array.from(new BigUint64Array(bytes), Number); break;
      default: data = new Uint8Array(bytes); // F16, BF16: raw bytes
    }
    out[name] = { dtype: t.dtype, shape: t.shape, data };
  }
  return out;
}

// ---- charts (plain SVG) ----------------------------------------------------

// lineChart draws series [{name, color, t: [unix s], y: []}] over the last
// WINDOW_S seconds ending at now.
function lineChart(series, { now, height = 160, label = "" } = {}) {
  const W = 560, H = height, L = 46, R = 8, T = 8, B = 20;
  // The last WINDOW_S seconds, or less while the history is younger (at
  // least a minute), so that a new server's lines are not a sliver.
  let first = now;
  for (const s of series) if (s.t.length) first = Math.min(first, s.t[0]);
  const span = Math.min(WINDOW_S, Math.max(60, now - first));
  const t0 = now - span;
  let ymax = 0;
  for (const s of series) for (const v of s.y) ymax = Math.max(ymax, v);
  if (ymax <= 0) ymax = 1;
  const x = (t) => L + ((t - t0) / span) * (W - L - R);
  const y = (v) => T + (1 - v / ymax) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": label, class: "chart line" });
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  root.append(svg("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, fmt(ymax, ymax < 10 ? 1 : 0)));
  root.append(svg("text", { x: L - 4, y: H - B, "text-anchor": "end" }, "0"));
  root.append(svg("text", { x: L, y: H - 6 }, span >= 120 ? `-${Math.round(span / 60)} min` : `-${span} s`));
  root.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "now"));
  for (const s of series) {
    const pts = [];
    for (let i = 0; i < s.t.length; i++) if (s.t[i] >= t0) pts.push(`${x(s.t[i]).toFixed(1)},${y(s.y[i]).toFixed(1)}`);
    if (pts.length) root.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: s.color, "stroke-width": 1.5 }));
  }
  const legend = el("div", { class: "legend" }, series.map((s) =>
    el("span", {}, el("span", { class: "swatch", style: `background:${s.color}` }), s.name)));
  return el("div", {}, root, legend);
}

// barChart draws a histogram: counts[i] in [edges[i], edges[i+1]).
function barChart(edges, counts, { label = "", fmtEdge = (v) => fmt(v) } = {}) {
  const W = 560, H = 170, L = 46, R = 8, T = 8, B = 22;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": label, class: "chart bars" });
  const cmax = Math.max(1, ...counts);
  const bw = (W - L - R) / Math.max(1, counts.length);
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  root.append(svg("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, fmt(cmax)));
  counts.forEach((c, i) => {
    const h = (c / cmax) * (H - T - B);
    const r = svg("rect", { x: (L + i * bw + 1).toFixed(1), y: (H - B - h).toFixed(1), width: Math.max(1, bw - 2).toFixed(1), height: h.toFixed(1), fill: "#2563eb", "data-count": c });
    r.append(svg("title", {}, `[${fmtEdge(edges[i])}, ${fmtEdge(edges[i + 1])}): ${c}`));
    root.append(r);
  });
  if (edges.length) {
    root.append(svg("text", { x: L, y: H - 6 }, fmtEdge(edges[0])));
    root.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, fmtEdge(edges[edges.length - 1])));
  }
  return root;
}

// ---- activity history, merged across polls --------------------------------

const history = { buffers: new Map(), collectors: new Map(), now: 0 };

// mergeCols merges columnar points {t: [], k: []} into dst by second.
function mergeCols(dst, src) {
  const keys = Object.keys(src).filter((k) => k !== "t");
  for (let i = 0; i < src.t.length; i++) {
    const t = src.t[i];
    let j = dst.t.length;
    while (j > 0 && dst.t[j - 1] >= t) j--;
    if (j < dst.t.length && dst.t[j] === t) {
      for (const k of keys) dst[k][j] = src[k][i];
    } else {
      dst.t.splice(j, 0, t);
      for (const k of keys) (dst[k] ||= []).splice(j, 0, src[k][i]);
    }
  }
  // Drop what fell out of the window.
  let cut = 0;
  while (cut < dst.t.length && dst.t[cut] < history.now - WINDOW_S - 1) cut++;
  if (cut) for (const k of Object.keys(dst)) dst[k].splice(0, cut);
}

async function pollActivity() {
  // The second the last answer ended in may have changed since: ask again
  // from before it.
  const since = history.now ? history.now - 2 : 0;
  const a = await api(`/v1/activity?since=${since}`);
  history.now = a.now;
  for (const [kind, src] of [["buffers", a.buffers], ["collectors", a.collectors]]) {
    const m = history[kind];
    for (const [name, cols] of Object.entries(src || {})) {
      if (!m.has(name)) m.set(name, { t: [] });
      mergeCols(m.get(name), cols);
    }
    for (const name of [...m.keys()]) if (!(name in (src || {}))) m.delete(name);
  }
}

// rates turns a cumulative counter into per-second rates: a point's delta
// happened within its own second (a second without change has no point and
// a rate of 0).
function rates(t, c) {
  const out = { t: [], y: [] };
  for (let i = 1; i < t.length; i++) {
    if (t[i] - t[i - 1] > 1) { out.t.push(t[i - 1] + 1, t[i] - 1); out.y.push(0, 0); }
    out.t.push(t[i]);
    out.y.push(Math.max(0, c[i] - c[i - 1]));
  }
  return out;
}

// recentRate is the counter's mean rate over the last span seconds.
function recentRate(h, key, span = 10) {
  if (!h || !h.t.length) return 0;
  const now = history.now;
  const last = h[key][h.t.length - 1];
  let i = h.t.length - 1;
  while (i > 0 && h.t[i - 1] > now - span) i--;
  const before = i > 0 ? h[key][i - 1] : (h.t[0] > now - span ? h[key][0] : last);
  return Math.max(0, last - before) / span;
}

// ---- pages -----------------------------------------------------------------

let pageTimer = null;
let pageGen = 0;

function route() {
  const gen = ++pageGen;
  clearTimeout(pageTimer);
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active",
    a.dataset.nav === (parts[0] === "collectors" ? "collectors" : "overview")));
  let page;
  if (parts[0] === "buffer" && parts[1]) page = () => bufferPage(parts[1]);
  else if (parts[0] === "rows" && parts[1]) page = () => rowsPage(parts[1], params);
  else if (parts[0] === "collectors") page = collectorsPage;
  else page = overviewPage;
  const tick = async () => {
    try {
      const t0 = performance.now();
      const keep = await page();
      if (gen !== pageGen) return;
      // How long the refresh took, requests and drawing: what a slow
      // server or a page with many buffers costs, in plain sight.
      const ms = Math.round(performance.now() - t0);
      statusEl.dataset.refreshMs = ms;
      setStatus(`updated ${new Date().toLocaleTimeString()} in ${ms} ms`, false);
      if (keep !== false) pageTimer = setTimeout(tick, POLL_MS);
    } catch (e) {
      if (gen !== pageGen) return;
      setStatus(e.message, true);
      pageTimer = setTimeout(tick, 3 * POLL_MS);
    }
  };
  tick();
}

function render(...nodes) {
  main.replaceChildren(...nodes.flat());
}

function kindOf(info) {
  return (info.spec && info.spec.storage) || "memory";
}

function limiterBadge(rl) {
  if (!rl) return el("span", { class: "muted" }, "none");
  const blocked = rl.blocked && rl.blocked !== "none";
  return el("span", { class: "badge " + (blocked ? "warn" : "ok"), title: `diff ${fmt(rl.diff)} in [${fmt(rl.min_diff)}, ${fmt(rl.max_diff)}]` },
    blocked ? "holding back " + rl.blocked : "open");
}

function bytesOf(info) {
  let logical = 0, stored = 0;
  for (const b of Object.values(info.bytes || {})) { logical += b.logical; stored += b.stored; }
  return { logical, stored };
}

async function overviewPage() {
  const [list] = await Promise.all([api("/v1/buffers"), pollActivity()]);
  const bufs = list.buffers || [];
  const rows = bufs.map((info) => {
    const h = history.buffers.get(info.name);
    const cap = info.spec.capacity;
    const pct = cap ? (100 * info.size) / cap : 0;
    const { logical, stored } = bytesOf(info);
    const link = "#/buffer/" + encodeURIComponent(info.name);
    const spark = h ? sparkline([[rates(h.t, h.write_count), "#2563eb"], [rates(h.t, h.samples_served), "#d9480f"]]) : el("span");
    return el("tr", { "data-buffer": info.name, "data-size": info.size, "data-write-count": info.write_count },
      el("td", {}, el("a", { href: link, class: "name" }, info.name)),
      el("td", {}, kindOf(info)),
      el("td", {}, el("span", { class: "fill", title: pct.toFixed(1) + "%" }, el("span", { style: `width:${pct.toFixed(1)}%` })), " ",
        el("span", { class: "size" }, fmt(info.size)), el("span", { class: "muted" }, " / " + fmt(cap))),
      el("td", { class: "num write-count" }, fmt(info.write_count)),
      el("td", { class: "num ingest" }, fmt(recentRate(h, "write_count"), 1)),
      el("td", { class: "num sample-rate" }, fmt(recentRate(h, "samples_served"), 1)),
      el("td", {}, spark),
      el("td", { class: "num" }, fmtBytes(logical), el("span", { class: "muted" }, " / " + fmtBytes(stored))),
      el("td", { class: "num" }, fmt(info.durable_seq)),
      el("td", {}, limiterBadge(info.rate_limit)));
  });
  const table = el("table", { id: "buffers" },
    el("thead", {}, el("tr", {}, ["buffer", "kind", "fill", "writes", "in rows/s", "out rows/s", "in / out, last 10 min", "bytes logical / stored", "durable", "limiter"]
      .map((h, i) => el("th", { class: [3, 4, 5, 7, 8].includes(i) ? "num" : "" }, h)))),
    el("tbody", {}, rows));
  render(el("h1", {}, `Buffers (${bufs.length})`),
    bufs.length ? el("div", { class: "card" }, table) : el("p", { class: "muted" }, "No buffers yet: create one with PUT /v1/buffers/{name}."));
}

// sparkline draws rates [[{t, y}, color], ...] on one scale over the last
// WINDOW_S seconds (less while the history is younger, as lineChart).
function sparkline(lines) {
  const W = 120, H = 24;
  let first = history.now;
  for (const [r] of lines) if (r.t.length) first = Math.min(first, r.t[0]);
  const span = Math.min(WINDOW_S, Math.max(60, history.now - first)); // as lineChart
  const t0 = history.now - span;
  const ymax = Math.max(1, ...lines.flatMap(([r]) => r.y));
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "spark" });
  for (const [r, color] of lines) {
    const pts = [];
    for (let i = 0; i < r.t.length; i++) if (r.t[i] >= t0) pts.push(`${(((r.t[i] - t0) / span) * W).toFixed(1)},${(H - 1 - (r.y[i] / ymax) * (H - 2)).toFixed(1)}`);
    root.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1 }));
  }
  return root;
}

async function bufferPage(name) {
  const enc = encodeURIComponent(name);
  const [info, stats] = await Promise.all([api(`/v1/buffers/${enc}`), api(`/v1/buffers/${enc}/stats`), pollActivity()]);
  const h = history.buffers.get(name) || { t: [], write_count: [], samples_served: [], size: [] };
  const inR = rates(h.t, h.write_count), outR = rates(h.t, h.samples_served);
  const { logical, stored } = bytesOf(info);
  const rl = info.rate_limit;
  const summary = el("dl", { class: "kv" },
    el("dt", {}, "kind"), el("dd", {}, kindOf(info)),
    el("dt", {}, "size / capacity"), el("dd", { class: "size" }, `${fmt(info.size)} / ${fmt(info.spec.capacity)}`),
    el("dt", {}, "write count"), el("dd", {}, fmt(info.write_count)),
    el("dt", {}, "trajectories (open)"), el("dd", {}, `${fmt(info.trajectories)} (${fmt(info.open_trajectories)})`),
    el("dt", {}, "rows/s in, out (10 s)"), el("dd", {}, `${fmt(recentRate(h, "write_count"), 1)}, ${fmt(recentRate(h, "samples_served"), 1)}`),
    el("dt", {}, "bytes logical / stored"), el("dd", {}, `${fmtBytes(logical)} / ${fmtBytes(stored)}`),
    el("dt", {}, "durable watermark"), el("dd", {}, fmt(info.durable_seq)),
    el("dt", {}, "rate limiter"), el("dd", {}, limiterBadge(rl), rl ? ` diff ${fmt(rl.diff)}, waiting ${rl.waiting_samples} samples / ${rl.waiting_extends} extends` : ""),
    el("dt", {}, "policy versions"), el("dd", {}, info.policy_versions && info.policy_versions.newest >= 0 ? `${info.policy_versions.min}..${info.policy_versions.max} (newest ${info.policy_versions.newest})` : "-"),
    el("dt", {}, "fields"), el("dd", {}, Object.entries(info.spec.fields).map(([k, f]) => `${k} ${f.dtype}[${f.shape.join(",")}]`).join(", ")));
  const tl = stats.trajectory_lengths;
  const lenCard = el("div", { class: "card", id: "lengths" }, el("h2", {}, "Trajectory lengths (live rows)"),
    tl.trajectories ? barChart(tl.edges, tl.counts, { label: "trajectory length histogram" }) : el("p", { class: "muted" }, "no trajectories yet"),
    el("p", { class: "muted" }, `${fmt(tl.trajectories)} trajectories` + (tl.capped ? "; the last bar holds all of 4095 rows or more" : "")));
  const pr = stats.priorities;
  const prioCard = el("div", { class: "card", id: "priorities" }, el("h2", {}, "Priorities"),
    !pr ? el("p", { class: "muted" }, "this buffer has no priorities")
      : pr.sampled ? [barChart(pr.edges, pr.counts, { label: "priority histogram", fmtEdge: (v) => v.toPrecision(3) }),
        el("p", { class: "muted" }, `${pr.scale} buckets over ${pr.sampled} rows drawn at random; min ${pr.min.toPrecision(3)}, mean ${pr.mean.toPrecision(3)}, max ${pr.max.toPrecision(3)}`)]
        : el("p", { class: "muted" }, "no rows yet"));
  const streams = el("div", { class: "card", id: "streams" }, el("h2", {}, "Open trajectories per stream"),
    stats.open_trajectories_by_stream.length ? el("table", {}, el("tbody", {}, stats.open_trajectories_by_stream.map((s) =>
      el("tr", {}, el("td", { class: "stream" }, s.stream), el("td", { class: "num" }, fmt(s.open_trajectories))))))
      : el("p", { class: "muted" }, "none"),
    stats.other_streams ? el("p", { class: "muted" }, `and ${stats.other_streams.streams} more streams with ${stats.other_streams.open_trajectories} open trajectories`) : null);
  const errs = stats.errors;
  const errCard = el("div", { class: "card", id: "errors" }, el("h2", {}, "Failed requests"),
    Object.keys(errs.by_status).length ? el("p", {}, Object.entries(errs.by_status).map(([st, n]) => el("span", { class: "badge" }, `${st}: ${n}`)), " ",
      Object.entries(errs.by_code).map(([c, n]) => el("span", { class: "badge" }, `${c}: ${n}`))) : el("p", { class: "muted" }, "none since the server started"),
    errs.recent.length ? el("table", {}, el("tbody", {}, errs.recent.slice().reverse().map((e) =>
      el("tr", {}, el("td", { class: "muted" }, new Date(e.time).toLocaleTimeString()), el("td", {}, e.endpoint), el("td", {}, String(e.status)),
        el("td", { class: "message" }, e.error))))) : null);
  render(el("h1", {}, "Buffer ", el("span", { class: "name" }, name), " ",
    el("a", { href: `#/rows/${enc}`, class: "badge" }, "browse rows")),
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h2", {}, "State"), summary),
      el("div", { class: "card", id: "rates" }, el("h2", {}, "Rows per second"),
        lineChart([{ name: "in (writes)", color: "#2563eb", ...inR }, { name: "out (sampled)", color: "#d9480f", ...outR }], { now: history.now, label: "rows per second" })),
      el("div", { class: "card" }, el("h2", {}, "Live rows"), lineChart([{ name: "size", color: "#2b8a3e", t: h.t, y: h.size }], { now: history.now, label: "live rows" })),
      lenCard, prioCard, streams, errCard));
}

async function collectorsPage() {
  const [list] = await Promise.all([api("/v1/collectors"), pollActivity()]);
  const cols = list.collectors || [];
  if (!cols.length) {
    render(el("h1", {}, "Collectors"), el("p", { class: "muted" }, "This server runs no collector (rbd serve --demo runs one)."));
    return;
  }
  render(el("h1", {}, "Collectors"), cols.map((c) => {
    const h = history.collectors.get(c.name) || { t: [], frames: [], episodes: [], mean_episode_return: [], mean_episode_length: [] };
    const eps = rates(h.t, h.episodes);
    return el("div", { class: "grid", "data-collector": c.name },
      el("div", { class: "card" }, el("h2", {}, "Collector ", c.name),
        el("dl", { class: "kv" },
          el("dt", {}, "env"), el("dd", {}, `${c.env} x ${c.envs}`),
          el("dt", {}, "buffer"), el("dd", {}, el("a", { href: "#/buffer/" + encodeURIComponent(c.buffer) }, c.buffer)),
          el("dt", {}, "policy"), el("dd", {}, `${c.policy}${c.hidden ? " (hidden " + c.hidden + ")" : ""}, epsilon ${c.epsilon}`),
          el("dt", {}, "policy version"), el("dd", { class: "weights-version" }, String(c.weights_version)),
          el("dt", {}, "frames"), el("dd", { class: "frames" }, fmt(c.frames)),
          el("dt", {}, "frames/s"), el("dd", {}, fmt(c.frames_per_second, 1)),
          el("dt", {}, "episodes"), el("dd", {}, fmt(c.episodes)),
          el("dt", {}, "mean return, length (last 100)"), el("dd", {}, `${c.mean_episode_return.toFixed(2)}, ${c.mean_episode_length.toFixed(1)}`),
          el("dt", {}, "rate limiter"), el("dd", {}, c.rate_limited ? el("span", { class: "badge warn" }, "holding writes back") : el("span", { class: "badge ok" }, "open"),
            ` waited ${c.rate_limit_wait_seconds.toFixed(1)} s in all`))),
      el("div", { class: "card" }, el("h2", {}, "Episodes per second"), lineChart([{ name: "episodes/s", color: "#2563eb", ...eps }], { now: history.now, label: "episodes per second" })),
      el("div", { class: "card", id: "learning-curve" }, el("h2", {}, "Mean episode return (last 100 episodes)"),
        lineChart([{ name: "mean return", color: "#2b8a3e", t: h.t, y: h.mean_episode_return }], { now: history.now, label: "mean episode return" })));
  }));
}

// ---- row browser -----------------------------------------------------------

// imageLayout says how to draw a uint8 field of one row, or null: [H, W]
// gray, [H, W, C] with C in 1, 3, 4, or a stack [K, H, W] of gray frames.
function imageLayout(dtype, shape) {
  if (dtype !== "U8") return null;
  if (shape.length === 2 && shape[0] >= 8 && shape[1] >= 8) return { frames: 1, h: shape[0], w: shape[1], c: 1 };
  if (shape.length === 3 && [1, 3, 4].includes(shape[2]) && shape[0] >= 8 && shape[1] >= 8) return { frames: 1, h: shape[0], w: shape[1], c: shape[2] };
  if (shape.length === 3 && shape[0] <= 16 && shape[1] >= 8 && shape[2] >= 8) return { frames: shape[0], h: shape[1], w: shape[2], c: 1 };
  return null;
}

// drawFrame draws frame f of a row's image bytes onto a new canvas.
function drawFrame(bytes, lay, f, scale = 1) {
  const cv = el("canvas", { class: "frame", width: lay.w, height: lay.h, style: `width:${lay.w * scale}px;height:${lay.h * scale}px` });
  const ctx = cv.getContext("2d");
  const img = ctx.createImageData(lay.w, lay.h);
  const n = lay.w * lay.h;
  const off = f * n * lay.c;
  for (let p = 0; p < n; p++) {
    const s = off + p * lay.c;
    const d = p * 4;
    if (lay.c >= 3) { img.data[d] = bytes[s]; img.data[d + 1] = bytes[s + 1]; img.data[d + 2] = bytes[s + 2]; }
    else { img.data[d] = img.data[d + 1] = img.data[d + 2] = bytes[s]; }
    img.data[d + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  return cv;
}

function rowValues(t, i) {
  const per = t.shape.slice(1).reduce((a, b) => a * b, 1);
  const vals = Array.from(t.data.subarray(i * per, (i + 1) * per));
  const shown = vals.slice(0, 16).map((v) => (Number.isInteger(v) ? String(v) : v.toPrecision(4)));
  return (per > 1 ? "[" + shown.join(", ") + (vals.length > 16 ? `, ... ${vals.length} values]` : "]") : shown[0]);
}

const META = ["seq", "traj_id", "step", "prev_seq", "next_seq"];

async function rowsPage(name, params) {
  const enc = encodeURIComponent(name);
  const traj = params.get("traj");
  const from = params.get("from") || "-16";
  const count = traj ? 64 : 16;
  const q = traj ? `traj_id=${encodeURIComponent(traj)}&count=${count}` : `from_seq=${encodeURIComponent(from)}&count=${count}`;
  const buf = await api(`/v1/buffers/${enc}/rows?${q}`, { binary: true });
  const t = parseSafetensors(buf);
  const n = t.seq ? t.seq.shape[0] : 0;
  const fields = Object.keys(t).filter((k) => !META.includes(k)); // the answer's order: the spec's
  const images = fields.map((k) => [k, imageLayout(t[k].dtype, t[k].shape.slice(1))]).filter(([, lay]) => lay);
  const go = (hash) => { location.hash = hash; };
  const seqInput = el("input", { type: "number", placeholder: "from seq", value: traj ? "" : from, "aria-label": "from seq" });
  const trajInput = el("input", { type: "number", placeholder: "trajectory id", value: traj || "", "aria-label": "trajectory id" });
  const tools = el("div", { class: "rowtools" },
    el("a", { href: "#/buffer/" + enc }, "back to ", name),
    el("form", { onsubmit: (e) => { e.preventDefault(); go(`#/rows/${enc}?from=${seqInput.value}`); } }, seqInput, el("button", {}, "rows from seq")),
    el("form", { onsubmit: (e) => { e.preventDefault(); go(`#/rows/${enc}?traj=${trajInput.value}`); } }, trajInput, el("button", {}, "trajectory")),
    !traj && n ? el("button", { onclick: () => go(`#/rows/${enc}?from=${t.seq.data[n - 1] + 1}`) }, "next rows") : null,
    !traj && n ? el("button", { onclick: () => go(`#/rows/${enc}?from=${Math.max(0, t.seq.data[0] - count)}`) }, "previous rows") : null);
  const parts = [el("h1", {}, traj ? `Trajectory ${traj} of ` : "Rows of ", el("span", { class: "name" }, name)), tools];
  if (!n) {
    parts.push(el("p", { class: "muted" }, traj ? "This trajectory has no live rows." : "No live rows there."));
  }
  if (traj && n && images.length) {
    // The observation a step saw, rather than the one after it.
    const [k, lay] = images.find(([name]) => !name.startsWith("next.")) || images[0];
    const per = lay.frames * lay.h * lay.w * lay.c;
    const strip = el("div", { class: "filmstrip", id: "filmstrip", "data-field": k });
    for (let i = 0; i < n; i++) {
      const bytes = t[k].data.subarray(i * per, (i + 1) * per);
      strip.append(el("figure", {}, drawFrame(bytes, lay, lay.frames - 1, 1), el("figcaption", {}, "step " + t.step.data[i])));
    }
    parts.push(el("div", { class: "card" }, el("h2", {}, `${k}: the newest frame of each step`), strip));
  }
  if (n) {
    const head = el("tr", {}, ["seq", "traj", "step", "prev", "next"].map((h) => el("th", { class: "num" }, h)), fields.map((k) => el("th", {}, k)));
    const body = [];
    for (let i = 0; i < n; i++) {
      const tid = t.traj_id.data[i];
      body.push(el("tr", { "data-seq": t.seq.data[i] },
        el("td", { class: "num" }, String(t.seq.data[i])),
        el("td", { class: "num" }, el("a", { href: `#/rows/${enc}?traj=${tid}` }, String(tid))),
        el("td", { class: "num" }, String(t.step.data[i])),
        el("td", { class: "num" }, String(t.prev_seq.data[i])),
        el("td", { class: "num" }, String(t.next_seq.data[i])),
        fields.map((k) => {
          const lay = imageLayout(t[k].dtype, t[k].shape.slice(1));
          if (!lay) return el("td", { class: "values" }, rowValues(t[k], i));
          const per = lay.frames * lay.h * lay.w * lay.c;
          const bytes = t[k].data.subarray(i * per, (i + 1) * per);
          const frames = [];
          for (let f = 0; f < lay.frames; f++) frames.push(drawFrame(bytes, lay, f, 1));
          return el("td", {}, el("div", { class: "frames" }, frames));
        })));
    }
    parts.push(el("div", { class: "card" }, el("table", { id: "rows" }, el("thead", {}, head), el("tbody", {}, body))));
  }
  render(...parts);
  return false; // rows do not refresh by themselves: the user pages
}

window.addEventListener("hashchange", route);
route();
