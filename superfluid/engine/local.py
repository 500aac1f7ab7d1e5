"""One model: scheduler + worker process. The API layer talks to it only through the
engine contract (engine.contract.EngineAPI): `submit()` (an async iterator of Chunks),
`cancel()`, `stats()` and read calls; what it shares with the fleet head's engine (codec,
request check, streams and their delivery) is in engine/base.py.

The loop is three calls: plan = scheduler.schedule(); the worker runs it; events =
scheduler.update(plan, result), with two plans in flight (see _loop). Around them: size
prefill chunks from measured speed, respawn a dead worker (failing the lanes it held with
a typed error), and turn each token event into a Chunk for its request's stream (delivery.py
commits it to the session log first)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
import time
from collections.abc import AsyncIterator, Callable

from ..codec.output import OutputProcessor
from ..codec.detok import TextStream
from ..codec.tokenizer import Tokenizer
from ..config import EngineConfig
from .embedding import Embedder
from .contract import NO_HOOKS, EngineStats, Hooks
from .base import EngineBase
from .budget import StepBudget
from .stats import RateMeter, local_stats
from ..errors import SuperfluidError, WorkerCrashed, WorkerUnavailable
from ..plan import StepPlan
from ..request import Chunk, FinishReason, GenRequest, Qos, TokenLogprob
from ..sched import multistep
from ..sched.embeds import EmbedEvent
from ..sched.jobs import ProgressEvent, TokenEvent
from ..sched.scheduler import Job, Scheduler
from .delivery import SessionLog
from .delivery import Stream as _Stream
from ..worker.protocol import WorkerSettings
from ..worker.supervisor import WorkerProcess

log = logging.getLogger("superfluid.engine")

PIPELINE_DEPTH = 2  # plans in flight to the worker


class Engine(EngineBase):
    def __init__(self, cfg: EngineConfig, tokenizer: Tokenizer, n_ctx: int, log: SessionLog | None = None,
                 worker_factory: Callable[[WorkerSettings], WorkerProcess] = WorkerProcess, *,
                 hooks: Hooks = NO_HOOKS, clock: Callable[[], float] = time.monotonic):
        super().__init__(cfg, tokenizer, log, hooks=hooks, clock=clock)
        self.spec = WorkerSettings(cfg.model_path, cfg.slots, n_ctx, cfg.threads, cfg.step_tokens, runtime=cfg.runtime,
                                   stages=cfg.stages, spares=cfg.stage_spares, stage_psk=cfg.stage_psk,
                                   split=cfg.stage_split, pooling=cfg.pooling,
                                   kv_dir=cfg.kv_dir, draft_model=cfg.draft_model, speculative=cfg.speculative,
                                   kv_disk_mb=cfg.kv_disk_mb, rpc_nodes=cfg.rpc_nodes, rpc_split=cfg.rpc_split,
                                   rpc_output=cfg.rpc_output, rope_scaling=cfg.rope_scaling,
                                   rope_scale=cfg.rope_scale, yarn_orig_ctx=cfg.yarn_orig_ctx,
                                   rpc_names=cfg.rpc_names, rpc_listen_fd=cfg.rpc_listen_fd, kv_bits=cfg.kv_bits,
                                   flash_attn=cfg.flash_attn, n_cpu_moe=cfg.n_cpu_moe,
                                   swa_cache="window" if cfg.swa_cache == "window" else "full",
                                   gpu_layers=int(cfg.gpu_layers) if cfg.gpu_layers.isdigit() else 999,
                                   devices=cfg.devices, split_mode=cfg.split_mode, tensor_split=cfg.tensor_split)
        self.worker: WorkerProcess | None = None
        self._new_worker = worker_factory  # a process; tests pass an in-process worker with its face
        self.sched = Scheduler(lanes=cfg.max_batch, n_ctx=n_ctx, step_tokens=cfg.step_tokens,
                               eog=tokenizer.eog, slots=cfg.slots,
                               class_lanes={Qos(q): n for q, n in cfg.class_lanes},
                               aging_steps=cfg.aging_steps,
                               # shortest remaining work first within a class; SUPERFLUID_SRPT=0 (a
                               # benchmarking switch) serves a class first come, first served
                               srpt=os.environ.get("SUPERFLUID_SRPT", "1") != "0",
                               tail_rows=2 if cfg.deterministic else 1)
        self.respawns = 0
        self.meter = RateMeter()  # prefill and decode tokens/s for stats()
        self.budget = StepBudget(step_target_s=cfg.step_target_s, step_tokens=cfg.step_tokens, lanes=cfg.max_batch,
                                 decode_steps=cfg.decode_steps)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._failures = 0
        self._gave_up = False
        self.loop_errors = 0  # times the loop hit an error it did not expect and went on
        self._loop_failures = 0  # in a row, without a step completing
        self.steps = 0
        self.embedder = Embedder(self)

    @property
    def n_ctx(self) -> int:
        return self.sched.n_ctx

    @property
    def ready(self) -> bool:
        """Serving: the loop runs and the worker is up (/health says so)."""
        loop_ok = self._task is None or not self._task.done()
        return loop_ok and self.worker is not None and self.worker.alive

    async def start(self) -> None:
        self.worker = self._new_worker(self.spec)
        self.info = await self.worker.start()
        self.sched.tiers.seed_disk(self.worker.kv_entries)
        # llama.cpp may round the per-lane window; never promise more than it holds
        self.sched.n_ctx = min(self.sched.n_ctx, self.info.n_ctx)
        self.sched.embeds.window = self.info.embed_window
        self.sched.embeds.chunks = self.info.embed_chunks
        self.sched.spec.supported = bool(self.info.speculate)  # the runtime verifies drafted rows
        self.sched.spec.max_tokens = self.cfg.spec_tokens if self.info.rollback else 0
        self.sched.slots.checkpoints = self.info.prefix_cache == "checkpoints"  # cut lanes only where saved
        self.sched.tiers.marks_only = self.info.disk_marks
        if self.info.memory != "kv":  # one line on how this model's prefix is reused (docs/models.md)
            log.info("%s: %s memory%s; prefix cache: %s", self.cfg.model_id, self.info.memory,
                     " (window-sized sliding-window cache: the full-size one did not fit)" if self.info.swa_window
                     else "", "state checkpoints (the last 8 a lane)" if self.info.prefix_cache == "checkpoints"
                     else "full-size sliding-window cache (restored from disk only whole)")
        self._task = asyncio.create_task(self._supervised(), name="engine-loop")

    async def close(self, error: SuperfluidError | None = None) -> None:
        """Stop the loop and the worker. Requests still running end with `error` (a typed
        error), or as cancelled when the whole daemon is stopping."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        # tokens still waiting for their commit are dropped: each of those streams ends
        # with the error below (the log may hold more than its client saw, never less)
        for st in self.out.drop():
            if st.req.id not in self._streams and not st.failed:  # its last chunk was among them
                st.queue.put_nowait(st.final(FinishReason.ERROR if error else FinishReason.CANCELLED, error))
        for st in list(self._streams.values()):
            self._end(st, st.final(FinishReason.ERROR if error else FinishReason.CANCELLED, error))
        self.embedder.fail_all(error or WorkerUnavailable("the server is stopping"))
        if self.worker is not None:
            await self.worker.stop()

    # -- the API's view ------------------------------------------------------------------
    def submit(self, req: GenRequest) -> AsyncIterator[Chunk]:
        """Queue a generation that check() accepted."""
        self.last_used = self.clock()
        out = OutputProcessor(TextStream(self.codec.pieces, self.tokenizer.eog, req.stop), req.channels)
        out.replay(req.history)  # a continued turn (a restart, a failover) picks up where it was
        st = _Stream(req, out)
        self._streams[req.id] = st
        self.sched.add(Job(req.id, list(req.prompt), req.sampling, req.max_tokens, req.qos, prior=tuple(req.history),
                           session=req.session, cache=req.cache, speculate=req.speculate, persist=req.persist,
                           cache_ns=req.cache_ns, progress=req.progress))
        if self._gave_up:  # a new request is the cue to try the worker again
            self._gave_up, self._failures = False, 0
        self._wake.set()
        return self._iterate(st)

    @property
    def embed_window(self) -> int:
        """Most tokens in one input to embed (0: this model cannot embed)."""
        return self.info.embed_window if self.info is not None else 0

    @property
    def model_kind(self) -> str:
        """generate, embedding (embeds only) or cross-encoder (scores pairs only)."""
        return self.info.kind if self.info is not None else "generate"

    def wake(self) -> None:
        """New work for the loop (a new request is also the cue to try a given-up worker again)."""
        if self._gave_up:
            self._gave_up, self._failures = False, 0
        self._wake.set()

    def cancel(self, request_id: str) -> bool:
        st = self._streams.pop(request_id, None)
        if st is None:
            return False
        st.done = True
        self.sched.finish(request_id, FinishReason.CANCELLED)
        self._end(st, st.final(FinishReason.CANCELLED))
        self._wake.set()
        return True

    def pin(self, session: str, tokens: list[int] | None, cache_ns: str = "") -> int:
        """Keep a session's context (in prefix-cache namespace `cache_ns`) warm (sched/pins.py),
        or unpin it (None): tokens a slot holds."""
        self._wake.set()  # the disk pin goes with the next plan
        if tokens is None:
            return int(self.sched.tiers.unpin_session(session))
        return self.sched.tiers.pin_session(session, tokens, cache_ns)

    def pinned(self, session: str) -> bool:
        return self.sched.tiers.pinned(session)

    @property
    def queued(self) -> int:
        return len(self.sched.waiting)

    @property
    def idle(self) -> bool:
        return not self._streams and not self.sched.has_work and not self.embedder.running

    def kv_usage(self) -> tuple[int, int]:
        """(tokens of KV held: running lanes and cache entries, tokens the slots can hold)."""
        used = sum(len(s.kv) if s.job is None else min(s.job.scheduled, self.n_ctx)
                   for s in self.sched.slots.slots)
        return used, len(self.sched.slots) * self.n_ctx

    def stats(self) -> EngineStats:
        return local_stats(self)

    # -- the loop ------------------------------------------------------------------------
    async def _supervised(self) -> None:
        """The loop, restarted after any error it did not expect (a step that cannot be
        built or sent, a bug): the requests it was running end with a typed error, the
        worker, whose state may no longer match the scheduler's, is replaced, and the model
        goes on serving. Three failures in a row, with no step completing, also fail the
        waiting requests (one of them may be what fails)."""
        while True:
            try:
                await self._loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 -- any error: the loop must go on
                self.loop_errors += 1
                self._loop_failures += 1
                log.exception("engine loop of %s failed (%s); its running requests fail, it goes on",
                              self.model_id, type(e).__name__)
                err = WorkerCrashed(f"the engine could not run this request ({type(e).__name__}: {e})",
                                    code="engine_error")
                if self.worker is not None:
                    await self.worker.stop(timeout=1.0)
                    self.worker = None
                self._lose_lanes(err)
                if self._loop_failures >= 3:
                    self._loop_failures = 0
                    for job in list(self.sched.waiting):
                        st = self._streams.get(job.id)
                        self.sched.finish(job.id, FinishReason.ERROR)
                        if st is not None:
                            self._end(st, st.final(FinishReason.ERROR, err))
                try:
                    await self._respawn()  # now, not at the next request: /health comes back
                except Exception:  # noqa: BLE001 -- the loop's next turn tries again
                    log.exception("respawning the worker of %s failed", self.model_id)
                self._wake.set()

    async def _loop(self) -> None:
        """schedule -> worker.step -> update, with PIPELINE_DEPTH plans in flight: the worker
        finds its next plan waiting when it finishes a step (decodes of tokens it has not
        returned yet carry PLACEHOLDER), so neither the Link W round trip nor detokenizing
        and streaming ever leave it idle."""
        inflight: deque[StepPlan] = deque()
        while True:
            if not inflight:
                if not self.sched.has_work:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self.ready and not await self._respawn():
                    continue
                self._fill(inflight)
                if not inflight:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
            assert self.worker is not None
            try:
                result = await self.worker.recv_step()
                plan = inflight.popleft()
                events = self.sched.update(plan, result)
            except (WorkerCrashed, ValueError) as e:
                err = e if isinstance(e, WorkerCrashed) else WorkerCrashed(f"Link W out of step: {e}")
                log.error("worker %s crashed: %s", self.worker.pid, err.message)
                inflight.clear()
                if err.code == "stage_unavailable" and self.cfg.stage_spares:
                    # a pipeline with spare stages: the next worker takes a spare in place of the
                    # lost stage, and the running requests continue on it after a re-prefill
                    self.sched.reset(requeue=True)
                    self._fail_poisoned(err)
                else:
                    self._lose_lanes(err, retry=True)
                await self._respawn()  # now, not at the next request: /health comes back
                continue
            self._failures = 0
            self._loop_failures = 0
            self.steps += 1
            self.budget.after_step(self.sched, plan.n_tokens, result.elapsed_s, self.clock(),
                                   multistep.forwards(plan.runs, (s.seq for s in result.sampled), bool(result.drafted)))
            self._fill(inflight)
            self.embedder.deliver([e for e in events if isinstance(e, EmbedEvent)])
            self.out.publish([o for o in map(self._prepare, events) if isinstance(o, tuple)])

    def _fill(self, inflight: deque[StepPlan]) -> None:
        self.sched.tiers.expire(self.clock())  # the scheduler reads no clock
        depth = 1 if self.budget.long_steps else PIPELINE_DEPTH  # an arriving request waits one long step, not two
        while len(inflight) < depth and self.ready:
            plan = self.sched.schedule()
            if plan is None:
                return
            assert self.worker is not None
            self.worker.send_step(plan)
            inflight.append(plan)

    async def _respawn(self) -> bool:
        """Replace a dead worker. Gives up after max_respawns failures in a row (until the
        next request) and fails every waiting request with WorkerUnavailable."""
        if self.worker is not None:
            self._lose_lanes(WorkerCrashed("the worker process died"), retry=True)
            await self.worker.stop(timeout=1.0)
            self.worker = None
        while not self._gave_up:
            if self._failures >= self.cfg.max_respawns:
                log.error("worker failed %d times in a row without completing a step; not "
                          "restarting it until the next request", self._failures)
                self._gave_up = True
                break
            self._failures += 1
            worker = self._new_worker(self.spec)
            try:
                self.info = await worker.start()
                self.sched.tiers.seed_disk(worker.kv_entries)
                self.worker = worker
                self.respawns += 1
                log.warning("worker respawned (pid %s)", worker.pid)
                return True
            except WorkerCrashed as e:
                log.error("worker failed to start: %s", e.message)
                await worker.stop(timeout=1.0)
        err = WorkerUnavailable("the model's worker process is down; retry the request")
        self.embedder.fail_all(err)
        for job in list(self.sched.waiting):
            st = self._streams.get(job.id)
            self.sched.finish(job.id, FinishReason.ERROR)
            if st is not None:
                self._end(st, Chunk(job.id, finish=FinishReason.ERROR, error=err))
        return False

    def _lose_lanes(self, err: SuperfluidError, *, retry: bool = False) -> None:
        """Running requests end with err; with retry (the worker died, not the engine's
        own error), those that have streamed nothing yet are requeued once instead."""
        for job in self.sched.reset(retry=retry):
            st = self._streams.get(job.id)
            if st is not None:
                self._end(st, st.final(FinishReason.ERROR, err))
        self._fail_poisoned(err)

    def _fail_poisoned(self, err: SuperfluidError) -> None:
        """Embedding jobs whose inputs were in flight at every one of the last worker deaths."""
        for job_id in self.sched.embeds.take_poisoned():
            self.embedder.fail(job_id, WorkerCrashed(f"the worker died twice while embedding this request's "
                                                     f"inputs ({err.message}); it is not retried again"))

    def _fail(self, st: _Stream, err: SuperfluidError) -> None:
        """Its tokens could not be committed: end it with the error, generate no more."""
        st.done = True
        self._streams.pop(st.req.id, None)
        self.sched.finish(st.req.id, FinishReason.ERROR)
        self._wake.set()
        st.queue.put_nowait(st.final(FinishReason.ERROR, err))

    def _prepare(self, ev: TokenEvent | EmbedEvent | ProgressEvent) -> tuple[_Stream, Chunk] | None:
        if isinstance(ev, EmbedEvent):
            return None
        st = self._streams.get(ev.job_id)
        if st is None:
            return None
        if isinstance(ev, ProgressEvent):  # never logged: nothing of the conversation in it
            ms = (time.monotonic() - st.t_submit) * 1000
            return st, Chunk(st.req.id, progress=(ev.total, ev.cached, ev.processed, round(ms, 3)))
        if ev.error is not None:  # its lane failed on its own: it ends with the error, no other does
            st.done = True
            self._streams.pop(st.req.id, None)
            return st, st.final(FinishReason.ERROR, ev.error.exception())  # typed as the worker raised it
        self._timed(st)
        lp = None
        if ev.logprob is not None and ev.token not in self.tokenizer.eog:
            tt = self.tokenizer.token_text
            lp = TokenLogprob(ev.token, tt(ev.token), ev.logprob, tuple((t, tt(t), p) for t, p in ev.top))
        try:
            chunk = st.chunk(ev.token, ev.finish, ev.cached, lp)
        except Exception as e:  # noqa: BLE001 - reading one stream's output fails that stream alone
            log.exception("request %s: its output could not be read", st.req.id)
            st.done = True
            self._streams.pop(st.req.id, None)
            self.sched.finish(ev.job_id, FinishReason.ERROR)
            return st, st.final(FinishReason.ERROR, SuperfluidError(
                f"the output could not be read ({type(e).__name__})", code="output_unreadable"))
        if chunk.stop_sequence is not None:
            self.sched.finish(ev.job_id, FinishReason.STOP_SEQUENCE)
        if chunk.finish is not None:
            st.done = True
            self._streams.pop(st.req.id, None)
        return st, chunk
