"""The session store's writer: one thread owns the SQLite connection and runs every call.
Writes queued while a transaction runs share the next one (group commit: one fsync for
all of them, e.g. one per scheduler step for every lane). Each write runs in a SAVEPOINT,
so a write that fails on its own (a SuperfluidError: unknown session, stale epoch) is
undone alone; a failed COMMIT (disk full, I/O) rolls the whole transaction back and fails
every write in it with StoreError."""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import StoreError, StoreFull, SuperfluidError

log = logging.getLogger("superfluid.store")

BATCH = 512  # most queued calls folded into one transaction


class _Call:
    __slots__ = ("fn", "write", "fut", "loop")

    def __init__(self, fn, write: bool, fut: asyncio.Future | None, loop):
        self.fn, self.write, self.fut, self.loop = fn, write, fut, loop


def _resolve(fut: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class Writer:
    def __init__(self, conn: sqlite3.Connection, on_commit: Callable[[float], None] | None = None):
        self._conn = conn
        self.on_commit = on_commit
        self.commits = 0  # transactions committed (each one fsync when durable)
        self.commit_seconds: list[float] = []  # recent commit latencies (a ring, for stats)
        self._q: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="session-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Run what is queued, then stop."""
        self._q.put(None)
        self._thread.join()

    def stats(self) -> dict:
        recent = sorted(self.commit_seconds[-1024:])

        def pct(q: float) -> float | None:
            return round(recent[min(len(recent) - 1, int(q * len(recent)))] * 1000, 3) if recent else None

        return {"commits": self.commits, "commit_p50_ms": pct(0.5), "commit_p99_ms": pct(0.99)}

    def _run(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < BATCH:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._run_batch(batch)
            if stop:
                return

    def _run_batch(self, batch: list[_Call]) -> None:
        conn = self._conn
        assert conn is not None
        results: list[tuple[_Call, Any, BaseException | None]] = []
        writes = [c for c in batch if c.write]
        if writes:
            t0 = time.perf_counter()
            done: list[tuple[_Call, Any, BaseException | None]] = []
            try:
                conn.execute("BEGIN IMMEDIATE")
                for c in writes:
                    conn.execute("SAVEPOINT call")
                    try:
                        done.append((c, c.fn(conn), None))
                        conn.execute("RELEASE call")
                    except (sqlite3.OperationalError, sqlite3.InternalError):
                        raise  # the database itself failed (disk full, I/O): undo the whole batch
                    except Exception as e:  # noqa: BLE001 -- anything else is this call's own fault
                        # (a body that cannot be encoded, nested past the recursion limit, too big)
                        conn.execute("ROLLBACK TO call")
                        conn.execute("RELEASE call")
                        err = e if isinstance(e, SuperfluidError) else StoreError(
                            f"the session store could not encode this request ({type(e).__name__}: {e})")
                        done.append((c, None, err))
                conn.execute("COMMIT")
                self.commits += 1
                results.extend(done)
            except Exception as e:  # noqa: BLE001 -- sqlite errors (disk full, I/O) and anything else: undo all
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                err = full(e) or StoreError(f"the session store could not commit ({e}); nothing of this request "
                                            "was saved")
                log.error("session store: commit failed: %s", e)
                results.extend((c, None, err) for c in writes)
            took = time.perf_counter() - t0
            self.commit_seconds.append(took)
            if len(self.commit_seconds) > 4096:
                del self.commit_seconds[:2048]
            if self.on_commit is not None:
                self.on_commit(took)
        for c in batch:
            if not c.write:
                try:
                    results.append((c, c.fn(conn), None))
                except Exception as e:  # noqa: BLE001 -- a read's failure is that reader's error only
                    results.append((c, None, e if isinstance(e, SuperfluidError) else StoreError(str(e))))
        for c, value, exc in results:
            if c.fut is not None:
                c.loop.call_soon_threadsafe(_resolve, c.fut, value, exc)

    def call(self, fn: Callable[[sqlite3.Connection], Any], write: bool) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put(_Call(fn, write, fut, loop))
        return fut

    def call_sync(self, fn: Callable[[sqlite3.Connection], Any], write: bool = False) -> Any:
        """For code off the event loop (tests, tools): run fn on the writer thread, wait."""
        box: dict = {}
        ev = threading.Event()

        class _Sync:
            def call_soon_threadsafe(self, f, fut, value, exc):
                box.update(value=value, exc=exc)
                ev.set()

        class _Fut:
            def done(self):
                return False

        self._q.put(_Call(fn, write, _Fut(), _Sync()))  # type: ignore[arg-type]
        ev.wait()
        if box["exc"] is not None:
            raise box["exc"]
        return box["value"]


def full(e: BaseException) -> StoreFull | None:
    """The typed error for a commit that failed for want of room (SQLITE_FULL: the page cap
    --sessions-max-mb sets, or the disk)."""
    if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "is full" in str(e):
        return StoreFull("the session store is full (--sessions-max-mb, or the disk); nothing of this request was "
                         "saved: delete or purge sessions to free room")
    return None
