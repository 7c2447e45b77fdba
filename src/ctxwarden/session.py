"""A conversation that outlives the process: messages, summary and facts in a store (R13).

:class:`Session` is the user-facing object over a :class:`~ctxwarden.store.SessionStore`::

    with Session("sqlite:///agent.db", "chat-42") as s:
        s.append([{"role": "user", "content": "hi"}])
        built = s.build(model="gpt-4o", max_input_tokens=2000)

``build`` has the contract of :func:`ctxwarden.build_context` but reads only what can end
up in the context — pinned messages, the newest tail that can fit (by the token counts
stored at insert), the summary, the facts and the previous build's sticky decisions — so
it costs the same at 100 and 100,000 messages.

:meth:`Session.summarize` is seed 000's cycle in three steps, and the order matters:
read what to fold (one short read transaction), call the model with **no transaction and
no connection held** (the store's connection is released first), then write summary and
facts in one short transaction guarded by the session's version. If another writer won
the race, the cycle re-reads (now starting after the other summary, which becomes the
``previous`` one to merge) and retries. Messages appended meanwhile are not touched: they
lie after the folded range and fall into the next cycle.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .errors import (
    CtxwardenError,
    StoreError,
    SummarizationError,
    UnknownModelError,
    VersionConflict,
)
from .formats.openai import message_from_openai, message_to_openai
from .messages import Message
from .store import SessionStore, StoredMessage, StoredSession, open_store
from .tokens import TokenCounter
from .usage import Usage

if TYPE_CHECKING:
    from .audit import BuildState
    from .engine import BuiltContext
    from .facts import Facts, FactSchema
    from .policy import Policy
    from .summarize import SummaryTrigger

__all__ = ["Session", "SummaryWrite", "count_key"]

_HEAD_SLACK = 8  # system messages that may precede the first pinned conversation messages
_CACHE_SIZE = 20_000
TAIL_SLACK = 3
"""The tail is read up to this many budgets of raw tokens: truncation and masking can make
more messages fit than raw counts say, and a cold engine build walks back three budgets
to place its window; still bounded by the budget, never by the history."""


class _SummarizerLike(Protocol):
    async def summarize(self, messages: Sequence[Message], previous: str | None = None) -> Any: ...


class _ExtractorLike(Protocol):
    async def extract(
        self, messages: Sequence[Message], existing: Any, schema: Any = None
    ) -> Any: ...


@dataclass(frozen=True)
class SummaryWrite:
    """One completed cycle: the session as written, what was folded, and the attempts."""

    session: StoredSession
    folded: int
    covered_up_to_seq: int
    attempts: int
    usage: Usage


def count_key(counter: TokenCounter) -> str:
    """The key under which a counter's per-message counts are stored: the encoding for
    exact counts, plus the family and factor for estimates (they differ per model)."""
    if counter.factor == 1.0:
        return counter.encoding_name
    return f"{counter.encoding_name}~{counter.family}x{counter.factor:g}"


class Session:
    """A stored conversation; see the module docstring. Close it (or use ``with``)."""

    def __init__(
        self,
        store: str | SessionStore,
        session_id: str,
        *,
        tenant: str = "default",
        model: str = "gpt-4o",
        policy: Any = None,
        **store_options: Any,
    ) -> None:
        self._owns_store = isinstance(store, str)
        self.store: SessionStore = (
            open_store(store, **store_options) if isinstance(store, str) else store
        )
        self.session_id = session_id
        self.tenant = tenant
        self.model = model
        self.policy = policy
        self._cache: dict[int, Message] = {}  # seq -> decoded message, reused across builds
        try:
            self.store.create_session(tenant, session_id)
        except BaseException:
            self.close()
            raise

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store's connections if this session opened the store."""
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

    @property
    def summary(self) -> str | None:
        return self.record.summary

    @property
    def facts(self) -> Facts:
        """The critical facts, read like a dict (``session.facts["budget"]``)."""
        from .facts import Facts

        return Facts.from_json(self.record.facts)

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

    def append(self, messages: Iterable[Mapping[str, Any] | Message]) -> list[int]:
        """Validate, count and store ``messages`` in one transaction; return their seqs.

        Every message is validated before anything is written: one bad message raises
        :class:`~ctxwarden.errors.InvalidMessageError` naming its index, and nothing from
        this call is stored.
        """
        parsed = [
            item if isinstance(item, Message) else message_from_openai(item, index=i)
            for i, item in enumerate(messages)
        ]
        counter = TokenCounter.for_model(self.model)
        key = count_key(counter)
        counts = [{key: counter.count_message(m)} for m in parsed]
        return self.store.append(self.tenant, self.session_id, parsed, counts)

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
        """Add one call's usage (priced with ``model``'s registry prices); return the total."""
        name = model or self.model
        dollars = 0.0
        try:
            from .cost import estimate_cost

            dollars = estimate_cost(usage, name)
        except UnknownModelError:
            pass  # a custom model without prices: tokens still count
        record = self.store.record_usage(
            self.tenant, self.session_id, usage, model=name, dollars=dollars
        )
        return record.total_usage

    # -- build -------------------------------------------------------------------------------

    def context_messages(
        self, budget: int, model: str | None = None, *, pin_first: int = 0
    ) -> list[StoredMessage]:
        """What a build reads: system and pinned messages, the first ``pin_first``
        conversation messages, and the unsummarised tail that can fit (``TAIL_SLACK``
        budgets of raw tokens), in order; the tail starts on a whole block."""
        counter = TokenCounter.for_model(model or self.model)
        record = self.record
        merged: dict[int, StoredMessage] = {}
        if pin_first:
            head = self.store.range(self.tenant, self.session_id, 0, pin_first + _HEAD_SLACK)
            merged.update((m.seq, m) for m in head if m.message.role != "system")
            merged = dict(sorted(merged.items())[:pin_first])
        merged.update((m.seq, m) for m in self.store.pinned(self.tenant, self.session_id))
        tail = self.store.tail(
            self.tenant,
            self.session_id,
            budget * TAIL_SLACK,
            count_key(counter),
            after_seq=record.summary_upto,
            count=counter.count_message,
            cache=self._cache,
        )
        if len(self._cache) > _CACHE_SIZE:  # stored messages never change; keep the newest
            for seq in sorted(self._cache)[: len(self._cache) - _CACHE_SIZE]:
                del self._cache[seq]
        while len(tail) > 1 and tail[0].message.role == "tool":
            tail = tail[1:]  # its call is older than the tail: never send an orphan result
        merged.update((m.seq, m) for m in tail)
        return [merged[seq] for seq in sorted(merged)]

    def build(
        self, model: str | None = None, policy: Policy | None = None, **kw: Any
    ) -> BuiltContext:
        """Build the context as :func:`ctxwarden.build_context` does, reading only what
        can fit, and keep the build's sticky decisions for the next one.

        The engine's state counts positions in the list it was given; the session keeps
        them as sequence numbers (``window_start_seq``, ``last_seq``) and translates them
        into positions of this build's list, so the window stays sticky although each
        build sees a different slice of the history.
        """
        from .engine import build_context
        from .policy import Policy as PolicyClass
        from .registry import get_model

        model = model or self.model
        policy = policy if policy is not None else (self.policy or PolicyClass())
        try:
            window: int | None = get_model(model).context_window
        except UnknownModelError:
            window = None
        budget = policy.budget_for(window, kw.get("max_input_tokens"))
        record = self.record
        stored = self.context_messages(budget, model, pin_first=policy.window.pin_first)
        seqs = [m.seq for m in stored]
        facts = self.facts.render() if record.facts else ""
        built = build_context(
            [m.message for m in stored],
            model=model,
            policy=policy,
            previous=_state_for(record.sticky, seqs),
            summary=record.summary,
            facts=facts or None,
            **kw,
        )
        self.store.save_sticky(self.tenant, self.session_id, _sticky_from(built.state, seqs))
        return built

    # -- summarisation cycle ----------------------------------------------------------------

    async def summarize(
        self,
        summarizer: _SummarizerLike,
        extractor: _ExtractorLike | None = None,
        *,
        trigger: SummaryTrigger | None = None,
        schema: FactSchema = None,
        max_messages: int = 2000,
        retries: int = 3,
    ) -> SummaryWrite | None:
        """Fold the unsummarised messages into the summary and facts (three steps, see
        the module docstring). Returns ``None`` when no trigger fires.

        A failing model raises :class:`SummarizationError` and changes nothing; losing
        the version race ``retries`` times in a row raises :class:`VersionConflict`.
        """
        from .facts import Facts
        from .summarize import SummaryTrigger, plan_summary

        trigger = trigger or SummaryTrigger()
        counter = TokenCounter.for_model(self.model)
        usage = Usage(calls=0)
        for attempt in range(1, retries + 2):
            # 1. read: one short read transaction
            batch = self.store.read_for_summary(
                self.tenant, self.session_id, max_messages=max_messages
            )
            messages = [m.message for m in batch.messages]
            plan = plan_summary(messages, trigger, counter.count_message) if messages else None
            if plan is None:
                return None
            folded_ids = {m.id for m in plan.fold}
            covered = max(s.seq for s in batch.messages if s.message.id in folded_ids)
            # 2. the model: no transaction, and no connection held while it thinks
            self.store.release()
            existing = Facts.from_json(batch.session.facts)
            try:
                facts = existing
                if extractor is not None:
                    facts = await extractor.extract(plan.fold, existing, schema)
                result = await summarizer.summarize(plan.fold, batch.session.summary)
            except (CtxwardenError, TimeoutError) as exc:
                raise SummarizationError(f"summarisation failed, nothing changed: {exc}") from exc
            text = getattr(result, "text", None)
            if not isinstance(text, str) or not text.strip():
                raise SummarizationError("the summariser returned no text; nothing changed")
            call_usage = getattr(result, "usage", None)
            if isinstance(call_usage, Usage) and call_usage.calls:
                usage = usage + call_usage
                self.record_usage(call_usage, getattr(result, "model", None) or "summarizer")
            # 3. write: one short transaction, only if nobody wrote since step 1
            try:
                written = self.store.write_summary(
                    self.tenant,
                    self.session_id,
                    expected_version=batch.session.version,
                    summary=text,
                    facts=facts.to_json() if isinstance(facts, Facts) else dict(facts),
                    covered_up_to_seq=covered,
                )
            except VersionConflict:
                if attempt > retries:
                    raise
                continue
            return SummaryWrite(written, len(plan.fold), covered, attempt, usage)
        raise AssertionError("unreachable")  # pragma: no cover

    def summarize_sync(
        self, summarizer: _SummarizerLike, extractor: _ExtractorLike | None = None, **kw: Any
    ) -> SummaryWrite | None:
        """:meth:`summarize` for callers without an event loop."""
        return asyncio.run(self.summarize(summarizer, extractor, **kw))


def _sticky_from(state: BuildState, seqs: Sequence[int]) -> dict[str, Any]:
    """The engine state with its positions turned into sequence numbers."""
    data = state.to_dict()
    if state.history_length:
        data["last_seq"] = seqs[state.history_length - 1]
        data["window_start_seq"] = seqs[min(state.window_start, len(seqs) - 1)]
    return data


def _state_for(sticky: Mapping[str, Any], seqs: Sequence[int]) -> BuildState | None:
    """The stored state with its sequence numbers turned into positions of ``seqs``;
    ``None`` (a cold build) when the last build's newest message is not in this slice."""
    from .audit import BuildState

    last_seq = sticky.get("last_seq")
    if last_seq is None:
        return None
    at = bisect.bisect_left(seqs, last_seq)
    if at == len(seqs) or seqs[at] != last_seq:
        return None
    state = BuildState.from_dict(sticky)
    start = bisect.bisect_left(seqs, int(sticky.get("window_start_seq", 0)))
    return replace(state, history_length=at + 1, window_start=min(start, at))
