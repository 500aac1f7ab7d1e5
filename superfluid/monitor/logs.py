"""The daemon's log lines: text ("superfluid: ...") or JSON, written by a thread, never on
the event loop, so a stdout nobody reads (a full pipe, a stalled terminal) cannot freeze
the server. Past 10,000 waiting lines, new ones are dropped.

A record is one line whatever client string it carries (a model name, a path, a tool type):
every unprintable character in its message, a newline that would forge a line, a terminal
escape, a bidi override, is written as its escape; a traceback's lines are indented
(net/logline.py)."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import logging.handlers
import queue

from ..net.logline import OneLine

QUEUED = 10_000


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.name == "superfluid.access":
            return msg  # already one JSON object
        return json.dumps({"ts": round(record.created, 3), "level": record.levelname.lower(),
                           "logger": record.name, "msg": msg})


class _Dropping(logging.handlers.QueueHandler):
    def enqueue(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(record)


def _flush(listener: logging.handlers.QueueListener, wait: float = 2.0) -> None:
    """At exit, the lines still queued go out, unless stdout is stuck: then exit anyway."""
    with contextlib.suppress(queue.Full):
        listener.enqueue_sentinel()
    thread = listener._thread  # noqa: SLF001 -- QueueListener.stop() would wait forever
    if thread is not None:
        thread.join(wait)


def setup_logging(json_lines: bool = False) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter("superfluid: %(message)s"))
    q: queue.Queue = queue.Queue(QUEUED)
    listener = logging.handlers.QueueListener(q, handler)
    listener.start()
    atexit.register(_flush, listener)
    queued = _Dropping(q)
    queued.setFormatter(OneLine("%(message)s"))  # only the message, escaped: the writer formats the line
    logging.basicConfig(level=logging.INFO, handlers=[queued])
    # httpx logs each request it makes at INFO ("HTTP Request: GET …"): noise in front of an
    # agent `launch` starts, and the daemon's own requests have their own lines
    for name in ("httpx", "httpx2"):  # httpx2: huggingface_hub's client (superfluid pull)
        logging.getLogger(name).setLevel(logging.WARNING)
