"""Ollama keep_alive parsing (api/keep_alive.py): durations, forever, and typed errors."""

import math

import pytest

from superfluid.api.keep_alive import parse
from superfluid.errors import BadRequest


def test_durations_and_forever():
    assert parse(None) is None
    assert parse(0) == 0 and parse("0s") == 0
    assert parse("1h30m") == 5400 and parse(90) == 90
    assert parse(-1) == math.inf and parse("-5m") == math.inf
    assert parse(1e300) == math.inf and parse("99999999999h") == math.inf  # no date overflow later


@pytest.mark.parametrize("bad", ["soon", "5 minutes", [], {}, True, float("nan"), "nan"])
def test_bad_values_are_a_typed_400(bad):
    with pytest.raises(BadRequest):
        parse(bad)
