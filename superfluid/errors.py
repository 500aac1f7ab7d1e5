"""The one exception tree. Every error a user can cause is a subclass of SuperfluidError
with an HTTP status and an OpenAI-style type/code; foreign errors are mapped at the boundary."""

from __future__ import annotations


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
    code = "context_length_exceeded"


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
