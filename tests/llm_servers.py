"""In-process HTTP servers that speak the OpenAI, Anthropic and Gemini wire formats, for
tests.

The real ``openai`` / ``anthropic`` / ``google-genai`` SDKs are pointed at
``ScriptedServer.url``. Each test scripts the replies (status, body, headers, delay, or
SSE events) in order, or gives a ``responder`` that answers from the request (a fake
model), and then inspects ``server.requests`` to see exactly what the SDK sent. The
server binds 127.0.0.1 on a random port and never reaches past the machine.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = [
    "Recorded",
    "Reply",
    "ScriptedServer",
    "anthropic_error",
    "anthropic_message",
    "anthropic_stream",
    "gemini_error",
    "gemini_response",
    "gemini_stream",
    "openai_completion",
    "openai_error",
    "openai_stream",
    "openai_tool_calls",
    "openai_tool_stream",
    "scripted_server",
]


@dataclass
class Reply:
    """One scripted response. ``body`` may be a dict (sent as JSON), str or bytes (sent
    verbatim, e.g. malformed JSON); ``events`` (SSE frames) makes it a stream."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    events: list[str] | None = None
    frame_delay: float = 0.0  # seconds between SSE frames (a slow stream)


@dataclass
class Recorded:
    """One request as the server received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default 5 drops connections under a load test


class ScriptedServer:
    """A threaded HTTP server replaying a queue of :class:`Reply` objects; once the
    queue is empty, ``responder`` (if given) answers each request from its content."""

    def __init__(self, responder: Callable[[Recorded], Reply] | None = None) -> None:
        self.responder = responder
        self.requests: list[Recorded] = []
        self.aborted: list[Recorded] = []  # replies the client hung up on mid-way
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def reply(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in a scripted delay
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if self._replies:
                return self._replies.popleft()
            if self.responder is not None:
                return self.responder(recorded)
        return Reply(500, {"error": {"message": "no scripted reply left", "type": "test"}})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                recorded = Recorded(self.command, self.path, headers, body)
                reply = server._next(recorded)
                if reply.delay and server._stopping.wait(reply.delay):
                    return
                try:
                    self._send(reply)
                except OSError:  # the client gave up (a timeout, a cancelled stream)
                    server.aborted.append(recorded)

            do_GET = do_POST

            def _send(self, reply: Reply) -> None:
                if reply.events is not None:
                    self.send_response(reply.status)
                    self.send_header("content-type", "text/event-stream")
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    for i, frame in enumerate(reply.events):
                        if i and reply.frame_delay and server._stopping.wait(reply.frame_delay):
                            return
                        self.wfile.write(frame.encode())
                        self.wfile.flush()
                    return
                if isinstance(reply.body, bytes):
                    payload = reply.body
                elif isinstance(reply.body, str):
                    payload = reply.body.encode()
                else:
                    payload = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

        return Handler


@pytest.fixture
def scripted_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    try:
        yield server
    finally:
        server.stop()


# --- OpenAI chat-completions bodies ------------------------------------------------------


def openai_completion(
    text: str = "ok",
    *,
    prompt: int = 10,
    completion: int = 5,
    cached: int = 0,
    model: str = "gpt-4o-mini",
    finish_reason: str = "stop",
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def openai_tool_calls(
    calls: list[tuple[str, str, dict[str, Any]]],
    *,
    text: str | None = None,
    prompt: int = 10,
    completion: int = 5,
    model: str = "gpt-4o-mini",
) -> dict[str, Any]:
    """A completion whose message calls tools: ``(call id, function name, arguments)``."""
    body = openai_completion(
        "", prompt=prompt, completion=completion, model=model, finish_reason="tool_calls"
    )
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(a)}}
            for cid, name, a in calls
        ],
    }
    return body


def openai_stream(
    deltas: list[str],
    *,
    prompt: int = 10,
    completion: int = 5,
    cached: int = 0,
    model: str = "gpt-4o-mini",
    with_usage: bool = True,
) -> list[str]:
    """SSE frames of a streamed completion; with ``stream_options.include_usage`` the
    last chunk has empty ``choices`` and the usage."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    payloads = [chunk({"role": "assistant", "content": ""})]
    payloads += [chunk({"content": d}) for d in deltas]
    payloads.append(chunk({}, "stop"))
    if with_usage:
        final = chunk({})
        final["choices"] = []
        final["usage"] = openai_completion(prompt=prompt, completion=completion, cached=cached)[
            "usage"
        ]
        payloads.append(final)
    return [f"data: {json.dumps(p)}\n\n" for p in payloads] + ["data: [DONE]\n\n"]


def openai_tool_stream(
    calls: list[tuple[str, str, dict[str, Any]]],
    *,
    pieces: int = 3,
    prompt: int = 10,
    completion: int = 5,
    model: str = "gpt-4o-mini",
    with_usage: bool = True,
) -> list[str]:
    """SSE frames of a streamed tool-calling completion: per call a first delta with its
    ``index``, id and name, then the JSON arguments in ``pieces`` fragments (as OpenAI
    streams them), ``finish_reason: tool_calls``, then the usage chunk."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-tools",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    payloads = [chunk({"role": "assistant", "content": None})]
    for index, (cid, name, args) in enumerate(calls):
        first = {"index": index, "id": cid, "type": "function"}
        payloads.append(
            chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]})
        )
        text = json.dumps(args)
        step = max(1, -(-len(text) // pieces))
        for i in range(0, len(text), step):
            part = {"index": index, "function": {"arguments": text[i : i + step]}}
            payloads.append(chunk({"tool_calls": [part]}))
    payloads.append(chunk({}, "tool_calls"))
    if with_usage:
        final = chunk({})
        final["choices"] = []
        final["usage"] = openai_completion(prompt=prompt, completion=completion)["usage"]
        payloads.append(final)
    return [f"data: {json.dumps(p)}\n\n" for p in payloads] + ["data: [DONE]\n\n"]


def openai_error(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# --- Anthropic messages bodies -----------------------------------------------------------


def anthropic_message(
    text: str = "ok",
    *,
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int = 0,
    cache_write: int = 0,
    model: str = "claude-haiku-4-5",
    stop_reason: str = "end_turn",
    extra_content: list[dict[str, Any]] | None = None,
    iterations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_write,
    }
    if iterations is not None:
        usage["iterations"] = iterations
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [*(extra_content or []), {"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def anthropic_stream(
    deltas: list[str],
    *,
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int = 0,
    cache_write: int = 0,
    model: str = "claude-haiku-4-5",
) -> list[str]:
    """SSE events of a streamed message: input and cache usage arrive in
    ``message_start``, output tokens and the stop reason in ``message_delta``."""
    start = anthropic_message("", input_tokens=input_tokens, output_tokens=1, model=model)
    start["content"] = []
    start["stop_reason"] = None
    start["usage"]["cache_read_input_tokens"] = cache_read
    start["usage"]["cache_creation_input_tokens"] = cache_write
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    events += [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}},
        )
        for d in deltas
    ]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]


def anthropic_error(message: str, kind: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- Gemini generateContent bodies -------------------------------------------------------


def gemini_usage(prompt: int = 20, output: int = 5, cached: int = 0) -> dict[str, Any]:
    usage = {"promptTokenCount": prompt, "candidatesTokenCount": output,
             "totalTokenCount": prompt + output}  # fmt: skip
    if cached:
        usage["cachedContentTokenCount"] = cached
    return usage


def gemini_response(
    parts: list[dict[str, Any]], *, finish: str = "STOP", usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``generateContent`` response: one candidate whose content is ``parts``."""
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
        ],
        "usageMetadata": usage or gemini_usage(),
        "modelVersion": "gemini-2.5-flash",
        "responseId": "resp-1",
    }


def gemini_stream(
    chunks: list[list[dict[str, Any]]], *, usage: dict[str, Any] | None = None
) -> list[str]:
    """A ``streamGenerateContent?alt=sse`` stream: one ``data:`` frame per chunk of parts
    (``\\r\\n\\r\\n`` between frames, as Google writes them), the last with the
    ``finishReason`` and the ``usageMetadata``."""
    frames = []
    for i, parts in enumerate(chunks):
        last = i == len(chunks) - 1
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-2.5-flash"}
        if last:
            candidate["finishReason"] = "STOP"
            body["usageMetadata"] = usage or gemini_usage()
        frames.append(f"data: {json.dumps(body)}\r\n\r\n")
    return frames


def gemini_error(code: int, message: str, status: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}
