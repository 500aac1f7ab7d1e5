"""Placement policies, pure."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from superfluid.errors import ProtocolError
from superfluid.fleet.placement import pick
from superfluid.runtime.pipeline import split_layers
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


def test_on_a_tie_the_node_with_more_layers_on_a_gpu_wins():
    cpu = N("cpu", 4096, lanes=8, waiting=0, device={"devices": ["CPU"], "layers": 0})
    half = N("half", 4096, lanes=8, waiting=0, device={"devices": ["CUDA0"], "layers": 16, "of": 33})
    gpu = N("gpu", 4096, lanes=8, waiting=0, device={"devices": ["CUDA0"], "layers": 33, "of": 33})
    assert pick([cpu, half, gpu], "m", 100, "load-aware", {}, 0) is gpu
    assert pick([cpu, half], "m", 100, "load-aware", {}, 0) is half
    # a shorter wait still comes first; a malformed report counts as no GPU
    assert pick([cpu, gpu], "m", 100, "load-aware", {id(gpu): 4}, 0) is cpu
    odd = N("odd", 4096, lanes=8, waiting=0, device={"layers": "many", "of": 0})
    assert pick([odd, half], "m", 100, "load-aware", {}, 0) is half


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


def _warm(name, window=4096, held=(), **status):
    n = N(name, window, **status)
    n.prefixes = frozenset(held)
    return n


def test_cache_aware_places_on_the_node_holding_the_longest_prefix():
    from superfluid.fleet.prefixes import wanted
    convo = list(range(1000, 1900))  # 900 tokens: 3 sampled hashes (256-token grain)
    want = wanted(convo + [7, 8, 9])
    assert len(want) == 3
    cold = _warm("cold", lanes=4)
    short = _warm("short", lanes=4, held=wanted(convo[:600]))  # its first 512 tokens
    deep = _warm("deep", lanes=4, held=wanted(convo))
    # the deepest wins even when it is busier (not overloaded); cold nodes never match
    assert pick([cold, short, deep], "m", 100, "load-aware", {id(deep): 2, id(short): 1}, 0, want) is deep
    assert pick([cold, short], "m", 100, "load-aware", {id(short): 1}, 0, want) is short
    # without a prompt hash, or under the other policies, the load alone decides
    assert pick([deep, cold], "m", 100, "load-aware", {id(deep): 1}, 0, ()) is cold
    assert pick([deep, cold], "m", 100, "least-loaded", {id(deep): 1}, 0, want) is cold
    # a distinct prompt finds no warm node
    assert pick([deep, cold], "m", 100, "load-aware", {id(deep): 1}, 0, wanted(list(range(900)))) is cold


def test_cache_affinity_breaks_ties_and_yields_to_overload_and_full_kv():
    from superfluid.fleet.prefixes import wanted
    convo = list(range(5000, 5600))
    want = wanted(convo)
    a, b = _warm("a", lanes=4), _warm("b", lanes=4, held=want)
    assert pick([a, b], "m", 100, "load-aware", {}, 0, want) is b  # a tie: the warm one
    # every lane of the warm node taken while the other has a free one: the load rule wins
    assert pick([a, b], "m", 100, "load-aware", {id(b): 4, id(a): 3}, 0, want) is a
    # both saturated, the warm one less than a round of lanes behind: still warm
    assert pick([a, b], "m", 100, "load-aware", {id(b): 6, id(a): 4}, 0, want) is b
    assert pick([a, b], "m", 100, "load-aware", {id(b): 8, id(a): 4}, 0, want) is a  # a whole round behind
    full = _warm("f", lanes=4, held=want, kv_used=99, kv_total=100)
    assert pick([a, full], "m", 100, "load-aware", {}, 0, want) is a
    small = _warm("s", window=256, lanes=4, held=want)
    assert pick([a, small], "m", 1000, "load-aware", {}, 0, want) is a  # its window does not fit


def test_prefix_summaries_round_trip_bounded_and_optional():
    from superfluid.fleet.prefixes import GRAIN, LIMIT, from_wire, summarize, to_wire, wanted
    one, two = list(range(700)), list(range(1, 2000))
    hashes = summarize([(one, ""), (two, ""), (list(range(100)), "")], disk=[11, 12])
    assert hashes[:2] == wanted(one) and hashes[2:2 + len(wanted(two))] == wanted(two) and hashes[-2:] == [11, 12]
    assert from_wire({"prefix": to_wire(hashes), "prefix_tokens": GRAIN}) == frozenset(hashes)
    assert len(summarize([(list(range(i, i + 300)), "") for i in range(LIMIT + 10)])) == LIMIT
    assert summarize([(one, ""), (one, "")]) == wanted(one)  # deduplicated
    assert not set(summarize([(one, "ns-a")])) & set(wanted(one))  # another namespace's prefix is not this one
    for bad in ({}, {"prefix": b"x" * 7, "prefix_tokens": GRAIN}, {"prefix": to_wire([1]), "prefix_tokens": 64},
                {"prefix": "text", "prefix_tokens": GRAIN}):
        assert from_wire(bad) == frozenset()


def test_a_node_summarises_its_slots_and_disk_and_recomputes_only_when_they_change():
    from types import SimpleNamespace as NS

    from superfluid.fleet.prefixes import NodeSummary, from_wire, wanted
    from superfluid.sched.kvdisk import DiskIndex
    from superfluid.sched.lanes import Slot
    running = NS(kv_tokens=lambda: list(range(300)), cache_ns="")
    disk = DiskIndex()
    disk.add(1, list(range(50, 1100)))
    slots = [Slot(0, None, list(range(9, 600)), last_used=3), Slot(1, running, [], last_used=1),
             Slot(2, None, [], last_used=0)]
    eng = NS(steps=5, sched=NS(slots=NS(slots=slots), tiers=NS(disk=disk)))
    s = NodeSummary()
    held = from_wire(s.fields(eng))
    assert held == frozenset(wanted(list(range(300))) + wanted(list(range(9, 600))) + disk.summary())
    slots[0].kv = []
    assert from_wire(s.fields(eng)) == held  # the engine has not stepped: the cached summary
    eng.steps = 6
    assert from_wire(s.fields(eng)) == frozenset(wanted(list(range(300))) + disk.summary())
    empty = NS(steps=0, sched=NS(slots=NS(slots=[]), tiers=NS(disk=None)))
    assert from_wire(NodeSummary().fields(empty)) == frozenset()
    assert NodeSummary().fields(None) == {}  # a pipeline stage: no scheduler, no message
