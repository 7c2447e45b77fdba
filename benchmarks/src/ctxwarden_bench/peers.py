"""Peers in the trace tables: litellm's ``trim_messages`` and ``compress``, headroom-ai's
``compress`` (``pip install -e "./benchmarks[peers]"``), each run offline as a user would call it.

Every peer gets the history before a tool call as OpenAI chat dicts (what its users
pass) and the budget in the shape its API takes; what it returns is converted back to
messages and measured exactly as ctxwarden's contexts are (retention, reduction,
invariant problems, over budget, gpt-4o counts of the messages; tool definitions a peer
asks to add are not counted). Offline modes: ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no
cost-map download), headroom's ``kompress_model="disabled"`` (no model weights).

* ``litellm trim_messages``: ``trim_messages(msgs, model="gpt-4o", max_tokens=budget,
  trim_ratio=1.0)`` (the default ratio, 0.75, would aim below the budget).
* ``litellm compress``: ``compress(msgs, model="gpt-4o", compression_trigger=budget,
  compression_target=budget)``. It raises on ``content: None`` (tool-call messages), so
  those contents are sent as ``""``; stubs of dropped messages name its retrieval tool.
* ``litellm compress (fitted)``: the same, the target halved (at most 4 times) until
  the result fits the budget: its relevance selection held to the budget.
* ``headroom compress``: ``compress(msgs, model="gpt-4o", model_limit=budget,
  kompress_model="disabled")``: it compresses content in place and drops nothing.

A peer that raises on a history is counted in ``errors`` and the history is sent
unchanged (what a caller's fallback sends), so the failure shows as over budget.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import messages_from_openai, messages_to_openai

__all__ = ["PEERS", "PeerBuilder", "peer_builders"]

Compressor = Callable[[list[dict[str, Any]], int], list[dict[str, Any]]]


class PeerBuilder:
    """A :data:`~ctxwarden_bench.retention.Builder` around one peer's function, counting
    the calls that raised."""

    def __init__(self, name: str, compress: Compressor, model: str = "gpt-4o") -> None:
        self.name = name
        self.compress = compress
        self.counter = TokenCounter.for_model(model)
        self.errors = 0
        self.error_examples: list[str] = []

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        wire = messages_to_openai(before)
        try:
            out = self.compress(wire, budget)
        except Exception as exc:  # a peer's own failure is a measured outcome
            self.errors += 1
            if len(self.error_examples) < 3:
                self.error_examples.append(f"{type(exc).__name__}: {exc}"[:200])
            return list(before)
        return _as_messages(out, before)


def _as_messages(out: Sequence[dict[str, Any]], before: Sequence[Message]) -> list[Message]:
    """A peer's dicts as messages; one equal to an input message keeps its id, others
    get ids of their own, except a last message in the newest one's place (same role
    and call id: the newest, compressed in place), which keeps the newest's id."""
    by_fingerprint = {m.fingerprint: m for m in before}
    result: list[Message] = []
    for i, m in enumerate(messages_from_openai(list(out))):
        same = by_fingerprint.get(m.fingerprint)
        result.append(same if same is not None else replace(m, id=f"peer:{i}"))
    if result and before:
        last, newest = result[-1], before[-1]
        if (last.role, last.tool_call_id) == (newest.role, newest.tool_call_id):
            result[-1] = replace(last, id=newest.id)
    return result


def _no_none(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(m, content="") if m.get("content") is None else m for m in messages]


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:
        raise MissingDependencyError("the bench's litellm peers", "peers") from exc
    # trim_messages logs the traceback of every failure it swallows (content: None):
    # they are counted as over budget instead, keep the table readable
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    return litellm


def _trim(model: str) -> Compressor:
    from litellm.utils import trim_messages

    def run(msgs: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
        out = trim_messages(msgs, model=model, max_tokens=budget, trim_ratio=1.0)
        return list(out[0] if isinstance(out, tuple) else out)

    return run


def _compress(model: str, counter: TokenCounter, fitted: bool) -> Compressor:
    litellm = _litellm()

    def run(msgs: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
        clean = _no_none(msgs)
        target = budget
        for _ in range(5 if fitted else 1):
            out = list(
                litellm.compress(
                    clean, model=model, compression_trigger=budget, compression_target=target
                )["messages"]
            )
            if counter.count_messages(messages_from_openai(out)).tokens <= budget:
                break
            target //= 2
        return out

    return run


def _headroom(model: str) -> Compressor:
    try:
        import headroom
    except ImportError as exc:
        raise MissingDependencyError("the bench's headroom-ai peer", "peers") from exc

    def run(msgs: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
        result = headroom.compress(msgs, model=model, model_limit=budget, kompress_model="disabled")
        return list(result.messages)

    return run


PEERS = (
    "litellm trim_messages",
    "litellm compress",
    "litellm compress (fitted)",
    "headroom compress",
)


def peer_builders(model: str = "gpt-4o", names: Sequence[str] = PEERS) -> dict[str, PeerBuilder]:
    """One fresh :class:`PeerBuilder` per peer name (``MissingDependencyError`` without
    the ``peers`` extra)."""
    _litellm()
    counter = TokenCounter.for_model(model)
    make: dict[str, Callable[[], Compressor]] = {
        "litellm trim_messages": lambda: _trim(model),
        "litellm compress": lambda: _compress(model, counter, fitted=False),
        "litellm compress (fitted)": lambda: _compress(model, counter, fitted=True),
        "headroom compress": lambda: _headroom(model),
    }
    unknown = [n for n in names if n not in make]
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown}; known: {', '.join(PEERS)}")
    return {name: PeerBuilder(name, make[name](), model) for name in names}
