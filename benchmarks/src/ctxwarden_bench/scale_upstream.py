"""A local model for the replica benchmark and tests: a tool-using agent and a slow summariser.

One threaded HTTP server speaking the chat-completions wire format, answering from the
request alone (so every replica and every run gets the same answer to the same
context):

- the **agent** (any model but :data:`SUMMARY_MODEL`): to a user message ``Turn N: ...``
  it answers with a ``lookup`` tool call ``call_N`` for order ``ORD-N``; to that tool's
  result, with a text naming the order. :func:`next_turn` is the client's side of it.
- the **summariser** (:data:`SUMMARY_MODEL`, as ``--summarizer openai:gpt-4o-mini``
  calls it): a summary answer waits ``summary_delay`` seconds (2 s by default, a
  realistic summary call) and names the orders the transcript mentions; a facts
  extraction answers ``{}`` at once.

Requests are counted per kind (``agent``, ``summary``, ``facts``), and the messages of
every agent request are kept in order, for the checks.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from typing import Any

from ctxwarden_bench.local_servers import LocalJSONServer

__all__ = ["SUMMARY_MODEL", "ScaleUpstream", "first_turn", "next_turn", "what_it_says"]

SUMMARY_MODEL = "gpt-4o-mini"
_TURN = re.compile(r"Turn (\d+):")
_ORDER = re.compile(r"ORD-\d+")


def first_turn(
    system: str = "You are a support agent. Look orders up before answering.",
) -> list[dict[str, Any]]:
    """The history a session starts with: a system prompt and the first user message."""
    return [{"role": "system", "content": system}, _user(0)]


def _user(n: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"Turn {n}: where is my order ORD-{1000 + n}? I paid {20 + n} EUR.",
    }


def next_turn(history: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The history the client sends next: ``reply`` (the assistant message it got), then
    the tool's result when it is a call, else the next user message."""
    out = [*history, reply]
    calls = reply.get("tool_calls") or []
    if calls:
        call = calls[0]
        order = json.loads(call["function"]["arguments"])["order"]
        result = {"order": order, "status": "shipped", "carrier": "DHL", "eta": "Monday",
                  "events": [f"{order} scanned at hub {i}" for i in range(6)]}  # fmt: skip
        out.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    else:
        turns = sum(1 for m in out if m["role"] == "user")
        out.append(_user(turns))
    return out


def what_it_says(message: dict[str, Any]) -> tuple[Any, ...]:
    """A message as the checks compare it: role, text, call id, tool calls (an SDK may
    spell an empty text as ``None`` or ``""``)."""
    calls = tuple(
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or ()
    )
    return (message["role"], message.get("content") or "", message.get("tool_call_id"), calls)


def _completion(message: dict[str, Any], model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scale",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    }


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def kind_of(body: dict[str, Any]) -> str:
    """``agent``, ``summary`` or ``facts`` (see the module docstring)."""
    messages = body.get("messages") or []
    if str(body.get("model", "")) != SUMMARY_MODEL:
        return "agent"
    return "facts" if messages and "JSON" in _text(messages[0]) else "summary"


def answer(body: dict[str, Any], summary_delay: float) -> tuple[str, dict[str, Any]]:
    """The kind of request and the completion for it (see the module docstring)."""
    model = str(body.get("model", ""))
    messages = body.get("messages") or []
    kind = kind_of(body)
    if kind != "agent":
        prompt = _text(messages[-1]) if messages else ""
        if kind == "facts":
            return "facts", _completion({"role": "assistant", "content": "{}"}, model)
        time.sleep(summary_delay)
        orders = sorted(set(_ORDER.findall(prompt)))
        text = (
            f"The user asked where {len(orders)} orders are ({', '.join(orders[:6])}"
            f"{', ...' if len(orders) > 6 else ''}); the agent looked each one up: all "
            "shipped with DHL, due Monday."
        )
        return "summary", _completion({"role": "assistant", "content": text}, model)
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        order = json.loads(_text(last)).get("order", "the order")
        reply = {
            "role": "assistant",
            "content": f"Order {order} has shipped with DHL; it arrives Monday.",
        }
        return "agent", _completion(reply, model)
    found = _TURN.search(_text(last))
    n = int(found.group(1)) if found else 0
    arguments = json.dumps({"order": f"ORD-{1000 + n}"})
    call = {"id": f"call_{n}", "type": "function",
            "function": {"name": "lookup", "arguments": arguments}}  # fmt: skip
    return "agent", _completion({"role": "assistant", "content": None, "tool_calls": [call]}, model)


class ScaleUpstream(LocalJSONServer):
    """The server, on a free loopback port, in a daemon thread (see the module)."""

    prefix = "/v1"

    def __init__(self, summary_delay: float = 2.0) -> None:
        super().__init__()
        self.summary_delay = summary_delay
        self.counts: Counter[str] = Counter()
        self.contexts: list[str] = []  # the messages of every agent request, in order
        self._lock = threading.Lock()

    def answer(self, body: bytes) -> tuple[int, Any]:
        request = json.loads(body or b"{}")
        kind = kind_of(request)
        with self._lock:  # counted on arrival: a summary is then being waited on
            self.counts[kind] += 1
            if kind == "agent":
                self.contexts.append(json.dumps(request.get("messages"), sort_keys=True))
        return 200, answer(request, self.summary_delay)[1]
