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
import struct

import llama_cpp as ll

from ..plan import CHECKPOINTS

PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the recurrent (or SWA) part only
PACKED = b"SFCP"  # a disk entry of such a lane: its whole state and its checkpoints


def pack(full: bytes, cps: dict[int, bytes]) -> bytes:
    """A lane's whole state and its checkpoints, as one disk-tier entry's bytes."""
    head = PACKED + struct.pack("<I", len(cps)) + b"".join(struct.pack("<IQ", p, len(d)) for p, d in cps.items())
    return head + struct.pack("<Q", len(full)) + full + b"".join(cps.values())


def unpack(data: bytes) -> tuple[bytes, dict[int, bytes]]:
    """(whole state, {position: checkpoint}); ValueError for bytes pack did not make."""
    try:
        if data[:4] != PACKED:
            raise ValueError("not a checkpointed state")
        (n,) = struct.unpack_from("<I", data, 4)
        at = 8 + 12 * n
        sizes = [struct.unpack_from("<IQ", data, 8 + 12 * i) for i in range(n)]
        (size,) = struct.unpack_from("<Q", data, at)
        at += 8
        full, at = data[at:at + size], at + size
        cps = {}
        for p, k in sizes:
            cps[p], at = data[at:at + k], at + k
        if at != len(data) or len(full) != size:
            raise ValueError("truncated")
        return full, cps
    except struct.error as e:
        raise ValueError(f"a bad checkpointed state: {e}") from None


def memory_kind(model) -> str:
    """How the model's memory keeps a sequence: "kv" (attention only: any prefix can be cut),
    "swa" (sliding-window attention; llama.cpp's default full-size SWA cache keeps every
    position, so it is cut as "kv" is), "recurrent" (Mamba: one state a sequence) or "hybrid"
    (recurrent or linear-attention layers beside attention: LFM2, Qwen3.5, Granite 4)."""
    if ll.llama_model_is_hybrid(model):
        return "hybrid"
    if ll.llama_model_is_recurrent(model):
        return "recurrent"
    return "swa" if ll.llama_model_n_swa(model) > 0 else "kv"


class Checkpoints:
    def __init__(self, ctx, limit: int = CHECKPOINTS):
        self.ctx = ctx
        self.limit = limit
        self.lanes: dict[int, dict[int, bytes]] = {}  # seq -> {position: partial state}

    def take(self, seq: int, pos: int) -> bool:
        """Save the lane's recurrent state as it is now, after `pos` tokens."""
        size = ll.llama_state_seq_get_size_ext(self.ctx, seq, PARTIAL)
        buf = (ctypes.c_uint8 * size)()
        if size == 0 or ll.llama_state_seq_get_data_ext(self.ctx, buf, size, seq, PARTIAL) != size:
            return False
        lane = self.lanes.setdefault(seq, {})
        lane[pos] = bytes(buf)
        while len(lane) > self.limit:
            del lane[min(lane)]
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
            del lane[p]

    def up_to(self, seq: int, n: int) -> dict[int, bytes]:
        return {p: d for p, d in self.lanes.get(seq, {}).items() if p <= n}

    def put(self, seq: int, cps: dict[int, bytes]) -> None:
        """The lane's checkpoints are these (restored from the disk tier with its state)."""
        self.lanes[seq] = dict(sorted(cps.items())[-self.limit:])

    def copy(self, src: int, dst: int, n: int) -> None:
        """dst holds src's first n tokens: it has src's checkpoints up to n."""
        self.put(dst, self.up_to(src, n))
