"""KvSlots: longest-prefix match, in-place reuse vs copy, eviction order."""

import pytest

from superfluid.sched.lanes import KvSlots
from superfluid.sched.prefix import common_prefix


class J:
    def __init__(self, kv, cache_ns=""):
        self.kv, self.cache_ns = kv, cache_ns


def held(job):
    return job.kv


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    long = list(range(1000))
    assert common_prefix(long, long[:700] + [-1]) == 700
    assert common_prefix(long, long) == 1000


def test_best_match_prefers_the_longest_prefix():
    s = KvSlots(3)
    s[0].kv = [1, 2]
    s[1].kv = [1, 2, 3, 4]
    slot, n = s.best_match([1, 2, 3, 9], held)
    assert (slot.seq, n) == (1, 3)


def test_running_slots_match_through_their_job():
    s = KvSlots(2)
    s[1].job = J([5, 6, 7])
    slot, n = s.best_match([5, 6, 7, 8], held)
    assert (slot.seq, n) == (1, 3)


def test_tie_goes_to_a_free_slot():
    s = KvSlots(2)
    s[0].job = J([5, 6])
    s[1].kv = [5, 6]
    slot, n = s.best_match([5, 6, 7], held)
    assert (slot.seq, n) == (1, 2)


def test_no_match():
    s = KvSlots(2)
    assert s.best_match([1], held) == (None, 0)


def test_a_job_matches_only_its_own_namespace():
    """Key B must not reuse (and so learn of, through cached_tokens or timing) key A's KV."""
    s = KvSlots(3)
    s[0].kv, s[0].ns = [1, 2, 3, 4], "a"
    s[1].job = J([1, 2, 3], "a")
    s[2].kv = [1, 2]
    assert s.best_match([1, 2, 3, 4, 5], held, ns="b") == (None, 0)
    assert s.best_match([1, 2, 3, 4, 5], held) == (s[2], 2)  # the shared namespace's own entry
    assert s.best_match([1, 2, 3, 4, 5], held, ns="a") == (s[0], 4)
    assert s.best_match([1, 2, 3, 9], held, ns="a", exclude=0) == (s[1], 3)


def test_eviction_order_empty_then_unreused_then_lru():
    s = KvSlots(4)
    s[0].kv, s[0].hits, s[0].last_used = [1], 3, 1
    s[1].kv, s[1].hits, s[1].last_used = [2], 0, 9
    s[2].kv, s[2].hits, s[2].last_used = [3], 0, 5
    s[3].job = J([4])
    assert s.evictable().seq == 2  # never reused, least recently used
    s[2].hits = 1
    assert s.evictable().seq == 1
    s[1].hits = 1
    assert s.evictable().seq == 2  # all reused: 2 is next to the running lane 3
    s[3].job, s[3].kv, s[3].hits, s[3].last_used = None, [4], 1, 20
    assert s.evictable().seq == 0  # none running: least recently used
    s[3].job = J([4])
    s[0].kv = []
    assert s.evictable(avoid=s[0]).seq == 2  # avoid excludes; running never evicted


def test_a_slot_next_to_a_running_one_comes_before_lru_within_its_class():
    # llama.cpp computes consecutive sequences together: lanes packed side by side decode in
    # one graph compute per step
    s = KvSlots(8)
    for i in range(8):
        s[i].kv, s[i].last_used = [i], i + 1
    s[4].job = J([4])
    assert s.evictable().seq == 3  # 3 and 5 are next to 4: the less recently used
    s[3].hits = 1  # a reused entry is a dearer class: never traded for adjacency
    assert s.evictable().seq == 5
    s[5].hits = 1
    assert s.evictable().seq == 0  # no cheap slot is adjacent: least recently used
    s[6].job = J([6])
    assert s.evictable().seq == 7  # next to the new running lane 6, though the most recent
    s[0].kv = []
    assert s.evictable().seq == 0  # an empty slot first, adjacent or not
    empty = KvSlots(6)
    empty[2].job = J([1])
    assert empty.evictable().seq == 1  # empty slots alike: the one next to the running lane
    empty[1].job = J([1])
    assert empty.evictable().seq == 0


def test_at_least_one_slot():
    with pytest.raises(ValueError):
        KvSlots(0)
