"""Key policy files: strict validation, constant-time lookup."""

import json

import pytest

from superfluid.api.policy import PolicyError, find_key, parse_policies
from superfluid.request import Qos


def doc(*keys):
    return json.dumps({"keys": list(keys)})


def test_full_entry():
    [p] = parse_policies(doc({"name": "ci", "key": "sk-12345678", "qos": "background", "max_qos": "agent",
                              "rpm": 60, "max_concurrent": 2, "admin": True}))
    assert (p.name, p.qos, p.max_qos, p.rpm, p.max_concurrent, p.admin) == (
        "ci", Qos.BACKGROUND, Qos.AGENT, 60, 2, True)


def test_defaults():
    [p] = parse_policies(doc({"name": "a", "key": "sk-12345678"}))
    assert p.qos is None and p.max_qos == Qos.INTERACTIVE and p.rpm is None and not p.admin


@pytest.mark.parametrize("text,why", [
    ("not json", "not valid JSON"),
    ('{"keys": []}', "empty"),
    ('{"keys": [], "extra": 1}', "nothing else"),
    ('[1]', "nothing else"),
    (doc({"name": "a", "key": "sk-12345678", "colour": "red"}), "unknown fields"),
    (doc({"name": "a", "key": "sk-12345678"}, {"name": "a", "key": "sk-87654321"}), "duplicate name"),
    (doc({"name": "a", "key": "sk-12345678"}, {"name": "b", "key": "sk-12345678"}), "duplicate key"),
    (doc({"name": "a", "key": "short"}), "at least 8"),
    (doc({"name": "", "key": "sk-12345678"}), "'name'"),
    (doc({"name": "a", "key": "sk-12345678", "qos": "vip"}), "unknown QoS"),
    (doc({"name": "a", "key": "sk-12345678", "rpm": 0}), "positive integer"),
    (doc({"name": "a", "key": "sk-12345678", "max_concurrent": "2"}), "positive integer"),
    (doc({"name": "a", "key": "sk-12345678", "admin": "yes"}), "'admin'"),
])
def test_bad_files_are_refused_with_the_reason(text, why):
    with pytest.raises(PolicyError, match=why):
        parse_policies(text)


def test_find_key():
    ps = parse_policies(doc({"name": "a", "key": "sk-aaaaaaaa"}, {"name": "b", "key": "sk-bbbbbbbb"}))
    assert find_key(ps, "sk-bbbbbbbb").name == "b"
    assert find_key(ps, "sk-cccccccc") is None
    assert find_key(ps, "") is None
