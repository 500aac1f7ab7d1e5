"""The head takes a node's tokens only if they are in the model's vocabulary (issue 33): a
node that sends an id outside it ends its link (a ProtocolError), and nothing of that
message is counted as delivered, so the generation fails over whole."""

import pytest

from superfluid.config import EngineConfig
from superfluid.errors import ProtocolError
from superfluid.fleet.head import FleetEngine, _Placed
from superfluid.fleet.pool import NodeConn
from superfluid.link import messages as m
from superfluid.link.head_state import Tracker
from superfluid.request import Chunk, GenRequest, SamplingParams

from ..fakes import FakeVocab


class Pool:  # the head's pool, as far as on_tokens uses it
    def __init__(self):
        self.sent = []

    def send(self, node, msg):
        self.sent.append(msg)

    def cancel(self, node, gen):
        pass


def events(*tokens: list[int]) -> m.TokenEvents:
    return m.TokenEvents("g", 1, tuple((i, m.chunk_to_wire(Chunk("g", tokens=t))) for i, t in enumerate(tokens)))


def test_token_ids_outside_the_vocabulary_end_the_link_and_count_nothing():
    vocab = FakeVocab()
    eng = FleetEngine(EngineConfig(model_path="fake.gguf", model_id="fake"), vocab, 512, Pool())
    node = NodeConn("127.0.0.1", 1)
    p = _Placed(GenRequest("g", [1, 2], SamplingParams(), 8), Tracker("g", 1), node=node)
    eng._placed["g"] = p
    with pytest.raises(ProtocolError, match="outside the model's vocabulary"):
        eng.on_tokens(node, events([72], [vocab.n_vocab + 5]))
    assert p.delivered == [] and p.tracker.next_seq == 0  # the good first event was not taken either
    eng.on_tokens(node, events([72], [105]))
    assert p.delivered == [72, 105] and p.tracker.next_seq == 2
