"""Opening the session store's file: the connection (integrity and format checked, private
files, WAL, the schema) and the recovery at each start (a new epoch; sessions cut
mid-generation keep their turn open, and `store: false` ones are erased)."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from ..config import private_file
from ..errors import StoreUnreadable
from .events import Created, EpochBump, decode, encode

log = logging.getLogger("superfluid.store")

FORMAT = "superfluid-sessions-1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, parent TEXT, fork_at INTEGER, model TEXT, api TEXT,
  created REAL NOT NULL, updated REAL NOT NULL, epoch INTEGER NOT NULL, next_id INTEGER NOT NULL,
  title TEXT, archived INTEGER NOT NULL DEFAULT 0, purged INTEGER NOT NULL DEFAULT 0,
  generating INTEGER NOT NULL DEFAULT 0, owner TEXT);
CREATE INDEX IF NOT EXISTS sessions_created ON sessions (created);
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner, created);
CREATE INDEX IF NOT EXISTS sessions_parent ON sessions (parent);
CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (updated);
CREATE TABLE IF NOT EXISTS events (
  session TEXT NOT NULL, id INTEGER NOT NULL, epoch INTEGER NOT NULL, ts REAL NOT NULL,
  kind TEXT NOT NULL, body BLOB NOT NULL, PRIMARY KEY (session, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS responses (
  id TEXT PRIMARY KEY, session TEXT, created REAL NOT NULL, record BLOB NOT NULL);
"""


def connect(path: Path | None, durable: bool, max_bytes: int | None) -> sqlite3.Connection:
    """The store's connection: its file checked (integrity, format) and made private, WAL,
    the schema in place."""
    target = str(path) if path is not None else ":memory:"
    existed = path is not None and path.exists() and path.stat().st_size > 0
    if path is not None:  # SQLite gives its -wal and -shm files the database's mode
        for suffix in ("", "-wal", "-shm"):
            private_file(path.with_name(path.name + suffix), create=not suffix)
    try:
        conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise StoreUnreadable(f"the session store {target} cannot be opened ({e})") from None
    try:
        if existed:
            check = conn.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                raise sqlite3.DatabaseError("; ".join(str(r[0]) for r in check[:3]))
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            fmt = conn.execute("SELECT value FROM meta WHERE key='format'").fetchone() \
                if "meta" in tables else None
            if fmt is None or fmt[0] != FORMAT:
                raise sqlite3.DatabaseError(f"not a superfluid session store (format {fmt[0] if fmt else None})")
        if path is not None:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
        conn.execute("PRAGMA secure_delete=ON")  # erased or purged content is overwritten, not left in free pages
        if max_bytes:
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={max(16, max_bytes // page)}")
        conn.executescript(SCHEMA)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (FORMAT,))
    except sqlite3.DatabaseError as e:
        conn.close()
        raise StoreUnreadable(f"the session store {target} cannot be read ({e}); it was left untouched: "
                              f"move it away or start with --sessions DIR") from None
    return conn


def recover(conn: sqlite3.Connection, wal: bool) -> tuple[int, list[str]]:
    """Bump the store's epoch and every live session's; sessions that were generating
    when the last owner stopped get an EpochBump event (their turn stays open), but for
    `store: false` ones, which are erased (their end would have erased them). (The new epoch,
    the sessions cut.)"""
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
        epoch = (int(row[0]) if row else 0) + 1
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (str(epoch),))
        cut = conn.execute("SELECT id, next_id FROM sessions WHERE generating=1 AND purged=0").fetchall()
        erased = [sid for sid, _ in cut if ephemeral(conn, sid)]
        for sid in erased:  # store: false, cut by the stop: nothing of it stays (its end would have erased it)
            erase(conn, sid)
        cut = [(sid, nxt) for sid, nxt in cut if sid not in erased]
        conn.execute("UPDATE sessions SET epoch=? WHERE purged=0", (epoch,))
        now = time.time()
        for sid, nxt in cut:
            kind, body = encode(EpochBump(epoch))
            conn.execute("INSERT INTO events VALUES (?,?,?,?,?,?)", (sid, nxt, epoch, now, kind, body))
            conn.execute("UPDATE sessions SET next_id=?, updated=?, generating=0 WHERE id=?", (nxt + 1, now, sid))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if wal:  # the WAL held the erased content too: fold it in and empty it
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if erased:
        log.info("session store: %d store:false conversation(s) cut by the stop were erased", len(erased))
    if cut:
        log.info("session store: %d session(s) were cut mid-generation; their turns stay open", len(cut))
    return epoch, [sid for sid, _ in cut]


def erase(c: sqlite3.Connection, sid: str) -> None:
    """A session's content gone for good (events, stored responses); its row stays, purged and
    marked erased (next_id -1), so the id is never reused and reads find nothing."""
    c.execute("DELETE FROM events WHERE session=?", (sid,))
    c.execute("DELETE FROM responses WHERE session=?", (sid,))
    c.execute("UPDATE sessions SET purged=1, title=NULL, generating=0, next_id=-1 WHERE id=?", (sid,))


def ephemeral(c: sqlite3.Connection, sid: str) -> bool:
    """Whether a session was opened by a `store: false` request (its Created event says so)."""
    row = c.execute("SELECT kind, body FROM events WHERE session=? AND id=0", (sid,)).fetchone()
    if row is None:
        return False
    try:
        body = decode(row[0], row[1])
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(body, Created) and isinstance(body.params, dict) and body.params.get("store") is False
