"""A conversation that outlives the process: messages, summary and facts in a store (R13).

:class:`Session` is the user-facing object over a :class:`~ctxwarden.store.SessionStore`::

    with Session("sqlite:///agent.db", "chat-42") as s:
        s.append([{"role": "user", "content": "hi"}])
        built = s.build(model="gpt-4o", max_input_tokens=2000)

``build`` has the contract of :func:`ctxwarden.build_context` but reads only what can end
up in the context — pinned messages, every message from where the build's window starts
(the stored window start, else the engine's own walk back, and never after the newest
user message, which every build keeps), the summary, the facts and the previous build's
sticky decisions — so it costs what the window holds, not the whole history. The
entity ledger of everything older than that slice is a stored checkpoint each build
advances by the messages that left the slice since
(:mod:`ctxwarden.store.ledger_checkpoint`), so in a session built turn by turn the ids
and amounts of message 3 still reach the context at message 100,000, as they do in
``build_context`` over the full list. A session filled without builds (an import, a
bulk fill, data stored before the ledger was) is not read whole by its first build:
its ledger is seeded from the last ``ledger_backfill`` messages before the window
(1,000 by default) and holds their values plus everything that leaves the window from
then on; the values of the older messages are not in it, and that build's audit warns.

:meth:`Session.summarize` is seed 000's cycle in three steps, and the order matters:
read what to fold (one short read transaction), call the model with **no transaction and
no connection held** (the store's connection is released first), then write summary and
facts in one short transaction guarded by the session's version. If another writer won
the race, the cycle re-reads (now starting after the other summary, which becomes the
``previous`` one to merge) and retries. Messages appended meanwhile are not touched: they
lie after the folded range and fall into the next cycle. The model step is
:func:`ctxwarden.memory.summaries.summarize_cycle`, the in-memory cycle, so a session cascades
the same way: when level-one summaries pile up they are folded into a meta-summary in
the same model step, and both tiers are written together.
"""

from __future__ import annotations

import asyncio
import uuid
from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from ctxwarden.core.errors import ConfigError, StoreError, UnknownModelError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.catalog import Registry
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import message_from_openai, message_to_openai
from ctxwarden.pipeline.inputs import check_build_options, check_summarize_arguments
from ctxwarden.session import rows as session_state
from ctxwarden.session.build_log import KEEP_BUILDS, KEEP_CONTEXTS, ContextMemo, log_build
from ctxwarden.session.cycle import SummaryWrite, summary_cycle
from ctxwarden.session.ledger_memo import SeqMemo
from ctxwarden.session.pending_log import PendingLog
from ctxwarden.session.read_back import ReadBack
from ctxwarden.session.tail_memo import TailMemo, check_appended, count_key, with_tail
from ctxwarden.session.task_read import TaskRead
from ctxwarden.session.tool_pins import PinnedBlocks
from ctxwarden.steps.recall_gate import SHAPE_READ, history_chat_shaped, recall_reads_back
from ctxwarden.steps.state import BuildState
from ctxwarden.steps.window import leading_system
from ctxwarden.store import SessionStore, StoredMessage, StoredSession, open_store
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.ledger_checkpoint import (
    LEDGER_BACKFILL,
    LedgerCheckpoint,
    current_checkpoint,
    ledger_warnings,
    load_checkpoint,
    remember_checkpoint,
)
from ctxwarden.telemetry import (
    BUILD_SPAN,
    SUMMARIZE_SPAN,
    pending_attributes,
    summary_write_attributes,
    traced,
    traced_async,
)

if TYPE_CHECKING:
    from ctxwarden.llm.embeddings import Embedder
    from ctxwarden.memory.facts import Facts, FactSchema
    from ctxwarden.memory.summaries import SummaryState, SummaryTrigger
    from ctxwarden.pipeline.engine import BuiltContext
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.session.recall import Recalled
    from ctxwarden.steps.tool_rules import ToolRules

__all__ = ["PendingLog", "Session", "SummaryWrite", "count_key"]

_SEQ = attrgetter("seq")


_HEAD_SLACK = 8  # system messages that may precede the first pinned conversation messages
_CACHE_SIZE = 20_000
COLD_REACH = 4
"""A session without a stored window start reads back this many budgets, each message
counted as at most one budget: a cold engine build walks back until it has passed three
times the room its window has (each message counted as at most that room, the last one
crossing the line), and the room is at most the budget, so this reach holds that walk."""
_ALL = 2**62  # tokens: every message of the window region is read
RECENT_USERS = 2
"""A build reads this many newest user messages: the newest is always kept, and the
facts layer holds back a fact each of them restated (:mod:`ctxwarden.steps.layers`)."""
LEDGER_SAVE_EVERY = 32
"""A build stores the advanced entity-ledger checkpoint when none is stored yet, or when
it covers this many more messages than the stored one. Encoding a full ledger costs a
few milliseconds, so not every build pays it; a process without the checkpoint in memory
re-reads at most this many messages more."""


class _SummarizerLike(Protocol):
    async def summarize(self, messages: Sequence[Message], previous: str | None = None) -> Any: ...

    async def merge(self, summaries: Sequence[str]) -> Any: ...


class _ExtractorLike(Protocol):
    async def extract(
        self, messages: Sequence[Message], existing: Any, schema: Any = None
    ) -> Any: ...


class Session:
    """A stored conversation; see the module docstring. Close it (or use ``with``).

    ``registry`` is where models are looked up for counts, windows and prices (default:
    the built-in registry plus ``CTXWARDEN_MODELS``), so a user's own model is counted,
    budgeted and priced as its entry says. ``summarizer`` is the one :meth:`summarize`
    uses when given none, and lets :meth:`build` show the summary focused on the newest
    user message (see :meth:`build`). ``ledger_backfill`` (settable per instance) is how
    many messages before the window a build reads to seed an entity ledger that lags
    further behind than that."""

    ledger_backfill: int = LEDGER_BACKFILL
    keep_builds: int = KEEP_BUILDS
    """Builds whose audits the store keeps for this session (see :mod:`.build_log`)."""
    keep_contexts: int = KEEP_CONTEXTS
    """Of those, how many newest also keep their built messages (0: none)."""

    def __init__(
        self,
        store: str | SessionStore,
        session_id: str,
        *,
        tenant: str = "default",
        model: str = "gpt-4o",
        policy: Any = None,
        registry: Registry | None = None,
        summarizer: _SummarizerLike | None = None,
        **store_options: Any,
    ) -> None:
        check_build_options(model, policy, {"registry": registry}, summarizer=summarizer)
        self._owns_store = isinstance(store, str)
        self.store: SessionStore = (
            open_store(store, **store_options) if isinstance(store, str) else store
        )
        self.session_id = session_id
        self.tenant = tenant
        self.model = model
        self.policy = policy
        self.registry = registry
        self.summarizer = summarizer
        self._cache: dict[int, Message] = {}  # seq -> decoded message, reused across builds
        self._cache_of = 0.0  # the created_at of the session the cache holds messages of
        self._ledger_memo: SeqMemo | None = None  # the last build's, by seq (speed only)
        self._logged = ContextMemo()  # how the last build's context was logged (speed only)
        self._saved: session_state.SavedState | None = None  # the sticky state stored last
        self._tails = TailMemo()  # the last build's tail and what came after (speed only)
        self._task_read = TaskRead()  # the agent run's task, read once (speed only)
        self._rule_pins = PinnedBlocks()  # blocks a tool rule pins, before it (speed only)
        self._read_back = ReadBack()  # the recall's read-back before the slice (speed only)
        self._shape_back = ReadBack()  # the newest messages the recall gate reads (speed only)
        self._embedders: dict[str, Embedder] = {}  # embeddings clients, by spec
        self._embedded_upto: dict[tuple[str, float], int] = {}  # (vectors' key, session) ->
        # the seq up to which every message has a vector (where the next embed reads from)
        try:
            self.store.create_session(tenant, session_id)
        except BaseException:
            self.close()
            raise

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store's connections if this session opened the store (and the
        embeddings clients it opened)."""
        for embedder in self._embedders.values():
            embedder.close()
        self._embedders.clear()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session({self.store.url!r}, {self.session_id!r}, tenant={self.tenant!r})"

    # -- reading ----------------------------------------------------------------------------

    @property
    def record(self) -> StoredSession:
        found = self.store.get_session(self.tenant, self.session_id)
        if found is None:
            raise StoreError(f"session {self.session_id!r} disappeared from {self.store.url}")
        return found

    def leading_system(self) -> list[Message]:
        """The system prompts the stored session starts with (read as a build reads its
        pinned messages: from the session's memo once it has them)."""
        record = self.record
        if record.created_at != self._cache_of:
            self._tails.clear()
        read = partial(self.store.pinned, self.tenant, self.session_id)
        found: list[Message] = []
        for i, m in enumerate(self._tails.pinned(record.created_at, record.next_seq, read)):
            if m.seq != i or m.message.role != "system":
                break
            found.append(m.message)
        return found

    @property
    def summary(self) -> str | None:
        return self.record.summary

    @property
    def facts(self) -> Facts:
        """The critical facts, read like a dict (``session.facts["budget"]``)."""
        return self._facts(self.record)

    @staticmethod
    def _facts(record: StoredSession) -> Facts:
        from ctxwarden.memory.facts import Facts

        return Facts.from_json(record.facts)

    @property
    def summary_state(self) -> SummaryState:
        """The summary's tiers: level-one summaries since the last meta-summary, the
        meta-summary, and how many cycles wrote them (``summary`` is their text)."""
        return session_state.summary_state(self.record)

    @property
    def ledger(self) -> LedgerCheckpoint:
        """The entity ledger of the messages before the last build's slice, and the
        ``upto`` seq it covers (this process's copy, else the stored one)."""
        record = self.record
        return current_checkpoint(self.store, self.tenant, self.session_id, record.created_at)

    @property
    def usage(self) -> Usage:
        """Tokens of every model call recorded for this session (all models)."""
        return self.record.total_usage

    @property
    def cost(self) -> float:
        """Dollars of every recorded call, each priced with its own model."""
        return self.record.dollars

    def __len__(self) -> int:
        return self.store.count(self.tenant, self.session_id)

    def messages(self) -> Iterator[Message]:
        """Every message in order, read in batches (never all at once)."""
        for stored in self.store.iter_messages(self.tenant, self.session_id):
            yield stored.message

    def export(self, *, with_meta: bool = False) -> list[dict[str, Any]]:
        """Every message in order as OpenAI dicts (``with_meta`` keeps our metadata)."""
        return [message_to_openai(m, with_meta=with_meta) for m in self.messages()]

    # -- writing ----------------------------------------------------------------------------

    def append(
        self,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        check_pairs: bool = True,
        expect_next: int | None = None,
        also: Callable[[Any, list[int]], object] | None = None,
    ) -> list[int]:
        """Validate, count and store ``messages`` in one transaction; return their seqs.

        Every message is validated before anything is written: one bad message raises
        :class:`~ctxwarden.core.errors.InvalidMessageError` naming its index, and nothing from
        this call is stored. So is what a build would have to reject: a repeated explicit
        id within the call, a tool result with no call right before it, a call the
        conversation moves on from without its results (checked against the stored last
        block, so results may follow their call in a later ``append``). ``check_pairs=False``
        skips the pairing check for a store of raw items that are paired only when read
        (the OpenAI Agents SDK session stores one call per item). ``expect_next``: append
        only if the session still holds that many messages, else raise
        :class:`~ctxwarden.core.errors.VersionConflict` (see :meth:`SessionStore.append`).
        ``also(tx, seqs)`` (the SQL stores only) writes more in the same transaction.
        """
        from ctxwarden.pipeline.inputs import check_messages_argument, check_unique_ids

        parsed = [
            item if isinstance(item, Message) else message_from_openai(item, index=i)
            for i, item in enumerate(check_messages_argument(messages))
        ]
        check_unique_ids(parsed)
        more: dict[str, Any] = {} if also is None else {"also": also}
        if check_pairs:
            where = (self.store, self.tenant, self.session_id, self._cache, self._cache_of)
            more.update(check_appended(*where, parsed, expect_next))
        counter = TokenCounter.for_model(self.model, self.registry)
        key = count_key(counter)
        counts = [{key: counter.count_message(m)} for m in parsed]
        seqs = self.store.append(
            self.tenant, self.session_id, parsed, counts, expect_next=expect_next, **more
        )
        for seq, m, c in list(zip(seqs, parsed, counts, strict=True))[-_CACHE_SIZE:]:
            stored = m.with_id(f"m{seq}") if m.id == "h" + m.fingerprint[:12] else m
            self._cache[seq] = stored  # as the store reads it back
            self._tails.appended(seq, stored, c)
        self._trim_cache()
        return seqs

    def _trim_cache(self) -> None:
        if len(self._cache) > _CACHE_SIZE:  # stored messages never change; keep the newest
            for seq in sorted(self._cache)[: len(self._cache) - _CACHE_SIZE]:
                del self._cache[seq]

    def import_messages(self, messages: Iterable[Mapping[str, Any] | Message]) -> list[int]:
        """Add a whole transcript (OpenAI dicts, ours with metadata too) atomically."""
        return self.append(messages)

    @classmethod
    def import_(
        cls,
        store: str | SessionStore,
        session_id: str,
        messages: Iterable[Mapping[str, Any] | Message],
        **kw: Any,
    ) -> Session:
        """A new session holding ``messages``; refuses to add to a non-empty one."""
        session = cls(store, session_id, **kw)
        if len(session):
            session.close()
            raise StoreError(
                f"session {session_id!r} already has messages; import into a new session id"
            )
        session.import_messages(messages)
        return session

    def record_usage(self, usage: Usage, model: str | None = None) -> Usage:
        """Add one call's usage (priced with ``model``'s prices in the session's registry);
        return the total."""
        name = model or self.model
        dollars = 0.0
        try:
            from ctxwarden.core.registry.cost import estimate_cost

            dollars = estimate_cost(usage, name, self.registry)
        except UnknownModelError:
            pass  # a custom model without prices: tokens still count
        record = self.store.record_usage(
            self.tenant, self.session_id, usage, model=name, dollars=dollars
        )
        return record.total_usage

    # -- build -------------------------------------------------------------------------------

    def context_messages(
        self,
        budget: int,
        model: str | None = None,
        *,
        pin_first: int = 0,
        from_seq: int | None = None,
    ) -> list[StoredMessage]:
        """What a build reads: system and pinned messages, the first ``pin_first``
        conversation messages, and every message from where the build's window starts
        (``from_seq``, the stored window start, when given; see :meth:`_window_region`)
        on, in order; the tail starts on a whole block."""
        return self._slice(budget, model, pin_first, from_seq, self.record)[0]

    def _slice(
        self,
        budget: int,
        model: str | None,
        pin_first: int,
        from_seq: int | None,
        record: StoredSession,
        rules: ToolRules | None = None,
    ) -> tuple[list[StoredMessage], int]:
        """:meth:`context_messages` and the seq its tail starts at (everything older
        that is not in the slice is what the entity ledger must cover)."""
        counter = TokenCounter.for_model(model or self.model, self.registry)
        if record.created_at != self._cache_of:  # deleted and created again, maybe elsewhere
            self._cache.clear()
            self._ledger_memo = None
            self._tails.clear()
            self._cache_of = record.created_at
        merged: dict[int, StoredMessage] = {}
        if pin_first:
            head = self.store.range(self.tenant, self.session_id, 0, pin_first + _HEAD_SLACK)
            merged.update((m.seq, m) for m in head if m.message.role != "system")
            merged = dict(sorted(merged.items())[:pin_first])
        read = partial(self.store.pinned, self.tenant, self.session_id)
        for m in self._tails.pinned(record.created_at, record.next_seq, read):  # as cached
            merged[m.seq] = replace(m, message=self._cache.setdefault(m.seq, m.message))
        begin, walked = self._window_region(record, budget, counter, from_seq)
        key = count_key(counter)
        scope = (record.created_at, begin - 1, _ALL, key)
        tail = self._tails.tail(scope, record.next_seq, begin - 1, _ALL, key, counter.count_message)
        if tail is None and walked and walked[0].seq == begin:
            tail = walked  # (every message from ``begin`` on: the walk read no more)
        if tail is None:
            tail = self.store.tail(
                self.tenant,
                self.session_id,
                _ALL,
                key,
                after_seq=begin - 1,
                count=counter.count_message,
                cache=self._cache,
            )
        self._tails.remember(scope, record.next_seq, tail)
        self._trim_cache()
        while len(tail) > 1 and tail[0].message.role == "tool":
            tail = tail[1:]  # its call is older than the tail: never send an orphan result
        start = tail[0].seq if tail else begin
        if rules is not None and rules.pins:  # the blocks a tool rule pins (session.tool_pins)
            found = self._rule_pins.read(
                self.store, self.tenant, self.session_id, record.created_at, rules, start
            )
            for seq, m in found.items():
                merged.setdefault(seq, replace(m, message=self._cache.setdefault(seq, m.message)))
        return with_tail(merged, tail), start

    def _with_shape(
        self, read: list[StoredMessage], start: int, record: StoredSession
    ) -> tuple[list[StoredMessage], int]:
        """``read`` completed to the newest :data:`~ctxwarden.steps.recall_gate.SHAPE_READ`
        stored messages, contiguous, and the new start: what the recall gate reads the
        conversation's shape from, as ``build_context`` reads it from the whole history
        (before the build, :func:`~ctxwarden.steps.recall_gate.recall_reads_back`, and in
        it, where the build reads these too when its slice alone reads otherwise). A
        slice shorter than that (a tight budget, or a summary that folds all but a few
        messages) is completed from the messages before it, those a summary folds
        included, read once (:class:`ReadBack`); pinned messages read ahead of the slice
        do not count."""
        # (``read`` is in seq order: those from ``start`` on are its last ones)
        need = SHAPE_READ - (len(read) - bisect_left(read, start, key=_SEQ))
        if need <= 0:
            return read, start
        lo = max(0, start - need)
        return self._read_before(self._shape_back, read, start, lo, record.created_at)

    def _with_older(
        self, read: list[StoredMessage], start: int, lookback: int, created_at: float
    ) -> tuple[list[StoredMessage], int]:
        """``read`` with the ``lookback`` messages before ``start`` (the relevance
        recall's sources: :func:`~ctxwarden.steps.recall_gate.recall_reads_back`), in
        seq order, and the new start."""
        lo = max(0, start - lookback)
        return self._read_before(self._read_back, read, start, lo, created_at)

    def _read_before(
        self, memo: ReadBack, read: list[StoredMessage], start: int, lo: int, created_at: float
    ) -> tuple[list[StoredMessage], int]:
        """``read`` with the stored messages ``lo <= seq < start`` (read through
        ``memo``, once), in seq order, and the new start ``lo``."""
        if lo >= start:
            return read, start
        before = memo.rows(self.store, self.tenant, self.session_id, created_at, lo, start)
        if not read or read[0].seq >= start:  # (both in seq order, ``before`` all older)
            return [*before, *read], lo
        merged = {m.seq: m for m in before}
        merged.update((m.seq, m) for m in read)
        return [merged[seq] for seq in sorted(merged)], lo

    def _task_of(self, record: StoredSession) -> StoredMessage | None:
        """The agent run's task as stored (:mod:`.task_read`), its message the one this
        session's cache holds."""
        found = self._task_read.task(
            self.store, self.tenant, self.session_id, record.created_at, record.next_seq
        )
        if found is None:
            return None
        return replace(found, message=self._cache.setdefault(found.seq, found.message))

    def _window_region(
        self, record: StoredSession, budget: int, counter: TokenCounter, from_seq: int | None
    ) -> tuple[int, list[StoredMessage] | None]:
        """The seq from which a build must read every message: where the engine's window
        over the whole history would start — the sticky start (``from_seq``) or, cold,
        where the engine's walk back from the newest message stops (:data:`COLD_REACH`),
        never before the summary's end unless the sticky start is (a held summary keeps
        the window's start until the next compaction) — and no later than the last
        :data:`RECENT_USERS` user messages (the newest is always kept; the facts layer
        reads both). Once there is a summary, every message it does not cover: its view
        fills what they leave (:func:`~ctxwarden.steps.layers.fill_room`), and the
        summary trigger bounds them. Pinned and first messages are read on their own.
        Which messages of the window fit is decided by the build from their sizes after
        truncation and masking; the session reads them all, so it never holds less than
        the build over the full history would keep. Also returns the cold walk's
        messages, when it walked."""
        floor = record.summary_upto + 1
        walk: list[StoredMessage] | None = None
        if record.summary_upto >= 0:
            begin = floor  # a summary's view fills what the messages it does not cover leave
            if from_seq is not None:  # a held summary keeps the window's start until the
                begin = min(begin, from_seq)  # next compaction (steps.layers.held_layers)
        elif from_seq is not None:
            begin = max(floor, from_seq)
        else:
            walk = self.store.tail(
                self.tenant,
                self.session_id,
                COLD_REACH * budget,
                count_key(counter),
                after_seq=record.summary_upto,
                count=counter.count_message,
                cache=self._cache,
                cap=budget,
            )
            begin = walk[0].seq if walk else floor
        read = partial(self._read_newest_users, RECENT_USERS)
        users = self._tails.newest_users(record.created_at, record.next_seq, RECENT_USERS, read)
        return (min(begin, users[0]) if users else begin), walk

    def _read_newest_users(self, n: int) -> list[int]:
        store, tenant, sid = self.store, self.tenant, self.session_id
        if isinstance(store, SqlStore):
            return store.newest_users(tenant, sid, n)
        end, page, found = store.count(tenant, sid), 64, list[int]()
        while end > 0 and len(found) < n:  # pages back from the end, newest first
            rows = store.range(tenant, sid, max(0, end - page), end)
            found += [m.seq for m in reversed(rows) if m.message.role == "user"]
            end, page = end - page, page * 2
        return sorted(found[:n])

    def _ledger_before(
        self, record: StoredSession, start: int, skip: Container[int], read_back: int
    ) -> tuple[LedgerCheckpoint, tuple[str, ...]]:
        """The entity-ledger checkpoint advanced to cover the messages before ``start``
        that the slice does not hold (seeded from the last ``ledger_backfill`` when it
        lags further behind; see :mod:`ctxwarden.store.ledger_checkpoint`), and the
        warnings for the build's audit (a damaged stored ledger, skipped messages).

        ``read_back`` is how far before its slice a build of this policy may read (the
        relevance recall's ``lookback``): a built session whose earlier builds read that
        far back, and whose ledger therefore stopped there, covers the whole gap when this
        build does not (a chat that turned into an agent loop); those messages were read
        by a build, they are not an import to seed from its newest ones."""
        ckpt, damage = load_checkpoint(
            self.store, self.tenant, self.session_id, record.created_at, needed_upto=start - 1
        )
        built_before = "window_start_seq" in record.sticky and damage is None
        advanced = ckpt.advance(
            self.store,
            self.tenant,
            self.session_id,
            start,
            skip,
            self._cache,
            backfill=self.ledger_backfill + (read_back if built_before else 0),
        )
        return advanced, ledger_warnings(ckpt, advanced, damage)

    def build(
        self, model: str | None = None, policy: Policy | None = None, **kw: Any
    ) -> BuiltContext:
        """:meth:`build_unlogged` (same arguments), its log written at once."""
        pending = self.build_unlogged(model, policy, **kw)
        pending.log()
        return pending.built

    @traced(BUILD_SPAN, pending_attributes)
    def build_unlogged(
        self,
        model: str | None = None,
        policy: Policy | None = None,
        *,
        summarizer: str | _SummarizerLike | None = None,
        build_id: str | None = None,
        status: str = "built",
        amend: Callable[[BuiltContext], BuiltContext] | None = None,
        **kw: Any,
    ) -> PendingLog:
        """Build the context as :func:`ctxwarden.build_context` does, reading only what
        can fit, and keep the build's sticky decisions for the next one. The build's
        audit is logged in the store as the session's next turn, under ``build_id``
        (default: a new one) with ``status`` (see :mod:`ctxwarden.session.build_log`)
        and the sticky decisions, by the returned :class:`PendingLog`'s ``log()``; until
        then (or if never) the store holds the session as before this build. ``amend``
        has the last word on the built context before it is logged (the proxy adds the
        warning of a summary it could not enqueue).

        The engine's state counts positions in the list it was given; the session keeps
        them as sequence numbers (``window_start_seq``, ``last_seq``) and translates them
        into positions of this build's list, so the window stays sticky although each
        build sees a different slice of the history. The entity ledger of what lies
        before the slice comes in as ``earlier_entities`` and is saved, advanced, with
        the sticky decisions. The first build of a session filled without builds (an
        import, or one stored before the ledger was) seeds it from the last
        ``ledger_backfill`` messages before the slice, and its audit warns what it
        skipped; a stored ledger that cannot be read back is rebuilt, with a warning.

        The stored summary is shown as ``build_context`` shows its own: with a
        ``summarizer`` (this one, else the session's) that can focus, such as the
        offline one (or its spec ``"offline"``), the part most relevant to the newest
        user message, within ``policy.summary.summary_share`` of the budget or, without
        a share, in what the rest of the context leaves; otherwise as written. Nothing is
        summarised here: :meth:`summarize` writes the summary.
        """
        from ctxwarden.pipeline.engine import model_info, run_build
        from ctxwarden.pipeline.policy import Policy as PolicyClass
        from ctxwarden.pipeline.summarize import summary_viewer

        check_build_options(model, policy, kw, session=True, summarizer=summarizer)
        model = model or self.model
        policy = policy if policy is not None else (self.policy or PolicyClass())
        info = model_info(model, self.registry)
        budget = policy.budget_for(
            info.context_window if info else None, kw.get("max_input_tokens")
        )
        record = self.record
        warm = record.sticky.get("window_start_seq")
        read, start = self._slice(
            budget,
            model,
            policy.window.pin_first,
            int(warm) if warm is not None else None,
            record,
            policy.tools,
        )
        recall = policy.recall
        if recall is not None:
            shaped, shape_start = self._with_shape(read, start, record)
            if recall_reads_back(recall, [m.message for m in shaped if m.seq >= shape_start]):
                read, start = self._with_older(
                    shaped, shape_start, recall.lookback, record.created_at
                )
            elif recall.auto and _chat_shaped(shaped) != _chat_shaped(read):
                # the slice alone would read as another shape in the build than the newest
                # messages do (in build_context, over the whole history): build over both
                read, start = shaped, shape_start
        task = self._task_of(record) if policy.window.task_share else None
        if task is not None and not any(m.seq == task.seq for m in read):
            read = sorted([*read, task], key=_SEQ)  # the agent's task stays (steps.task)
        seqs = [m.seq for m in read]
        history = [m.message for m in read]
        ckpt: LedgerCheckpoint | None = None
        notes: tuple[str, ...] = ()
        if policy.ledger.enabled:
            read_back = recall.lookback if recall is not None else 0
            ckpt, notes = self._ledger_before(record, start, frozenset(seqs), read_back)
        vectors, vector_notes = None, tuple[str, ...]()
        recall = policy.recall
        if recall is not None and recall.embeddings is not None:
            from ctxwarden.session.vectors import vectors_for_build

            # the query's vector, if new, is computed here, before the build; the messages
            # most like it that the slice does not hold are read too (see session.vectors)
            vectors, extra, vector_notes = vectors_for_build(
                self, recall.embeddings, read, start, recall.lookback
            )
            if extra:
                read = sorted([*read, *extra], key=lambda m: m.seq)
                seqs = [m.seq for m in read]
                history = [m.message for m in read]
        layers = session_state.layers_for(record, history, seqs)
        previous = session_state.state_for(record.sticky, seqs, self._saved)
        if previous is not None and self._ledger_memo is not None:
            previous = self._ledger_memo.for_slice(previous, seqs)
        built = run_build(
            history,
            model=model,
            budget=budget,
            policy=policy,
            counter=TokenCounter.for_model(model, self.registry),
            state=previous if previous is not None else BuildState(),
            info=info,
            layer_state=layers,
            summarizer=summary_viewer(
                summarizer if summarizer is not None else self.summarizer, layers.summary
            ),
            earlier=ckpt.ledger if ckpt is not None and len(ckpt.ledger) else None,
            tools=kw.get("tools"),
            pre=((), (*notes, *vector_notes)),
            vectors=vectors,
            task_id=task.message.id if task is not None else None,
        )
        self._ledger_memo = SeqMemo.of(built.state, seqs)
        ahead = ckpt.upto - ckpt.saved if ckpt is not None else 0  # (LEDGER_SAVE_EVERY)
        save = ckpt is not None and ahead > 0 and (ckpt.saved < 0 or ahead >= LEDGER_SAVE_EVERY)
        saved = session_state.SavedState.of(built.state, seqs)
        ledger = ckpt.encode() if save and ckpt is not None else None
        if amend is not None:
            built = amend(built)
        counter = TokenCounter.for_model(model, self.registry)
        build_id, scope = build_id or uuid.uuid4().hex, record.created_at

        def write() -> None:
            log_build(self, built, read, start, counter=counter, build_id=build_id,
                      status=status, sticky=saved.sticky, ledger=ledger, memo=self._logged,
                      scope=scope)  # fmt: skip
            self._saved = saved
            if ckpt is not None:
                kept = replace(ckpt, saved=ckpt.upto) if save else ckpt
                remember_checkpoint(self.store, self.tenant, self.session_id, scope, kept)

        return PendingLog(built, build_id, write)

    def forget_sent(self) -> None:
        """The last build's context got no answer (its call failed upstream): the provider
        cached nothing of it, so the next build must not hold it as sent. Its sticky
        decisions stay; what cache-aware compaction holds (the context's digests, the
        drops inside the window) is cleared, so the next build is built as it would be
        after no call at all (:mod:`ctxwarden.pipeline.compaction`). Only the build this
        process logged last is cleared: one a replica logged since is left alone."""
        saved = self._saved
        if saved is None or not saved.sticky.get("prefix"):
            return
        if dict(self.record.sticky) != dict(saved.sticky):
            return  # another build was logged meanwhile: its context is the one sent
        self._saved = session_state.SavedState.forgotten(saved)
        self.store.save_sticky(self.tenant, self.session_id, self._saved.sticky)

    # -- embedding recall -------------------------------------------------------------------

    def embedder(self, spec: str) -> Embedder:
        """This session's client for an embeddings spec (made on first use)."""
        from ctxwarden.llm.embeddings import Embedder

        found = self._embedders.get(spec)
        if found is None:
            found = self._embedders[spec] = Embedder(spec)
        return found

    def embed(
        self, embeddings: str | Embedder | None = None, *, upto_seq: int | None = None
    ) -> int:
        """Compute and store the embedding vectors this session's messages lack (see
        :mod:`ctxwarden.session.vectors`): ``embeddings`` is a spec (or a client made
        for one), default the policy's ``[recall] embeddings``; ``upto_seq`` stops at
        that message. Each message is
        embedded once; returns how many were now. A failing endpoint raises
        :class:`~ctxwarden.core.errors.ProviderError` naming it; what was stored stays."""
        from ctxwarden.llm.embeddings import Embedder, check_embeddings_spec
        from ctxwarden.session.vectors import embed_missing

        if isinstance(embeddings, Embedder):
            return embed_missing(self, embeddings, upto_seq=upto_seq)
        if embeddings is None:
            recall = getattr(self.policy, "recall", None)
            embeddings = getattr(recall, "embeddings", None)
        if embeddings is None:
            raise ConfigError(
                "no embeddings spec: pass one to embed(), or set [recall] embeddings in the "
                "session's policy"
            )
        check_embeddings_spec(embeddings)
        return embed_missing(self, self.embedder(embeddings), upto_seq=upto_seq)

    # -- recall -------------------------------------------------------------------------------

    def recall(self, handle: str) -> Recalled:
        """The stored message a handle (``cw:msg:<id>``) names, with its original content
        byte for byte (:mod:`ctxwarden.session.recall`), and the recall recorded in the session's
        audit trail (a ``recalled`` row of the builds listing, on the SQL stores).

        A store-given id (``m<seq>``) is one indexed read; an explicit id of your own is
        looked up by reading the messages in batches. An unknown handle raises
        :class:`~ctxwarden.core.errors.UnknownHandleError` and records nothing.
        """
        from ctxwarden.session.recall import audit_recall, find_stored, recalled

        seq, message = find_stored(self.store, self.tenant, self.session_id, handle)
        found = recalled(message, self.model, seq)
        audit_recall(self.store, self.tenant, self.session_id, found)
        return found

    # -- summarisation cycle ----------------------------------------------------------------

    @traced_async(SUMMARIZE_SPAN, summary_write_attributes)
    async def summarize(
        self,
        summarizer: str | _SummarizerLike | None = None,
        extractor: _ExtractorLike | None = None,
        *,
        trigger: SummaryTrigger | None = None,
        schema: FactSchema = None,
        max_messages: int = 2000,
        retries: int = 3,
        window: int | None = None,
        max_input_tokens: int | None = None,
        policy: Policy | None = None,
        summarizer_timeout: float | None = None,
    ) -> SummaryWrite | None:
        """Fold the unsummarised messages into the summary and keep the facts current
        (three steps, see the module docstring): the same cycle as
        :func:`ctxwarden.summarize_history`, so a session summarised and then built shows
        what ``build_context(messages, summarizer=...)`` shows. ``summarizer`` is a spec
        (``"offline"``, ``"openai:gpt-4o-mini"``; ``summarizer_timeout``: seconds for its
        client) or an object, default the session's. ``trigger`` defaults to the policy's
        (``policy`` or the session's); the fill ratio is measured against ``window`` (or
        ``max_input_tokens``), default the budget a build of the session's model gets.
        Returns ``None`` when nothing changed (no trigger fired and no new fact).

        A failing model raises :class:`SummarizationError` and changes nothing; losing
        the version race ``retries`` times in a row raises :class:`VersionConflict`.
        """
        from ctxwarden.pipeline.engine import _as_sent, model_info
        from ctxwarden.pipeline.policy import Policy as PolicyClass
        from ctxwarden.pipeline.summarize import resolve_summarizer

        summarizer = summarizer if summarizer is not None else self.summarizer
        check_summarize_arguments(summarizer, policy, schema, window, max_input_tokens)
        if summarizer is None:
            raise ConfigError(
                "no summariser: pass one to summarize(), or to Session(..., summarizer=...)"
            )
        if not isinstance(summarizer, str) and not callable(getattr(summarizer, "merge", None)):
            raise ConfigError(
                f"{type(summarizer).__name__} has no merge(summaries): a session summariser "
                "also writes the meta-summary (see ctxwarden.summarize.Summarizer)"
            )
        policy = policy if policy is not None else (self.policy or PolicyClass())
        trigger = trigger or policy.summary
        if window is None:
            info = model_info(self.model, self.registry)
            window = policy.budget_for(info.context_window if info else None, max_input_tokens)
        counter = TokenCounter.for_model(self.model, self.registry)
        store = window  # the offline summariser keeps one budget; builds show a view
        chosen, extract_with, free = resolve_summarizer(
            summarizer,
            schema,
            store_tokens=store,
            timeout=summarizer_timeout,
        )
        if extractor is not None:
            extract_with, free = extractor, False
        count = _as_sent(counter, replace(policy, summary=trigger))
        rest = (trigger, count, window, schema, max_messages, retries)
        return await summary_cycle(self, (chosen, extract_with, free), *rest)

    def summarize_sync(
        self,
        summarizer: str | _SummarizerLike | None = None,
        extractor: _ExtractorLike | None = None,
        **kw: Any,
    ) -> SummaryWrite | None:
        """:meth:`summarize` for callers without an event loop."""
        return asyncio.run(self.summarize(summarizer, extractor, **kw))


def _chat_shaped(read: Sequence[StoredMessage]) -> bool:
    """The recall gate's shape of a build over ``read`` (as the build will read it)."""
    history = [m.message for m in read]
    return history_chat_shaped(history, leading_system(history))
