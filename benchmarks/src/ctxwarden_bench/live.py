"""One event loop for the bench's model calls, so a real model keeps its connections.

The bench is synchronous (strategies call summarisers from plain code), and the model
clients are async. ``complete_sync`` would open a fresh loop, and so a fresh HTTP
client and TLS handshake, for every call; a bench run makes hundreds. A
:class:`ModelRunner` runs every call of one summariser or agent on one loop (the SDK
client is per loop, see :class:`~ctxwarden.llm.base.LoopLocal`) and closes the
client's connections when the run ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ctxwarden.core.errors import UsageError

__all__ = ["ModelRunner", "describe_failure"]

T = TypeVar("T")


class ModelRunner:
    """Runs coroutines to completion on one private event loop (not re-entrant)."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = asyncio.Runner()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` and return its result; refused inside a running event loop."""
        if self._runner is None:
            coro.close()
            raise UsageError("this model runner is closed")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._runner.run(coro)
        coro.close()
        raise UsageError("the bench runs models synchronously; call it outside an event loop")

    def close(self, *models: Any) -> None:
        """Close ``models``' connections (those with ``aclose``), then the loop."""
        if self._runner is None:
            return
        for model in models:
            aclose = getattr(model, "aclose", None)
            if aclose is not None:
                self._runner.run(aclose())
        self._runner.close()
        self._runner = None


def describe_failure(exc: BaseException) -> str:
    """One line for a report or an error message: the exception's kind and first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()
