"""The session store: SQLite in WAL mode with synchronous=FULL, its schema and operations.
Every call runs on one writer thread (session/writer.py: group commit, one fsync per
transaction, a failed commit fails every write in it and leaves the store consistent).

Opening takes an exclusive lock on the directory (a second daemon is refused), refuses a file
that is not a readable store (never overwriting it), keeps the files the owner's alone (0600
in a 0700 directory), and bumps the epoch of every live session, so no owner from before the
restart can append."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import private_dir
from ..errors import BadRequest, SessionNotFound, StaleEpoch, StoreError, StoreLocked, SuperfluidError
from .opening import connect, erase, recover
from .writer import Writer
from .events import Body, Created, EpochBump, Event, Generated, GenerationPrompt, Message, Meta, Purge, ToolResult, \
    decode, encode

log = logging.getLogger("superfluid.store")

@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    parent: str | None
    fork_at: int | None
    model: str | None
    api: str | None
    created: float
    updated: float
    epoch: int
    next_id: int
    title: str | None
    archived: bool
    purged: bool
    generating: bool
    owner: str | None = None  # the name of the API key that made it (None: no keys)

    def to_json(self) -> dict:
        return {"id": self.id, "object": "session", "model": self.model, "api": self.api,
                "created": self.created, "updated": self.updated, "epoch": self.epoch,
                "events": self.next_id, "title": self.title, "archived": self.archived,
                "parent": self.parent, "fork_at": self.fork_at, "owner": self.owner}


_ROW = "id, parent, fork_at, model, api, created, updated, epoch, next_id, title, archived, purged, generating, owner"


def _row(r) -> SessionRow:
    return SessionRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], bool(r[10]), bool(r[11]),
                      bool(r[12]), r[13])


@dataclass(frozen=True, slots=True)
class Append:
    """One event to append; `epoch`, when set, must be the session's current epoch."""
    session: str
    body: Body
    epoch: int | None = None
    expect_id: int | None = None  # when set, the id the event must get (no gaps after a failure)


class Store:
    def __init__(self, directory: str | Path | None, *, durable: bool = True, max_bytes: int | None = None):
        """directory None: a throwaway in-memory store (nothing survives the process)."""
        self.dir = Path(directory).expanduser() if directory is not None else None
        self.path = self.dir / "sessions.db" if self.dir is not None else None
        self.durable = durable and self.dir is not None
        self.max_bytes = max_bytes
        self.epoch = 0  # this opening's epoch: one more than the last opening's
        self.recovered: list[str] = []  # sessions cut mid-generation by the last stop
        self._lock_fd: int | None = None
        self._conn: sqlite3.Connection | None = None
        self._w: Writer | None = None

    # -- opening -------------------------------------------------------------------------
    def open(self, on_commit: Callable[[float], None] | None = None) -> Store:
        """Lock, read and recover the store; `on_commit` gets each commit's seconds (metrics)."""
        if self.dir is not None:
            self._take_lock()
        try:
            self._conn = connect(self.path, self.durable, self.max_bytes)
            self.epoch, self.recovered = recover(self._conn, wal=self.path is not None)
        except BaseException:
            self.close()
            raise
        self._w = Writer(self._conn, on_commit=on_commit)
        return self

    def _take_lock(self) -> None:
        fd = os.open(private_dir(self.dir) / "lock", os.O_RDWR | os.O_CREAT, 0o600)  # type: ignore[arg-type]
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreLocked(f"another superfluid daemon (pid {holder}) is using the sessions directory "
                              f"{self.dir}; stop it, or give this one --sessions DIR") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def stats(self) -> dict:
        return {"path": str(self.path) if self.path else None, "durable": self.durable, "epoch": self.epoch,
                **(self._w.stats() if self._w is not None else {})}

    @property
    def commits(self) -> int:
        return self._w.commits if self._w is not None else 0

    def _call(self, fn: Callable[[sqlite3.Connection], Any], write: bool) -> asyncio.Future:
        if self._w is None:
            raise StoreError("the session store is closed")
        return self._w.call(fn, write)

    def call_sync(self, fn: Callable[[sqlite3.Connection], Any], write: bool = False) -> Any:
        """For code off the event loop (startup imports, tools): run fn on the writer, wait."""
        if self._w is None:
            raise StoreError("the session store is closed")
        return self._w.call_sync(fn, write)

    # -- operations ----------------------------------------------------------------------
    # Writes are queued when called (not when awaited): the order of calls is the order of
    # the log, whatever order the callers await in.
    def create(self, sid: str, *, params: dict, model: str | None = None, api: str | None = None,
               bodies: Sequence[Body] = (), parent: str | None = None,
               fork_at: int | None = None, owner: str | None = None) -> asyncio.Future:
        """A new session with a Created event (and `bodies` after it), in one commit:
        resolves to its events."""
        return self._call(lambda c: self._create(c, sid, params, model, api, bodies, parent, fork_at, owner), True)

    def create_many(self, specs: list[dict]) -> asyncio.Future:
        """Several sessions in one commit (a request's choices): dicts of create()'s args."""
        return self._call(lambda c: [self._create(c, **s) for s in specs], True)

    def append(self, items: Sequence[Append]) -> asyncio.Future:
        """Append events, one commit for all: resolves to one Event or error per item. A
        refused item (unknown session, stale epoch, a gap) does not stop the others."""
        return self._call(lambda c: [self._append_one(c, it) for it in items], True)

    async def append_one(self, item: Append) -> Event:
        (res,) = await self.append([item])
        if isinstance(res, SuperfluidError):
            raise res
        return res

    async def events(self, sid: str, after: int = -1, limit: int | None = None) -> list[Event]:
        return await self._call(lambda c: self._events(c, sid, after, None, limit), False)

    async def session(self, sid: str) -> SessionRow:
        return await self._call(lambda c: self._session(c, sid), False)

    async def sessions(self, *, limit: int = 100, before: float | None = None,
                       archived: bool | None = None, owner: str | None = None) -> list[SessionRow]:
        """The newest sessions first; `owner`: only that key's."""
        def q(c):
            sql = f"SELECT {_ROW} FROM sessions WHERE purged=0"
            args: list = []
            if owner is not None:
                sql += " AND owner=?"
                args.append(owner)
            if before is not None:
                sql += " AND created < ?"
                args.append(before)
            if archived is not None:
                sql += " AND archived=?"
                args.append(int(archived))
            sql += " ORDER BY created DESC LIMIT ?"
            args.append(limit)
            return [_row(r) for r in c.execute(sql, args)]
        return await self._call(q, False)

    # -- stored Responses (OpenAI Responses API): a record per response, by id ------------
    def put_response(self, rid: str, session: str | None, record: bytes) -> asyncio.Future:
        return self._call(lambda c: c.execute("INSERT OR REPLACE INTO responses VALUES (?,?,?,?)",
                                              (rid, session, time.time(), record)), True)

    async def response(self, rid: str) -> bytes | None:
        def q(c):
            r = c.execute("SELECT record FROM responses WHERE id=?", (rid,)).fetchone()
            return r[0] if r else None
        return await self._call(q, False)

    async def response_owner(self, rid: str) -> tuple[bool, str | None]:
        """(whether the response exists, the owner of its session)."""
        r = await self._call(lambda c: c.execute("SELECT s.owner FROM responses r LEFT JOIN sessions s "
                                                 "ON s.id = r.session WHERE r.id=?", (rid,)).fetchone(), False)
        return (r is not None, r[0] if r else None)

    def prunable(self, cutoff: float | None, limit: int, skip: int = 0) -> asyncio.Future:
        """Sessions retention may erase, least recently written first: not erased, not
        generating, last written before `cutoff` (None: whenever), and no kept session forked
        from them (a fork reads its parent's events). `skip`: the first ones, passed over."""
        age = " AND updated < ?" if cutoff is not None else ""
        sql = (f"SELECT id FROM sessions s WHERE next_id >= 0 AND generating=0{age} AND NOT EXISTS "
               "(SELECT 1 FROM sessions k WHERE k.parent = s.id AND k.next_id >= 0) ORDER BY updated LIMIT ? OFFSET ?")
        args = ((cutoff,) if cutoff is not None else ()) + (limit, skip)
        return self._call(lambda c: [r[0] for r in c.execute(sql, args)], False)

    def used_bytes(self) -> asyncio.Future:
        """Bytes the store's pages hold (free pages, which new writes reuse, not counted)."""
        def q(c):
            (pages,), (free,), (size,) = (c.execute(f"PRAGMA {p}").fetchone()
                                          for p in ("page_count", "freelist_count", "page_size"))
            return (pages - free) * size
        return self._call(q, False)

    async def erase_many(self, sids: Sequence[str]) -> None:
        def q(c):
            for sid in sids:
                erase(c, sid)
        await self._call(q, True)

    async def erase(self, sid: str) -> None:
        """Remove a session's content for good (events, stored responses); its row stays, purged
        and marked erased (next_id -1), so the id is never reused and reads find nothing."""
        await self._call(lambda c: erase(c, sid), True)

    async def delete_response(self, rid: str) -> bool:
        return await self._call(lambda c: c.execute("DELETE FROM responses WHERE id=?", (rid,)).rowcount > 0, True)

    # -- on the writer thread ------------------------------------------------------------
    @staticmethod
    def _session(c: sqlite3.Connection, sid: str) -> SessionRow:
        r = c.execute(f"SELECT {_ROW} FROM sessions WHERE id=?", (sid,)).fetchone()
        if r is None:
            raise SessionNotFound(f"no session {sid}", param="session")
        return _row(r)

    def _create(self, c, sid, params, model=None, api=None, bodies=(), parent=None, fork_at=None,
                owner=None) -> list[Event]:
        first = 0
        if parent is not None:
            p = self._session(c, parent)
            if fork_at is None or not 0 <= fork_at < p.next_id:
                raise BadRequest(f"session {parent} has no event {fork_at} to fork at", param="at")
            first = fork_at + 1
        now = time.time()
        try:
            c.execute(f"INSERT INTO sessions ({_ROW}) VALUES (?,?,?,?,?,?,?,?,?,?,0,0,0,?)",
                      (sid, parent, fork_at, model, api, now, now, self.epoch, first, None, owner))
        except sqlite3.IntegrityError:
            raise BadRequest(f"session {sid} already exists") from None
        out = [self._append_one(c, Append(sid, Created(parent, fork_at, params)), strict=True)]
        out += [self._append_one(c, Append(sid, b), strict=True) for b in bodies]
        return out  # type: ignore[return-value]

    def _append_one(self, c, it: Append, strict: bool = False) -> Event | SuperfluidError:
        r = c.execute("SELECT epoch, next_id, purged FROM sessions WHERE id=?", (it.session,)).fetchone()
        err: SuperfluidError | None = None
        if r is None:
            err = SessionNotFound(f"no session {it.session}", param="session")
        elif r[2] and not isinstance(it.body, Purge):
            err = SessionNotFound(f"session {it.session} was purged", param="session")
        elif it.epoch is not None and it.epoch != r[0]:
            err = StaleEpoch(f"session {it.session} is at epoch {r[0]}, not {it.epoch}")
        elif it.expect_id is not None and it.expect_id != r[1]:
            err = StoreError(f"session {it.session}: an earlier write of this generation failed "
                             f"(next event is {r[1]}, not {it.expect_id}); nothing more is appended")
        if err is not None:
            if strict:
                raise err
            return err
        epoch, eid = r[0], r[1]
        now = time.time()
        kind, data = encode(it.body)
        c.execute("INSERT INTO events VALUES (?,?,?,?,?,?)", (it.session, eid, epoch, now, kind, data))
        b = it.body
        sets = ["next_id=?", "updated=?"]
        args: list = [eid + 1, now]
        gen = _generating(b)
        if gen is not None:
            sets.append("generating=?")
            args.append(int(gen))
        if isinstance(b, Meta):
            if b.title is not None:
                sets.append("title=?")
                args.append(b.title)
            if b.archived is not None:
                sets.append("archived=?")
                args.append(int(b.archived))
        elif isinstance(b, Purge):
            sets.append("purged=1")
        c.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id=?", (*args, it.session))
        return Event(eid, epoch, now, b)

    def _events(self, c, sid: str, after: int, upto: int | None, limit: int | None) -> list[Event]:
        row = self._session(c, sid)
        if row.next_id < 0:
            raise SessionNotFound(f"no session {sid}", param="session")  # erased (store: false)
        out: list[Event] = []
        if row.parent is not None and row.fork_at is not None and after < row.fork_at:
            out = self._events(c, row.parent, after, row.fork_at if upto is None else min(upto, row.fork_at), limit)
            after = row.fork_at
        if limit is not None and len(out) >= limit:
            return out[:limit]
        sql = "SELECT id, epoch, ts, kind, body FROM events WHERE session=? AND id>?"
        args: list = [sid, after]
        if upto is not None:
            sql += " AND id<=?"
            args.append(upto)
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit - len(out))
        for eid, epoch, ts, kind, body in c.execute(sql, args):
            try:
                out.append(Event(eid, epoch, ts, decode(kind, body)))
            except (ValueError, TypeError) as e:
                raise StoreError(f"session {sid} event {eid} cannot be decoded ({e})") from None
        return out


def _generating(b: Body) -> bool | None:
    """Whether the session is mid-generation after this event (None: unchanged)."""
    if isinstance(b, GenerationPrompt):
        return True
    if isinstance(b, Generated):
        return b.finish is None
    if isinstance(b, (Message, ToolResult, EpochBump)):
        return False
    return None

