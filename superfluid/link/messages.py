"""Link F messages (msgpack bodies in the frame envelope). The head initiates with HELLO
{versions, head: its process's instance id, the namespace of its command ids}; the node
answers HELLO_ACK (identity, models, capacity, limits), then:

head -> node: GENERATE_REQ {cmd, gen, session, epoch, prompt, sampling, max_tokens, stop,
              qos, channels}, GENERATE_CANCEL {cmd, gen}, WATERMARK_ACK {gen, epoch, upto},
              RECONCILE {gens: {gen: [epoch, last_seq]}}, SESSION_REVOKE {session, epoch},
              KEEPALIVE {} (it also renews every lease),
              EMBED_REQ {id, inputs: [[tokens, pair_at]...], qos} (a batch to embed or score)
node -> head: EMBED_RESP {id, vectors: [float32 bytes...]} or {id, error: [code, message]},
              TOKEN_EVENTS {gen, epoch, events: [[seq, chunk]...]}, RECONCILE_ACK {gens
              it no longer has}, NODE_STATUS {lanes, running, waiting, kv_used, kv_total,
              decode_tps}, NODE_PREFIXES {prefix: u64 LE hashes, prefix_tokens} (the prefixes
              its KV holds, fleet/prefixes.py; with each NODE_STATUS), KEEPALIVE {}

Pipeline stages (`node serve --stage`; the head's worker drives them, one request at a time
per link, answered in order):
head -> node: STAGE_LOAD {first, last} (hold decoder layers [first, last) of the node's model),
              STAGE_FORWARD_REQ {id, items: [[session, pos, tokens | None, hidden | None, want]]}
              (hidden: an array, see pack_array; want: return logits for the item's last position),
              STAGE_COPY {src, dst, n}, STAGE_DROP {sessions}
node -> head: STAGE_READY {first, last, n_params, n_layer, n_vocab, n_ctx_train} or {error},
              STAGE_FORWARD_RESP {id, outs: [array | None]} or {id, error}
A stage's sessions are the head's lanes; each keeps its KV for the stage's layers.

TOKEN_EVENTS are numbered densely per (generation, epoch) from 0; the head accepts only the
next one and acknowledges a watermark; the node keeps what is not acknowledged and
resends it after RECONCILE."""

from __future__ import annotations

import msgpack
import numpy as np

from ..errors import ProtocolError
from ..request import CallDelta, Chunk, FinishReason, TokenLogprob

VERSION = 1
OPTIONAL_BIT = 0x8000

HELLO, HELLO_ACK = 1, 2
GENERATE_REQ, GENERATE_CANCEL, TOKEN_EVENTS, WATERMARK_ACK = 10, 11, 12, 13
RECONCILE, RECONCILE_ACK, SESSION_REVOKE = 14, 15, 16
EMBED_REQ, EMBED_RESP = 17, 18  # idempotent: a batch whose node is lost is simply sent to another
NODE_STATUS, KEEPALIVE, NODE_PREFIXES = 0x8000 | 20, 0x8000 | 21, 0x8000 | 22  # optional: a peer may ignore them
STAGE_LOAD, STAGE_READY, STAGE_FORWARD_REQ, STAGE_FORWARD_RESP, STAGE_COPY, STAGE_DROP = 30, 31, 32, 33, 34, 35
KNOWN = {HELLO, HELLO_ACK, GENERATE_REQ, GENERATE_CANCEL, TOKEN_EVENTS, WATERMARK_ACK, RECONCILE,
         RECONCILE_ACK, SESSION_REVOKE, EMBED_REQ, EMBED_RESP, NODE_STATUS, KEEPALIVE, NODE_PREFIXES, STAGE_LOAD,
         STAGE_READY, STAGE_FORWARD_REQ, STAGE_FORWARD_RESP, STAGE_COPY, STAGE_DROP}



def pack(body: dict) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def unpack(data: bytes) -> dict:
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types on garbage
        raise ProtocolError(f"a Link F body is not msgpack ({type(e).__name__})") from None
    if not isinstance(body, dict):
        raise ProtocolError("a Link F body must be a map")
    return body


def pack_array(a) -> list:
    """A 2-D array on the wire: [dtype, rows, cols, raw little-endian bytes]."""
    return [str(a.dtype), int(a.shape[0]), int(a.shape[1]), a.tobytes()]


def unpack_array(w) -> np.ndarray:
    """The array pack_array sent, checked (dtype, shape against the byte count): a
    ProtocolError otherwise."""
    try:
        dtype, rows, cols, raw = w
        if (dtype not in ("float32", "float16") or not isinstance(rows, int) or not isinstance(cols, int)
                or rows < 0 or cols <= 0 or not isinstance(raw, bytes)):
            raise ValueError(f"dtype {dtype!r}, shape ({rows}, {cols})")
        dt = np.dtype(dtype).newbyteorder("<")
        if len(raw) != rows * cols * dt.itemsize:
            raise ValueError(f"{len(raw)} bytes for ({rows}, {cols}) {dtype}")
        return np.frombuffer(raw, dtype=dt).reshape(rows, cols).astype(np.float32)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"a stage array is malformed ({e})") from None


def malformed(kind: int, e: Exception) -> ProtocolError:
    """A message whose body lacks a field or has a wrong type: fatal for the link only."""
    return ProtocolError(f"message {kind} has a malformed body ({type(e).__name__}: {e})")


def chunk_to_wire(c: Chunk) -> list:
    err = None
    if c.error is not None:
        err = [getattr(c.error, "code", None) or "error", getattr(c.error, "message", str(c.error))]
    return [c.text, list(c.tokens), int(c.finish) if c.finish is not None else None, c.prompt_tokens,
            c.completion_tokens, c.cached_tokens, c.ttft_s, c.stop_sequence, c.reasoning,
            [d.to_wire() for d in c.calls],
            [[lp.token, lp.text, lp.logprob, [list(x) for x in lp.top]] for lp in c.logprobs], err]


def chunk_from_wire(request_id: str, w: list) -> Chunk:
    try:
        (text, tokens, finish, pt, ct, cached, ttft, stop, reasoning, calls, lps, err) = w
        c = Chunk(request_id, text=text, tokens=list(tokens),
                  finish=FinishReason(finish) if finish is not None else None, prompt_tokens=pt,
                  completion_tokens=ct, cached_tokens=cached, ttft_s=ttft, stop_sequence=stop,
                  reasoning=reasoning, calls=[CallDelta.from_wire(d) for d in calls],
                  logprobs=[TokenLogprob(t, bytes(b), lp, tuple(tuple(x) for x in top)) for t, b, lp, top in lps])
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"a TOKEN_EVENTS chunk is malformed ({e})") from None
    if err is not None:
        from ..errors import WorkerCrashed
        c.error = WorkerCrashed(f"the node reported: {err[1]}", code=str(err[0]))
    return c
