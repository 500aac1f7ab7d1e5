// The engine view: polls GET /v1/monitor once a second (the engines' readings, the same
// the terminal monitor and /metrics read) and draws lanes, queues, KV, rates and TTFT as
// small charts over the last minutes. Rates are counter deltas between polls, as in
// `superfluid top`.

import { Offline, json } from "./api.js";
import { installKeyPrompt } from "./auth.js";
import { h } from "./render.js";
import { themeButton } from "./prefs.js";

const POLL_MS = 1000;
const KEEP_S = 300; // the charts' window
const history = new Map(); // model -> {prev: {t, counters}, points: [{t, decode, prefill, p50, p95}]}
const $ = (id) => document.getElementById(id);

function rates(mid, rec, t) {
  const hst = history.get(mid) || { prev: null, points: [] };
  history.set(mid, hst);
  let decode = 0;
  let prefill = 0;
  if (hst.prev && t > hst.prev.t) {
    const dt = (t - hst.prev.t) / 1000;
    decode = Math.max(0, rec.counters.decode_tokens - hst.prev.counters.decode_tokens) / dt;
    prefill = Math.max(0, rec.counters.prefill_tokens - hst.prev.counters.prefill_tokens) / dt;
  }
  hst.prev = { t, counters: rec.counters };
  hst.points.push({ t, decode, prefill, p50: rec.ttft.p50, p95: rec.ttft.p95 });
  while (hst.points.length && t - hst.points[0].t > KEEP_S * 1000) hst.points.shift();
  return { decode, prefill, points: hst.points };
}

const fmt = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

function fig(k, v, name) {
  return h("div", { class: "fig", "data-fig": name }, h("div", { class: "k", text: k }), h("div", { class: "v", text: v }));
}

function chart(title, series, now) {
  const canvas = h("canvas", { width: "300", height: "70", role: "img", "aria-label": title });
  const last = series.map((s) => s.values.length ? s.values[s.values.length - 1].v : null);
  const box = h("div", { class: "chart" },
    h("div", { class: "k" }, h("span", { text: title }),
      h("span", { text: series.map((s, i) => `${s.name} ${fmt(last[i], s.digits ?? 1)}`).join("  ") })), canvas);
  requestAnimationFrame(() => draw(canvas, series, now));
  return box;
}

function draw(canvas, series, now) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300;
  const hgt = canvas.clientHeight || 70;
  canvas.width = w * ratio;
  canvas.height = hgt * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  const css = getComputedStyle(document.documentElement);
  const colors = [css.getPropertyValue("--accent"), css.getPropertyValue("--warn")];
  const top = Math.max(1e-9, ...series.flatMap((s) => s.values.map((p) => p.v)));
  // the x axis grows with the history, up to the last KEEP_S seconds
  const oldest = Math.min(now, ...series.flatMap((s) => s.values.map((p) => p.t)));
  const span = Math.min(KEEP_S * 1000, Math.max(10_000, now - oldest));
  ctx.strokeStyle = css.getPropertyValue("--line");
  ctx.beginPath();
  ctx.moveTo(0, hgt - 0.5);
  ctx.lineTo(w, hgt - 0.5);
  ctx.stroke();
  series.forEach((s, i) => {
    ctx.strokeStyle = colors[i % colors.length];
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.values.forEach((p, j) => {
      const x = w - ((now - p.t) / span) * w;
      const y = hgt - 3 - (p.v / top) * (hgt - 8);
      if (j === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  });
}

function series(points, key) {
  return points.filter((p) => p[key] !== null && p[key] !== undefined).map((p) => ({ t: p.t, v: p[key] }));
}

function modelPanel(rec, t, isDefault) {
  const r = rates(rec.model, rec, t);
  const c = rec.counters;
  const kvPct = rec.kv.total ? `${Math.round((100 * rec.kv.used) / rec.kv.total)}%` : "–";
  const reuse = c.cached_tokens + c.prefill_tokens ? `${Math.round((100 * c.cached_tokens) / (c.cached_tokens + c.prefill_tokens))}%` : "–";
  const waiting = Object.entries(rec.queue).filter(([, n]) => n > 0);
  const queue = waiting.length ? waiting.map(([k, n]) => `${k} ${n}`).join(" · ") : "empty";
  const st = rec.status || {};
  const panel = h("section", { class: "panel", "data-model": rec.model, "aria-label": `Model ${rec.model}` },
    h("h2", {}, h("span", { text: rec.model }),
      h("span", { class: `sub ${st.ready ? "up" : "down"}`, text: st.ready ? "ready" : "not ready" }),
      h("span", { class: "sub", text: `${isDefault ? "default · " : ""}worker pid ${st.worker_pid ?? "–"}` })),
    h("div", { class: "figs" },
      fig("lanes busy", `${rec.lanes.length} / ${rec.max_lanes}`, "lanes"),
      fig("KV", `${rec.kv.used} / ${rec.kv.total} (${kvPct})`, "kv"),
      fig("queue", queue, "queue"),
      fig("decode tok/s", fmt(r.decode), "decode"),
      fig("prefill tok/s", fmt(r.prefill), "prefill"),
      fig("TTFT p50 / p95", `${fmt(rec.ttft.p50, 2)} / ${fmt(rec.ttft.p95, 2)} s`, "ttft"),
      fig("prefix reuse", `${reuse} (${c.cached_tokens} tok)`, "reuse"),
      fig("preemptions", String(c.preemptions), "preemptions"),
      fig("worker restarts", String(rec.respawns), "respawns"),
      fig("steps", String(rec.steps), "steps")),
    h("div", { class: "charts" },
      chart("decode tok/s", [{ name: "now", values: series(r.points, "decode") }], t),
      chart("prefill tok/s", [{ name: "now", values: series(r.points, "prefill") }], t),
      chart("TTFT s", [{ name: "p50", values: series(r.points, "p50"), digits: 2 },
        { name: "p95", values: series(r.points, "p95"), digits: 2 }], t)),
    lanesTable(rec.lanes));
  if (Array.isArray(st.nodes)) panel.append(nodesView(st.nodes));
  if (rec.stages && rec.stages.length) {
    panel.append(h("h3", { text: "Pipeline stages" }),
      h("ol", { class: "stages" }, ...rec.stages.map((s) => h("li", { text: s }))));
  }
  return panel;
}

function lanesTable(lanes) {
  const t = h("table", { class: "lanes", "aria-label": "Lanes" },
    h("thead", {}, h("tr", {}, ...["lane", "class", "phase", "prompt", "generated", "cached"].map((k) => h("th", { scope: "col", text: k })))));
  const body = h("tbody");
  for (const l of lanes) {
    body.append(h("tr", { "data-lane": String(l.lane) },
      ...[l.lane, l.class, l.phase, l.prompt, l.generated, l.cached].map((v) => h("td", { text: String(v) }))));
  }
  if (!lanes.length) body.append(h("tr", { class: "idle" }, h("td", { colspan: "6", text: "idle" })));
  t.append(body);
  return t;
}

function nodesView(nodes) {
  return h("div", {}, h("h3", { text: "Fleet nodes" }), h("div", { class: "nodes" }, ...nodes.map((n) => {
    const s = n.status || {};
    const kv = s.kv_total ? `${s.kv_used} / ${s.kv_total} (${Math.round((100 * s.kv_used) / s.kv_total)}%)` : "–";
    return h("div", { class: "fig", "data-node": n.name || n.addr },
      h("div", { class: "k" }, h("span", { text: `${n.name || ""} ${n.addr || ""} ` }),
        h("span", { class: n.up ? "up" : "down", text: n.up ? "up" : "down" })),
      h("div", { text: `lanes ${s.running ?? "–"} / ${s.lanes ?? "–"} · waiting ${s.waiting ?? "–"}` }),
      h("div", { text: `KV ${kv} · placed here ${n.placed ?? 0}` }),
      h("div", { class: "k", text: (n.models || []).join(", ") }));
  })));
}

async function poll() {
  try {
    const r = await json("/v1/monitor");
    const t = Date.now();
    $("models").replaceChildren(...r.models.map((rec) => modelPanel(rec, t, rec.model === r.default)));
    const log = $("log");
    const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 20;
    log.textContent = r.log.join("\n") || "(no log lines yet)";
    if (atEnd) log.scrollTop = log.scrollHeight;
    $("conn").textContent = "";
    document.body.dataset.ready = "1";
  } catch (e) {
    $("conn").textContent = e instanceof Offline ? "reconnecting…" : e.message;
  }
  setTimeout(poll, POLL_MS);
}

installKeyPrompt();
themeButton($("theme"));
poll();
