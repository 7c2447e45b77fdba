"""Copying an SQLite file's write-ahead log into the database, in a thread of its own.

In WAL mode a commit appends pages to the ``-wal`` file; from time to time those pages are
copied back into the database file (a *checkpoint*), which SQLite does by default inside
the commit that takes the log past 1,000 pages. That commit then also reads and writes
every page the log holds and syncs both files to disk: on this project's benchmark
machine 5–12 ms, once every ~35 proxied calls, during which the server's event loop
(where SQLite work runs by default) serves nobody — every other client waits too.

:class:`BackgroundCheckpoint` does that copy in a thread with its own connection instead,
after every ``commits`` write commits (and within ``seconds`` of any commit), with
``PRAGMA wal_checkpoint(PASSIVE)``: it never blocks a writer or a reader, and the
statement runs without Python's GIL, so the loop goes on meanwhile. The store's own
connections keep a checkpoint of their own only past :data:`FALLBACK_PAGES` (a thread
that falls behind or fails never lets the log grow without bound). What is committed and
what survives a crash do not change: a checkpoint only moves committed pages from one
file to the other, and ``synchronous = NORMAL`` syncs both as SQLite's own does.
"""

from __future__ import annotations

import sqlite3
import threading

__all__ = ["FALLBACK_PAGES", "BackgroundCheckpoint"]

FALLBACK_PAGES = 10_000
"""``wal_autocheckpoint`` for the store's connections while the thread runs: ten times
SQLite's default, reached only if the thread falls behind (or has stopped)."""


class BackgroundCheckpoint:
    """Checkpoints ``path``'s log in a daemon thread (see the module docstring).

    :meth:`committed` is called after each write commit, from any thread; it only counts
    (a count lost to a race between threads delays a checkpoint until the next commit or
    ``seconds``). ``runs``, ``failures`` and ``error`` (the last failure, or ``None``) say
    what the thread did; ``log_pages`` and ``copied_pages``, the log's pages and how many
    of them were in the file after the last checkpoint (SQLite's own two counts, since
    the log last started over: a page is counted again by each checkpoint until then)."""

    def __init__(
        self, path: str, *, timeout: float, commits: int = 100, seconds: float = 1.0
    ) -> None:
        if commits < 1 or seconds <= 0:
            raise ValueError(f"commits must be >= 1 and seconds > 0, got {commits}, {seconds}")
        self.path, self.timeout = path, timeout
        self.commits, self.seconds = commits, seconds
        self.runs = self.failures = self.log_pages = self.copied_pages = 0
        self.error: str | None = None
        self._pending = 0
        self._stopping = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ctxwarden checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """One more write commit (its pages are in the log)."""
        self._pending += 1
        if self._pending >= self.commits:
            self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread after the checkpoint it may be running (waits up to its timeout)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.timeout)

    def _loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while not self._stopping:
                self._wake.wait(self.seconds)
                self._wake.clear()
                if self._stopping or not self._pending:
                    continue
                self._pending = 0
                try:
                    if conn is None:
                        conn = self._connect()
                    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the next one starts on a new connection
                    self.error = f"{type(exc).__name__}: {exc}"
                    self.failures += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    continue
                self.runs += 1
                if row is not None and int(row[1]) >= 0:  # (-1, -1) when busy
                    self.log_pages, self.copied_pages = int(row[1]), int(row[2])
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        conn.execute("PRAGMA synchronous = NORMAL")  # as the writers: syncs log, then file
        return conn
