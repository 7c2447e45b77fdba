"""The embedded backend: one SQLite file in WAL mode, stdlib :mod:`sqlite3` only.

Each thread (and each process) gets its own connection, opened lazily; WAL lets readers
run while one writer commits, and writes start with ``BEGIN IMMEDIATE`` so a writer
takes the lock up front and waits (``busy_timeout``) instead of failing half-way with a
deadlock between two deferred transactions. :meth:`SQLiteStore.release` closes the
calling thread's connection: the summarisation cycle calls it before the model call, so
nothing is held while the model thinks. ``:memory:`` keeps one shared connection (closing
it would drop the database), guarded by a lock.

Deleted and overwritten content is zeroed where that costs no extra write
(``secure_delete = FAST``, whatever the SQLite build's default): within the b-tree pages,
not on the pages a row's long values leave free (they are reused, or dropped by
``VACUUM``). The proxy rewrites a session row and a build's logged context on every call,
and zeroing each freed page was a third of what every call wrote to the WAL.

Opening never writes to a file that is not ours: a file that is not SQLite, or an SQLite
database without ``ctxwarden_migrations`` but with other tables, is refused before WAL
mode or any table is set up.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ctxwarden.core.errors import ConfigError, StoreError
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.migrations import Tx, check_schema, migrate
from ctxwarden.store.sqlite_checkpoint import FALLBACK_PAGES, BackgroundCheckpoint

__all__ = ["SQLiteStore"]

_CACHE_KIB = 64 * 1024
"""Each connection's page cache, at most (filled as pages are read). SQLite's default of
2 MB holds a few sessions: a proxy serving 64 agents at once re-read most pages it
touched (a session row's sticky state, a build's audit) from the file, a system call
each; ~24 fewer reads per proxied call at 64 sessions."""


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(sql, [tuple(r) for r in rows])


class SQLiteStore(SqlStore):
    """A :class:`~ctxwarden.store.SessionStore` in one SQLite file (or ``:memory:``).

    ``migrate_upto`` stops the migrations at a named step (for upgrade tests and tools).
    ``background_checkpoint`` copies the write-ahead log into the file in a thread of its
    own rather than inside the commit that fills it
    (:class:`~ctxwarden.store.sqlite_checkpoint.BackgroundCheckpoint`; a file only):
    ``ctxwarden serve`` sets it, so no request waits for that copy and its syncs.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 30.0,
        migrate_upto: str | None = None,
        background_checkpoint: bool = False,
    ) -> None:
        self.path = str(path)
        self.url = f"sqlite:///{self.path}"
        self.timeout = timeout
        self._memory = self.path == ":memory:"
        self._local = threading.local()
        self._lock = threading.RLock()
        self._open: set[sqlite3.Connection] = set()
        self._shared: sqlite3.Connection | None = None
        self._closed = False
        if background_checkpoint and self._memory:
            raise ConfigError("background_checkpoint needs a database file (:memory: has no log)")
        self._background = background_checkpoint
        self.checkpoint: BackgroundCheckpoint | None = None
        try:
            self._setup(migrate_upto)
            if background_checkpoint:
                self.checkpoint = BackgroundCheckpoint(self.path, timeout=timeout)
        except BaseException:
            self.close()
            raise

    def _utf8_text(self, data: bytes) -> tuple[str, Any]:
        # bound as a blob, cast to TEXT in the database's encoding (UTF-8: ours always
        # is): the same stored text, without decoding a long value to bind it again
        return "CAST(? AS TEXT)", data

    # -- connections ------------------------------------------------------------------------

    def _new_connection(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA secure_delete = FAST")
            conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            if self._background:
                conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_PAGES}")
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc
        with self._lock:
            self._open.add(conn)
        return conn

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"the store for {self.url} is closed")
        if self._memory:
            if self._shared is None:
                self._shared = self._new_connection()
            return self._shared
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is None or getattr(local, "forks", None) != _FORKS[0]:
            conn = self._new_connection()
            local.conn = conn
            local.forks = _FORKS[0]
        return conn

    def connections_in_use(self) -> int:
        """Connections this store holds open (all threads)."""
        with self._lock:
            return len(self._open)

    def release(self) -> None:
        """Close the calling thread's connection (no-op for ``:memory:``)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._memory:
            return
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def close(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint.close()
        with self._lock:
            conns, self._open = list(self._open), set()
            self._closed = True
        for conn in conns:
            conn.close()
        self._shared = None

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions -----------------------------------------------------------------------

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[Tx]:
        with self._lock if self._memory else _NOLOCK:
            conn = self._connection()
            try:
                conn.execute(begin)
                try:
                    yield _SqliteTx(conn)
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                if self.checkpoint is not None and begin == _WRITE:
                    self.checkpoint.committed()
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"SQLite error on {self.path}: {exc}") from exc

    def _read(self) -> Any:
        return self._transaction("BEGIN")

    @contextmanager
    def _read_one(self) -> Iterator[Tx]:
        with self._lock if self._memory else _NOLOCK:
            conn = self._connection()
            try:
                yield _SqliteTx(conn)
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite error on {self.path}: {exc}") from exc

    def _write(self) -> Any:
        return self._transaction(_WRITE)

    # -- opening ----------------------------------------------------------------------------

    def _setup(self, migrate_upto: str | None) -> None:
        conn = self._connection()
        try:
            names = {
                row[0]
                for row in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            }
        except sqlite3.DatabaseError as exc:
            raise self._open_error(exc) from exc
        if names and "ctxwarden_migrations" not in names:
            raise StoreError(
                f"{self.path} is an SQLite database that ctxwarden did not create (tables: "
                f"{', '.join(sorted(names))}); ctxwarden left it untouched — give it its own file"
            )
        if not self._memory:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot switch {self.path} to WAL mode: {exc}") from exc
            if mode is None or str(mode[0]).lower() != "wal":
                raise StoreError(
                    f"{self.path} refused WAL mode (got {mode}); is it on a network disk?"
                )
        migrate(self._write, upto=migrate_upto)
        if migrate_upto is None:
            check_schema(self._columns)

    def _open_error(self, exc: sqlite3.Error) -> StoreError:
        if "not a database" in str(exc):
            return StoreError(
                f"{self.path} is not an SQLite database ({exc}); ctxwarden left it untouched — "
                "point the store at a new file"
            )
        return StoreError(f"cannot open SQLite database {self.path}: {exc}")

    def _columns(self, table: str) -> set[str]:
        with self._read() as tx:
            return {row[1] for row in tx.execute(f"PRAGMA table_info({table})")}


_FORKS = [0]
"""How many forks this process is from its start: a connection made before a fork is
never used after it (SQLite's rule); counted at the fork rather than asking ``getpid``
on every transaction."""
os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))

_WRITE = "BEGIN IMMEDIATE"

_NOLOCK = nullcontext()
"""A file's connections are per thread: nothing to lock (a reusable no-op, not a new
generator per transaction)."""
