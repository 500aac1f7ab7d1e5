"""Choosing a node for a generation, pure. Policies:
- load-aware (default): nodes whose window fits, skipping nodes near full KV, lowest
  estimated wait (running + waiting + placed per lane);
- least-loaded: fewest generations placed;
- round-robin: in turn."""

from __future__ import annotations

POLICIES = ("load-aware", "least-loaded", "round-robin")
KV_FULL = 0.95


def pick(nodes: list, model_id: str, need: int, policy: str, placed: dict[int, int], turn: int):
    """nodes: objects with .window(model_id) and .status (NODE_STATUS); placed: id(node) ->
    generations the head has on it. None when no node fits."""
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
    return min(roomy, key=wait)


def _kv_full(s: dict) -> bool:
    total = int(s.get("kv_total", 0))
    return total > 0 and int(s.get("kv_used", 0)) / total > KV_FULL


def split_layers(n_layer: int, weights: list[float]) -> list[tuple[int, int]]:
    """Contiguous layer ranges [first, last), one per stage, in proportion to `weights`
    (equal weights: an even split; reported memory: by memory); every stage holds at
    least one layer."""
    k = len(weights)
    if not 0 < k <= n_layer:
        raise ValueError(f"{k} stages cannot split {n_layer} layers")
    total = sum(max(0.0, x) for x in weights)
    w = [max(0.0, x) / total for x in weights] if total > 0 else [1 / k] * k
    bounds, acc = [0], 0.0
    for i in range(k - 1):
        acc += w[i]
        lo, hi = bounds[-1] + 1, n_layer - (k - 1 - i)  # room for one layer per later stage
        bounds.append(min(max(round(acc * n_layer), lo), hi))
    bounds.append(n_layer)
    return list(zip(bounds, bounds[1:], strict=False))
