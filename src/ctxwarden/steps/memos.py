"""What a step carries to the next build: its own typed memo, kept under its name.

A step that remembers something from one build to the next (the window's pinned
positions, the fit's earlier drops, the entity ledger, the recall block, the summary
triggers' sums) owns a frozen memo class with ``to_dict()`` and a ``from_dict(data)``
classmethod, in its own module. It registers the class under its name
(:func:`register_memo`), leaves this build's memo on the draft
(``draft.with_memo(name, memo)``) and reads the previous build's with :func:`memo_of`::

    register_memo("drop_tagged", DroppedMemo)
    ...
    before = memo_of(ctx.previous, "drop_tagged", DroppedMemo)   # None on a cold build
    return StepResult(draft.with_memo("drop_tagged", DroppedMemo(...)))

The engine carries ``Draft.memos`` into ``BuildState.memos``, which stores each memo by
its ``to_dict`` and reads it back with the class registered under its name: adding a step
with state touches no field of :class:`~ctxwarden.steps.base.Draft` or
:class:`~ctxwarden.steps.state.BuildState`. A memo stored under a name no class is
registered for yet (the step's module not imported when the state was read) is kept as
its :class:`StoredMemo` and read by :func:`memo_of` with the class the step asks for.

The registry is written when a step's module is imported (a class a name), under a lock,
and only read afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

from ctxwarden.core.errors import ConfigError

__all__ = ["Memo", "StoredMemo", "decode_memo", "memo_of", "memos_with", "register_memo"]


class Memo(Protocol):
    """A step's memo: frozen, JSON-ready by ``to_dict``, read back by ``from_dict``."""

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self: ...


M = TypeVar("M", bound=Memo)

_KINDS: dict[str, type[Memo]] = {}
_LOCK = threading.Lock()


def register_memo(step: str, kind: type[M]) -> type[M]:
    """Register ``kind`` as the memo class of the step named ``step`` (returned as it is).
    Another class under a name already taken is a :class:`ConfigError`; the same class
    (a module imported again) is not."""
    with _LOCK:
        known = _KINDS.get(step)
        if known is not None and (known.__module__, known.__qualname__) != (
            kind.__module__,
            kind.__qualname__,
        ):
            raise ConfigError(
                f"step memo {step!r} is {known.__module__}.{known.__qualname__} already; "
                "give the step another name"
            )
        _KINDS[step] = kind
    return kind


@dataclass(frozen=True)
class StoredMemo:
    """A memo as stored, under a name no class was registered for when it was read."""

    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoredMemo:
        return cls(dict(data))


def decode_memo(step: str, data: Mapping[str, Any]) -> Memo:
    """The memo stored under ``step``, read by its registered class (a
    :class:`StoredMemo` when none is registered)."""
    kind = _KINDS.get(step)
    if kind is None:
        return StoredMemo.from_dict(data)
    return kind.from_dict(data)


def memo_of(holder: Any, step: str, kind: type[M]) -> M | None:
    """The memo of the step named ``step`` in ``holder`` (a build state or a draft: what
    its ``memos`` hold), as a ``kind``; ``None`` when it holds none."""
    found = holder.memos.get(step)
    if found is None or isinstance(found, kind):
        return found
    if isinstance(found, StoredMemo):
        return kind.from_dict(found.data)
    raise TypeError(f"the {step!r} memo is a {type(found).__name__}, not a {kind.__name__}")


def memos_with(memos: Mapping[str, Any], step: str, memo: Any) -> dict[str, Any]:
    """``memos`` with ``memo`` as the memo of the step named ``step`` (``None``: with
    none): what ``with_memo`` of a draft and of a build state hold."""
    out = {k: v for k, v in memos.items() if k != step}
    if memo is not None:
        out[step] = memo
    return out
