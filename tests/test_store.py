"""The session store on both backends: one suite, SQLite always, PostgreSQL when
CTXWARDEN_TEST_POSTGRES holds a DSN (each module run gets its own schema, dropped after)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.core.errors import ConfigError, MissingDependencyError, StoreError, VersionConflict
from ctxwarden.core.messages import Message, TextPart, ToolCall
from ctxwarden.core.registry.usage import Usage
from ctxwarden.pipeline.policy import Policy
from ctxwarden.store import MIGRATIONS, SessionStore, SQLiteStore, open_store
from ctxwarden.store.base import encode_message

PG_DSN = os.environ.get("CTXWARDEN_TEST_POSTGRES")
PG_SKIP = "set CTXWARDEN_TEST_POSTGRES to a PostgreSQL DSN to run the PostgreSQL store tests"
ENC = "o200k_base"


def pg_url(schema: str) -> str:
    assert PG_DSN
    return f"{PG_DSN}{'&' if '?' in PG_DSN else '?'}schema={schema}"


def drop_schema(schema: str) -> None:
    import psycopg

    assert PG_DSN
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="module")
def pg_module_url() -> Iterator[str]:
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    schema = f"ctxw_test_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_module_url"))


@pytest.fixture
def store(url: str) -> Iterator[SessionStore]:
    s = open_store(url)
    yield s
    s.close()


@pytest.fixture
def sid(store: SessionStore) -> str:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    store.create_session("t", session_id)
    return session_id


def msgs(n: int, start: int = 0) -> list[Message]:
    return [
        Message.user(f"message {i}") if i % 2 == 0 else Message.assistant(f"reply {i}")
        for i in range(start, start + n)
    ]


def counts(n: int, size: int = 10) -> list[dict[str, int]]:
    return [{ENC: size}] * n


# -- messages ------------------------------------------------------------------------------


def test_append_allocates_dense_sequence_numbers_and_keeps_order(
    store: SessionStore, sid: str
) -> None:
    assert store.append("t", sid, msgs(3), counts(3)) == [0, 1, 2]
    assert store.append("t", sid, msgs(2, 3), counts(2)) == [3, 4]
    assert store.count("t", sid) == 5
    assert [m.message.text for m in store.iter_messages("t", sid, batch=2)] == [
        "message 0",
        "reply 1",
        "message 2",
        "reply 3",
        "message 4",
    ]
    assert [m.seq for m in store.range("t", sid, 1, 3)] == [1, 2]


def test_round_trip_keeps_content_parts_tool_calls_and_our_metadata(
    store: SessionStore, sid: str
) -> None:
    original = [
        Message.system("be brief"),
        Message.user(
            (TextPart("look"), TextPart("here")),
            id="u1",
            pinned=True,
            priority="high",
            meta={"turn": 1},
            created_at=1700000000.5,
        ),
        Message.assistant(None, (ToolCall("c1", "lookup", '{"q": "ABC123"}'),), id="a1"),
        Message.tool('{"status": "ok"}', "c1", name="lookup", id="t1"),
    ]
    store.append("t", sid, original, counts(4))
    back = [m.message for m in store.iter_messages("t", sid)]
    assert back[1:] == original[1:]
    assert back[0].id == "m0" and back[0].text == "be brief"  # content-derived id -> m<seq>
    assert back[3].kind == "json"


def test_messages_without_explicit_ids_get_unique_position_ids(
    store: SessionStore, sid: str
) -> None:
    store.append("t", sid, [Message.user("ok"), Message.user("ok")], counts(2))
    store.append("t", sid, [Message.user("ok", id="mine")], counts(1))
    assert [m.message.id for m in store.iter_messages("t", sid)] == ["m0", "m1", "mine"]


def test_tail_returns_the_newest_messages_that_fit_oldest_first(
    store: SessionStore, sid: str
) -> None:
    store.append("t", sid, msgs(100), counts(100, size=10))
    tail = store.tail("t", sid, 95, ENC)
    assert [m.seq for m in tail] == list(range(91, 100))
    assert [m.seq for m in store.tail("t", sid, 5, ENC)] == [99]  # min_messages=1
    assert store.tail("t", sid, 5, ENC, min_messages=0) == []
    # walks back across several chunks (32, 64, ...) and stops at after_seq
    assert [m.seq for m in store.tail("t", sid, 10_000, ENC, after_seq=9)] == list(range(10, 100))


def test_tail_uses_stored_counts_and_counts_other_encodings_on_demand(
    store: SessionStore, sid: str
) -> None:
    store.append("t", sid, msgs(4), [{ENC: 1}, {ENC: 1}, {ENC: 50}, {ENC: 1}])
    assert [m.seq for m in store.tail("t", sid, 10, ENC)] == [3]  # seq 2 (50 tokens) stops it
    assert [m.seq for m in store.tail("t", sid, 10, "cl100k_base", count=lambda m: 2)] == [
        0,
        1,
        2,
        3,
    ]
    with pytest.raises(StoreError, match="no token count for 'cl100k_base'"):
        store.tail("t", sid, 10, "cl100k_base")


def test_pinned_returns_pinned_and_system_messages_in_order(store: SessionStore, sid: str) -> None:
    store.append(
        "t", sid, [Message.system("sys"), *msgs(3), Message.user("keep", pinned=True)], counts(5)
    )
    assert [m.seq for m in store.pinned("t", sid)] == [0, 4]


def test_append_checks_its_arguments_and_the_session(store: SessionStore, sid: str) -> None:
    with pytest.raises(ValueError, match="one token_counts"):
        store.append("t", sid, msgs(2), counts(1))
    with pytest.raises(StoreError, match="no session 'nope'"):
        store.append("t", "nope", msgs(1), counts(1))
    assert store.count("t", sid) == 0


# -- sessions, summary, sticky, usage --------------------------------------------------------


def test_sessions_are_isolated_by_tenant(store: SessionStore) -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    store.create_session("a", name)
    store.create_session("b", name)
    store.append("a", name, msgs(2), counts(2))
    assert store.count("a", name) == 2 and store.count("b", name) == 0
    assert name in [s.session_id for s in store.list_sessions("b")]
    assert store.create_session("a", name).next_seq == 2  # idempotent


def test_summary_write_is_optimistic(store: SessionStore, sid: str) -> None:
    store.append("t", sid, msgs(10), counts(10))
    batch = store.read_for_summary("t", sid, keep_recent=4)
    assert [m.seq for m in batch.messages] == list(range(6)) and batch.up_to_seq == 5
    written = store.write_summary(
        "t", sid, expected_version=0, summary="S1", facts={"size": "L"}, covered_up_to_seq=5
    )
    assert (written.version, written.summary_upto, written.facts) == (1, 5, {"size": "L"})
    with pytest.raises(VersionConflict, match="expected 0"):
        store.write_summary(
            "t", sid, expected_version=0, summary="stale", facts={}, covered_up_to_seq=9
        )
    after = store.get_session("t", sid)
    assert after is not None and (after.summary, after.version, after.summary_upto) == ("S1", 1, 5)
    assert [m.seq for m in store.read_for_summary("t", sid).messages] == [6, 7, 8, 9]


def test_sticky_and_usage_are_kept(store: SessionStore, sid: str) -> None:
    store.save_sticky("t", sid, {"sticky": {"m3": "masked"}, "window_start": 4})
    store.record_usage("t", sid, Usage(100, 10), model="gpt-4o", dollars=0.5)
    rec = store.record_usage(
        "t", sid, Usage(50, 5, cached_input_tokens=20), model="gpt-4o", dollars=0.25
    )
    rec = store.record_usage("t", sid, Usage(7, 1), model="claude-haiku-4-5")
    assert rec.sticky == {"sticky": {"m3": "masked"}, "window_start": 4}
    assert rec.usage["gpt-4o"] == Usage(150, 15, cached_input_tokens=20, calls=2)
    assert rec.total_usage.input_tokens == 157 and rec.total_usage.calls == 3
    assert rec.dollars == pytest.approx(0.75)


def test_ledger_checkpoint_only_moves_forward_with_the_sticky_write(
    store: SessionStore, sid: str
) -> None:
    assert store.load_ledger("t", sid) == (-1, None)
    store.save_sticky("t", sid, {"last_seq": 9}, ledger=(9, '{"covers": 9}'))
    store.save_sticky("t", sid, {"last_seq": 12}, ledger=(5, '{"covers": 5}'))  # behind: kept
    assert store.load_ledger("t", sid) == (9, '{"covers": 9}')
    rec = store.get_session("t", sid)
    assert rec is not None and rec.sticky == {"last_seq": 12}  # the sticky part still wins
    store.save_sticky("t", sid, {}, ledger=(9, '{"covers": "9 again"}'))  # equal: replaces
    store.save_sticky("t", sid, {})
    assert store.load_ledger("t", sid) == (9, '{"covers": "9 again"}')


def test_unpinned_between_reads_a_range_in_order_without_pinned_messages(
    store: SessionStore, sid: str
) -> None:
    given = [Message.system("sys"), *msgs(6), Message.user("keep", pinned=True), *msgs(4, 6)]
    store.append("t", sid, given, counts(len(given)))
    got = store.unpinned_between("t", sid, 0, 9)
    assert [seq for seq, _ in got] == [1, 2, 3, 4, 5, 6, 8]
    assert [m.text for _, m in got][:2] == ["message 0", "reply 1"]
    assert [seq for seq, _ in store.unpinned_between("t", sid, 2, 11, limit=3)] == [3, 4, 5]
    cached = Message.user("from the cache")
    assert store.unpinned_between("t", sid, 3, 5, cache={4: cached}) == [(4, cached)]


def test_a_checkpoint_far_behind_is_seeded_from_the_look_back_only(
    store: SessionStore, sid: str
) -> None:
    from ctxwarden.store.ledger_checkpoint import LedgerCheckpoint

    given = [Message.user(f"order ORD{i:05d} is placed") for i in range(60)]
    given[57] = Message.user("order ORD00057 is placed", pinned=True)  # in the context
    store.append("t", sid, given, counts(len(given)))
    near = LedgerCheckpoint().advance(store, "t", sid, 40, {3}, backfill=40)  # 40 behind: read
    assert (near.since, near.upto) == (0, 39) and "ORD00003" not in near.ledger.values()
    assert near.ledger.values()[:2] == ["ORD00000", "ORD00001"]
    far = near.advance(store, "t", sid, 60, (), backfill=5)  # 20 behind: the last 5 only
    assert (far.since, far.upto, far.saved) == (55, 59, -1)
    seeded = [f"ORD{i:05d}" for i in (55, 56, 58, 59)]
    assert far.ledger.values() == [*near.ledger.values(), *seeded]
    assert near.advance(store, "t", sid, 40, ()) is near  # nothing new: the same checkpoint
    assert far.advance(store, "t", sid, 62, ()).since == 55  # a normal step keeps since
    with pytest.raises(ValueError, match="backfill must be >= 0"):
        near.advance(store, "t", sid, 60, (), backfill=-1)


def test_a_checkpoint_round_trips_its_coverage_and_names_damage() -> None:
    import json

    from ctxwarden.memory.entities import extract_entities
    from ctxwarden.memory.entity_ledger import EntityLedger
    from ctxwarden.store.ledger_checkpoint import LedgerCheckpoint

    ledger = EntityLedger().add(extract_entities(Message.user("booking ZFA04Y")))
    upto, text = LedgerCheckpoint(90, ledger, since=40).encode()
    back = LedgerCheckpoint.decode(upto, text)
    assert (back.upto, back.since, back.saved) == (90, 40, 90) and back.ledger == ledger
    as_003 = json.dumps(ledger.to_dict())  # stored before coverage was: read from 0
    assert LedgerCheckpoint.decode(90, as_003).since == 0
    assert LedgerCheckpoint.decode(-1, None) == LedgerCheckpoint()
    for bad in ("not json", "[]", json.dumps({**ledger.to_dict(), "since": 92})):
        with pytest.raises(StoreError, match="stored entity ledger cannot be read back"):
            LedgerCheckpoint.decode(90, bad)


def test_an_entity_ledger_survives_the_json_round_trip_exactly() -> None:
    import json

    from ctxwarden.memory.entities import extract_entities
    from ctxwarden.memory.entity_ledger import EntityLedger

    texts = [
        "Reservation ZFA04Y for mia_li_3668@example.com on 2024-05-20, total $1,240.50.",
        '{"order_id": "#W2378156", "items": [{"sku": "A-17", "price": 19.99}]}',
        "Reservation ZFA04Y again, now with Anna Kowalska in Kraków.",
    ]
    ledger = EntityLedger(header="Values:")
    for text in texts:
        ledger = ledger.add(extract_entities(Message.user(text)))
    back = EntityLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert back == ledger and back.seq == ledger.seq and back.header == "Values:"
    more = extract_entities(Message.user("Refund 99 EUR to ZFA04Y and NEW123"))
    assert back.add(more).to_dict() == ledger.add(more).to_dict()  # the index is rebuilt
    for bad in ({"entries": [["only a value"]], "seq": 1}, {"seq": 1}, [], {"entries": 7}):
        with pytest.raises(ValueError, match="not a stored entity ledger"):
            EntityLedger.from_dict(bad)


# -- opening, migrations, foreign databases ---------------------------------------------------


def test_open_store_chooses_the_backend_by_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown store URL"):
        open_store("mysql://x")
    mem = open_store("sqlite:///:memory:")
    assert isinstance(mem, SessionStore) and isinstance(mem, SQLiteStore)
    mem.create_session("t", "s")
    mem.append("t", "s", msgs(1), counts(1))
    mem.release()  # must not drop an in-memory database
    assert mem.count("t", "s") == 1
    mem.close()


def test_postgres_backend_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(MissingDependencyError, match=r"ctxwarden\[postgres\]"):
        open_store("postgresql://postgres@127.0.0.1:1/none")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_text_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    before = _digest(path)
    with pytest.raises(StoreError, match="is not an SQLite database"):
        open_store(f"sqlite:///{path}")
    assert _digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_sqlite_zeroes_deleted_rows_without_extra_writes(tmp_path: Path) -> None:
    from ctxwarden.store.service_tables import delete_session

    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        assert store._connection().execute("PRAGMA secure_delete").fetchone() == (2,)  # FAST
        store.create_session("t", "gone")
        store.append("t", "gone", [Message.user("marker-4f1c2a short text")], [{}])
        assert delete_session(store, "t", "gone")
        store._connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert b"marker-4f1c2a" not in path.read_bytes()  # zeroed in its b-tree page


def test_sqlite_connections_keep_many_sessions_pages_in_memory(tmp_path: Path) -> None:
    """A proxy serving dozens of sessions reads its pages from memory, not the file:
    every thread's connection caches up to 64 MB (SQLite's default is 2 MB)."""
    import threading

    with SQLiteStore(tmp_path / "s.db") as store:
        sizes = [store._connection().execute("PRAGMA cache_size").fetchone()]
        worker = threading.Thread(
            target=lambda: sizes.append(store._connection().execute("PRAGMA cache_size").fetchone())
        )
        worker.start()
        worker.join()
    assert sizes == [(-65536,), (-65536,)]  # negative: KiB


def test_a_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO messages (body) VALUES ('hello')")
    conn.close()
    before = _digest(path)
    with pytest.raises(StoreError, match=r"did not create \(tables: messages\)"):
        open_store(f"sqlite:///{path}")
    assert _digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def _sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master").fetchall()
    conn.close()
    return {r[0] for r in rows}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a new file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    schema = f"ctxw_mig_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)


def _applied(store: SessionStore) -> list[str]:
    with store._read() as tx:  # type: ignore[attr-defined]
        return [r[0] for r in tx.execute("SELECT name FROM ctxwarden_migrations ORDER BY name")]


def test_migrations_from_an_empty_database(fresh_url: str) -> None:
    with open_store(fresh_url) as store:  # type: ignore[attr-defined]
        assert _applied(store) == [m.name for m in MIGRATIONS]
    with open_store(fresh_url) as store:  # reopening applies nothing twice
        assert _applied(store) == [m.name for m in MIGRATIONS]


def test_migrations_upgrade_a_database_created_at_the_first_step(fresh_url: str) -> None:
    with open_store(fresh_url, migrate_upto="001_initial") as old:  # type: ignore[attr-defined]
        assert _applied(old) == ["001_initial"]
        with old._write() as tx:  # rows as version 001 wrote them
            tx.execute(
                "INSERT INTO ctxwarden_sessions (tenant, session_id, summary, next_seq, "
                "created_at, updated_at) VALUES ('t', 'old', 'S0', 1, 1.0, 1.0)"
            )
            tx.execute(
                "INSERT INTO ctxwarden_messages (tenant, session_id, seq, message, role, "
                "pinned, token_counts, created_at) VALUES ('t', 'old', 0, ?, 'user', 1, "
                "'{\"o200k_base\": 5}', 1.0)",
                ('{"role": "user", "content": "from v1", "ctxwarden": {"id": "m0"}}',),
            )
    with open_store(fresh_url) as store:  # type: ignore[attr-defined]
        assert _applied(store) == [m.name for m in MIGRATIONS]
        rec = store.get_session("t", "old")
        assert rec is not None and rec.summary == "S0" and rec.total_usage.calls == 0
        assert [m.message.text for m in store.pinned("t", "old")] == ["from v1"]
        assert store.append("t", "old", msgs(1), counts(1)) == [1]


def test_migrations_upgrade_a_database_from_the_previous_step(fresh_url: str) -> None:
    from ctxwarden.session.session import Session

    previous = MIGRATIONS[-2].name
    with open_store(fresh_url, migrate_upto=previous) as old:  # type: ignore[attr-defined]
        assert _applied(old) == [m.name for m in MIGRATIONS[:-1]]
        with old._write() as tx:  # a session with a summary, as the previous version wrote it
            tx.execute(
                "INSERT INTO ctxwarden_sessions (tenant, session_id, summary, summary_upto, "
                "version, next_seq, sticky, usage, created_at, updated_at) VALUES ('t', 'old', "
                "'S0', 9, 1, 41, '{\"last_seq\": 40, \"window_start_seq\": 30}', '{}', 1.0, 1.0)"
            )
            tx.executemany(
                "INSERT INTO ctxwarden_messages (tenant, session_id, seq, message, role, pinned, "
                "token_counts, created_at) VALUES ('t', 'old', ?, ?, ?, ?, ?, 1.0)",
                [
                    (
                        seq,
                        encode_message(replace(m, id=f"m{seq}")),
                        m.role,
                        int(seq == 0),
                        '{"o200k_base": 8}',
                    )
                    for seq, m in enumerate([Message.system("sys"), *msgs(40)])
                ],
            )
    with open_store(fresh_url) as store:  # type: ignore[attr-defined]
        assert _applied(store) == [m.name for m in MIGRATIONS]
        rec = store.get_session("t", "old")
        assert rec is not None and rec.summary == "S0" and rec.summary_levels == {}
        assert store.load_ledger("t", "old") == (-1, None)
        # recall off: a chat-shaped session's build otherwise reads the recall's look-back
        # (here all 40 messages) and the ledger has nothing before it to catch up on
        with Session(store, "old", tenant="t", policy=Policy(recall=None)) as s:
            assert s.summary_state.summaries == ("S0",)  # the old summary is level one
            built = s.build(max_input_tokens=200)
            assert "message 10" not in [m.text for m in built.messages]  # summarised
            upto, text = store.load_ledger("t", "old")
            # caught up once, to where the build's read starts: the messages the summary
            # does not cover are read whole (the session path), their values the build's own
            assert text is not None and upto >= 9


def test_a_database_from_a_newer_version_is_refused(fresh_url: str) -> None:
    with open_store(fresh_url) as store, store._write() as tx:  # type: ignore[attr-defined]
        tx.execute("INSERT INTO ctxwarden_migrations (name, applied_at) VALUES ('999_future', 0)")
    with pytest.raises(StoreError, match=r"newer ctxwarden.*999_future"):
        open_store(fresh_url)


def test_a_missing_table_is_named(fresh_url: str) -> None:
    with open_store(fresh_url) as store, store._write() as tx:  # type: ignore[attr-defined]
        tx.execute("DROP TABLE ctxwarden_messages")
    with pytest.raises(StoreError, match="table ctxwarden_messages is missing"):
        open_store(fresh_url)


@pytest.mark.postgres
def test_postgres_refuses_tables_it_did_not_create() -> None:
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    import psycopg

    schema = f"ctxw_foreign_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".ctxwarden_sessions (x int)')
    try:
        with pytest.raises(StoreError, match="did not create"):
            open_store(pg_url(schema))
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchall()
        assert rows == [("ctxwarden_sessions",)]
    finally:
        drop_schema(schema)


@pytest.mark.postgres
def test_postgres_reads_of_one_statement_open_no_transaction(
    pg_module_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxied call's single-statement reads (its session's row and end, the pinned
    messages, the tenant by key, the head) go to the server as that statement alone,
    without the BEGIN, SET TRANSACTION and COMMIT round trips around it; what they
    read is the same, and a server error is still a StoreError."""
    import psycopg

    from ctxwarden.store.service_tables import get_head, tenant_by_key_hash

    sent: list[str] = []
    exec_command = psycopg.Connection._exec_command

    def recorded(self: Any, command: Any, result: Any = 0) -> Any:
        sent.append(bytes(command).decode() if isinstance(command, bytes) else str(command))
        return exec_command(self, command, result)

    with open_store(pg_module_url) as store:
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        store.create_session("t", session_id)
        store.append("t", session_id, [Message.system("rules", pinned=True), *msgs(2)], counts(3))
        monkeypatch.setattr(psycopg.Connection, "_exec_command", recorded)
        session = store.get_session("t", session_id)
        assert session is not None and store.position("t", session_id) == (
            3,
            session.created_at,
        )
        assert [m.message.text for m in store.pinned("t", session_id)] == ["rules"]
        assert [m.seq for m in store.range("t", session_id, 1, 3)] == [1, 2]
        assert tenant_by_key_hash(store, "no such key") is None
        assert get_head(store, "t", "no such client") is None
        assert sent == [] and store.connections_in_use() == 0  # type: ignore[attr-defined]
        store.create_session("t", f"s-{uuid.uuid4().hex[:8]}")  # a write still is one
        assert sent[0].startswith("BEGIN") and sent[-1] == "COMMIT"
        schema = pg_module_url.rsplit("schema=", 1)[1]
        with psycopg.connect(PG_DSN or "", autocommit=True) as conn:  # a table gone
            conn.execute(f'ALTER TABLE "{schema}".ctxwarden_sessions RENAME TO gone')
        try:
            with pytest.raises(StoreError, match=r"PostgreSQL error: .*ctxwarden_sessions"):
                store.get_session("t", session_id)
            assert store.connections_in_use() == 0  # type: ignore[attr-defined]
        finally:
            with psycopg.connect(PG_DSN or "", autocommit=True) as conn:
                conn.execute(f'ALTER TABLE "{schema}".gone RENAME TO ctxwarden_sessions')
        assert store.get_session("t", session_id) == session  # the pool's connection is fine


def test_sqlite_build_reads_use_the_primary_key_not_a_scan(tmp_path: Path) -> None:
    path = tmp_path / "plan.db"
    open_store(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    plans = [
        " ".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
        for sql, params in [
            (
                "SELECT seq FROM ctxwarden_messages WHERE tenant = ? AND session_id = ? "
                "AND seq > ? AND seq < ? ORDER BY seq DESC LIMIT 32",
                ("t", "s", -1, 10**9),
            ),
            (
                "SELECT seq FROM ctxwarden_messages WHERE tenant = ? AND session_id = ? "
                "AND pinned = 1 ORDER BY seq",
                ("t", "s"),
            ),
        ]
    ]
    conn.close()
    assert all("SEARCH" in p and "SCAN" not in p for p in plans), plans
    assert "ctxwarden_messages_pinned" in plans[1]


def test_position_and_count_are_the_rows_next_seq_and_creation_time(
    store: SessionStore, sid: str
) -> None:
    from ctxwarden.store._sql import SqlStore

    assert isinstance(store, SqlStore)
    assert store.position("t", "nobody") is None and store.count("t", "nobody") == 0
    store.append("t", sid, [Message.user("a"), Message.user("b")], [{}, {}])
    record = store.get_session("t", sid)
    assert record is not None
    assert (
        store.position("t", sid) == (2, record.created_at) == (record.next_seq, record.created_at)
    )
    assert store.count("t", sid) == 2
