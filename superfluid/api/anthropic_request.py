"""The Anthropic Messages request, read: content blocks (text, tool_use, tool_result) onto the
canonical conversation, cache_control breakpoints onto a prefix-cache hint, and tools (client
tools kept, Anthropic's server tools dropped with a notice). api/anthropic.py builds the
generation request and the response from these."""

from __future__ import annotations

from ..errors import BadRequest
from ..limits import arguments_text


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", param=where)
    out = []
    for i, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            out.append(b["text"])
        elif kind == "image":
            raise BadRequest("this model takes text only: image blocks are not supported", param=f"{where}.{i}")
        else:
            raise BadRequest(f"unexpected content block {kind!r}", param=f"{where}.{i}")
    return "".join(out)


# `system` inside messages: Claude Code sends its later instructions there (the
# mid-conversation-system beta); they stay where they are, so the prompt before them is
# the previous turn's prompt and its cache still holds.
ROLES = ("user", "assistant", "system")


def _blocks(m: dict, i: int) -> list[dict]:
    """One Anthropic message as canonical messages: text, assistant tool calls (tool_use),
    tool results (tool_result, each a `tool` message). Thinking blocks are not fed back."""
    content = m.get("content", "")
    where = f"messages.{i}.content"
    if m["role"] == "system":
        return [{"role": "system", "content": _text(content, where)}]
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", param=where)
    text: list[str] = []
    calls: list[dict] = []
    results: list[dict] = []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                raise BadRequest("tool_use needs a name and an input object", param=f"{where}.{j}")
            calls.append({"id": str(b.get("id") or ""), "type": "function", "function": {
                "name": b["name"], "arguments": arguments_text(b.get("input", {}), f"{where}.{j}.input")}})
        elif kind == "tool_result" and m["role"] == "user":
            inner = b.get("content", "")
            body = inner if isinstance(inner, str) else _text(inner, f"{where}.{j}.content")
            if b.get("is_error"):
                body = "Error: " + body
            results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""), "content": body})
        elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
            continue
        elif kind == "image":
            raise BadRequest("this model takes text only: image blocks are not supported", param=f"{where}.{j}")
        else:
            raise BadRequest(f"unexpected content block {kind!r} in a {m['role']} message", param=f"{where}.{j}")
    out: list[dict] = results[:]
    if calls:
        out.append({"role": "assistant", "content": "".join(text) or None, "tool_calls": calls})
    elif text or not results:
        out.append({"role": m["role"], "content": "".join(text)})
    return out


def conversation(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: a non-empty list is required", param="messages")
    turns = []
    if body.get("system") is not None:
        turns.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest("each message needs role 'user', 'assistant' or 'system'", param=f"messages.{i}.role")
        turns += _blocks(m, i)
    return turns


TTLS = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4


def _ttl(block, where: str) -> float | None:
    """A block's cache_control TTL in seconds (None: the block has none)."""
    cc = block.get("cache_control") if isinstance(block, dict) else None
    if cc is None:
        return None
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise BadRequest("cache_control must be {\"type\": \"ephemeral\"} with an optional ttl",
                         param=f"{where}.cache_control")
    ttl = cc.get("ttl", "5m")
    if ttl not in TTLS:
        raise BadRequest("cache_control.ttl must be \"5m\" or \"1h\"", param=f"{where}.cache_control.ttl")
    return TTLS[ttl]


def cache_breakpoints(body: dict) -> list[tuple[int, float]]:
    """(message, ttl seconds) for each cache_control breakpoint: the index, in conversation()'s
    messages, of the message that holds the marked block (-1 for tools and system: the first
    message rendered, which holds them). A breakpoint marks the prompt through the end of
    that message."""
    marks: list[tuple[int, float]] = []
    for where, blocks in (("tools", body.get("tools")), ("system", body.get("system"))):
        for j, b in enumerate(blocks if isinstance(blocks, list) else []):
            ttl = _ttl(b, f"{where}.{j}")
            if ttl is not None:
                marks.append((-1, ttl))
    n = 0 if body.get("system") is None else 1
    for i, m in enumerate(body.get("messages") or []):
        count = len(_blocks(m, i))
        results = 0  # tool results come first, one message each; the rest is the last message
        for j, b in enumerate(m["content"] if isinstance(m.get("content"), list) else []):
            ttl = _ttl(b, f"messages.{i}.content.{j}")
            is_result = b.get("type") == "tool_result"
            if ttl is not None:
                marks.append((n + results if is_result else n + count - 1, ttl))
            results += is_result
        n += count
    if len(marks) > MAX_BREAKPOINTS:
        raise BadRequest(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                         f"Found {len(marks)}.", param="cache_control")
    return marks


def cache_hint(body: dict, cp) -> tuple[int, float] | None:
    """(prompt tokens, seconds) to keep warm: the longest marked prefix, for the longest TTL
    asked (it holds every shorter marked prefix)."""
    marks = cache_breakpoints(body)
    if not marks:
        return None
    last = max(i for i, _ in marks)
    # the bodies are the rendered messages, then the opener (which a continued final message
    # joined); tools may have added a system message
    last = 0 if last < 0 else last + len(cp.bodies) - 1 - len(conversation(body)) + cp.continued
    return sum(len(b.span) for b in cp.bodies[:last + 1]), max(t for _, t in marks)


# Anthropic's server tools run on Anthropic's side: this server has no web search or sandbox,
# so they are left out of the prompt (api/hosted.py says so to the client).
SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "mcp_toolset", "tool_search_tool_")


def hosted(tool: dict) -> bool:
    kind = tool.get("type")
    return isinstance(kind, str) and kind.startswith(SERVER_TOOLS)


def dropped_tools(body: dict) -> list[str]:
    """The types of the server tools a request offered, which the model is not given."""
    tools = body.get("tools")
    return [str(t.get("type")) for t in tools if isinstance(t, dict) and hosted(t)] if isinstance(tools, list) else []


def tools_of(body: dict) -> tuple[list[dict] | None, object]:
    """Anthropic tools and tool_choice in OpenAI's shapes (server tools left out)."""
    tools = body.get("tools")
    if tools is None:
        return None, None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise BadRequest("each tool needs a name and an input_schema", param=f"tools.{i}")
        if hosted(t):
            continue
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                      "parameters": t.get("input_schema") or {"type": "object"}}})
    choice = body.get("tool_choice")
    if choice is None:
        return out, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if kind == "tool":
        named = next((t for t in tools if isinstance(t, dict) and t.get("name") == choice.get("name")), None)
        if named is not None and hosted(named):
            raise BadRequest(f"tool_choice names {named['name']!r}, a server tool ({named.get('type')}) this server "
                             "cannot run", param="tool_choice")
        return out, {"type": "function", "function": {"name": choice.get("name")}}
    if mapped is None:
        raise BadRequest("tool_choice type must be auto, any, tool or none", param="tool_choice")
    return out, mapped
