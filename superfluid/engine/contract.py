"""The engine contract: what the API, the service and the monitor may call on a model's
engine, whether it runs here (engine.Engine: scheduler + worker) or on a fleet's nodes
(fleet/head.FleetEngine). Neither engine inherits from the other; both implement this.

`stats()` is the one reading the monitor, /metrics, /health, the TUI and `superfluid top`
take: a frozen record of the engine's state at the moment it is called. A fleet head's
record sums its nodes' lanes, queues, KV and counters, and has a row per node."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..request import Chunk, GenRequest, Qos

if TYPE_CHECKING:
    from ..codec.template import ChatTemplate
    from ..codec.tokenizer import Tokenizer
    from ..codec.dialects import Dialect
    from ..config import EngineConfig
    from ..runtime.base import ModelInfo

QUEUE_CLASSES = tuple(q.name.lower() for q in Qos)  # the classes a queue is reported for


@dataclass(frozen=True)
class Lane:
    """A lane running a generation: its class, its phase (prefilling or decoding) and sizes."""
    lane: int
    qos: str  # interactive, completion, agent, background
    phase: str  # prefilling, decoding
    prompt: int = 0
    generated: int = 0
    cached: int = 0
    node: str = ""  # on a fleet head: the node it runs on


@dataclass(frozen=True)
class NodeStats:
    """A fleet head's view of one node, from the node's last NODE_STATUS."""
    name: str
    addr: str
    up: bool
    lanes: int  # lanes running a generation
    max_lanes: int
    queue: int  # generations waiting for a lane
    kv_used: int
    kv_total: int
    placed: int  # this head's generations placed there
    models: tuple[str, ...] = ()
    prefixes: int = 0  # prompt-prefix hashes it reported (cache-aware placement)
    report: Mapping[str, Any] = field(default_factory=dict)  # the node's status as sent


@dataclass(frozen=True)
class EngineStats:
    model: str
    ready: bool
    max_lanes: int
    lanes: tuple[Lane, ...]
    queue: Mapping[str, int]  # class -> generations waiting; every class of QUEUE_CLASSES
    kv_used: int = 0  # KV tokens held (running lanes and cache entries)
    kv_total: int = 0  # KV tokens the slots can hold
    kv_slots: int = 0
    prefill_rate: float = 0.0  # prompt tokens/s over the last seconds
    decode_rate: float = 0.0  # generated tokens/s over the last seconds
    ttft_n: int = 0  # first-token latencies the percentiles are over
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    restarts: int = 0  # worker processes restarted (a fleet head: every node's, summed)
    steps: int = 0
    embedding: int = 0  # embedding requests in progress
    counters: Mapping[str, int] = field(default_factory=dict)  # the scheduler's (monotonic) counters
    worker_pid: int | None = None
    device: Mapping[str, Any] | None = None  # where the layers are (runtime/offload.Offload.to_json)
    stages: tuple[str, ...] = ()  # a pipeline's stage nodes
    fleet: bool = False  # a fleet head's: its generations run on the nodes below
    nodes: tuple[NodeStats, ...] = ()  # a fleet head's nodes
    placed: int = 0  # a fleet head's generations in progress on its nodes

    @property
    def running(self) -> int:
        return len(self.lanes)

    @property
    def waiting(self) -> int:
        return sum(self.queue.values())

    def by_class_phase(self) -> dict[tuple[str, str], int]:
        """Running lanes counted by (class, phase)."""
        return dict(Counter((lane.qos, lane.phase) for lane in self.lanes))


def full_queue(depths: Mapping[str, int]) -> dict[str, int]:
    """Every class of QUEUE_CLASSES (0 where none wait), then any other a node reported."""
    out = {q: int(depths.get(q, 0)) for q in QUEUE_CLASSES}
    out.update({str(q): int(n) for q, n in depths.items() if q not in out})
    return out


def percentiles(values) -> tuple[float | None, float | None]:
    """(p50, p95) of the values (None, None for none): the monitor's TTFT figures."""
    v = sorted(values)
    if not v:
        return None, None
    mid = len(v) // 2
    p50 = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
    return p50, v[min(len(v) - 1, int(0.95 * len(v)))]


@dataclass(frozen=True)
class Hooks:
    """What an engine reports as it happens, given at construction: the daemon's metrics
    (monitor/metrics.Metrics.hooks), none in tests."""
    ttft: Callable[[float], None] | None = None  # seconds from submit to a stream's first token
    itl: Callable[[float], None] | None = None  # seconds between a stream's tokens


NO_HOOKS = Hooks()  # an engine nobody measures (tests, a node's own engine)


@runtime_checkable
class EngineAPI(Protocol):
    """One model's engine as the API layer, the session service and the monitor see it."""

    model_id: str
    cfg: EngineConfig
    tokenizer: Tokenizer
    template: ChatTemplate
    tool_format: Dialect  # how this model's template writes tool calls
    reasoning: tuple[str, str] | None  # its reasoning markers, if it reasons
    info: ModelInfo | None
    last_used: float  # monotonic time of its last request (the idle reaper reads it)
    sampling_defaults: dict[str, float]  # the operator's and the model's (sampling_defaults.py)

    @property
    def n_ctx(self) -> int: ...

    @property
    def ready(self) -> bool: ...

    @property
    def idle(self) -> bool: ...

    @property
    def model_kind(self) -> str: ...

    @property
    def embed_window(self) -> int: ...

    async def start(self) -> None: ...

    async def close(self, error: Any = None) -> None: ...

    def check(self, req: GenRequest) -> None:
        """Raise the typed error a request that can never run gets."""

    def submit(self, req: GenRequest) -> AsyncIterator[Chunk]:
        """Start a generation; its chunks, the last one with a finish reason."""

    def cancel(self, request_id: str) -> bool: ...

    def keep_running(self, request_id: str) -> None: ...

    def pinned(self, session: str) -> bool:
        """Whether the session's context is pinned here (retention never erases it)."""

    @property
    def queued(self) -> int:
        """Generations waiting here for a lane (--max-queue bounds it)."""

    def encode_prompt(self, text: str) -> list[int]: ...

    def new_seed(self) -> int: ...

    async def embed(self, inputs: list, qos: Qos = Qos.EMBEDDING) -> list: ...

    def stats(self) -> EngineStats:
        """The engine's state now (see EngineStats)."""
