"""Session on both backends: append/export/import, usage, builds that read only a slice,
the three-step summarisation cycle, concurrency across processes, and SIGKILL mid-cycle."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.errors import ConfigError, InvalidMessageError, StoreError, SummarizationError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.memory.entities import extract_entities
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.memory.facts import Facts
from ctxwarden.memory.summaries import SummaryResult, SummaryTrigger
from ctxwarden.pipeline.engine import build_context
from ctxwarden.pipeline.policy import Policy
from ctxwarden.session.session import Session
from ctxwarden.steps.layers import SUMMARY_HEADING
from ctxwarden.store import SessionStore, open_store

PG_DSN = os.environ.get("CTXWARDEN_TEST_POSTGRES")
PG_SKIP = "set CTXWARDEN_TEST_POSTGRES to a PostgreSQL DSN to run the PostgreSQL session tests"
EVERY_40 = SummaryTrigger(max_messages=40, keep_recent=10, fill_ratio=None)


def _with_param(url: str, key: str, value: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{key}={value}"


@pytest.fixture(scope="module")
def pg_module_url() -> Iterator[str]:
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    import psycopg

    schema = f"ctxw_sess_{uuid.uuid4().hex[:10]}"
    yield _with_param(PG_DSN, "schema", schema)
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sessions.db'}"
    return str(request.getfixturevalue("pg_module_url"))


@pytest.fixture
def sid() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def chat(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"user turn {i}: order ABC{i:04d} please"}
        if i % 2 == 0
        else {"role": "assistant", "content": f"assistant turn {i}: order ABC{i - 1:04d} is placed"}
        for i in range(start, start + n)
    ]


class Scripted:
    """A summariser that answers from a script and records what it was given."""

    def __init__(self, during: Any = None) -> None:
        self.calls: list[tuple[int, str | None]] = []
        self.merged: list[list[str]] = []
        self.during = during

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        self.calls.append((len(messages), previous))
        if self.during is not None:
            await self.during(len(self.calls))
        text = f"summary {len(self.calls)} of {messages[0].id}..{messages[-1].id}"
        return SummaryResult(text, Usage(100, 20))

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        self.merged.append(list(summaries))
        if self.during is not None:
            await self.during(-len(self.merged))  # negative: the n-th meta-summary call
        return SummaryResult(f"meta {len(self.merged)} <- " + " + ".join(summaries), Usage(50, 10))


class ScriptedFacts:
    async def extract(
        self, messages: Sequence[Message], existing: Facts, schema: Any = None
    ) -> Facts:
        return existing.merge({"last_order": messages[-1].text.split()[-3]}, source=messages[-1].id)


# -- messages in and out ---------------------------------------------------------------------


def test_export_returns_every_message_as_given(url: str, sid: str) -> None:
    given = [{"role": "system", "content": "be brief"}, *chat(5)]
    given.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "find", "arguments": "{}"}}
            ],
        }
    )
    given.append({"role": "tool", "tool_call_id": "c1", "content": "found"})
    with Session(url, sid) as s:
        s.append(given[:3])
        s.append([message_from_openai(d) for d in given[3:]])
        assert s.export() == given and len(s) == len(given)
    with Session(url, sid) as again:  # reopened: same session, nothing lost
        assert again.export() == given
        assert [m["ctxwarden"]["id"] for m in again.export(with_meta=True)][:2] == ["m0", "m1"]


def test_one_invalid_message_stores_nothing_from_that_call(url: str, sid: str) -> None:
    with Session(url, sid) as s:
        s.append(chat(2))
        with pytest.raises(InvalidMessageError, match=r"message 1.*tool_call_id"):
            s.append([{"role": "user", "content": "fine"}, {"role": "tool", "content": "x"}])
        with pytest.raises(InvalidMessageError, match=r"message 0.*role"):
            s.append([{"role": "wizard", "content": "x"}])
        assert len(s) == 2 and s.export() == chat(2)


def test_import_creates_a_session_and_refuses_a_non_empty_one(url: str, sid: str) -> None:
    with Session.import_(url, sid, chat(7)) as s:
        assert s.export() == chat(7)
    with pytest.raises(StoreError, match="already has messages"):
        Session.import_(url, sid, chat(1))


def test_usage_and_cost_accumulate_per_model(url: str, sid: str) -> None:
    from ctxwarden.core.registry.cost import estimate_cost

    with Session(url, sid, model="gpt-4o") as s:
        s.record_usage(Usage(1000, 100))
        total = s.record_usage(Usage(500, 50, cached_input_tokens=200), model="gpt-4o-mini")
        s.record_usage(Usage(10, 1), model="my-local-model")  # unknown: tokens only
        assert total == Usage(1500, 150, cached_input_tokens=200, calls=2)
        assert s.usage.calls == 3
        assert s.cost == pytest.approx(
            estimate_cost(Usage(1000, 100), "gpt-4o")
            + estimate_cost(Usage(500, 50, cached_input_tokens=200), "gpt-4o-mini")
        )


# -- build ---------------------------------------------------------------------------------


def test_build_reads_a_slice_but_builds_what_the_full_history_builds(url: str, sid: str) -> None:
    history = [{"role": "system", "content": "You are a shop assistant."}, *chat(400)]
    with Session(url, sid) as s:
        s.append(history)
        read = s.context_messages(600)
        assert len(read) < 200  # a slice bounded by the budget, not the 401 messages
        built = s.build(max_input_tokens=600)
        full = build_context(history, max_input_tokens=600)
        # the same context, entity ledger included (the stored ledger covers the rest)
        assert built.to_openai() == full.to_openai()
        assert "ledger" in built.layers.values()
        # the next turns: sticky state carried in sequence numbers, same as the full build
        for turn in range(6):
            s.append(chat(2, 400 + 2 * turn))
            history += chat(2, 400 + 2 * turn)
            built = s.build(max_input_tokens=600)
            full = build_context(history, max_input_tokens=600, previous=full)
            assert built.to_openai() == full.to_openai()
            assert built.audit.prefix_shared_tokens == full.audit.prefix_shared_tokens


def test_a_state_stored_before_the_packed_prefix_builds_the_same(url: str, sid: str) -> None:
    history = [{"role": "system", "content": "You are a shop assistant."}, *chat(300)]
    with Session(url, sid) as s:
        s.append(history)
        first = s.build(max_input_tokens=600)
        stored = dict(s.record.sticky)
        assert isinstance(stored["prefix"], str)  # packed
        # as version 2 stored it: the context's fingerprints whole, in a list
        old = {**stored, "version": 2, "prefix": [m.fingerprint for m in first.messages]}
        s.append(chat(2, 300))
        builds = []
        for sticky in (stored, old, stored):
            s.store.save_sticky(s.tenant, sid, sticky)
            with Session(url, sid) as fresh:  # reads the stored state, no memo
                builds.append(fresh.build(max_input_tokens=600))
        new_way, old_way, _ = builds
        assert old_way.to_openai() == new_way.to_openai() and old_way.audit == new_way.audit
        assert old_way.state == new_way.state
        assert 0 < new_way.audit.prefix_shared_tokens == builds[2].audit.prefix_shared_tokens


PLANTED = {
    3: "My reservation is ZFA04Y, paid with credit_card_7815826.",
    6: "The refund of $1,240.50 goes to account DE44500105175407324931.",
    9: "Please also note order #W2378156 from 2024-05-20.",
}


LEDGER_PATH = Policy(recall=None)
"""The ledger tests' policy: the default's relevance recall makes a chat-shaped session
read the ``lookback`` messages before its slice (a chat of ``filler`` never asks beyond
them), which the ledger then need not read; an agent loop's session reads only its slice,
and these tests follow the ledger's reads on that path. The chat path with the ledger:
``test_a_chat_that_turns_into_an_agent_loop_keeps_every_value``."""


def filler(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Chat without values, except the ones planted early (PLANTED, by position)."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        role = "user" if i % 2 == 0 else "assistant"
        text = PLANTED.get(i, f"{role} says: thanks, that sounds fine, please go on with it")
        out.append({"role": role, "content": text})
    return out


def _context_text(built: Any) -> str:
    return "\n".join(m.text for m in built.messages)


def _recording(store: SessionStore) -> list[tuple[int, int]]:
    """Record the (after, before) ranges the ledger reads from ``store``."""
    ranges: list[tuple[int, int]] = []
    inner = store.unpinned_between

    def unpinned_between(
        tenant: str, session_id: str, after: int, before: int, **kw: Any
    ) -> list[tuple[int, Message]]:
        ranges.append((after, before))
        return inner(tenant, session_id, after, before, **kw)

    store.unpinned_between = unpinned_between  # type: ignore[method-assign]
    return ranges


def test_early_ids_reach_the_context_through_the_stored_ledger(url: str, sid: str) -> None:
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(400)]
    planted = ["ZFA04Y", "credit_card_7815826", "DE44500105175407324931", "W2378156"]
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
        ranges = _recording(s.store)
        built = s.build(max_input_tokens=500)
        full = build_context(history, max_input_tokens=500, policy=LEDGER_PATH)
        sliced = build_context([m.message for m in s.context_messages(500)], max_input_tokens=500)
        for value in planted:
            assert value in _context_text(full) and value in _context_text(built)
            assert value not in _context_text(sliced)  # the slice alone has lost them
        assert built.to_openai() == full.to_openai()
        assert ranges[0][0] == -1  # the first build reads what lies before its slice, once
        del ranges[:]
        for turn in range(20):  # the agent loop: each build reads what left the slice
            s.append(filler(2, 400 + 2 * turn))
            history += filler(2, 400 + 2 * turn)
            built = s.build(max_input_tokens=500)
            full = build_context(history, max_input_tokens=500, policy=LEDGER_PATH, previous=full)
            assert built.to_openai() == full.to_openai()
            assert all(value in _context_text(built) for value in planted)
        # the first warm build moves the slice from the cold tail to the window start;
        # after that, each read spans only the messages the window moved past
        assert ranges[0][1] - ranges[0][0] <= len(s.context_messages(500)), ranges
        assert all(before - after <= 20 for after, before in ranges[1:]), ranges
        # consecutive, never overlapping: no message is read (or added) twice
        assert all(b[0] == a[1] - 1 for a, b in itertools.pairwise(ranges)), ranges


def _expected_ledger(s: Session, upto: int, skip: set[int], since: int = 0) -> EntityLedger:
    """The ledger of every message from ``since`` to ``upto``, built from scratch from
    the export."""
    ledger = EntityLedger()
    for seq, message in enumerate(s.messages()):
        if seq > upto:
            break
        if seq >= since and not (message.pinned or message.role == "system" or seq in skip):
            ledger = ledger.add(extract_entities(message))
    return ledger


def _stored_ledger(s: Session) -> tuple[int, EntityLedger | None]:
    upto, text = s.store.load_ledger(s.tenant, s.session_id)
    return upto, (EntityLedger.from_dict(json.loads(text)) if text is not None else None)


def test_the_stored_ledger_counts_each_message_once_and_skips_pinned(url: str, sid: str) -> None:
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(300)]
    history[5] = {
        "role": "user",
        "content": "Keep booking PIN777X in mind.",
        "ctxwarden": {"pinned": True},
    }
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
        for turn in range(30):
            s.append(filler(2, 300 + 2 * turn))
            built = s.build(max_input_tokens=400)
        assert "PIN777X" in [m.text.split()[2] for m in built.messages if m.pinned]
        upto, stored = _stored_ledger(s)
        assert stored is not None and upto > 250
        expected = _expected_ledger(s, upto, set())
        assert stored.to_dict() == expected.to_dict()  # seq too: no message added twice
        assert "PIN777X" not in stored.values() and "ZFA04Y" in stored.values()
        assert s.ledger.upto >= upto  # this process may be ahead of what it stored


def test_folded_messages_still_feed_the_ledger(url: str, sid: str) -> None:
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(120)]
    fold_most = SummaryTrigger(max_messages=60, keep_recent=20, fill_ratio=None)
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
        written = s.summarize_sync(Scripted(), trigger=fold_most)
        assert written is not None and written.covered_up_to_seq > 90
        assert s.summary is not None and "ZFA04Y" not in s.summary  # the summary dropped it
        built = s.build(max_input_tokens=500)
        ledger = [m.text for m in built.messages if built.layers[m.id] == "ledger"]
        assert ledger and "ZFA04Y" in ledger[0] and "W2378156" in ledger[0]
        assert not {f"m{i}" for i in range(1, written.covered_up_to_seq + 1)} & {
            m.id for m in built.messages
        }


def test_a_new_process_resumes_from_the_stored_checkpoint(
    url: str, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    from ctxwarden.session.session import LEDGER_SAVE_EVERY
    from ctxwarden.store import ledger_checkpoint

    history = [{"role": "system", "content": "sys"}, *filler(300)]
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
        full = None
        for turn in range(40):
            s.append(filler(2, 300 + 2 * turn))
            history += filler(2, 300 + 2 * turn)
            s.build(max_input_tokens=400)
            full = build_context(history, max_input_tokens=400, policy=LEDGER_PATH, previous=full)
        stored_upto = _stored_ledger(s)[0]
        assert 0 <= s.ledger.upto - stored_upto < LEDGER_SAVE_EVERY  # saved every so often
    monkeypatch.setattr(
        ledger_checkpoint, "_MEMORY", BoundedCache("test", 16)
    )  # as in a new process
    with Session(url, sid, policy=LEDGER_PATH) as s:
        ranges = _recording(s.store)
        s.append(filler(2, 380))
        history += filler(2, 380)
        built = s.build(max_input_tokens=400)
        assert (
            built.to_openai()
            == build_context(
                history, max_input_tokens=400, policy=LEDGER_PATH, previous=full
            ).to_openai()
        )
        assert ranges[0][0] == stored_upto and ranges[0][1] - stored_upto <= LEDGER_SAVE_EVERY + 20


def tool_rounds(n: int, start: int) -> list[dict[str, Any]]:
    """``n`` agent-loop rounds: a tool call and its result, each result naming a file."""
    out: list[dict[str, Any]] = []
    for i in range(start, start + n):
        read = {"name": "read_file", "arguments": f'{{"path": "src/m{i}.py"}}'}
        call = {"id": f"call_{i}", "type": "function", "function": read}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"def f{i}(): pass"})
    return out


def test_a_chat_that_turns_into_an_agent_loop_keeps_every_value(url: str, sid: str) -> None:
    """A chat-shaped session reads the recall's look-back before its slice, and the ledger
    covers only what lies before that; when the conversation turns into an agent loop the
    session reads its slice alone, and the ledger must then cover the whole look-back at
    once: a gap of a built session, not an import to seed from its newest messages."""
    from ctxwarden.steps.recall_relevant import RecallRelevant

    policy = Policy(recall=RecallRelevant(auto=True, lookback=300))
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(400)]
    history[201]["content"] = "Remember the voucher VCH7731Q for the return leg."
    with Session(url, sid, policy=policy) as s:
        s.ledger_backfill = 100
        s.append(history)
        full = None
        for turn in range(40):  # chat turns, then tool rounds
            new = filler(2, 400 + 2 * turn) if turn < 5 else tool_rounds(1, turn)
            s.append(new)
            history += new
            built = s.build(max_input_tokens=500)
            full = build_context(history, max_input_tokens=500, policy=policy, previous=full)
            assert built.to_openai() == full.to_openai(), turn
            assert not built.audit.warnings, (turn, built.audit.warnings)
        assert "VCH7731Q" in _context_text(built) and "ZFA04Y" in _context_text(built)


def test_a_chat_session_reads_the_recall_look_back_once(url: str, sid: str) -> None:
    """A chat-shaped session reads the ``lookback`` messages before its slice for the
    relevance recall; the next builds read only the messages that range gained, and
    still send what ``build_context`` sends over the whole history."""
    from ctxwarden.steps.recall_relevant import RecallRelevant

    policy = Policy(recall=RecallRelevant(auto=True, lookback=300))
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(600)]
    history[151]["content"] = "Remember the voucher VCH7731Q for the return leg."
    with Session(url, sid, policy=policy) as s:
        s.append(history)
        read = _counting(s.store)
        full = None
        for turn in range(12):
            new = filler(2, 600 + 2 * turn)
            if turn == 11:
                new[0]["content"] = "Which voucher did I mention for the return leg?"
            s.append(new)
            history += new
            read.clear()
            built = s.build(max_input_tokens=500)
            full = build_context(history, max_input_tokens=500, policy=policy, previous=full)
            assert built.to_openai() == full.to_openai(), turn
            if turn == 0:
                assert read["range"] >= 290  # the look-back, once
            elif turn == 1:  # the first warm build moves from the cold tail to the window start
                # (and the newest messages the recall gate reads the shape from, once)
                assert read.get("range", 0) <= len(s.context_messages(500)) + 58, read
            else:
                assert read.get("range", 0) <= 2 * 20, (turn, read)  # what the window passed
        assert "VCH7731Q" in _context_text(built)  # recalled from before the slice


def test_a_damaged_stored_ledger_is_rebuilt(
    url: str, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    from ctxwarden.store import ledger_checkpoint

    history = [{"role": "system", "content": "sys"}, *filler(200)]
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
        first = s.build(max_input_tokens=500)
        with s.store._write() as tx:  # type: ignore[attr-defined]
            tx.execute("UPDATE ctxwarden_ledgers SET ledger = '{\"entries\": 7}'")
        monkeypatch.setattr(ledger_checkpoint, "_MEMORY", BoundedCache("test", 16))  # a new process
        with pytest.raises(ValueError, match="not a stored entity ledger"):
            _stored_ledger(s)
        again = s.build(max_input_tokens=500)
        assert again.to_openai() == first.to_openai()
        assert not first.audit.warnings  # built turn by turn from the start: nothing to say
        (warning,) = again.audit.warnings  # not repaired silently
        assert warning.startswith("stored entity ledger cannot be read back")
        assert "not a stored entity ledger" in warning and "rebuilt" in warning
        upto, stored = _stored_ledger(s)  # repaired by the build's save
        assert stored is not None and stored.to_dict() == _expected_ledger(s, upto, set()).to_dict()
        monkeypatch.setattr(ledger_checkpoint, "_MEMORY", BoundedCache("test", 16))
        s.append(filler(2, 200))
        assert not s.build(max_input_tokens=500).audit.warnings  # the repaired one reads back


LATE = {
    3000: "Old ticket KPL93Z was closed.",  # before the look-back: not in the ledger
    4500: "Late booking QXR8T2 is paid with gift_card_5550001.",
    4700: "Please ship order #W9988776 on 2025-01-15.",
}


def bulk(n: int) -> list[dict[str, Any]]:
    """A system prompt and ``n - 1`` filler turns, with PLANTED early and LATE late."""
    out = [{"role": "system", "content": "You are a travel agent."}, *filler(n - 1)]
    for position, text in LATE.items():
        out[position]["content"] = text
    return out


def _counting(store: SessionStore) -> dict[str, int]:
    """Count the messages ``store`` hands out, per method, from now on."""
    read: dict[str, int] = {}
    for name in ("tail", "pinned", "range", "unpinned_between"):
        inner = getattr(store, name)

        def counted(*args: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            got = _inner(*args, **kw)
            read[_name] = read.get(_name, 0) + len(got)
            return got

        setattr(store, name, counted)
    return read


def test_a_bulk_imported_session_seeds_its_ledger_from_a_bounded_look_back(
    url: str, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    from ctxwarden.session.session import LEDGER_SAVE_EVERY
    from ctxwarden.store import ledger_checkpoint
    from ctxwarden.store.ledger_checkpoint import LEDGER_BACKFILL, LedgerCheckpoint

    history = bulk(5000)
    with Session.import_(url, sid, history, policy=LEDGER_PATH) as s:
        assert s.ledger_backfill == LEDGER_BACKFILL == 1000
        read, ranges = _counting(s.store), _recording(s.store)
        built = s.build(max_input_tokens=500)
        first = dict(read)
        start = min(m.seq for m in s.context_messages(500) if m.message.role != "system")
        assert 4800 < start < 5000  # the slice: the newest tail
        # the first build read the slice and the last 1,000 messages before it, not 5,000
        assert ranges == [(start - 1 - LEDGER_BACKFILL, start)]
        assert first == {"pinned": 1, "tail": 5000 - start, "unpinned_between": LEDGER_BACKFILL}
        # the coverage recorded: messages since..upto, in memory and in the store
        ckpt = s.ledger
        assert (ckpt.since, ckpt.upto) == (start - LEDGER_BACKFILL, start - 1)
        upto, text = s.store.load_ledger(s.tenant, s.session_id)
        stored = LedgerCheckpoint.decode(upto, text)
        assert (stored.since, stored.upto) == (ckpt.since, ckpt.upto)
        expected = _expected_ledger(s, upto, set(), since=ckpt.since)
        assert stored.ledger.to_dict() == expected.to_dict()  # each message added once
        values = set(stored.ledger.values())
        late = {"QXR8T2", "gift_card_5550001", "#W9988776", "2025-01-15"}
        assert late <= values and all(v in _context_text(built) for v in late)
        assert not values & {"KPL93Z", "ZFA04Y", "#W2378156"}  # older than the look-back
        (warning,) = built.audit.warnings
        assert f"(seq {ckpt.since}-{ckpt.upto}): the older ones (seq 0-{ckpt.since - 1})" in warning
        # the next builds continue from there: only what left the slice, nothing twice
        del ranges[:]
        for turn in range(20):
            s.append(filler(2, 5000 + 2 * turn))
            read.clear()
            again = s.build(max_input_tokens=500)
            assert not again.audit.warnings
            assert sum(read.values()) <= 150, read  # the slice and a few that left it
            assert all(v in _context_text(again) for v in late)
        assert ranges[0][0] == upto and all(b - a <= 150 for a, b in ranges), ranges
        assert all(b[0] == a[1] - 1 for a, b in itertools.pairwise(ranges)), ranges
        assert s.ledger.since == ckpt.since and s.ledger.upto > upto
        # a new process continues from the stored checkpoint, its coverage kept
        monkeypatch.setattr(ledger_checkpoint, "_MEMORY", BoundedCache("test", 16))
        s.append(filler(2, 5040))
        read.clear()
        assert not s.build(max_input_tokens=500).audit.warnings
        assert read["unpinned_between"] <= LEDGER_SAVE_EVERY + 20
        upto, stored_again = _stored_ledger(s)
        assert stored_again is not None and s.ledger.since == ckpt.since
        assert stored_again.to_dict() == _expected_ledger(s, upto, set(), ckpt.since).to_dict()


def test_a_damaged_ledger_of_a_long_session_is_rebuilt_from_the_look_back_only(
    url: str, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    from ctxwarden.store import ledger_checkpoint

    with Session.import_(url, sid, bulk(5000), policy=LEDGER_PATH) as s:
        first = s.build(max_input_tokens=500)
        with s.store._write() as tx:  # type: ignore[attr-defined]
            tx.execute("UPDATE ctxwarden_ledgers SET ledger = 'not json'")
        monkeypatch.setattr(ledger_checkpoint, "_MEMORY", BoundedCache("test", 16))  # a new process
        read = _counting(s.store)
        again = s.build(max_input_tokens=500)
        damaged, seeded = again.audit.warnings
        assert "cannot be read back" in damaged and "seeded from the 1,000 messages" in seeded
        assert read["unpinned_between"] <= s.ledger_backfill  # no read of the whole history
        assert again.to_openai() == first.to_openai()
        upto, stored = _stored_ledger(s)
        assert stored is not None
        assert stored.to_dict() == _expected_ledger(s, upto, set(), s.ledger.since).to_dict()


def test_a_bulk_append_to_a_built_session_is_read_from_the_window_start(url: str, sid: str) -> None:
    """A built session has a stored window start, and the build over the whole history
    starts its window there: the session reads every message appended since (the
    values of those that do not fit reach the ledger as they do in ``build_context``),
    not a backfill of the newest ones."""
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(300)]
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
        s.build(max_input_tokens=400)
        full = build_context(history, max_input_tokens=400, policy=LEDGER_PATH)
        before = s.ledger
        assert before.since == 0 and {"ZFA04Y", "#W2378156"} <= set(before.ledger.values())
        s.ledger_backfill = 100
        added = filler(600, 300)  # seqs 301..900
        added[600 - 301]["content"] = "Old ticket KPL93Z was closed."
        added[780 - 301]["content"] = "Late booking QXR8T2 is paid with gift_card_5550001."
        s.append(added)
        history += added
        ranges = _recording(s.store)
        built = s.build(max_input_tokens=400)
        full = build_context(history, max_input_tokens=400, policy=LEDGER_PATH, previous=full)
        assert built.to_openai() == full.to_openai()
        assert all(before <= 301 for _, before in ranges)  # no look-back into the append
        for value in ("ZFA04Y", "#W2378156", "KPL93Z", "QXR8T2"):
            assert value in _context_text(built)
        assert not built.audit.warnings


def test_without_the_ledger_the_session_build_is_the_full_build(url: str, sid: str) -> None:
    from ctxwarden.pipeline.policy import LedgerConfig, Policy

    policy = Policy(ledger=LedgerConfig(enabled=False))
    history = [{"role": "system", "content": "sys"}, *chat(300)]
    with Session(url, sid, policy=policy) as s:
        s.append(history)
        previous = None
        for turn in range(3):
            s.append(chat(2, 300 + 2 * turn))
            history += chat(2, 300 + 2 * turn)
            built = s.build(max_input_tokens=500)
            previous = build_context(
                history, max_input_tokens=500, policy=policy, previous=previous
            )
            assert built.to_openai() == previous.to_openai()
            assert built.audit.prefix_shared_tokens == previous.audit.prefix_shared_tokens


def test_build_uses_summary_and_facts_and_skips_what_they_cover(url: str, sid: str) -> None:
    with Session(url, sid) as s:
        s.append([{"role": "system", "content": "sys"}, *chat(60)])
        written = s.summarize_sync(Scripted(), ScriptedFacts(), trigger=EVERY_40)
        assert written is not None
        built = s.build(max_input_tokens=4000)
        texts = [m.text for m in built.messages]
        assert any(t.startswith(SUMMARY_HEADING + "summary 1 of m1..m") for t in texts)
        assert any("last_order" in t for t in texts)
        kept_ids = {m.id for m in built.messages}
        assert not {f"m{i}" for i in range(1, written.covered_up_to_seq + 1)} & kept_ids


def test_a_registry_model_counts_budgets_and_prices_in_a_session(url: str, sid: str) -> None:
    """A user's model (tests/test_registry.py MY_LLAMA: 6,000-token window, factor 1.5,
    $1 / $2 per 1M) given as ``Session(..., registry=...)``."""
    from test_registry import my_llama

    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.session.session import count_key

    registry = my_llama()
    history = [{"role": "system", "content": "You are a shop assistant."}, *chat(600)]
    with Session(url, f"{sid}-default", model="my-llama") as plain:
        plain.append(chat(2))
        with pytest.raises(ConfigError, match="no budget"):  # the default registry lacks it
            plain.build()
    with Session(url, sid, model="my-llama", registry=registry) as s:
        s.append(history)
        counter = TokenCounter.for_model("my-llama", registry)
        first = s.store.range(s.tenant, sid, 0, 1)[0]
        assert count_key(counter) == "o200k_base~llamax1.5"
        assert first.token_counts == {"o200k_base~llamax1.5": counter.count_message(first.message)}
        built = s.build()
        full = build_context(history, "my-llama", registry=registry)
        assert built.to_openai() == full.to_openai()
        assert (built.audit.budget, built.audit.context_window) == (6_000 - 4096, 6_000)
        assert built.audit.estimated_cost_usd == pytest.approx(built.input_tokens / 1e6)
        s.record_usage(Usage(1000, 100))
        assert s.cost == pytest.approx((1000 * 1.0 + 100 * 2.0) / 1e6)


# -- the summary shown: the view for the newest user message -----------------------------

SHARE = SummaryTrigger(max_messages=16, keep_recent=6, fill_ratio=None, summary_share=0.25)


def _summary_layer(built: Any) -> str | None:
    """The summary layer's text after its heading (both build paths show the heading)."""
    text = next((m.text for m in built.messages if m.id == "ctxwarden:summary"), None)
    if text is None:
        return None
    assert text.startswith(SUMMARY_HEADING)
    return text[len(SUMMARY_HEADING) :]


class _Unfocused:
    """A summariser that cannot focus a stored summary (as a model's)."""

    async def summarize(self, messages: Any, previous: str | None = None) -> Any:
        raise AssertionError("not called")

    async def merge(self, summaries: Any) -> Any:
        raise AssertionError("not called")


def test_build_shows_the_summary_focused_on_the_question(url: str, sid: str) -> None:
    from test_engine_summary import travel_chat  # each trip told once

    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.llm.offline import OfflineSummarizer
    from ctxwarden.memory.summaries import summary_view
    from ctxwarden.pipeline.compaction import CacheConfig
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.steps.layers import SUMMARY_HEADING

    summarizer = OfflineSummarizer(max_tokens=1200, meta_max_tokens=2400)
    # the view renewed at every build (by default it is held while mostly the same:
    # tests/test_engine_summary.py)
    policy = Policy(summary=SHARE, cache=CacheConfig(hold_layers=False))
    counter = TokenCounter.for_model("gpt-4o")
    room = int(1200 * 0.25) - counter.count_message(Message.system(SUMMARY_HEADING))
    with Session(url, sid, summarizer=summarizer, policy=policy) as s:
        s.append(travel_chat(30))
        assert s.summarize_sync(trigger=SHARE) is not None  # the session's summariser
        stored = s.summary
        assert stored is not None and counter.count_text(stored) > 2 * room  # more than shown
        views: dict[str, str] = {}
        for city, question in [("Kyoto", "What food did I try in Kyoto?"), ("Oaxaca", "Oaxaca?")]:
            s.append([{"role": "user", "content": question}])
            built = s.build(max_input_tokens=1200)
            shown = _summary_layer(built)
            assert shown is not None and built.input_tokens <= 1200
            assert counter.count_message(Message.system(shown)) <= 1200 * 0.25
            assert set(shown.splitlines()) <= set(stored.splitlines())  # its lines, unchanged
            # exactly the view build_context shows (after its heading), every time
            assert shown == summary_view(summarizer, stored, question, room)
            assert _summary_layer(s.build(max_input_tokens=1200)) == shown
            views[city] = shown
        assert "matcha ice cream" in views["Kyoto"] and "mole negro" in views["Oaxaca"]
        assert views["Kyoto"].count("Kyoto") > views["Oaxaca"].count("Kyoto")
        # a session given no summariser shows it as the one that wrote it says (the
        # offline one: focused), the same view on every path (the proxy's, a replica's)
        with Session(url, sid, policy=policy) as plain:
            assert _summary_layer(plain.build(max_input_tokens=1200)) == views["Oaxaca"]
        # without a share, a summariser that can focus fills what the rest leaves: more
        # of the stored lines than the 25 % share shows, the budget held
        renewed = Policy(cache=CacheConfig(hold_layers=False))
        unshared = s.build(max_input_tokens=1200, policy=Policy())  # a new policy: renewed
        shown_lines = (_summary_layer(unshared) or "").splitlines()
        assert len(views["Oaxaca"].splitlines()) < len(shown_lines) < len(stored.splitlines())
        assert set(shown_lines) <= set(stored.splitlines())
        assert unshared.input_tokens <= 1200
        # a summariser that cannot focus: the summary as stored within
        # summary.max_summary_share, its newest lines (the rest stays stored), and the
        # audit says so
        with Session(url, sid, summarizer=_Unfocused()) as plain:
            written = plain.build(max_input_tokens=1200, policy=renewed)
        written_lines = (_summary_layer(written) or "").splitlines()
        assert 0 < len(written_lines) < len(stored.splitlines())
        assert written_lines == stored.splitlines()[-len(written_lines) :]
        assert written.audit.layers["summary"] <= 0.35 * 1200
        assert any("summary layer cut" in w for w in written.audit.warnings)
        with Session(url, sid) as other:  # or given to one build
            given = other.build(max_input_tokens=1200, policy=policy, summarizer=summarizer)
        assert _summary_layer(given) == views["Oaxaca"]


def test_a_share_too_small_for_any_line_leaves_the_summary_out_and_says_so(
    url: str, sid: str
) -> None:
    from test_engine_summary import travel_chat

    from ctxwarden.llm.offline import OfflineSummarizer
    from ctxwarden.pipeline.policy import Policy

    tiny = SummaryTrigger(max_messages=16, keep_recent=6, fill_ratio=None, summary_share=0.01)
    with Session(url, sid, summarizer=OfflineSummarizer()) as s:
        s.append(travel_chat(30))
        s.summarize_sync(trigger=tiny)
        built = s.build(max_input_tokens=1200, policy=Policy(summary=tiny))
        assert _summary_layer(built) is None and s.summary  # left out, still stored
        assert any("summary left out" in w for w in built.audit.warnings)
    with Session(url, f"{sid}-none") as bare, pytest.raises(ConfigError, match="no summariser"):
        bare.summarize_sync()


# -- the summarisation cycle -------------------------------------------------------------------


def test_summarize_folds_old_messages_and_keeps_new_ones(url: str, sid: str) -> None:
    with Session(url, sid) as s:
        s.append(chat(50))
        # No trigger fires: nothing is folded, but the free rule-based extractor (as in
        # build_context(summarizer=...)) keeps the facts current, and that is written.
        first = s.summarize_sync(
            Scripted(), trigger=SummaryTrigger(max_messages=60, fill_ratio=None)
        )
        assert first is not None and first.folded == 0 and first.session.summary is None
        assert (
            s.summarize_sync(Scripted(), trigger=SummaryTrigger(max_messages=60, fill_ratio=None))
            is None
        )
        model = Scripted()
        written = s.summarize_sync(model, ScriptedFacts(), trigger=EVERY_40)
        assert written is not None and written.session.version == 2 and written.attempts == 1
        assert model.calls == [(written.folded, None)]
        assert written.covered_up_to_seq == written.folded - 1 and 40 <= written.folded <= 40
        assert s.summary == f"summary 1 of m0..m{written.covered_up_to_seq}"
        assert s.facts["last_order"] == f"ABC{written.covered_up_to_seq - 1:04d}"
        assert s.usage == Usage(100, 20)
        assert len(s) == 50  # summarising never deletes a message


def test_messages_appended_during_the_model_call_fall_into_the_next_cycle(
    url: str, sid: str
) -> None:
    other = Session(url, sid)

    async def meanwhile(call: int) -> None:
        if call == 1:
            other.append(chat(40, 50))

    with Session(url, sid) as s, other:
        s.append(chat(50))
        model = Scripted(meanwhile)
        first = s.summarize_sync(model, trigger=EVERY_40)
        assert first is not None and first.covered_up_to_seq == 39
        assert len(s) == 90
        second = s.summarize_sync(model, trigger=EVERY_40)
        assert second is not None and second.session.version == 2
        assert model.calls[1] == (second.folded, "summary 1 of m0..m39")
        assert s.export() == chat(90)


def test_a_lost_race_rereads_and_merges_the_winner(url: str, sid: str) -> None:
    rival = Session(url, sid)

    async def race(call: int) -> None:
        if call == 1:  # another worker completes a whole cycle while our model thinks
            await rival.summarize(Scripted(), trigger=EVERY_40)
            rival.append(chat(40, 60))

    with Session(url, sid) as s, rival:
        s.append(chat(60))
        model = Scripted(race)
        written = s.summarize_sync(model, trigger=EVERY_40)
        assert written is not None and written.attempts == 2 and written.session.version == 2
        assert model.calls[1][1] == "summary 1 of m0..m49"  # the winner's summary, merged
        assert s.summary is not None and s.summary.startswith("summary 2 of m50")


def test_a_failing_model_changes_nothing(url: str, sid: str) -> None:
    class Broken(Scripted):
        async def summarize(self, messages: Sequence[Message], previous: str | None = None) -> Any:
            raise TimeoutError

    class Empty(Scripted):
        async def summarize(self, messages: Sequence[Message], previous: str | None = None) -> Any:
            return SummaryResult("  ")

    with Session(url, sid) as s:
        s.append(chat(50))
        for model in (Broken(), Empty()):
            with pytest.raises(SummarizationError, match="nothing changed"):
                s.summarize_sync(model, trigger=EVERY_40)
        assert (s.record.version, s.summary, len(s)) == (0, None, 50)


def test_no_connection_is_held_during_the_model_call(url: str, sid: str) -> None:
    seen: list[int] = []
    with Session(url, sid) as s:

        async def look(call: int) -> None:
            seen.append(s.store.connections_in_use())

        s.append(chat(50))
        assert s.store.connections_in_use() >= 0
        s.summarize_sync(Scripted(look), trigger=EVERY_40)
        assert seen == [0]


def test_level_one_summaries_cascade_into_a_meta_summary(url: str, sid: str) -> None:
    seen: list[tuple[int, int]] = []
    two_then_meta = SummaryTrigger(max_messages=20, keep_recent=5, fill_ratio=None, max_summaries=2)
    with Session(url, sid) as s:

        async def look(call: int) -> None:
            seen.append((call, s.store.connections_in_use()))

        model = Scripted(look)
        s.append(chat(30))
        first = s.summarize_sync(model, trigger=two_then_meta)
        assert first is not None and not first.meta and s.summary == model_text(1, 0, 24)
        s.append(chat(20, 30))
        second = s.summarize_sync(model, trigger=two_then_meta)
        assert second is not None and second.meta and second.error is None
        assert model.calls[1][1] == model_text(1, 0, 24)  # level one merges the previous one
        assert model.merged == [[model_text(2, 25, 44)]]  # its text already holds the first
        meta = f"meta 1 <- {model_text(2, 25, 44)}"
        assert s.summary == meta and s.summary_state.summaries == ()
        assert seen == [(1, 0), (2, 0), (-1, 0)]  # no connection held, meta call included
        s.append(chat(20, 50))
        third = s.summarize_sync(model, trigger=two_then_meta)
        assert third is not None and not third.meta
        assert model.calls[2][1] is None  # level one starts afresh after the meta-summary
        assert third.session.version == 3  # one versioned write per cycle, meta included
        assert s.usage == Usage(350, 70, calls=4)
    with Session(url, sid) as again:  # both tiers stored
        state = again.summary_state
        assert state.meta_summary == meta and state.summaries == (model_text(3, 45, 64),)
        assert again.summary == f"{meta}\n\n{model_text(3, 45, 64)}" and state.cycles == 3


def model_text(call: int, first: int, last: int) -> str:
    return f"summary {call} of m{first}..m{last}"


def test_a_failing_meta_summary_keeps_the_level_one_and_retries(url: str, sid: str) -> None:
    class MetaFails(Scripted):
        async def merge(self, summaries: Sequence[str]) -> SummaryResult:
            if not self.merged:
                self.merged.append([])
                raise SummarizationError("the model is down")
            return await super().merge(summaries)

    two_then_meta = SummaryTrigger(max_messages=20, keep_recent=5, fill_ratio=None, max_summaries=2)
    with Session(url, sid) as s:
        model = MetaFails()
        s.append(chat(30))
        s.summarize_sync(model, trigger=two_then_meta)
        s.append(chat(20, 30))
        second = s.summarize_sync(model, trigger=two_then_meta)
        assert second is not None and not second.meta
        assert second.error is not None and "the model is down" in second.error
        assert s.summary == model_text(2, 25, 44) and len(s.summary_state.summaries) == 2
        s.append(chat(20, 50))
        third = s.summarize_sync(model, trigger=two_then_meta)
        assert third is not None and third.meta and s.summary_state.summaries == ()
        assert s.summary == f"meta 2 <- {model_text(3, 45, 64)}"


def test_a_summariser_without_merge_is_refused_before_anything_runs(url: str, sid: str) -> None:
    class OnlySummaries:
        async def summarize(self, messages: Sequence[Message], previous: str | None = None) -> Any:
            raise AssertionError("never called")

    with Session(url, sid) as s:
        s.append(chat(50))
        with pytest.raises(ConfigError, match="no merge"):
            s.summarize_sync(OnlySummaries(), trigger=EVERY_40)  # type: ignore[arg-type]
        assert (s.record.version, s.summary) == (0, None)


# -- many processes ---------------------------------------------------------------------------


def _appender(url: str, sid: str, proc: int, n: int, batch: int) -> None:
    with Session(url, sid) as s:
        for start in range(0, n, batch):
            s.append(
                [{"role": "user", "content": f"p{proc} #{i}"} for i in range(start, start + batch)]
            )


class _Sleepy:
    """Sleeps like a real model, and meanwhile looks at what the process holds."""

    def __init__(self, store: SessionStore, sleep: float, db_path: str | None, app: str | None):
        self.store, self.sleep, self.db_path, self.app = store, sleep, db_path, app
        self.observations: list[tuple[int, int]] = []
        self.calls = 0

    def _held_elsewhere(self) -> int:
        if self.db_path is not None:  # open file descriptors on the database or its WAL
            fds = Path("/proc/self/fd")
            links = [os.readlink(fds / fd) for fd in os.listdir(fds) if (fds / fd).is_symlink()]
            return sum(1 for link in links if link.startswith(self.db_path))
        import psycopg

        assert PG_DSN
        with psycopg.connect(PG_DSN, autocommit=True, application_name="ctxw-checker") as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND state IS DISTINCT FROM 'idle'",
                (self.app,),
            ).fetchone()
        return int(row[0]) if row else -1

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        self.calls += 1
        self.observations.append((self.store.connections_in_use(), self._held_elsewhere()))
        await asyncio.sleep(self.sleep)
        return SummaryResult(f"cycle {self.calls}: {len(messages)} messages to {messages[-1].id}")

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        self.observations.append((self.store.connections_in_use(), self._held_elsewhere()))
        await asyncio.sleep(self.sleep)
        return SummaryResult("meta: " + " | ".join(summaries))


def _summarizer(
    url: str,
    sid: str,
    ready: Any,
    stop: Any,
    out: Any,
    sleep: float,
    db_path: str | None,
    app: str | None,
) -> None:
    async def run() -> None:
        cycles: list[tuple[int, int, str | None]] = []
        with Session(url, sid) as s:
            model = _Sleepy(s.store, sleep, db_path, app)
            ready.set()  # the appenders start now: a slow spawn must not miss them
            while True:
                stopping = stop.is_set()
                written = await s.summarize(model, trigger=EVERY_40)
                if written is not None:
                    cycles.append(
                        (
                            written.session.version,
                            written.covered_up_to_seq,
                            written.session.summary,
                        )
                    )
                elif stopping:
                    break
                else:
                    await asyncio.sleep(0.02)
        out.put((cycles, model.observations))

    asyncio.run(run())


def test_eight_appenders_and_a_summariser(url: str, sid: str, tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    with Session(url, sid):
        pass
    db_path = url.removeprefix("sqlite:///") if url.startswith("sqlite") else None
    app = f"ctxw-sum-{uuid.uuid4().hex[:8]}"
    sum_url = url if db_path else _with_param(url, "application_name", app)
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    started = time.monotonic()
    summariser = ctx.Process(
        target=_summarizer, args=(sum_url, sid, ready, stop, out, 0.2, db_path, app)
    )
    summariser.start()
    assert ready.wait(30)
    appenders = [ctx.Process(target=_appender, args=(url, sid, p, 500, 5)) for p in range(8)]
    for p in appenders:
        p.start()
    for p in appenders:
        p.join(90)
        assert p.exitcode == 0
    stop.set()
    cycles, observations = out.get(timeout=60)
    summariser.join(30)
    assert summariser.exitcode == 0
    assert time.monotonic() - started < 60

    with Session(url, sid) as s:
        texts = [m["content"] for m in s.export()]
        record = s.record
    assert len(texts) == 4000
    for proc in range(8):  # each process's order kept
        mine = [int(t.split("#")[1]) for t in texts if t.startswith(f"p{proc} ")]
        assert mine == list(range(500))
    assert len(cycles) >= 3  # the summariser really cycled while appenders ran
    assert [c[0] for c in cycles] == list(range(1, len(cycles) + 1))  # no update lost
    assert record.version == len(cycles) and record.summary == cycles[-1][2]
    assert [c[1] for c in cycles] == sorted({c[1] for c in cycles})  # coverage only grows
    assert observations and all(obs == (0, 0) for obs in observations), observations


# -- SIGKILL mid-cycle --------------------------------------------------------------------------


class _Hang:
    def __init__(self, reached: Any, arm: list[bool] | None = None) -> None:
        self.reached, self.arm = reached, arm

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        if self.arm is not None:  # hang later, inside the write transaction
            self.arm[0] = True
            return SummaryResult("never committed")
        self.reached.set()
        await asyncio.sleep(120)
        return SummaryResult("never written")

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        return SummaryResult("never merged")


def _killed_child(url: str, sid: str, reached: Any, where: str) -> None:
    store = open_store(url)
    arm = [False]
    if where == "write":
        original = store._write  # type: ignore[attr-defined]

        @contextmanager
        def slow_write() -> Iterator[Any]:
            with original() as tx:
                yield tx
                if arm[0]:  # the UPDATE ran; the COMMIT has not
                    reached.set()
                    time.sleep(120)

        store._write = slow_write  # type: ignore[attr-defined]
    with Session(store, sid) as s:
        asyncio.run(
            s.summarize(_Hang(reached, arm if where == "write" else None), trigger=EVERY_40)
        )


@pytest.mark.parametrize("where", ["model", "write"])
def test_sigkill_mid_cycle_leaves_the_session_consistent(url: str, sid: str, where: str) -> None:
    with Session(url, sid) as s:
        s.append([{"role": "system", "content": "sys"}, *chat(60)])
    ctx = mp.get_context("spawn")
    reached = ctx.Event()
    child = ctx.Process(target=_killed_child, args=(url, sid, reached, where))
    child.start()
    assert reached.wait(30), "the child never reached the point to kill"
    time.sleep(0.1)
    os.kill(child.pid or 0, signal.SIGKILL)
    child.join(10)
    assert child.exitcode == -signal.SIGKILL

    with Session(url, sid) as s:
        assert (s.record.version, s.summary, len(s)) == (0, None, 61)
        s.append(chat(2, 60))
        built = s.build(max_input_tokens=800)
        assert built.messages[-1].text == chat(2, 60)[-1]["content"]
        written = s.summarize_sync(Scripted(), trigger=EVERY_40)
        assert written is not None and written.session.version == 1


class _Recorder:
    """A transaction that remembers whether a statement touched the ledger table."""

    def __init__(self, tx: Any) -> None:
        self.tx, self.ledger = tx, False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.ledger = self.ledger or "ctxwarden_ledgers" in sql
        return self.tx.execute(sql, params)  # type: ignore[no-any-return]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.tx.executemany(sql, rows)


def _killed_in_ledger_write(url: str, sid: str, reached: Any) -> None:
    store = open_store(url)
    original = store._write  # type: ignore[attr-defined]

    @contextmanager
    def slow_write() -> Iterator[Any]:
        with original() as tx:
            recorder = _Recorder(tx)
            yield recorder
            if recorder.ledger:  # sticky and ledger written; the COMMIT has not run
                reached.set()
                time.sleep(120)

    store._write = slow_write  # type: ignore[attr-defined]
    with Session(store, sid, policy=LEDGER_PATH) as s:
        s.build(max_input_tokens=500)


def test_sigkill_during_the_ledger_write_leaves_the_session_consistent(url: str, sid: str) -> None:
    history = [{"role": "system", "content": "You are a travel agent."}, *filler(400)]
    with Session(url, sid, policy=LEDGER_PATH) as s:
        s.append(history)
    ctx = mp.get_context("spawn")
    reached = ctx.Event()
    child = ctx.Process(target=_killed_in_ledger_write, args=(url, sid, reached))
    child.start()
    assert reached.wait(60), "the child never reached the ledger write"
    time.sleep(0.1)
    os.kill(child.pid or 0, signal.SIGKILL)
    child.join(10)
    assert child.exitcode == -signal.SIGKILL

    with Session(url, sid, policy=LEDGER_PATH) as s:
        assert _stored_ledger(s) == (-1, None) and s.record.sticky == {}  # all or nothing
        built = s.build(max_input_tokens=500)
        alone = build_context(history, max_input_tokens=500, policy=LEDGER_PATH)
        assert built.to_openai() == alone.to_openai()
        upto, stored = _stored_ledger(s)
        assert stored is not None and stored.to_dict() == _expected_ledger(s, upto, set()).to_dict()
        assert "ZFA04Y" in _context_text(built)


# -- CLI ------------------------------------------------------------------------------------


def test_cli_session_commands(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from ctxwarden.cli.session import session_app

    runner, db = CliRunner(), f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["--db", db, "--session", "c1"]
    given = [{"role": "system", "content": "sys"}, *chat(6)]
    assert runner.invoke(session_app, ["add", *base], input=json.dumps(given)).exit_code == 0
    bad = runner.invoke(session_app, ["add", *base], input='[{"role": "tool", "content": "x"}]')
    assert bad.exit_code == 2 and "tool_call_id" in bad.output
    exported = runner.invoke(session_app, ["export", *base])
    assert json.loads(exported.stdout) == given
    built = runner.invoke(session_app, ["build", *base, "--max-input-tokens", "80"])
    assert built.exit_code == 0
    sent = json.loads(built.stdout)
    assert sent == build_context(given, max_input_tokens=80).to_openai()
    assert sent[0] == given[0] and len(sent) < len(given)
    shown = runner.invoke(session_app, ["show", *base]).stdout
    assert "7 messages" in shown and "entity ledger: " in shown and "summary tiers: 0" in shown
    assert runner.invoke(session_app, ["list", "--db", db]).stdout.startswith("c1\t7\tv0")
    (tmp_path / "notes.txt").write_text("not a db")
    foreign = runner.invoke(session_app, ["list", "--db", f"sqlite:///{tmp_path / 'notes.txt'}"])
    assert foreign.exit_code == 1 and "not an SQLite database" in foreign.output
