"""One request's output that cannot be read (issue 33, fault 1): a tool call nested
thousands deep, which a forced format can make a model write, is read by every dialect
without an exception (past MAX_DEPTH it is no call); and should reading a stream's output
fail anyway, that stream alone ends with a typed error while the others on the model go on
and the worker is not restarted."""

import asyncio
import json

import pytest

from superfluid.codec.channels import Channels, ChannelSpec
from superfluid.codec.dialects import BY_NAME
from superfluid.codec.output import OutputProcessor
from superfluid.codec.tools import MAX_DEPTH, parse_json, too_deep
from superfluid.request import FinishReason

from ..fakes import FakeModel
from .test_dialect_grammars import EXAMPLES
from .test_engine_loop import drain, req, run

DEEP = "[" * 5000 + "1" + "]" * 5000


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_dialect_reads_a_call_nested_thousands_deep_without_raising(name):
    assert "Paris" in EXAMPLES[name]
    ch = Channels(ChannelSpec(BY_NAME[name]))
    text = EXAMPLES[name].replace('"Paris"', DEEP).replace("Paris", DEEP)
    ch.feed(text)  # before the fix: RecursionError in all but gemma
    ch.finish()


def test_depth_is_counted_outside_strings_only():
    assert too_deep("[" * (MAX_DEPTH + 1)) and not too_deep("[" * MAX_DEPTH)
    assert not too_deep(json.dumps({"a": "[" * 500 + '\\"' + "{" * 500}))
    assert parse_json(DEEP) is None and parse_json('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}


def test_a_stream_whose_output_cannot_be_read_fails_alone(monkeypatch):
    m = FakeModel()
    real = OutputProcessor.token

    def token(self, tok, finish, logprob=None):
        if getattr(self, "poisoned", False):
            raise RecursionError("maximum recursion depth exceeded")
        return real(self, tok, finish, logprob)
    monkeypatch.setattr(OutputProcessor, "token", token)

    async def body(eng):
        bad, good = eng.submit(req(m, "bad", "hi")), eng.submit(req(m, "good", "hi"))
        eng._streams["bad"].out.poisoned = True
        return await asyncio.gather(drain(bad), drain(good)), eng.respawns
    (bad, good), respawns = run(m, body)
    assert bad[-1].finish == FinishReason.ERROR and bad[-1].error.code == "output_unreadable"
    assert bad[-1].error.status == 500 and "RecursionError" in bad[-1].error.message
    assert "".join(c.text for c in good) == "Hello world." and good[-1].finish == FinishReason.END_OF_TURN
    assert respawns == 0
