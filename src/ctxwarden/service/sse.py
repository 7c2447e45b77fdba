"""Server-sent events as upstream sent them: split into frames, parsed only to account.

:class:`FrameSplitter` cuts the byte stream into whole frames (ending in a blank line)
and hands each back **byte for byte**, so what the client reads is what upstream wrote
(``event:`` lines, comments, ``data: [DONE]``). The accumulators read a parsed copy of
each frame to rebuild the reply for the store and the usage for accounting: OpenAI
chunks (text, tool-call deltas by ``index``, the usage chunk) and Anthropic events
(text, ``tool_use`` input JSON, thinking and signature deltas, usage from
``message_start`` merged with ``message_delta``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AnthropicReply", "FrameSplitter", "OpenAIReply", "parse_frame"]


class FrameSplitter:
    """Whole SSE frames out of arbitrary chunks (``\\n\\n`` or ``\\r\\n\\r\\n`` ends one)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._buf + chunk if self._buf else chunk
        frames: list[bytes] = []
        start = 0
        while True:
            lf = data.find(b"\n\n", start)
            crlf = data.find(b"\r\n\r\n", start)
            if lf < 0 and crlf < 0:
                break
            end = crlf + 4 if crlf >= 0 and (lf < 0 or crlf < lf) else lf + 2
            frames.append(data[start:end])
            start = end
        self._buf = data[start:]
        return frames

    def rest(self) -> bytes:
        """What came after the last whole frame (a stream cut mid-frame)."""
        rest, self._buf = self._buf, b""
        return rest


def parse_frame(frame: bytes) -> tuple[str | None, str | None]:
    """``(event, data)`` of one frame; ``data`` joins its ``data:`` lines."""
    event: str | None = None
    data: list[str] = []
    for raw in frame.decode("utf-8", "replace").splitlines():
        if raw.startswith("data:"):
            value = raw[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        elif raw.startswith("event:"):
            event = raw[6:].strip()
    return event, ("\n".join(data) if data else None)


@dataclass
class OpenAIReply:
    """The assistant message and usage rebuilt from chat-completion chunks."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    tokens_seen: bool = False

    def add(self, data: str) -> dict[str, Any] | None:
        """Account for one frame's data; returns the parsed chunk (``None`` for ``[DONE]``
        or a frame that is not JSON)."""
        if data.strip() == "[DONE]":
            self.done = True
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            return None
        if not isinstance(chunk, dict):
            return None
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
                self.tokens_seen = True
            for tc in delta.get("tool_calls") or ():
                self.tokens_seen = True
                slot = self.calls.setdefault(
                    int(tc.get("index", 0)), {"id": "", "name": "", "arguments": []}
                )
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] = fn.get("name") or slot["name"]
                if fn.get("arguments"):
                    slot["arguments"].append(fn["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return chunk

    def message(self, *, complete: bool) -> dict[str, Any]:
        """The reply as an OpenAI message; a partial one keeps its text only (a tool
        call cut mid-arguments is not a call to store)."""
        calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
            }
            for _, c in sorted(self.calls.items())
        ]
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if calls and complete:
            out["tool_calls"] = calls
        if out["content"] is None and "tool_calls" not in out:
            out["content"] = ""
        return out


@dataclass
class AnthropicReply:
    """The assistant content blocks and merged usage rebuilt from Messages API events."""

    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    partial_json: dict[int, list[str]] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    tokens_seen: bool = False

    def add(self, data: str) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            self._merge_usage((event.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            self.blocks[int(event.get("index", 0))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            self._close(int(event.get("index", 0)))
        elif kind == "message_delta":
            self._merge_usage(event.get("usage"))
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.error = event.get("error") or {}

    def _merge_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):  # message_delta repeats or updates message_start's
            self.usage.update({k: v for k, v in usage.items() if v is not None})

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        self.tokens_seen = True
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "input_json_delta":
            self.partial_json.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _close(self, index: int) -> None:
        parts = self.partial_json.pop(index, None)
        block = self.blocks.get(index)
        if parts is not None and block is not None:
            text = "".join(parts)
            try:
                block["input"] = json.loads(text) if text.strip() else {}
            except ValueError:
                block["input"] = {"_raw_arguments": text}
            block["_closed"] = True
        elif block is not None:
            block["_closed"] = True

    def content(self, *, complete: bool) -> list[dict[str, Any]]:
        """The reply's blocks; a partial reply keeps only its text blocks."""
        out = []
        for _, block in sorted(self.blocks.items()):
            closed = block.get("_closed", False)
            clean = {k: v for k, v in block.items() if k != "_closed"}
            wanted = complete or (clean.get("type") == "text" and clean.get("text"))
            if wanted and (clean.get("type") != "tool_use" or closed):
                out.append(clean)
        return out
