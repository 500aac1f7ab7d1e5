"""Embeddings through the fleet head: the head's FleetEngine answers embedding requests by
sending batches to the nodes that serve the model (EMBED_REQ / EMBED_RESP over Link F).

A request is split into batches of at most EMBED_BATCH inputs (a frame stays far under its
cap, and the nodes share a big indexing job). Each batch goes to the least busy node whose
embedding window fits it. Embedding is idempotent: a batch whose node is lost is sent to
another node at once; no retry buffer, no epochs."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from ..engine.embedding import EmbedInput, check
from ..errors import EmbeddingUnsupported, ProtocolError, SuperfluidError, WorkerCrashed, WorkerUnavailable
from ..link import messages as m
from ..request import Qos

if TYPE_CHECKING:
    from .pool import NodeConn

log = logging.getLogger("superfluid.fleet")

EMBED_BATCH = 64  # inputs per batch: 64 vectors of 16384 floats are 4 MiB, far under the frame cap
NODE_WAIT_S = 10.0  # how long a batch waits for a node serving the model to be up


class _NodeLost(Exception):
    pass


class FleetEmbedder:
    def __init__(self, engine):
        self.engine = engine
        self._ids = itertools.count(1)
        self._waits: dict[str, tuple[asyncio.Future, NodeConn, int]] = {}  # id -> (answer, node, inputs)

    @property
    def running(self) -> int:
        return len(self._waits)

    def owns(self, rid: str) -> bool:
        return rid in self._waits

    def load(self, n: NodeConn) -> int:
        return sum(1 for _, node, _ in self._waits.values() if node is n)

    async def embed(self, inputs: list[EmbedInput], qos: Qos = Qos.EMBEDDING) -> list[np.ndarray]:
        check(self.engine, inputs)
        parts = [inputs[i:i + EMBED_BATCH] for i in range(0, len(inputs), EMBED_BATCH)]
        tasks = [asyncio.ensure_future(self._batch(p, qos)) for p in parts]
        try:
            results = await asyncio.gather(*tasks)
        finally:  # one batch failed, or the client went away: the others stop waiting
            for t in tasks:
                t.cancel()
        return [v for r in results for v in r]

    async def _batch(self, inputs: list[EmbedInput], qos: Qos) -> list[np.ndarray]:
        eng = self.engine
        need = max(len(x.tokens) for x in inputs)
        deadline = time.monotonic() + NODE_WAIT_S
        while True:
            nodes = [n for n in eng.nodes if n.up and n.embed_window(eng.model_id) >= need]
            if not nodes:
                if time.monotonic() > deadline:
                    raise WorkerUnavailable(f"no fleet node that embeds with {eng.model_id} is up; retry")
                await asyncio.sleep(0.1)
                continue
            node = min(nodes, key=lambda n: (self.load(n) + int((n.status or {}).get("waiting", 0)),
                                             eng.placed_on(n)))
            rid = f"{eng.model_id}#{next(self._ids)}"
            fut: asyncio.Future = asyncio.get_running_loop().create_future()
            self._waits[rid] = (fut, node, len(inputs))
            eng.pool.send(node, m.EmbedReq(rid, tuple((tuple(x.tokens), x.pair_at) for x in inputs), int(qos)))
            try:
                return await fut
            except _NodeLost:
                log.warning("embedding batch %s: node %s was lost; sending it to another node", rid, node.addr)
                continue  # idempotent: send it to another node
            finally:
                self._waits.pop(rid, None)

    def on_embedded(self, n: NodeConn, body: m.EmbedResp) -> None:
        got = self._waits.get(body.id)
        if got is None or got[1] is not n or got[0].done():
            return
        fut, _, count = got
        if body.error is not None:
            code, message = body.error
            fut.set_exception(EmbeddingUnsupported(message, param="model") if code == EmbeddingUnsupported.code
                              else WorkerCrashed(f"the node reported: {message}", code=code))
            return
        vecs = [np.frombuffer(v, dtype="<f4") for v in body.vectors or ()]
        if len(vecs) != count or len({len(v) for v in vecs}) > 1:
            raise ProtocolError(f"EMBED_RESP has {len(vecs)} vectors of mixed or wrong sizes for {count} inputs")
        fut.set_result(vecs)

    def node_lost(self, n: NodeConn) -> None:
        for fut, node, _ in self._waits.values():
            if node is n and not fut.done():
                fut.set_exception(_NodeLost())

    def fail_all(self, err: SuperfluidError) -> None:
        for fut, _, _ in self._waits.values():
            if not fut.done():
                fut.set_exception(err)
