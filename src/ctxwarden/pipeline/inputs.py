"""The arguments of a build, checked before any work: a clear error, never a crash inside.

A proxy hands the build bodies it did not write. Each check here turns a bad argument
into a :class:`~ctxwarden.core.errors.UsageError` that names it (``ConfigError`` for an
argument, ``InvalidMessageError`` with the index for a message) before the engine sees
it, so nothing raises a bare ``TypeError``/``ValueError``/``OverflowError`` from deep
inside (a NaN budget used to fail in an ``int()`` three calls down).

The checks cost O(new messages) in an agent loop: messages given as dicts are checked
where they are parsed (:func:`ctxwarden.formats.openai.messages_from_openai`), and the
duplicate-id check of a list of :class:`~ctxwarden.core.messages.Message` s remembers the ids
of the history it saw last, so the next call checks only what was appended.

**Duplicate ids are an error.** Two messages with one explicit id would share every
decision keyed by id (a 3,000-token message rode in on the newest message's id). Ids
that ctxwarden derived from the content (``h`` + 12 hex digits, :class:`Message` with no
id) are left out: two identical messages ("ok", "ok") share one by design.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import is_
from typing import Any

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.errors import ConfigError, InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.pipeline.built import BuiltContext

__all__ = [
    "MAX_BUDGET",
    "all_messages",
    "check_budget_argument",
    "check_build_arguments",
    "check_build_options",
    "check_messages_argument",
    "check_summarize_arguments",
    "check_summarizer_argument",
    "check_unique_ids",
]

MAX_BUDGET = 1_000_000_000
"""No model has a window of a billion tokens: a larger budget is a mistake."""

_AUTO_ID = re.compile(r"h[0-9a-f]{12}")
# (history length, id of its last message) -> that history (its message objects) and the
# explicit ids seen in it; a later history is checked against it only when it starts with
# the very same objects, so another history under the same key is checked in full
_SEEN: BoundedCache[tuple[int, str], tuple[tuple[Any, ...], dict[str, int]]] = BoundedCache(
    "inputs.checked_ids", 64
)


def check_budget_argument(value: Any, name: str = "max_input_tokens") -> None:
    """A token budget is ``None`` or a whole number from 1 to :data:`MAX_BUDGET`."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and not math.isfinite(value):
            shown = f"{value!r}"
        else:
            shown = f"{value!r} ({type(value).__name__})"
        raise ConfigError(f"{name} must be a whole number of tokens (an int), got {shown}")
    if not 1 <= value <= MAX_BUDGET:
        raise ConfigError(f"{name} must be between 1 and {MAX_BUDGET:,}, got {value:,}")


def _check_model(model: Any) -> None:
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"model must be a model name (a non-empty str), got {model!r}")


def _check_optional(value: Any, name: str, kind: type, what: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{name} must be {what} or None, got {type(value).__name__}")


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
        raise ConfigError(f"tools must be a list of tool definitions, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ConfigError(f"tools[{i}] must be an object, got {type(tool).__name__}")


def check_summarizer_argument(value: Any, name: str = "summarizer") -> None:
    """A summariser is ``None``, ``"offline"``, a provider spec (read, not connected:
    ``"nope:x"`` is refused here, not when a summary first falls due) or an object with
    ``summarize`` and ``merge`` (:class:`~ctxwarden.memory.summaries.Summarizer`)."""
    if value is None:
        return
    if isinstance(value, str):
        from ctxwarden.llm.spec import check_spec

        try:
            check_spec(value)
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        return
    missing = [m for m in ("summarize", "merge") if not callable(getattr(value, m, None))]
    if missing:
        raise ConfigError(
            f"{name} must be 'offline', a provider spec such as 'openai:gpt-4o-mini', or a "
            f"summariser object (async summarize() and merge()), got {type(value).__name__} "
            f"(no {' or '.join(missing)})"
        )


def check_layers_argument(value: Any, name: str = "layers") -> None:
    """Stored layers are ``None`` or a :class:`~ctxwarden.memory.layer_state.LayerState`
    (``built.state.layers``, or what :func:`ctxwarden.summarize_history` returned)."""
    from ctxwarden.memory.layer_state import LayerState

    if value is not None and not isinstance(value, LayerState):
        raise ConfigError(
            f"{name} must be a LayerState (built.state.layers, or summarize_history's "
            f".state) or None, got {type(value).__name__}"
        )


def _check_facts_schema(value: Any) -> None:
    if value is None:
        return
    from ctxwarden.memory.facts import schema_fields

    try:
        schema_fields(value)
    except ConfigError as exc:
        raise ConfigError(f"facts_schema: {exc}") from None


def check_summarize_arguments(
    summarizer: Any, policy: Any, schema: Any, window: Any, max_input_tokens: Any
) -> None:
    """``Session.summarize`` 's arguments, every one checked before any work, whether or
    not a summary is due."""
    check_build_options(
        None,
        policy,
        {"max_input_tokens": max_input_tokens, "facts_schema": schema},
        summarizer=summarizer,
    )
    check_budget_argument(window, "window")


_SESSION_OPTIONS = frozenset({"max_input_tokens", "tools", "facts_schema"})


def check_build_options(
    model: Any,
    policy: Any,
    options: Mapping[str, Any],
    *,
    session: bool = False,
    summarizer: Any = None,
) -> None:
    """The arguments besides the messages (``Session.build`` checks these first, with
    ``session=True``: then only the options it passes on to the build may be given).
    Every one is checked whether or not the build would use it (a summariser when no
    summary is due, a schema without a summariser): a mistake shows at the first call."""
    from ctxwarden.core.registry.catalog import Registry
    from ctxwarden.memory.entity_ledger import EntityLedger
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.steps.state import BuildState

    if session and not set(options) <= _SESSION_OPTIONS:
        unknown = ", ".join(sorted(set(options) - _SESSION_OPTIONS))
        raise ConfigError(
            f"Session.build does not take {unknown} (the session supplies the history, "
            f"summary, facts and previous state); it takes {', '.join(sorted(_SESSION_OPTIONS))}"
        )

    if model is not None:
        _check_model(model)
    _check_optional(policy, "policy", Policy, "a Policy")
    check_budget_argument(options.get("max_input_tokens"))
    _check_optional(options.get("summary"), "summary", str, "a str")
    _check_optional(options.get("facts"), "facts", str, "a str")
    _check_tools(options.get("tools"))
    previous = options.get("previous")
    if previous is not None and not isinstance(previous, BuildState | BuiltContext):
        raise ConfigError(
            f"previous must be the last BuiltContext (or its state), got {type(previous).__name__}"
        )
    check_summarizer_argument(options.get("summarizer", summarizer))
    _check_facts_schema(options.get("facts_schema"))
    check_layers_argument(options.get("layers"))
    _check_optional(
        options.get("earlier_entities"), "earlier_entities", EntityLedger, "an EntityLedger"
    )
    _check_optional(options.get("registry"), "registry", Registry, "a Registry")
    from ctxwarden.steps.recall_fusion import RecallVectors

    _check_optional(
        options.get("recall_vectors"), "recall_vectors", RecallVectors, "a RecallVectors"
    )


def check_messages_argument(messages: Any) -> list[Any]:
    """``messages`` as a list; anything but an iterable of messages is an error."""
    if type(messages) is list:
        return messages
    if messages is None or isinstance(messages, str | bytes | Mapping | Message):
        got = "None" if messages is None else type(messages).__name__
        raise InvalidMessageError(
            f"messages must be a list of messages (OpenAI dicts or Message), got {got}"
        )
    try:
        return list(messages)
    except TypeError:
        raise InvalidMessageError(
            f"messages must be a list of messages, got {type(messages).__name__}"
        ) from None


def all_messages(items: Sequence[Any], start: int = 0) -> bool:
    """Whether every item from ``start`` on is a :class:`Message` (one C-level pass: a
    cold build of 10,000 messages checks them all)."""
    return all(map(isinstance, items[start:] if start else items, repeat(Message)))


def _explicit(message_id: str) -> bool:
    return not (len(message_id) == 13 and _AUTO_ID.fullmatch(message_id))


def check_unique_ids(messages: list[Any], known: int = 0) -> None:
    """Raise :class:`InvalidMessageError` naming both positions of a repeated explicit id.

    Only a list of :class:`Message` s is checked here (dicts are checked where they are
    parsed). ``known`` leading messages were checked by the previous call on this history."""
    n = len(messages)
    known = known if 0 < known <= n and isinstance(messages[known - 1], Message) else 0
    if not n or not all_messages(messages, known):
        return  # dicts among them: messages_from_openai checks while parsing
    kept = _SEEN.pop((known, messages[known - 1].id)) if 0 < known <= n else None
    seen = kept[1] if kept is not None and all(map(is_, messages, kept[0])) else None
    if seen is not None:  # the history we saw last (the same objects), extended
        for pos in range(known, n):
            message_id = messages[pos].id
            first = seen.get(message_id)
            if first is not None:
                if first < known and messages[first].id == message_id:
                    _duplicate(message_id, first, pos)
                break  # two new ones alike, or the old history changed: check it all
            if _explicit(message_id):
                seen[message_id] = pos
        else:
            _remember(messages, seen)
            return
    ids = [m.id for m in messages]
    explicit = dict(zip(ids, range(n), strict=True))  # id -> its last position
    if len(explicit) < n:
        seen = {}
        for pos, message_id in enumerate(ids):
            if _explicit(message_id):
                if message_id in seen:
                    _duplicate(message_id, seen[message_id], pos)
                seen[message_id] = pos
    for auto in [i for i in explicit if len(i) == 13 and not _explicit(i)]:
        del explicit[auto]  # only ids of the auto shape are tested (the regex is the cost)
    _remember(messages, explicit)


def _duplicate(message_id: str, first: int, pos: int) -> None:
    raise InvalidMessageError(
        f"duplicate id {message_id!r}: messages {first} and {pos} both have it; ids must "
        "be unique (leave them out and ctxwarden numbers the messages)",
        index=pos,
        field="ctxwarden.id",
    )


def _remember(messages: list[Any], seen: dict[str, int]) -> None:
    if not messages:
        return
    _SEEN.put((len(messages), messages[-1].id), (tuple(messages), seen))


def check_build_arguments(
    messages: Any, model: Any, max_input_tokens: Any, options: Mapping[str, Any]
) -> list[Any]:
    """Everything ``build_context`` is given, checked; ``messages`` returned as a list."""
    check_build_options(
        model, options.get("policy"), {**options, "max_input_tokens": max_input_tokens}
    )
    items = check_messages_argument(messages)
    previous = options.get("previous")
    state = getattr(previous, "state", previous)
    known = int(getattr(state, "history_length", 0) or 0)
    check_unique_ids(items, known if known <= len(items) else 0)
    return items
