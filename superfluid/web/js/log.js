// Reading a session's log, and exporting a conversation (JSON: the log's events as the
// daemon keeps them; Markdown: the conversation as shown).

import { json } from "./api.js";
import { toMarkdown } from "./conv.js";

export async function allEvents(sid, after = -1) {
  const out = [];
  for (;;) {
    const r = await json(`/v1/sessions/${sid}/events?after=${after}&limit=10000`);
    out.push(...r.data);
    if (r.data.length < 10000) return out;
    after = r.next;
  }
}

function download(name, type, text) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], { type }));
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

export async function exportConversation(conv, kind) {
  const name = (conv.title || conv.sid).replace(/[^\w.-]+/g, "_").slice(0, 60) || "conversation";
  if (kind === "json") {
    const [session, evs] = await Promise.all([json(`/v1/sessions/${conv.sid}`), allEvents(conv.sid)]);
    download(`${name}.json`, "application/json", JSON.stringify({ session, events: evs }, null, 2));
  } else {
    download(`${name}.md`, "text/markdown", toMarkdown(conv));
  }
}
