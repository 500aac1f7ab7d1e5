// A conversation as the session log has it: events folded into messages. The same fold
// takes the log (GET events), a live generation stream and a resumed stream, and skips
// any event it already has (by its log id), so nothing is shown twice.

export function newConversation(sid) {
  return { sid, cursor: -1, messages: [], title: null, archived: false, params: {}, parent: null, forkAt: null };
}

function lastAssistant(c) {
  const m = c.messages[c.messages.length - 1];
  return m && m.role === "assistant" ? m : null;
}

function openTurn(c, ev) {
  const m = {
    role: "assistant", parts: [], tools: [], first: ev.id, last: ev.id, tokens: 0, finish: null, cut: false,
    tPrompt: ev.ts ?? null, tFirst: null, tLast: null, usage: null, text: "", reasoning: "",
  };
  c.messages.push(m);
  return m;
}

function retext(m) {
  m.text = m.parts.filter((p) => p.channel !== "reasoning" && p.channel !== "tool_call").map((p) => p.text).join("");
  m.reasoning = m.parts.filter((p) => p.channel === "reasoning").map((p) => p.text).join("");
}

// Apply one event (log JSON, or a live `generated` event) to the conversation. Returns
// true when it changed anything.
export function apply(c, ev) {
  if (ev.id !== undefined && ev.id !== null) {
    if (ev.id <= c.cursor) return false;
    c.cursor = ev.id;
  }
  switch (ev.type) {
    case "created":
      if (ev.parent) { c.parent = ev.parent; c.forkAt = ev.fork_at; }
      c.params = ev.params || c.params;
      return false;
    case "message":
      if (ev.role === "assistant") {
        const m = openTurn(c, ev);
        m.parts.push({ id: ev.id, text: ev.text || "", channel: "content" });
        m.finish = "end_of_turn";
        retext(m);
      } else {
        c.messages.push({ role: ev.role === "prompt" ? "user" : ev.role, text: ev.text || "", first: ev.id, last: ev.id });
      }
      return true;
    case "generation_prompt": {
      const m = lastAssistant(c);
      if (m && !m.finish) { m.last = ev.id; return false; }
      openTurn(c, ev);
      return true;
    }
    case "generated": {
      let m = lastAssistant(c);
      if (!m) m = openTurn(c, ev);
      if (ev.reasoning) m.parts.push({ id: ev.id, text: ev.reasoning, channel: "reasoning" });
      const text = ev.text || "";
      if (text) m.parts.push({ id: ev.id, text, channel: ev.channel || "content" });
      // tool-call pieces as the model writes them: [index, id, name, arguments, end, cut]
      for (const [index, callId, name, args, end, cut] of ev.calls || []) {
        let t = m.tools.find((x) => x.index === index && x.generated);
        if (!t && name) { t = { index, generated: true, name, arguments: "", callId, open: true }; m.tools.push(t); }
        if (!t) continue;
        t.arguments += args || "";
        if (end) { t.open = false; t.cut = !!cut; }
      }
      m.tokens += (ev.span || ev.tokens || []).length;
      if (ev.ts) { m.tFirst = m.tFirst ?? ev.ts; m.tLast = ev.ts; }
      m.last = ev.id ?? m.last;
      m.finish = ev.finish || null;
      m.cut = m.finish === "dropped"; // the page lost its stream: the daemon cut it, the page continues it
      if (ev.usage) m.usage = ev.usage;
      retext(m);
      return true;
    }
    case "tool_use": {
      const m = lastAssistant(c) || openTurn(c, ev);
      m.tools.push({ name: ev.name, arguments: ev.arguments, callId: ev.call_id });
      m.last = ev.id;
      return true;
    }
    case "tool_result":
      c.messages.push({ role: "tool", text: ev.content || "", callId: ev.call_id, first: ev.id, last: ev.id });
      return true;
    case "epoch_bump": {
      const m = lastAssistant(c);
      if (m && !m.finish) { m.cut = true; return true; }
      return false;
    }
    case "meta":
      if (ev.title !== undefined && ev.title !== null) c.title = ev.title;
      if (ev.archived !== undefined && ev.archived !== null) c.archived = ev.archived;
      return true;
    case "trim":
      trim(c, ev.to);
      return true;
    default:
      return false;
  }
}

// The context now ends after event `to`: later messages and parts go (the log keeps them).
function trim(c, to) {
  c.messages = c.messages.filter((m) => m.first <= to);
  const m = c.messages[c.messages.length - 1];
  if (m && m.role === "assistant" && m.last > to) {
    m.parts = m.parts.filter((p) => p.id <= to);
    m.tools = [];
    m.last = to;
    m.finish = "trimmed";
    retext(m);
  }
}

export function fold(sid, evs) {
  const c = newConversation(sid);
  for (const ev of evs) apply(c, ev);
  return c;
}

// The figures shown under an answer: tokens, time to first token, tokens/s, cached.
export function figures(m) {
  const out = { tokens: m.tokens, ttft: null, rate: null, cached: m.usage ? m.usage.cached_tokens : null };
  if (m.tPrompt !== null && m.tFirst !== null) out.ttft = Math.max(0, m.tFirst - m.tPrompt);
  if (m.tFirst !== null && m.tLast !== null && m.tLast > m.tFirst && m.tokens > 1) {
    out.rate = (m.tokens - 1) / (m.tLast - m.tFirst);
  }
  return out;
}

export function toMarkdown(c) {
  const lines = [`# ${c.title || "Conversation"}`, "", `Session \`${c.sid}\``, ""];
  for (const m of c.messages) {
    lines.push(`## ${m.role[0].toUpperCase()}${m.role.slice(1)}`, "");
    if (m.reasoning) lines.push("<details><summary>Reasoning</summary>", "", m.reasoning, "", "</details>", "");
    lines.push(m.text, "");
    for (const t of m.tools || []) lines.push(`Tool call \`${t.name}\`: \`${t.arguments}\``, "");
  }
  return lines.join("\n");
}
