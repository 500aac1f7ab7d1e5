"""OpenAI's prompt_cache_key as a cache hint (api/prompt.prompt_cache_hint)."""

import pytest

from superfluid.api.prompt import prompt_cache_hint
from superfluid.errors import BadRequest


def test_a_key_keeps_the_whole_prompt_warm_for_its_retention():
    assert prompt_cache_hint(None, None, 500) is None
    assert prompt_cache_hint("conv-1", None, 500) == (500, 600.0)
    assert prompt_cache_hint("conv-1", "in_memory", 500) == (500, 600.0)
    assert prompt_cache_hint("conv-1", "24h", 500) == (500, 86400.0)


@pytest.mark.parametrize("key,retention,param", [
    (42, None, "prompt_cache_key"), ("k" * 1025, None, "prompt_cache_key"), ({"a": 1}, None, "prompt_cache_key"),
    ("k", "forever", "prompt_cache_retention"), ("k", 24, "prompt_cache_retention"),
    ("k", ["24h"], "prompt_cache_retention")])
def test_a_bad_key_or_retention_is_a_400_naming_it(key, retention, param):
    with pytest.raises(BadRequest) as e:
        prompt_cache_hint(key, retention, 10)
    assert e.value.param == param
