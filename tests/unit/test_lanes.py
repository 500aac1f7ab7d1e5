"""LanePool: a fixed set of lane ids, lowest first."""

import pytest

from superfluid.sched.lanes import LanePool


def test_lane_pool_hands_out_the_lowest_free_lane():
    p = LanePool(3)
    assert [p.acquire(), p.acquire(), p.acquire(), p.acquire()] == [0, 1, 2, None]
    p.release(2)
    p.release(0)
    assert p.free == 2
    assert p.acquire() == 0


def test_lane_pool_rejects_bad_releases():
    p = LanePool(2)
    with pytest.raises(ValueError):
        p.release(0)  # never acquired
    p.acquire()
    with pytest.raises(ValueError):
        p.release(5)
    p.release(0)
    with pytest.raises(ValueError):
        p.release(0)  # twice


def test_needs_a_lane():
    with pytest.raises(ValueError):
        LanePool(0)
