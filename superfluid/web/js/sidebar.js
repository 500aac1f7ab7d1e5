// The conversation list: sessions from the log, newest first, filtered by title; rename,
// archive and delete in place (no browser dialogs: a second click confirms a delete).

import { json } from "./api.js";
import { h } from "./render.js";

export class Sidebar {
  constructor({ onOpen, onChanged, onError }) {
    this.list = document.getElementById("sessions");
    this.search = document.getElementById("search");
    this.archived = document.getElementById("show-archived");
    this.onOpen = onOpen;
    this.onChanged = onChanged;
    this.onError = onError;
    this.rows = [];
    this.current = null;
    this.search.addEventListener("input", () => this.draw());
    this.archived.addEventListener("change", () => this.refresh());
  }

  async refresh() {
    try {
      const r = await json(`/v1/sessions?limit=500&archived=${this.archived.checked}`);
      this.rows = r.data;
    } catch (e) {
      this.onError(e);
      return;
    }
    this.draw();
  }

  setCurrent(sid) {
    this.current = sid;
    for (const li of this.list.children) {
      if (li.dataset.sid === sid) li.setAttribute("aria-current", "true");
      else li.removeAttribute("aria-current");
    }
  }

  draw() {
    const q = this.search.value.trim().toLowerCase();
    const rows = this.rows.filter((r) => !q || (r.title || "").toLowerCase().includes(q));
    this.list.replaceChildren(...rows.map((r) => this.item(r)));
    if (!rows.length) this.list.append(h("li", { class: "empty", text: q ? "No title matches." : "No conversations yet." }));
  }

  item(r) {
    const label = r.title || `Untitled (${r.api || "session"})`;
    const when = new Date(r.updated * 1000).toLocaleString();
    const open = h("button", { type: "button", class: "open", title: `${label}\n${when}`,
      onclick: () => this.onOpen(r.id) },
    h("span", { class: "t", text: label }), h("span", { class: "d", text: (r.parent ? "fork · " : "") + when }));
    const li = h("li", { "data-sid": r.id }, open,
      h("button", { type: "button", class: "icon", "data-act": "rename", "aria-label": `Rename ${label}`, text: "✎",
        onclick: () => this.rename(li, r) }),
      h("button", { type: "button", class: "icon", "data-act": "archive",
        "aria-label": `${r.archived ? "Unarchive" : "Archive"} ${label}`, text: r.archived ? "⇡" : "⇣",
        onclick: () => this.patch(r.id, { archived: !r.archived }) }),
      h("button", { type: "button", class: "icon danger", "data-act": "delete", "aria-label": `Delete ${label}`,
        text: "✕", onclick: (e) => this.remove(e.currentTarget, r) }));
    if (r.id === this.current) li.setAttribute("aria-current", "true");
    return li;
  }

  rename(li, r) {
    const input = h("input", { type: "text", class: "rename", "aria-label": "New title" });
    input.value = r.title || "";
    let finished = false;
    const done = async (save) => {
      if (finished) return;
      finished = true;
      input.replaceWith(li.querySelector(".open") || input);
      if (save && input.value.trim() && input.value.trim() !== r.title) await this.patch(r.id, { title: input.value.trim() });
      else this.draw();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") { e.preventDefault(); done(true); }
      if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); done(false); }
    });
    input.addEventListener("blur", () => done(true), { once: true });
    li.querySelector(".open").replaceWith(input);
    input.focus();
    input.select();
  }

  async patch(sid, body) {
    try {
      await json(`/v1/sessions/${sid}`, { method: "PATCH", body });
    } catch (e) {
      this.onError(e);
    }
    await this.refresh();
    this.onChanged(sid);
  }

  async remove(btn, r) {
    if (btn.dataset.armed !== "1") {
      btn.dataset.armed = "1";
      btn.textContent = "Delete?";
      setTimeout(() => { if (btn.isConnected) { btn.dataset.armed = ""; btn.textContent = "✕"; } }, 4000);
      return;
    }
    try {
      await json(`/v1/sessions/${r.id}`, { method: "DELETE" });
    } catch (e) {
      this.onError(e);
    }
    await this.refresh();
    this.onChanged(r.id, true);
  }
}
