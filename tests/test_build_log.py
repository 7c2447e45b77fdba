"""Every ``Session.build`` logs its audit in the store, bounded per session (R15)."""

from __future__ import annotations

import json

from service_harness import db_url

from ctxwarden import Session
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.session.build_log import context_rows
from ctxwarden.session.session import count_key
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.base import json_text
from ctxwarden.store.service_tables import list_builds, logged_context, record_build
from ctxwarden_bench.proxy import conversation

__all__ = ["db_url"]  # the store fixture: SQLite, and PostgreSQL when configured


def _turns(s: Session, n: int, *, start: int = 0, size: int = 40) -> None:
    for i in range(start, start + n):
        s.append([{"role": "user", "content": f"question {i}: " + "word " * size}])
        s.build(max_input_tokens=300)
        s.append([{"role": "assistant", "content": f"answer {i} ORD-{1000 + i}"}])


def test_each_build_is_logged_with_the_full_history_size(db_url: str) -> None:
    with Session(db_url, "log", model="gpt-4o") as s:
        s.append([{"role": "system", "content": "You help."}])
        _turns(s, 12)
        builds = list_builds(s.store, "default", "log", limit=100)
        assert [b.turn for b in builds] == list(range(1, 13))
        assert all(b.status == "built" and b.model == "gpt-4o" for b in builds)
        counter = TokenCounter.for_model("gpt-4o")
        stored = list(s.store.iter_messages("default", "log"))
        for b in builds:  # every message up to the one the build saw, as stored
            want = sum(m.token_counts[count_key(counter)] for m in stored if m.seq <= b.upto_seq)
            assert b.history_tokens == want
        last = builds[-1]
        assert last.upto_seq == len(s) - 2  # the reply came after the build
        assert last.input_tokens == last.audit["input_tokens"] <= 300 < last.history_tokens
        assert last.audit["actions"], "a history over budget drops something"


def test_the_log_keeps_the_newest_builds_and_contexts_only(db_url: str) -> None:
    with Session(db_url, "bounded") as s:
        s.keep_builds, s.keep_contexts = 5, 2
        _turns(s, 9)
        builds = list_builds(s.store, "default", "bounded", limit=100)
        assert [b.turn for b in builds] == [5, 6, 7, 8, 9]
        assert [b.has_context for b in builds] == [False, False, False, True, True]
        assert logged_context(s.store, "default", "bounded", builds[0].build_id) is None
        rows = logged_context(s.store, "default", "bounded", builds[-1].build_id)
        assert rows is not None and rows[-1]["layer"] == "current"
        assert rows[-1]["message"]["content"].startswith("question 8")


def test_a_first_build_over_an_imported_history_counts_all_of_it(db_url: str) -> None:
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} " * 30}
               for i in range(200)]  # fmt: skip
    with Session.import_(db_url, "imported", history) as s:
        built = s.build(max_input_tokens=400)
        [row] = list_builds(s.store, "default", "imported")
        counter = TokenCounter.for_model(s.model)
        assert row.history_tokens == sum(counter.count_message(m) for m in s.messages())
        assert row.history_tokens > 10 * built.input_tokens


def test_a_build_under_another_model_counts_what_has_no_stored_count(db_url: str) -> None:
    history = [{"role": "user", "content": f"hello number {i}"} for i in range(50)]
    with Session.import_(db_url, "models", history, model="gpt-4o") as s:
        s.build(model="claude-sonnet-4-5", max_input_tokens=200)
        [row] = list_builds(s.store, "default", "models")
        counter = TokenCounter.for_model("claude-sonnet-4-5")
        assert row.history_tokens == sum(counter.count_message(m) for m in s.messages())


def test_a_context_logged_as_runs_reads_back_as_one_logged_before_them(db_url: str) -> None:
    with Session(db_url, "runs", model="gpt-4o") as s:
        s.append(conversation(40))
        built = s.build(max_input_tokens=3_000, build_id="new")
        store = s.store
        assert isinstance(store, SqlStore)
        with store._read() as tx:
            text = tx.execute("SELECT context FROM ctxwarden_build_contexts WHERE build_id = 'new'")
        runs = json.loads(text[0][0])
        assert any(r.get("count", 1) > 1 for r in runs)  # written as runs
        # as written before runs: one row per stored message; and a run of messages no
        # longer stored (read back as their numbers, either way)
        before = [
            {"layer": r["layer"], "seq": r["seq"] + k} if "seq" in r else r
            for r in runs
            for k in range(r.get("count", 1))
        ]
        gone = [{"layer": "window", "seq": 9_998}, {"layer": "window", "seq": 9_999}]
        for build_id, rows in (
            ("before", before),
            ("gone-before", [*before, *gone]),
            ("gone-runs", [*runs, {"layer": "window", "seq": 9_998, "count": 2}]),
        ):
            record_build(store, "default", "runs", build_id=build_id, model="gpt-4o",
                         history_tokens=0, input_tokens=0, audit={}, context=rows)  # fmt: skip
        want = context_rows(built)
        assert logged_context(store, "default", "runs", "new") == want
        assert logged_context(store, "default", "runs", "before") == want
        assert logged_context(store, "default", "runs", "gone-before") == [*want, *gone]
        assert logged_context(store, "default", "runs", "gone-runs") == [*want, *gone]


def test_an_audit_logged_with_its_actions_as_rows_reads_as_one_logged_before(db_url: str) -> None:
    with Session(db_url, "audit", model="gpt-4o") as s:
        s.append(conversation(40))
        built = s.build(max_input_tokens=3_000, build_id="new")
        assert built.audit.actions
        # as logged before the rows: each action an object
        before = json_text(built.audit.to_dict())
        record_build(s.store, "default", "audit", build_id="before", model="gpt-4o",
                     history_tokens=0, input_tokens=0, audit=before)  # fmt: skip
        rows = {b.build_id: b.audit for b in list_builds(s.store, "default", "audit")}
        assert rows["new"] == rows["before"] == json.loads(before)
        assert list(rows["new"]) == list(rows["before"])
