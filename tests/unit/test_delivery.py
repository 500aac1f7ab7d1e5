"""Delivery (delivery.py) on the real engine loop: a session-backed stream's chunks reach
its client only once the session log has committed them, in order across steps, and a
failed commit ends that stream with the log's typed error."""

import asyncio
import itertools

from superfluid.errors import StoreError, SuperfluidError
from superfluid.request import FinishReason, GenRequest, SamplingParams
from superfluid.session.events import Event

from ..fakes import FakeModel
from .test_engine_loop import until

GREEDY = SamplingParams(temperature=0)


class HeldLog:
    """A SessionLog whose group commits resolve when the test says."""

    def __init__(self):
        self.commits: list[tuple[list, asyncio.Future]] = []
        self.ended: list[tuple[str, FinishReason]] = []
        self._ids = itertools.count(100)

    def commit(self, items):
        fut = asyncio.get_running_loop().create_future()
        self.commits.append((items, fut))
        return fut

    def end(self, req, finish):
        self.ended.append((req.id, finish))

    def ok(self, i: int) -> list[int]:
        items, fut = self.commits[i]
        evs = [Event(next(self._ids), 1, 0.0, body) for _, body in items]
        fut.set_result(evs)
        return [e.id for e in evs]


def session_req(m: FakeModel, rid: str, text: str = "hi", max_tokens: int = 32) -> GenRequest:
    return GenRequest(rid, m.vocab.encode_prompt(text), GREEDY, max_tokens, session="sess-" + rid)


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def run(m: FakeModel, body):
    async def go():
        log = HeldLog()
        eng = m.engine(log)
        await eng.start()
        try:
            return await body(eng, log)
        finally:
            await eng.close()
    return asyncio.run(go())


def consume(it, into: list) -> asyncio.Task:
    async def pump():
        async for c in it:
            into.append(c)
    return asyncio.ensure_future(pump())


def test_chunks_reach_the_client_only_after_their_commit_resolves():
    m = FakeModel()

    async def body(eng, log):
        got: list = []
        task = consume(eng.submit(session_req(m, "r1")), got)
        await until(lambda: len(log.commits) == 4)  # "Hello", " world", ".", end of turn: one commit a step
        await settle()
        assert got == []  # generated and in the log's hands, not the client's
        assert [body.text for items, _ in log.commits for _, body in items] == ["Hello", " world", ".", ""]
        ids = log.ok(0)
        await settle()
        assert [c.text for c in got] == ["Hello"] and got[0].event_id == ids[0]
        for i in (1, 2, 3):
            log.ok(i)
        await task
        return got
    got = run(m, body)
    assert [c.text for c in got] == ["Hello", " world", ".", ""] and got[-1].finish == FinishReason.END_OF_TURN
    assert [c.event_id for c in got] == [100, 101, 102, 103]


def test_order_is_kept_when_later_commits_resolve_first():
    m = FakeModel()

    async def body(eng, log):
        got: list = []
        task = consume(eng.submit(session_req(m, "r1")), got)
        await until(lambda: len(log.commits) == 4)
        for i in (3, 2, 1):
            log.ok(i)
        await settle()
        assert got == []  # the first step's commit holds the rest back
        log.ok(0)
        await task
        return got
    got = run(m, body)
    assert [c.text for c in got] == ["Hello", " world", ".", ""]
    assert [c.event_id for c in got] == [103, 102, 101, 100]  # each chunk got its own commit's event


def test_a_failed_commit_ends_that_stream_with_the_logs_error_and_stops_it():
    m = FakeModel(lambda p: m.vocab.script(*["hm"] * 100))
    err = StoreError("the disk is full")

    async def body(eng, log):
        got: list = []
        task = consume(eng.submit(session_req(m, "r1", max_tokens=100)), got)
        await until(lambda: len(log.commits) >= 2)
        log.ok(0)
        log.commits[1][1].set_result([err])
        await task
        await until(lambda: eng.idle)
        for i, (_, fut) in enumerate(log.commits):  # steps already in flight: committed, never delivered
            if not fut.done():
                log.ok(i)
        await settle()
        return got, len(log.commits)
    got, n_commits = run(m, body)
    assert [c.text for c in got[:-1]] == ["hm"]
    assert got[-1].finish == FinishReason.ERROR and got[-1].error is err
    assert n_commits < 100  # it stopped generating


def test_a_log_that_fails_the_whole_commit_ends_the_stream_with_a_typed_error():
    m = FakeModel()

    async def body(eng, log):
        got: list = []
        task = consume(eng.submit(session_req(m, "r1")), got)
        await until(lambda: len(log.commits) >= 1)
        log.commits[0][1].set_exception(OSError("gone"))
        await task
        return got
    got = run(m, body)
    assert len(got) == 1 and got[0].finish == FinishReason.ERROR
    assert isinstance(got[0].error, SuperfluidError) and "gone" in got[0].error.message


def test_a_cancel_arrives_behind_the_tokens_waiting_for_their_commit():
    m = FakeModel(lambda p: m.vocab.script(*["hm"] * 100))

    async def body(eng, log):
        got: list = []
        task = consume(eng.submit(session_req(m, "r1", max_tokens=100)), got)
        await until(lambda: len(log.commits) >= 2)
        eng.cancel("r1")
        n = len(log.commits)
        await settle()
        assert got == []
        for i in range(n):
            log.ok(i)
        await task
        return got, n
    got, n = run(m, body)
    assert [c.text for c in got[:-1]] == ["hm"] * n and got[-1].finish == FinishReason.CANCELLED


def test_a_request_without_a_session_does_not_wait_for_the_log():
    m = FakeModel()

    async def body(eng, log):
        r = GenRequest("r1", m.vocab.encode_prompt("hi"), GREEDY, 32)
        return [c async for c in eng.submit(r)], log.commits
    got, commits = run(m, body)
    assert "".join(c.text for c in got) == "Hello world." and commits == []
