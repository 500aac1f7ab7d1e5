"""A model split by layers across stage nodes, as a Runtime: `superfluid serve --pipeline
H1:P1,H2:P2,...` runs this in its worker process, so the daemon's scheduler, session log,
sampling (counter-based RNG, grammars), QoS, streaming and every API work as on one machine.

The runtime dials each stage (`superfluid node serve --stage`, fleet/stage_node.py) over
Link F through the shared connection layer (net/transport.py), assigns
contiguous layer ranges (evenly, or by the memory each stage reports), and executes each
step's runs as one STAGE_FORWARD_REQ per stage: token ids into the first, activations from
each stage into the next, logits out of the last; all lanes' decode tokens of a step travel
together. Each stage keeps a KV cache per lane for its layers, so a decoded token costs one
layer-slice pass per stage whatever the context. Sampling stays here.

The links run on an event loop in a background thread (keepalives flow between steps). A
stage that goes away (its connection ends, or it is silent past `timeout` while a request
waits) fails the step with a StageLost error: the daemon fails the step's requests with a
typed error and restarts this worker, which dials the stages again."""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from ..errors import SuperfluidError
from ..link import messages as m
from ..plan import Run
from ..net.transport import Link
from .base import ModelInfo, Runtime
from .gguf_vocab import GgufVocab

log = logging.getLogger("superfluid.pipeline")
R = TypeVar("R", bound=m.Record)


FRAME_BUDGET = 12 * 2**20  # bytes of activations or logits per request (the frame cap is 16 MiB)
LOAD_TIMEOUT = 280.0  # a stage loading its layers (the daemon waits 300 s for its worker)
FORWARD_TIMEOUT = 120.0  # one step on one stage


def split_layers(n_layer: int, weights: list[float]) -> list[tuple[int, int]]:
    """Contiguous layer ranges [first, last), one per stage, in proportion to `weights`
    (equal weights: an even split; reported memory: by memory); every stage holds at
    least one layer."""
    k = len(weights)
    if not 0 < k <= n_layer:
        raise ValueError(f"{k} stages cannot split {n_layer} layers")
    total = sum(max(0.0, x) for x in weights)
    w = [max(0.0, x) / total for x in weights] if total > 0 else [1 / k] * k
    bounds, acc = [0], 0.0
    for i in range(k - 1):
        acc += w[i]
        lo, hi = bounds[-1] + 1, n_layer - (k - 1 - i)  # room for one layer per later stage
        bounds.append(min(max(round(acc * n_layer), lo), hi))
    bounds.append(n_layer)
    return list(zip(bounds, bounds[1:], strict=False))


def _want(r: Run) -> bool | int:
    """An item's logits rows: none, its last position's, or one per draft and the token before."""
    return (r.draft + 1) if r.sample and r.draft else r.sample


class StageLost(SuperfluidError):
    status = 503
    code = "stage_unavailable"


class _Stage:
    def __init__(self, addr: str, link: Link, ack: m.HelloAck):
        self.addr, self.link = addr, link
        self.info = ack.stage or {}
        self.pending: collections.deque[asyncio.Future] = collections.deque()  # answered in order
        self.lost: str | None = None
        self.reader: asyncio.Task | None = None
        self.first = self.last = 0
        self.ready = m.StageReady()  # what the stage holds


class PipelineRuntime(Runtime):
    def __init__(self, model_path: str, stages: list[tuple[str, int]], psk: bytes | None, *, lanes: int,
                 n_ctx: int, split: str = "even", timeout: float = 10.0, spares: Sequence[tuple[str, int]] = ()):
        super().__init__()
        self.timeout = timeout
        self.proto = replace(m.LINK_F, silence=timeout)  # a stage silent this long is gone
        self.instance = secrets.token_hex(8)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="pipeline-links", daemon=True).start()
        self.stages: list[_Stage] = []
        self.vocab = GgufVocab(model_path)
        self.eog = self.vocab.eog
        try:
            spare = iter(spares)
            for host, port in stages:
                self.stages.append(self._call(self._dial_or_spare(host, port, psk, spare), 120))
            self._assign(split)
        except BaseException:
            self.close()
            raise
        desc = ", ".join(f"{s.addr} [{s.first},{s.last})" for s in self.stages)
        self._ends: dict[int, int] = {}  # positions each lane's KV holds on the stages, as fed from here
        self.info = ModelInfo(n_vocab=self.n_vocab, n_ctx=n_ctx, n_lanes=lanes,
                              n_ctx_train=self.stages[-1].ready.n_ctx_train,
                              description=f"pipeline of {len(self.stages)} stages: {desc}",
                              speculate=self.stages[-1].ready.rows > 1)  # the last stage verifies drafts

    # -- setup ---------------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _dial_or_spare(self, host: str, port: int, psk: bytes | None, spares) -> _Stage:
        """The stage, or the next spare that answers in its place."""
        try:
            return await self._dial(host, port, psk)
        except StageLost as e:
            for h, p in spares:
                try:
                    st = await self._dial(h, p, psk)
                except StageLost as e2:
                    log.warning("spare stage %s:%d: %s", h, p, e2.message)
                    continue
                log.warning("%s; spare %s:%d takes its place", e.message, h, p)
                return st
            raise

    async def _dial(self, host: str, port: int, psk: bytes | None) -> _Stage:
        addr = f"{host}:{port}"
        link = None
        try:
            link = await Link.dial(host, port, self.proto, psk)
            ack = await link.greet(m.Hello((m.VERSION,), self.instance))
            if not isinstance(ack.stage, dict):
                raise StageLost(f"{addr} is not a pipeline stage (start it with `superfluid node serve --stage`)")
        except (OSError, TimeoutError, OverflowError, SuperfluidError) as e:
            if link is not None:
                link.close()
            if isinstance(e, StageLost):
                raise
            raise StageLost(f"pipeline stage {addr} is not reachable: {getattr(e, 'message', None) or e}") from None
        st = _Stage(addr, link, ack)
        st.reader = asyncio.create_task(self._read(st))
        return st

    def _assign(self, split: str) -> None:
        """Contiguous layer ranges, loaded on every stage at once; the stages must serve this
        model (the same layer count and vocabulary)."""
        try:
            n_layers = {int(s.info.get("n_layer", 0)) for s in self.stages}
            weights = [float(s.info.get("mem", 0)) if split == "memory" else 1.0 for s in self.stages]
        except (TypeError, ValueError) as e:
            raise StageLost(f"a pipeline stage sent a malformed HELLO_ACK ({e})") from None
        if len(n_layers) != 1:
            raise StageLost("the pipeline's stages serve models with different layer counts: "
                            + ", ".join(f"{s.addr}: {s.info.get('model')} ({s.info.get('n_layer')} layers)"
                                        for s in self.stages))
        for st, (first, last) in zip(self.stages, split_layers(n_layers.pop(), weights), strict=True):
            st.first, st.last = first, last

        async def load_all() -> list[m.StageReady]:
            return await asyncio.gather(*(self._ask(st, m.StageLoad(st.first, st.last), m.StageReady, LOAD_TIMEOUT)
                                          for st in self.stages))
        for st, ready in zip(self.stages, self._call(load_all()), strict=True):
            st.ready = ready
            if ready.n_vocab < self.vocab.n_vocab:
                raise StageLost(f"pipeline stage {st.addr} serves another model: a vocabulary of "
                                f"{ready.n_vocab} tokens, not {self.vocab.n_vocab}")
            log.info("stage %s holds layers [%d, %d): %s parameters", st.addr, st.first, st.last, ready.n_params)
        self.n_vocab = self.stages[-1].ready.n_vocab
        self.hidden = self.stages[0].ready.hidden or 1

    # -- the links -----------------------------------------------------------------------
    async def _read(self, st: _Stage) -> None:
        """The stage's answers, to its requests in order (the link drops a silent stage)."""
        def on_message(kind: int, body: Any) -> None:
            if kind in (m.STAGE_READY, m.STAGE_FORWARD_RESP):
                if not st.pending:
                    raise SuperfluidError(f"an answer nobody asked for (message {kind})")
                fut = st.pending.popleft()
                if not fut.done():
                    fut.set_result(body)
        try:
            await st.link.serve(on_message)
        except (ConnectionError, OSError, SuperfluidError) as e:
            self._lose(st, f"pipeline stage {st.addr} went away ({getattr(e, 'message', None) or e or 'closed'})")

    def _lose(self, st: _Stage, why: str) -> None:
        st.lost = st.lost or why
        st.link.close()
        while st.pending:
            fut = st.pending.popleft()
            if not fut.done():
                fut.set_exception(StageLost(st.lost))

    async def _ask(self, st: _Stage, msg: m.Record, answer: type[R], limit: float = FORWARD_TIMEOUT) -> R:
        """One request and its answer. Fails with StageLost when the stage goes away, is
        silent for `timeout` (its link ends), or does not answer within `limit` (keepalives
        do not count)."""
        if st.lost:
            raise StageLost(st.lost)
        fut = self.loop.create_future()
        st.pending.append(fut)
        try:
            st.link.send(msg)
        except (ConnectionError, SuperfluidError) as e:  # gone, or a request over the frame cap
            self._lose(st, f"pipeline stage {st.addr}: {getattr(e, 'message', None) or e or 'the link is closed'}")
        deadline = time.monotonic() + limit
        while True:
            done, _ = await asyncio.wait([fut], timeout=1.0)
            if done:
                break
            if time.monotonic() > deadline:
                self._lose(st, f"pipeline stage {st.addr} did not answer within {limit:.0f} s")
        try:
            reply = answer.from_wire(fut.result())
        except SuperfluidError as e:
            self._lose(st, f"pipeline stage {st.addr} answered a malformed {answer.__name__} ({e.message})")
            raise StageLost(st.lost or "") from None
        why = getattr(reply, "error", None)
        if why:
            raise StageLost(f"pipeline stage {st.addr} refused: {why}")
        return reply

    def _tell(self, msg: m.Record) -> None:
        """A command with no answer, to every stage (ordered before the next request)."""
        def send() -> None:
            for st in self.stages:
                if not st.lost:
                    try:
                        st.link.send(msg)
                    except ConnectionError:
                        self._lose(st, f"pipeline stage {st.addr} went away")
        self.loop.call_soon_threadsafe(send)

    async def _forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for group in self._groups(runs):
            out.update(await self._forward_group(group))
        return out

    def _groups(self, runs: tuple[Run, ...]) -> list[list[Run]]:
        """The step's runs in requests whose activations and logits stay under the frame cap:
        a long prefill run is cut in pieces (one lane's pieces go in order), and requests carry
        at most as many sampled rows as fit."""
        max_rows = max(1, FRAME_BUDGET // (4 * self.hidden))
        max_samples = max(m.STAGE_ROWS, FRAME_BUDGET // (4 * self.n_vocab))
        pieces = []
        for r in runs:
            for a in range(0, len(r.tokens), max_rows):
                toks = r.tokens[a:a + max_rows]
                last = a + len(toks) == len(r.tokens)
                pieces.append(Run(r.seq, r.pos + a, toks, r.sample and last, r.draft if last else 0))
        groups: list[list[Run]] = [[]]
        rows = samples = 0
        for p in pieces:
            logits = (p.draft + 1) * p.sample  # logits rows it brings back
            if groups[-1] and (rows + len(p.tokens) > max_rows or samples + logits > max_samples):
                groups.append([])
                rows = samples = 0
            groups[-1].append(p)
            rows, samples = rows + len(p.tokens), samples + logits
        return [g for g in groups if g]

    async def _forward_group(self, runs: list[Run]) -> dict[int, np.ndarray]:
        hidden: list = [None] * len(runs)
        for st in self.stages:
            items = tuple((r.seq, r.pos, tuple(r.tokens) if st.first == 0 else None,
                           None if st.first == 0 else m.pack_array(h), _want(r))
                          for r, h in zip(runs, hidden, strict=True))
            reply = await self._ask(st, m.StageForwardReq(0, items), m.StageForwardResp)
            try:
                outs = reply.outs
                if len(outs) != len(runs):
                    raise ValueError(f"{len(outs)} outputs for {len(runs)} items")
                hidden = [None if o is None else m.unpack_array(o) for o in outs]
                if st is not self.stages[-1] and any(h is None for h in hidden):
                    raise ValueError("an item without activations")
            except (KeyError, TypeError, ValueError, SuperfluidError) as e:
                self._lose(st, f"pipeline stage {st.addr} answered a malformed forward "
                               f"({getattr(e, 'message', None) or e})")
                raise StageLost(st.lost or "") from None
        for r in runs:
            self._ends[r.seq] = r.pos + len(r.tokens)
        return {r.seq: h.reshape(r.draft + 1, -1) if r.draft else h.reshape(-1)
                for r, h in zip(runs, hidden, strict=True) if r.sample and h is not None}

    # -- the Runtime contract ----------------------------------------------------------
    def grammar_tokenizer(self):
        return self.vocab.grammar_tokenizer()

    def open_lane(self, seq: int, keep: int) -> None:
        self.drop_tail(seq, keep)  # each stage truncates a lane's KV to the position of its next run

    def close_lane(self, seq: int) -> None:
        pass  # the KV stays on the stages: a prefix-cache entry

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        self._tell(m.StageCopy(src, dst, n))
        if src in self._ends:
            self._ends[dst] = min(n, self._ends[src])
        else:
            self._ends.pop(dst, None)

    def lane_len(self, seq: int) -> int | None:
        """What this worker fed the lane (None: nothing yet): a decode with drafts goes at its
        end, after a step in flight that kept drafts."""
        return self._ends.get(seq)

    def drop_tail(self, seq: int, n: int) -> None:
        """Rejected drafts: the stages drop them when the lane's next run starts at n."""
        if seq in self._ends:
            self._ends[seq] = min(n, self._ends[seq])

    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        return self._call(self._forward(runs))

    def close(self) -> None:
        def shut() -> None:
            for st in self.stages:
                if st.reader is not None:
                    st.reader.cancel()
                st.link.close()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(shut)
            self.loop.call_soon_threadsafe(self.loop.stop)
        if getattr(self, "vocab", None) is not None:
            self.vocab.close()
