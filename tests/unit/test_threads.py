"""The thread governor: every core while the machine is quiet, fewer while other processes
keep cores busy (runtime/threads.py)."""

from superfluid.runtime.threads import PERIOD_S, QUICK_S, ThreadGovernor, threads_for


def test_threads_for_gives_up_a_core_per_busy_core_beyond_half_of_one():
    assert threads_for(0.0, 8) == 8
    assert threads_for(0.5, 8) == 8  # the daemon's own Python, a client: tolerated
    assert threads_for(0.6, 8) == 7
    assert threads_for(1.5, 8) == 7
    assert threads_for(1.6, 8) == 6
    assert threads_for(0.9, 2) == 1
    assert threads_for(7.9, 2) == 1  # never none
    assert threads_for(0.0, 1) == 1


class Machine:
    """/proc/stat and this process's CPU time, in ticks, driven by the test."""

    def __init__(self, cpus: int):
        self.cpus, self.busy, self.total, self.own = cpus, 0, 0, 0

    def run(self, ticks: int, own: float, others: float) -> None:
        """`ticks` of wall time per CPU: this process used `own` cores, the rest `others`."""
        self.total += self.cpus * ticks
        self.busy += round((own + others) * ticks)
        self.own += round(own * ticks)


def governor(m: Machine, most: int):
    applied: list[int] = []
    g = ThreadGovernor(most, applied.append, machine=lambda: (m.busy, m.total), own=lambda: m.own, cpus=m.cpus)
    return g, applied


def test_the_governor_follows_other_processes_load():
    m = Machine(cpus=2)
    g, applied = governor(m, 2)
    t = 0.0
    assert g.threads(t) == 2  # the first look only takes a baseline
    m.run(100, own=2.0, others=0.0)
    t += PERIOD_S
    assert g.threads(t) == 2 and applied == []  # its own spinning threads are not "others"
    m.run(100, own=1.0, others=1.0)  # a build took a core
    t += PERIOD_S
    assert g.threads(t) == 1 and applied == [1]
    assert 0.99 < g.others < 1.01
    m.run(100, own=1.0, others=1.0)
    t += PERIOD_S / 2
    assert g.threads(t) == 1 and applied == [1]  # looked at once a period, changes only applied
    m.run(100, own=1.9, others=0.1)
    t += PERIOD_S
    assert g.threads(t) == 1  # since the last look: half busy, half quiet (0.55 cores)
    m.run(100, own=1.9, others=0.1)
    t += PERIOD_S
    assert g.threads(t) == 2 and applied == [1, 2]  # the machine is quiet again: every core


def test_a_single_thread_is_never_governed():
    m = Machine(cpus=4)
    g, applied = governor(m, 1)
    m.run(100, own=1.0, others=3.0)
    assert g.threads(0.0) == 1 and g.threads(10.0) == 1 and applied == []


def test_no_proc_keeps_the_current_count():
    def broken():
        raise OSError("no /proc")
    g = ThreadGovernor(4, lambda n: None, machine=broken, own=lambda: 0, cpus=4)
    assert g.threads(0.0) == 4 and g.threads(5.0) == 4


def test_a_look_over_an_idle_spell_keeps_the_count_and_looks_again_soon():
    """While the worker slept, another process's burst (another server's answer, an agent's
    test run) says little about now: the count is kept and the machine looked at again
    QUICK_S later, instead of a whole period on one thread."""
    m = Machine(cpus=2)
    g, applied = governor(m, 2)
    t = 0.0
    g.threads(t)
    m.run(500, own=0.0, others=2.0)  # the worker idle for five periods, a build on both cores
    t += 5 * PERIOD_S
    assert g.threads(t) == 2 and applied == []
    assert g.threads(t + QUICK_S / 2) == 2  # not yet
    m.run(10, own=2.0, others=0.0)  # the build is over
    soon = 1.01 * QUICK_S
    assert g.threads(t + soon) == 2 and applied == []
    m.run(500, own=0.0, others=2.0)  # idle again, and this time the build goes on
    t += soon + 5 * PERIOD_S
    assert g.threads(t) == 2
    m.run(10, own=1.0, others=1.0)
    assert g.threads(t + soon) == 1 and applied == [1]  # a tenth of a second later, it knows


def test_a_worker_that_steps_on_a_crowded_machine_is_not_idle():
    """Steps every 50 ms, the worker held to a third of a core by other work: a thread is
    given up all the same."""
    m = Machine(cpus=2)
    g, applied = governor(m, 2)
    t = 0.0
    g.threads(t)
    for _ in range(12):
        m.run(5, own=0.3, others=1.7)
        t += 0.05
        g.threads(t)
    assert applied == [1] and g.current == 1
