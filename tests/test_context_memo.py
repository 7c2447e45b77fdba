"""The build log's context memo (session/build_log.py, speed only): a context written from
the rows the session's last context shares with it is byte for byte the context written
from nothing, build after build, and a session's logged contexts read back as built."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from ctxwarden import Policy, build_context
from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.session.build_log import ContextMemo, context_rows, context_utf8
from ctxwarden.session.session import Session
from ctxwarden.store import StoredMessage
from ctxwarden.store.base import json_text
from ctxwarden.store.service_tables import delete_session, logged_context
from ctxwarden_bench.proxy import conversation
from ctxwarden_bench.random_histories import random_history


def _stored(history: list[Message]) -> list[StoredMessage]:
    return [StoredMessage(seq, m, {}) for seq, m in enumerate(history)]


@pytest.mark.parametrize("seed", range(12))
def test_a_context_written_from_the_memo_is_the_context_written_from_nothing(
    seed: int,
) -> None:
    """Agent loops over random histories (parallel calls, pins, critical results) with
    budgets that move the window, pins and layers: every build's bytes equal the
    memo-less writing; the memo serves most builds in part."""
    rng = random.Random(seed)
    full = random_history(seed, max_turns=40)
    memo, served = ContextMemo(), 0
    previous = None
    at = min(len(full), 6)
    while at <= len(full):
        history = full[:at]
        budget = rng.choice((400, 900, 2_000, 6_000, 60_000))
        built = build_context(history, "gpt-4o", budget, previous=previous)
        stored = _stored(history)
        last = memo.last
        got = context_utf8(built, stored, memo, "session")
        assert got == context_utf8(built, stored), f"build at {at}"
        assert got == json_text(_as_read(built, stored)).encode()
        served += last is not None and bool(last.messages) and last.messages[0] is built.messages[0]
        previous = built
        at += rng.choice((1, 2, 3))
    assert served > 0


def _as_read(built: object, stored: list[StoredMessage]) -> list[dict[str, object]]:
    """The rows as the memo-less writer lays them out (refs and runs), as parsed JSON."""
    import json

    return json.loads(context_utf8(built, stored))  # type: ignore[arg-type]


def test_the_memo_is_not_used_for_another_session_or_a_slice_with_repeated_ids() -> None:
    history = random_history(3, max_turns=30)
    built = build_context(history, "gpt-4o", 2_000)
    stored = _stored(history)
    memo = ContextMemo()
    context_utf8(built, stored, memo, "a")
    assert memo.last is not None
    # the same objects stored at other numbers (a session deleted and filled again)
    moved = [StoredMessage(s.seq + 100, s.message, {}) for s in stored]
    assert context_utf8(built, moved, memo, "b") == context_utf8(built, moved)
    # two stored messages with one id: which one a message is found as depends on the slice
    twice = [*moved, StoredMessage(999, replace(history[-1], content="other"), {})]
    assert context_utf8(built, twice, memo, "b") == context_utf8(built, twice)
    assert memo.last is None  # (nothing kept from a slice it could not serve)
    assert context_utf8(built, moved, memo, "b") == context_utf8(built, moved)


def test_a_context_that_cannot_be_utf8_is_written_escaped_and_not_kept() -> None:
    history = random_history(5, max_turns=10)
    odd = message_from_openai({"role": "user", "content": "lone \ud800 surrogate"})
    built = build_context([*history, odd], "gpt-4o", 60_000)
    memo = ContextMemo()
    text = context_utf8(built, _stored(history), memo, "s")
    assert text.isascii() and text == json_text(context_rows(built)).encode()
    assert memo.last is None


def test_a_sessions_logged_contexts_read_back_as_built(tmp_path: Path) -> None:
    """Through Session.build (the proxy's build): a 120-message tool-using conversation
    growing a reply and a question at a time, budgets that mask and cut, a pin, and a
    session deleted and filled again: each logged context reads back as the build's rows
    and equals what a session without the memo would write."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    base = [message_from_openai(m) for m in conversation(120)]
    policy = Policy()
    with Session(url, "memo", tenant="t") as s:
        for round_ in range(2):
            s.append(base[:60])
            for turn in range(30):
                more = base[60 + 2 * turn : 62 + 2 * turn]
                if turn == 12:
                    more = [replace(more[0], pinned=True, id=""), *more[1:]]
                s.append(more)
                budget = (3_000, 8_000, 20_000)[turn // 10]
                build_id = f"r{round_}b{turn}"
                built = s.build(max_input_tokens=budget, policy=policy, build_id=build_id)
                read = logged_context(s.store, "t", "memo", build_id)
                assert read == context_rows(built), f"round {round_}, turn {turn}"
                if turn == 0:
                    system = built.messages[0]
                # the pinned system prompt is the session's cached object, build after
                # build (its memos, and so the context memo's shared rows, hold)
                assert built.messages[0] is system and system.role == "system"
                assert s._logged.last is not None and s._logged.last.scope == s.record.created_at
            assert delete_session(s.store, "t", "memo")  # filled again by the next round
            s.store.create_session("t", "memo")


def test_the_state_saved_last_reads_back_as_the_stored_sticky_decodes(tmp_path: Path) -> None:
    """A session's next build takes the state it stored last instead of decoding it
    (speed only): for every build of an agent loop (masks, cuts, a pin, a moving window),
    the state so taken equals the one decoded from the stored row, and a stored row that
    is not the one saved (another process wrote it) is decoded."""
    from ctxwarden.session import rows as session_state

    url = f"sqlite:///{tmp_path / 's.db'}"
    base = [message_from_openai(m) for m in conversation(120)]
    with Session(url, "state", tenant="t") as s:
        s.append(base[:40])
        taken = 0
        for turn in range(40):
            more = base[40 + 2 * turn : 42 + 2 * turn]
            if turn == 7:
                more = [replace(more[0], pinned=True, id=""), *more[1:]]
            s.append(more)
            record = s.record
            window_start = int(record.sticky.get("window_start_seq", 0))
            for seqs in ([*range(record.next_seq)], [0, *range(window_start, record.next_seq)]):
                decoded = session_state.state_for(record.sticky, seqs)
                assert session_state.state_for(record.sticky, seqs, s._saved) == decoded
            taken += s._saved is not None and s._saved.sticky == record.sticky
            s.build(max_input_tokens=2_500 + 400 * (turn % 5))
        assert taken >= 35
        saved = s._saved
        assert saved is not None
        other = {**saved.sticky, "sticky": {}}  # (the masked and cut ids: others)
        seqs = list(range(s.record.next_seq))
        assert session_state.state_for(other, seqs, saved) == session_state.state_for(other, seqs)
