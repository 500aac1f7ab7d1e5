"""State checkpoints: the prefix cache of models whose memory cannot be cut at any position.

A recurrent layer (Mamba, LFM2's short convolutions, Qwen3.5's and Qwen3-Next's linear
attention) keeps one state a sequence, folded over every token so far: llama.cpp refuses to
drop a recurrent lane's tail (`llama_memory_seq_rm` returns false for a partial range), so a
lane's KV can be reused only up to where its state was saved. This keeps those saves: after
each run of more than one token (a prefill chunk, the end of a prompt) the lane's recurrent
part (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: the attention layers of a hybrid model are cut as
usual) is copied to host memory, at most `plan.CHECKPOINTS` a lane, the oldest going first.

The scheduler keeps the same positions (sched/lanes.Slot.marks, by the same rule) and seats a
job only at one of them or at the lane's end; a cut the runtime cannot make anyway (a
checkpoint it failed to take) falls back to the deepest one it has, and the scheduler hears
how much the lane holds (StepResult.held)."""

from __future__ import annotations

import ctypes

import llama_cpp as ll

from ..plan import CHECKPOINTS

PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the recurrent (or SWA) part only


class Checkpoints:
    def __init__(self, ctx, limit: int = CHECKPOINTS):
        self.ctx = ctx
        self.limit = limit
        self.lanes: dict[int, dict[int, bytes]] = {}  # seq -> {position: partial state}
        self.bytes = 0

    def take(self, seq: int, pos: int) -> bool:
        """Save the lane's recurrent state as it is now, after `pos` tokens."""
        size = ll.llama_state_seq_get_size_ext(self.ctx, seq, PARTIAL)
        buf = (ctypes.c_uint8 * size)()
        if size == 0 or ll.llama_state_seq_get_data_ext(self.ctx, buf, size, seq, PARTIAL) != size:
            return False
        lane = self.lanes.setdefault(seq, {})
        self.bytes += size - len(lane.get(pos, b""))
        lane[pos] = bytes(buf)
        while len(lane) > self.limit:
            self.bytes -= len(lane.pop(min(lane)))
        return True

    def restore(self, seq: int, pos: int) -> bool:
        """Put the lane's recurrent state back to its checkpoint at `pos` (the attention part
        is cut by the caller). False: there is none, or llama.cpp refused it."""
        data = self.lanes.get(seq, {}).get(pos)
        if data is None:
            return False
        src = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return ll.llama_state_seq_set_data_ext(self.ctx, src, len(data), seq, PARTIAL) == len(data)

    def below(self, seq: int, n: int) -> list[int]:
        """The lane's checkpoint positions at or below n, deepest first."""
        return sorted((p for p in self.lanes.get(seq, {}) if p <= n), reverse=True)

    def keep(self, seq: int, n: int) -> None:
        """The lane keeps its first n tokens: checkpoints past them go."""
        lane = self.lanes.get(seq, {})
        for p in [p for p in lane if p > n]:
            self.bytes -= len(lane.pop(p))

    def copy(self, src: int, dst: int, n: int) -> None:
        """dst holds src's first n tokens: it has src's checkpoints up to n."""
        self.keep(dst, -1)
        lane = {p: d for p, d in self.lanes.get(src, {}).items() if p <= n}
        self.bytes += sum(len(d) for d in lane.values())
        self.lanes[dst] = lane
