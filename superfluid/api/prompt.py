"""The canonical chat request every API builds: messages (with tool calls and results),
tools and tool_choice, a structured-output grammar and template options → the session
events and prompt, how to split the output into channels, and the grammar to enforce."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from ..codec import grammar as gr
from ..limits import MAX_CACHE_KEY_LEN, check_chat
from ..codec.channels import ChannelSpec, spec_for
from ..codec.tools import EXAMPLE, tool_list
from ..errors import BadRequest
from ..session.markup import mark_message, mark_tools
from ..session.turns import context_text, prelude


@dataclass
class ChatPrompt:
    bodies: list  # session events: a Message per message, then the opener
    prompt: list[int]
    channels: ChannelSpec
    grammar: str  # "" when unconstrained
    continued: bool = False  # the last message was the assistant's, continued (its text ends the opener)


def parse_tool_choice(choice: object, tools: list[dict]) -> tuple[str, str | None]:
    """("auto" | "none" | "required", function name or None), from OpenAI's shapes."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("auto", "none", "required"):
        return str(choice), None
    if isinstance(choice, dict):
        fn: dict = choice["function"] if isinstance(choice.get("function"), dict) else {}
        name = fn.get("name") or choice.get("name")
        if isinstance(name, str) and name:
            return "required", name
    raise BadRequest("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}", param="tool_choice")


def chat_prompt(engine, messages: list[dict], *, tools: list | None = None, tool_choice: object = None,
                grammar: str = "", template_kwargs: dict | None = None,
                parallel_tool_calls: bool = True, continue_final: bool = False) -> ChatPrompt:
    """`parallel_tool_calls`: one reply may carry several calls (OpenAI's default, Anthropic's
    unless disable_parallel_tool_use); false: at most one. `continue_final`: the last message
    is the assistant's start of its reply (Anthropic's prefill, vLLM's continue_final_message,
    llama-server's assistant prefill): the reply goes on from its text, which joins the
    assistant-turn opener (one session event); the output is what follows it."""
    check_chat(messages, tools)
    prefill: list[int] = []
    if continue_final:
        messages, prefill = _prefill(engine, messages)
    tools = tool_list(tools) if tools else []
    mode, name = parse_tool_choice(tool_choice, tools)
    if mode == "required" and not tools:
        raise BadRequest("tool_choice requires tools", param="tool_choice")
    use_tools = tools if mode != "none" else []
    fmt = engine.tool_format
    # names, arguments, call ids and the tools' JSON stay text wherever the dialect writes them
    # (session/markup.py); the grammar below takes the tools as they are
    tok = engine.tokenizer
    msgs, extra = fmt.render([mark_message(tok, m) for m in messages], mark_tools(tok, use_tools))
    kwargs = {**(template_kwargs or {}), **extra}
    bodies, prompt = prelude(engine, msgs, **kwargs)
    bodies = fold_examples(msgs, bodies)
    if prefill:
        bodies[-1] = replace(bodies[-1], span=tuple(bodies[-1].span) + tuple(prefill))
        prompt = list(prompt) + prefill
    opener = context_text(engine.tokenizer, list(bodies[-1].span)) if bodies else ""
    # a structured dialect (Harmony, Functionary, Granite) reads every reply, tools or not
    channels = spec_for(fmt if use_tools or fmt.structured else None, engine.reasoning, opener)
    # the dialect's markers as the model's special tokens where its vocabulary has them
    lits = gr.Literals.of(engine.tokenizer, fmt.markers, engine.reasoning or ()) if use_tools else gr.PLAIN
    if mode == "required":  # calls in the model's dialect, after the model's reasoning if it reasons
        lits = lits.thinking(forced_thinking(engine, channels, kwargs, opener))
        grammar = fmt.calls_grammar(use_tools, name, parallel=parallel_tool_calls, lazy=False, lits=lits)
    elif mode == "auto" and use_tools and not grammar:  # text, or calls once the model opens one
        grammar = fmt.calls_grammar(use_tools, None, parallel=parallel_tool_calls, lazy=True, lits=lits)
    return ChatPrompt(bodies, prompt, channels, grammar, continue_final)


def _prefill(engine, messages: list[dict]) -> tuple[list[dict], list[int]]:
    """(the messages before the last, the tokens of the last's text): the assistant message a
    reply continues. Its text is text: markers in it never become control tokens."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant":
        raise BadRequest("continuing the final message needs the last message to be the assistant's",
                         param="messages")
    if last.get("tool_calls"):
        raise BadRequest("a final assistant message with tool calls cannot be continued", param="messages")
    content = last.get("content")
    text = content if isinstance(content, str) else ""
    return messages[:-1], engine.tokenizer.encode(text) if text else []


def fold_examples(msgs: list[dict], bodies: list) -> list:
    """Example turns a dialect put in the prompt (codec/tools.examples) join the message before
    them (the system note): the prompt is unchanged, but the session records, and the client
    and the web app see, only the conversation's own messages."""
    out: list = []
    for m, body in zip(msgs, bodies, strict=False):
        if m.get(EXAMPLE) and out:
            out[-1] = replace(out[-1], span=tuple(out[-1].span) + tuple(body.span))
        else:
            out.append(body)
    return out + bodies[len(msgs):]  # the opener


def forced_thinking(engine, channels: ChannelSpec, kwargs: dict, opener: str) -> gr.Thinking | None:
    """The reasoning block a forced call may follow: between the template's reasoning markers
    (inside it from the first token when the assistant opener opened it), or the dialect's
    own (Harmony's analysis message) when the template is of the dialect's family (not one a
    --tool-dialect put on another family's model). None when the request turns reasoning off
    (`enable_thinking` / `thinking` false) or the opener already closed the block (Qwen 3's
    empty `<think></think>` when thinking is off)."""
    if kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False:
        return None
    if channels.reasoning is not None:
        opn, close = channels.reasoning
        if opener.rstrip().endswith(close):
            return None
        return gr.Thinking(opn, close, inside=channels.start_in_reasoning)
    fmt = engine.tool_format
    return fmt.reasoning_block if fmt.reasoning_block is not None and fmt.detect(engine.template.source) else None


def response_format_grammar(fmt: object, param: str = "response_format") -> str:
    """OpenAI response_format / Responses text.format → grammar ("" for text)."""
    if fmt is None:
        return ""
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise BadRequest(f"{param} must be an object with a type", param=param)
    kind = fmt["type"]
    if kind == "text":
        return ""
    if kind == "json_object":
        return gr.json_object(param)
    if kind == "json_schema":
        inner: dict = fmt["json_schema"] if isinstance(fmt.get("json_schema"), dict) else fmt  # Responses: flat
        schema = inner.get("schema")
        if schema is None:
            raise BadRequest(f"{param}: json_schema needs a schema", param=param)
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise BadRequest(f"{param}: the schema is not JSON", param=param) from None
        return gr.json_schema(schema, param)
    raise BadRequest(f"{param} type {kind!r} is not supported: use text, json_object or json_schema", param=param)


def request_grammar(grammar: object = None, json_schema: object = None, response_format: object = None) -> str:
    """The output grammar a request asks for, as llama-server reads it on every route: a GBNF
    `grammar` first, then a bare `json_schema`, then OpenAI's `response_format`."""
    if grammar not in (None, ""):
        if not isinstance(grammar, str):
            raise BadRequest("grammar must be a string (GBNF)", param="grammar")
        return gr.gbnf(grammar)
    if json_schema is not None:
        return gr.json_schema(json_schema, "json_schema")
    return response_format_grammar(response_format)


def template_options(chat_template_kwargs: object = None, reasoning_effort: object = None,
                     enable_thinking: object = None) -> dict:
    kw = dict(chat_template_kwargs) if isinstance(chat_template_kwargs, dict) else {}
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
    if reasoning_effort is not None:
        kw.setdefault("reasoning_effort", reasoning_effort)
    if enable_thinking is not None:
        kw.setdefault("enable_thinking", bool(enable_thinking))
    return kw


# OpenAI's prompt caching keeps a prefix "in memory" for 5-10 minutes of inactivity, or a
# day with prompt_cache_retention "24h"
CACHE_TTL = {"in_memory": 600.0, "in-memory": 600.0, "24h": 86400.0}


def prompt_cache_hint(key: object, retention: object, prompt_len: int) -> tuple[int, float] | None:
    """OpenAI's prompt_cache_key as the cache hint it is (GenRequest.cache): requests that
    share a key share a prefix, so this prompt is kept warm for the next one (an agent's
    next turn extends it; pins.hint hands the older prefix's share to the longer one)."""
    if key is None:
        return None
    if not isinstance(key, str) or len(key) > MAX_CACHE_KEY_LEN:
        raise BadRequest(f"prompt_cache_key must be a string of at most {MAX_CACHE_KEY_LEN} characters",
                         param="prompt_cache_key")
    if retention is not None and not (isinstance(retention, str) and retention in CACHE_TTL):
        raise BadRequest("prompt_cache_retention must be 'in_memory' or '24h'", param="prompt_cache_retention")
    return prompt_len, CACHE_TTL[retention or "in_memory"]
