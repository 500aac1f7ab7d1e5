"""The one exception tree. Every error a user can cause is a subclass of SuperfluidError
with an HTTP status and an OpenAI-style type/code; foreign errors are mapped at the boundary."""

from __future__ import annotations

from dataclasses import dataclass


class SuperfluidError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class BadRequest(SuperfluidError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    """A prompt (or prompt + max_tokens) over the model's window. The body is OpenAI's
    (code `context_length_exceeded`) with llama-server's type and its two counts, which
    clients of llama-server read to trim their history (`n_prompt_tokens`, `n_ctx`)."""
    type = "exceed_context_size_error"
    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 n_prompt_tokens: int | None = None, n_ctx: int | None = None):
        super().__init__(message, param=param, code=code)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx

    @classmethod
    def over(cls, n_prompt: int, n_ctx: int, asked: int | None = None, *, param: str = "messages",
             what: str = "the prompt") -> ContextLengthExceeded:
        """The one wording, with both clients' phrases: llama-server's "exceeds the available
        context size" and OpenAI's "maximum context length"."""
        total = n_prompt if asked is None else n_prompt + asked
        detail = (f"{what} alone has {n_prompt}" if asked is None
                  else f"{n_prompt} in {what}, {asked} for the completion")
        return cls(f"the request ({total} tokens) exceeds the available context size ({n_ctx} tokens): this "
                   f"model's maximum context length is {n_ctx} tokens ({detail})", param=param,
                   n_prompt_tokens=n_prompt, n_ctx=n_ctx)

    def body(self) -> dict:
        out = super().body()
        if self.n_prompt_tokens is not None:
            out["error"].update(n_prompt_tokens=self.n_prompt_tokens, n_ctx=self.n_ctx)
        return out


class ModelNotFound(SuperfluidError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLarge(SuperfluidError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class WorkerCrashed(SuperfluidError):
    """The worker process died while the request was in flight."""
    code = "worker_crashed"


class WorkerUnavailable(SuperfluidError):
    """The worker could not be (re)started; the next request retries."""
    status = 503
    code = "worker_unavailable"


class ModelUnloaded(SuperfluidError):
    """The model was unloaded while the request ran; the next request loads it again."""
    status = 503
    code = "model_unloaded"


class Forbidden(SuperfluidError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class ProtocolError(SuperfluidError):
    """A peer sent bytes that are not a valid frame or message (fatal for that link)."""
    code = "protocol_error"


class ModelLoadError(SuperfluidError):
    """A model file is missing or not something we can serve."""
    status = 400
    type = "invalid_request_error"
    code = "model_load_error"


class SessionNotFound(SuperfluidError):
    status = 404
    type = "invalid_request_error"
    code = "session_not_found"


class SessionBusy(SuperfluidError):
    """A session runs one generation (or turn change) at a time."""
    status = 409
    type = "invalid_request_error"
    code = "session_busy"


class QueueFull(SuperfluidError):
    """The model's queue is full (--max-queue): retry after a moment."""
    status = 503
    code = "queue_full"
    retry_after = 2.0


class TooManyPins(SuperfluidError):
    """Only --kv-slots minus --max-batch slots may be pinned: every lane must find a slot."""
    status = 409
    type = "invalid_request_error"
    code = "too_many_pins"


class StaleEpoch(SuperfluidError):
    """An append from an owner whose epoch was bumped (a pre-crash or replaced owner)."""
    status = 409
    type = "invalid_request_error"
    code = "stale_epoch"


class StoreError(SuperfluidError):
    """The session store could not commit (disk full, I/O error); nothing was half-written."""
    code = "store_error"


class StoreFull(StoreError):
    """The session store reached its size cap (--sessions-max-mb) or the disk is full: nothing
    of the request was saved; purging or deleting sessions frees room (HTTP's 507)."""
    status = 507
    code = "store_full"


class StoreUnreadable(SuperfluidError):
    """The session store on disk is not a store we can read; we refuse to touch it."""
    code = "store_unreadable"


class StoreLocked(SuperfluidError):
    """Another daemon already owns the sessions directory."""
    code = "store_locked"


class EmbeddingUnsupported(BadRequest):
    """The model cannot do what was asked: embed (a model without the runtime support), score
    pairs (not a cross-encoder), or generate (an embedding-only model)."""
    code = "model_not_supported"


class NotSupported(SuperfluidError):
    """A route or option this server knows but does not offer (llama-server's POST /props)."""
    status = 501
    type = "not_supported_error"
    code = "not_supported"


# -- across a link ---------------------------------------------------------------------------
# The request's own errors that a worker's runtime may raise for one lane (a grammar it cannot
# compile against the model's vocabulary, an input it refuses). They cross Link W by class name
# and only these names are taken back: a name from the wire never picks any other class.
LINKED: dict[str, type[SuperfluidError]] = {c.__name__: c for c in (
    BadRequest, ContextLengthExceeded, EmbeddingUnsupported, PayloadTooLarge)}
MESSAGE_MAX = 1000  # characters of a message that crosses a link (a grammar error quotes the grammar)
NAME_MAX = 64  # characters of a code or param


def _bounded(text: object, limit: int) -> str:
    s = text if isinstance(text, str) else str(text)
    return s if len(s) <= limit else s[:limit - 1] + "\u2026"


@dataclass(frozen=True, slots=True)
class ErrorReport:
    """An error as it crosses a link (plan.LaneError: one lane's own failure in the worker).
    `kind` names a LINKED class: the client then gets the same class, status, code and param
    it would get had the error been raised in the daemon. Anything else (kind ""), a bug or a
    runtime fault, crosses as a server error (500) with its message and code."""
    message: str
    code: str | None = None
    kind: str = ""
    param: str | None = None

    @classmethod
    def of(cls, e: BaseException, code: str = "generation_failed") -> ErrorReport:
        """How the worker reports `e`: typed when it is (a subclass of) a LINKED class."""
        if not isinstance(e, SuperfluidError):
            return cls(_bounded(f"{type(e).__name__}: {e}", MESSAGE_MAX), code)
        kind = next((k.__name__ for k in type(e).__mro__ if LINKED.get(k.__name__) is k), "")
        return cls.from_wire([kind, e.message, e.code or (None if kind else code), e.param])

    def to_wire(self) -> list:
        return [self.kind, self.message, self.code, self.param]

    @classmethod
    def from_wire(cls, w: list) -> ErrorReport:
        """What the receiving end takes: bounded strings, and a kind only if it is LINKED."""
        kind, message, code, param = w
        return cls(_bounded(message, MESSAGE_MAX), None if code is None else _bounded(code, NAME_MAX),
                   kind if isinstance(kind, str) and kind in LINKED else "",
                   None if param is None else _bounded(param, NAME_MAX))

    def exception(self) -> SuperfluidError:
        """The error to end the request with, typed as it was raised."""
        cls = LINKED.get(self.kind)
        if cls is None:
            return SuperfluidError(self.message, code=self.code or "generation_failed")
        return cls(self.message, param=self.param, code=self.code)
