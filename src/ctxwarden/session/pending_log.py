"""A session build whose log is written later (:meth:`ctxwarden.Session.build_unlogged`):
the proxy sends the context upstream first and writes the log while upstream reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxwarden.pipeline.built import BuiltContext

__all__ = ["PendingLog"]


class PendingLog:
    """``built`` is the context; ``log()`` writes the build's row, its sticky decisions
    and its ledger checkpoint in one transaction, once (a second call does nothing), and
    returns the build id. A call that fails raises the store's error and may be made
    again."""

    __slots__ = ("_write", "build_id", "built")

    def __init__(self, built: BuiltContext, build_id: str, write: Callable[[], None]) -> None:
        self.built = built
        self.build_id = build_id
        self._write: Callable[[], None] | None = write

    @property
    def logged(self) -> bool:
        return self._write is None

    def log(self) -> str:
        write = self._write
        if write is not None:
            write()
            self._write = None
        return self.build_id
