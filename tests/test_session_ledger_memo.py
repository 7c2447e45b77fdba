"""An open session reuses its last build's ledger and window memos (speed only): every
context equals the one a session object that has never built (a new replica) gives from
the store."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.pipeline.policy import Policy
from ctxwarden.session.session import Session
from ctxwarden_bench.proxy import conversation


def test_a_kept_ledger_memo_changes_no_context(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    base = [message_from_openai(m) for m in conversation(120)]
    policy = Policy()
    kept = Session(url, "memo", tenant="t")
    kept.append(base[:40])
    reused = 0
    for turn, at in enumerate(range(40, len(base), 4)):
        kept.append(base[at : at + 4])
        budget = 3_000 if turn % 3 else 6_000  # the window moves, the ledger grows
        # the store as a replica sees it, copied before this turn's build: no memo; it
        # must build the very same context and state from the same stored decisions
        copy = tmp_path / f"replica-{turn}.db"
        with sqlite3.connect(tmp_path / "s.db") as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
        memo_before = kept._ledger_memo
        ours = kept.build(model="gpt-4o", policy=policy, max_input_tokens=budget)
        reused += memo_before is not None
        fresh = Session(f"sqlite:///{copy}", "memo", tenant="t")
        theirs = fresh.build(model="gpt-4o", policy=policy, max_input_tokens=budget)
        fresh.close()
        assert ours.to_openai() == theirs.to_openai(), f"turn {turn}"
        assert ours.state.to_dict() == theirs.state.to_dict(), f"turn {turn}"
    assert reused >= 10


def test_a_long_turn_keeps_its_window_memo_and_changes_no_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coding agent's run (one request, then its steps): the session's slice is the
    whole run, and the window step's scan for pinned messages before the window is kept
    with the ledger's memo, so a build scans only what left the window since; the
    contexts are a new replica's, which scans it all."""
    from itertools import islice

    import ctxwarden.steps.window as window
    from ctxwarden_bench.traffic import one_prompt_traffic

    run = list(islice(one_prompt_traffic(3), 700))
    for at in (12, 240):  # results the user pinned: the window keeps them as it moves on
        at = next(i for i in range(at, len(run)) if run[i].role == "tool")
        run[at] = replace(run[at], pinned=True)
    scanned = 0
    real = window.is_pinned

    def counted(message: Message) -> bool:
        nonlocal scanned
        scanned += 1
        return real(message)

    monkeypatch.setattr(window, "is_pinned", counted)
    url = f"sqlite:///{tmp_path / 's.db'}"
    kept = Session(url, "run", tenant="t")
    kept.append(run[:500])
    kept.build(model="gpt-4o", max_input_tokens=2_000)
    for turn, at in enumerate(range(500, len(run), 25)):
        kept.append(run[at : at + 25])
        copy = tmp_path / f"replica-{turn}.db"  # (the store before this build)
        with sqlite3.connect(tmp_path / "s.db") as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
        scanned = 0
        ours = kept.build(model="gpt-4o", max_input_tokens=2_000)
        assert scanned <= 150, f"turn {turn}: the window step scanned {scanned} messages"
        fresh = Session(f"sqlite:///{copy}", "run", tenant="t")
        scanned = 0
        theirs = fresh.build(model="gpt-4o", max_input_tokens=2_000)
        fresh.close()
        assert scanned > 400  # (a replica scans the run: the memo is what spared it)
        assert ours.to_openai() == theirs.to_openai(), f"turn {turn}"
        assert ours.state.to_dict() == theirs.state.to_dict(), f"turn {turn}"
        assert sum(m.pinned for m in ours.messages) == 2  # (both pins sent, far behind)
    kept.close()


def test_two_open_sessions_taking_turns_build_what_one_builds(tmp_path: Path) -> None:
    """Two replicas of one session, each with the memos of its own last build (two calls
    old), take turns; a request comes between them. Each build must be the one a single
    open session makes (a memo of an older build than the stored state must not hide the
    new request)."""
    from test_long_turn import two_requests

    run = two_requests()
    url, alone = f"sqlite:///{tmp_path / 'pair.db'}", f"sqlite:///{tmp_path / 'one.db'}"
    pair = [Session(url, "run", tenant="t"), Session(url, "run", tenant="t")]
    single = Session(alone, "run", tenant="t")
    pair[0].append(run[:60])  # (one store: the other replica reads it)
    single.append(run[:60])
    for call, at in enumerate(range(60, len(run), 2)):
        replica = pair[call % 2]
        replica.append(run[at : at + 2])
        single.append(run[at : at + 2])
        ours = replica.build(model="gpt-4o", max_input_tokens=1_500)
        theirs = single.build(model="gpt-4o", max_input_tokens=1_500)
        assert ours.to_openai() == theirs.to_openai(), f"call {call} (history {at + 2})"
    assert any(m.get("content") == "Now also find order 99." for m in ours.to_openai())
    for s in (*pair, single):
        s.close()
