"""Pure parts of the Responses API's background mode and paging: input_items pages, the
sequence-number filter of a resumed stream, and the metadata limits."""

import asyncio

import pytest

from superfluid.api.response_background import after_sequence, starting_after
from superfluid.api.responses import page
from superfluid.api.sse import frame, tagged
from superfluid.errors import BadRequest
from superfluid.limits import check_metadata

ITEMS = [{"id": f"msg_x_{i}"} for i in range(5)]


def ids(p: dict) -> list[str]:
    return [it["id"][-1] for it in p["data"]]


def test_pages_follow_openai_order_limit_and_after():
    assert ids(page(ITEMS, {})) == list("43210")  # desc by default
    p = page(ITEMS, {"order": "asc", "limit": "2"})
    assert ids(p) == ["0", "1"] and p["has_more"] and p["first_id"] == "msg_x_0" and p["last_id"] == "msg_x_1"
    p = page(ITEMS, {"order": "asc", "limit": "2", "after": "msg_x_3"})
    assert ids(p) == ["4"] and not p["has_more"]
    assert ids(page(ITEMS, {"after": "msg_x_3"})) == list("210")
    empty = page([], {})
    assert empty["data"] == [] and empty["first_id"] is None and not empty["has_more"]
    for q, param in (({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
                     ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after")):
        with pytest.raises(BadRequest) as e:
            page(ITEMS, q)
        assert e.value.param == param


def test_a_resumed_stream_keeps_only_events_after_the_sequence_number():
    evs = [frame({"type": "t", "sequence_number": i}, "t") for i in range(5)]
    evs[2] = tagged([evs[2]], "sess_1:7")[0]  # a log cursor on one of them
    stream = evs[:3] + [b": ping\n\n"] + evs[3:]

    async def run(n):
        async def src():
            for b in stream:
                yield b
        return [b async for b in after_sequence(src(), n)]

    assert asyncio.run(run(-1)) == stream
    assert asyncio.run(run(1)) == [evs[2], b": ping\n\n", evs[3], evs[4]]
    assert asyncio.run(run(4)) == [b": ping\n\n"]
    assert starting_after(None) == -1 and starting_after("3") == 3
    for raw in ("-1", "x", "1.5"):
        with pytest.raises(BadRequest) as e:
            starting_after(raw)
        assert e.value.param == "starting_after"


def test_metadata_limits_name_the_parameter():
    assert check_metadata(None) == {}
    ok = {f"k{i}": "v" * 512 for i in range(16)}
    assert check_metadata(ok) == ok
    for bad, param in (({f"k{i}": "v" for i in range(17)}, "metadata"), ({"k" * 65: "v"}, "metadata"),
                       ({"k": "v" * 513}, "metadata.k"), ({"k": 1}, "metadata.k"), (["k"], "metadata"),
                       ("k", "metadata")):
        with pytest.raises(BadRequest) as e:
            check_metadata(bad)
        assert e.value.param == param
