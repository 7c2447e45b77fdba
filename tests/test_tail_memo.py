"""An open session's tail memo (session/tail_memo.py, speed only): the slice it gives is the
one the store gives a session that has never read, also when every stored message fits
and the next turn's do not (the memo then walks again instead of extending its tail)."""

from __future__ import annotations

from pathlib import Path

from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.session.session import Session
from ctxwarden.session.tail_memo import TailMemo, with_tail
from ctxwarden.store import StoredMessage
from ctxwarden_bench.proxy import conversation


def _ids(rows: list[StoredMessage]) -> list[int]:
    return [r.seq for r in rows]


def test_the_memo_gives_the_stores_slice_while_all_fits_and_after(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    base = [message_from_openai(m) for m in conversation(80)]
    kept = Session(url, "tail", tenant="t")
    kept.append(base[:8])
    whole = 0
    for turn, at in enumerate(range(8, len(base), 4)):
        kept.append(base[at : at + 4])
        budget = 60_000 if turn < 8 else 2_500 + 900 * (turn % 4)  # all fits, then not
        ours = kept.context_messages(budget)
        fresh = Session(url, "tail", tenant="t")
        theirs = fresh.context_messages(budget)
        fresh.close()
        assert _ids(ours) == _ids(theirs), f"turn {turn}"
        assert [r.message for r in ours] == [r.message for r in theirs]
        whole += kept._tails._last_whole is not None
    assert whole >= 4  # the memo knew every row fit, and extended without walking
    kept.close()


def test_a_tail_that_no_longer_fits_is_walked_again() -> None:
    memo = TailMemo()
    rows = [StoredMessage(i, Message.user(f"m{i}", id=f"m{i}"), {"k": 10}) for i in range(5)]
    scope = ("scope",)
    memo.remember(scope, 5, rows)
    first = memo.tail(scope, 5, -1, 100, "k", lambda m: 0)
    assert first is not None and _ids(first) == [0, 1, 2, 3, 4]
    memo.remember(scope, 5, first)
    assert memo._last_whole == 50
    for i in (5, 6):
        memo.appended(i, Message.user(f"m{i}", id=f"m{i}"), {"k": 30})
    cut = memo.tail(scope, 7, -1, 100, "k", lambda m: 0)  # 110 tokens: the oldest goes
    assert cut is not None and _ids(cut) == [1, 2, 3, 4, 5, 6]
    assert memo._whole is None  # not every row: the next tail walks


def test_with_tail_merges_by_seq() -> None:
    rows = [StoredMessage(i, Message.user(f"m{i}", id=f"m{i}"), {}) for i in range(6)]
    tail = rows[3:]
    assert with_tail({}, tail) == tail and with_tail({}, tail) is not tail
    assert _ids(with_tail({0: rows[0], 4: rows[4]}, tail)) == [0, 3, 4, 5]


def test_with_tail_is_the_merge_by_seq_for_any_pins_and_tail() -> None:
    """The shortcut (pins before or inside a tail without gaps) gives what merging by seq
    gives, the tail's row winning, for pins before, inside, after and in a gappy tail."""
    import random

    rng = random.Random(3)
    rows = {i: StoredMessage(i, Message.user(f"m{i}", id=f"m{i}"), {}) for i in range(40)}
    pinned = {i: StoredMessage(i, Message.user(f"p{i}", id=f"p{i}"), {}) for i in range(40)}
    shortcuts = 0
    for _ in range(400):
        lo = rng.randrange(0, 30)
        seqs = list(range(lo, rng.randrange(lo, 40)))
        if rng.random() < 0.3 and len(seqs) > 2:
            seqs.pop(rng.randrange(1, len(seqs) - 1))  # a gap
        tail = [rows[s] for s in seqs]
        merged = {s: pinned[s] for s in rng.sample(range(40), rng.randrange(0, 5))}
        both = {**merged, **{m.seq: m for m in tail}}
        expected = [both[s] for s in sorted(both)]
        got = with_tail(merged, tail)
        assert got == expected and [r.message.id for r in got] == [r.message.id for r in expected]
        shortcuts += bool(tail and merged and max(merged) <= tail[-1].seq)
    assert shortcuts > 50


def test_pinned_messages_are_the_stores_read_followed_through_own_appends(
    tmp_path: Path,
) -> None:
    """The pinned messages a build reads: read once, then the same list as the store's
    while the session appends them itself (no read); read again when another writer
    appended (the memo cannot know what it wrote) or the session was made again."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    s = Session(url, "pins", tenant="t")
    reads: list[int] = []
    real = s.store.pinned

    def counted(tenant: str, session_id: str) -> list[StoredMessage]:
        reads.append(1)
        return real(tenant, session_id)

    s.store.pinned = counted  # type: ignore[method-assign]

    def same_as_store() -> bool:
        record = s.record
        given = s._tails.pinned(record.created_at, record.next_seq, lambda: [])
        return [(r.seq, r.message) for r in given] == [
            (r.seq, r.message) for r in real("t", "pins")
        ]

    s.append([Message.system("You help."), Message.user("a")])
    s.build()
    s.append([Message.user("keep this", pinned=True), Message.assistant("ok")])
    s.build()
    s.append([Message.user("b"), Message.system("Also this.")])
    s.build()
    assert len(reads) == 1 and same_as_store()
    with Session(url, "pins", tenant="t") as other:  # another writer
        other.append([Message.user("theirs", pinned=True)])
    s.build()
    assert len(reads) == 2 and same_as_store()
    assert "theirs" in [m.text for m in s.build().messages]
    s.close()


def test_the_pinned_memo_reads_on_a_gap_or_another_session() -> None:
    memo = TailMemo()
    pin = StoredMessage(0, Message.system("s", id="m0"), {})
    read: list[list[StoredMessage]] = [[pin]]
    assert memo.pinned(1.0, 1, lambda: read[-1]) == [pin]
    memo.appended(1, Message.user("x", id="m1", pinned=True), {})
    assert [r.seq for r in memo.pinned(1.0, 2, lambda: [])] == [0, 1]  # its own append
    assert memo.pinned(1.0, 4, lambda: read[-1]) == [pin]  # seqs 2-3 not its own: read
    assert memo.pinned(2.0, 4, lambda: []) == []  # another session under the same id
