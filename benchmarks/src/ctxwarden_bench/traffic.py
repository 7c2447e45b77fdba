"""Deterministic agent traffic for the engine benchmarks (no data files needed).

:func:`agent_traffic` is an endless support-agent conversation whose tool results have
the sizes real tools return; :func:`session_calls` cuts it at the points where an agent
calls the model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from ctxwarden.core.messages import Message, ToolCall

__all__ = ["agent_traffic", "one_prompt_traffic", "session_calls"]

_VOCABULARY = (
    "order refund shipping invoice account customer address payment card delivery "
    "warehouse status update please confirm check the a to of and for with your my is was "
    "will can we I you need would like cancel change return exchange item size colour "
    "price discount policy ticket escalate tracking carrier parcel delayed today tomorrow "
    "week"
)
_WORDS = _VOCABULARY.split()
_CITIES = ("Lisbon", "Kraków", "Denver", "Osaka", "Nairobi", "Toronto", "Lyon", "Kyiv")


def one_prompt_traffic(seed: int = 0) -> Iterator[Message]:
    """:func:`agent_traffic` with only its first user message: a coding agent's run (one
    request, then every tool call and reply the model makes), the shape Claude Code and
    Codex send. The window never starts after the newest user message, so such a run is
    the case where the window's region is the whole history."""
    asked = False
    for m in agent_traffic(seed):
        if m.role == "user":
            if asked:
                continue
            asked = True
        yield m


def agent_traffic(seed: int = 0) -> Iterator[Message]:
    """An endless, deterministic support-agent conversation (system prompt first).

    Each turn: a user message, zero to three tool steps (a quarter of them two parallel
    calls), each result JSON of a size drawn to match real tools — mostly a 60-250 token
    record, often a 200-600 token list, one in eight a 800-3,000 token search page (which
    truncation cuts), one in twenty a stack trace — then an assistant reply. Every
    message is unique (ids, numbers), so no cache gets a free hit across turns.
    """
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))) + "."

    def record(k: int) -> dict[str, Any]:
        return {
            "order_id": f"ORD-{rng.randint(10_000, 99_999)}",
            "customer": f"{rng.choice(_CITIES).lower()}_{k}@example.com",
            "amount": f"{rng.randint(5, 900)}.{rng.randint(0, 99):02d}",
            "currency": "EUR",
            "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "status": rng.choice(("shipped", "pending", "refunded", "delivered")),
            "note": words(3, 25),
        }

    def result(k: int) -> tuple[str, str, dict[str, Any]]:
        r = rng.random()
        if r < 0.05:
            frames = "".join(
                f'  File "/usr/lib/python3.11/site-packages/lib{i}/core.py", '
                f"line {i * 7}, in f{i}\n"
                for i in range(rng.randint(8, 30))
            )
            trace = f"Traceback (most recent call last):\n{frames}KeyError: 'ORD-{k}'"
            return "refund_order", trace, {"order_id": f"ORD-{k}"}
        if r < 0.55:
            return "get_order", json.dumps(record(k)), {"order_id": f"ORD-{k}"}
        size = rng.randint(3, 8) if r < 0.87 else rng.randint(12, 45)
        items = [record(k * 100 + i) for i in range(size)]
        return "search_orders", json.dumps({"results": items, "total": size}), {"q": words(1, 3)}

    yield Message.system(
        "You are the support agent of a web shop. Be brief. " + words(150, 250), id="m0"
    )
    index, call_no = 1, 0

    def next_id() -> str:
        nonlocal index
        index += 1
        return f"m{index - 1}"

    while True:
        yield Message.user(words(6, 60) + f" My order is ORD-{index}.", id=next_id())
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3))):
            parallel = 2 if rng.random() < 0.25 else 1
            calls, results = [], []
            for _ in range(parallel):
                call_no += 1
                name, content, args = result(call_no)
                call = ToolCall(f"call_{call_no}", name, json.dumps(args))
                calls.append(call)
                results.append((call, content))
            yield Message.assistant(None, tuple(calls), id=next_id())
            for call, content in results:
                yield Message.tool(content, call.id, call.name, id=next_id())
        yield Message.assistant(words(15, 120), id=next_id())


def session_calls(seed: int, calls: int) -> Iterator[list[Message]]:
    """The history at each model call: after a user message or a tool step's last result."""
    history: list[Message] = []
    stream = agent_traffic(seed)
    pending = next(stream)
    made = 0
    while made < calls:
        message, pending = pending, next(stream)
        history.append(message)
        if message.role == "user" or (message.role == "tool" and pending.role != "tool"):
            made += 1
            yield history
