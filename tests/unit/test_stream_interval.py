"""--stream-interval-ms (engine/delivery.py): within the interval a stream's tokens join one
chunk (one log event, one commit, one event to the client); its first token and its end are
delivered at once, and a chunk pushed off the token path stays behind the tokens before it."""

import asyncio
import itertools

from superfluid.engine.delivery import Deliveries, Stream
from superfluid.request import Chunk, FinishReason, GenRequest, SamplingParams
from superfluid.session.events import Event


class Log:
    """A SessionLog whose commits resolve at once."""

    def __init__(self):
        self.commits: list[list] = []
        self._ids = itertools.count(1)

    def commit(self, items):
        self.commits.append([body.text for _, body in items])
        fut = asyncio.get_running_loop().create_future()
        fut.set_result([Event(next(self._ids), 1, 0.0, body) for _, body in items])
        return fut

    def end(self, req, finish):
        pass


def stream(rid: str) -> Stream:
    return Stream(GenRequest(rid, [1, 2], SamplingParams(temperature=0), 16, session="s-" + rid))


def tok(st: Stream, text: str, n: int, finish: FinishReason | None = None) -> tuple[Stream, Chunk]:
    return st, Chunk(st.req.id, text=text, tokens=[n], completion_tokens=n, finish=finish)


def drain(st: Stream) -> list[Chunk]:
    out = []
    while not st.queue.empty():
        out.append(st.queue.get_nowait())
    return out


def test_tokens_within_the_interval_are_one_chunk_and_the_first_and_last_go_at_once():
    async def go():
        log = Log()
        d = Deliveries(log, lambda st, e: None, interval_s=0.05)
        a, b = stream("a"), stream("b")
        d.publish([tok(a, "Hel", 1)])
        await asyncio.sleep(0)
        assert [c.text for c in drain(a)] == ["Hel"]  # the first token: at once
        d.publish([tok(a, "lo", 2), tok(b, "Hi", 1)])  # b's first token flushes a's held one too
        await asyncio.sleep(0)
        assert [c.text for c in drain(a)] == ["lo"] and [c.text for c in drain(b)] == ["Hi"]
        d.publish([tok(a, ",", 3), tok(b, " there", 2)])
        d.publish([tok(a, " you", 4)])
        await asyncio.sleep(0.01)
        assert drain(a) == [] and drain(b) == []  # held for the interval
        await asyncio.sleep(0.06)
        (c,) = drain(a)
        assert (c.text, c.tokens, c.completion_tokens) == (", you", [3, 4], 4) and c.event_id is not None
        assert [x.text for x in drain(b)] == [" there"]
        assert log.commits[-1] == [", you", " there"]  # one commit, one event per stream
        d.publish([tok(a, "!", 5)])
        d.publish([tok(a, "", 6, FinishReason.END_OF_TURN)])  # the end: at once, with what was held
        await asyncio.sleep(0)
        (c,) = drain(a)
        assert (c.text, c.finish, c.tokens) == ("!", FinishReason.END_OF_TURN, [5, 6])
        assert len(log.commits) == 4
    asyncio.run(go())


def test_a_pushed_chunk_comes_after_the_held_tokens_and_drop_names_their_streams():
    async def go():
        d = Deliveries(Log(), lambda st, e: None, interval_s=10.0)
        a, b = stream("a"), stream("b")
        d.publish([tok(a, "x", 1)])
        d.publish([tok(a, "y", 2)])
        d.push(a, a.final(FinishReason.CANCELLED))
        await asyncio.sleep(0)
        assert [(c.text, c.finish) for c in drain(a)] == [("x", None), ("y", None), ("", FinishReason.CANCELLED)]
        d.publish([tok(b, "p", 1)])
        d.publish([tok(b, "q", 2)])
        assert d.drop() == [b]
    asyncio.run(go())


def test_without_an_interval_every_step_is_its_own_commit():
    async def go():
        log = Log()
        d = Deliveries(log, lambda st, e: None)
        a = stream("a")
        for i, t in enumerate(("a", "b", "c"), 1):
            d.publish([tok(a, t, i)])
        await asyncio.sleep(0)
        assert [c.text for c in drain(a)] == ["a", "b", "c"] and log.commits == [["a"], ["b"], ["c"]]
    asyncio.run(go())


def test_the_first_token_stays_its_own_event_when_a_step_gives_several():
    """A speculative step gives a stream several tokens at once: the first one's event is
    still its own (it carries the prompt's cached tokens in the log)."""
    async def go():
        log = Log()
        d = Deliveries(log, lambda st, e: None, interval_s=0.05)
        a = stream("a")
        d.publish([tok(a, "A", 1), tok(a, "B", 2), tok(a, "C", 3)])
        await asyncio.sleep(0)
        assert [c.text for c in drain(a)] == ["A", "BC"] and log.commits == [["A", "BC"]]
    asyncio.run(go())
