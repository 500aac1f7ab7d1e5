// Messages to DOM. Model output is markdown rendered inert: raw HTML in it is shown as
// text, the result is sanitized by DOMPurify against a short allow-list, links open in a
// new tab and only for http(s)/mailto, and images become a button that opens them only
// when clicked (no request to a remote host by itself). Code is highlighted by
// highlight.js, which works on text.

import { Marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";
import hljs from "../vendor/highlight.min.js";
import { figures } from "./conv.js";

hljs.configure({ ignoreUnescapedHTML: true });

const escapeHtml = (s) => s.replace(/[&<>"']/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[ch]);
const SAFE_URL = /^(https?:|mailto:)/i;

const marked = new Marked({
  gfm: true,
  renderer: {
    html({ text, block }) { return block ? `<p class="raw-html">${escapeHtml(text)}</p>` : escapeHtml(text); },
    image({ href, text }) {
      const alt = escapeHtml(text || "image");
      if (!SAFE_URL.test(href || "")) return `<span class="img-blocked">[image: ${alt}]</span>`;
      let host = "";
      try { host = new URL(href).host; } catch { /* shown without a host */ }
      return `<button type="button" class="img-ph" data-src="${escapeHtml(href)}">Image “${alt}” from ${escapeHtml(host)}: open</button>`;
    },
  },
});

const PURIFY = {
  ALLOWED_TAGS: ["p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre",
    "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "span", "button"],
  ALLOWED_ATTR: ["href", "title", "class", "data-src", "type", "start", "align"],
  ALLOW_DATA_ATTR: false,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!SAFE_URL.test(href)) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
  if (node.tagName === "BUTTON" && !node.classList.contains("img-ph")) node.replaceWith(...node.childNodes);
});

export function renderMarkdown(el, text) {
  const html = DOMPurify.sanitize(marked.parse(text || ""), { ...PURIFY, ADD_ATTR: ["target", "rel"] });
  el.innerHTML = html;
  for (const code of el.querySelectorAll("pre code")) hljs.highlightElement(code);
  for (const btn of el.querySelectorAll("button.img-ph")) {
    btn.addEventListener("click", () => {
      const src = btn.dataset.src || "";
      if (SAFE_URL.test(src)) window.open(src, "_blank", "noopener,noreferrer");
    });
  }
}

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const c of children) if (c) el.append(c);
  return el;
}
export { h };

const WHO = { user: "You", assistant: "Assistant", system: "System", tool: "Tool result" };
const FINISH = { cancelled: "stopped", length: "cut at the token limit", error: "failed", trimmed: "trimmed here" };

function usageLine(m) {
  const f = figures(m);
  const bits = [`${f.tokens} tokens`];
  if (f.ttft !== null) bits.push(`TTFT ${f.ttft.toFixed(2)} s`);
  if (f.rate !== null) bits.push(`${f.rate.toFixed(1)} tok/s`);
  if (f.cached !== null && f.cached !== undefined) bits.push(`${f.cached} cached`);
  return bits.join(" · ");
}

// One message's element; `actions` is [[label, fn], ...] for its buttons.
export function messageView(m, actions) {
  const el = h("article", { class: `msg ${m.role}`, "data-role": m.role, "data-first": String(m.first),
    "aria-label": WHO[m.role] || m.role });
  el.append(h("div", { class: "who", text: WHO[m.role] || m.role }));
  if (m.role === "assistant") {
    const det = h("details", { class: "reasoning" }, h("summary", { text: "Reasoning" }), h("div", { class: "md" }));
    el.append(det, h("div", { class: "md content" }), h("div", { class: "tools" }),
      h("div", { class: "meta" }, h("span", { class: "usage" }), h("span", { class: "state" })));
  } else {
    el.append(h("div", { class: "plain content" }));
  }
  const bar = h("div", { class: "msg-actions" });
  for (const [label, fn, name] of actions) {
    bar.append(h("button", { type: "button", class: "act", "data-act": name || label.toLowerCase(), text: label,
      onclick: fn }));
  }
  el.append(bar);
  updateMessage(el, m);
  return el;
}

export function updateMessage(el, m) {
  if (m.role !== "assistant") {
    el.querySelector(".content").textContent = m.text;
    return;
  }
  renderMarkdown(el.querySelector(".content"), m.text);
  const det = el.querySelector(".reasoning");
  det.hidden = !m.reasoning;
  if (m.reasoning) det.querySelector(".md").textContent = m.reasoning;
  const tools = el.querySelector(".tools");
  tools.replaceChildren(...m.tools.map((t) => h("div", { class: "tool-card", role: "group", "aria-label": `Tool call ${t.name}` },
    h("div", { class: "tool-name", text: `⚙ ${t.name}` }), h("pre", { class: "tool-args", text: prettyArgs(t.arguments) }))));
  el.querySelector(".usage").textContent = m.tokens || m.finish ? usageLine(m) : "";
  const state = m.cut ? "cut by a restart" : (FINISH[m.finish] || (m.finish ? "" : "…"));
  el.querySelector(".state").textContent = state;
  el.dataset.finish = m.finish || (m.cut ? "cut" : "");
}

function prettyArgs(a) {
  try { return JSON.stringify(typeof a === "string" ? JSON.parse(a) : a, null, 2); } catch { return String(a); }
}
