"""The blocks a session's build reads for the tool rules that pin (``[tools.NAME] pin = true``).

A session reads what its build needs: the system prompt, the pinned messages (flagged so
in the store), the first messages and the tail from where the window starts. A result
pinned by its tool's rule is not flagged in the store — the rule is the policy's, not the
message's — so before the tail the session finds the tool-call blocks that hold one
(the call with all its results, as the window keeps a pinned block) and reads them too;
otherwise ``build_context`` over the whole history would keep a pinned result the
session never read. The scan is incremental: :class:`PinnedBlocks` remembers how far it
read and what it found, so a session's builds read each older message once (speed only:
a fresh object reads them all again and finds the same blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxwarden.steps.tool_rules import ToolRules, result_tool
from ctxwarden.store import SessionStore, StoredMessage

__all__ = ["PinnedBlocks"]


class PinnedBlocks:
    """The stored blocks before a seq that hold a result a tool rule pins, by seq."""

    def __init__(self) -> None:
        self._key: Any = None
        self._upto = 0
        self._found: dict[int, StoredMessage] = {}
        self._open: list[StoredMessage] = []  # the last block scanned (more results may follow)

    def read(
        self,
        store: SessionStore,
        tenant: str,
        session_id: str,
        created_at: float,
        rules: ToolRules,
        upto: int,
    ) -> dict[int, StoredMessage]:
        """The messages of the pinned blocks with a seq under ``upto``."""
        key = (created_at, rules)
        if key != self._key or upto < self._upto:
            self._key, self._upto, self._found, self._open = key, 0, {}, []
        if upto > self._upto:
            rows = self._open + store.range(tenant, session_id, self._upto, upto)
            self._open = self._scan(rows, rules)
            self._upto = upto
        return {seq: m for seq, m in self._found.items() if seq < upto}

    def _scan(self, rows: Sequence[StoredMessage], rules: ToolRules) -> list[StoredMessage]:
        """Adds the pinned blocks of ``rows``; returns the last block (to scan again with
        what follows it)."""
        messages = [r.message for r in rows]
        i, last = 0, 0
        while i < len(rows):
            if not messages[i].is_tool_call:
                i += 1
                continue
            end = i + 1
            while end < len(rows) and messages[end].role == "tool":
                end += 1
            if any(rules.for_tool(result_tool(messages, j)).pin for j in range(i + 1, end)):
                self._found.update((r.seq, r) for r in rows[i:end])
            last, i = i, end
        return list(rows[last:]) if rows and messages[last].is_tool_call else []
