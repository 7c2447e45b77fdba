"""How the entity ledger ranks its values: what survives pressure (issue 12, item 2).

:class:`~ctxwarden.memory.entity_ledger.EntityLedger` keeps its entries highest rank
first, most recently seen first within a rank (and, within one tool result, the values
it lists first). The rank uses signals that hold in any domain, not one data set's keys:
an entry's category tier (:data:`~ctxwarden.memory.entities.CATEGORY_TIERS`: ids,
e-mails; then dates, codes, names, paths, identifiers, amounts; then times, quantities,
plain values; numbers last) plus:

* **+2 stated by the user**: the value occurs in a user message, or matches one there
  by a key: the same month-day in another date format ("May 27" and "2024-05-27"),
  a word of a name the user gave ("Sofia Kim" and ``first_name: Sofia``), case aside;
* **+1 written by the agent** in its own text, **+2 passed by it** in a tool call's
  arguments (what an agent named or passed once it tends to pass again: the file a
  coding agent keeps editing, the reservation a support agent works on);
* **+1 repeated**: seen in two or three messages, **+2** in four or more (what the
  conversation keeps returning to: the airports of every reservation) — not for
  times, quantities and amounts, which recur across records by coincidence (a price,
  a departure time);
* **+1 of a kind the agent passes**: the JSON key that labels the value (its last
  part: ``flights.date`` is ``date``) labels a value the agent passed in a tool call
  (:data:`KIND`). An agent working through a list of records passes the same fields of
  each in turn (every reservation's flight numbers and dates, not its passengers'
  birth dates); values found in free text are labelled by their category, not a key,
  and take no such bonus (a coding agent passing *a* path says nothing about the others).

And **a tier lower, no bonus**: a name, amount, code, date, time, quantity or plain
value that only a tool-using agent's own prose holds (no tool returned it, no user
said it, no call passed it): its labels ("Total Cost", "Cabin Class"), sums it worked
out, dates it restated. Ids, paths and code identifiers are exempt (a coding agent
names the file it is about to create), and so is the assistant of a conversation
without tools, whose words are first-hand (LoCoMo's second speaker). A number in the
agent's prose or in a call's arithmetic (``"expression": "1859 - 140"``) marks nothing.
Values under three characters and plain numbers take no bonus.

Measured (``python -m ctxwarden_bench.traces --tau --swebench``, default policy),
every tau-bench argument value at 1,600 / 2,000 tokens: 82.5% / 99.3% with the
bonuses alone; 94.9% / 99.6% with the render's handles and skips; 97.3% / 99.6% with
the rules for the agent's prose, arithmetic and coincident repeats, schema keys
(``address1``) out of the ledger and the eviction's block leaving out what the window
shows (:func:`~ctxwarden.steps.evict.EvictStep`); 98.1% / 99.6% with the bonus of the
kind the agent passes (the loop of the bench, ``build_context`` before every assistant
message: 97.5% without it). swebench-mini needed-later tokens 95.5% / 98.4% at 4,000 /
8,000 (the kind bonus leaves them as they were: a coding agent's values are not keyed).
"""

from __future__ import annotations

from typing import Protocol

from ctxwarden.core.caching import memoize
from ctxwarden.memory.entities import CATEGORY_TIERS, date_key

__all__ = [
    "AGENT",
    "CALL",
    "KIND",
    "LOW_RANK",
    "MARKS",
    "MATCH",
    "MAX_RANK",
    "MIN_RANKED_CHARS",
    "PROSE",
    "TOOL",
    "USER",
    "kind_of",
    "match_keys",
    "rank",
    "rank_of",
    "ranked",
]

USER = 1  # stated by the user
AGENT = 2  # written by the agent in its own text
CALL = 4  # passed by the agent in a tool call's arguments
MATCH = 8  # matching a value the user stated, in other words (a date's month-day, a name word)
TOOL = 16  # returned by a tool
PROSE = 32  # written by the agent in its own text once tools were used
KIND = 64  # labelled by a JSON key that labels a value the agent passed in a tool call
#: The mark of an entity's origin (:attr:`~ctxwarden.memory.entities.Entity.origin`).
MARKS = {"user": USER, "assistant": AGENT, "call": CALL, "tool": TOOL}
MAX_RANK = max(CATEGORY_TIERS.values()) + 7

#: Rank bonuses (see the module docstring): stated by the user, written by the agent,
#: passed in a tool call, seen in 2-3 messages, seen in 4 or more, of a kind passed.
USER_BONUS, AGENT_BONUS, CALL_BONUS, REPEAT_BONUS, FREQUENT_BONUS = 2, 1, 2, 1, 2
KIND_BONUS = 1
_RESTATED = frozenset({"name", "amount", "code", "date", "value", "time", "quantity"})
_COINCIDENT = frozenset({"time", "quantity", "amount"})
MIN_RANKED_CHARS = 3  # shorter values ("1", "no") take no bonus and go first
LOW_RANK = 1  # plain numbers, one-off times, quantities, values: a handle may displace them


class Ranked(Protocol):
    """What a rank is read from (a ledger entry)."""

    @property
    def value(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def hits(self) -> int: ...
    @property
    def marks(self) -> int: ...


def rank(category: str, hits: int, marks: int, size: int = MIN_RANKED_CHARS) -> int:
    """An entry's rank (higher survives longer); see the module docstring. Plain
    numbers and values under :data:`MIN_RANKED_CHARS` characters take no bonus: "1",
    "no" and "100" recur in every conversation and say nothing by being repeated."""
    r = CATEGORY_TIERS.get(category, 1)
    if r == 0 or size < MIN_RANKED_CHARS:
        return 0
    if marks & (USER | MATCH | CALL | TOOL) == 0 and marks & PROSE and category in _RESTATED:
        return max(r - 1, 0)  # only in a tool-using agent's prose: its wording, not data
    if marks & (USER | MATCH):
        r += USER_BONUS
    if marks & AGENT:
        r += AGENT_BONUS
    if marks & CALL:
        r += CALL_BONUS
    elif marks & KIND:  # (a value passed itself is of its kind: its own bonus is more)
        r += KIND_BONUS
    if category not in _COINCIDENT:
        r += FREQUENT_BONUS if hits >= 4 else REPEAT_BONUS if hits >= 2 else 0
    return min(r, MAX_RANK)


#: ``rank`` memoised by its arguments (renders and adds rank every entry they visit),
#: the size capped at :data:`MIN_RANKED_CHARS` (it only matters below): few distinct keys.
ranked = memoize(4096)(rank)


def rank_of(e: Ranked) -> int:
    """``rank`` of an entry (memoised: :data:`ranked`)."""
    size = len(e.value)
    return ranked(
        e.category, e.hits, e.marks, size if size < MIN_RANKED_CHARS else MIN_RANKED_CHARS
    )


@memoize(4096)
def kind_of(label: str) -> str | None:
    """The kind a value is of, for :data:`KIND`: the last part of the JSON key that
    labels it (``flights.date``: ``date``), or None when its label is a category (a
    value found in free text is labelled by its category: it has no key)."""
    if label in CATEGORY_TIERS:
        return None
    return label.rpartition(".")[2]


def match_keys(value: str, category: str) -> tuple[str, ...]:
    """The keys a value matches a user-stated one by: itself (case aside), its month-day
    when it is a date, each word when it is a name of several words."""
    if category == "date" or (category == "name" and " " in value):
        return _keys(value, category)
    return (value.casefold(),)


@memoize(65_536)
def _keys(value: str, category: str) -> tuple[str, ...]:
    keys = [value.casefold()]
    if category == "date":
        day = date_key(value)
        if day:
            keys.append("date:" + day)
    else:
        keys += [w.casefold() for w in value.split() if len(w) > 1]
    return tuple(keys)
