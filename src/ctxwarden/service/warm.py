"""One build before the server takes its first call.

The first proxied call of a fresh process paid for what every later call finds ready:
the ``o200k_base`` encoding read and its ranks built (~0.2 s; it counts every OpenAI
model of the registry but gpt-4 / 3.5, and every model counted by an estimate family),
and a first build's other one-time work (patterns compiled on first use). An agent's
first call through the proxy took ~0.3 s more than its second (a swebench run's call
at 10 messages: 305 ms, then 4-5 ms; 29 ms with the warm-up). ``ctxwarden serve`` now
does it once at startup, before it listens (and before it freezes what startup made
out of the collector's walks, :func:`ctxwarden.service._tune_gc`). The build is
:func:`~ctxwarden.build_context` of a small made-up tool loop: pure, nothing stored, and
no build after it depends on it (the caches it fills are keyed by content); it makes no
span (:func:`~ctxwarden.telemetry.spans.untraced`).
"""

from __future__ import annotations

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.telemetry.spans import untraced

__all__ = ["warm_up"]

_LINES = 400  # a result long enough to be cut within the budget below
_BUDGET = 2_000


def warm_up(model: str = "gpt-4o") -> None:
    """Build the context of :func:`_loop` for ``model``: loads its encoding and runs
    every step a tool loop runs (cutting a long result, the entity ledger, the fit)."""
    from ctxwarden.pipeline.engine import build_context

    history = _loop()
    answer = Message(role="tool", content="order 1004", tool_call_id="call_2", name="bash")
    with untraced():  # no span in the user's traces for a build no one asked for
        built = build_context(history, model, _BUDGET)
        build_context([*history, *_reply(2), answer], model, _BUDGET, previous=built)


def _loop() -> list[Message]:
    """A system prompt, a request and one answered tool call whose result is long."""
    listing = "\n".join(
        f"2026-01-{1 + i % 28:02d} 12:{i % 60:02d}:00 INFO order {1000 + i} shipped to "
        f"warehouse W{i % 7} (carrier UPS, tracking 1Z{i:08d})"
        for i in range(_LINES)
    )
    return [
        Message(role="system", content="You are an assistant that can run shell commands."),
        Message(role="user", content="Find the orders that went to warehouse W3 on January 5."),
        *_reply(1),
        Message(role="tool", content=listing, tool_call_id="call_1", name="bash"),
    ]


def _reply(n: int) -> list[Message]:
    """The agent's ``n``-th step: a call of the shell tool."""
    call = ToolCall(id=f"call_{n}", name="bash", arguments='{"command": "grep W3 orders.log"}')
    return [Message(role="assistant", content="", tool_calls=(call,))]
