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

from ..errors import (BadRequest, ContextLengthExceeded, EmbeddingUnsupported, ModelUnloaded, SuperfluidError,
                     WorkerCrashed)
from ..ids import new_id
from ..request import FinishReason, Qos
from ..sched.embeds import EmbedEvent, EmbedJob

if TYPE_CHECKING:
    from .local import Engine

_CANCELLED = FinishReason.CANCELLED


@dataclass(frozen=True, slots=True)
class EmbedInput:
    tokens: list[int]
    pair_at: int = 0  # >0: a (query, document) pair for a cross-encoder; the document starts here


MAX_TOKENS = 1 << 20  # tokens in one embedding request (2048 inputs of 512)


@dataclass
class _Wait:
    vectors: list[np.ndarray | None]
    future: asyncio.Future = field(repr=False)
    missing: int = 0


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
    if sum(len(x.tokens) for x in inputs) > MAX_TOKENS:
        raise BadRequest(f"one embedding request may hold at most {MAX_TOKENS} tokens", param="input")
    n_vocab = eng.tokenizer.n_vocab
    for i, x in enumerate(inputs):
        if not x.tokens:
            raise BadRequest(f"input {i} is empty", param="input")
        if len(x.tokens) > window:
            raise ContextLengthExceeded(
                f"input {i} has {len(x.tokens)} tokens; this model embeds at most {window} tokens per input "
                f"(ask for truncation to cut it)", param="input")
        ids = np.asarray(x.tokens, dtype=np.int64)  # one pass in C, not a call per token on the loop
        if ids.min() < 0 or ids.max() >= n_vocab:
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
        if eng.closed:
            raise ModelUnloaded(f"the model {eng.model_id} was unloaded; retry to load it again")
        check(eng, inputs)
        job = EmbedJob(new_id("emb"), [(tuple(x.tokens), x.pair_at) for x in inputs], qos)
        wait = _Wait([None] * len(inputs), asyncio.get_running_loop().create_future(), len(inputs))
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
            if wait.vectors[ev.index] is None:
                wait.missing -= 1
            wait.vectors[ev.index] = np.frombuffer(ev.data, dtype="<f4")
            if wait.missing == 0:
                self._waits.pop(ev.job_id, None)
                wait.future.set_result(wait.vectors)

    def fail(self, job_id: str, err: SuperfluidError) -> None:
        wait = self._waits.pop(job_id, None)
        self.engine.sched.finish(job_id, _CANCELLED)
        if wait is not None and not wait.future.done():
            wait.future.set_exception(err)

    def fail_all(self, err: SuperfluidError) -> None:
        """The engine stops, or its worker cannot be started: every waiting request ends."""
        for job_id, wait in list(self._waits.items()):
            self._waits.pop(job_id, None)
            self.engine.sched.finish(job_id, _CANCELLED)
            if not wait.future.done():
                wait.future.set_exception(err)

