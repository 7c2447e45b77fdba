"""An upstream that answers instantly, for ``python -m ctxwarden_bench.proxy``.

A bare asyncio HTTP/1.1 server (keep-alive, no framework) speaking just enough of the
chat-completions wire format — a JSON completion, or a stream of SSE chunks (role, five
text deltas, finish, usage, ``[DONE]``) in chunked encoding — and, on ``/v1/messages``,
of Anthropic's: a JSON message, or its stream of events (``message_start``, a text block
in five deltas, ``ping``, ``message_delta`` with the usage, ``message_stop``). It reads
the whole body (the proxy's cost of sending it is real) but parses none of it, so what
the benchmark measures is the proxy, not the upstream. On ``/v1/responses`` it speaks the
Responses API: a response object, or its events (``response.created``, the message item
added, five ``response.output_text.delta``, the item done, ``response.completed`` with
the usage). It runs in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator

from ctxwarden_bench.local_servers import stop_process

__all__ = ["REPLY_TEXT", "main", "running", "serve"]

REPLY_TEXT = "The order ships on Monday."

_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY_TEXT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 7, "total_tokens": 1007},
    }
).encode()


def _chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _stream_frames(include_usage: bool) -> bytes:
    words = REPLY_TEXT.split(" ")
    pieces = [" ".join(words[:2]), *(" " + w for w in words[2:])]
    frames = [_chunk({"role": "assistant", "content": ""})]
    frames += [_chunk({"content": p}) for p in pieces]
    frames.append(_chunk({}, "stop"))
    if include_usage:
        usage = {"prompt_tokens": 1000, "completion_tokens": 7, "total_tokens": 1007}
        frames.append({**_chunk({}), "choices": [], "usage": usage})
    text = "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"
    return text.encode()


_SSE = {True: _stream_frames(True), False: _stream_frames(False)}

_ANTHROPIC_USAGE = {"input_tokens": 1000, "output_tokens": 7}
_MESSAGE = json.dumps(
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": REPLY_TEXT}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _ANTHROPIC_USAGE,
    }
).encode()


def _anthropic_events() -> bytes:
    words = REPLY_TEXT.split(" ")
    pieces = [" ".join(words[:2]), *(" " + w for w in words[2:])]
    start = {**json.loads(_MESSAGE), "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": 1000, "output_tokens": 1}
    events: list[tuple[str, dict[str, object]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
        *(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": p}}) for p in pieces),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 7},
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()


_EVENTS = _anthropic_events()

_TEXT_PART = {"type": "output_text", "text": REPLY_TEXT, "annotations": []}
_OUTPUT = [{"type": "message", "id": "msg_bench", "role": "assistant", "status": "completed",
            "content": [_TEXT_PART]}]  # fmt: skip
_RESPONSE_USAGE = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": 1007}  # fmt: skip
_RESPONSE_OBJECT = {"id": "resp_bench", "object": "response", "created_at": 1_700_000_000,
                    "status": "completed", "model": "gpt-4o", "output": _OUTPUT,
                    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                    "store": False, "usage": _RESPONSE_USAGE}  # fmt: skip
_RESPONSE = json.dumps(_RESPONSE_OBJECT).encode()


def _response_events() -> bytes:
    words = REPLY_TEXT.split(" ")
    pieces = [" ".join(words[:2]), *(" " + w for w in words[2:])]
    start = {**_RESPONSE_OBJECT, "status": "in_progress", "output": [], "usage": None}
    item = {**_OUTPUT[0], "status": "in_progress", "content": []}
    ids = {"item_id": "msg_bench", "output_index": 0, "content_index": 0}
    events: list[dict[str, object]] = [
        {"type": "response.created", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ids,
         "part": {"type": "output_text", "text": "", "annotations": []}},
        *({"type": "response.output_text.delta", **ids, "delta": p, "logprobs": []}
          for p in pieces),
        {"type": "response.output_text.done", **ids, "text": REPLY_TEXT, "logprobs": []},
        {"type": "response.content_part.done", **ids, "part": _TEXT_PART},
        {"type": "response.output_item.done", "output_index": 0, "item": _OUTPUT[0]},
        {"type": "response.completed", "response": _RESPONSE_OBJECT},
    ]  # fmt: skip
    frames = (f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n"
              for i, e in enumerate(events))  # fmt: skip
    return "".join(frames).encode()


_RESPONSE_EVENTS = _response_events()


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            anthropic = path.startswith(b"/v1/messages")
            responses = path.startswith(b"/v1/responses")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if b'"stream": true' in body or b'"stream":true' in body:
                usage = b'"include_usage": true' in body or b'"include_usage":true' in body
                events = _EVENTS if anthropic else _RESPONSE_EVENTS if responses else _SSE[usage]
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n" + _chunked(events)
                )
            else:
                reply = _MESSAGE if anthropic else _RESPONSE if responses else _COMPLETION
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(reply), reply)
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def running(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """This upstream in a process of its own on ``port``, from when it listens; stopped
    on leaving. (:mod:`ctxwarden_bench.proxy_cost` starts its own: its measured process
    may run an older checkout, whose module has no such helper.)"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxwarden_bench.proxy_upstream", str(port)],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it says when it listens
        yield proc
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def main(argv: list[str] | None = None) -> None:
    port = int((argv or sys.argv[1:])[0])
    asyncio.run(serve(port))


if __name__ == "__main__":
    main()
