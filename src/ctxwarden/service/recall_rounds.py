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

**Who owns the tool.** A client that offers a tool named ``ctxwarden_recall`` itself (a
framework built on the library, talking through the proxy) owns it: the proxy then adds
no second definition and answers nothing, so the model's calls of it reach the client
like any other tool call (:func:`proxy_recall`). The handles in the proxy's context are
the proxy's; such a client resolves them with ``GET /v1/sessions/{id}/recall/{handle}``.

**Accounting.** The rounds' upstream usage is charged like the call's own
(:func:`~ctxwarden.service.proxied_call.charge`): the session's usage, the tenant's spend —
so a spend cap sees it and answers 429 from the next call on — and the token metrics.
``ctxwarden_recall_rounds_total{outcome}`` counts the rounds answered (``answered``,
``unknown_handle`` when a call named a handle the store lacks, ``cut`` when a recalled
original was cut to the budget left) and the calls that used up the rounds
(``limit``); ``ctxwarden_recalled_tokens_total`` the recalled tokens sent upstream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import CtxwardenError, UnknownHandleError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.service.prepared import Prepared
from ctxwarden.service.sse import FrameSplitter
from ctxwarden.service.wire import Wire
from ctxwarden.session.recall import RECALL_TOOL_NAME, recall_arguments

if TYPE_CHECKING:
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.service.metrics import Metrics
    from ctxwarden.service.upstream import Upstream

__all__ = ["MAX_ROUNDS", "Held", "client_offers_recall", "proxy_recall", "settle"]

MAX_ROUNDS = 3
Fetch = Callable[[str], Awaitable[str]]


def client_offers_recall(tools: Sequence[Mapping[str, Any]] | None) -> bool:
    """The request's own tools (OpenAI shape) include one named ``ctxwarden_recall``."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == RECALL_TOOL_NAME:
            return True
    return False


def proxy_recall(policy: Policy, tools: Sequence[Mapping[str, Any]] | None) -> bool:
    """The proxy offers and answers the recall tool: the policy enables it and the
    client does not offer its own (see the module docstring)."""
    return policy.recall_tool and not client_offers_recall(tools)


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
) -> tuple[tuple[Message, ...], int, int, str]:
    """The call and a result per recall call (cut to ``room`` tokens in all); the tokens
    used, those of the results, and the round's outcome (see the module docstring)."""
    from ctxwarden import TokenCounter
    from ctxwarden.steps.truncate import TruncateToolResults

    counter = TokenCounter.for_model(prepared.call.model)
    out: list[Message] = [reply]
    used = counter.count_message(reply)
    recalled, outcome = 0, "answered"
    for call in reply.tool_calls:
        try:
            content = await fetch(recall_arguments(call.arguments))
        except UnknownHandleError as exc:
            content, outcome = f"error: {exc}", "unknown_handle"
        result = Message.tool(content, call.id, name=RECALL_TOOL_NAME)
        left = max(room - used, 16)
        if counter.count_message(result) > left:
            cut = TruncateToolResults(threshold_tokens=left, target_tokens=left)
            result = cut.truncate(result, counter.count_message, counter.count_text)
            outcome = "cut" if outcome == "answered" else outcome
        tokens = counter.count_message(result)
        used += tokens
        recalled += tokens
        out.append(result)
    return tuple(out), used, recalled, outcome


async def settle(
    upstream: Upstream,
    wire: Wire,
    prepared: Prepared,
    headers: Mapping[str, str],
    *,
    stream: bool,
    fetch: Fetch,
    account: Callable[[Usage], Awaitable[None]],
    metrics: Metrics,
) -> Any:
    """Forward with the recall tool offered, answering recall-only replies (see the
    module docstring); the response to relay to the client. ``fetch(handle)`` returns
    a recalled original (audited), ``account(usage)`` charges the rounds the client
    does not see."""
    extra: tuple[Message, ...] = ()
    room = prepared.built.audit.budget - prepared.built.input_tokens
    api = wire.api
    for round_ in range(MAX_ROUNDS + 1):
        offer = round_ < MAX_ROUNDS
        response = await upstream.open(wire.path, wire.body(prepared, extra, offer), headers)
        if not offer:
            metrics.recall_rounds.labels(api, "limit").inc()
            return response
        if response.status_code >= 400:
            return response
        reply, usage, held = await _read(response, wire, stream)
        if not recall_only(reply):
            return held
        await held.aclose()
        if usage is not None:
            await account(usage)
        assert reply is not None
        answered, used, recalled, outcome = await _answer(prepared, reply, room, fetch)
        metrics.recall_rounds.labels(api, outcome).inc()
        metrics.recalled_tokens.labels(api).inc(recalled)
        room -= used
        extra = (*extra, *answered)
    raise AssertionError("unreachable: the last round returns")  # pragma: no cover
