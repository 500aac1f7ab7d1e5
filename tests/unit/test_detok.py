"""Token ids -> text deltas: split UTF-8, eog tokens, stop strings across tokens."""

from superfluid.codec.detok import TextStream

E_ACUTE = "é".encode()  # two bytes
SMILE = "😀".encode()  # four bytes
PIECES = [
    b"</s>",           # 0: eog
    b"Hel", b"lo",     # 1, 2
    E_ACUTE[:1],       # 3
    E_ACUTE[1:],       # 4
    SMILE[:1], SMILE[1:2], SMILE[2:3], SMILE[3:],  # 5..8
    b" wor", b"ld",    # 9, 10
    b"!",              # 11
]
EOG = frozenset({0})


def push_all(ts: TextStream, tokens: list[int]) -> list[str]:
    return [ts.push(t) for t in tokens]


def test_plain_tokens_decode_in_order():
    ts = TextStream(PIECES, EOG)
    assert "".join(push_all(ts, [1, 2, 9, 10])) + ts.finish() == "Hello world"


def test_multibyte_char_split_across_tokens_never_comes_out_split():
    ts = TextStream(PIECES, EOG)
    assert push_all(ts, [1, 3, 4, 11]) == ["Hel", "", "é", "!"]


def test_four_byte_char_split_over_four_tokens():
    ts = TextStream(PIECES, EOG)
    assert push_all(ts, [5, 6, 7, 8]) == ["", "", "", "😀"]


def test_eog_token_produces_no_text():
    ts = TextStream(PIECES, EOG)
    assert push_all(ts, [1, 0]) == ["Hel", ""]
    assert ts.finish() == ""


def test_out_of_range_token_produces_no_text():
    ts = TextStream(PIECES, EOG)
    assert push_all(ts, [999, -1, 2]) == ["", "", "lo"]


def test_stop_string_across_tokens_sets_stopped_by():
    ts = TextStream(PIECES, EOG, stops=("lo w",))
    out = push_all(ts, [1, 2, 9, 10])
    assert out == ["He", "l", "", ""]  # "l" is held: it could begin "lo w"
    assert ts.stopped_by == "lo w"
    assert ts.finish() == ""


def test_stop_string_with_a_split_multibyte_char():
    ts = TextStream(PIECES, EOG, stops=("é!",))
    assert push_all(ts, [1, 3, 4, 11]) == ["Hel", "", "", ""]
    assert ts.stopped_by == "é!"


def test_finish_flushes_a_held_partial_stop():
    ts = TextStream(PIECES, EOG, stops=("lo there",))
    assert push_all(ts, [1, 2]) == ["He", "l"]
    assert ts.finish() == "lo"
    assert ts.stopped_by is None


def test_finish_turns_a_dangling_partial_char_into_a_replacement():
    ts = TextStream(PIECES, EOG)
    assert push_all(ts, [1, 3]) == ["Hel", ""]
    assert ts.finish() == "\ufffd"


def test_a_continued_stream_primed_with_its_history_completes_a_split_char_and_a_stop():
    """What a failover or a restart does: a new detokenizer fed the turn's tokens so far
    (their text was already sent, its output is discarded) gives exactly the rest."""
    whole = TextStream(PIECES, EOG)
    ref = "".join(push_all(whole, [1, 2, 5, 6, 7, 8, 9, 10])) + whole.finish()
    for cut in range(1, 8):
        toks = [1, 2, 5, 6, 7, 8, 9, 10]
        first = TextStream(PIECES, EOG)
        seen = "".join(push_all(first, toks[:cut]))  # the old node dies here: held bytes never sent
        second = TextStream(PIECES, EOG)
        push_all(second, toks[:cut])  # primed
        rest = "".join(push_all(second, toks[cut:])) + second.finish()
        assert seen + rest == ref, cut
    first = TextStream(PIECES, EOG, ("world",))
    assert "".join(push_all(first, [1, 2, 9])) == "Hello "  # "wor" is held: maybe a stop
    second = TextStream(PIECES, EOG, ("world",))
    push_all(second, [1, 2, 9])
    assert second.push(10) == "" and second.stopped_by == "world"
