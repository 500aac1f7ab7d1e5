"""The prefix cache's namespaces (request.GenRequest.cache_ns): a generation reuses KV only
from generations of its own namespace (sched/lanes.py, sched/kvdisk.py, fleet/prefixes.py),
so `cached_tokens` and the time to the first token tell a client nothing about prompts
outside it.

A request's namespace is made of its key (`--cache-isolation key`, the default, when keys
are configured: each key its own; an admin key and a server without keys share one) and the
request's `cache_salt` (vLLM's field: requests with the same salt share a namespace, others
cannot reach it). Neither: the shared namespace "". Within one namespace a shared system
prompt is prefilled once, as before."""

from __future__ import annotations

import hashlib

from ..errors import BadRequest
from ..limits import MAX_CACHE_SALT_LEN

STATE = "cache_ns"  # the request scope's state entry the guard sets (api/guard.py)
PARAM = "cache_ns"  # the session params' entry: the namespace its generations ran in (never shown)


def of_session(params: dict, request) -> str:
    """The namespace a session's generation goes on in (a resumed stream's continuation, a
    pin): the one its request ran in, salt and all; a native session's, the request's."""
    ns = params.get(PARAM)
    return ns if isinstance(ns, str) else namespace(request)


def shown(params: dict) -> dict:
    """A session's params as its summary shows them: without the namespace (a hash of the salt)."""
    return {k: v for k, v in params.items() if k != PARAM}


def of_key(name: str) -> str:
    """A key's own namespace."""
    return _hash(f"key\0{name}")


def salt_of(value: object) -> str | None:
    """A request's `cache_salt`, checked (vLLM's rule: a non-empty string when given)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest("cache_salt must be a non-empty string", param="cache_salt")
    if len(value) > MAX_CACHE_SALT_LEN:
        raise BadRequest(f"cache_salt is {len(value)} characters; the limit is {MAX_CACHE_SALT_LEN}",
                         param="cache_salt")
    return value


def namespace(request, salt: str | None = None) -> str:
    """The namespace of a request's generations: its key's (set by the guard), salted."""
    base = request.scope.get("state", {}).get(STATE, "")
    if not salt:
        return base
    return _hash(f"{base}\0salt\0{salt}")


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
