// The chat page. Every conversation is a session in the daemon's log: the page creates
// sessions, appends messages and streams generations through the native session API, and
// reads conversations back from the log. A stream that breaks (reload, network, daemon
// restart) is picked up from the log cursor with Last-Event-ID; a generation a restart cut
// off is continued with the rest of its token budget.

import { ApiError, Offline, cursorOf, events, json, request } from "./api.js";
import { installKeyPrompt } from "./auth.js";
import { apply, fold } from "./conv.js";
import { allEvents, exportConversation } from "./log.js";
import { messageView, updateMessage } from "./render.js";
import { Sidebar } from "./sidebar.js";
import * as prefs from "./prefs.js";

const $ = (id) => document.getElementById(id);
const ui = { messages: $("messages"), input: $("input"), send: $("send"), stop: $("stop"), title: $("title"),
  conn: $("conn"), notice: $("notice") };
const SETTINGS = ["model", "system", "temperature", "top_p", "max_tokens", "seed"];
let conv = null; // the open conversation (null: a new chat)
let views = []; // one element per conv.messages entry
let gen = null; // the running generation this page drives: {sid, budget, ctrl}
let drawQueued = false;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const sidebar = new Sidebar({
  onOpen: (sid) => { closeSide(); openSession(sid); },
  onChanged: (sid, deleted) => {
    if (conv && conv.sid === sid) deleted ? newChat() : refreshTitle();
  },
  onError: showError,
});

function showError(e) {
  if (e instanceof Offline) { status("offline: waiting for the server…"); return; }
  ui.notice.textContent = e.message || String(e);
  ui.notice.hidden = false;
  clearTimeout(showError.t);
  showError.t = setTimeout(() => { ui.notice.hidden = true; }, 8000);
}

function status(text) {
  ui.conn.textContent = text;
  ui.conn.dataset.state = text ? "reconnecting" : "";
}

function settings() {
  const p = prefs.load();
  for (const k of SETTINGS) if ($(k).value !== "" || k === "seed" || k === "system") p[k] = $(k).value;
  prefs.save(p);
  return p;
}

function sampling(p) {
  const out = { temperature: Number(p.temperature), top_p: Number(p.top_p) };
  if (p.seed !== "" && p.seed !== null) out.seed = Number(p.seed);
  return out;
}

// -- drawing ---------------------------------------------------------------------------
function actionsFor(m, i) {
  const acts = [["Fork", () => fork(m.last), "fork"]];
  if (m.role === "user") acts.unshift(["Edit", () => editFrom(m), "edit"]);
  if (m.role === "assistant") {
    acts.push(["Regenerate", () => regenerate(m), "regenerate"], ["Trim after", () => trimTo(m.last), "trim"]);
    if (i === conv.messages.length - 1 && (m.cut || m.finish === "cancelled" || m.finish === "length")) {
      acts.push(["Continue", () => continueTurn(), "continue"]);
    }
  }
  return acts;
}

function drawAll() {
  const atEnd = nearEnd();
  views = conv ? conv.messages.map((m, i) => messageView(m, actionsFor(m, i))) : [];
  ui.messages.replaceChildren(...views);
  if (!views.length) ui.messages.append(emptyState());
  if (atEnd) ui.messages.scrollTop = ui.messages.scrollHeight;
}

function emptyState() {
  const d = document.createElement("p");
  d.className = "empty-state";
  d.textContent = "Ask anything. Conversations are kept in the server's session log.";
  return d;
}

function nearEnd() {
  const el = ui.messages;
  return el.scrollHeight - el.scrollTop - el.clientHeight < 80;
}

function queueDraw() {
  if (drawQueued) return;
  drawQueued = true;
  requestAnimationFrame(() => {
    drawQueued = false;
    if (!conv) return;
    if (views.length !== conv.messages.length || views.some((v, i) => v.dataset.first !== String(conv.messages[i].first))) {
      drawAll();
      return;
    }
    const atEnd = nearEnd();
    const last = conv.messages.length - 1;
    if (last >= 0) updateMessage(views[last], conv.messages[last]);
    if (atEnd) ui.messages.scrollTop = ui.messages.scrollHeight;
  });
}

function setGenerating(on) {
  ui.stop.hidden = !on;
  ui.send.disabled = on;
  document.body.dataset.generating = on ? "1" : "";
}

function refreshTitle() {
  ui.title.textContent = conv ? conv.title || "Untitled" : "New chat";
  document.title = conv && conv.title ? `${conv.title} · superfluid` : "superfluid";
  if (conv) json(`/v1/sessions/${conv.sid}`).then((s) => {
    if (conv && conv.sid === s.id) { conv.title = s.title; ui.title.textContent = s.title || "Untitled"; }
  }).catch(() => {});
}

// -- reading the log -------------------------------------------------------------------
async function openSession(sid, { follow = true } = {}) {
  if (gen && gen.sid !== sid) gen.ctrl.abort();
  let summary;
  let evs;
  try {
    [summary, evs] = await Promise.all([json(`/v1/sessions/${sid}`), allEvents(sid)]);
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) { newChat(); showError(new Error("That conversation is gone.")); return; }
    showError(e);
    return;
  }
  // usage (cached tokens) comes only with a live stream: keep it, keyed by the answer's last event
  const usage = new Map((conv && conv.sid === sid ? conv.messages : []).map((m) => [m.last, m.usage]));
  conv = fold(sid, evs);
  conv.title = summary.title;
  for (const m of conv.messages) if (!m.usage && usage.get(m.last)) m.usage = usage.get(m.last);
  if (location.hash !== `#s=${sid}`) history.replaceState(null, "", `#s=${sid}`);
  sidebar.setCurrent(sid);
  refreshTitle();
  drawAll();
  if (follow && !gen) {
    const budget = Number(prefs.load().max_tokens);
    const m = conv.messages[conv.messages.length - 1];
    if (summary.busy) drive(sid, resumeFrom(sid, budget), budget);
    else if (m && m.role === "assistant" && m.finish === "dropped" && budget - m.tokens > 0) {
      drive(sid, resumeFrom(sid, budget), budget); // reloaded mid-answer: it goes on
    }
  }
}

function newChat() {
  if (gen) gen.ctrl.abort();
  conv = null;
  history.replaceState(null, "", location.pathname);
  sidebar.setCurrent(null);
  refreshTitle();
  drawAll();
  ui.input.focus();
}

// -- generating ------------------------------------------------------------------------
// the rest of a generation after the page's cursor; one whose stream was lost (cut,
// "dropped") goes on to the turn's `budget` of tokens in all
const resumeFrom = (sid, budget) => (signal) => request(`/v1/sessions/${sid}/resume${budget ? `?budget=${budget}` : ""}`,
  { extraHeaders: { "last-event-id": `${sid}:${conv.cursor}` }, signal });
const generateOn = (sid, maxTokens) => (signal) => request(`/v1/sessions/${sid}/generate`,
  { method: "POST", body: { stream: true, max_tokens: maxTokens, ...sampling(prefs.load()) }, signal });

// Read one stream into the conversation: "done", "cut" (a restart interrupted it),
// "behind" or "broken" (it ended without [DONE]).
async function consume(res, g) {
  for await (const { id, data } of events(res)) {
    if (data === "[DONE]") return "done";
    if (data.type === "interrupted") return "cut";
    if (data.type === "behind") return "behind";
    if (data.type === "error") { showError(new Error(data.error ? data.error.message : data.message)); continue; }
    if (!conv || conv.sid !== g.sid) continue;
    if (data.id === undefined || data.id === null) data.id = cursorOf(id);
    if (apply(conv, data)) queueDraw();
  }
  return "broken";
}

// Drive a generation to its end, across broken streams and restarts.
async function drive(sid, first, budget) {
  const g = { sid, budget, ctrl: new AbortController() };
  gen = g;
  setGenerating(true);
  let next = first;
  try {
    while (next) {
      let outcome;
      try {
        outcome = await consume(await next(g.ctrl.signal), g);
      } catch (e) {
        if (e.name === "AbortError" || g.ctrl.signal.aborted) return;
        if (!(e instanceof Offline)) { showError(e); return; }
        outcome = "broken";
      }
      next = outcome === "done" ? null : await recover(g);
    }
  } finally {
    if (gen === g) {
      gen = null;
      status("");
      if (conv && conv.sid === sid) await settle(sid);
      setGenerating(false);
      document.body.dataset.done = String(Number(document.body.dataset.done || 0) + 1);
      sidebar.refresh();
    }
  }
}

// After a generation: read the conversation back from the log (timestamps, channels, tool
// calls) and check that what was streamed is what the log holds.
async function settle(sid) {
  const last = conv.messages[conv.messages.length - 1];
  const streamed = last && last.role === "assistant" ? last.text : null;
  await openSession(sid, { follow: false });
  const now = conv && conv.sid === sid ? conv.messages[conv.messages.length - 1] : null;
  if (streamed !== null && now && now.text !== streamed) {
    document.body.dataset.mismatch = "1";
    console.warn("the streamed answer differs from the session log; showing the log");
  }
}

// Where does the generation stand? Waits quietly for the daemon while it is away. Returns
// the next stream to read, or null when the generation is over.
async function recover(g) {
  for (let delay = 200; ; delay = Math.min(delay * 2, 2000)) {
    if (g.ctrl.signal.aborted) return null;
    try {
      const s = await json(`/v1/sessions/${g.sid}`, { signal: g.ctrl.signal });
      for (const ev of await allEvents(g.sid, conv.cursor)) apply(conv, ev);
      queueDraw();
      status("");
      const m = conv.messages[conv.messages.length - 1];
      if (s.busy) return resumeFrom(g.sid, g.budget);
      // cut by a restart or by the lost connection: the daemon continues it from the log
      if (m && m.role === "assistant" && m.cut && g.budget - m.tokens > 0) return resumeFrom(g.sid, g.budget);
      return null;
    } catch (e) {
      if (e.name === "AbortError") return null;
      if (!(e instanceof Offline) && !(e instanceof ApiError && e.status >= 500)) { showError(e); return null; }
    }
    status("reconnecting…");
    await sleep(delay); // back-off between attempts to reach the daemon
  }
}

async function send(text) {
  if (gen || !text.trim()) return;
  const p = settings();
  ui.input.value = "";
  try {
    if (!conv) {
      const body = { model: p.model || undefined, title: text.trim().split("\n")[0].slice(0, 60), ...sampling(p) };
      if (p.system.trim()) body.system = p.system;
      const s = await json("/v1/sessions", { method: "POST", body });
      conv = fold(s.id, []);
      await openSession(s.id, { follow: false });
    }
    const sid = conv.sid;
    const r = await json(`/v1/sessions/${sid}/messages`, { method: "POST", body: { role: "user", content: text } });
    for (const ev of r.data) apply(conv, ev);
    drawAll();
    sidebar.refresh();
    await drive(sid, generateOn(sid, Number(p.max_tokens)), Number(p.max_tokens));
  } catch (e) {
    if (!conv || !conv.messages.length) ui.input.value = text;
    showError(e);
  }
}

async function stop() {
  if (!gen) return;
  try {
    await json(`/v1/sessions/${gen.sid}/cancel`, { method: "POST" });
  } catch (e) {
    showError(e);
  }
}

async function continueTurn() {
  if (gen || !conv) return;
  const budget = Number(settings().max_tokens);
  await drive(conv.sid, generateOn(conv.sid, budget), budget);
}

// -- forks, trims, export ----------------------------------------------------------------
async function forkAt(at) {
  const parent = conv;
  const f = await json(`/v1/sessions/${parent.sid}/fork`, { method: "POST", body: { at } });
  await json(`/v1/sessions/${f.id}`, { method: "PATCH", body: { title: `${parent.title || "Untitled"} (fork)` } });
  await openSession(f.id, { follow: false });
  sidebar.refresh();
  return f.id;
}

async function fork(at) {
  try { await forkAt(at); } catch (e) { showError(e); }
}

async function editFrom(m) {
  try {
    await forkAt(m.first - 1);
    ui.input.value = m.text;
    ui.input.focus();
  } catch (e) {
    showError(e);
  }
}

async function regenerate(m) {
  try {
    const sid = await forkAt(m.first - 1);
    const budget = Number(settings().max_tokens);
    await drive(sid, generateOn(sid, budget), budget);
  } catch (e) {
    showError(e);
  }
}

async function trimTo(to) {
  try {
    await json(`/v1/sessions/${conv.sid}/trim`, { method: "POST", body: { to } });
    await openSession(conv.sid, { follow: false });
  } catch (e) {
    showError(e);
  }
}

// -- wiring ------------------------------------------------------------------------------
async function loadModels() {
  const sel = $("model");
  try {
    const r = await json("/v1/models");
    sel.replaceChildren(...r.data.map((m) => {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = `${m.id}${m.meta && m.meta.loaded ? "" : " (not loaded)"}${m.meta && m.meta.default ? " · default" : ""}`;
      return o;
    }));
    const want = prefs.load().model;
    if (want && r.data.some((m) => m.id === want)) sel.value = want;
  } catch (e) {
    showError(e);
  }
}

function closeSide() { document.body.classList.remove("side-open"); }

function wire() {
  installKeyPrompt();
  prefs.themeButton($("theme"));
  const p = prefs.load();
  for (const k of SETTINGS) $(k).value = p[k] ?? "";
  for (const k of SETTINGS) $(k).addEventListener("change", settings);
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(ui.input.value); });
  ui.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(ui.input.value); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && gen) { e.preventDefault(); stop(); } });
  ui.stop.addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => { closeSide(); newChat(); });
  $("export-json").addEventListener("click", () => conv && exportConversation(conv, "json").catch(showError));
  $("export-md").addEventListener("click", () => conv && exportConversation(conv, "md").catch(showError));
  $("settings-btn").addEventListener("click", (e) => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    e.currentTarget.setAttribute("aria-expanded", String(open));
  });
  $("open-side").addEventListener("click", () => document.body.classList.add("side-open"));
  $("close-side").addEventListener("click", closeSide);
  window.addEventListener("hashchange", () => {
    const m = location.hash.match(/^#s=([\w-]+)$/);
    if (m && (!conv || conv.sid !== m[1])) openSession(m[1]);
  });
}

async function main() {
  wire();
  drawAll();
  await loadModels();
  sidebar.refresh();
  const m = location.hash.match(/^#s=([\w-]+)$/);
  if (m) await openSession(m[1]);
  document.body.dataset.ready = "1";
  // installable, and opens when the daemon is down (sw.js); not where a browser refuses workers
  navigator.serviceWorker?.register("/sw.js").catch(() => {});
}

main();
