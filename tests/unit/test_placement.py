"""Placement policies, pure."""

from superfluid.fleet.placement import pick


class N:
    def __init__(self, name, window, **status):
        self.name, self._w, self.status = name, window, status

    def window(self, model_id):
        return self._w


def test_only_nodes_whose_window_fits():
    small, big = N("s", 512), N("b", 4096)
    assert pick([small, big], "m", 1000, "load-aware", {}, 0) is big
    assert pick([small], "m", 1000, "load-aware", {}, 0) is None


def test_load_aware_prefers_the_shortest_wait_and_skips_full_kv():
    a = N("a", 4096, lanes=8, waiting=0, kv_used=10, kv_total=100)
    b = N("b", 4096, lanes=2, waiting=0, kv_used=10, kv_total=100)
    assert pick([a, b], "m", 100, "load-aware", {id(a): 4, id(b): 4}, 0) is a  # 4/8 vs 4/2 per lane
    full = N("f", 4096, lanes=8, waiting=0, kv_used=99, kv_total=100)
    assert pick([full, b], "m", 100, "load-aware", {id(b): 5}, 0) is b
    assert pick([full], "m", 100, "load-aware", {}, 0) is full  # nothing better: still served


def test_least_loaded_and_round_robin():
    a, b, c = N("a", 4096), N("b", 4096), N("c", 4096)
    assert pick([a, b, c], "m", 10, "least-loaded", {id(a): 2, id(b): 0, id(c): 1}, 0) is b
    assert [pick([a, b, c], "m", 10, "round-robin", {}, t).name for t in range(4)] == ["a", "b", "c", "a"]
