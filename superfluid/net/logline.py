"""Log lines that stay one line whatever client string they carry (a model name, a path, a
tool type): every unprintable character, a newline that would forge a line, a terminal escape,
a bidi override, written as its escape. The daemon's log writer, the web monitor's log pane
and the terminal monitor's format records with OneLine (monitor/logs.py); it lives
in net/, the layer under every one that logs a client's string."""

from __future__ import annotations

import logging

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """`text` with every unprintable character written as its escape (\\n, \\u001b, \\u202e;
    a JSON string's escapes, so a JSON line stays JSON)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    o = ord(c)
    if o > 0xFFFF:
        o -= 0x10000
        return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"
    return f"\\u{o:04x}"


class OneLine(logging.Formatter):
    """A record as one line: its message escaped (one_line); a traceback or stack after it
    has each line escaped and indented, so no line of it reads as a record of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))

    def formatException(self, ei) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  " + one_line(ln) for ln in text.splitlines())
