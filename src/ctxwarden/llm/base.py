"""The small protocol every model client speaks (R12).

A summariser or fact extractor needs one thing from a model: messages in, text and
token usage out. :class:`ChatModel` is that contract, async first; :func:`complete_sync`
is the thin wrapper for callers without an event loop. Retries live in
:mod:`ctxwarden.llm.retry` (:class:`RetryPolicy` is re-exported here).
"""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, Self, TypeVar, runtime_checkable

from ctxwarden.core.errors import UsageError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.llm.retry import RetryPolicy, SDKErrors, call_with_retry

__all__ = [
    "DEFAULT_TIMEOUT",
    "ChatModel",
    "Completion",
    "LoopLocal",
    "RetryPolicy",
    "SDKModel",
    "StreamingChatModel",
    "TextStream",
    "complete_sync",
    "run_sync",
]

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
"""Seconds one attempt may take (connect + response) unless the caller says otherwise."""


@dataclass(frozen=True)
class Completion:
    """One model answer: the text, what it cost, and the provider's own response object."""

    text: str
    usage: Usage
    model: str
    finish_reason: str | None = None
    raw: Any = field(default=None, repr=False, compare=False)


@runtime_checkable
class ChatModel(Protocol):
    """What summarisation and fact extraction need from a model.

    ``cache_breakpoints`` are message ids after which a provider with explicit prompt
    caching (Anthropic) marks a cache boundary; providers with automatic prefix caching
    (OpenAI) ignore them.
    """

    name: str

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_mode: bool = False,
        cache_breakpoints: Collection[str] = (),
    ) -> Completion: ...


class TextStream:
    """Text deltas of a streamed answer; ``usage``/``completion`` are set once it is exhausted.

    Providers report streamed usage in the last event, so the totals are only known
    after the final delta; reading :attr:`completion` earlier is a usage error.
    """

    def __init__(
        self, source: Callable[[TextStream], AsyncGenerator[str, None]], model: str
    ) -> None:
        self.model = model
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.raw: list[Any] = []
        self._parts: list[str] = []
        self._iter = source(self)
        self._done = False

    def __aiter__(self) -> TextStream:
        return self

    async def __anext__(self) -> str:
        try:
            delta = await self._iter.__anext__()
        except StopAsyncIteration:
            self._done = True
            raise
        self._parts.append(delta)
        return delta

    async def aclose(self) -> None:
        """Stop early and release the connection (a finished stream is already closed)."""
        await self._iter.aclose()

    @property
    def text(self) -> str:
        """The text received so far."""
        return "".join(self._parts)

    @property
    def completion(self) -> Completion:
        """The whole answer as a :class:`Completion` (only after the stream is exhausted)."""
        if not self._done:
            raise UsageError("the stream is not finished: iterate it to the end first")
        return Completion(
            text=self.text,
            usage=self.usage or Usage(),
            model=self.model,
            finish_reason=self.finish_reason,
            raw=self.raw,
        )


@runtime_checkable
class StreamingChatModel(ChatModel, Protocol):
    """A :class:`ChatModel` that can also stream text deltas."""

    def stream(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_mode: bool = False,
        cache_breakpoints: Collection[str] = (),
    ) -> TextStream: ...


def run_sync(
    coro: Coroutine[Any, Any, T],
    *,
    caller: str = "a *_sync method",
    instead: str = "await the async one",
) -> T:
    """Run a coroutine from synchronous code (scripts, the CLI).

    Inside a running event loop this would deadlock or nest loops, so it refuses (closing
    the coroutine) and says what to ``await`` instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise UsageError(f"{caller} was called inside a running event loop; {instead}")


def complete_sync(model: ChatModel, messages: Sequence[Message], **kwargs: Any) -> Completion:
    """Run ``model.complete`` from synchronous code (scripts, the CLI)."""
    return run_sync(
        model.complete(messages, **kwargs),
        caller="complete_sync()",
        instead="use `await model.complete(...)` there instead",
    )


class LoopLocal(Generic[T]):
    """An SDK client per event loop.

    ``httpx`` connection pools belong to the loop that opened them; :func:`complete_sync`
    runs each call in a fresh loop, so a client made in an earlier loop is replaced
    rather than reused.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._value: T = factory()  # built eagerly so configuration errors surface at once
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            self._value, self._loop = self._factory(), loop
        return self._value

    @property
    def current(self) -> T:
        return self._value


class SDKModel:
    """What the SDK-backed clients share: a client per event loop, SDK errors mapped to
    ours, and closing. Subclasses set ``_client`` and ``_errors`` in ``__init__``."""

    _client: LoopLocal[Any]
    _errors: SDKErrors
    retry: RetryPolicy
    deadline: float
    provider: str

    async def _call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """One SDK call, retried per ``self.retry`` within ``self.deadline`` seconds in all
        (the deadline bounds the retries too: ``timeout=10`` gives up after 10 s, not
        after four 10 s attempts and their waits); SDK failures become ours."""
        return await call_with_retry(
            attempt,
            self._errors.classify,
            self.retry,
            deadline=self.deadline,
            provider=self.provider,
        )

    @asynccontextmanager
    async def _sdk_stream(self, events: Any) -> AsyncIterator[Any]:
        """Read an SDK event stream: its failures become ours, and it is always closed."""
        try:
            yield events
        except Exception as exc:
            failure = self._errors.classify(exc)
            if failure is None:
                raise
            raise failure.error from exc
        finally:
            await events.close()

    async def aclose(self) -> None:
        """Close the HTTP connections of the current client."""
        await self._client.current.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
