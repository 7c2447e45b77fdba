"""How a proxied call ends is one write: the reply, the usage, the spend, the build's
status and the head move together or not at all; built contexts live in their own rows."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import pytest
from service_harness import db_url

from ctxwarden import Session, Usage
from ctxwarden.core.errors import StoreError, VersionConflict
from ctxwarden.core.messages import Message
from ctxwarden.store import open_store
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.service_tables import (
    CallEnd,
    Head,
    add_tenant,
    delete_session,
    end_call,
    get_head,
    latest_builds,
    list_builds,
    logged_context,
    put_head,
    record_build,
    tenant_by_key_hash,
)

__all__ = ["db_url"]  # the store fixture: SQLite, and PostgreSQL when configured


def _forwarded(url: str) -> tuple[Session, Head, str]:
    """A session with one built, forwarded call and the head the proxy left for it."""
    s = Session(url, "chat", tenant="acme")
    add_tenant(s.store, "acme", key_hash="h" * 64, key_prefix="cw-x")
    s.append([{"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}])
    s.build(build_id="b1", status="forwarded")
    head = Head("acme", "chat", "chat", 0, 2, hashlib.sha256(b"two").hexdigest(), 20)
    assert put_head(s.store, head, expected=None)
    return s, head, "b1"


def _state(s: Session) -> tuple[Any, ...]:
    record = s.record
    [build] = list_builds(s.store, "acme", "chat")
    spent = tenant_by_key_hash(s.store, "h" * 64)
    assert spent is not None
    head = get_head(s.store, "acme", "chat")
    texts = [m.text for m in s.messages()]
    return texts, record.total_usage, record.dollars, spent.spent_usd, build.status, head


def _end(head: Head) -> CallEnd:
    moved = replace(head, count=3, chain=hashlib.sha256(b"three").hexdigest(), history_tokens=27)
    usage = Usage(input_tokens=120, output_tokens=7)
    return CallEnd(
        "acme", "chat", "b1", "complete", usage=usage, model="gpt-4o", dollars=0.25,
        head=moved, expected=head,
    )  # fmt: skip


def test_the_reply_and_the_call_end_are_stored_together(db_url: str) -> None:
    s, head, _ = _forwarded(db_url)
    end = _end(head)
    with s:
        s.append([Message.assistant("hello")], expect_next=2,
                 also=lambda tx, _: end_call(s.store, end, tx))  # fmt: skip
        texts, usage, dollars, spent, status, now = _state(s)
        assert texts == ["You help.", "hi", "hello"]
        assert (usage.input_tokens, usage.output_tokens, usage.calls) == (120, 7, 1)
        assert dollars == pytest.approx(0.25) and spent == pytest.approx(0.25)
        assert status == "complete" and now == end.head


def test_a_failure_mid_write_leaves_the_session_as_before(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, head, _ = _forwarded(db_url)
    with s:
        before = _state(s)
        real = SqlStore.record_usage_in

        def fails_after_writing(self: SqlStore, *a: Any, **kw: Any) -> Any:
            real(self, *a, **kw)  # the usage is written, then the store fails
            raise StoreError("disk full")

        monkeypatch.setattr(SqlStore, "record_usage_in", fails_after_writing)
        end = _end(head)
        with pytest.raises(StoreError, match="disk full"):
            s.append([Message.assistant("hello")], expect_next=2,
                     also=lambda tx, _: end_call(s.store, end, tx))  # fmt: skip
        monkeypatch.undo()
        assert _state(s) == before  # no reply, usage, spend, status or head move
        assert s.append([Message.assistant("again")], expect_next=2) == [2]  # still at 2


def test_a_reply_that_lost_the_race_still_closes_the_build(db_url: str) -> None:
    s, head, _ = _forwarded(db_url)
    with s:
        s.append([Message.assistant("another replica's reply")])
        end = _end(head)
        with pytest.raises(VersionConflict):
            s.append([Message.assistant("hello")], expect_next=2,
                     also=lambda tx, _: end_call(s.store, end, tx))  # fmt: skip
        assert end_call(s.store, replace(end, status="reply_not_stored", head=None))
        texts, usage, _, spent, status, now = _state(s)
        assert texts[-1] == "another replica's reply" and "hello" not in texts
        assert usage.calls == 1 and spent == pytest.approx(0.25)
        assert status == "reply_not_stored" and now == head


def test_contexts_are_rows_of_their_own_and_the_migration_moves_old_ones(
    tmp_path: Any,
) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with open_store(url, migrate_upto="006_build_log") as old:  # type: ignore[call-arg]
        assert isinstance(old, SqlStore)
        old.create_session("t", "s")
        with old._write() as tx:  # a build row with its context, as 006 wrote it
            tx.execute(
                "INSERT INTO ctxwarden_builds (tenant, session_id, build_id, created_at, model, "
                "history_tokens, input_tokens, status, audit, turn, upto_seq, context) VALUES "
                "('t', 's', 'old', 1.0, 'gpt-4o', 5, 5, 'built', '{}', 1, 0, ?)",
                ('[{"layer": "current", "message": {"role": "user", "content": "hi"}}]',),
            )
    with Session(url, "s", tenant="t") as s:
        [row] = list_builds(s.store, "t", "s")
        assert row.has_context
        moved = logged_context(s.store, "t", "s", "old")
        assert moved == [{"layer": "current", "message": {"role": "user", "content": "hi"}}]
        s.append([{"role": "user", "content": "next"}])
        s.build(build_id="new", status="forwarded")
        assert end_call(s.store, CallEnd("t", "s", "new", "complete"))
        rows = {b.build_id: b for b in list_builds(s.store, "t", "s")}
        assert rows["new"].status == "complete" and rows["new"].has_context
        context = logged_context(s.store, "t", "s", "new")
        assert context is not None and context[-1]["message"]["content"] == "next"


def _syncer(store: Any) -> tuple[Any, Any]:
    """The proxy's sync over ``store`` for client session ``chat`` of tenant ``acme``:
    ``open_session(id)`` (one Session per id, as the hub keeps them) and ``sync(dicts)``."""
    from ctxwarden.formats import message_from_openai
    from ctxwarden.service.history import sync_history, wire_key

    sessions: dict[str, Session] = {}

    def open_session(sid: str) -> Session:
        return sessions.setdefault(sid, Session(store, sid, tenant="acme"))

    def sync(messages: list[dict[str, Any]]) -> Any:
        return sync_history(
            store, open_session, "acme", "chat", [wire_key(m) for m in messages],
            lambda start: [message_from_openai(m) for m in messages[start:]], lambda m: 1,
        )  # fmt: skip

    return open_session, sync


def test_new_messages_and_the_head_move_are_one_write(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxwarden.service import history

    sent = [{"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}]
    with open_store(db_url) as store:
        open_session, sync = _syncer(store)

        first = sync(sent)
        assert first.head.count == 2 and not first.forked
        more = [*sent, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
        real = history.put_head
        monkeypatch.setattr(history, "put_head", lambda *a, **kw: False)  # always loses the race
        with pytest.raises(VersionConflict):
            sync(more)
        assert [m.text for m in open_session("chat").messages()] == ["You help.", "hi"]
        monkeypatch.setattr(history, "put_head", real)
        again = sync(more)  # nothing half-written: the same session, no branch
        assert again.session.session_id == "chat" and not again.forked
        assert [m.text for m in again.session.messages()] == ["You help.", "hi", "hello", "x"]


def test_a_build_log_write_that_fails_keeps_the_previous_sticky_state(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session(db_url, "sticky", tenant="acme") as s:
        s.append([{"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}])
        s.build(status="forwarded")
        before = dict(s.record.sticky)
        s.append([{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}])
        real = SqlStore.save_sticky_in

        def fails_after_writing(self: SqlStore, *a: Any, **kw: Any) -> None:
            real(self, *a, **kw)  # the sticky state is written, then the store fails
            raise StoreError("disk full")

        monkeypatch.setattr(SqlStore, "save_sticky_in", fails_after_writing)
        with pytest.raises(StoreError, match="disk full"):
            s.build(status="forwarded")
        monkeypatch.undo()
        assert dict(s.record.sticky) == before  # the log row and the sticky state: both or none
        assert len(list_builds(s.store, "acme", "sticky")) == 1
        s.build(status="forwarded")
        assert dict(s.record.sticky)["last_seq"] == 3
        assert len(list_builds(s.store, "acme", "sticky")) == 2


def _rows(s: Session, query: str) -> list[tuple[Any, ...]]:
    """``query``'s rows for the session (its one parameter)."""
    assert isinstance(s.store, SqlStore)
    with s.store._read() as tx:
        return tx.execute(query, (s.session_id,))


def _build_rows(s: Session) -> list[tuple[Any, ...]]:
    return _rows(
        s,
        "SELECT build_id, status, audit FROM ctxwarden_builds WHERE session_id = ? ORDER BY turn",
    )


def _ends(s: Session) -> list[tuple[Any, ...]]:
    return _rows(
        s,
        "SELECT build_id, status FROM ctxwarden_build_ends WHERE session_id = ? ORDER BY build_id",
    )


def test_a_call_end_leaves_the_build_row_as_written(db_url: str) -> None:
    s, head, _ = _forwarded(db_url)
    with s:
        written = _build_rows(s)
        assert [r[1] for r in written] == ["forwarded"]
        assert end_call(s.store, _end(head))
        assert _build_rows(s) == written  # its audit is not written again
        assert _ends(s) == [("b1", "complete")]
        assert _state(s)[4] == "complete"
        assert latest_builds(s.store, "acme")["chat"].status == "complete"
        # ended again (as after a lost race): the newest end is the status
        assert end_call(s.store, replace(_end(head), status="reply_not_stored", head=None))
        assert _ends(s) == [("b1", "reply_not_stored")] and _state(s)[4] == "reply_not_stored"
        # a build no longer logged gets no end
        assert end_call(s.store, replace(_end(head), build_id="gone", head=None))
        assert _ends(s) == [("b1", "reply_not_stored")]


def test_the_ends_of_builds_go_with_them(db_url: str) -> None:
    with Session(db_url, "bounded", tenant="acme") as s:
        s.keep_builds = 3
        for i in range(5):
            s.append([{"role": "user", "content": f"question {i}"}])
            s.build(build_id=f"b{i}", status="forwarded")
            if i != 3:  # b3 is a call that never ended
                assert end_call(s.store, CallEnd("acme", "bounded", f"b{i}", "complete"))
            s.append([{"role": "assistant", "content": f"answer {i}"}])
        builds = list_builds(s.store, "acme", "bounded")
        assert [(b.build_id, b.status) for b in builds] == [
            ("b2", "complete"), ("b3", "forwarded"), ("b4", "complete"),
        ]  # fmt: skip
        assert _ends(s) == [("b2", "complete"), ("b4", "complete")]
        assert delete_session(s.store, "acme", "bounded")
        assert _ends(s) == []


_TIME_INDEX = "SELECT 1 FROM sqlite_master WHERE name = 'ctxwarden_builds_time'"


def test_a_build_logged_before_the_ends_table_ends_and_reads_as_before(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with open_store(url, migrate_upto="007_build_contexts") as store:  # type: ignore[call-arg]
        assert isinstance(store, SqlStore)
        with Session(store, "s", tenant="t") as old:
            old.append([{"role": "user", "content": "hi"}])
        for build_id in ("done", "open"):  # as 007 logged a forwarded call's build
            record_build(
                store, "t", "s", build_id=build_id, model="gpt-4o", history_tokens=1,
                input_tokens=1, audit={}, status="forwarded",
            )  # fmt: skip
        with store._write() as tx:  # as 007 ended a call: in its build row
            tx.execute("UPDATE ctxwarden_builds SET status = 'complete' WHERE build_id = 'done'")
            assert tx.execute(_TIME_INDEX)
    with Session(url, "s", tenant="t") as s:  # migrated on open
        assert isinstance(s.store, SqlStore)
        with s.store._read() as tx:
            assert not tx.execute(_TIME_INDEX)  # (009: no read used it)
        rows = {b.build_id: b.status for b in list_builds(s.store, "t", "s")}
        assert rows == {"done": "complete", "open": "forwarded"}
        assert end_call(s.store, CallEnd("t", "s", "open", "partial"))
        rows = {b.build_id: b.status for b in list_builds(s.store, "t", "s")}
        assert rows == {"done": "complete", "open": "partial"}


@pytest.mark.parametrize("new", [True, False])
def test_a_store_moved_without_the_head_starts_a_branch(db_url: str, new: bool) -> None:
    """Another writer appended to the session (the session API, say): the proxy's next
    call does not write after it but branches, whether it brings new messages (the
    append's own check refuses them, the next attempt reads the store) or none (read
    at once)."""
    from ctxwarden.service.history import BRANCH_MARK

    sent = [{"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}]
    with open_store(db_url) as store:
        open_session, sync = _syncer(store)

        assert not sync(sent).forked
        open_session("chat").build()  # (the proxy's session knows where it ends)
        with Session(store, "chat", tenant="acme") as other:
            other.append([{"role": "assistant", "content": "from elsewhere"}])
        more = [*sent, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
        synced = sync(more if new else sent)
        assert synced.forked and synced.session.session_id == "chat" + BRANCH_MARK + "1"
        texts = [m["content"] for m in (more if new else sent)]
        assert [m.text for m in synced.session.messages()] == texts
        assert [m.text for m in open_session("chat").messages()][-1] == "from elsewhere"
