"""Suffix decoding (`--speculative suffix`; SuffixDecoding, arXiv 2411.04975): drafts from
suffix trees, built with Snowflake's Arctic Inference (its C++ SuffixTree, as vLLM's
SuffixDecodingProposer uses it).

Two kinds of tree, each searched with the lane's last tokens:
- a lane's own tree over its context (the prompt and the output so far), kept in step with
  what the lane holds: extended with the tokens added since the last draft, new when the
  lane is opened again (a prefix reused for another request) or copied into;
- a global tree over the outputs this worker produced, one per prefix-cache namespace (so a
  draft never carries one key's text into another's generation), fed as tokens are produced
  and bounded: the oldest outputs leave first past MAX_OUTPUTS or MAX_TOKENS.

A tree answers with the most frequent continuation of the longest match, token by token while
the continuation's estimated probability stays over MIN_PROB, and no longer than the match
(the paper's adaptive length: a short match drafts little). Of the two answers the one with
the higher score (the sum of the probabilities) is proposed. Where nothing repeats, nothing is
drafted: free chat pays no rows. Drafts are verified as every drafter's are (runtime/base.py)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..plan import PLACEHOLDER
from .speculate import Drafter

DEPTH = 24  # the longest match (and draft) a tree holds: vLLM's default
SPEC_FACTOR = 1.0  # a match of n tokens drafts at most n * SPEC_FACTOR
MIN_PROB = 0.1  # a drafted token's estimated probability at least this (vLLM's default)
MAX_OUTPUTS = 10_000  # outputs the global trees keep (vLLM's default) ...
MAX_TOKENS = 2_000_000  # ... and their tokens in all (about 100 MB of tree at DEPTH 24)


def suffix_tree_class():
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as e:
        raise ModelLoadError("--speculative suffix needs Arctic Inference's suffix tree: "
                             f"pip install --no-build-isolation arctic-inference ({e})") from None
    return SuffixTree


@dataclass
class _Lane:
    tree: Any
    held: int = 0  # the tokens its tree holds: the lane's first `held`
    last: int = PLACEHOLDER  # the last of them
    ns: str = ""
    out: int = -1  # its output's id in the global tree of its namespace (-1: none yet)
    pending: list[int] = field(default_factory=list)  # produced, not yet in the global tree


class SuffixDrafter(Drafter):
    def __init__(self) -> None:
        self.Tree = suffix_tree_class()
        self.lanes: dict[int, _Lane] = {}
        self.globals: dict[str, Any] = {}  # namespace -> the tree of its outputs
        self.outputs: OrderedDict[tuple[str, int], int] = OrderedDict()  # (ns, id) -> tokens, oldest first
        self.tokens = 0
        self.next_id = 0

    def begin(self, seq: int, ns: str) -> None:
        self.end(seq)
        self.lanes[seq] = _Lane(self.Tree(DEPTH), ns=ns)

    def produced(self, seq: int, token: int) -> None:
        lane = self.lanes.get(seq)
        if lane is not None:
            lane.pending.append(token)

    def end(self, seq: int) -> None:
        lane = self.lanes.pop(seq, None)
        if lane is not None:
            self._flush(lane)

    def copy(self, src: int, dst: int, n: int) -> None:
        lane = self.lanes.get(dst)
        if lane is not None:  # its context is now another lane's prefix: rebuilt on the next draft
            lane.tree, lane.held = self.Tree(DEPTH), 0

    def propose(self, wants: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for seq, (ctx, k) in wants.items():
            lane = self.lanes.get(seq)
            if lane is None or k <= 0:
                continue
            self._flush(lane)
            self._sync(lane, ctx)
            pattern = np.asarray(ctx[-DEPTH:], dtype=np.int32)
            best = lane.tree.speculate_ndarray(pattern, k, SPEC_FACTOR, 0.0, MIN_PROB, False)
            shared = self.globals.get(lane.ns)
            if shared is not None:
                other = shared.speculate_ndarray(pattern, k, SPEC_FACTOR, 0.0, MIN_PROB, False)
                if other.score > best.score:
                    best = other
            draft = list(best.token_ids)[:k]
            if PLACEHOLDER in draft:
                draft = draft[:draft.index(PLACEHOLDER)]
            if draft:
                out[seq] = draft
        return out

    def _sync(self, lane: _Lane, ctx: list[int]) -> None:
        """The lane's tree holds exactly its context, extended with what was added since. While
        a lane runs its context only grows past what the tree holds (a rejected draft was fed
        after the last one drafted from): it is cut only when it is opened again or copied
        into (`begin`, `copy`: a new tree). The last token held is checked all the same."""
        if lane.held and (lane.held > len(ctx) or ctx[lane.held - 1] != lane.last):
            lane.tree, lane.held = self.Tree(DEPTH), 0
        if len(ctx) > lane.held:
            lane.tree.extend_ndarray(0, np.asarray(ctx[lane.held:], dtype=np.int32))
            lane.held, lane.last = len(ctx), ctx[-1]

    def _flush(self, lane: _Lane) -> None:
        """The lane's produced tokens into its namespace's global tree (a new output the first
        time), then the oldest outputs out while over the bounds."""
        if not lane.pending:
            return
        tree = self.globals.get(lane.ns)
        if tree is None:
            tree = self.globals[lane.ns] = self.Tree(DEPTH)
        if lane.out < 0:
            lane.out, self.next_id = self.next_id, (self.next_id + 1) & 0x7FFFFFFF
            self.outputs[(lane.ns, lane.out)] = 0
        key = (lane.ns, lane.out)
        if key in self.outputs:  # (it may have been evicted while the lane ran)
            tree.extend_ndarray(lane.out, np.asarray(lane.pending, dtype=np.int32))
            self.outputs[key] += len(lane.pending)
            self.tokens += len(lane.pending)
        lane.pending = []
        while len(self.outputs) > MAX_OUTPUTS or (self.tokens > MAX_TOKENS and len(self.outputs) > 1):
            (ns, oid), n = self.outputs.popitem(last=False)
            self.globals[ns].remove(oid)
            self.tokens -= n
            if self.globals[ns].num_seqs() == 0:
                del self.globals[ns]
