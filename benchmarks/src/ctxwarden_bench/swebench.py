"""swebench-mini: the needed-later tokens of a coding agent's shell commands, kept.

The trace is mini-swe-agent (one ``bash`` tool) on SWE-bench Verified tasks
(``../shared/data/swebench-mini/``). A command's *needed-later tokens*, as the data
README (section 3) defines them: split the command on ``[^\\w./-]+``; keep each token
(once per command) of at least 4 characters that contains ``/``, ``.`` or ``_``, a
camelCase step, or is all digits (file paths, dotted names, identifiers); drop those
that occur in the system prompt or the task (the first user message), since every
strategy keeps those; keep those that occur verbatim, word-bounded, in an earlier
message. Retention is the share of those uses still in the built context, by the same
word-bounded match (:mod:`ctxwarden_bench.retention`); reduction as for tau-bench.
Beside it, the share of the *names* among them (:func:`group_of`): 127 of the 3,303 uses
are a word with a sentence's full stop, a method with a call chain's dot, or a name with
an escape's letter glued to it.

Measured on the 44-run dev file: 3,303 uses (the README says 3,086; its exact
tokenisation is not given, and the variants tried, ``\\b`` boundaries, exclusion by
substring, matching within message content only, gave 2,494-3,360, none 3,086). The
bench's plain pair-safe window (a block that does not fit is skipped, older ones may
still fit) keeps 87.2% at 4,000 tokens (72.0% reduction) and 94.9% at 8,000 (47.9%);
a window that stops at the first block that does not fit keeps 84.2% / 94.0% at
75.3% / 50.7% reduction, closest to the README's 85.4% / 94.0% at 75.9% / 50.9%.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import messages_from_openai
from ctxwarden.tune.measures import distinctive, needed_tokens
from ctxwarden_bench.retention import (
    Builder,
    Mentions,
    Progress,
    Retention,
    call_retention,
)

__all__ = [
    "BUDGETS",
    "distinctive",
    "group_of",
    "load_swebench",
    "needed_tokens",
    "swebench_retention",
]

BUDGETS = (4000, 8000)


def load_swebench(path: str | Path) -> list[list[Message]]:
    """swebench-mini runs (a JSON list of runs with ``traj``) as message lists."""
    p = Path(path)
    if not p.exists():
        raise InvalidMessageError(f"swebench-mini file not found: {p}")
    try:
        runs = json.loads(p.read_text("utf-8"))
    except ValueError as exc:
        raise InvalidMessageError(f"swebench-mini file {p} is not JSON: {exc}") from exc
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "traj" in r for r in runs):
        raise InvalidMessageError(f"{path}: expected a list of runs, each with a 'traj' list")
    return [messages_from_openai(r["traj"]) for r in runs]


def _needed(m: Message, earlier: Mentions, before: Sequence[Message]) -> list[tuple[str, str]]:
    given = _given_of(before)
    out: list[tuple[str, str]] = []
    for c in m.tool_calls:
        command = c.parsed_arguments().get("command")
        if isinstance(command, str):
            out += [(t, group_of(t, command)) for t in needed_tokens(command, earlier, given)]
    return out


def group_of(token: str, command: str) -> str:
    """``"punctuated"`` for a needed token that the README's split leaves with a
    sentence's full stop at its end (``expected.`` of ``print("... as expected.")``), a
    call chain's dot at its start (``.strip`` of ``f().strip()``) or an escape's letter
    glued to it (``nos.makedirs`` of ``"\\nos.makedirs(d)"``): the measure counts the
    word, the method or the glued token, no path or name the agent reuses, wherever an
    earlier message ends a sentence with it, calls it or holds the same escape;
    ``"names"`` for the rest. The bench reports the retention of all of them (the
    measure asked) and of the names alone."""
    if token.endswith("."):
        return "punctuated"
    if token.startswith(".") and (f"){token}" in command or f"]{token}" in command):
        return "punctuated"
    if token[:1] in _ESCAPES and _escaped(command, token):
        return "punctuated"
    return "names"


_ESCAPES = frozenset("ntr")  # \n, \t, \r: the split keeps their letter on the next word


def _escaped(command: str, token: str) -> bool:
    """Whether ``token`` follows a backslash in ``command`` (an escape glued to it)."""
    return re.search(r"\\" + re.escape(token) + r"(?![\w./-])", command) is not None


_GIVEN: dict[str, Mentions] = {}


def _given_of(before: Sequence[Message]) -> Mentions:
    """Mentions of the system prompt and the task (first user message), per run."""
    head = [m for m in before[:3] if m.role == "system"]
    head += [next((m for m in before if m.role == "user"), Message.user(""))]
    key = "|".join(m.fingerprint for m in head)
    hit = _GIVEN.get(key)
    if hit is None:
        if len(_GIVEN) > 256:
            _GIVEN.clear()
        hit = _GIVEN[key] = Mentions(head)
    return hit


def swebench_retention(
    runs: Sequence[Sequence[Message]],
    budget: int,
    builder: Builder,
    model: str = "gpt-4o",
    progress: Progress = None,
) -> Retention:
    """Needed-later tokens kept by ``builder`` at ``budget`` over every bash call."""
    return call_retention(
        runs, budget, builder, _needed, model=model, progress=progress, label="swebench run"
    )
