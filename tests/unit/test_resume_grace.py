"""The resume grace is read on the daemon's clock: a generation nobody watches is cut once the
clock says its grace ran out (service/watchers.Live), so these tests advance a clock instead of
sleeping through the grace."""

import asyncio

from superfluid.request import GenRequest, SamplingParams
from superfluid.service.watchers import Live


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _gen(live: Live, cancelled: list[str], rid: str = "gen_1", sid: str = "sess_1"):
    req = GenRequest(rid, [1, 2, 3], SamplingParams(), 8, session=sid)
    return live.started(req, lambda: cancelled.append(rid) or True, next_id=1)


def test_an_unwatched_generation_is_cut_only_when_the_clock_passes_its_grace():
    async def go():
        clock, cancelled = Clock(), []
        live = Live(grace=30, max_backlog=8, clock=clock)
        gen = _gen(live, cancelled)
        live.watch("sess_1")
        live.unwatch(gen)
        assert gen.deadline == 1030.0 and live.expire() == 0 and not cancelled
        clock.now += 29.9
        assert live.expire() == 0 and not gen.dropped
        clock.now += 0.2
        assert live.expire() == 1
        assert cancelled == ["gen_1"] and gen.dropped and gen.timer is None
    asyncio.run(go())


def test_a_resume_within_the_grace_keeps_it_running():
    async def go():
        clock, cancelled = Clock(), []
        live = Live(grace=30, max_backlog=8, clock=clock)
        gen = _gen(live, cancelled)
        live.watch("sess_1")
        live.unwatch(gen)
        clock.now += 20
        assert live.watch("sess_1") is gen and gen.deadline is None  # resumed (Last-Event-ID)
        clock.now += 60
        assert live.expire() == 0 and not cancelled and not gen.dropped
    asyncio.run(go())


def test_the_timer_asks_the_clock_before_it_cuts():
    """The loop's timer fires when the grace should be over; with a clock that says it is not
    (here: one that stands still), nothing is cut until the clock moves on."""
    async def go():
        clock, cancelled = Clock(), []
        live = Live(grace=0.05, max_backlog=8, clock=clock)
        gen = _gen(live, cancelled)
        live.watch("sess_1")
        live.unwatch(gen)
        await asyncio.sleep(0.12)
        assert not cancelled and gen.timer is not None  # looked, and is looking again
        clock.now += 0.05
        await asyncio.sleep(0.12)
        assert cancelled == ["gen_1"] and gen.dropped
    asyncio.run(go())


def test_no_grace_cuts_at_once_and_an_ended_generation_is_never_cut():
    async def go():
        clock, cancelled = Clock(), []
        live = Live(grace=0, max_backlog=8, clock=clock)
        gen = _gen(live, cancelled)
        live.watch("sess_1")
        live.unwatch(gen)
        assert cancelled == ["gen_1"] and gen.dropped
        live2 = Live(grace=5, max_backlog=8, clock=clock)
        gen2 = _gen(live2, cancelled, "gen_2", "sess_2")
        live2.watch("sess_2")
        live2.unwatch(gen2)
        assert live2.ended("gen_2") is gen2 and gen2.ended.is_set() and not live2.busy("sess_2")
        clock.now += 10
        assert live2.expire() == 0 and cancelled == ["gen_1"]
    asyncio.run(go())
