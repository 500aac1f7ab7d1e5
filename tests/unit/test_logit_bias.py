"""logit_bias in each API's shape → (token id, bias) pairs, and its limits (api/bias.py)."""

import pytest

from superfluid.api.bias import logit_bias
from superfluid.api.llama_params import options
from superfluid.errors import BadRequest
from superfluid.limits import MAX_LOGIT_BIAS


class Tok:
    n_vocab = 1000

    def valid(self, t: int) -> bool:
        return 0 <= t < self.n_vocab

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return [ord(c) for c in text]


TEXT = "".join(chr(100 + i) for i in range(400))  # 400 distinct tokens for Tok


def test_openai_shape():
    assert logit_bias({"5": -100, "7": 2.5}, Tok()) == ((5, -100.0), (7, 2.5))
    assert logit_bias(None, Tok()) == () and logit_bias({}, Tok()) == ()


def test_llama_server_shapes():
    tok = Tok()
    assert logit_bias([[5, False], [7, 1]], tok, text_keys=True) == ((5, -100.0), (7, 1.0))
    assert logit_bias([["ab", -2]], tok, text_keys=True) == ((97, -2.0), (98, -2.0))
    assert logit_bias({"ab": 1, "9": False}, tok, text_keys=True) == ((9, -100.0), (97, 1.0), (98, 1.0))
    assert options({"logit_bias": [[5, False]]}, tok).sampling.logit_bias == ((5, -100.0),)
    assert options({}, tok).sampling.logit_bias == ()


@pytest.mark.parametrize("value,text_keys", [
    ({"5": 101}, False), ({"5": -100.5}, False), ({"5": "x"}, False), ({"5": True}, False),
    ({"1000": 1}, False), ({"-1": 1}, False), ({"word": 1}, False), ([[5, 1]], False), ("5", False),
    ({str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}, False), ([[5]], True), ([[5.5, 1]], True),
    ({"x" * 257: 1}, True), ([[TEXT[:200], 1], [TEXT[200:], 1]], True)])
def test_bad_bias_names_the_parameter(value, text_keys):
    with pytest.raises(BadRequest) as e:
        logit_bias(value, Tok(), text_keys=text_keys)
    assert e.value.param == "logit_bias"


def test_the_limit_itself_is_allowed():
    assert len(logit_bias({str(i): -1 for i in range(MAX_LOGIT_BIAS)}, Tok())) == MAX_LOGIT_BIAS
