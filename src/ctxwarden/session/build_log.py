"""Every :meth:`ctxwarden.Session.build` leaves its audit in the store (R15, R11).

The audit is what the session page (:mod:`ctxwarden.ui`) and ``GET
/v1/sessions/{id}/builds`` show turn by turn, so it is written by the build itself, not
by one of its callers: the proxy, the session API, an adapter and a user's own loop all
leave the same row in ``ctxwarden_builds`` (:func:`~ctxwarden.store.service_tables.record_build`).

A row holds the audit (its actions as rows of values under their field names, named
once: :func:`audit_json`), the newest message the build saw (``upto_seq``), the size of the
full history at that point (what sending everything would have cost) and, for the
newest ``keep_contexts`` builds only, the built messages with their layers; only the
newest ``keep_builds`` rows of a session are kept. A built message that is a stored
message as stored (most of a window: stored messages never change) is written as its
sequence number, ``{"layer": ..., "seq": n}`` (a run of them, consecutive in the context
and in the store, as one row: ``{"layer": ..., "seq": n, "count": k}``), and read back
whole (:func:`~ctxwarden.store.service_tables.logged_context`): a proxied call logs a few
kilobytes instead of its whole ~80 KB context again. And the messages a context shares,
from its start, with the session's last context logged whole (its *base*: the same
message objects in the same layers) are logged as one first row naming that build and
how many (``{"base": build_id, "count": n}``, :func:`context_delta`): a proxied
session's window masks a hundred tool results, each logged whole as its placeholder,
~29 KB a call, the same every call until the mask moves on. A context is logged whole
when it shares less than half its messages with the base, or after
``KEYFRAME_EVERY - 1`` logged from it; a base stays stored while a kept context begins
with it. The full-history size is the previous
row's plus the stored counts of the messages after it: the build's own slice has most of
them, so a warm build reads nothing more, and a first build over an imported history
reads only the counts column.

A library build's row is written without waiting for durability where the backend
allows it (as the sticky decisions are); the proxy's rows, which record whether a
forwarded call finished, are durable.

A store that is not one of the SQL backends (a user's own :class:`SessionStore`) has no
log table; its builds are not logged.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from operator import attrgetter, is_not, ne, or_
from typing import TYPE_CHECKING, Any, cast

from ctxwarden.core.caching import memoize
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import message_to_openai
from ctxwarden.formats.openai_json import dumps, meta_message_bytes, object_json
from ctxwarden.session.handle import SessionHandle
from ctxwarden.session.tail_memo import count_key
from ctxwarden.steps.base import Action
from ctxwarden.store import StoredMessage
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.base import json_text, unstorable
from ctxwarden.store.migrations import Tx
from ctxwarden.store.service_tables import HistoryTokens, record_build, stored_tokens_in

if TYPE_CHECKING:
    from ctxwarden.core.messages import Message
    from ctxwarden.pipeline.audit import Audit
    from ctxwarden.pipeline.engine import BuiltContext

__all__ = [
    "KEEP_BUILDS",
    "KEEP_CONTEXTS",
    "ContextMemo",
    "audit_json",
    "context_json",
    "context_rows",
    "context_utf8",
    "log_build",
]

KEEP_BUILDS = 2000
"""Builds (audits) kept per session: a few kilobytes each."""
KEEP_CONTEXTS = 50
"""Of those, how many newest keep their built messages (up to a budget of text each)."""
_RANGE = 500


def context_rows(built: BuiltContext) -> list[dict[str, Any]]:
    """The built messages as stored: each with its layer and as its OpenAI dict."""
    return [
        {"layer": built.layers.get(m.id, "window"), "message": message_to_openai(m, with_meta=True)}
        for m in built.messages
    ]


class ContextMemo:
    """What a session's last logged contexts were written as (a session holds one and
    passes it to :func:`log_build`). The next build's context is mostly the same message
    objects in the same layers, so its rows are written from where the two part and
    taken as written before that (``last``: a proxied call wrote its ~240 rows again each
    time); and it is logged as the first messages of the last context logged whole, its
    *base*, and the rest (``base``, ``since``: how many were logged so since). ``last``
    is ``None`` until a build is logged, and after one that it cannot serve; ``base`` is
    set only once its row is committed, so no logged context names a base never stored."""

    __slots__ = ("base", "last", "since")

    def __init__(self) -> None:
        self.last: _Written | None = None
        self.base: tuple[str, _Written] | None = None  # build id, as written
        self.since = 0


@dataclass(frozen=True)
class _Written:
    scope: Hashable  # the session it was written for (deleted and created again: another)
    messages: tuple[Message, ...]
    layers: tuple[str, ...]
    parts: tuple[bytes, ...]  # the rows' pieces, each row ended by ", ", the open run not
    ends: tuple[tuple[int, tuple[Any, ...]], ...]  # after message i: pieces, the open run


def _shared(last: _Written, messages: Sequence[Message], layers: Sequence[str]) -> int:
    """How many leading messages are the same objects in the same layers (read in C)."""
    differ = map(or_, map(is_not, last.messages, messages), map(ne, last.layers, layers))
    first = next(itertools.compress(itertools.count(), differ), None)
    return min(len(last.messages), len(messages)) if first is None else first


class _Rows:
    """Writes built messages as logged rows, as pieces joined once at the end: a message
    equal to one of the build's slice as its sequence number, consecutive ones of one
    layer as one run (see the module docstring), any other whole."""

    __slots__ = ("ends", "heads", "parts", "refs", "run", "seq_of")

    def __init__(self, seq_of: Mapping[str, StoredMessage], parts: list[bytes]) -> None:
        self.seq_of = seq_of
        self.parts = parts  # joined once: no row is made and copied again
        self.run: list[Any] = []  # the open run of stored messages: [layer, first seq, count]
        self.ends: list[tuple[int, tuple[Any, ...]]] = []  # after each message
        self.heads: dict[str, bytes] = {}
        self.refs: dict[str, bytes] = {}

    def close_run(self) -> None:
        run, parts = self.run, self.parts
        layer, first, count = run
        ref = self.refs.get(layer)
        if ref is None:
            ref = self.refs[layer] = f'{{"layer": {dumps(layer)}, "seq": '.encode()
        more = b"}, " if count == 1 else b', "count": %d}, ' % count
        parts.extend((ref, str(first).encode(), more))
        run.clear()

    def write(self, messages: Sequence[Message], layers: Sequence[str]) -> None:
        """Rows for ``messages`` (raises ``UnicodeEncodeError`` for text UTF-8 cannot hold)."""
        seq_of, parts, run, ends, heads = self.seq_of, self.parts, self.run, self.ends, self.heads
        for m, layer in zip(messages, layers, strict=True):
            found = seq_of.get(m.id)
            # an edited message (cut, masked) has other content: unequal without comparing
            # every field, as the dataclass's == would
            if found is not None and (
                found.message is m or (found.message.content == m.content and found.message == m)
            ):
                if run and run[0] == layer and run[1] + run[2] == found.seq:
                    run[2] += 1
                else:
                    if run:
                        self.close_run()
                    run += (layer, found.seq, 1)
                ends.append((len(parts), tuple(run)))
                continue
            if run:
                self.close_run()
            head = heads.get(layer)
            if head is None:
                head = heads[layer] = f'{{"layer": {dumps(layer)}, "message": '.encode()
            parts += (head, meta_message_bytes(m), b"}, ")
            ends.append((len(parts), ()))

    def joined(self) -> bytes:
        """The rows as one JSON array (the open run closed)."""
        if self.run:
            self.close_run()
        parts = self.parts
        if not parts:
            return b"[]"
        # the last row's "}, " or '..., "count": n}, '
        return b"".join((b"[", *parts[:-1], parts[-1][:-2], b"]"))


def _layers(built: BuiltContext) -> list[str]:
    layer_of = built.layers.get
    return [layer_of(m.id, "window") for m in built.messages]


def _by_id(stored: Sequence[StoredMessage] | None) -> dict[str, StoredMessage]:
    return {s.message.id: s for s in stored} if stored else {}


def context_utf8(
    built: BuiltContext,
    stored: Sequence[StoredMessage] | None = None,
    memo: ContextMemo | None = None,
    scope: Hashable = None,
) -> bytes:
    """``json_text(context_rows(built))`` as UTF-8, each message's bytes memoised
    (:func:`~ctxwarden.formats.openai_json.meta_message_bytes`): from one build to the
    next a session's context is mostly the same messages, so the ~80 KB text is joined,
    never encoded (a truncation's mark makes it UCS-2, whose encoding is the slow one).
    A JSON text is storable exactly when it encodes (it holds no raw NUL): a part that
    does not (a lone surrogate) has the whole context written with ASCII escapes.

    With ``stored`` (the build's slice), a built message equal to one of them is written
    as its sequence number instead, and a run of such messages of one layer with
    consecutive numbers as one row, its first number and ``count`` (see the module
    docstring). With ``memo`` (the session's, for the session ``scope`` names), the rows
    of the messages this context shares with the last one written, from the start, are
    taken as written then: the same objects in the same layers, and a slice whose ids are
    unique (so a message is found in it as it was), give the same rows."""
    messages = built.messages
    layers = _layers(built)
    seq_of = _by_id(stored)
    unique = scope is not None and len(seq_of) == len(stored or ())
    last = memo.last if memo is not None and unique else None
    shared = _shared(last, messages, layers) if last is not None and last.scope == scope else 0
    rows = _Rows(seq_of, [])
    if last is not None and shared:
        pieces, open_run = last.ends[shared - 1]
        rows.parts += last.parts[:pieces]
        rows.run += open_run
        rows.ends += last.ends[:shared]
    try:
        rows.write(messages[shared:], layers[shared:])
    except UnicodeEncodeError:
        if memo is not None:
            memo.last = None
        return json_text(context_rows(built)).encode()
    if memo is not None:
        written = (scope, tuple(messages), tuple(layers), tuple(rows.parts), tuple(rows.ends))
        memo.last = _Written(*written) if unique else None
    return rows.joined()


KEYFRAME_EVERY = 25
"""At most this many contexts in a row are logged from one base (it included): a base
stays while a kept context begins with it, so this bounds how long it outlives its turn."""


def context_delta(
    built: BuiltContext,
    stored: Sequence[StoredMessage] | None,
    memo: ContextMemo,
    scope: Hashable,
    every: int = KEYFRAME_EVERY,
) -> tuple[bytes, str] | None:
    """``built``'s context logged from the memo's base, and the base's build id: a first
    row ``{"base": build_id, "count": n}`` standing for the first ``n`` messages of the
    base's context (the same objects in the same layers: rows that read back as they do
    there), then the rest as :func:`context_utf8` writes them. ``None`` when it should be
    logged whole: no base for this session, fewer than half of the messages shared, or
    ``every - 1`` contexts logged from this base already."""
    if memo.base is None or memo.since + 1 >= every:
        return None
    build_id, base = memo.base
    if base.scope != scope:
        return None
    messages = built.messages
    layers = _layers(built)
    shared = _shared(base, messages, layers)
    if not shared or 2 * shared < len(messages):
        return None
    head = b'{"base": %s, "count": %d}, ' % (dumps(build_id).encode(), shared)
    rows = _Rows(_by_id(stored), [head])
    try:
        rows.write(messages[shared:], layers[shared:])
    except UnicodeEncodeError:
        return None  # (logged whole, with its escapes)
    return rows.joined(), build_id


def context_json(built: BuiltContext) -> str:
    """:func:`context_utf8` as text: ``json_text(context_rows(built))``."""
    return context_utf8(built).decode()


_SCALARS = frozenset((str, int, float, bool, type(None)))  # exact types: a subclass is dumped
_TEXT_ATTR = "_ctxwarden_json"  # an action's logged JSON, kept on the (frozen) action


def _field_reader(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A C-level reader of ``names`` as a tuple (``attrgetter`` of one name is no tuple)."""
    if len(names) > 1:
        return attrgetter(*names)
    return lambda obj: tuple(getattr(obj, n) for n in names)


def _action_text(action: Any) -> str:
    """One action's JSON as ``json.dumps(asdict(action))`` writes it, memoised by its
    values and their types (``1`` and ``True`` are written apart): a proxied session's
    build cuts and masks the same messages for the same reasons turn after turn, with
    the same action objects (:func:`~ctxwarden.steps.base.same_action`), on which the
    text is kept."""
    own = getattr(action, "__dict__", None)
    kept: str | None = own.get(_TEXT_ATTR) if own is not None else None
    if kept is not None:
        return kept
    text = _action_json(action)
    if own is not None and type(action) is Action:
        own[_TEXT_ATTR] = text
    return text


@memoize(64)
def _fields_of(cls: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    names = tuple(f.name for f in fields(cls))
    return names, _field_reader(names)


@memoize(65_536)
def _scalars_json(names: tuple[str, ...], values: tuple[Any, ...], types: tuple[type, ...]) -> str:
    """The JSON object of ``names`` and scalar ``values``; ``types`` is only part of the
    memo's key (``1`` and ``True`` are equal, and are written apart)."""
    return dumps(dict(zip(names, values, strict=True)))


def _action_json(action: Any) -> str:
    cls: type = type(action)
    names, read = _fields_of(cls)
    values = read(action)
    types = tuple(map(type, values))
    if not _SCALARS.issuperset(types):
        return dumps(asdict(action))
    return _scalars_json(names, values, types)


_ROW_ATTR = "_ctxwarden_row"  # an action's logged row, kept on the (frozen) action
_ACTION_FIELDS = tuple(f.name for f in fields(Action))
_ROWS_HEAD = '{"fields": ' + dumps(list(_ACTION_FIELDS)) + ', "rows": ['


def _action_row(action: Any) -> str | None:
    """One action's values as a JSON array, in the order of :class:`Action`'s fields,
    memoised as :func:`_action_text` is; ``None`` for an action with other fields or a
    value that is no scalar (its audit logs each action as an object)."""
    own = getattr(action, "__dict__", None)
    kept: str | None = own.get(_ROW_ATTR) if own is not None else None
    if kept is not None:
        return kept
    cls: type = type(action)
    names, read = _fields_of(cls)
    if names != _ACTION_FIELDS:
        return None
    values = read(action)
    types = tuple(map(type, values))
    if not _SCALARS.issuperset(types):
        return None
    text = _scalars_row(values, types)
    if own is not None and type(action) is Action:
        own[_ROW_ATTR] = text
    return text


@memoize(65_536)
def _scalars_row(values: tuple[Any, ...], types: tuple[type, ...]) -> str:
    """The JSON array of scalar ``values`` (``types``: as for :func:`_scalars_json`)."""
    return dumps(list(values))


def audit_json(audit: Audit) -> str:
    """``json_text(audit.to_dict())`` with its actions written compactly: as rows of
    their values under the field names, named once (``{"fields": [...], "rows": [[...],
    ...]}``, a build logs one action per cut or masked message, ~165 bytes each as
    objects), which :func:`~ctxwarden.store.service_tables.list_builds` reads back as the
    objects; each action's text memoised (:func:`_action_row`). An action with other
    fields or values (a user's step) has the actions written as objects, byte for byte
    as ``json_text`` writes them."""
    rows = list(map(_action_row, audit.actions))
    if rows and None not in rows:
        actions = _ROWS_HEAD + ", ".join(cast("list[str]", rows)) + "]}"
    else:
        actions = "[" + ", ".join(map(_action_text, audit.actions)) + "]"
    text = object_json(audit.to_dict(actions=False), {"actions": actions})
    if not text.isascii() and unstorable(text):
        return json_text(audit.to_dict())
    return text


def _history_tokens(
    session: SessionHandle,
    read: Sequence[StoredMessage],
    start: int,
    upto: int,
    counter: TokenCounter,
) -> HistoryTokens:
    """The tokens of every stored message up to ``upto`` (see the module docstring), from
    the newest logged build's mark, as :func:`record_build` reads it in its transaction."""
    store, tenant, sid = session.store, session.tenant, session.session_id
    assert isinstance(store, SqlStore)  # (only the SQL stores keep a log)
    key = count_key(counter)

    def tokens(tx: Tx, mark: tuple[int, int] | None) -> int:
        previous, after = mark or (0, -1)
        if after > upto:  # the log is ahead of this build's view (a concurrent build)
            previous, after = 0, -1
        total = previous
        if after < start - 1:  # messages between the last logged build and this slice's tail
            summed, missing = stored_tokens_in(tx, tenant, sid, after, start - 1, key)
            total += summed
            for i in range(0, len(missing), _RANGE):
                chunk = missing[i : i + _RANGE]
                rows = store.range(tenant, sid, chunk[0], chunk[-1] + 1, tx)
                wanted = set(chunk)
                total += sum(counter.count_message(r.message) for r in rows if r.seq in wanted)
        for m in read:
            if m.seq >= start and m.seq > after:
                stored = m.token_counts.get(key)
                total += stored if isinstance(stored, int) else counter.count_message(m.message)
        return total

    return tokens


def log_build(
    session: SessionHandle,
    built: BuiltContext,
    read: Sequence[StoredMessage],
    start: int,
    *,
    counter: TokenCounter,
    build_id: str | None,
    status: str,
    sticky: Mapping[str, Any] | None = None,
    ledger: tuple[int, str] | None = None,
    memo: ContextMemo | None = None,
    scope: Hashable = None,
) -> str | None:
    """Record ``built`` as the session's next turn, with the build's ``sticky`` decisions
    and ``ledger`` checkpoint when given (one transaction); return its build id (``None``
    when the store keeps no log). ``read`` is the build's slice, ``start`` where its tail
    begins; ``memo`` the session's :class:`ContextMemo` for the session ``scope`` names."""
    store = session.store
    if not isinstance(store, SqlStore):
        if sticky is not None:
            store.save_sticky(session.tenant, session.session_id, sticky, ledger=ledger)
        return None

    def save_sticky(tx: Tx) -> None:
        if sticky is not None:
            store.save_sticky_in(tx, session.tenant, session.session_id, sticky, ledger=ledger)

    build_id = build_id or uuid.uuid4().hex
    upto = read[-1].seq if read else -1
    keep_contexts = session.keep_contexts
    context: bytes | None = None
    base: str | None = None
    whole: list[bool] = []  # the context was logged whole (it is the next base)

    def whole_context() -> bytes:
        whole.append(True)
        return context_utf8(built, read, memo, scope)

    if keep_contexts > 0:
        every = min(KEYFRAME_EVERY, keep_contexts)
        delta = context_delta(built, read, memo, scope, every) if memo is not None else None
        context, base = delta if delta is not None else (whole_context(), None)
    record_build(
        session.store,
        session.tenant,
        session.session_id,
        build_id=build_id,
        model=built.model,
        history_tokens=_history_tokens(session, read, start, upto, counter),
        input_tokens=built.input_tokens,
        audit=audit_json(built.audit),
        status=status,
        upto_seq=upto,
        context=context,
        keep=session.keep_builds,
        keep_contexts=keep_contexts,
        # a library build's row is advisory (a crash may lose the newest); the proxy's
        # ``forwarded`` row must survive one, to say the call never finished
        durable=status != "built",
        also=save_sticky,
        context_base=base,
        whole_context=whole_context,
    )
    if memo is not None and context is not None:  # committed: a base the next may name
        if whole:  # (``last``: as context_utf8 just wrote it for ``scope``, or None)
            memo.base, memo.since = (build_id, memo.last) if memo.last else None, 0
        else:
            memo.since += 1
    return build_id
