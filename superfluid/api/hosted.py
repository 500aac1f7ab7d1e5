"""Tools that run on the provider's side (OpenAI's web_search, file_search, code_interpreter
...; Anthropic's web_search_*, code_execution_* ...): this server cannot run them, so the
model is not offered them. Dropping one never fails a request (Codex sends web_search with
every turn); the answer says which were left out in one header, and the log says so once
per tool type. Only a tool_choice that names one is refused, by the API that reads it."""

from __future__ import annotations

import logging

log = logging.getLogger("superfluid.api")

HEADER = "x-superfluid-dropped-tools"
# tool types are the client's strings: the header and the once-per-type memory are bounded
MAX_NAMES = 16
MAX_NAME = 64
MAX_SAID = 256
_said: set[tuple[str, str]] = set()


def notice(api: str, kinds: list[str]) -> dict[str, str]:
    """The response header naming the dropped tool types ({} when none); logs each new type once."""
    if not kinds:
        return {}
    names = sorted({printable(k) for k in kinds})[:MAX_NAMES]
    new = [k for k in names if (api, k) not in _said]
    if new and len(_said) < MAX_SAID:
        _said.update((api, k) for k in new)
        log.warning("%s: left out tools that run on the provider's side, which this server cannot run: %s "
                    "(said once per type; the %s header names them on every answer)", api, ", ".join(new), HEADER)
    return {HEADER: ",".join(names)}


def printable(kind: str) -> str:
    """A client's tool type as a header (and log) word: printable ASCII only. Other characters
    are escaped (\\xe9, \\u2603, \\n), a space or a comma is `_`: a header that cannot be
    encoded fails the response after its generation started."""
    escaped = kind[:MAX_NAME].encode("unicode_escape").decode("ascii")
    return "".join(c if "!" <= c <= "~" and c != "," else "_" for c in escaped)[:MAX_NAME]
