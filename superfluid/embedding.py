"""A model's embedding requests: checked once, queued as one scheduler job, answered with
one float32 vector per input in input order.

The engine owns one Embedder. An embedding request is not a session: nothing reaches the
session log. A client that goes away cancels its job; inputs already sent finish in their
step and are dropped."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .errors import BadRequest, ContextLengthExceeded, EmbeddingUnsupported, SuperfluidError, WorkerCrashed
from .ids import new_id
from .request import FinishReason, Qos
from .sched.embeds import EmbedEvent, EmbedJob

if TYPE_CHECKING:
    from .engine import Engine

_CANCELLED = FinishReason.CANCELLED


@dataclass(frozen=True, slots=True)
class EmbedInput:
    tokens: list[int]
    pair_at: int = 0  # >0: a (query, document) pair for a cross-encoder; the document starts here


@dataclass
class _Wait:
    vectors: list[np.ndarray | None]
    future: asyncio.Future = field(repr=False)


def _error(code: str, message: str) -> SuperfluidError:
    if code == EmbeddingUnsupported.code:
        return EmbeddingUnsupported(message, param="model")
    return WorkerCrashed(f"the model failed to embed: {message}")


def check(eng, inputs: list[EmbedInput]) -> None:
    """Raise the typed error inputs that this engine (local or fleet) can never embed get."""
    window, kind = eng.embed_window, eng.model_kind
    if not window:
        raise EmbeddingUnsupported(f"the model {eng.model_id} cannot embed", param="model")
    pairs = any(x.pair_at for x in inputs)
    if kind == "cross-encoder" and not pairs:
        raise EmbeddingUnsupported(f"the model {eng.model_id} is a cross-encoder: it scores (query, document) "
                                   f"pairs with /v1/rerank and cannot embed", param="model")
    if pairs and kind != "cross-encoder":
        raise EmbeddingUnsupported(f"the model {eng.model_id} is not a cross-encoder: it cannot score pairs",
                                   param="model")
    if not inputs:
        raise BadRequest("there is nothing to embed", param="input")
    valid = eng.tokenizer.valid
    for i, x in enumerate(inputs):
        if not x.tokens:
            raise BadRequest(f"input {i} is empty", param="input")
        if len(x.tokens) > window:
            raise ContextLengthExceeded(
                f"input {i} has {len(x.tokens)} tokens; this model embeds at most {window} tokens per input "
                f"(ask for truncation to cut it)", param="input")
        if not all(valid(t) for t in x.tokens):
            raise BadRequest(f"input {i} has token ids outside the vocabulary", param="input")


class Embedder:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._waits: dict[str, _Wait] = {}

    @property
    def running(self) -> int:
        return len(self._waits)

    async def embed(self, inputs: list[EmbedInput], qos: Qos = Qos.EMBEDDING) -> list[np.ndarray]:
        """One vector per input, in order; raises a typed error if any input fails."""
        eng = self.engine
        check(eng, inputs)
        job = EmbedJob(new_id("emb"), [(tuple(x.tokens), x.pair_at) for x in inputs], qos)
        wait = _Wait([None] * len(inputs), asyncio.get_running_loop().create_future())
        self._waits[job.id] = wait
        eng.sched.add_embed(job)
        eng.wake()
        try:
            return await wait.future
        finally:
            if self._waits.pop(job.id, None) is not None:  # cancelled (the client went away)
                eng.sched.finish(job.id, _CANCELLED)
                eng.wake()

    def deliver(self, events: list[EmbedEvent]) -> None:
        for ev in events:
            wait = self._waits.get(ev.job_id)
            if wait is None or wait.future.done():
                continue
            if ev.error:
                self._waits.pop(ev.job_id, None)
                self.engine.sched.finish(ev.job_id, _CANCELLED)
                wait.future.set_exception(_error(ev.code, ev.error))
                continue
            wait.vectors[ev.index] = np.frombuffer(ev.data, dtype="<f4")
            if all(v is not None for v in wait.vectors):
                self._waits.pop(ev.job_id, None)
                wait.future.set_result(wait.vectors)

    def fail_all(self, err: SuperfluidError) -> None:
        """The engine stops, or its worker cannot be started: every waiting request ends."""
        for job_id, wait in list(self._waits.items()):
            self._waits.pop(job_id, None)
            self.engine.sched.finish(job_id, _CANCELLED)
            if not wait.future.done():
                wait.future.set_exception(err)

