"""Frame fuzzing against a live node over a real Noise session (issue 14, "Proof"): a head
is connected to the node with a fleet token; hypothesis opens more authenticated Link F
sessions to it and sends random and mutated messages of every Link F type (and unknown
ones), or garbage in place of ciphertext. Pass: the node drops or ignores each of them with
a typed error in its log, never an unhandled exception; it stays up; and the real head's
link is untouched (same connection, chats still answered)."""

from __future__ import annotations

import asyncio
import re
import time

import msgpack
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superfluid.cli.fleet import read_token
from superfluid.link import messages as m
from superfluid.net.transport import Link

from ..unit.test_fuzz_frames import VALID, body_for, known_types, mutate
from .conftest import MODEL
from .daemon import Daemon
from .fleet import Node

LIVE = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
CHAT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    token = tmp_path_factory.mktemp("token") / "fleet.token"
    token.write_text("c" * 64)
    node = Node(auth_file=str(token))
    head = Daemon("--fleet", f"127.0.0.1:{node.port}", "--fleet-auth", str(token))
    yield head, node, read_token(str(token))
    head.stop()
    node.stop()


def first_head(node: Node) -> str:
    """The address of the first head that connected: the real one."""
    found = re.search(r"head (\S+) connected", node.log())
    assert found, node.log()[-2000:]
    return found.group(1)


async def poke(port: int, psk: bytes, send) -> None:
    """One authenticated session: HELLO, then `send(link)`, then read until the node drops
    us or goes quiet (a message it may ignore)."""
    link = await Link.dial("127.0.0.1", port, m.LINK_F, psk)
    try:
        await link.greet(m.Hello((m.VERSION,), "a-fuzzing-head"), 10.0)
        send(link)
        await link.writer.drain()
        deadline = time.monotonic() + 0.25  # the node answers in milliseconds; a late crash fails the next example
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.wait_for(link.recv(), left)
    except (ConnectionError, TimeoutError, OSError):
        pass
    finally:
        link.close()


def fuzz_types() -> st.SearchStrategy[int]:
    return st.sampled_from([t for t in known_types(m.LINK_F) if t != m.HELLO]) | st.integers(0, 0xFFFF)


@LIVE
@given(data=st.data())
def test_a_live_node_survives_random_messages_in_an_authenticated_session(secured, data):
    head, node, psk = secured
    how = data.draw(st.sampled_from(["typed", "mutated", "ciphertext"]), label="how")
    if how == "typed":
        kind = data.draw(fuzz_types(), label="type")
        body = data.draw(body_for(m.LINK_F.table.classes.get(kind)), label="body")
        send = lambda link: link.send_raw(kind, body)  # noqa: E731
    elif how == "mutated":  # a valid message's body, mutated, in a well-formed record
        proto, msg = data.draw(st.sampled_from([v for v in VALID if v[0] is m.LINK_F]), label="msg")
        ops = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 999), st.integers(0, 255)),
                                 min_size=1, max_size=6), label="ops")
        raw = mutate(msgpack.packb(msg.to_wire() if hasattr(msg, "to_wire") else [], use_bin_type=True), ops)
        kind = msg.TYPE

        def send(link):
            try:
                body = msgpack.unpackb(raw)
            except Exception:  # noqa: BLE001 -- not msgpack any more: send the bytes as the body
                body = raw
            link.send_raw(kind, body)
    else:  # bytes that are not a Noise record of this session
        junk = data.draw(st.binary(min_size=1, max_size=200), label="junk")
        send = lambda link: link.writer.write(junk)  # noqa: E731
    asyncio.run(poke(node.port, psk, send))
    assert node.proc.poll() is None, node.log()[-3000:]


def test_after_the_fuzzing_the_node_and_the_heads_link_are_untouched(secured):
    """Runs after the fuzzing (module order): no unhandled exception in the node's log, the
    head still has its first connection, and a chat through the fleet is answered."""
    head, node, _ = secured
    real = first_head(node)
    reply = openai.OpenAI(base_url=head.url + "/v1", api_key="x", max_retries=0, timeout=120) \
        .chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    assert reply.choices[0].message.content
    log = node.log()
    assert "Traceback" not in log and "exception was never retrieved" not in log, log[-4000:]
    dropped = log.count("dropping the link to")
    print(f"node dropped {dropped} fuzzing sessions with a typed error")
    assert dropped >= 20  # the fuzzing did reach it, and it answered with typed errors
    assert f"head {real} disconnected" not in log and f"dropping the link to {real}" not in log
    assert all(n["up"] for n in next(iter(head.health()["models"].values()))["nodes"])
