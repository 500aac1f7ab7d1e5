"""Placement policies, pure."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from superfluid.errors import ProtocolError
from superfluid.fleet.placement import pick, split_layers
from superfluid.link.messages import pack_array, unpack_array


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


def test_layers_split_evenly_or_by_memory():
    assert split_layers(30, [1, 1]) == [(0, 15), (15, 30)]
    assert split_layers(30, [1, 1, 1]) == [(0, 10), (10, 20), (20, 30)]
    assert split_layers(30, [3, 1]) == [(0, 22), (22, 30)]  # by reported memory
    assert split_layers(30, [0, 0]) == [(0, 15), (15, 30)]  # nothing reported: even
    assert split_layers(3, [100, 1, 1]) == [(0, 1), (1, 2), (2, 3)]  # every stage holds a layer
    with pytest.raises(ValueError):
        split_layers(2, [1, 1, 1])


@given(st.integers(1, 200), st.lists(st.floats(0, 1e12), min_size=1, max_size=8))
def test_layer_ranges_always_tile_the_model(n_layer, weights):
    if len(weights) > n_layer:
        return
    ranges = split_layers(n_layer, weights)
    assert len(ranges) == len(weights) and ranges[0][0] == 0 and ranges[-1][1] == n_layer
    assert all(a < b for a, b in ranges) and all(r[1] == s[0] for r, s in zip(ranges, ranges[1:], strict=False))


def test_stage_activations_round_trip_and_garbage_is_a_protocol_error():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(unpack_array(pack_array(a)), a)
    assert unpack_array(pack_array(a.astype(np.float16))).dtype == np.float32
    for bad in (None, [], ["float32", 3, 4, b"x" * 47], ["int64", 3, 4, a.tobytes()], ["float32", -1, 4, b""],
                ["float32", 3, "4", a.tobytes()], ["float32", 3, 4, "text"], 7):
        with pytest.raises(ProtocolError):
            unpack_array(bad)
