// HTTP to the daemon's own API, same origin. The API key (only when the daemon asks for
// one) lives in sessionStorage and travels as a header, never in a URL.

const KEY = "superfluid.key";
let askKey = null; // set by the page: async () => a key the user typed

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || null;
  }
}

// A failure to reach the daemon at all (down, restarting, network lost).
export class Offline extends Error {}

export function onKeyNeeded(fn) {
  askKey = fn;
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

function headers(extra) {
  const h = { ...extra };
  const key = sessionStorage.getItem(KEY);
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

async function send(path, opts) {
  try {
    return await fetch(path, opts());
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Offline(String(e));
  }
}

// fetch with the key; a 401 asks the user for a key once and retries.
export async function request(path, { method = "GET", body, extraHeaders, signal } = {}) {
  const opts = () => ({
    method, signal, cache: "no-store", credentials: "omit",
    headers: headers({ ...(body !== undefined ? { "content-type": "application/json" } : {}), ...extraHeaders }),
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  let res = await send(path, opts);
  while (res.status === 401 && askKey) {
    const key = await askKey(sessionStorage.getItem(KEY) ? "That key was not accepted." : "");
    if (!key) break;
    sessionStorage.setItem(KEY, key);
    res = await send(path, opts);
  }
  if (!res.ok) {
    let b = null;
    try { b = await res.json(); } catch { /* not JSON */ }
    throw new ApiError(res.status, b);
  }
  return res;
}

export async function json(path, opts) {
  return (await request(path, opts)).json();
}

// Server-sent events from a fetch response: yields {id, data} (data parsed from JSON;
// "[DONE]" as the string). Throws Offline when the stream breaks before it ends.
export async function* events(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let id = null;
  let data = [];
  try {
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (e.name === "AbortError") throw e;
        throw new Offline(String(e));
      }
      if (chunk.done) return;
      buf += chunk.value;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line === "") {
          if (data.length) {
            const raw = data.join("\n");
            yield { id, data: raw === "[DONE]" ? raw : JSON.parse(raw) };
          }
          id = null;
          data = [];
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        } else if (line.startsWith("id:")) {
          id = line.slice(3).trim();
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

// "SESSION:EVENT" -> EVENT (the log cursor an SSE id carries).
export function cursorOf(id) {
  if (!id) return null;
  const n = Number(id.slice(id.lastIndexOf(":") + 1));
  return Number.isInteger(n) ? n : null;
}
