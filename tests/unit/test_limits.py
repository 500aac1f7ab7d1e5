"""limits.py, pure: nesting is measured without recursion, and each limit names its parameter."""

import orjson
import pytest

from superfluid.errors import BadRequest
from superfluid.limits import (MAX_ARGS_DEPTH, MAX_GRAMMAR_BYTES, MAX_SCHEMA_DEPTH, arguments_text, check_chat,
                               check_generation, depth, output_budget, text_depth)


def nested(n: int) -> dict:
    out: dict = {}
    cur = out
    for _ in range(n):
        cur["x"] = {}
        cur = cur["x"]
    return out


def test_depth_is_measured_without_recursion_and_stops_early():
    assert depth({"a": [1, {"b": 2}]}, 10) == 4
    assert depth(nested(100_000), MAX_SCHEMA_DEPTH) == MAX_SCHEMA_DEPTH + 1  # no RecursionError, no full walk


def test_json_text_is_measured_as_its_value_without_parsing():
    for v in ({"a": 1}, [1, [2, {"b": "]]]"}]], {"s": "\\\"[[[["}):
        assert text_depth(orjson.dumps(v).decode(), 99) == depth(v, 99), v
    assert text_depth("[" * 100_000, MAX_ARGS_DEPTH) == MAX_ARGS_DEPTH + 1  # not JSON, still measured
    assert arguments_text({"a": [1]}, "p") == '{"a":[1]}' and arguments_text("not json", "p") == "not json"


@pytest.mark.parametrize("call,param", [
    (lambda: check_chat([{}] * 5000, None), "messages"),
    (lambda: check_chat([{"tool_calls": [{"function": {"arguments": nested(100)}}]}], None),
     "messages.0.tool_calls.0.function.arguments"),
    (lambda: arguments_text("[" * 100 + "]" * 100, "args"), "args"),
    (lambda: check_chat([], [{"function": nested(50)}]), "tools"),
    (lambda: check_chat([], [{"function": {"name": str(i)}} for i in range(200)]), "tools"),
    (lambda: check_generation(("a",) * 17, 1, -1, ""), "stop"),
    (lambda: check_generation(("a" * 300,), 1, -1, ""), "stop"),
    (lambda: check_generation((), 17, -1, ""), "n"),
    (lambda: check_generation((), 1, 21, ""), "top_logprobs"),
    (lambda: check_generation((), 1, -1, "x" * (MAX_GRAMMAR_BYTES + 1)), "response_format"),
])
def test_each_limit_is_a_400_naming_its_parameter(call, param):
    with pytest.raises(BadRequest) as e:
        call()
    assert e.value.param == param


def test_output_budget_is_capped_by_the_room_left_and_the_operator():
    assert output_budget(32000, 7776, 8192) == 416  # opencode's ask: capped, not refused
    assert output_budget(100, 10, 8192) == 100
    assert output_budget(32000, 10, 8192, cap=256) == 256
    assert output_budget(32000, 8192, 8192) == 1  # no room: the engine's check refuses the prompt itself
