"""Suffix decoding (`--speculative suffix`; SuffixDecoding, arXiv 2411.04975): drafts from
suffix trees, built with Snowflake's Arctic Inference (its C++ SuffixTree, as vLLM's
SuffixDecodingProposer uses it).

Two kinds of tree, each searched with the lane's last tokens:
- a lane's own tree over its context (the prompt and the output so far), kept in step with
  what the lane holds: extended with the tokens added since the last draft, new when the
  lane is opened again (a prefix reused for another request) or copied into;
- a global tree over the outputs this worker produced, one per prefix-cache namespace (so a
  draft never carries one key's text into another's generation), fed as tokens are produced
  and bounded: the oldest outputs leave first past MAX_OUTPUTS or MAX_TOKENS. Outputs are
  kept in a file beside the KV disk tier (runtime/suffix_store.py): a new worker starts
  with them. A store:false request's output (LaneOpen.persist False) drafts from memory
  only: it never reaches the file. An erasure (a session purged, a retention pass:
  suffix_store.forget_before) reaches both: the outputs of lanes opened before it leave the
  file and, at the next lane open or retirement, this memory.

A tree answers with the most frequent continuation of the longest match, token by token while
the continuation's estimated probability stays over MIN_PROB, and no longer than the match
(the paper's adaptive length: a short match drafts little). Of the two answers the one with
the higher score (the sum of the probabilities) is proposed. Where nothing repeats, nothing is
drafted: free chat pays no rows. Drafts are verified as every drafter's are (runtime/base.py)."""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from ..plan import PLACEHOLDER
from .speculate import Drafter
from .suffix_store import OutputFile

DEPTH = 24  # the longest match (and draft) a tree holds: vLLM's default
SPEC_FACTOR = 1.0  # a match of n tokens drafts at most n * SPEC_FACTOR
MIN_PROB = 0.1  # a drafted token's estimated probability at least this (vLLM's default)
MAX_OUTPUTS = 10_000  # outputs the global trees keep (vLLM's default) ...
MAX_TOKENS = 2_000_000  # ... and their tokens in all (about 100 MB of tree at DEPTH 24)


def suffix_tree_class():
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as e:
        raise ModelLoadError("--speculative suffix needs Arctic Inference's suffix tree: pip install nanobind ninja "
                             "cmake grpcio-tools wheel && pip install --no-build-isolation arctic-inference==0.3.0 "
                             f"(scripts/suffix-tree.sh) ({e})") from None
    return SuffixTree


def suffix_tree_available() -> bool:
    """Whether Arctic Inference's suffix tree is installed (`--speculative auto` takes suffix then)."""
    try:
        suffix_tree_class()
    except ModelLoadError:
        return False
    return True


@dataclass
class _Lane:
    tree: Any
    held: int = 0  # the tokens its tree holds: the lane's first `held`
    last: int = PLACEHOLDER  # the last of them
    ns: str = ""
    persist: bool = True  # False (store: false): its output never reaches the file
    opened: float = 0.0  # when it was opened (wall clock): an erasure after it reaches its output
    out: int = -1  # its output's id in the global tree of its namespace (-1: none yet)
    pending: list[int] = field(default_factory=list)  # produced, not yet in the global tree


class SuffixDrafter(Drafter):
    def __init__(self, path: str | None = None, clock: Callable[[], float] = time.time) -> None:
        """`path`: where outputs are kept across restarts (runtime/suffix_store.py); `clock`:
        the wall clock an erasure's time is read against."""
        self.Tree = suffix_tree_class()
        self.clock = clock
        self.lanes: dict[int, _Lane] = {}
        self.globals: dict[str, Any] = {}  # namespace -> the tree of its outputs
        self.outputs: OrderedDict[tuple[str, int], array] = OrderedDict()  # (ns, id) -> its tokens, oldest first
        self.volatile: set[tuple[str, int]] = set()  # outputs of store:false lanes: never written
        self.opened: dict[tuple[str, int], float] = {}  # when each output's lane opened
        self.forgotten = 0.0  # the last erasure applied to memory: outputs of lanes opened before it are gone
        self.tokens = 0
        self.next_id = 0
        self.file = OutputFile(path) if path else None
        if self.file is not None:
            kept: list[tuple[str, array, float]] = []
            n = 0
            for ns, tokens, opened in reversed(self.file.load()):  # the newest that fit the bounds
                if len(kept) >= MAX_OUTPUTS or n + len(tokens) > MAX_TOKENS:
                    break
                kept.append((ns, tokens, opened))
                n += len(tokens)
            kept.reverse()
            for ns, tokens, opened in kept:
                self._add(ns, self._new_id(ns, opened), tokens)
            self.file.rewrite(kept)
            self.forgotten = self.file.cutoff()

    def begin(self, seq: int, ns: str, persist: bool = True) -> None:
        self.end(seq)
        self._erasures()
        self.lanes[seq] = _Lane(self.Tree(DEPTH), ns=ns, persist=persist, opened=self.clock())

    def produced(self, seq: int, token: int) -> None:
        lane = self.lanes.get(seq)
        if lane is not None:
            lane.pending.append(token)

    def end(self, seq: int) -> None:
        lane = self.lanes.pop(seq, None)
        if lane is None:
            return
        self._flush(lane)
        self._erasures()
        tokens = self.outputs.get((lane.ns, lane.out))
        if self.file is not None and tokens and lane.persist:
            self.file.append(lane.ns, tokens, lane.opened)  # (not if an erasure came since it opened)
            if self.file.size > 2 * (4 * self.tokens + 8 * len(self.outputs)) + (1 << 20):
                self.file.rewrite(list((ns, t, self.opened[(ns, oid)]) for (ns, oid), t in self.outputs.items()
                                       if (ns, oid) not in self.volatile))

    def _erasures(self) -> None:
        """An erasure since the last look (suffix_store.forget_before): the outputs of lanes
        opened before it leave memory too, running lanes' included (what they produce from
        now on is dropped, and never written)."""
        if self.file is None:
            return
        cut = self.file.cutoff()
        if cut <= self.forgotten:
            return
        self.forgotten = cut
        for key in [k for k, t in self.opened.items() if t < cut]:
            self._drop(key)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

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
        time)."""
        if not lane.pending:
            return
        if lane.out < 0:
            lane.out = self._new_id(lane.ns, lane.opened)
            if not lane.persist:
                self.volatile.add((lane.ns, lane.out))
        if (lane.ns, lane.out) in self.outputs:  # (it may have been evicted while the lane ran)
            self._add(lane.ns, lane.out, array("i", lane.pending))
        lane.pending = []

    def _new_id(self, ns: str, opened: float) -> int:
        oid, self.next_id = self.next_id, (self.next_id + 1) & 0x7FFFFFFF
        self.outputs[(ns, oid)] = array("i")
        self.opened[(ns, oid)] = opened
        return oid

    def _drop(self, key: tuple[str, int]) -> None:
        """An output out of memory and its namespace's tree."""
        gone = self.outputs.pop(key)
        self.volatile.discard(key)
        self.opened.pop(key, None)
        self.tokens -= len(gone)
        ns, oid = key
        if gone and ns in self.globals:  # (an output with no tokens yet is in no tree)
            self.globals[ns].remove(oid)
            if self.globals[ns].num_seqs() == 0:
                del self.globals[ns]

    def _add(self, ns: str, oid: int, tokens: array) -> None:
        """Tokens onto an output, then the oldest outputs out while over the bounds."""
        tree = self.globals.get(ns)
        if tree is None:
            tree = self.globals[ns] = self.Tree(DEPTH)
        tree.extend_ndarray(oid, np.frombuffer(tokens, dtype=np.int32))
        self.outputs[(ns, oid)].extend(tokens)
        self.tokens += len(tokens)
        while len(self.outputs) > MAX_OUTPUTS or (self.tokens > MAX_TOKENS and len(self.outputs) > 1):
            self._drop(next(iter(self.outputs)))
