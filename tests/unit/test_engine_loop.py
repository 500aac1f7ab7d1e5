"""The real engine loop (engine.Engine: scheduler, worker steps, output processor, delivery)
on an in-process fake runtime: no worker process, no model."""

import asyncio

from superfluid.errors import WorkerCrashed, WorkerUnavailable
from superfluid.request import FinishReason, GenRequest, Qos, SamplingParams

from ..fakes import BOOM, FakeModel, replies

GREEDY = SamplingParams(temperature=0)


def req(model: FakeModel, rid: str, text: str, max_tokens: int = 32, **kw) -> GenRequest:
    return GenRequest(rid, model.vocab.encode_prompt(text), kw.pop("sampling", GREEDY), max_tokens, **kw)


async def drain(stream) -> list:
    return [c async for c in stream]


async def until(cond, timeout: float = 5.0) -> None:
    async def wait():
        while not cond():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(wait(), timeout)


def run(model: FakeModel, body, **cfg):
    """Start an engine on `model`, run body(engine), close it."""
    async def go():
        eng = model.engine(**cfg)
        await eng.start()
        try:
            return await body(eng)
        finally:
            await eng.close()
    return asyncio.run(go())


def test_a_generation_streams_its_tokens_in_order_then_finishes():
    m = FakeModel()
    script = m.vocab.script("Hello world.")

    async def body(eng):
        r = req(m, "r1", "hi")
        eng.check(r)
        return await drain(eng.submit(r))
    chunks = run(m, body)
    assert [t for c in chunks for t in c.tokens] == script + [m.vocab.eos]
    assert [c.text for c in chunks] == ["Hello", " world", ".", ""]
    assert [c.finish for c in chunks] == [None] * 3 + [FinishReason.END_OF_TURN]
    assert [c.completion_tokens for c in chunks] == [1, 2, 3, 4]
    last = chunks[-1]
    assert last.prompt_tokens == len(m.vocab.encode_prompt("hi")) and last.ttft_s is not None
    assert m.runtimes and m.runtime.prompts == [m.vocab.encode_prompt("hi")]


def test_max_tokens_and_a_stop_string_end_it():
    m = FakeModel(lambda p: m.vocab.script(" Once upon a time"))

    async def body(eng):
        cut = await drain(eng.submit(req(m, "r1", "a", max_tokens=2)))
        stop = await drain(eng.submit(req(m, "r2", "b", stop=(" a",))))
        return cut, stop
    cut, stop = run(m, body)
    assert "".join(c.text for c in cut) == " Once upon" and cut[-1].finish == FinishReason.LENGTH
    assert "".join(c.text for c in stop) == " Once upon"
    assert stop[-1].finish == FinishReason.STOP_SEQUENCE and stop[-1].stop_sequence == " a"


def test_logprobs_come_with_each_token():
    m = FakeModel()

    async def body(eng):
        return await drain(eng.submit(req(m, "r1", "hi", sampling=SamplingParams(temperature=0, top_logprobs=2))))
    chunks = run(m, body)
    lps = [lp for c in chunks for lp in c.logprobs]
    assert [lp.text for lp in lps] == [b"Hello", b" world", b"."]
    assert all(lp.logprob > -1e-6 and len(lp.top) == 2 and lp.top[0][0] == lp.token for lp in lps)


def test_cancel_ends_the_stream_and_frees_its_lane():
    m = FakeModel(lambda p: m.vocab.script(*["hm"] * 400))

    async def body(eng):
        it = eng.submit(req(m, "r1", "hi", max_tokens=400))
        got = [await it.__anext__() for _ in range(3)]
        assert eng.cancel("r1") is True
        assert eng.cancel("r1") is False  # once
        got += await drain(it)
        await until(lambda: eng.idle)
        return got
    chunks = run(m, body)
    assert chunks[-1].finish == FinishReason.CANCELLED and chunks[-1].error is None
    assert all(c.finish is None for c in chunks[:-1]) and len(chunks) < 400


def test_a_consumer_that_goes_away_cancels_its_generation():
    m = FakeModel(lambda p: m.vocab.script(*["hm"] * 400))

    async def body(eng):
        it = eng.submit(req(m, "r1", "hi", max_tokens=400))
        await it.__anext__()
        await it.aclose()
        await until(lambda: eng.idle)
        return eng.cancel("r1")
    assert run(m, body) is False  # nothing is left to cancel


def test_two_lanes_run_in_the_same_steps_each_with_its_own_output():
    m = FakeModel()
    m.reply = replies(m.vocab, {"first": m.vocab.script(" Once upon a time"), "second": m.vocab.script("Hello world.")})
    order: list[str] = []

    async def body(eng):
        async def one(r):
            out = []
            async for c in eng.submit(r):
                order.append(r.id)
                out.append(c)
            return out
        return await asyncio.gather(one(req(m, "a", "first")), one(req(m, "b", "second")))
    a, b = run(m, body)
    assert "".join(c.text for c in a) == " Once upon a time" and a[-1].finish == FinishReason.END_OF_TURN
    assert "".join(c.text for c in b) == "Hello world." and b[-1].finish == FinishReason.END_OF_TURN
    assert any(len(set(seqs)) == 2 for seqs in m.runtime.batches)  # one forward fed both lanes
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")  # b started before a ended


def test_a_runtime_error_fails_every_lane_on_the_worker_and_the_worker_is_respawned():
    """Today's behaviour: the worker reports the error and exits; every running request ends
    with WorkerCrashed (the tokens before the failing step were delivered), the engine starts
    a new worker at once, and the next request runs on it."""
    m = FakeModel()
    m.reply = replies(m.vocab, {"bad": m.vocab.script("Hello", " world", ".", BOOM),
                                "good": m.vocab.script(*["hm"] * 50)}, m.vocab.script("Hello world."))

    async def body(eng):
        bad = asyncio.ensure_future(drain(eng.submit(req(m, "bad", "bad"))))
        good = asyncio.ensure_future(drain(eng.submit(req(m, "good", "good", max_tokens=100))))
        bad_chunks, good_chunks = await asyncio.gather(bad, good)
        await until(lambda: eng.ready)
        after = await drain(eng.submit(req(m, "next", "again")))
        return bad_chunks, good_chunks, after, eng.respawns
    bad, good, after, respawns = run(m, body)
    assert "".join(c.text for c in bad) == "Hello world."
    for chunks in (bad, good):
        end = chunks[-1]
        assert end.finish == FinishReason.ERROR and isinstance(end.error, WorkerCrashed)
        assert end.error.message == "the worker failed: RuntimeError: boom"
    assert respawns == 1 and len(m.runtimes) == 2 and m.runtimes[0].closed
    assert "".join(c.text for c in after) == "Hello world." and after[-1].finish == FinishReason.END_OF_TURN


def test_a_worker_that_dies_before_a_requests_first_token_costs_a_retry_not_an_error():
    """The worker dies before the request produced anything (killed while idle, its death
    noticed only when the step fails): the request runs again on the next worker, and its
    client sees only the answer. A request that kills every worker fails at its second try."""
    m = FakeModel()
    m.reply = lambda p: m.vocab.script(BOOM) if len(m.runtimes) == 1 or "poison" in m.vocab.decode(p) \
        else m.vocab.script("Hello world.")

    async def body(eng):
        first = await drain(eng.submit(req(m, "r1", "hi")))
        poison = await drain(eng.submit(req(m, "r2", "poison")))
        return first, poison, eng.respawns
    first, poison, respawns = run(m, body)
    assert "".join(c.text for c in first) == "Hello world." and first[-1].finish == FinishReason.END_OF_TURN
    assert poison[-1].finish == FinishReason.ERROR and isinstance(poison[-1].error, WorkerCrashed)
    assert respawns == 3


def test_a_worker_that_cannot_start_again_fails_waiting_requests_until_the_next_one():
    m = FakeModel(lambda p: m.vocab.script("Hello", BOOM))

    async def body(eng):
        m.fail_starts = 99
        first = await drain(eng.submit(req(m, "r1", "hi")))
        await until(lambda: eng._gave_up)
        waiting = await drain(eng.submit(req(m, "r2", "hi")))  # tries again, and gives up again
        m.fail_starts = 0
        m.reply = lambda p: m.vocab.script("Hello world.")
        ok = await drain(eng.submit(req(m, "r3", "hi")))
        return first, waiting, ok
    first, waiting, ok = run(m, body, max_respawns=2)
    assert first[-1].finish == FinishReason.ERROR and isinstance(first[-1].error, WorkerCrashed)
    assert waiting[-1].finish == FinishReason.ERROR and isinstance(waiting[-1].error, WorkerUnavailable)
    assert "".join(c.text for c in ok) == "Hello world."


def test_close_ends_running_streams_with_the_error_given():
    m = FakeModel(lambda p: m.vocab.script(*["hm"] * 400))

    async def go():
        eng = m.engine()
        await eng.start()
        it = eng.submit(req(m, "r1", "hi", max_tokens=400))
        await it.__anext__()
        await eng.close(WorkerUnavailable("going"))
        rest = await drain(it)
        return rest, eng.closed
    rest, closed = asyncio.run(go())
    assert closed and rest[-1].finish == FinishReason.ERROR and isinstance(rest[-1].error, WorkerUnavailable)


def test_an_interactive_request_preempts_background_work_which_then_goes_on_unrepeated():
    m = FakeModel()
    story = m.vocab.script(*[" Once", " upon", " a", " time"] * 10)
    m.reply = replies(m.vocab, {"story": story, "chat": m.vocab.script("Hello world.")})

    async def body(eng):
        bg = eng.submit(req(m, "bg", "story", max_tokens=100, qos=Qos.BACKGROUND))
        first = [await bg.__anext__() for _ in range(3)]
        chat = await drain(eng.submit(req(m, "chat", "chat", qos=Qos.INTERACTIVE)))
        rest = await drain(bg)
        return first + rest, chat, eng.sched.counters.preemptions
    bg, chat, preemptions = run(m, body, max_batch=1)
    assert preemptions >= 1
    assert "".join(c.text for c in chat) == "Hello world."
    assert [t for c in bg for t in c.tokens] == story + [m.vocab.eos]  # nothing lost, nothing twice
    assert bg[-1].finish == FinishReason.END_OF_TURN


def test_an_error_the_loop_did_not_expect_fails_its_requests_and_the_engine_goes_on():
    """A step that cannot be sent (here: a frame over Link W's cap) must not end the engine
    loop for good while /health says ok: the requests it ran fail with a typed error, the
    worker is replaced, and the next request is served."""
    from superfluid.errors import ProtocolError
    m = FakeModel()

    async def body(eng):
        real = eng.worker.send_step

        def oversized(plan):
            raise ProtocolError("a frame over the 16 MiB cap")
        eng.worker.send_step = oversized
        first = await asyncio.wait_for(drain(eng.submit(req(m, "r1", "hi"))), 10)  # a loop that died would hang here
        await until(lambda: eng.ready)
        assert eng.worker.send_step is not oversized and real is not None  # a new worker
        second = await drain(eng.submit(req(m, "r2", "hi")))
        return first, second, eng.loop_errors, eng.ready
    first, second, errors, ready = run(m, body)
    assert first[-1].finish == FinishReason.ERROR and isinstance(first[-1].error, WorkerCrashed)
    assert first[-1].error.code == "engine_error"
    assert "".join(c.text for c in second) == "Hello world." and second[-1].finish == FinishReason.END_OF_TURN
    assert errors == 1 and ready


def test_a_lanes_own_failure_fails_that_request_only():
    """A grammar that cannot be built (here: too deep to compile) fails that lane's request
    with a typed error, not the step (and the worker with it) for every lane: the other lane
    gives the same output as it does alone; the worker never restarts."""
    m = FakeModel()

    async def body(eng):
        def matcher(grammar):
            raise RecursionError("maximum recursion depth exceeded while compiling the grammar")
        m.runtime.grammar_matcher = matcher
        bad = req(m, "bad", "hi", sampling=SamplingParams(temperature=0, grammar="start: x"))
        res = await asyncio.gather(drain(eng.submit(bad)), drain(eng.submit(req(m, "good", "hi"))))
        alone = await drain(eng.submit(req(m, "again", "hi")))
        return res, alone, eng.respawns, len(m.runtimes)
    (bad, good), alone, respawns, runtimes = run(m, body)
    assert bad[-1].finish == FinishReason.ERROR and bad[-1].error.code == "generation_failed"
    assert "recursion" in bad[-1].error.message and bad[-1].error.status == 500  # not the request's fault
    assert "".join(c.text for c in good) == "Hello world." == "".join(c.text for c in alone)
    assert good[-1].finish == FinishReason.END_OF_TURN
    assert respawns == 0 and runtimes == 1  # the worker never died


def test_a_grammar_only_the_models_vocabulary_refuses_is_the_requests_400():
    """The daemon checks a grammar without a vocabulary (codec/grammar.py); a token id past the
    model's vocabulary passes there, and the worker's matcher, in its error state, would allow
    only the end token: a 200 with an empty answer. So the worker raises the BadRequest the
    daemon would have, it crosses Link W typed (plan.LaneError), and only that request fails,
    with the 400's body."""
    import llguidance

    from superfluid.codec import grammar as gr
    from superfluid.errors import BadRequest

    class Bytes:  # the fake's bytes as an llguidance vocabulary
        eos_token_id, bos_token_id = 256, None
        tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
        special_token_ids = [256]

        def __call__(self, s):
            return list(s.encode() if isinstance(s, str) else s)
    m = FakeModel()
    grammar = gr.lark("start: <[99999]>")  # the daemon's check lets it through

    async def body(eng):
        m.runtime.grammar_tokenizer = lambda: llguidance.LLTokenizer(llguidance.TokenizerWrapper(Bytes()))
        bad = req(m, "bad", "hi", sampling=SamplingParams(temperature=0, grammar=grammar))
        return await asyncio.gather(drain(eng.submit(bad)), drain(eng.submit(req(m, "good", "hi")))), eng.respawns
    (bad, good), respawns = run(m, body)
    err = bad[-1].error
    assert bad[-1].finish == FinishReason.ERROR and type(err) is BadRequest and err.status == 400
    assert err.body()["error"]["type"] == "invalid_request_error" and "99999" in err.message
    assert len(bad) == 1 and not bad[0].tokens  # nothing was sampled for it
    assert "".join(c.text for c in good) == "Hello world." and good[-1].finish == FinishReason.END_OF_TURN
    assert respawns == 0


def test_a_full_queue_is_a_typed_503_with_retry_after():
    """--max-queue bounds the generations waiting for a lane; past it the service refuses
    before anything is committed or queued."""
    import pytest

    from superfluid.errors import QueueFull
    from superfluid.service import Service
    m = FakeModel(lambda p: m.vocab.script(" Once upon a time"))

    async def body(eng):
        svc = Service(None)
        first = await svc.submit(eng, [req(m, "a", "x", max_tokens=200)], api="completions")
        await until(lambda: eng.sched.running)
        second = await svc.submit(eng, [req(m, "b", "y")], api="completions")
        with pytest.raises(QueueFull) as e:
            await svc.submit(eng, [req(m, "c", "z")], api="completions")
        assert eng.queued == 1 and e.value.status == 503 and e.value.retry_after >= 1
        for s in first + second:
            await drain(s)
        return eng.queued
    assert run(m, body, max_batch=1, max_queue=1) == 0
