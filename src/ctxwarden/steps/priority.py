"""Importance scoring and priority eviction, the last step of the cascade (R9).

When the budget still does not hold what the earlier steps kept (pinned messages,
critical ones), something that was meant to stay must go. It goes in order of
importance, lowest first:

* **priority** set by the caller: critical > high > medium > low (dominant term);
* **recency**: newer is more important;
* **relevance** to the current request: shared content words;
* **entity density**: ids, numbers, dates, names per token (what agents re-ask for);
* **correction**: the user corrected the agent right after this message (or this is
  the correction) — dropping it invites the same mistake again.

Pure functions of the messages: no I/O, deterministic, ties broken by position.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxwarden.core.messages import Message

__all__ = ["PRIORITY_WEIGHT", "eviction_order", "importance", "is_correction"]

PRIORITY_WEIGHT = {"critical": 100.0, "high": 10.0, "medium": 5.0, "low": 0.0}

_WORD = re.compile(r"\w+", re.UNICODE)
_ENTITY = re.compile(
    r"\b(?=[\w-]*\d)[\w-]{3,}\b"  # ids and numbers with letters or digits
    r"|\b\d{4}-\d{2}-\d{2}\b"  # dates
    r"|[$€£₴]\s?\d[\d,.]*"  # amounts
    r"|(?<=[a-z,;] )[A-Z][a-z]+"  # capitalised words mid-sentence
)
_CORRECTION = re.compile(
    r"^\s*(no[,.!]|nope|wrong|actually|not quite|that'?s (not|wrong)|i said|i meant|"
    r"instead|correction|ні[,.!]|не так|насправді|нет[,.!]|неправильно|вообще-то|"
    r"nie[,.!]|właściwie|źle)",
    re.IGNORECASE,
)


def is_correction(message: Message) -> bool:
    """A user message that opens by correcting the agent ("No, I said size L")."""
    return message.role == "user" and bool(_CORRECTION.search(message.text))


def _density(text: str) -> float:
    words = len(_WORD.findall(text)) or 1
    return min(len(_ENTITY.findall(text)) / words * 10.0, 3.0)


def _relevance(text: str, query: set[str]) -> float:
    if not query:
        return 0.0
    words = {w.lower() for w in _WORD.findall(text) if len(w) > 3}
    return min(len(words & query) / max(len(query), 1) * 3.0, 3.0)


def importance(
    messages: Sequence[Message], index: int, *, current: str = "", corrected: bool = False
) -> float:
    """The importance of ``messages[index]`` among ``messages`` (higher = keep longer)."""
    message = messages[index]
    query = {w.lower() for w in _WORD.findall(current) if len(w) > 3}
    recency = (index + 1) / len(messages) * 2.0
    score = PRIORITY_WEIGHT[message.priority] + recency
    score += _density(message.text) + _relevance(message.text, query)
    if corrected or is_correction(message):
        score += 4.0
    return score


def eviction_order(messages: Sequence[Message], *, current: str = "") -> list[Message]:
    """Messages in the order they should be evicted: least important first."""
    corrected = {
        i
        for i in range(len(messages) - 1)
        if messages[i].role == "assistant" and is_correction(messages[i + 1])
    }
    scored = [
        (importance(messages, i, current=current, corrected=i in corrected), i)
        for i in range(len(messages))
    ]
    return [messages[i] for _, i in sorted(scored)]
