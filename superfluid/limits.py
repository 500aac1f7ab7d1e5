"""The limits a request must stay within, the same on every API. Each keeps one client's
request from costing the others: work on the event loop that grows with a list's length or
a schema's depth, a grammar the worker compiles per lane, output that many lanes produce.
A request over one gets a typed 400 naming the parameter (docs/security.md lists them)."""

from __future__ import annotations

import re

import orjson

from .errors import BadRequest

MAX_MESSAGES = 4096  # messages in one conversation
MAX_TOOLS = 128  # tools offered in one request
MAX_SCHEMA_DEPTH = 32  # nesting of a tool's parameters or a response format's schema
MAX_PROMPT_WRAPS = 4  # llama-server's /completion prompt: lists and objects around one prompt (it needs 2)
MAX_ARGS_DEPTH = 64  # nesting of a tool call's arguments a client sends back (an object, or JSON text)
MAX_SCHEMA_BYTES = 256 << 10  # the JSON text of all the tools' definitions together (Claude Code sends 64 KB)
MAX_STOPS = 16  # stop strings
MAX_STOP_LEN = 256  # characters in one stop string
MAX_CHOICES = 16  # n
MAX_TOP_LOGPROBS = 20  # alternatives per token
MAX_GRAMMAR_BYTES = 1 << 20  # a compiled grammar (tools, JSON schema, format)
MAX_INFILL_FILES = 64  # /infill input_extra files (their text is cut to the window, tokenized from the end)
MAX_METADATA_KEYS = 16  # a stored response's metadata (OpenAI's limits)
MAX_METADATA_KEY_LEN = 64
MAX_METADATA_VALUE_LEN = 512
MAX_LOGIT_BIAS = 300  # logit_bias entries (OpenAI's limit)
MAX_BIAS = 100.0  # |bias| for one token: -100 bans it, +100 all but forces it (OpenAI's range)
MAX_CACHE_KEY_LEN = 1024  # prompt_cache_key characters
MAX_CACHE_SALT_LEN = 1024  # cache_salt characters (vLLM suggests 43: 256 random bits in base64)
MAX_REPEAT_LAST_N = 1 << 20  # the penalties' window in tokens (-1: the whole context)


def depth(value: object, limit: int) -> int:
    """How deeply `value` nests (stopping once past `limit`), without recursion."""
    worst, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > worst:
            worst = d
            if worst > limit:
                return worst
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return worst


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string literal (its brackets are text)
_BRACKET = re.compile(r"[\[\]{}]")


def text_depth(text: str, limit: int) -> int:
    """How deeply the JSON in `text` nests, counted as depth() counts the value it parses to
    (an empty container one more; stopping once past `limit`), valid JSON or not, without
    parsing it."""
    level = worst = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        level += 1 if m.group() in "[{" else -1
        if level >= worst:
            worst = level + 1
            if worst > limit:
                break
    return worst


def arguments_text(args: object, param: str) -> str:
    """A tool call's arguments a client sends back in a conversation (an object, or its JSON
    text), as JSON text, at most MAX_ARGS_DEPTH levels deep: deeper ones failed encoding,
    parsing or rendering with a recursion error (an untyped 500)."""
    if isinstance(args, str):
        deep = text_depth(args, MAX_ARGS_DEPTH)
    else:
        deep = depth(args, MAX_ARGS_DEPTH)
    if deep > MAX_ARGS_DEPTH:
        raise BadRequest(f"a tool call's arguments nest deeper than {MAX_ARGS_DEPTH} levels", param=param)
    return args if isinstance(args, str) else orjson.dumps(args).decode()


def check_schema(schema: object, param: str) -> None:
    if depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise BadRequest(f"{param} nests deeper than {MAX_SCHEMA_DEPTH} levels", param=param)


def check_chat(messages: list, tools: list | None) -> None:
    """A chat request's conversation and tools (before anything renders them)."""
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"a conversation may have at most {MAX_MESSAGES} messages, not {len(messages)}",
                         param="messages")
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        for j, c in enumerate(calls if isinstance(calls, list) else ()):
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict) and "arguments" in fn:
                arguments_text(fn["arguments"], f"messages.{i}.tool_calls.{j}.function.arguments")
    if not tools:
        return
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"at most {MAX_TOOLS} tools may be given, not {len(tools)}", param="tools")
    check_schema(tools, "tools")
    size = sum(len(repr(t)) for t in tools)
    if size > MAX_SCHEMA_BYTES:
        raise BadRequest(f"the tools' definitions are {size} bytes; the limit is {MAX_SCHEMA_BYTES}", param="tools")


def check_generation(stops: tuple[str, ...], choices: int, top_logprobs: int, grammar: str) -> None:
    """What a generation asks of the engine."""
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"at most {MAX_STOPS} stop strings, not {len(stops)}", param="stop")
    if any(len(s) > MAX_STOP_LEN for s in stops):
        raise BadRequest(f"stop strings are limited to {MAX_STOP_LEN} characters", param="stop")
    if choices > MAX_CHOICES:
        raise BadRequest(f"n is at most {MAX_CHOICES}", param="n")
    if top_logprobs > MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs is at most {MAX_TOP_LOGPROBS}", param="top_logprobs")
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise BadRequest(f"the request's grammar (its tools, schema or format) compiles to {len(grammar)} bytes; "
                         f"the limit is {MAX_GRAMMAR_BYTES}", param="response_format")


def check_metadata(value: object, param: str = "metadata") -> dict[str, str]:
    """Metadata a client attaches to what it stores: string keys and values, bounded."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{param} must be an object of strings", param=param)
    if len(value) > MAX_METADATA_KEYS:
        raise BadRequest(f"{param} may have at most {MAX_METADATA_KEYS} keys, not {len(value)}", param=param)
    for k, v in value.items():
        if len(k) > MAX_METADATA_KEY_LEN:
            raise BadRequest(f"{param} keys are at most {MAX_METADATA_KEY_LEN} characters", param=param)
        if not isinstance(v, str) or len(v) > MAX_METADATA_VALUE_LEN:
            raise BadRequest(f"{param} values are strings of at most {MAX_METADATA_VALUE_LEN} characters",
                             param=f"{param}.{k}")
    return dict(value)


def output_budget(asked: int, prompt_len: int, n_ctx: int, cap: int | None = None) -> int:
    """The tokens a generation may produce: what the request asked, at most the room its prompt
    leaves in the window and the operator's cap (--max-output). Coding agents ask 32,000
    whatever the window; like llama-server and Ollama, the answer then ends with `length`
    where the window ends, and only a prompt that does not fit by itself is refused (by the
    engine's check, which this leaves a budget of at least 1 to reach)."""
    room = max(1, n_ctx - prompt_len)
    return max(1, min(asked, room, cap or asked))


# a pull the daemon runs for a client (runtime/pull_bounds.py): its files in all, and what it
# leaves free on the cache's disk (ServeConfig.pull_max_bytes, pull_min_free)
PULL_MAX_BYTES = 256 << 30
PULL_MIN_FREE = 2 << 30
MAX_PULLS = 2  # pulls running at once, each of another name
