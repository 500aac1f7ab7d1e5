"""The fleet head's engine for one model: the engine contract (engine.contract.EngineAPI) a
local Engine also meets, sharing only engine.base.EngineBase with it, but its generations
run on nodes over Link F (fleet/pool.py holds the links, shared by every model the head
serves on the fleet). The head keeps the tokenizer and template (the API layer builds
prompts here) and the session log; nodes run scheduler + worker and stream back numbered
chunks. Its stats() sum what the nodes report (fleet/stats.py).

Exactly once: each placed generation has a Tracker (link/head_state.py) that accepts only
the next seq of its current epoch; the head acknowledges a watermark. A dropped link is
redialled and reconciled (the node resends exactly the missing tail). A node that does not
come back within `grace` seconds loses its generations: each is re-placed on another node
under a new epoch, with the tokens already delivered as context and the remaining budget,
so the client's stream goes on with no token twice and none missing."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..engine.contract import NO_HOOKS, EngineStats, Hooks
from ..engine.base import EngineBase
from ..errors import ContextLengthExceeded, ProtocolError, SuperfluidError, WorkerUnavailable
from ..link import messages as m
from ..link.head_state import Tracker
from ..request import Chunk, FinishReason, GenRequest
from .embeds import FleetEmbedder
from .node import spec_to_wire
from .placement import pick
from .pool import NodePool, NodeConn
from .prefixes import wanted
from .stats import fleet_stats

log = logging.getLogger("superfluid.fleet")


@dataclass(eq=False)
class _Placed:
    req: GenRequest
    tracker: Tracker
    node: NodeConn | None = None
    delivered: list[int] = field(default_factory=list)  # tokens the client already has
    base: int = 0  # tokens delivered before the current placement


class FleetEngine(EngineBase):
    def __init__(self, cfg, tokenizer, n_ctx: int, pool: NodePool, *, policy: str = "load-aware",
                 grace: float = 1.0, log=None, hooks: Hooks = NO_HOOKS):
        super().__init__(cfg, tokenizer, log, hooks=hooks)
        self._n_ctx = n_ctx  # until a node says how large its window is
        self.pool = pool
        self.policy = policy
        self.grace = grace  # a gone node has this long to come back before its work moves
        self._placed: dict[str, _Placed] = {}
        self._rr = itertools.count()
        self._watcher: asyncio.Task | None = None
        self.embedder = FleetEmbedder(self)  # batches go to the nodes

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def nodes(self) -> list[NodeConn]:
        return self.pool.nodes

    @property
    def ready(self) -> bool:
        return self.pool.ready(self.model_id)

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    async def start(self) -> None:
        self.pool.attach(self)
        try:
            await self.pool.start()
        except BaseException:
            await self.pool.detach(self)
            raise
        self._watcher = asyncio.create_task(self._watch(), name=f"fleet-failover-{self.model_id}")
        self._fit_window()

    async def close(self, error: SuperfluidError | None = None) -> None:
        self.closed = True
        if self._watcher is not None:
            self._watcher.cancel()
        finish = FinishReason.ERROR if error else FinishReason.CANCELLED
        self.embedder.fail_all(error or WorkerUnavailable("the server is stopping"))
        for p in list(self._placed.values()):
            st = self._streams.get(p.req.id)
            if st is not None:
                self._end(st, st.final(finish, error))
            if p.node is not None and p.node.up:
                self.pool.cancel(p.node, p.req.id)
        self._placed.clear()
        await self.pool.detach(self)

    def _fit_window(self) -> None:
        """Requests are checked against the largest window a connected node offers."""
        windows = [n.window(self.model_id) for n in self.nodes if n.up]
        if windows and max(windows) > 0:
            self._n_ctx = max(windows)

    # -- the pool's calls ------------------------------------------------------------------
    def owns(self, gen: str) -> bool:
        return gen in self._placed or self.embedder.owns(gen)

    def placed_on(self, n: NodeConn) -> int:
        return sum(1 for p in self._placed.values() if p.node is n)

    @property
    def embed_window(self) -> int:
        return max((n.embed_window(self.model_id) for n in self.nodes if n.up), default=0)

    @property
    def model_kind(self) -> str:
        kinds = [x.kind for n in self.nodes if n.up for x in n.models if x.id == self.model_id]
        return kinds[0] if kinds else "generate"

    def on_embedded(self, n: NodeConn, body: m.EmbedResp) -> None:
        self.embedder.on_embedded(n, body)

    def node_up(self, n: NodeConn) -> dict[str, tuple[int, int]]:
        """A node (re)connected: our generations on it, as RECONCILE wants them. Embedding
        batches sent over its old link are answered there, if at all: they go out again."""
        self._fit_window()
        self.embedder.node_lost(n)
        view = {}
        for p in self._placed.values():
            if p.node is n:
                p.tracker.found()
                view[p.req.id] = (p.tracker.epoch, p.tracker.watermark)
        return view

    def node_lost(self, n: NodeConn, *, at: float, gens: tuple[str, ...] | None = None) -> None:
        """The link to n ended (at: when) or n refused us / lost them (at=0: move at once)."""
        if gens is None:
            self.embedder.node_lost(n)  # its embedding batches go to another node now
        for p in self._placed.values():
            if p.node is n and (gens is None or p.req.id in gens):
                p.tracker.lost(at)

    # -- the API's view ------------------------------------------------------------------
    def submit(self, req: GenRequest) -> AsyncIterator[Chunk]:
        self.last_used = self.clock()
        p = _Placed(req, Tracker(req.id, 0))
        self._place(p)  # raises when no node can take it
        st = self._stream_for(req)
        self._placed[req.id] = p
        return self._iterate(st)

    def _stream_for(self, req: GenRequest):
        from ..engine.delivery import Stream
        st = Stream(req)  # its chunks come whole from the node
        self._streams[req.id] = st
        return st

    def cancel(self, request_id: str) -> bool:
        p = self._placed.pop(request_id, None)
        st = self._streams.pop(request_id, None)
        if st is None:
            return False
        st.done = True
        if p is not None and p.node is not None and p.node.up and p.node.link is not None:
            self.pool.cancel(p.node, p.req.id)
        self._end(st, st.final(FinishReason.CANCELLED))
        return True

    def _fail(self, st, err: SuperfluidError) -> None:
        p = self._placed.pop(st.req.id, None)
        if p is not None and p.node is not None and p.node.up:
            self.pool.cancel(p.node, p.req.id)
        self._streams.pop(st.req.id, None)
        st.done = True
        st.queue.put_nowait(st.final(FinishReason.ERROR, err))

    @property
    def idle(self) -> bool:
        return not self._streams and not self.embedder.running

    def stats(self) -> EngineStats:
        return fleet_stats(self)

    @property
    def placed(self) -> int:
        """Generations of this model in progress on the nodes."""
        return len(self._placed)

    # -- placement -------------------------------------------------------------------------
    def _place(self, p: _Placed) -> None:
        need = len(p.req.prompt) + p.req.max_tokens
        load = {id(n): sum(e.placed_on(n) for e in self.pool.engines)
                for n in self.nodes}  # every model's generations share a node's lanes
        # the prompt as the node will hold it (a failover's includes what was delivered)
        want = wanted(list(p.req.prompt) + p.delivered, p.req.cache_ns) if self.policy == "load-aware" else []
        node = pick([n for n in self.nodes if n.up], self.model_id, need, self.policy, load, next(self._rr), want)
        if node is None:
            fits = [n.window(self.model_id) for n in self.nodes if n.up and n.serves(self.model_id)]
            if fits and max(fits) < need:
                raise ContextLengthExceeded(f"no fleet node has a context window for {need} tokens; the "
                                            f"largest is {max(fits)}", param="messages")
            raise WorkerUnavailable(f"no fleet node serving {self.model_id} is up to take the request; retry")
        node.placed_prompt(want)
        epoch = self.pool.epochs.next()
        if p.tracker.epoch == 0:
            p.tracker = Tracker(p.req.id, epoch)
        else:
            p.tracker.replace(epoch)
        p.node, p.base = node, len(p.delivered)
        r = p.req
        self.pool.send(node, m.GenerateReq(
            self.pool.cmds.next(), r.id, r.session or r.id, epoch, tuple(r.prompt) + tuple(p.delivered),
            r.sampling.to_wire(), r.max_tokens - len(p.delivered), tuple(r.stop), int(r.qos),
            spec_to_wire(r.channels), tuple(r.history) + tuple(p.delivered), self._speculate(r), r.persist,
            r.cache_ns))

    def _speculate(self, r: GenRequest) -> int:
        """The drafts per step the node may verify for this generation: the request's own, else
        this head's --speculative / --spec-max-tokens (a node honours the head's settings). A
        node drafts with its own drafter: the one it was started with (`node serve --speculative
        suffix`, or `draft --draft-model GGUF`), else prompt lookup."""
        if r.speculate is not None:
            return r.speculate
        return self.cfg.spec_tokens

    async def _watch(self) -> None:
        """Failover: work on a node gone for longer than `grace` moves."""
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()  # the pool marks a node gone on this clock
            for p in list(self._placed.values()):
                if p.tracker.failover_due(now, self.grace):
                    self._failover(p)

    def _failover(self, p: _Placed) -> None:
        old = p.node
        try:
            self._place(p)
        except SuperfluidError as e:
            if p.tracker.hopeless(time.monotonic(), self.grace):
                st = self._streams.get(p.req.id)
                self._placed.pop(p.req.id, None)
                if st is not None:
                    self._end(st, st.final(FinishReason.ERROR, e))
            return
        log.warning("re-placed %s from %s on %s (epoch %d, %d tokens delivered)", p.req.id,
                    old.addr if old else "?", p.node.addr if p.node else "?", p.tracker.epoch, len(p.delivered))
        if old is not None and old.up:
            self.pool.send(old, m.SessionRevoke(p.req.session or p.req.id, p.tracker.epoch))

    def on_tokens(self, n: NodeConn, body: m.TokenEvents) -> None:
        gen, epoch = body.gen, body.epoch
        p = self._placed.get(gen)
        if p is None or p.node is not n or p.tracker.epoch != epoch:
            # a stale epoch or a generation that moved away: never delivered; the node drops it
            if p is None or p.node is not n:
                self.pool.cancel(n, gen)
            return
        st = self._streams.get(gen)
        outs = []
        chunks = [(seq, m.chunk_from_wire(gen, w)) for seq, w in body.events]  # all checked before any counts
        n_vocab = self.tokenizer.n_vocab
        if any(not 0 <= t < n_vocab for _, c in chunks for t in c.tokens):
            raise ProtocolError(f"node {n.addr} sent token ids outside the model's vocabulary")
        for seq, c in chunks:
            if not p.tracker.accept(epoch, seq):
                continue
            if st is not None and st.n_out == 0 and c.tokens:
                self._timed(st)  # its time to first token, as the client sees it
            p.delivered += c.tokens
            if st is not None:
                st.n_out = len(p.delivered)  # the stream's count, for a final chunk off the token path
            c.prompt_tokens = len(p.req.prompt)
            c.completion_tokens += p.base
            if st is not None:
                outs.append((st, c))
            if c.finish is not None:
                self._placed.pop(gen, None)
                if st is not None:
                    st.done = True
                    self._streams.pop(gen, None)
                break
        self.pool.send(n, m.WatermarkAck(gen, epoch, p.tracker.watermark))
        self.out.publish(outs)
