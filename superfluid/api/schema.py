"""Request bodies of the OpenAI-compatible endpoints, validated strictly: a wrong type is a
400 naming the field, unknown fields are ignored (clients send many)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import BadRequest
from ..limits import MAX_CACHE_SALT_LEN, MAX_INFILL_FILES, MAX_REPEAT_LAST_N


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class OtherPart(_Body):
    type: str


class ToolFunction(_Body):
    name: str
    arguments: str | dict = ""


class ToolCallIn(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolFunction


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | OtherPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


Stop = Union[str, Annotated[list[str], Field(max_length=16)], None]


class Sampling(_Body):
    model: str | None = None  # None: the default model (as llama-server and vLLM allow)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: Stop = None
    n: int = Field(1, ge=1, le=16)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    repetition_penalty: float | None = Field(None, gt=0, le=100)  # vLLM's name for repeat_penalty
    typical_p: float | None = Field(None, gt=0, le=1)
    repeat_last_n: int | None = Field(None, ge=-1, le=MAX_REPEAT_LAST_N)  # the penalties' window; -1 all
    ignore_eos: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None  # token id → bias (api/bias.py checks it)
    grammar: str | None = None  # llama-server's GBNF grammar, honoured on the OpenAI routes as there
    json_schema: dict | None = None  # llama-server's bare JSON schema for the output
    return_progress: bool = False  # llama-server's: streamed prompt_progress chunks while the prompt prefills
    # vLLM's: a namespace of its own in the prefix cache for requests that share it (api/cache_ns.py)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_LEN)


class ChatCompletionRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    chat_template_kwargs: dict | None = None
    reasoning_effort: str | None = None
    prompt_cache_key: object = None  # checked by prompt_cache_hint
    prompt_cache_retention: object = None
    timings_per_token: bool = False  # llama-server's: streamed chunks that end a choice carry `timings`
    # vLLM's: the reply continues the final (assistant) message; not with add_generation_prompt
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    verbose: bool = False  # llama-server's: the answer carries `__verbose`, the prompt as rendered and its stats


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None  # text after the completion: a fill-in-the-middle prompt (codec/fim.py)


class InfillFile(_Body):
    filename: str = "tmp"
    text: str


class InfillRequest(_Body):
    """llama-server's POST /infill: what it adds to /completion's options (api/llama_params.py)."""
    model: str | None = None
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[InfillFile], Field(max_length=MAX_INFILL_FILES)] = []
    prompt: str = ""


class TokenizeRequest(_Body):
    model: str | None = None
    content: str
    add_special: bool = False
    parse_special: bool = True  # llama-server's: special tokens' text becomes those tokens
    with_pieces: bool = False


class ModelRequest(_Body):
    model: str
    # /v1/models/load: unload a loaded model first, so its worker starts afresh (a model split
    # over llama.cpp RPC nodes takes in the nodes that answer now)
    reload: bool = False


class PruneRequest(_Body):
    """POST /v1/sessions/prune: erase idle sessions older than this, or until the store is this
    small (neither: the server's own retention policy)."""
    older_than_days: float | None = Field(None, ge=0)
    max_mb: float | None = Field(None, ge=0)


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


MAX_EMBED_INPUTS = 2048  # inputs in one embedding request (OpenAI's limit)

EmbedInputs = Union[str, Annotated[list[str], Field(min_length=1, max_length=MAX_EMBED_INPUTS)],
                    Annotated[list[int], Field(min_length=1)],
                    Annotated[list[list[int]], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]]


class EmbeddingRequest(_Body):
    model: str | None = None  # None: the embedding model (--embedding-model), else the default model
    input: EmbedInputs
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate: bool = False  # cut inputs over the model's window (an extension; vLLM: truncate_prompt_tokens)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)  # vLLM: -1 the window, N the first N tokens


class RerankDocument(_Body):
    text: str


class RerankRequest(_Body):
    model: str | None = None
    query: str
    documents: Annotated[list[str | RerankDocument], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True
    truncate: bool = True  # cut (query, document) inputs over the window, as rerankers do


def number_in(body: dict, key: str, lo: float, hi: float, default: float, *, allow_null: bool = False) -> float:
    """A numeric field of a raw JSON body, range-checked (a 400 naming the field otherwise)."""
    v = body.get(key, default)
    if v is None and allow_null:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise BadRequest(f"{key} must be a number in [{lo}, {hi}]", param=key)
    return float(v)


def json_object(raw: bytes) -> dict:
    """A request body that must be one JSON object."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


B = TypeVar("B", bound=_Body)


def parse(cls: type[B], raw: bytes) -> B:
    data = json_object(raw)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param(err["loc"])
        if err["type"] == "missing":
            raise BadRequest(f"missing required parameter: '{param}'", param=param) from None
        raise BadRequest(f"invalid value for '{param}': {err['msg']}", param=param) from None


def _field_names() -> frozenset[str]:
    return frozenset(name for m in (Message, TextPart, OtherPart, StreamOptions, ChatCompletionRequest,
                                    CompletionRequest, TokenizeRequest, DetokenizeRequest, ModelRequest,
                                    EmbeddingRequest, RerankRequest, RerankDocument, InfillRequest, InfillFile)
                     for name in m.model_fields)


_FIELDS = _field_names()


def _param(loc: tuple) -> str | None:
    """The field path of a validation error. pydantic adds the union member it tried
    ('stop.str', 'messages.0.content.list[...]'); a user needs the field, so stop at the
    first part that is neither a field name nor a list index."""
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int) or p in _FIELDS:
            parts.append(str(p))
        else:
            break
    return ".".join(parts) or None


# -- the native session API -----------------------------------------------------------------
class SessionSampling(_Body):
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=0)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0, le=100)
    typical_p: float | None = Field(None, gt=0, le=1)
    repeat_last_n: int | None = Field(None, ge=-1, le=MAX_REPEAT_LAST_N)
    stop: Stop = None

    def overrides(self) -> dict:
        return {k: v for k in ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                               "frequency_penalty", "repeat_penalty", "typical_p", "repeat_last_n")
                if (v := getattr(self, k)) is not None}

    def stops(self) -> tuple[str, ...] | None:
        return None if self.stop is None else ((self.stop,) if isinstance(self.stop, str) else tuple(self.stop))


class SessionCreate(SessionSampling):
    model: str | None = None
    system: str | None = None
    tools: list[dict] | None = None
    title: Annotated[str, Field(max_length=512)] | None = None
    raw: bool = False  # no chat template: messages are raw text, generation continues it


class SessionMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str = ""
    tool_calls: list[ToolCallIn] | None = None  # an assistant message's calls (role assistant only)


class SessionToolResult(_Body):
    call_id: str
    content: str


class SessionGenerate(SessionSampling):
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = True


class SessionFork(_Body):
    at: int | None = None


class SessionTrim(_Body):
    to: int


class SessionMetaBody(_Body):
    title: Annotated[str, Field(max_length=512)] | None = None
    archived: bool | None = None
