"""WaitQueue: class order, first come within a class, front requeue, aging."""

import pytest

from superfluid.request import Qos
from superfluid.sched.queues import WaitQueue


class W:
    def __init__(self, id, qos):
        self.id, self.qos, self.enqueued_step, self.order = id, qos, 0, 0


def ids(q, step=0):
    return [j.id for j in q.ordered(step)]


def test_best_class_first_then_fifo():
    q = WaitQueue()
    for i, c in [("a", Qos.AGENT), ("b", Qos.BACKGROUND), ("c", Qos.INTERACTIVE), ("d", Qos.AGENT)]:
        q.push(W(i, c), 0)
    assert ids(q) == ["c", "a", "d", "b"]
    assert q.count(Qos.AGENT) == 2 and len(q) == 4


def test_push_front_goes_ahead_of_its_class():
    q = WaitQueue()
    q.push(W("a", Qos.AGENT), 0)
    q.push(W("x", Qos.INTERACTIVE), 0)
    q.push_front(W("v", Qos.AGENT), 0)
    assert ids(q) == ["x", "v", "a"]


def test_aging_raises_a_waiting_job_one_class_per_period():
    q = WaitQueue(aging_steps=10)
    q.push(W("bg", Qos.BACKGROUND), 0)
    q.push(W("ag", Qos.AGENT), 0)
    assert ids(q, 5) == ["ag", "bg"]
    q.remove("ag")
    q.push(W("ag2", Qos.AGENT), 20)
    assert ids(q, 20) == ["bg", "ag2"]  # bg waited 20 steps: it competes as a completion job now
    assert q.effective(q.ordered(20)[0], 20) == Qos.COMPLETION
    assert q.effective(q.ordered(100)[0], 100) == 0  # never better than interactive


def test_remove():
    q = WaitQueue()
    q.push(W("a", Qos.AGENT), 0)
    assert q.remove("a").id == "a" and q.remove("a") is None and len(q) == 0


def test_aging_steps_must_be_positive():
    with pytest.raises(ValueError):
        WaitQueue(aging_steps=0)
