"""An open session reuses its last build's ledger memo (speed only): every context equals
the one a session object that has never built (a new replica) gives from the store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

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
