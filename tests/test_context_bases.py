"""A logged context that begins as the session's last context logged whole (its base)
is written as one row naming that build and how many of its messages, then the rest
(session/build_log.py): every such context reads back as built, now and after the log
is trimmed; a base stays while a kept context begins with it; a base another writer
removed, or one that shares too little, has the context logged whole."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from service_harness import db_url

from ctxwarden import Session
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.pipeline.engine import BuiltContext
from ctxwarden.session.build_log import ContextMemo, context_delta, context_rows, context_utf8
from ctxwarden.store import StoredMessage
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.service_tables import list_builds, logged_context
from ctxwarden_bench.proxy import conversation

__all__ = ["db_url"]  # the store fixture: SQLite, and PostgreSQL when configured

_BASE = [message_from_openai(m) for m in conversation(160)]


def _logged(s: Session) -> dict[str, tuple[int, str | None, int]]:
    """Each stored context's build id: its turn, its base and its size in bytes."""
    store = s.store
    assert isinstance(store, SqlStore)
    with store._read() as tx:
        rows = tx.execute(
            "SELECT build_id, turn, base, context FROM ctxwarden_build_contexts "
            "WHERE tenant = ? AND session_id = ?",
            (s.tenant, s.session_id),
        )
    return {r[0]: (int(r[1]), r[2], len(r[3].encode())) for r in rows}


def _loop(s: Session, turns: int, built: dict[str, Any], *, first: int = 60) -> None:
    """An agent loop: the conversation's first messages, then a reply and a question a
    turn, a build each (its rows kept in ``built`` by build id)."""
    s.append(_BASE[:first])
    for turn in range(turns):
        s.append(_BASE[first + 2 * turn : first + 2 + 2 * turn])
        build_id = f"b{turn}"
        done: BuiltContext = s.build(build_id=build_id, max_input_tokens=8_000)
        built[build_id] = context_rows(done)
        assert logged_context(s.store, s.tenant, s.session_id, build_id) == built[build_id]


def test_contexts_logged_from_a_base_read_back_as_built_and_are_small(db_url: str) -> None:
    built: dict[str, Any] = {}
    with Session(db_url, "bases", tenant="t") as s:
        _loop(s, 40, built)
        logged = _logged(s)
        assert set(logged) == set(built)  # (40 builds: all kept)
        for build_id, rows in built.items():  # after every later write, too
            assert logged_context(s.store, "t", "bases", build_id) == rows, build_id
        based = {b for b, (_, base, _) in logged.items() if base is not None}
        assert len(based) >= 20, "most contexts are logged from a base"
        for b in based:
            base = logged[b][1]
            assert base in logged and logged[base][1] is None  # a base is logged whole
        whole = sum(len(context_utf8_of(rows)) for rows in built.values())
        assert sum(size for *_, size in logged.values()) < whole / 3


def context_utf8_of(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps(rows).encode()


def test_a_base_stays_while_a_kept_context_begins_with_it(db_url: str) -> None:
    built: dict[str, Any] = {}
    with Session(db_url, "trimmed", tenant="t") as s:
        s.keep_contexts = 6  # so a base every six contexts
        _loop(s, 40, built)
        logged = _logged(s)
        turns = sorted(turn for turn, _, _ in logged.values())
        newest = turns[-6:]
        assert newest == list(range(35, 41))
        kept = {b for b, (turn, _, _) in logged.items() if turn in newest}
        bases = {logged[b][1] for b in kept} - {None}
        assert set(logged) == kept | bases  # nothing else outlives the bound
        assert all(logged[b][0] > 40 - 6 - 6 for b in bases)  # (a base is at most 5 older)
        for build_id in logged:
            assert logged_context(s.store, "t", "trimmed", build_id) == built[build_id]
        has = {b.build_id for b in list_builds(s.store, "t", "trimmed", limit=100) if b.has_context}
        assert has == set(logged)


def test_a_base_gone_has_the_context_logged_whole(db_url: str) -> None:
    built: dict[str, Any] = {}
    with Session(db_url, "gone", tenant="t") as s:
        _loop(s, 2, built)  # (two builds: a third may compact, and be a base of its own)
        logged = _logged(s)
        assert logged["b0"][1] is None and logged["b1"][1] == "b0"
        store = s.store
        assert isinstance(store, SqlStore)
        with store._write() as tx:  # as another writer's trimming would
            tx.execute("DELETE FROM ctxwarden_build_contexts WHERE build_id = 'b0'")
        assert logged_context(store, "t", "gone", "b1") is None  # (its base is gone)
        s.append(_BASE[64:66])
        done = s.build(build_id="b2", max_input_tokens=8_000)
        assert _logged(s)["b2"][1] is None  # logged whole: the memo's base was gone
        assert logged_context(store, "t", "gone", "b2") == context_rows(done)
        s.append(_BASE[66:68])
        done = s.build(build_id="b3", max_input_tokens=8_000)
        assert _logged(s)["b3"][1] == "b2"  # the new base
        assert logged_context(store, "t", "gone", "b3") == context_rows(done)


def test_one_context_kept_is_always_logged_whole(db_url: str) -> None:
    built: dict[str, Any] = {}
    with Session(db_url, "one", tenant="t") as s:
        s.keep_contexts = 1
        _loop(s, 5, built)
        assert {b: base for b, (_, base, _) in _logged(s).items()} == {"b4": None}


def test_a_context_sharing_less_than_half_its_messages_is_logged_whole() -> None:
    from ctxwarden import build_context as build

    history = _BASE[:80]
    stored = [StoredMessage(seq, m, {}) for seq, m in enumerate(history)]
    first = build(history, "gpt-4o", 60_000)
    memo = ContextMemo()
    context_utf8(first, stored, memo, "s")
    assert memo.last is not None
    memo.base = ("b0", memo.last)
    same = context_delta(first, stored, memo, "s")
    assert same is not None and json.loads(same[0])[0] == {
        "base": "b0",
        "count": len(first.messages),
    }
    # the same messages, other objects past the system prompt: nothing else shared
    copies = [history[0], *(replace(m, meta={**m.meta}) for m in history[1:])]
    other = build(copies, "gpt-4o", 60_000)
    assert context_delta(other, stored, memo, "s") is None
    assert context_delta(first, stored, memo, "another session") is None
    memo.since = 24  # the base's 25th context is logged whole
    assert context_delta(first, stored, memo, "s") is None
