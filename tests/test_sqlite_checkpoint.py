"""An SQLite file's log copied into the database in a thread of its own
(:mod:`ctxwarden.store.sqlite_checkpoint`), which ``ctxwarden serve`` uses: no commit
copies it any more, the thread does, and nothing committed is lost either way."""

from __future__ import annotations

import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.hub import Hub
from ctxwarden.service.metrics import Metrics
from ctxwarden.store import SQLiteStore
from ctxwarden.store import sqlite as sqlite_module
from ctxwarden.store.sqlite_checkpoint import BackgroundCheckpoint

_PAGE = 4096


def _fill(store: SQLiteStore, session: str, calls: int, size: int) -> None:
    """``calls`` commits of one message of ``size`` characters each."""
    store.create_session("t", session)
    for i in range(calls):
        message = Message(role="user", content=f"{i} " + "x" * size, id=f"u{i}")
        store.append("t", session, [message], [{}])


def _rows_in_file_alone(db: Path, tmp: Path) -> int:
    """Messages the database file holds without its log (a copy of the file alone).

    A copy taken while a checkpoint writes the file can be torn (pages of before and
    after): such a copy reads as -1, not a count, and the caller reads again."""
    alone = tmp / "alone.db"
    shutil.copyfile(db, alone)
    conn = sqlite3.connect(alone)
    try:
        (count,) = conn.execute("SELECT COUNT(*) FROM ctxwarden_messages").fetchone()
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
        count = 0  # not even the tables yet
    except sqlite3.DatabaseError:  # "malformed": a torn copy
        count = -1
    finally:
        conn.close()
    alone.unlink()
    return int(count)


class _Idle(BackgroundCheckpoint):
    """A checkpoint thread that never gets to run."""

    def __init__(self, path: str, *, timeout: float, **_: Any) -> None:
        super().__init__(path, timeout=timeout, commits=10**9, seconds=3600.0)


def test_commits_leave_the_log_to_the_thread(tmp_path: Path, monkeypatch: Any) -> None:
    """Past SQLite's default 1,000 pages of log, a commit of the store does not copy it
    into the file (the thread would): the file keeps its size, the log holds it all."""
    monkeypatch.setattr(sqlite_module, "BackgroundCheckpoint", _Idle)
    db = tmp_path / "s.db"
    store = SQLiteStore(db, background_checkpoint=True)
    empty = db.stat().st_size
    _fill(store, "s", 300, 4 * _PAGE)  # ~1,500 pages of log
    assert Path(f"{db}-wal").stat().st_size > 1_200 * _PAGE
    assert db.stat().st_size == empty
    assert _rows_in_file_alone(db, tmp_path) == 0
    store.close()  # the last connection's close copies the log (SQLite's own rule)
    reopened = SQLiteStore(db)
    assert reopened.count("t", "s") == 300
    reopened.close()


def test_without_it_a_commit_copies_the_log(tmp_path: Path) -> None:
    """The library's default is SQLite's own: the commit past 1,000 pages copies them."""
    db = tmp_path / "s.db"
    store = SQLiteStore(db)
    assert store.checkpoint is None
    _fill(store, "s", 300, 4 * _PAGE)
    assert _rows_in_file_alone(db, tmp_path) > 0
    store.close()


def test_the_thread_copies_every_commit_into_the_file(tmp_path: Path) -> None:
    """After 150 commits the thread has run (woken by the 100th, then by its timer), and
    the database file alone — no log — holds every message; after closing and opening
    again, so does the store."""
    db = tmp_path / "s.db"
    store = SQLiteStore(db, background_checkpoint=True)
    assert store.checkpoint is not None and store.checkpoint.running
    _fill(store, "s", 150, 200)
    deadline = time.monotonic() + 10
    rows = _rows_in_file_alone(db, tmp_path)
    while rows != 150 and time.monotonic() < deadline:
        time.sleep(0.05)
        rows = _rows_in_file_alone(db, tmp_path)
    assert rows == 150
    assert store.checkpoint.runs >= 1 and store.checkpoint.copied_pages > 0
    assert store.checkpoint.error is None
    store.close()
    assert not store.checkpoint.running
    reopened = SQLiteStore(db)
    assert [m.message.id for m in reopened.range("t", "s", 0, 150)] == [f"u{i}" for i in range(150)]
    reopened.close()


def test_a_failed_checkpoint_is_recorded_and_the_thread_goes_on(tmp_path: Path) -> None:
    """A checkpoint that fails (here: the file is not a database) is recorded in
    ``error``; the next one starts on a new connection and runs."""
    db = tmp_path / "s.db"
    db.write_bytes(b"not a database " * 100)
    thread = BackgroundCheckpoint(str(db), timeout=1.0, commits=1, seconds=0.05)
    try:
        thread.committed()
        deadline = time.monotonic() + 10
        while thread.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert thread.error is not None and "not a database" in thread.error
        assert thread.runs == 0
        good = tmp_path / "good.db"
        SQLiteStore(good).close()
        good.replace(db)
        thread.committed()
        deadline = time.monotonic() + 10
        while thread.runs == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert thread.runs == 1 and thread.running
    finally:
        thread.close()
    assert not thread.running


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a database file"):
        SQLiteStore(":memory:", background_checkpoint=True)
    with pytest.raises(ValueError, match="commits must be >= 1"):
        BackgroundCheckpoint(str(tmp_path / "x.db"), timeout=1.0, commits=0)


def test_the_server_checkpoints_its_sqlite_file_in_the_background(tmp_path: Path) -> None:
    """A hub on an SQLite file runs the thread and exports what it did on ``/metrics``;
    one in memory has neither, nor one whose config turns it off."""

    def hub(db: str, **config: Any) -> Hub:
        return Hub(ServiceConfig(db=db, upstream="http://127.0.0.1:9/v1", **config), Metrics())

    off = hub(f"sqlite:///{tmp_path / 'off.db'}", background_checkpoint=False)
    assert isinstance(off.store, SQLiteStore) and off.store.checkpoint is None
    assert "ctxwarden_sqlite" not in off.metrics.render()[0].decode()
    off.close()
    on_file = hub(f"sqlite:///{tmp_path / 'hub.db'}")
    in_memory = hub("sqlite:///:memory:")
    try:
        store = on_file.store
        assert isinstance(store, SQLiteStore) and store.checkpoint is not None
        assert isinstance(in_memory.store, SQLiteStore) and in_memory.store.checkpoint is None
        _fill(store, "s", 120, 200)
        deadline = time.monotonic() + 10
        while store.checkpoint.runs == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        text = on_file.metrics.render()[0].decode()
        runs = re.search(r'ctxwarden_sqlite_checkpoints_total\{outcome="copied"\} (\S+)', text)
        pages = re.search(r"^ctxwarden_sqlite_log_pages (\S+)", text, re.M)
        copied = re.search(r"^ctxwarden_sqlite_log_copied_pages (\S+)", text, re.M)
        assert runs and float(runs.group(1)) >= 1, text
        assert pages and copied and 0 < float(copied.group(1)) <= float(pages.group(1))
        assert 'ctxwarden_sqlite_checkpoints_total{outcome="failed"} 0.0' in text
        assert "ctxwarden_sqlite" not in in_memory.metrics.render()[0].decode()
    finally:
        on_file.close()
        in_memory.close()
    assert not store.checkpoint.running
