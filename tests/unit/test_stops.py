"""Stop strings over text deltas."""

import pytest

from superfluid.codec.stops import StopMatcher


def feed_all(m: StopMatcher, deltas: list[str]) -> tuple[str, str | None]:
    out = ""
    for d in deltas:
        text, hit = m.feed(d)
        out += text
        if hit is not None:
            return out, hit
    return out + m.flush(), None


# -- StopMatcher --------------------------------------------------------------------------


def test_no_stops_passes_text_through():
    m = StopMatcher(())
    assert m.feed("abc") == ("abc", None)
    assert m.flush() == ""


def test_empty_stop_strings_are_ignored():
    m = StopMatcher(("",))
    assert m.feed("abc") == ("abc", None)


def test_stop_inside_one_delta():
    m = StopMatcher(("END",))
    assert m.feed("hello END world") == ("hello ", "END")


def test_stop_split_across_deltas_is_caught_and_never_emitted():
    m = StopMatcher(("END",))
    assert m.feed("abc E") == ("abc ", None)
    assert m.feed("N") == ("", None)
    assert m.feed("D and more") == ("", "END")
    assert m.flush() == ""


def test_held_prefix_is_released_when_it_is_not_a_stop():
    m = StopMatcher(("END",))
    assert m.feed("xEN") == ("x", None)
    assert m.feed("z") == ("ENz", None)


def test_overlapping_partial_matches():
    # "aab" inside "aaab" fed one char at a time
    assert feed_all(StopMatcher(("aab",)), list("aaab")) == ("a", "aab")


@pytest.mark.parametrize("stops", [("foo", "bar"), ("bar", "foo")])
def test_earliest_stop_wins_whatever_the_order_of_the_stops(stops):
    m = StopMatcher(stops)
    assert m.feed("xx foo bar") == ("xx ", "foo")


def test_earliest_stop_wins_across_deltas():
    assert feed_all(StopMatcher(("<|end|>", "\n\n")), ["ab", "\n", "\n<|e", "nd|>"]) == ("ab", "\n\n")


def test_hold_covers_the_longest_partial_of_several_stops():
    m = StopMatcher(("xyz", "yzw"))
    assert m.feed("axy") == ("a", None)  # "xy" could begin "xyz"
    assert m.feed("zq") == ("", "xyz")


def test_flush_returns_held_text_once():
    m = StopMatcher(("END",))
    assert m.feed("abcEN") == ("abc", None)
    assert m.flush() == "EN"
    assert m.flush() == ""


def _reference(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """The text up to the first stop string to complete (the longest, on the same character)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if s and text[:end].endswith(s)]
        if done:
            hit = max(done, key=len)
            return text[:end - len(hit)], hit
    return text, None


def test_the_automaton_agrees_with_a_plain_scan_on_random_streams():
    import random
    rng = random.Random(7)
    for _ in range(2000):
        stops = tuple("".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 5)))
        text = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert feed_all(StopMatcher(stops), deltas) == _reference(text, stops), (stops, deltas)


def test_many_stop_strings_cost_one_step_per_character():
    m = StopMatcher(tuple(f"stop-{i:04d}-" + "x" * 200 for i in range(16)))
    assert m.feed("stop-0003-" + "x" * 199) == ("", None)  # all of it may still be a stop string
    assert m.feed("y")[0] == "stop-0003-" + "x" * 199 + "y"
