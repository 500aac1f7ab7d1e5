// The API key prompt: shown when the daemon answers 401 (it was started with --api-key).
// The key goes to sessionStorage (gone when the tab closes) and is sent as a header.

import { onKeyNeeded } from "./api.js";

export function installKeyPrompt() {
  const dlg = document.getElementById("key-dialog");
  const form = dlg.querySelector("form");
  const input = dlg.querySelector("input");
  const note = dlg.querySelector(".key-note");
  let pending = null;
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    dlg.close();
    const key = input.value.trim();
    input.value = "";
    if (pending) pending.forEach((resolve) => resolve(key));
    pending = null;
  });
  dlg.addEventListener("cancel", () => {
    if (pending) pending.forEach((resolve) => resolve(""));
    pending = null;
  });
  onKeyNeeded((why) => new Promise((resolve) => {
    if (pending) { pending.push(resolve); return; } // several requests wait for one answer
    pending = [resolve];
    note.textContent = why || "This server needs an API key.";
    dlg.showModal();
    input.focus();
  }));
}
