"""The recall tool through the proxy: offered to the model, answered from the store.

With ``recall_tool = true`` in the tenant's policy, the proxy adds the recall tool
(:func:`ctxwarden.recall_tool`) to the request it forwards. When the model's reply calls
that tool and nothing else, the proxy answers each call from the session's store
(:meth:`ctxwarden.Session.recall`, which audits it as a ``recalled`` row of the
session's builds), appends the call and its result to the forwarded context, and asks
upstream again; the client never sees those rounds and the stored session does not hold
them (the client's own history stays the session's). At most :data:`MAX_ROUNDS` rounds
offer the tool; the last request goes without it, so the model has to answer. A recalled
original that would take the request past the build's budget is cut to what is left.

A streamed reply is held back only while it may still be a recall call: once its first
text, or a call to another tool, arrives, what was held is sent and the rest is relayed
as upstream writes it (the client's frames are upstream's bytes either way).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from ctxwarden.errors import CtxwardenError, UnknownHandleError
from ctxwarden.memory.recall import RECALL_TOOL_NAME, recall_arguments
from ctxwarden.messages import Message
from ctxwarden.registry.usage import Usage
from ctxwarden.service.forward import Wire
from ctxwarden.service.pipeline import Prepared
from ctxwarden.service.sse import FrameSplitter
from ctxwarden.service.upstream import Upstream

__all__ = ["MAX_ROUNDS", "Held", "settle"]

MAX_ROUNDS = 3
Fetch = Callable[[str], Awaitable[str]]


class Held:
    """An upstream response whose first bytes were read to decide: the same interface
    the relay uses (``status_code``, ``headers``, ``aiter_bytes``, ``aread``,
    ``aclose``), the held bytes first, then the rest live."""

    def __init__(self, response: Any, held: bytes, rest: AsyncIterator[bytes] | None) -> None:
        self.status_code = response.status_code
        self.headers = response.headers
        self._response, self._held, self._rest = response, held, rest

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        if self._held:
            yield self._held
        if self._rest is not None:
            async for chunk in self._rest:
                yield chunk

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def aclose(self) -> None:
        await self._response.aclose()


def recall_only(reply: Message | None) -> bool:
    """The reply calls the recall tool and nothing else."""
    return (
        reply is not None
        and bool(reply.tool_calls)
        and all(c.name == RECALL_TOOL_NAME for c in reply.tool_calls)
        and not reply.text.strip()
    )


def _decided(reply: Message | None) -> bool:
    """A partial reply that can no longer be a recall-only call."""
    if reply is None:
        return False
    return bool(reply.text.strip()) or any(c.name != RECALL_TOOL_NAME for c in reply.tool_calls)


async def _read(response: Any, wire: Wire, stream: bool) -> tuple[Message | None, Any, Held]:
    """The reply (as far as needed to decide) and the response to hand on."""
    if not stream:
        raw = await response.aread()
        try:
            reply, usage = wire.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError, IndexError):
            reply, usage = None, None
        return reply, usage, Held(response, raw, None)
    reader, splitter = wire.reader(), FrameSplitter()
    held: list[bytes] = []
    chunks = response.aiter_bytes()
    async for chunk in chunks:
        held.append(chunk)
        for frame in splitter.feed(chunk):
            reader.frame(frame)
        try:
            reply = reader.result(False)[0]
        except (CtxwardenError, ValueError, KeyError, TypeError):
            continue  # a partial block that does not parse yet
        if _decided(reply):
            return reply, None, Held(response, b"".join(held), chunks)
    reply, usage, _ = reader.result(True)
    return reply, usage, Held(response, b"".join(held), None)


async def _answer(
    prepared: Prepared, reply: Message, room: int, fetch: Fetch
) -> tuple[tuple[Message, ...], int]:
    """The call and a result per recall call (cut to ``room`` tokens in all)."""
    from ctxwarden import TokenCounter
    from ctxwarden.steps.truncate import TruncateToolResults

    counter = TokenCounter.for_model(prepared.call.model)
    out: list[Message] = [reply]
    used = counter.count_message(reply)
    for call in reply.tool_calls:
        try:
            content = await fetch(recall_arguments(call.arguments))
        except UnknownHandleError as exc:
            content = f"error: {exc}"
        result = Message.tool(content, call.id, name=RECALL_TOOL_NAME)
        left = max(room - used, 16)
        if counter.count_message(result) > left:
            cut = TruncateToolResults(threshold_tokens=left, target_tokens=left)
            result = cut.truncate(result, counter.count_message, counter.count_text)
        used += counter.count_message(result)
        out.append(result)
    return tuple(out), used


async def settle(
    upstream: Upstream,
    wire: Wire,
    prepared: Prepared,
    headers: Mapping[str, str],
    *,
    stream: bool,
    fetch: Fetch,
    account: Callable[[Usage], Awaitable[None]],
) -> Any:
    """Forward with the recall tool offered, answering recall-only replies (see the
    module docstring); the response to relay to the client. ``fetch(handle)`` returns
    a recalled original (audited), ``account(usage)`` records the rounds the client
    does not see."""
    extra: tuple[Message, ...] = ()
    room = prepared.built.audit.budget - prepared.built.input_tokens
    for round_ in range(MAX_ROUNDS + 1):
        offer = round_ < MAX_ROUNDS
        response = await upstream.open(wire.path, wire.body(prepared, extra, offer), headers)
        if not offer or response.status_code >= 400:
            return response
        reply, usage, held = await _read(response, wire, stream)
        if not recall_only(reply):
            return held
        await held.aclose()
        if usage is not None:
            await account(usage)
        assert reply is not None
        answered, used = await _answer(prepared, reply, room, fetch)
        room -= used
        extra = (*extra, *answered)
    raise AssertionError("unreachable: the last round returns")  # pragma: no cover
