"""api/anthropic.usage: Anthropic's split of a prompt into cache reads, cache writes and the rest."""

from superfluid.api.anthropic import usage
from superfluid.request import Chunk, FinishReason


def split(prompt: int, cached: int, marked: int) -> dict:
    return usage(Chunk("r", finish=FinishReason.END_OF_TURN, prompt_tokens=prompt, cached_tokens=cached), 5, marked)


def test_the_three_parts_sum_to_the_prompt():
    for prompt, cached, marked in [(100, 0, 0), (100, 60, 0), (100, 0, 80), (100, 60, 80), (100, 99, 100),
                                   (100, 0, 100), (20000, 18493, 19923)]:
        u = split(prompt, cached, marked)
        assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] == prompt
        assert u["output_tokens"] == 5


def test_the_rest_is_never_zero():
    """Claude Code keeps message_start's input_tokens (the whole prompt) when the delta's is 0,
    and so counted a wholly marked prompt twice ("Prompt is too long" on a 20k prompt in 32k)."""
    assert split(100, 0, 100) == {"input_tokens": 1, "output_tokens": 5, "cache_read_input_tokens": 0,
                                  "cache_creation_input_tokens": 99}
    assert split(100, 99, 100)["input_tokens"] == 1
    assert split(100, 60, 80) == {"input_tokens": 20, "output_tokens": 5, "cache_read_input_tokens": 60,
                                  "cache_creation_input_tokens": 20}
