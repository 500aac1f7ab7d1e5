"""A model split by layers across stage nodes, as a Runtime: `superfluid serve --pipeline
H1:P1,H2:P2,...` runs this in its worker process, so the daemon's scheduler, session log,
sampling (counter-based RNG, grammars), QoS, streaming and every API work as on one machine.

The runtime dials each stage (`superfluid node serve --stage`) over Link F, assigns
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

import numpy as np

from ..errors import SuperfluidError
from ..link import messages as m
from ..plan import Run
from ..runtime.base import ModelInfo, Runtime
from ..runtime.gguf_vocab import GgufVocab
from .placement import split_layers
from .transport import Link

log = logging.getLogger("superfluid.pipeline")


class StageLost(SuperfluidError):
    status = 503
    code = "stage_unavailable"


class _Stage:
    def __init__(self, addr: str, link: Link, ack: dict):
        self.addr, self.link = addr, link
        self.info = ack.get("stage") or {}
        self.pending: collections.deque[asyncio.Future] = collections.deque()  # answered in order
        self.last_heard = time.monotonic()
        self.lost: str | None = None
        self.reader: asyncio.Task | None = None
        self.first = self.last = 0
        self.ready: dict = {}  # STAGE_READY: what the stage holds


class PipelineRuntime(Runtime):
    def __init__(self, model_path: str, stages: list[tuple[str, int]], psk: bytes | None, *, lanes: int,
                 n_ctx: int, split: str = "even", timeout: float = 10.0):
        super().__init__()
        self.timeout = timeout
        self.instance = secrets.token_hex(8)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="pipeline-links", daemon=True).start()
        self.stages: list[_Stage] = []
        try:
            for host, port in stages:
                self.stages.append(self._call(self._dial(host, port, psk), 60))
            self._assign(split)
        except BaseException:
            self.close()
            raise
        self.vocab = GgufVocab(model_path)
        self.eog = self.vocab.eog
        last = self.stages[-1].ready
        desc = ", ".join(f"{s.addr} [{s.first},{s.last})" for s in self.stages)
        self.info = ModelInfo(n_vocab=int(last["n_vocab"]), n_ctx=n_ctx, n_lanes=lanes,
                              n_ctx_train=int(last.get("n_ctx_train") or 0),
                              description=f"pipeline of {len(self.stages)} stages: {desc}")

    # -- setup ---------------------------------------------------------------------------
    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _dial(self, host: str, port: int, psk: bytes | None) -> _Stage:
        addr = f"{host}:{port}"
        try:
            link = await Link.dial(host, port, psk)
            link.send(m.HELLO, {"versions": [m.VERSION], "head": self.instance})
            kind, ack = await asyncio.wait_for(link.recv(), 10.0)
        except (OSError, TimeoutError, SuperfluidError) as e:
            raise StageLost(f"pipeline stage {addr} is not reachable: {getattr(e, 'message', None) or e}") from None
        if kind != m.HELLO_ACK or not ack.get("stage"):
            link.close()
            raise StageLost(f"{addr} is not a pipeline stage (start it with `superfluid node serve --stage`)")
        st = _Stage(addr, link, ack)
        st.reader = asyncio.create_task(self._read(st))
        return st

    def _assign(self, split: str) -> None:
        n_layers = {int(s.info.get("n_layer", 0)) for s in self.stages}
        if len(n_layers) != 1:
            raise StageLost("the pipeline's stages serve models with different layer counts: "
                            + ", ".join(f"{s.addr}: {s.info.get('model')} ({s.info.get('n_layer')} layers)"
                                        for s in self.stages))
        weights = [float(s.info.get("mem", 0)) if split == "memory" else 1.0 for s in self.stages]
        for st, (first, last) in zip(self.stages, split_layers(n_layers.pop(), weights), strict=True):
            st.first, st.last = first, last
            st.ready = self._call(self._ask(st, m.STAGE_LOAD, {"first": first, "last": last}), 600)
            log.info("stage %s holds layers [%d, %d): %d parameters", st.addr, first, last, st.ready["n_params"])

    # -- the links -----------------------------------------------------------------------
    async def _read(self, st: _Stage) -> None:
        try:
            while True:
                kind, body = await st.link.recv()
                st.last_heard = time.monotonic()
                if kind in (m.STAGE_READY, m.STAGE_FORWARD_RESP):
                    if not st.pending:
                        raise SuperfluidError(f"an answer nobody asked for (message {kind})")
                    fut = st.pending.popleft()
                    if not fut.done():
                        fut.set_result(body)
        except (ConnectionError, OSError, SuperfluidError) as e:
            self._lose(st, f"pipeline stage {st.addr} went away ({getattr(e, 'message', None) or e or 'closed'})")

    def _lose(self, st: _Stage, why: str) -> None:
        st.lost = st.lost or why
        st.link.close()
        while st.pending:
            fut = st.pending.popleft()
            if not fut.done():
                fut.set_exception(StageLost(st.lost))

    async def _ask(self, st: _Stage, kind: int, body: dict) -> dict:
        if st.lost:
            raise StageLost(st.lost)
        fut = self.loop.create_future()
        st.pending.append(fut)
        try:
            st.link.send(kind, body)
        except ConnectionError:
            self._lose(st, f"pipeline stage {st.addr} went away")
        while True:
            done, _ = await asyncio.wait([fut], timeout=1.0)
            if done:
                break
            if time.monotonic() - st.last_heard > self.timeout:
                self._lose(st, f"pipeline stage {st.addr} is silent for {self.timeout:.0f} s")
        reply = fut.result()
        if reply.get("error"):
            raise StageLost(f"pipeline stage {st.addr} refused: {reply['error']}")
        return reply

    def _tell(self, kind: int, body: dict) -> None:
        """A command with no answer, to every stage (ordered before the next request)."""
        def send() -> None:
            for st in self.stages:
                if not st.lost:
                    try:
                        st.link.send(kind, body)
                    except ConnectionError:
                        self._lose(st, f"pipeline stage {st.addr} went away")
        self.loop.call_soon_threadsafe(send)

    async def _forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        hidden: list = [None] * len(runs)
        for st in self.stages:
            items = [[r.seq, r.pos, list(r.tokens) if st.first == 0 else None,
                      None if st.first == 0 else m.pack_array(h), r.sample] for r, h in zip(runs, hidden, strict=True)]
            reply = await self._ask(st, m.STAGE_FORWARD_REQ, {"id": 0, "items": items})
            outs = reply.get("outs") or []
            if len(outs) != len(runs):
                raise StageLost(f"pipeline stage {st.addr} answered {len(outs)} items for {len(runs)}")
            hidden = [None if o is None else m.unpack_array(o) for o in outs]
        return {r.seq: h.reshape(-1) for r, h in zip(runs, hidden, strict=True) if r.sample and h is not None}

    # -- the Runtime contract ----------------------------------------------------------
    def grammar_tokenizer(self):
        return self.vocab.grammar_tokenizer()

    def open_lane(self, seq: int, keep: int) -> None:
        pass  # each stage truncates a lane's KV to the position of its next run

    def close_lane(self, seq: int) -> None:
        pass  # the KV stays on the stages: a prefix-cache entry

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        self._tell(m.STAGE_COPY, {"src": src, "dst": dst, "n": n})

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
