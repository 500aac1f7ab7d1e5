"""ClassQueues: one FIFO per QoS class."""

from superfluid.request import Qos
from superfluid.sched.queues import ClassQueues


def test_class_queues_best_class_first_fifo_within_a_class():
    q: ClassQueues[str] = ClassQueues()
    q.push(Qos.BACKGROUND, "bg", "bg")
    q.push(Qos.AGENT, "a1", "a1")
    q.push(Qos.AGENT, "a2", "a2")
    q.push(Qos.INTERACTIVE, "i", "i")
    q.push_front(Qos.AGENT, "a0", "a0")
    assert list(q) == ["i", "a0", "a1", "a2", "bg"]
    assert q.remove("a1") == "a1" and q.remove("a1") is None
    assert len(q) == 4
    assert [q.pop() for _ in range(5)] == ["i", "a0", "a2", "bg", None]


def test_empty_queue():
    q: ClassQueues[int] = ClassQueues()
    assert len(q) == 0 and q.pop() is None and list(q) == [] and q.remove("x") is None
