"""A pipeline stage node (`superfluid node serve --stage`): the layers a head assigns, behind
Link F, with a KV cache per session for those layers.

The head's worker (fleet/pipeline.py) says which layers to hold (STAGE_LOAD), then sends
STAGE_FORWARD_REQ with token ids (first stage) or activations (the others) for several of
its lanes at once; the stage runs them as one batched pass of runtime/stage.py's StageModel
and answers activations, or logits on the last stage. Each head's requests are answered in
the order they came (one task per head); the forward itself runs in a thread so keepalives
go on. Sessions are namespaced by the head's instance id; a head whose link ends loses its
sessions here (its worker starts over and re-prefills)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..errors import ProtocolError
from ..link import messages as m
from .node import NodeServer, _Head

log = logging.getLogger("superfluid.node")


class StageServer(NodeServer):
    def __init__(self, source: str, model_id: str, psk: bytes | None, *, threads: int = 1,
                 node_id: str | None = None, lease_s: float = 10.0):
        super().__init__(None, psk, node_id=node_id, lease_s=lease_s)
        self.source, self.model_id, self.threads = source, model_id, threads
        self.n_layer = _layers(source)
        self._models: dict[tuple[int, int], Any] = {}  # (first, last) -> StageModel
        self._users: dict[tuple[int, int], set[_Head]] = {}
        self._range: dict[_Head, tuple[int, int]] = {}
        self._queues: dict[_Head, asyncio.Queue] = {}
        self._workers: dict[_Head, asyncio.Task] = {}
        self._compute = asyncio.Lock()  # one forward at a time: they share the cores
        self.tokens_fed = 0  # tokens through this stage's layers, every head together

    def hello_ack(self) -> dict:
        return {"version": m.VERSION, "node": self.node_id, "models": [],
                "stage": {"model": self.model_id, "n_layer": self.n_layer, "mem": _memory()},
                "status": self.status()}

    def status(self) -> dict:
        return {"lanes": 0, "running": 0, "waiting": 0, "kv_used": 0, "kv_total": 0,
                "stages": [list(r) for r in self._models], "tokens_fed": self.tokens_fed,
                "sessions": sum(s.sessions() for s in self._models.values())}

    def _on_message(self, head: _Head, kind: int, body: dict) -> None:
        if kind in (m.STAGE_LOAD, m.STAGE_FORWARD_REQ, m.STAGE_COPY, m.STAGE_DROP):
            if head not in self._queues:
                self._queues[head] = asyncio.Queue()
                self._workers[head] = asyncio.create_task(self._serve_head(head))
            self._queues[head].put_nowait((kind, body))
        elif kind in (m.GENERATE_REQ, m.RECONCILE):
            raise ProtocolError("this node is a pipeline stage: it takes stage requests, not generations")
        else:
            super()._on_message(head, kind, body)

    def head_gone(self, head: _Head) -> None:
        task = self._workers.pop(head, None)
        if task is not None:
            task.cancel()
        self._queues.pop(head, None)
        rng = self._range.pop(head, None)
        if rng is not None:
            self._release(head, rng)

    def _release(self, head: _Head, rng: tuple[int, int]) -> None:
        model = self._models.get(rng)
        if model is None:
            return
        for key in [k for k in list(model._kv) if isinstance(k, tuple) and k[0] == id(head)]:
            model.drop(key)
        users = self._users.get(rng, set())
        users.discard(head)
        if not users:  # nobody uses these layers any more: free them
            self._models.pop(rng, None)
            self._users.pop(rng, None)
            log.info("released layers [%d, %d)", *rng)

    async def _serve_head(self, head: _Head) -> None:
        q = self._queues[head]
        while True:
            kind, body = await q.get()
            try:
                reply = await self._handle(head, kind, body)
            except (KeyError, TypeError, ValueError, AttributeError, ProtocolError) as e:
                log.warning("stage request from %s refused: %s", head.link.peer, e)
                reply = None  # copy and drop have no answer; a later forward of the lane fails instead
                if kind in (m.STAGE_LOAD, m.STAGE_FORWARD_REQ):
                    reply = (m.STAGE_FORWARD_RESP if kind == m.STAGE_FORWARD_REQ else m.STAGE_READY,
                             {"id": body.get("id") if isinstance(body, dict) else None, "error": str(e)})
            if reply is not None:
                try:
                    head.link.send(*reply)
                except ConnectionError:
                    return

    async def _handle(self, head: _Head, kind: int, body: dict):
        if kind == m.STAGE_LOAD:
            return m.STAGE_READY, await self._load(head, int(body["first"]), int(body["last"]))
        model = self._models[self._range[head]]
        if kind == m.STAGE_COPY:
            model.copy((id(head), body["src"]), (id(head), body["dst"]), int(body["n"]))
            return None
        if kind == m.STAGE_DROP:
            for s in body["sessions"]:
                model.drop((id(head), s))
            return None
        items, want = [], []
        for session, pos, tokens, hidden, w in body["items"]:
            if (not tokens) if model.is_first else (hidden is None):
                raise ValueError("the first stage takes tokens, the others activations")
            x = list(tokens) if model.is_first else m.unpack_array(hidden)
            items.append(((id(head), session), int(pos), x))
            want.append(bool(w))
        async with self._compute:
            outs = await asyncio.to_thread(model.run, items, want)
        self.tokens_fed += sum(len(x) for _, _, x in items)
        return m.STAGE_FORWARD_RESP, {"id": body["id"], "outs": [None if o is None else m.pack_array(
            o.reshape(1, -1) if o.ndim == 1 else o) for o in outs]}

    async def _load(self, head: _Head, first: int, last: int) -> dict:
        if not 0 <= first < last <= self.n_layer:
            raise ValueError(f"layers [{first}, {last}) are not within the model's {self.n_layer}")
        old = self._range.get(head)
        if old is not None and old != (first, last):
            self._release(head, old)
        rng = (first, last)
        if rng not in self._models:
            from ..runtime.stage import StageModel
            t0 = time.monotonic()
            async with self._compute:
                self._models[rng] = await asyncio.to_thread(StageModel, self.source, first, last,
                                                            threads=self.threads)
            log.info("holding layers [%d, %d) of %d: %d parameters, loaded in %.1f s", first, last, self.n_layer,
                     self._models[rng].n_params, time.monotonic() - t0)
        self._range[head] = rng
        self._users.setdefault(rng, set()).add(head)
        model = self._models[rng]
        return {"first": first, "last": last, "n_params": model.n_params, "n_layer": self.n_layer,
                "n_vocab": model.n_vocab, "n_ctx_train": int(getattr(model.config, "max_position_embeddings", 0) or 0)}


def _layers(source: str) -> int:
    import json

    from ..runtime.hf_convert import hf_dir
    return int(json.loads((hf_dir(source) / "config.json").read_text())["num_hidden_layers"])


def _memory() -> int:
    from ..runtime.registry import available_memory
    return available_memory()
