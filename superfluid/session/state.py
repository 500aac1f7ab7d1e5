"""A session's state as a fold of its events: `apply(state, event)` is deterministic and
does no I/O, and it is the only code that interprets events, live and at replay alike.

(It updates the state it is given and returns it: copying a long session's token list on
every event would make a replay quadratic.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .events import (OPEN_FINISHES, Created, EpochBump, Event, Generated, GenerationPrompt, Message, Meta, Purge,
                     ToolResult, ToolUse, Trim)


@dataclass(slots=True)
class Entry:
    """One event's contribution to the context: tokens [start, start+n)."""
    event_id: int
    kind: str
    start: int
    n: int
    role: str = ""
    text: str = ""
    call_id: str = ""
    turn_open: bool = False  # an assistant turn is open after this event


@dataclass(slots=True)
class SessionState:
    id: str
    parent: str | None = None
    fork_at: int | None = None
    params: dict = field(default_factory=dict)
    epoch: int = 0
    next_id: int = 0
    tokens: list[int] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    title: str | None = None
    archived: bool = False
    purged: bool = False
    created: float = 0.0
    updated: float = 0.0
    last_finish: str | None = None

    @property
    def turn_open(self) -> bool:
        """An assistant turn was opened and not ended by end of turn or a stop: generating
        continues it rather than opening a new one."""
        return bool(self.entries) and self.entries[-1].turn_open

    @property
    def turn_tokens(self) -> int:
        """Tokens generated so far in the open assistant turn."""
        n = 0
        for e in reversed(self.entries):
            if e.kind == "generated":
                n += e.n
            elif e.kind != "tool_use":
                break
        return n

    def conversation(self, decode: Callable[[list[int]], str]) -> list[dict]:
        """The messages a chat template renders: assistant turns carry the text the model
        produced (special tokens left to the template)."""
        msgs: list[dict] = []
        cur: dict | None = None
        for e in self.entries:
            if e.kind == "message":
                msgs.append({"role": e.role, "content": e.text})
                cur = msgs[-1] if e.role == "assistant" else None  # its tool calls follow it
            elif e.kind == "generation_prompt":
                cur = {"role": "assistant", "content": "", "_spans": []}
                msgs.append(cur)
            elif e.kind == "generated" and cur is not None:
                cur["_spans"].append((e.start, e.n))
            elif e.kind == "tool_use":
                if cur is None:
                    cur = {"role": "assistant", "content": "", "_spans": []}
                    msgs.append(cur)
                cur.setdefault("tool_calls", []).append(
                    {"id": e.call_id, "type": "function", "function": {"name": e.role, "arguments": e.text}})
            elif e.kind == "tool_result":
                msgs.append({"role": "tool", "content": e.text, "tool_call_id": e.call_id})
                cur = None
        for m in msgs:
            spans = m.pop("_spans", None)
            if spans:
                m["content"] = decode([t for s, n in spans for t in self.tokens[s:s + n]])
        return msgs


def _add(state: SessionState, ev: Event, kind: str, span: tuple[int, ...], turn_open: bool, **kw) -> None:
    state.entries.append(Entry(ev.id, kind, len(state.tokens), len(span), turn_open=turn_open, **kw))
    state.tokens.extend(span)


def apply(state: SessionState, ev: Event) -> SessionState:
    if ev.id != state.next_id:
        raise ValueError(f"session {state.id}: event {ev.id} out of order (expected {state.next_id})")
    b = ev.body
    was_open = state.turn_open
    if isinstance(b, Created):
        if ev.id == 0:
            state.created = ev.ts
        state.parent, state.fork_at = b.parent, b.fork_at
        state.params = dict(b.params)
    elif isinstance(b, Message):
        _add(state, ev, "message", b.span, False, role=b.role, text=b.text)
    elif isinstance(b, GenerationPrompt):
        _add(state, ev, "generation_prompt", b.span, True)
    elif isinstance(b, Generated):
        _add(state, ev, "generated", b.span, b.finish in OPEN_FINISHES, text=b.text)
        state.last_finish = b.finish
    elif isinstance(b, ToolUse):
        _add(state, ev, "tool_use", (), was_open, role=b.name, text=b.arguments, call_id=b.call_id)
    elif isinstance(b, ToolResult):
        _add(state, ev, "tool_result", b.span, False, role="tool", text=b.content, call_id=b.call_id)
    elif isinstance(b, EpochBump):
        state.epoch = max(state.epoch, b.epoch)
    elif isinstance(b, Meta):
        if b.title is not None:
            state.title = b.title
        if b.archived is not None:
            state.archived = b.archived
    elif isinstance(b, Trim):
        keep = [e for e in state.entries if e.event_id <= b.to]
        state.entries = keep
        del state.tokens[(keep[-1].start + keep[-1].n) if keep else 0:]
    elif isinstance(b, Purge):
        state.purged = True
    state.epoch = max(state.epoch, ev.epoch)
    state.next_id = ev.id + 1
    state.updated = ev.ts
    return state


def fold(session_id: str, events: Iterable[Event]) -> SessionState:
    state = SessionState(session_id)
    for ev in events:
        apply(state, ev)
    return state
