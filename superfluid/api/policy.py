"""API keys and their policies (`--api-key`, `--key-policy FILE`), validated strictly at start.

A policy file is JSON: {"keys": [{"name": "ci", "key": "sk-...", "qos": "agent",
"max_qos": "completion", "rpm": 120, "max_concurrent": 4, "admin": false}, ...]}.
`qos` is the class a request gets without a header; `max_qos` the best class it may ask for."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from ..request import Qos

FIELDS = {"name", "key", "qos", "max_qos", "rpm", "max_concurrent", "admin"}


class PolicyError(ValueError):
    """A policy file that cannot be used; the message says why."""


@dataclass(frozen=True)
class KeyPolicy:
    name: str
    key: str
    qos: Qos | None = None  # None: the server's default class
    max_qos: Qos = Qos.INTERACTIVE  # the best class this key may ask for
    rpm: int | None = None
    max_concurrent: int | None = None
    admin: bool = False


def _qos(value, where: str) -> Qos:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return Qos(value)
    if isinstance(value, str) and value.upper() in Qos.__members__:
        return Qos[value.upper()]
    raise PolicyError(f"{where}: unknown QoS class {value!r} (interactive, completion, agent, background)")


def _positive(value, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(f"{where}: must be a positive integer, got {value!r}")
    return value


def parse_policies(text: str, source: str = "key policy") -> list[KeyPolicy]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PolicyError(f"{source}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or set(data) != {"keys"} or not isinstance(data["keys"], list):
        raise PolicyError(f'{source}: expected {{"keys": [...]}} and nothing else')
    if not data["keys"]:
        raise PolicyError(f"{source}: the key list is empty")
    out: list[KeyPolicy] = []
    names, keys = set(), set()
    for i, k in enumerate(data["keys"]):
        where = f"{source}: keys[{i}]"
        if not isinstance(k, dict):
            raise PolicyError(f"{where}: must be an object")
        unknown = set(k) - FIELDS
        if unknown:
            raise PolicyError(f"{where}: unknown fields {sorted(unknown)}")
        name, key = k.get("name"), k.get("key")
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{where}: 'name' must be a non-empty string")
        if not isinstance(key, str) or len(key) < 8:
            raise PolicyError(f"{where}: 'key' must be a string of at least 8 characters")
        if name in names:
            raise PolicyError(f"{where}: duplicate name {name!r}")
        if key in keys:
            raise PolicyError(f"{where}: duplicate key (also used by another entry)")
        if "admin" in k and not isinstance(k["admin"], bool):
            raise PolicyError(f"{where}: 'admin' must be true or false")
        names.add(name)
        keys.add(key)
        out.append(KeyPolicy(
            name=name, key=key,
            qos=_qos(k["qos"], f"{where}.qos") if "qos" in k else None,
            max_qos=_qos(k["max_qos"], f"{where}.max_qos") if "max_qos" in k else Qos.INTERACTIVE,
            rpm=_positive(k.get("rpm"), f"{where}.rpm"),
            max_concurrent=_positive(k.get("max_concurrent"), f"{where}.max_concurrent"),
            admin=bool(k.get("admin", False))))
    return out


def load_policies(path: str) -> list[KeyPolicy]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PolicyError(f"cannot read key policy {path}: {e.strerror}") from None
    return parse_policies(text, path)


def find_key(policies: list[KeyPolicy], presented: str) -> KeyPolicy | None:
    """Constant-time comparison against every key (no early exit on a match)."""
    found = None
    for p in policies:
        if hmac.compare_digest(p.key.encode(), presented.encode()):
            found = p
    return found


# -- who may see what: keys own their sessions ------------------------------------------------
def key_of(request) -> KeyPolicy | None:
    """The key a request came with (None: the server has no keys)."""
    return request.scope.get("state", {}).get("key")


def owner_of(request) -> str | None:
    """The name a request's sessions and stored responses are recorded under."""
    key = key_of(request)
    return key.name if key is not None else None


def may_see(request, owner: str | None) -> bool:
    """A key sees only its own sessions; an admin key, or a server without keys, sees all."""
    key = key_of(request)
    return key is None or key.admin or owner == key.name


def listed_owner(request) -> str | None:
    """Whose sessions a list shows (None: everyone's)."""
    key = key_of(request)
    return None if key is None or key.admin else key.name
