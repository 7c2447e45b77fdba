"""What the three adapters share: stable ids, the builder that keeps each conversation's
previous build, and the split of a built context into its system prefix and the rest.

Adapters are idempotent: a framework may hand an adapter's output back as the next
turn's history (pydantic-ai's plain history processor does; a user may with any
framework). The builder takes the layers an earlier build left in it out first
(:func:`~ctxwarden.pipeline.carried.strip_layers`) and shows what they said again, each in
its one place: built again, a built context is that context, and layers are replaced,
never stacked.

Frameworks call an adapter once per model call with the whole history, and one adapter
instance often serves many conversations (one middleware per agent, many threads). The
builder therefore keeps the last build per conversation, keyed by the id of the first
non-system message, so ``previous=`` always belongs to the history being built and the
window, masks and truncations stay sticky turn after turn.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxwarden import BuiltContext, build_context
from ctxwarden.core.errors import UsageError
from ctxwarden.core.messages import Message
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summaries import SummaryState
from ctxwarden.pipeline.carried import Carried, strip_layers
from ctxwarden.steps.fold import FOLD_SEPARATOR

if TYPE_CHECKING:
    from ctxwarden import Audit, Policy, Session, Summarizer

__all__ = ["FOLD_SEPARATOR", "ContextBuilder", "layer_text", "split_system", "stable_id"]

LAYER_ID_PREFIX = "ctxwarden:"
_KEEP_CONVERSATIONS = 256


def stable_id(prefix: str, index: int, payload: Any) -> str:
    """An id for a framework message that has none: its position and a hash of it, so it
    is the same on every call (the history only grows) and differs between conversations."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return f"{prefix}{index}-{hashlib.sha1(text.encode('utf-8')).hexdigest()[:10]}"


def split_system(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """The leading system messages (prompt, then ctxwarden's layers), with the system
    layers the layout put later (after the task, :mod:`ctxwarden.steps.layout`), and the
    rest: for a framework that takes one system prompt, every layer folds into it."""
    i = 0
    while i < len(messages) and messages[i].role == "system":
        i += 1
    later = [m for m in messages[i:] if m.role == "system" and is_layer(m)]
    if not later:
        return list(messages[:i]), list(messages[i:])
    moved = {id(m) for m in later}
    return [*messages[:i], *later], [m for m in messages[i:] if id(m) not in moved]


def is_layer(message: Message) -> bool:
    """A message ctxwarden added (facts, summary, ledger): not from the framework."""
    return message.id.startswith(LAYER_ID_PREFIX)


def carried_options(
    carried: Carried, summarizer: object, previous: BuiltContext | None
) -> dict[str, Any]:
    """The ``build_context`` arguments that show ``carried`` layers again: the facts and
    summary as layer texts, the ledger's values as the ledger of messages the history no
    longer holds. With a summariser (and no summary state of this conversation's yet) a
    carried summary is the previous summary its next cycle merges."""
    options: dict[str, Any] = {
        "facts": carried.facts,
        "earlier_entities": carried.earlier_entities(),
    }
    if carried.summary is None:
        return options
    state = previous.state.layers if previous is not None else None
    if summarizer is not None and (state is None or not state.summary.text):
        body = carried.summary.split("\n", 1)[1] if "\n" in carried.summary else ""
        options["layers"] = LayerState(summary=SummaryState(summaries=(body,)))
    else:
        options["summary"] = carried.summary
    return options


def layer_text(messages: Sequence[Message]) -> str:
    """The texts of ctxwarden's layer messages, in order, for a framework that takes one
    system prompt (they are placed right after it, where the layout puts them)."""
    return FOLD_SEPARATOR.join(m.text for m in messages if is_layer(m) and m.text)


@dataclass
class ContextBuilder:
    """Runs ``build_context`` (or ``Session.build``) for an adapter and remembers builds.

    ``session``: a :class:`ctxwarden.Session` that mirrors the conversation (each new
    message appended once) and builds it with its stored summary and facts.
    """

    model: str = "gpt-4o"
    max_input_tokens: int | None = None
    policy: Policy | None = None
    summarizer: str | Summarizer | None = None
    session: Session | None = None
    last: BuiltContext | None = None
    _previous: OrderedDict[str, BuiltContext] = field(default_factory=OrderedDict, repr=False)
    _stored: int = field(default=-1, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def last_audit(self) -> Audit | None:
        return self.last.audit if self.last is not None else None

    def build(
        self, history: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> BuiltContext:
        """The context for one model call over ``history`` (system prompt first)."""
        if self.session is not None:
            built = self._build_in_session(history, tools)
        else:
            history, carried = strip_layers(history)
            key = _conversation_key(history)
            with self._lock:
                previous = self._previous.get(key)
            built = build_context(
                history,
                self.model,
                self.max_input_tokens,
                policy=self.policy,
                previous=previous,
                tools=tools,
                summarizer=self.summarizer,
                **carried_options(carried, self.summarizer, previous),
            )
            with self._lock:
                self._previous[key] = built
                self._previous.move_to_end(key)
                while len(self._previous) > _KEEP_CONVERSATIONS:
                    self._previous.popitem(last=False)
        self.last = built
        return built

    def _build_in_session(
        self, history: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
    ) -> BuiltContext:
        session = self.session
        assert session is not None
        with self._lock:
            if self._stored < 0:
                self._stored = session.record.next_seq
            stored = self._stored
            if stored > len(history):
                raise UsageError(
                    f"session {session.session_id!r} holds {stored} messages but this "
                    f"conversation has {len(history)}: give each conversation its own session"
                )
            if stored < len(history):
                session.append(history[stored:])
                self._stored = len(history)
        return session.build(
            self.model, self.policy, max_input_tokens=self.max_input_tokens, tools=tools
        )


def _conversation_key(history: Sequence[Message]) -> str:
    for m in history:
        if m.role != "system":
            return m.id
    return ""
