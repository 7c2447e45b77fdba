"""Forwarding one prepared call upstream, JSON or streamed, for either wire format.

The per-format parts (the body sent upstream, reading a JSON reply, reading a stream)
are a :class:`Wire`; the rest is here, once. The session's lock is taken before the
build and released only when the reply is stored — after the last streamed byte — so
the next call on the session sees it.

The build's log is written once the context has gone upstream, before its answer is
read (:meth:`~ctxwarden.service.upstream.Upstream.open`'s ``sent``): upstream reads
hundreds of kilobytes and thinks meanwhile, so the write overlaps its work instead of
adding to the call's time (~0.5 ms of a ~0.8 ms write against an upstream that answers
at once; all of it against a model). A log that cannot be written fails the call as a
build would (upstream's connection is closed, which cancels its work).

Streams are relayed frame by frame as upstream wrote them; the reader sees each frame
to account for it and may only drop one (the usage chunk the proxy asked for and the
client did not). :class:`ProxyStream` watches for the client going away: it then
stops reading upstream (closing that connection cancels the upstream call) and the
reply is stored as far as it got, marked partial.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, nullcontext
from dataclasses import replace
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ctxwarden import Usage
from ctxwarden.core.errors import CtxwardenError
from ctxwarden.core.messages import Message
from ctxwarden.service.calls import check_spend, tenant_key
from ctxwarden.service.errors import ServiceError, from_library
from ctxwarden.service.hub import Hub
from ctxwarden.service.prepared import Call, Prepared, Replay
from ctxwarden.service.proxied_call import charge, finish, prepare
from ctxwarden.service.recall_rounds import proxy_recall, settle
from ctxwarden.service.replay import replayed
from ctxwarden.service.sse import FrameSplitter
from ctxwarden.service.upstream import Upstream, UpstreamFailure
from ctxwarden.service.wire import StreamReader, Wire
from ctxwarden.telemetry import call_trace

__all__ = ["ProxyStream", "StreamReader", "Wire", "forward", "read_whole"]


async def _finish(
    hub: Hub, prepared: Prepared, reply: Message | None, usage: Usage | None, status: str
) -> None:
    try:
        await hub.run(finish, hub, prepared, reply, usage, status)
    finally:
        if prepared.call.trace is not None:
            prepared.call.trace.end(usage, status)
    if reply is not None and hub.summaries is not None:
        call = prepared.call
        hub.summaries.after_call(call.tenant, prepared.synced.session, call.model, prepared.built)
    if reply is not None:  # the reply's seq is the head's count before it
        hub.embeddings.after_call(
            prepared.call.tenant, prepared.synced.session, prepared.synced.head.count
        )


async def forward(
    request: Request, hub: Hub, upstream: Upstream, wire: Wire, call: Call, *, stream: bool
) -> Response:
    """Build, forward, store: the whole call (see the module docstring)."""
    check_spend(call.tenant)
    stack = AsyncExitStack()
    await stack.enter_async_context(hub.locked(call.tenant.name, call.client_id))
    traced = call_trace(wire.api, call.model, request.headers)
    if traced is not None:
        call = replace(call, trace=traced)
    handed_over = False
    try:
        started = time.perf_counter()
        try:
            with traced.current() if traced is not None else nullcontext():
                prepared = await hub.run(prepare, hub, call)  # the build: a child span
        except CtxwardenError as exc:
            raise from_library(exc) from exc
        if isinstance(prepared, Replay):  # a retry: its stored reply (replay.py)
            again = replayed(
                wire.api, prepared.reply, call.model, stream=stream, session_id=prepared.session_id
            )
            if again is not None:
                return again
            raise ServiceError(409, "this request repeats the session's last call", code="retry")
        hub.metrics.labelled(hub.metrics.build_seconds, wire.api).observe(
            time.perf_counter() - started
        )
        record = call.tenant.record
        key = tenant_key(record, wire.api)
        headers = upstream.headers(key, request.headers)
        if traced is not None:
            traced.inject(headers)  # upstream's traceparent: this call's span
            session_id, tokens = prepared.synced.session.session_id, prepared.built.input_tokens
            traced.built(call.tenant.name, session_id, prepared.build_id, tokens)
        sent = time.perf_counter()

        async def log() -> None:  # while upstream reads the context (see the module)
            nonlocal sent
            began = time.perf_counter()
            try:
                await hub.run(prepared.pending.log)
            except CtxwardenError as exc:
                raise from_library(exc) from exc
            finally:  # upstream's latency and time to first token leave the write out
                sent += time.perf_counter() - began

        try:
            if proxy_recall(call.tenant.policy, call.tools):
                await log()
                response = await _with_recall(hub, upstream, wire, prepared, headers, stream)
            else:
                response = await upstream.open(wire.path, wire.body(prepared), headers, log)
        except UpstreamFailure as failure:
            await _finish(hub, prepared, None, None, f"upstream_{failure.status}")
            raise ServiceError(failure.status, failure.message) from failure
        ours = prepared.headers()
        if response.status_code >= 400 or not stream:
            return await _whole(hub, upstream, wire, prepared, response, sent, ours)
        relay = _Relay(hub, upstream, wire, prepared, response, stack, sent)
        handed_over = True
        ours["cache-control"] = "no-cache"
        return ProxyStream(relay, ours, response.headers.get("content-type", "text/event-stream"))
    except BaseException as exc:
        if traced is not None:
            traced.fail(exc)  # (a call ended by _finish keeps its own end)
        raise
    finally:
        if not handed_over:
            await stack.aclose()


async def _with_recall(
    hub: Hub,
    upstream: Upstream,
    wire: Wire,
    prepared: Prepared,
    headers: Mapping[str, str],
    stream: bool,
) -> Any:
    """Upstream's response after the recall rounds (:mod:`~ctxwarden.service.recall_rounds`)."""
    session = prepared.synced.session

    async def fetch(handle: str) -> str:
        found = await hub.run(session.recall, handle)
        return str(found.content)

    async def account(usage: Usage) -> None:
        await hub.run(charge, hub, prepared.call, session, usage)

    return await settle(
        upstream,
        wire,
        prepared,
        headers,
        stream=stream,
        fetch=fetch,
        account=account,
        metrics=hub.metrics,
    )


async def _whole(
    hub: Hub,
    upstream: Upstream,
    wire: Wire,
    prepared: Prepared,
    response: Any,
    sent: float,
    headers: dict[str, str],
) -> Response:
    """A JSON reply (or an upstream error, passed with its status and body)."""
    try:
        raw = await read_whole(upstream, response)
    except ServiceError as failed:
        await _finish(hub, prepared, None, None, f"upstream_{failed.status}")
        raise
    hub.metrics.labelled(hub.metrics.upstream_seconds, wire.api).observe(time.perf_counter() - sent)
    media = response.headers.get("content-type", "application/json")
    if response.status_code >= 400:
        await _finish(hub, prepared, None, None, f"upstream_{response.status_code}")
        return Response(raw, response.status_code, headers=headers, media_type=media)
    try:
        reply, usage = wire.from_json(json.loads(raw))
        status = "complete"
    except (ValueError, KeyError, TypeError, IndexError):  # passed on; nothing to store
        reply, usage, status = None, None, "unreadable_reply"
    await _finish(hub, prepared, reply, usage, status)
    return Response(raw, response.status_code, headers=headers, media_type=media)


async def read_whole(upstream: Upstream, response: Any) -> bytes:
    """The body of an upstream response, which is closed after; a transport failure
    mid-body is a 504 (a timeout) or 502 :class:`ServiceError`."""
    try:
        data: bytes = await response.aread()
    except Exception as exc:
        if not upstream.is_transport_error(exc):
            raise
        code = 504 if upstream.is_timeout(exc) else 502
        raise ServiceError(code, f"upstream failed mid-response: {exc}") from exc
    finally:
        await response.aclose()
    return data


class _Relay:
    """Reads the upstream stream for :class:`ProxyStream` and stores the reply at the end."""

    def __init__(
        self,
        hub: Hub,
        upstream: Upstream,
        wire: Wire,
        prepared: Prepared,
        response: Any,
        stack: AsyncExitStack,
        sent: float,
    ) -> None:
        self.hub, self.upstream, self.wire = hub, upstream, wire
        self.prepared, self.response, self.stack, self.sent = prepared, response, stack, sent
        self.reader = wire.reader()
        self.ended = False  # upstream's stream ended normally
        self.failure: str | None = None
        self.stored = False

    async def chunks(self) -> AsyncIterator[bytes]:
        splitter = FrameSplitter()
        timed = False
        try:
            async for chunk in self.response.aiter_bytes():
                kept = [out for f in splitter.feed(chunk) if (out := self.reader.frame(f))]
                if not timed and self.reader.tokens_seen:
                    timed = True
                    ttft = time.perf_counter() - self.sent
                    metrics = self.hub.metrics
                    metrics.labelled(metrics.ttft_seconds, self.wire.api).observe(ttft)
                if self.reader.finished and not self.stored:
                    # store the reply before the client sees the end marker, so a client
                    # that has the whole reply finds it stored (read your writes)
                    with anyio.CancelScope(shield=True):
                        await self._store(complete=True, status=None)
                if kept:
                    yield b"".join(kept)
            rest = splitter.rest()
            if rest:
                yield rest
            self.ended = True
        except Exception as exc:
            if not self.upstream.is_transport_error(exc):
                raise
            self.failure = "upstream_timeout" if self.upstream.is_timeout(exc) else "upstream_cut"

    async def close(self, delivered: bool) -> None:
        """Close upstream (cancelling it if still running), store what arrived, unlock."""
        try:
            await self.response.aclose()
            if not self.stored:
                status = None if delivered else "client_disconnected"
                await self._store(complete=self.ended and delivered, status=status or self.failure)
        finally:
            await self.stack.aclose()

    async def _store(self, *, complete: bool, status: str | None) -> None:
        self.stored = True
        reply, usage, own = self.reader.result(complete)
        self.hub.metrics.labelled(self.hub.metrics.upstream_seconds, self.wire.api).observe(
            time.perf_counter() - self.sent
        )
        await _finish(self.hub, self.prepared, reply, usage, status or own)


class ProxyStream(Response):
    """A streamed response that notices the client leaving (whatever the ASGI version)
    and always closes its relay, shielded from cancellation.

    A watcher task reads the client's side: a disconnect before the end cancels the
    relaying (an anyio scope, so the relay's shielded store is never cut). Once the end
    is sent, the watcher is stopped with a plain task cancel: a task group cancelled
    there cost a formatted task ``repr`` (anyio names the cancelling task in its
    reason), a task group and a named task on every streamed call."""

    def __init__(self, relay: _Relay, headers: dict[str, str], media_type: str) -> None:
        self.relay = relay
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        delivered = ending = False
        chunks = self.relay.chunks()
        relaying = anyio.CancelScope()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not ending:  # the client left before the end: stop relaying
                relaying.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            with relaying:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                ending = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                delivered = True
        except OSError:
            pass  # the client went away while we were sending
        finally:
            watcher.cancel()  # (also marks a receive that failed as seen: nothing to report)
            with anyio.CancelScope(shield=True):
                await chunks.aclose()  # type: ignore[attr-defined]
                await self.relay.close(delivered)
