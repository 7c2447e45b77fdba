"""A Responses API stream, read to account for it: the reply to store and the usage.

Upstream's frames reach the client byte for byte (``event:`` lines and all); each one's
``data`` is parsed here. The reply is the response's output items: those of the final
``response.completed`` (or ``response.incomplete``) event, else the items that
``response.output_item.done`` finished. A stream cut before its end keeps the text that
arrived (``response.output_text.delta``), marked partial; a call cut mid-arguments is
not a call to store. ``response.failed`` and ``error`` end the call as an upstream
error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ctxwarden import Usage
from ctxwarden.core.messages import Message
from ctxwarden.formats.responses import reply_from_output
from ctxwarden.service.sse import parse_frame

__all__ = ["ResponsesReader", "responses_usage"]

_ENDS = ("response.completed", "response.incomplete", "response.failed")
_DELTAS = ("output_text.delta", "function_call_arguments.delta", "reasoning")


def responses_usage(raw: Any) -> Usage | None:
    """A response's ``usage``: input tokens with their ``cached_tokens``, output tokens
    (``reasoning_tokens`` are part of them, priced as output)."""
    if not isinstance(raw, dict):
        return None
    details = raw.get("input_tokens_details") or {}
    try:
        return Usage.from_openai(
            int(raw.get("input_tokens") or 0),
            int(raw.get("output_tokens") or 0),
            int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
        )
    except (TypeError, ValueError):
        return None


class ResponsesReader:
    """Accounts for each frame of a Responses stream; ``record(response)`` gives the
    stored reply's response record (its id, whether upstream stored it)."""

    def __init__(self, record: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
        self.record = record
        self.response: dict[str, Any] = {}
        self.items: dict[int, dict[str, Any]] = {}
        self.text: dict[int, list[str]] = {}
        self.usage: Any = None
        self.error = False
        self.done = False
        self.tokens_seen = False

    @property
    def finished(self) -> bool:
        return self.done

    def frame(self, frame: bytes) -> bytes | None:
        _, data = parse_frame(frame)
        if data is not None:
            self._add(data)
        return frame

    def _add(self, data: str) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = str(event.get("type", ""))
        if kind == "response.created" and isinstance(event.get("response"), dict):
            self.response = event["response"]
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.items[int(event.get("output_index", len(self.items)))] = event["item"]
        elif kind == "response.output_text.delta":
            self.tokens_seen = True
            index = int(event.get("output_index", 0))
            self.text.setdefault(index, []).append(str(event.get("delta", "")))
        elif kind in _ENDS:
            response = event.get("response")
            if isinstance(response, dict):
                self.response = response
                self.usage = response.get("usage")
            self.error = kind == "response.failed"
            self.done = True
        elif kind == "error":
            self.error = True
        elif kind.startswith("response.") and any(d in kind for d in _DELTAS):
            self.tokens_seen = True

    def result(self, complete: bool) -> tuple[Message | None, Usage | None, str]:
        usage = responses_usage(self.usage)
        done = complete and self.done and not self.error
        if done:
            output = self.response.get("output")
            if not output:
                output = [item for _, item in sorted(self.items.items())]
            return reply_from_output(output, self.record(self.response)), usage, "complete"
        text = "".join("".join(parts) for _, parts in sorted(self.text.items()))
        status = "upstream_error" if self.error else "partial"
        if not text:
            return None, usage, status
        reply = Message.assistant(text)
        return replace(reply, meta={"partial": True}), usage, status
