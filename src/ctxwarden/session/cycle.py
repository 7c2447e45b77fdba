"""A session's summary cycle in three steps (R13): short read, model call, short write.

Read what to fold in one short read transaction, call the model with **no transaction
and no connection held** (the store's connection is released first), then write summary
and facts in one short transaction guarded by the session's version; a lost race
re-reads and retries. The model step is :func:`ctxwarden.pipeline.summarize.summarize_history`,
the same as the in-memory cycle, so a session summarised and built sends what
``build_context(messages, summarizer=...)`` sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import SummarizationError, VersionConflict
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.session.handle import SessionHandle
from ctxwarden.store import StoredSession

if TYPE_CHECKING:
    from ctxwarden.memory.facts import FactSchema
    from ctxwarden.memory.summaries import SummaryTrigger

__all__ = ["SummaryWrite", "summary_cycle"]


@dataclass(frozen=True)
class SummaryWrite:
    """One completed cycle: the session as written, what was folded, and the attempts.

    ``meta`` says the level-one summaries were folded into a new meta-summary; ``error``
    says why that step failed (the level-one summary was written all the same, and the
    next cycle tries the meta-summary again)."""

    session: StoredSession
    folded: int
    covered_up_to_seq: int
    attempts: int
    usage: Usage
    meta: bool = False
    error: str | None = None


async def summary_cycle(
    session: SessionHandle,
    resolved: tuple[Any, Any, bool],
    trigger: SummaryTrigger,
    count: Callable[[Message], int],
    window: int | None,
    schema: FactSchema,
    max_messages: int,
    retries: int,
) -> SummaryWrite | None:
    """One cycle for ``session`` (see the module docstring); ``None`` when nothing
    changed."""
    from ctxwarden.memory.facts import Facts
    from ctxwarden.memory.layer_state import LayerState
    from ctxwarden.pipeline.summarize import summarize_history
    from ctxwarden.session import rows as session_state

    chosen = resolved[0]
    usage = Usage(calls=0)
    for attempt in range(1, retries + 2):
        # 1. read: one short read transaction
        batch = session.store.read_for_summary(
            session.tenant, session.session_id, max_messages=max_messages
        )
        if not batch.messages:
            return None
        record = batch.session
        seen_seq = int(record.summary_levels.get("seen_seq", -1)) if record.summary_levels else -1
        # the system prompt and pinned messages the summary never folds, though older than
        # what it covers: the fill ratio counts them, as it does over a whole history
        held = [
            m.message
            for m in session.store.pinned(session.tenant, session.session_id)
            if m.seq <= record.summary_upto
        ]
        seen = len(held) + sum(1 for s in batch.messages if s.seq <= seen_seq)
        facts = Facts.from_json(record.facts)
        previous = LayerState(session_state.summary_state(record), facts, 0, seen)
        # 2. the model: no transaction, and no connection held while it thinks
        session.store.release()
        update = await summarize_history(
            [*held, *(m.message for m in batch.messages)],
            previous,
            summarizer=chosen,
            trigger=trigger,
            count=count,
            window=window,
            schema=schema,
            resolved=resolved,
        )
        if update.usage.calls:
            usage = usage + update.usage
            session.record_usage(update.usage, _model_name(chosen))
        if update.error is not None and not update.folded:
            raise SummarizationError(f"summarisation failed, nothing changed: {update.error}")
        new = update.state
        if not update.folded and new.facts.to_json() == facts.to_json():
            return None
        folded_ids = {m.id for m in update.folded}
        covered = max(
            (s.seq for s in batch.messages if s.message.id in folded_ids),
            default=record.summary_upto,
        )
        # 3. write: one short transaction, only if nobody wrote since step 1
        try:
            written = session.store.write_summary(
                session.tenant,
                session.session_id,
                expected_version=record.version,
                summary=new.summary.text or None,
                facts=new.facts.to_json(),
                covered_up_to_seq=covered,
                levels=session_state.levels_of(new.summary, batch.messages[-1].seq),
            )
        except VersionConflict:
            if attempt > retries:
                raise
            continue
        return SummaryWrite(
            written, len(update.folded), covered, attempt, usage, update.meta, update.error
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _model_name(summarizer: Any) -> str:
    """The name usage is priced under: the summariser's model when it says, else a label."""
    model = getattr(summarizer, "model", None)
    name = getattr(model, "name", model)
    return name if isinstance(name, str) and name else "summarizer"
