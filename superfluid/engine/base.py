"""What the local engine (engine/local.Engine) and the fleet head's engine (fleet/head.FleetEngine)
share, so that neither inherits from the other: the model's codec (tokenizer, chat
template, tool format, reasoning markers), the request check, the open streams and their
delivery (delivery.py commits a chunk to the session log before its client sees it), and
first-token timing. Generation itself (submit, cancel, stats, the lifecycle) is each
engine's own; engine.contract.EngineAPI is the contract both meet."""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..codec.model import Codec
from ..codec.tokenizer import Tokenizer
from ..config import EngineConfig
from .contract import NO_HOOKS, Hooks
from .delivery import Deliveries, SessionLog
from .delivery import Stream as _Stream
from ..errors import BadRequest, ContextLengthExceeded, EmbeddingUnsupported, ModelUnloaded, SuperfluidError
from ..request import Chunk, GenRequest, Qos
from .sampling_defaults import from_gguf, merged
from ..runtime.base import ModelInfo

TTFT_KEPT = 256  # first-token latencies the monitor's p50/p95 are over


class EngineBase:
    """A model's codec and open streams. Subclasses provide n_ctx, model_kind, embedder,
    cancel() and _fail() (a stream whose log commit failed)."""

    embedder: Any  # embedding.Embedder or fleet/embeds.FleetEmbedder

    def __init__(self, cfg: EngineConfig, tokenizer: Tokenizer, log: SessionLog | None = None, *,
                 hooks: Hooks = NO_HOOKS, clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.model_id = cfg.model_id
        self.codec = Codec.of(tokenizer, cfg.chat_template, cfg.tool_dialect)
        self.tokenizer = tokenizer
        self.template = self.codec.template
        self.tool_format = self.codec.tool_format
        self.reasoning = self.codec.reasoning
        self.info: ModelInfo | None = None
        self.offload: Any = None  # runtime/offload.Offload: the layers on a GPU (None: not decided here)
        self.hooks = hooks  # the metrics it reports to
        self.clock = clock  # what idle time and pin deadlines are read on
        self.recent_ttft: deque[float] = deque(maxlen=TTFT_KEPT)  # for the monitor's p50/p95
        self.last_used = clock()
        self._streams: dict[str, _Stream] = {}
        self.log = log  # where a session-backed generation's output is committed (the service's log)
        self.out = Deliveries(log, self._fail, cfg.stream_interval_ms / 1000)
        self.closed = False  # close() ran: nothing new is taken
        # what a request that leaves a sampling parameter out gets (before its API's own default)
        meta = getattr(tokenizer, "meta", None)
        self.sampling_defaults = merged(from_gguf(meta) if meta else {}, cfg.sampling)

    # -- supplied by each engine -------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        raise NotImplementedError

    @property
    def model_kind(self) -> str:
        raise NotImplementedError

    def cancel(self, request_id: str) -> bool:
        raise NotImplementedError

    def _fail(self, st: _Stream, err: SuperfluidError) -> None:
        raise NotImplementedError

    @property
    def queued(self) -> int:
        """Generations waiting here for a lane (a fleet head queues nothing: nodes do)."""
        return 0

    # -- shared ------------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode_prompt(text)

    @staticmethod
    def new_seed() -> int:
        return secrets.randbits(63)

    def check(self, req: GenRequest) -> None:
        """Raise the typed error a request that can never run gets. This is the one check of
        a request (its window included): the service runs it before the prompt is committed,
        a fleet node before it takes a head's request; submit() trusts it."""
        if self.closed:
            raise ModelUnloaded(f"the model {self.model_id} was unloaded; retry to load it again")
        if self.model_kind != "generate":
            raise EmbeddingUnsupported(f"the model {self.model_id} is an {self.model_kind} model: it cannot generate "
                                       f"text (use /v1/embeddings or /v1/rerank)", param="model")
        if not req.prompt:
            raise BadRequest("the prompt is empty", param="messages")
        if any(not self.tokenizer.valid(t) for t in req.prompt):
            raise BadRequest("the prompt has token ids outside the vocabulary", param="prompt")
        if len(req.prompt) >= self.n_ctx:
            raise ContextLengthExceeded.over(len(req.prompt), self.n_ctx)
        if req.max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1", param="max_tokens")
        if len(req.prompt) + req.max_tokens > self.n_ctx:
            raise ContextLengthExceeded.over(len(req.prompt), self.n_ctx, req.max_tokens)
        if req.id in self._streams:
            raise BadRequest(f"request id {req.id} is already running")

    async def embed(self, inputs, qos: Qos = Qos.EMBEDDING):
        """One float32 vector per input (embedding.EmbedInput), batched by the engine's embedder."""
        self.last_used = self.clock()
        if self.closed:
            raise ModelUnloaded(f"the model {self.model_id} was unloaded; retry to load it again")
        return await self.embedder.embed(inputs, qos)

    def pinned(self, session: str) -> bool:
        return False  # pins are the local scheduler's (engine/local.py)

    def keep_running(self, request_id: str) -> None:
        """Its consumer going away does not cancel it: someone else (a resumed stream,
        a grace timer) decides."""
        st = self._streams.get(request_id)
        if st is not None:
            st.keep = True

    async def _iterate(self, st: _Stream) -> AsyncIterator[Chunk]:
        try:
            while True:
                chunk = await st.queue.get()
                yield chunk
                if chunk.finish is not None:
                    return
        finally:
            if not st.done and not st.keep:
                self.cancel(st.req.id)

    def _end(self, st: _Stream, chunk: Chunk) -> None:
        """End a stream off the token path (worker or node lost, stopping): the log says how."""
        st.done = True
        self._streams.pop(st.req.id, None)
        self.out.flush()  # its tokens held for the stream interval go into the log before its end
        if st.req.session is not None and self.log is not None and chunk.finish is not None:
            self.log.end(st.req, chunk.finish)
        self.out.push(st, chunk)

    def _timed(self, st: _Stream) -> None:
        """A token for `st` arrived now: its time to first token, or since its last one."""
        now = time.monotonic()
        if st.n_out == 0:
            st.ttft_s = now - st.t_submit
            self.recent_ttft.append(st.ttft_s)
            if self.hooks.ttft is not None:
                self.hooks.ttft(st.ttft_s)
        elif self.hooks.itl is not None:
            self.hooks.itl(now - st.t_last)
        st.t_last = now
