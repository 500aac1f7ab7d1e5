"""Cache-aware placement: a head and two nodes on loopback; a conversation's next turn goes
to the node that holds its prefix (reported in NODE_STATUS), although both are idle and the
load rule alone would pick the other (the first) node."""

import time

import httpx
import openai
import pytest

from superfluid.fleet.pool import RECENT

from .conftest import MODEL
from .daemon import Daemon
from .fleet import Node, together

FACTS = " ".join(f"Fact {i}: the harbor keeper counted {i * 7} gulls on day {i}." for i in range(30))
CONVO = [{"role": "system", "content": "You are a terse assistant."},
         {"role": "user", "content": f"Read these notes. {FACTS} Now say ok."}]


@pytest.fixture(scope="module")
def fleet():
    a, b = together(Node, Node)
    head = Daemon("--fleet", f"127.0.0.1:{a.port},127.0.0.1:{b.port}")
    yield head
    head.stop()
    a.stop()
    b.stop()


def nodes(head) -> list[dict]:
    return next(iter(head.health()["models"].values()))["nodes"]


def chat(head, messages):
    return openai.OpenAI(base_url=head.url + "/v1", api_key="x", max_retries=0, timeout=60).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0)


def test_the_next_turn_goes_to_the_warm_node(fleet):
    head = fleet
    # a long generation holds the first node, so the conversation's first turn goes to the second
    with httpx.stream("POST", head.url + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}],
                            "max_tokens": 400, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert [n["placed"] for n in nodes(head)] == [1, 0]
        first = chat(head, CONVO)
    assert first.usage.prompt_tokens > 300
    deadline = time.monotonic() + 15
    while sum(n["placed"] for n in nodes(head)) and time.monotonic() < deadline:
        time.sleep(0.1)  # the cancelled story leaves the first node
    # past the head's own memory of where it placed the turn (a fixed window): the nodes'
    # reports alone decide, once one shows the turn's prefix (they report every 2 s)
    time.sleep(RECENT)
    deadline = time.monotonic() + 15
    while not (nodes(head)[1]["prefixes"] > 0 and sum(n["placed"] for n in nodes(head)) == 0) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    cold, warm = nodes(head)
    assert warm["prefixes"] > 0 and cold["placed"] == warm["placed"] == 0  # cold holds the story's prefix
    turn = CONVO + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "What did the keeper count on day 3?"}]
    for _ in range(3):
        usage = chat(head, turn).usage
        # the first node would hold only the chat template's opening (the story's prompt)
        assert usage.prompt_tokens_details.cached_tokens >= 256, usage


def test_a_salted_prompt_is_warm_for_its_salt_only(fleet):
    """A request's prefix-cache namespace (its cache_salt here; its key's with keys) travels
    to the node: another salt's identical prompt reuses nothing there, wherever it is
    placed, and the same salt's next request goes to the node that holds it."""
    convo = [CONVO[0], {"role": "user", "content": f"Read these notes. {FACTS} Now say yes."}]

    def cached(salt: str) -> int:
        r = openai.OpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=60).chat.completions.create(
            model=MODEL, messages=convo, max_tokens=2, temperature=0, extra_body={"cache_salt": salt})
        return r.usage.prompt_tokens_details.cached_tokens
    assert cached("team-one") == 0
    assert cached("team-two") == 0
    assert cached("team-one") > 300
