"""The measures a policy is scored by, shared by ``ctxwarden tune`` and the bench
(``ctxwarden_bench``, a separate distribution that imports them from here).

At a recorded tool call, a value of its arguments is *needed* when an earlier message
mentions it (:func:`needed_values` for JSON arguments, :func:`needed_tokens` for the
distinctive tokens of a shell command); a built context *keeps* it when one of its
messages mentions it (:class:`Mentions`: a whole-token, case-sensitive match in a
message's text, its calls' names and arguments). A built context must also hold the
invariants a provider or an agent depends on (:func:`invariant_problems`), and what a
prompt cache would serve of it is :func:`common_prefix_tokens`. The baseline is the plain
pair-safe "newest that fit" window (:func:`plain_window`, :func:`plain_builder`); ours is
:class:`EngineBuilder`, ``build_context`` driven as an agent loop calls it.

They live in the runtime package because ``ctxwarden tune`` scores with them; the bench's
tables import them rather than keep a copy.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import group_blocks, pairing_problems
from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter

__all__ = [
    "ID_KEYS",
    "MIN_VALUE_CHARS",
    "Builder",
    "EngineBuilder",
    "Mentions",
    "common_prefix_tokens",
    "distinctive",
    "invariant_problems",
    "json_leaves",
    "message_text",
    "needed_tokens",
    "needed_values",
    "plain_builder",
    "plain_window",
]

# The tau-bench airline keys whose values are ids: a measure's grouping of needed values
# (reported apart), never a rule of the build.
ID_KEYS = frozenset({"user_id", "reservation_id", "flight_number", "payment_id"})
MIN_VALUE_CHARS = 3
_WORD = re.compile(r"\w+")
_SPLIT = re.compile(r"[^\w./-]+")
_CAMEL = re.compile(r"[a-z][A-Z]")

Builder = Callable[[Sequence[Message], Sequence[int], int], list[Message]]
"""(messages before the call, their token counts, budget) -> the context to send."""


def message_text(m: Message) -> str:
    """What a match is looked for in: the content, and each call's name and arguments."""
    return "\n".join([m.text] + [f"{c.name} {c.arguments}" for c in m.tool_calls])


class Mentions:
    """Whole-token lookup over a growing set of messages: a value that is one ``\\w+``
    token is a set lookup; anything else is a boundary regex over the texts."""

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self.tokens: set[str] = set()
        self.texts: list[str] = []
        for m in messages:
            self.add(m)

    def add(self, m: Message) -> None:
        text = message_text(m)
        self.texts.append(text)
        self.tokens.update(_WORD.findall(text))

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, str) or not value:
            return False
        if _WORD.fullmatch(value):
            return value in self.tokens
        pattern = re.compile(r"(?<!\w)" + re.escape(value) + r"(?!\w)")
        return any(pattern.search(t) for t in self.texts)


def invariant_problems(before: Sequence[Message], ctx: Sequence[Message]) -> list[str]:
    """What breaks ``ctx`` as the context for the call that follows ``before``: a tool
    call without its result or a result without its call (providers reject those), the
    system prompt not first, a message twice."""
    problems = [f"{p.problem} {p.call_id}" for p in pairing_problems(ctx)]
    system = before[0] if before and before[0].role == "system" else None
    if system and (not ctx or ctx[0].role != "system" or system.text not in ctx[0].text):
        problems.append("system prompt missing")
    ids = Counter(m.id for m in ctx if m.id)
    problems += [f"message {i} twice" for i, n in ids.items() if n > 1]
    return problems


def plain_builder() -> Builder:
    """The baseline: system prompt, then the newest pair-safe blocks that fit."""

    def build(before: Sequence[Message], counts: Sequence[int], budget: int) -> list[Message]:
        kept, _ = plain_window(before, counts, budget)
        return [before[i] for i in kept]

    return build


class EngineBuilder:
    """ctxwarden's ``build_context`` with the default policy (or ``policy``). ``loop``:
    given its previous build of the same run, as an agent loop calls it; else every
    build is cold (no ``previous``), as after a restart. ``summarizer`` (a spec such as
    ``"offline"``) is passed to ``build_context``. A build that raises
    :class:`~ctxwarden.core.errors.BudgetError` (the budget cannot hold the system prompt
    and the newest turn) is counted in ``errors`` and the plain window is sent instead,
    as a caller's fallback would."""

    def __init__(
        self,
        model: str = "gpt-4o",
        *,
        loop: bool = True,
        policy: Any = None,
        summarizer: Any = None,
    ):
        self.model, self.loop, self.policy, self.summarizer = model, loop, policy, summarizer
        self.errors = 0
        self.error_examples: list[str] = []
        self._run: list[Message] | None = None
        self._built: Any = None

    def build(self, before: Sequence[Message], budget: int) -> Any:
        """The :class:`~ctxwarden.BuiltContext` of ``before`` (raises what the build
        raises; after an error the next build is cold)."""
        from ctxwarden.pipeline.engine import build_context

        previous = None
        if self.loop and self._run is not None:
            n = len(self._run)
            if len(before) >= n and before[n - 1].fingerprint == self._run[-1].fingerprint:
                previous = self._built
        self._run = self._built = None
        built = build_context(
            before,
            model=self.model,
            max_input_tokens=budget,
            previous=previous,
            policy=self.policy,
            summarizer=self.summarizer,
        )
        self._run, self._built = list(before), built
        return built

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        from ctxwarden.core.errors import BudgetError

        try:
            built = self.build(before, budget)
        except BudgetError as exc:
            self.errors += 1
            if len(self.error_examples) < 3:
                self.error_examples.append(str(exc)[:200])
            return plain_builder()(before, counts, budget)
        return list(built.messages)


def common_prefix_tokens(
    previous: Sequence[Message],
    current: Sequence[Message],
    counter: TokenCounter,
    tools_tokens: int,
) -> int:
    """Tokens of ``current`` a prompt cache filled by ``previous`` would serve.

    The prefix is measured in whole messages (compared by fingerprint, which covers
    everything the provider sees), then converted to tokens; the tool definitions come
    first in the request, so they belong to any non-empty common prefix.
    """
    same = 0
    for a, b in zip(previous, current, strict=False):
        if a.fingerprint != b.fingerprint:
            break
        same += 1
    if same == 0:
        return 0
    return tools_tokens + sum(counter.count_message(m) for m in current[:same])


def plain_window(
    messages: Sequence[Message], counts: Sequence[int], budget: int
) -> tuple[list[int], int]:
    """The baseline window: the system prompt plus the newest blocks that fit.

    Blocks (a tool call with its results, or one message) are taken newest first; a
    block that does not fit is skipped and older, smaller blocks may still fit, the
    way a "newest that fit" loop over cached counts behaves. Returns the kept indices
    (in order) and the tokens of the result (reply priming included).
    """
    used = REPLY_PRIMING
    kept: list[int] = []
    start = 0
    if messages and messages[0].role == "system":
        used += counts[0]
        kept.append(0)
        start = 1
    chosen: list[range] = []
    for block in reversed(group_blocks(messages[start:])):
        lo, hi = block.start + start, block.end + start
        size = sum(counts[lo:hi])
        if used + size > budget:
            continue
        used += size
        chosen.append(range(lo, hi))
    for r in reversed(chosen):
        kept.extend(r)
    return kept, used


def distinctive(token: str) -> bool:
    """A file path, dotted name or identifier: what a later command reuses."""
    if len(token) < 4:
        return False
    return any(c in token for c in "/._") or token.isdigit() or bool(_CAMEL.search(token))


def needed_tokens(command: str, earlier: Mentions, given: Mentions) -> list[str]:
    """The distinctive tokens of ``command`` seen in ``earlier`` but not in ``given``
    (the system prompt and the task), once each, in order."""
    seen: dict[str, None] = {}
    for t in _SPLIT.split(command):
        if t and t not in seen and distinctive(t) and t not in given and t in earlier:
            seen[t] = None
    return list(seen)


def json_leaves(obj: Any, key: str | None = None) -> Iterable[tuple[str | None, Any]]:
    """Every scalar of a parsed JSON value with the object key that holds it (an array's
    items under its key; None at the top)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from json_leaves(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from json_leaves(v, key)
    else:
        yield key, obj


def needed_values(call_arguments: Any, earlier: Mentions) -> list[tuple[str, str]]:
    """The argument values of one call that an earlier message mentions, as ``(value,
    group)``: every leaf of at least :data:`MIN_VALUE_CHARS` characters (numbers as
    written by ``str``, booleans and nulls skipped), once per call; the group is
    ``"ids"`` for a leaf under one of :data:`ID_KEYS`, else ``"other"``."""
    out: dict[str, str] = {}
    for k, v in json_leaves(call_arguments):
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            continue
        text = v if isinstance(v, str) else str(v)
        if len(text) >= MIN_VALUE_CHARS and text not in out and text in earlier:
            out[text] = "ids" if k in ID_KEYS else "other"
    return list(out.items())
