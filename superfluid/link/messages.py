"""Link F messages: typed records (link/records.py; each a msgpack map of its fields) in
the frame envelope, carried by link/conn.py (LINK_F below). The head initiates with HELLO
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
              (hidden: an array, see pack_array; want: true or 1 returns logits for the item's last
              position, an integer k for its last k, up to STAGE_ROWS, as rows: drafts to verify),
              STAGE_COPY {src, dst, n}, STAGE_DROP {sessions}
node -> head: STAGE_READY {first, last, n_params, n_layer, n_vocab, n_ctx_train, rows} or {error}
              (rows: the most logits rows it returns per item; absent on older stages: 1),
              STAGE_FORWARD_RESP {id, outs: [array | None]} or {id, error}
A stage's sessions are the head's lanes; each keeps its KV for the stage's layers.

llama.cpp RPC (`node serve --rpc`; transport.Tunnels carries byte streams, the head's worker
dials, runtime/rpc_link.py): HELLO_ACK's `rpc` {free, total, threads} says the node offers it.
head -> node: RPC_OPEN {stream} (a connection to the node's loopback ggml RPC server)
both ways:    RPC_DATA {stream, data}, RPC_ACK {stream, n} (n bytes written on: the sender may
              have at most transport.WINDOW bytes unacknowledged), RPC_CLOSE {stream, error}

TOKEN_EVENTS are numbered densely per (generation, epoch) from 0; the head accepts only the
next one and acknowledges a watermark; the node keeps what is not acknowledged and
resends it after RECONCILE."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import numpy as np

from ..errors import ErrorReport, ProtocolError, WorkerCrashed
from ..request import CallDelta, Chunk, FinishReason, TokenLogprob
from .conn import HELLO, HELLO_ACK, KEEPALIVE, Protocol
from .records import Record, Table

VERSION = 1
OPTIONAL_BIT = 0x8000

GENERATE_REQ, GENERATE_CANCEL, TOKEN_EVENTS, WATERMARK_ACK = 10, 11, 12, 13
RECONCILE, RECONCILE_ACK, SESSION_REVOKE = 14, 15, 16
EMBED_REQ, EMBED_RESP = 17, 18  # idempotent: a batch whose node is lost is simply sent to another
NODE_STATUS, NODE_PREFIXES = 0x8000 | 20, 0x8000 | 22  # optional (KEEPALIVE too): a peer may ignore them
STAGE_LOAD, STAGE_READY, STAGE_FORWARD_REQ, STAGE_FORWARD_RESP, STAGE_COPY, STAGE_DROP = 30, 31, 32, 33, 34, 35
STAGE_ROWS = 33  # logits rows a stage returns for one item at most: a decode token and 32 drafts
RPC_OPEN, RPC_DATA, RPC_ACK, RPC_CLOSE = 40, 41, 42, 43


# -- the typed messages (link/records.py: a map of the fields by name on the wire) --------
@dataclass(frozen=True, slots=True)
class Hello(Record):
    TYPE = HELLO
    versions: tuple[int, ...]
    head: str = ""  # the head process's instance id: the namespace of its command ids


@dataclass(frozen=True, slots=True)
class ModelOffer(Record):
    id: str
    n_ctx: int = 0
    lanes: int = 0
    embed_window: int = 0
    kind: str = "generate"


@dataclass(frozen=True, slots=True)
class NodeStatus(Record):
    """NODE_STATUS (fleet/stats.py says what each field means); a field left None is not sent."""
    TYPE = NODE_STATUS
    lanes: int | None = None
    running: int | None = None
    waiting: int | None = None
    kv_used: int | None = None
    kv_total: int | None = None
    kv_slots: int | None = None
    lane_list: list | None = None
    queue: dict | None = None
    counters: dict | None = None
    rates: list | None = None
    restarts: int | None = None
    steps: int | None = None
    stages: list | None = None  # a pipeline stage: the layer ranges it holds
    tokens_fed: int | None = None
    sessions: int | None = None
    rpc: dict | None = None  # a llama.cpp RPC node: {free, total, threads, bytes_in, streams}
    device: dict | None = None  # where the model's layers are: {devices, layers, of, bytes, total_bytes}

    def report(self) -> dict:
        return self.to_wire()


@dataclass(frozen=True, slots=True)
class HelloAck(Record):
    TYPE = HELLO_ACK
    version: int
    node: str = ""
    models: tuple[ModelOffer, ...] = ()
    status: NodeStatus = field(default_factory=NodeStatus)
    stage: dict | None = None  # a pipeline stage: {model, n_layer, mem}
    rpc: dict | None = None  # a llama.cpp RPC node: {free, total, threads} (bytes of memory)


@dataclass(frozen=True, slots=True)
class GenerateReq(Record):
    TYPE = GENERATE_REQ
    cmd: int
    gen: str
    session: str
    epoch: int
    prompt: tuple[int, ...]
    sampling: list  # SamplingParams.to_wire()
    max_tokens: int
    stop: tuple[str, ...] = ()
    qos: int = 2
    channels: dict | None = None  # codec.channels.spec_to_wire()
    history: tuple[int, ...] = ()
    speculate: int | None = None  # drafts per step the node may verify (the head's setting); None: the node's
    persist: bool = True  # False (store: false): the node keeps none of it on its KV disk tier
    cache_ns: str = ""  # its prefix-cache namespace (request.GenRequest.cache_ns)


@dataclass(frozen=True, slots=True)
class GenerateCancel(Record):
    TYPE = GENERATE_CANCEL
    cmd: int
    gen: str


@dataclass(frozen=True, slots=True)
class TokenEvents(Record):
    TYPE = TOKEN_EVENTS
    gen: str
    epoch: int
    events: tuple[tuple[int, list], ...]  # (seq, chunk_to_wire(chunk))


@dataclass(frozen=True, slots=True)
class WatermarkAck(Record):
    TYPE = WATERMARK_ACK
    gen: str
    epoch: int
    upto: int


@dataclass(frozen=True, slots=True)
class Reconcile(Record):
    TYPE = RECONCILE
    gens: dict[str, tuple[int, int]]  # gen -> (epoch, last seq the head has)


@dataclass(frozen=True, slots=True)
class ReconcileAck(Record):
    TYPE = RECONCILE_ACK
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionRevoke(Record):
    TYPE = SESSION_REVOKE
    session: str
    epoch: int


@dataclass(frozen=True, slots=True)
class EmbedReq(Record):
    TYPE = EMBED_REQ
    id: str
    inputs: tuple[tuple[tuple[int, ...], int], ...]  # (tokens, pair_at) per input
    qos: int = 4


@dataclass(frozen=True, slots=True)
class EmbedResp(Record):
    TYPE = EMBED_RESP
    id: str
    vectors: tuple[bytes, ...] | None = None  # float32 little-endian, one per input
    error: tuple[str, str] | None = None  # (code, message) instead


# Pipeline stages. Decoded by their handlers (deferred): a stage answers a malformed
# request with an error reply and the link goes on; a head loses a stage that answers one.
@dataclass(frozen=True, slots=True)
class StageLoad(Record):
    TYPE = STAGE_LOAD
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class StageReady(Record):
    TYPE = STAGE_READY
    first: int = 0
    last: int = 0
    n_params: int = 0
    n_layer: int = 0
    n_vocab: int = 0
    hidden: int = 0
    n_ctx_train: int = 0
    error: str | None = None  # instead of the rest: why the stage refused
    rows: int = 1  # the most logits rows it returns per item (speculation verifies drafts: up to STAGE_ROWS)


@dataclass(frozen=True, slots=True)
class StageForwardReq(Record):
    TYPE = STAGE_FORWARD_REQ
    id: int
    items: tuple[tuple[object, int, tuple[int, ...] | None, list | None, object], ...]  # see the docstring


@dataclass(frozen=True, slots=True)
class StageForwardResp(Record):
    TYPE = STAGE_FORWARD_RESP
    id: object = None
    outs: tuple[list | None, ...] = ()  # pack_array per item (None: no output wanted)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StageCopy(Record):
    TYPE = STAGE_COPY
    src: object
    dst: object
    n: int


@dataclass(frozen=True, slots=True)
class StageDrop(Record):
    TYPE = STAGE_DROP
    sessions: tuple[object, ...]


@dataclass(frozen=True, slots=True)
class NodePrefixes(Record):
    """Deferred too: the head reads it defensively (fleet/prefixes.py: garbage or another
    granularity is no prefixes, not a lost link)."""
    TYPE = NODE_PREFIXES
    prefix: bytes | None = None  # u64 LE block hashes
    prefix_tokens: int | None = None  # tokens per block


# A tunnelled byte stream (transport.Tunnels).
@dataclass(frozen=True, slots=True)
class RpcOpen(Record):
    TYPE = RPC_OPEN
    stream: int


@dataclass(frozen=True, slots=True)
class RpcData(Record):
    TYPE = RPC_DATA
    stream: int
    data: bytes


@dataclass(frozen=True, slots=True)
class RpcAck(Record):
    TYPE = RPC_ACK
    stream: int
    n: int


@dataclass(frozen=True, slots=True)
class RpcClose(Record):
    TYPE = RPC_CLOSE
    stream: int
    error: str = ""


RECORDS: list[type[Record]] = [Hello, HelloAck, NodeStatus, GenerateReq, GenerateCancel, TokenEvents,
                               WatermarkAck, Reconcile, ReconcileAck, SessionRevoke, EmbedReq, EmbedResp,
                               RpcOpen, RpcData, RpcAck, RpcClose]
STAGE_RECORDS: tuple[type[Record], ...] = (StageLoad, StageReady, StageForwardReq, StageForwardResp, StageCopy,
                                           StageDrop)
TABLE = Table({**{r.TYPE: r for r in RECORDS}, KEEPALIVE: None}, deferred=(*STAGE_RECORDS, NodePrefixes))
KNOWN = frozenset(TABLE.classes)
KEEPALIVE_EVERY = 1.0  # a KEEPALIVE also renews the lease of every generation on the node
LINK_F = Protocol("Link F", VERSION, TABLE, keepalive=KEEPALIVE_EVERY)



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


def chunk_to_wire(c: Chunk) -> list:
    """A chunk on Link F; its error as an errors.ErrorReport, so a request's own error
    (errors.LINKED) reaches the head's client as the same typed 4xx."""
    err = None if c.error is None else ErrorReport.of(c.error, code="node_error").to_wire()
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
        try:
            err = list(err)
            if len(err) == 2:  # [code, message], as nodes before the typed report sent it
                err = ["", err[1], err[0], None]
            report = ErrorReport.from_wire(err)
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"a TOKEN_EVENTS error is malformed ({e})") from None
        c.error = report.exception() if report.kind else WorkerCrashed(f"the node reported: {report.message}",
                                                                        code=report.code or "node_error")
    return c
