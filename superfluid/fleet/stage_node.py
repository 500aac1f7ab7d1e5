"""A pipeline stage node (`superfluid node serve --stage`): the layers a head assigns, behind
Link F, with a KV cache per session for those layers.

The head's worker (runtime/pipeline.py) says which layers to hold (STAGE_LOAD), then sends
STAGE_FORWARD_REQ with token ids (first stage) or activations (the others) for several of
its lanes at once; the stage runs them as one batched pass of runtime/stage.py's StageModel
and answers activations, or logits on the last stage. Each head's requests are answered in
the order they came (one task per head); the forward itself runs in a thread so keepalives
go on. Sessions are namespaced by the head's instance id; a head whose link ends loses its
sessions here (its worker starts over and re-prefills)."""

from __future__ import annotations

import asyncio
import itertools
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
        self._serial: dict[_Head, int] = {}  # a head connection's namespace for its sessions (never reused)
        self._serials = itertools.count(1)
        self._loading: dict[tuple[int, int], asyncio.Future] = {}
        self._compute = asyncio.Lock()  # one forward at a time: they share the cores
        self.tokens_fed = 0  # tokens through this stage's layers, every head together

    def hello_ack(self) -> m.HelloAck:
        return m.HelloAck(m.VERSION, self.node_id, (), m.NodeStatus(**self.status()),
                          stage={"model": self.model_id, "n_layer": self.n_layer, "mem": _memory()})

    def status(self) -> dict:
        return {"lanes": 0, "running": 0, "waiting": 0, "kv_used": 0, "kv_total": 0,
                "stages": [list(r) for r in self._models], "tokens_fed": self.tokens_fed,
                "sessions": sum(s.sessions() for s in self._models.values())}

    def _on_message(self, head: _Head, kind: int, body: Any) -> None:
        if kind in (m.STAGE_LOAD, m.STAGE_FORWARD_REQ, m.STAGE_COPY, m.STAGE_DROP):
            if head not in self._queues:
                self._queues[head] = asyncio.Queue()
                self._serial[head] = next(self._serials)
                self._workers[head] = asyncio.create_task(self._serve_head(head))
            self._queues[head].put_nowait((kind, body))
        elif kind in (m.GENERATE_REQ, m.RECONCILE):
            raise ProtocolError("this node is a pipeline stage: it takes stage requests, not generations")
        else:
            super()._on_message(head, kind, body)

    def head_gone(self, head: _Head) -> None:
        """The head's link ended: its task finishes what it is running, then lets go of the
        head's sessions and layers (never mid-forward: the pass runs in a thread)."""
        q = self._queues.get(head)
        if q is not None:
            q.put_nowait(None)

    def _release(self, head: _Head) -> None:
        rng = self._range.pop(head, None)
        serial = self._serial.pop(head, None)
        self._queues.pop(head, None)
        self._workers.pop(head, None)
        if rng is not None:
            self._leave(head, serial, rng)

    def _leave(self, head: _Head, serial: int | None, rng: tuple[int, int]) -> None:
        """The head's sessions on these layers go; the layers too when nobody else uses them."""
        model = self._models.get(rng)
        if model is None:
            return
        for key in [k for k in model.session_keys() if isinstance(k, tuple) and k[0] == serial]:
            model.drop(key)
        users = self._users.get(rng, set())
        users.discard(head)
        if not users:  # nobody uses these layers any more: free them
            self._models.pop(rng, None)
            self._users.pop(rng, None)
            log.info("released layers [%d, %d)", *rng)

    async def _serve_head(self, head: _Head) -> None:
        """One head's stage requests, answered in the order they came. Any failure of one
        request is answered as an error (the head's worker fails the step); none ends the
        task, so nothing waits forever."""
        q = self._queues[head]
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                kind, body = item
                try:
                    reply = await self._handle(head, kind, body)
                except Exception as e:  # a bad request, a failed pass (bad ids, out of memory), a failed load
                    if not isinstance(e, (KeyError, TypeError, ValueError, ProtocolError)):
                        log.exception("stage request from %s failed", head.link.peer)
                    else:
                        log.warning("stage request from %s refused: %s", head.link.peer, e)
                    reply = None  # copy and drop have no answer; a later forward of the lane fails instead
                    why = e.message if isinstance(e, ProtocolError) else f"{type(e).__name__}: {e}"
                    if kind == m.STAGE_LOAD:
                        reply = m.StageReady(error=why)
                    elif kind == m.STAGE_FORWARD_REQ:
                        reply = m.StageForwardResp(body.get("id") if isinstance(body, dict) else None, error=why)
                if reply is not None:
                    try:
                        head.link.send(reply)
                    except ConnectionError:
                        return
                    except ProtocolError as e:  # e.g. a reply over the frame cap
                        head.link.send(m.StageForwardResp(reply.id, error=e.message)
                                       if isinstance(reply, m.StageForwardResp) else m.StageReady(error=e.message))
        finally:
            self._release(head)

    async def _handle(self, head: _Head, kind: int, body: dict) -> m.Record | None:
        if kind == m.STAGE_LOAD:
            load = m.StageLoad.from_wire(body)
            return await self._load(head, load.first, load.last)
        model = self._models[self._range[head]]
        ns = self._serial[head]
        if kind == m.STAGE_COPY:
            copy = m.StageCopy.from_wire(body)
            if copy.n < 0:
                raise ValueError(f"copy of {copy.n!r} positions")
            model.copy((ns, copy.src), (ns, copy.dst), copy.n)
            return None
        if kind == m.STAGE_DROP:
            for s in m.StageDrop.from_wire(body).sessions:
                model.drop((ns, s))
            return None
        req = m.StageForwardReq.from_wire(body)
        items, want = [], []
        for session, pos, tokens, hidden, w in req.items:
            if (not tokens) if model.is_first else (hidden is None):
                raise ValueError("the first stage takes tokens, the others activations")
            x: Any
            if model.is_first:
                x = list(tokens or ())
                if any(not 0 <= t < model.n_vocab for t in x):
                    raise ValueError(f"a token id outside the vocabulary of {model.n_vocab}")
            else:
                x = m.unpack_array(hidden)
                if x.shape[1] != model.hidden_size:
                    raise ValueError(f"activations of width {x.shape[1]}; this model's is {model.hidden_size}")
            if isinstance(w, bool):
                w = int(w)
            if not isinstance(w, int) or not 0 <= w <= min(m.STAGE_ROWS, len(x)):
                raise ValueError(f"want {w!r}: logits rows are 0 to {m.STAGE_ROWS}, at most the item's length")
            items.append(((ns, session), pos, x))
            want.append(w)
        async with self._compute:
            outs = await asyncio.to_thread(model.run, items, want)
        self.tokens_fed += sum(len(x) for _, _, x in items)
        return m.StageForwardResp(req.id, tuple(None if o is None else m.pack_array(
            o.reshape(1, -1) if o.ndim == 1 else o) for o in outs))

    async def _load(self, head: _Head, first: int, last: int) -> m.StageReady:
        if not 0 <= first < last <= self.n_layer:
            raise ValueError(f"layers [{first}, {last}) are not within the model's {self.n_layer}")
        rng = (first, last)
        old = self._range.get(head)
        if old is not None and old != rng:  # the head's layers change: its sessions there go
            self._leave(head, self._serial.get(head), old)
        if rng not in self._models:
            task = self._loading.get(rng)
            if task is None:  # one load per range, shared by heads, finished even if they leave
                task = self._loading[rng] = asyncio.ensure_future(self._load_range(rng))
            try:
                await asyncio.shield(task)
            finally:
                if task.done():
                    self._loading.pop(rng, None)
        self._range[head] = rng
        self._users.setdefault(rng, set()).add(head)
        model = self._models[rng]
        return m.StageReady(first, last, int(model.n_params), self.n_layer, int(model.n_vocab),
                            int(model.hidden_size), int(getattr(model.config, "max_position_embeddings", 0) or 0),
                            rows=m.STAGE_ROWS)

    async def _load_range(self, rng: tuple[int, int]) -> None:
        from ..runtime.stage import StageModel
        t0 = time.monotonic()
        async with self._compute:
            if rng not in self._models:
                self._models[rng] = await asyncio.to_thread(StageModel, self.source, *rng, threads=self.threads)
        log.info("holding layers [%d, %d) of %d: %d parameters, loaded in %.1f s", *rng, self.n_layer,
                 self._models[rng].n_params, time.monotonic() - t0)


def _layers(source: str) -> int:
    """The model's layer count, from a Hugging Face folder's config or the GGUF's metadata
    (a stage reads the GGUF in place: it is never converted whole)."""
    import json
    from pathlib import Path

    from ..runtime.hf_convert import gguf_weights, is_hf_dir
    if is_hf_dir(source):
        return int(json.loads((Path(source) / "config.json").read_text())["num_hidden_layers"])
    return int(gguf_weights(source).config["num_hidden_layers"])  # kept: each load reuses it


def _memory() -> int:
    from ..runtime.registry import available_memory
    return available_memory()
