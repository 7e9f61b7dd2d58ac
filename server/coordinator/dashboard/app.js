// pstrain's dashboard: polls the coordinator's JSON API once a second and
// draws the job list or one job's page. No libraries; every element is
// built with the DOM (text content only, never HTML from the server).
"use strict";

const POLL_MS = 1000;
const STUCK_S = 5;  // a rank waiting this long on something is flagged

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "-";
  if (typeof x !== "number") return String(x);
  if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(2) + "M";
  if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(1) + "k";
  return x.toFixed(digits === undefined ? 2 : digits);
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

async function api(path, options) {
  const headers = Object.assign({}, (options || {}).headers);
  const token = sessionStorage.getItem("pstrain-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const resp = await fetch(path, Object.assign({}, options, { headers, cache: "no-store" }));
  if (resp.status === 401) {
    askToken();
    throw new Error("a token is needed");
  }
  const body = await resp.json();
  if (!resp.ok) throw Object.assign(new Error(body.error || resp.statusText), { status: resp.status });
  return body;
}

function askToken() {
  const form = document.getElementById("token-form");
  if (!form.hidden) return;
  form.hidden = false;
  form.onsubmit = (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("pstrain-token", document.getElementById("token").value.trim());
    form.hidden = true;
  };
}

function stateBadge(state) {
  return el("span", { class: "state " + state }, state.toLowerCase());
}

function bar(step, steps) {
  const pct = steps > 0 ? Math.min(100, (100 * step) / steps) : 0;
  const inner = el("div");
  inner.style.width = pct.toFixed(1) + "%";
  return el("div", { class: "bar", title: pct.toFixed(1) + "%" }, inner);
}

// A line chart of [step, wall, value] points: axes, four ticks, the line.
function chart(title, name, points, digits) {
  const W = 420, H = 200, L = 56, R = 10, T = 26, B = 26;
  const s = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, "data-series": name,
                         "data-points": points.length, role: "img", "aria-label": title });
  const label = svg("text", { x: L, y: 16, class: "title" });
  const last = points.length ? points[points.length - 1][2] : null;
  label.textContent = title + (last === null ? "" : "  " + fmt(last, digits));
  s.append(label);
  s.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  s.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  if (points.length === 0) {
    const t = svg("text", { x: L + 10, y: H / 2 });
    t.textContent = "no points yet";
    s.append(t);
    return s;
  }
  let x0 = points[0][0], x1 = points[points.length - 1][0];
  let y0 = Math.min(...points.map((p) => p[2])), y1 = Math.max(...points.map((p) => p[2]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 3; i++) {
    const y = y0 + ((y1 - y0) * i) / 3;
    s.append(svg("line", { class: "axis", x1: L, y1: py(y), x2: W - R, y2: py(y), "stroke-dasharray": "2 3" }));
    const t = svg("text", { x: 2, y: py(y) + 3 });
    t.textContent = fmt(y, digits);
    s.append(t);
  }
  const xl = svg("text", { x: W - R, y: H - 6, "text-anchor": "end" });
  xl.textContent = "step " + x1;
  s.append(xl);
  s.append(svg("polyline", { points: points.map((p) => `${px(p[0]).toFixed(1)},${py(p[2]).toFixed(1)}`).join(" ") }));
  if (points.length === 1) s.append(svg("circle", { cx: px(points[0][0]), cy: py(points[0][2]), r: 3 }));
  return s;
}

// `narrow`: indexes of columns hidden on a phone (their cells carry the
// class too).
function table(headers, rows, narrow) {
  const th = (h, i) => el("th", (narrow || []).includes(i) ? { class: "hide-narrow" } : {}, h);
  return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map(th))), el("tbody", {}, ...rows));
}

function renderList(data) {
  document.getElementById("crumb").textContent = "jobs";
  const rows = data.jobs.slice().reverse().map((j) =>
    el("tr", { class: "job", "data-job": j.job_id },
       el("td", {}, el("a", { href: "/jobs/" + encodeURIComponent(j.job_id) }, j.job_id)),
       el("td", {}, j.name),
       el("td", {}, stateBadge(j.state)),
       el("td", {}, bar(j.step, j.steps)),
       el("td", { class: "num hide-narrow" }, `${j.step}/${j.steps}`),
       el("td", { class: "num hide-narrow" }, duration(j.eta_s)),
       el("td", { class: "num hide-narrow" }, fmt(j.loss, 4)),
       el("td", { class: "num" }, j.accuracy === null ? "-" : fmt(j.accuracy, 4))));
  return el("div", { class: "card" }, el("h2", {}, "Jobs"),
            rows.length ? table(["job", "name", "state", "progress", "step", "ETA", "loss", "accuracy"], rows, [4, 5, 6])
                        : el("p", { class: "muted" }, "No jobs yet: submit one with `pstrain submit`."));
}

async function act(id, what, button) {
  if (what === "cancel" && !confirm("Cancel " + id + "?")) return;
  button.disabled = true;
  const msg = document.getElementById("action-message");
  try {
    const r = await api(`/api/jobs/${encodeURIComponent(id)}/${what}`,
                        { method: "POST", headers: { "X-Pstrain-Request": "1" } });
    msg.textContent = what === "checkpoint" ? `checkpoint at step ${r.step}: ${r.path}` : `job ${r.state.toLowerCase()}`;
  } catch (e) {
    msg.textContent = what + " failed: " + e.message;
  } finally {
    button.disabled = false;
  }
}

function renderJob(j) {
  document.getElementById("crumb").textContent = j.job_id;
  const running = j.state === "RUNNING" || j.state === "CHECKPOINTING";
  const ckpt = el("button", { id: "checkpoint" }, "Checkpoint");
  const cancel = el("button", { id: "cancel", class: "danger" }, "Cancel");
  ckpt.disabled = cancel.disabled = !running;
  ckpt.onclick = () => act(j.job_id, "checkpoint", ckpt);
  cancel.onclick = () => act(j.job_id, "cancel", cancel);
  const kv = (v, k) => el("div", { class: "kv" }, el("b", {}, v), el("span", {}, k));
  const head = el("div", { class: "card head" },
    el("h1", {}, j.name), stateBadge(j.state),
    kv(`${j.step}/${j.steps}`, "step"), kv(duration(j.eta_s), "ETA"), kv(fmt(j.loss, 4), "loss"),
    kv(fmt(j.samples_per_s, 0), "samples/s"), kv(j.accuracy === null ? "-" : fmt(j.accuracy, 4), "accuracy"),
    kv(`${j.active_workers || j.num_workers}/${j.num_workers}`, "workers"),
    el("div", { class: "actions" }, ckpt, cancel));
  const charts = el("div", { class: "card" }, el("h2", {}, "Training"),
    el("div", { class: "charts" },
       chart("loss", "loss", j.curves.loss, 4),
       chart("samples/s (all ranks)", "samples_per_s", j.curves.samples_per_s, 0),
       // A click model (dlrm) is judged by its AUC; the others by accuracy.
       j.curves.auc && j.curves.auc.length ? chart("test AUC", "auc", j.curves.auc, 4)
                                           : chart("test accuracy", "accuracy", j.curves.accuracy, 4)));
  // A pipelined job's ranks: their stage, and the share of their step spent
  // waiting for the neighbouring stages (the bubble).
  const staged = j.ranks.some((r) => r.stage !== undefined);
  const ranks = j.ranks.map((r) => {
    const stuck = r.waits && r.for_s >= STUCK_S;
    const stage = staged ? [el("td", {}, r.stage === undefined ? "-" : `${r.stage}/${r.stages}`),
                            el("td", { class: "num" }, r.bubble === undefined ? "-" : fmt(100 * r.bubble, 0) + "%")] : [];
    return el("tr", { class: "rank" + (stuck ? " stuck" : ""), "data-rank": r.rank },
      el("td", {}, r.rank), ...stage, el("td", { class: "hide-narrow" }, r.member || "-"),
      el("td", { class: "num hide-narrow" }, r.epoch), el("td", { class: "num" }, `${r.step}/${r.steps}`),
      el("td", { class: "num" }, fmt(r.loss, 4)), el("td", { class: "num" }, fmt(r.samples_per_s, 0)),
      el("td", { class: "doing" }, r.doing || "-"),
      el("td", { class: "num" }, r.for_s === undefined ? "-" : r.for_s.toFixed(1) + "s"),
      el("td", { class: r.alive === false ? "lost" : "alive" }, r.alive === false ? "lost" : "alive"));
  });
  const shards = j.shards.map((s) => el("tr", { class: "shard" },
    el("td", {}, s.index), el("td", { class: "hide-narrow" }, s.member), el("td", {}, s.address),
    el("td", { class: s.alive && !s.hung ? "alive" : "lost" }, s.hung ? "hung" : s.alive ? "alive" : "lost"),
    el("td", { class: "num" }, s.call_ms === undefined ? "-" : s.call_ms.toFixed(2) + " ms"),
    el("td", { class: "num" }, s.bytes_per_s === undefined ? "-" : fmt(s.bytes_per_s / 1e6, 1) + " MB/s")));
  const conditions = j.conditions.slice().reverse().map((c) => el("tr", { class: "condition" },
    el("td", { class: "num" }, new Date(c.time_unix_ms).toLocaleTimeString()), el("td", {}, c.state.toLowerCase()),
    el("td", {}, c.reason), el("td", {}, c.message)));
  return el("div", {}, head, charts,
    el("div", { class: "card" }, el("h2", {}, "Ranks"),
       ranks.length ? table(["rank", ...(staged ? ["stage", "bubble"] : []), "member", "epoch", "step", "loss", "samples/s",
                             "now", "for", "health"], ranks, staged ? [3, 4] : [1, 2])
                    : el("p", { class: "muted" }, j.pending_reason || "No progress yet.")),
    shards.length ? el("div", { class: "card" }, el("h2", {}, "Shards (latency as rank 0 sees it)"),
                       table(["shard", "member", "address", "health", "call", "throughput"], shards, [1])) : null,
    el("div", { class: "card" }, el("h2", {}, "Conditions"), table(["time", "state", "reason", "message"], conditions)));
}

async function tick() {
  const main = document.getElementById("main");
  const m = location.pathname.match(/^\/jobs\/([^/]+)$/);
  try {
    const view = m ? renderJob(await api("/api/jobs/" + m[1])) : renderList(await api("/api/jobs"));
    main.replaceChildren(view);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.status === 404) main.replaceChildren(el("h1", { id: "not-found" }, "Not found"), el("p", {}, e.message));
    else document.getElementById("updated").textContent = "not updated: " + e.message;
  }
}

tick();
setInterval(tick, POLL_MS);
