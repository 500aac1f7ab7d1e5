"""api/streams.kept_alive: an event stream that has nothing to say (a long prefill) sends a
keepalive frame, without disturbing the generation under it."""

import asyncio

from superfluid.api.streams import kept_alive


def test_idle_gaps_get_keepalives_and_the_source_is_never_cancelled():
    log = []

    async def slow():
        try:
            await asyncio.sleep(0.35)  # a prefill: nothing for a while
            yield b"a"
            yield b"b"
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    async def go():
        return [b async for b in kept_alive(slow(), b"K", 0.1)]
    out = asyncio.run(go())
    assert out[-2:] == [b"a", b"b"] and set(out[:-2]) == {b"K"} and 2 <= len(out) - 2 <= 4
    assert log == []


def test_closing_the_stream_closes_the_source():
    log = []

    async def endless():
        try:
            while True:
                await asyncio.sleep(0.01)
                yield b"x"
        finally:
            log.append("closed")

    async def go():
        gen = kept_alive(endless(), b"K", 5)
        assert await gen.__anext__() == b"x"
        await gen.aclose()
    asyncio.run(go())
    assert log == ["closed"]


def test_a_client_gone_mid_wait_closes_the_source_too():
    log = []

    async def stalled():
        try:
            await asyncio.sleep(10)
            yield b"never"
        finally:
            log.append("closed")

    async def go():
        gen = kept_alive(stalled(), b"K", 0.05)
        assert await gen.__anext__() == b"K"
        await gen.aclose()  # the client went away while the source waits
    asyncio.run(go())
    assert log == ["closed"]
