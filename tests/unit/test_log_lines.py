"""A client's string cannot forge a log line (issue 54, low): a model name, a path or a tool
type holding a newline, a terminal escape or a bidi override reaches the daemon's log (the
access log's `model`, a hub name a pull logs, a message an exception carries). The log
writer (monitor/logs.setup_logging, in a process of its own), the web monitor's pane and the
terminal monitor's now write every record as one line, its unprintable characters escaped,
and a traceback's lines indented."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from superfluid.api.ui import LogTail
from superfluid.net.logline import OneLine, one_line

FORGED = "org/m:Q4\x1b[2J\nsuperfluid: GET /v1/admin 200 model=trusted\r\u202eevil\U000e0001"
SCRIPT = """
import logging, sys
from superfluid.monitor.logs import setup_logging
from superfluid.monitor.access import line
setup_logging(sys.argv[1] == "json")
forged = sys.argv[2]
logging.getLogger("superfluid.registry").info("unloaded %s", forged)
logging.getLogger("superfluid.access").info(line({"method": "POST", "path": "/v1/chat/completions",
                                                   "status": 200, "model": forged}, sys.argv[1]))
try:
    raise ValueError(forged)
except ValueError:
    logging.getLogger("superfluid.api").exception("a request failed: %s", forged)
"""


def _lines(fmt: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, fmt, FORGED], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stderr.splitlines()


def test_the_daemons_text_log_writes_each_record_as_one_line():
    lines = _lines("text")
    records = [ln for ln in lines if not ln.startswith("  ")]  # a traceback's lines are indented
    assert len(records) == 3, lines
    assert all(ln.startswith("superfluid: ") for ln in records), lines
    assert not any("\x1b" in ln or "\r" in ln or "\u202e" in ln for ln in lines), lines
    assert "org/m:Q4\\u001b[2J\\nsuperfluid: GET /v1/admin" in records[0], records[0]
    assert not any(ln.startswith("superfluid: GET") for ln in lines), lines  # the forged line is text in another


def test_the_daemons_json_log_writes_each_record_as_one_object():
    lines = _lines("json")
    records = [json.loads(ln) for ln in lines if not ln.startswith("  ")]
    assert len(records) == 3, lines
    assert records[0]["msg"].startswith("unloaded org/m:Q4") and records[1]["model"] == FORGED
    assert not any("\x1b" in ln or "\u202e" in ln for ln in lines), lines


def test_the_monitor_panes_and_the_escape_itself():
    rec = logging.LogRecord("superfluid.api", logging.INFO, __file__, 1, "model %s", (FORGED,), None)
    tail = LogTail()
    tail.emit(rec)
    assert "\n" not in tail.lines[-1] and "\x1b" not in tail.lines[-1]
    assert "\n" not in OneLine("%(message)s").format(rec)
    assert json.loads(f'"{one_line(FORGED)}"') == FORGED  # JSON's escapes: a JSON line stays JSON
    assert one_line("plain é text") == "plain é text"
