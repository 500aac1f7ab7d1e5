"""Choosing a node for a generation, pure. Policies:
- load-aware (default): nodes whose window fits, skipping nodes near full KV; among them the
  node holding the longest prefix of the prompt (cache-aware: fleet/prefixes.py), unless it
  is overloaded; otherwise (and on ties) the lowest estimated wait (waiting + placed per lane),
  then the larger share of the model's layers on a GPU (NODE_STATUS `device`).
  A warm node is overloaded when every lane of it is taken while the least-loaded node has a
  free one, or when its wait is a whole round of lanes (1.0) above that node's;
- least-loaded: fewest generations placed;
- round-robin: in turn."""

from __future__ import annotations

from collections.abc import Sequence

POLICIES = ("load-aware", "least-loaded", "round-robin")
KV_FULL = 0.95
BEHIND = 1.0  # waits per lane a warm node may be behind the least-loaded one


def pick(nodes: list, model_id: str, need: int, policy: str, placed: dict[int, int], turn: int,
         want: Sequence[int] = ()):
    """nodes: objects with .window(model_id), .status (NODE_STATUS) and optionally .prefixes
    (the hashes it holds, NODE_PREFIXES); placed: id(node) -> generations the head has on it; want: the
    prompt's sampled prefix hashes (prefixes.wanted). None when no node fits."""
    fits = [n for n in nodes if n.window(model_id) >= need]
    if not fits:
        return None
    if policy == "round-robin":
        return fits[turn % len(fits)]
    if policy == "least-loaded":
        return min(fits, key=lambda n: placed.get(id(n), 0))

    def wait(n) -> float:
        s = n.status or {}
        lanes = max(1, int(s.get("lanes", 1)))
        return (placed.get(id(n), 0) + int(s.get("waiting", 0))) / lanes

    roomy = [n for n in fits if not _kv_full(n.status or {})] or fits
    cold = min(roomy, key=lambda n: (wait(n), -gpu_share(n.status or {})))
    if want:
        warm = [(d, n) for n in roomy if (d := depth(getattr(n, "prefixes", None) or frozenset(), want))]
        for _, n in sorted(warm, key=lambda x: (-x[0], wait(x[1]))):
            if not _overloaded(wait(n), wait(cold)):
                return n
    return cold


def depth(held: frozenset[int], want: Sequence[int]) -> int:
    """How many sampled blocks of the prompt a node holding `held` has: the deepest hit
    (each sampled hash covers every token before it)."""
    if held:
        for i in range(len(want) - 1, -1, -1):
            if want[i] in held:
                return i + 1
    return 0


def gpu_share(s: dict) -> float:
    """The share of its model's layers a node has on a GPU (0 on a CPU node or one that does not say)."""
    d = s.get("device")
    if not isinstance(d, dict):
        return 0.0
    try:
        return max(0.0, min(1.0, int(d.get("layers", 0)) / max(1, int(d.get("of", 1)))))
    except (TypeError, ValueError):
        return 0.0


def _overloaded(w: float, least: float) -> bool:
    return (w >= 1.0 and least < 1.0) or w - least >= BEHIND


def _kv_full(s: dict) -> bool:
    total = int(s.get("kv_total", 0))
    return total > 0 and int(s.get("kv_used", 0)) / total > KV_FULL
