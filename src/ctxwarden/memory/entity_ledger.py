"""The entity ledger: values seen so far, deduplicated, trimmed to a token cap (issue 3, item 5).

:func:`~ctxwarden.memory.entities.extract_entities` finds the values; :class:`EntityLedger` keeps
them (first-seen order, so its rendering grows at the end and stays cacheable) and
renders a compact system block, dropping the least useful entries to fit a token
budget. :mod:`ctxwarden.steps.ledger` decides which messages feed it in a build.

**What survives pressure** (issue 12, item 2) is ranked by signals that hold in any
domain, not by one data set's keys. An entry's *rank* is its category's tier
(:data:`~ctxwarden.memory.entities.CATEGORY_TIERS`: ids, e-mails; then dates, codes,
names, paths, identifiers, amounts; then times, quantities, plain values; numbers
last) plus:

* **+2 stated by the user**: the value occurs in a user message, or matches one there
  by a key: the same month-day in another date format ("May 27" and "2024-05-27"),
  a word of a name the user gave ("Sofia Kim" and ``first_name: Sofia``), case aside;
* **+1 written by the agent** in its own text, **+2 passed by it** in a tool call's
  arguments (what an agent named or passed once it tends to pass again: the file a
  coding agent keeps editing, the reservation a support agent works on);
* **+1 repeated**: seen in two or three messages, **+2** in four or more (what the
  conversation keeps returning to: the airports of every reservation).

Values under three characters and plain numbers take no bonus. Entries are kept
highest rank first, most recently seen first within a rank. The block lists one line
per label, values separated by spaces (a comma costs a token per value; values with a
space are comma-separated), so a cap holds about a fifth more values.

Measured (``python -m ctxwarden.bench.traces --tau --swebench``, default policy): every
tau-bench argument value 97.3% / 78.9% at 2,000 / 1,600 tokens before (ranked by
category and recency, one comma-separated value after another), 99.3% / 82.5% after;
swebench-mini needed-later tokens 73.3% / 91.6% at 4,000 / 8,000 before, 94.4% / 97.6%
after (identifier extraction included).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from ctxwarden.memory.entities import CATEGORY_TIERS, Entity, date_key

__all__ = [
    "AGENT",
    "CALL",
    "DEFAULT_HEADER",
    "MATCH",
    "MAX_ENTRIES",
    "MAX_RANK",
    "MIN_RANKED_CHARS",
    "USER",
    "EntityLedger",
    "LedgerEntry",
    "listed",
    "match_keys",
    "rank",
]


DEFAULT_HEADER = "Known values from earlier messages (may have been removed from the context):"


class LedgerEntry(NamedTuple):
    """One remembered value (a named tuple: ledgers make thousands of them). ``hits``:
    messages it was seen in; ``marks``: :data:`USER` / :data:`AGENT` bits."""

    value: str
    label: str
    category: str
    source_id: str
    first_seen: int
    last_seen: int
    hits: int = 1
    marks: int = 0


USER = 1  # stated by the user
MATCH = 8  # matching a value the user stated, in other words (a date's month-day, a name word)
AGENT = 2  # written by the agent in its own text
CALL = 4  # passed by the agent in a tool call's arguments
_MARKS = {"user": USER, "assistant": AGENT, "call": CALL}
MAX_RANK = max(CATEGORY_TIERS.values()) + 7


#: Rank bonuses (see the module docstring): stated by the user, written by the agent,
#: passed in a tool call, seen in 2-3 messages, seen in 4 or more.
USER_BONUS, AGENT_BONUS, CALL_BONUS, REPEAT_BONUS, FREQUENT_BONUS = 2, 1, 2, 1, 2
MIN_RANKED_CHARS = 3  # shorter values ("1", "no") take no bonus and go first


def rank(category: str, hits: int, marks: int, size: int = MIN_RANKED_CHARS) -> int:
    """An entry's rank (higher survives longer); see the module docstring. Plain
    numbers and values under :data:`MIN_RANKED_CHARS` characters take no bonus: "1",
    "no" and "100" recur in every conversation and say nothing by being repeated."""
    r = CATEGORY_TIERS.get(category, 1)
    if r == 0 or size < MIN_RANKED_CHARS:
        return 0
    if marks & (USER | MATCH):
        r += USER_BONUS
    if marks & AGENT:
        r += AGENT_BONUS
    if marks & CALL:
        r += CALL_BONUS
    if hits >= 4:
        r += FREQUENT_BONUS
    elif hits >= 2:
        r += REPEAT_BONUS
    return min(r, MAX_RANK)


_RANKS: dict[tuple[str, int, int, int], int] = {}  # rank()'s arguments -> rank


def _rank_of(e: LedgerEntry) -> int:
    """``rank`` of an entry, memoised by its arguments (renders and adds rank every entry
    they visit); the size only matters below :data:`MIN_RANKED_CHARS`, so it is capped
    there."""
    key = (e.category, e.hits, e.marks, min(len(e.value), MIN_RANKED_CHARS))
    found = _RANKS.get(key)
    if found is None:
        if len(_RANKS) > 4096:
            _RANKS.clear()
        found = _RANKS[key] = rank(*key)
    return found


@lru_cache(maxsize=65_536)
def match_keys(value: str, category: str) -> tuple[str, ...]:
    """The keys a value matches a user-stated one by: itself (case aside), its month-day
    when it is a date, each word when it is a name of several words."""
    keys = [value.casefold()]
    if category == "date":
        day = date_key(value)
        if day:
            keys.append("date:" + day)
    elif category == "name" and " " in value:
        keys += [w.casefold() for w in value.split() if len(w) > 1]
    return tuple(keys)


#: Entries a ledger keeps at most; beyond, the lowest tier and least recently seen go
#: (down to half, so pruning is rare). A rendered block holds far fewer (one token each
#: at least, and the ledger's cap is hundreds of tokens), so pruning never changes what
#: is rendered for caps below ``MAX_ENTRIES // 2`` tokens (the default cap is 600). Smaller is
#: faster: every ``add`` copies the ledger.
MAX_ENTRIES = 2_048
_TIERS = 1 + MAX_RANK

# Token cost of one rendered value (" value" and its comma) or label line, per counter:
# rendering estimates with these and counts the whole text once, instead of counting
# every candidate text in a search.
_COSTS: dict[Callable[[str], int], dict[str, int]] = {}
_COSTS_MAX = 100_000


def _costs(count: Callable[[str], int]) -> dict[str, int]:
    table = _COSTS.get(count)
    if table is None or len(table) > _COSTS_MAX:
        if len(_COSTS) > 64:
            _COSTS.clear()
        table = _COSTS[count] = {}
    return table


def _cost(table: dict[str, int], count: Callable[[str], int], text: str) -> int:
    found = table.get(text)
    if found is None:
        found = table[text] = count(text)
    return found


def listed(value: str) -> str:
    """A value as a comma-separated list shows it: quoted when it holds a comma."""
    return f'"{value}"' if "," in value else value


_SPACED = re.compile(r"[\s,]")
_SKIPS = 32  # entries that do not fit a render tries past before it stops


def _joined(values: Sequence[str]) -> str:
    if any(_SPACED.search(v) for v in values):
        return ", ".join(listed(v) for v in values)
    return " ".join(values)


class _Keys:
    """Match key -> positions of the entries carrying it, for a ledger's first
    ``covered`` entries: shared with the ledgers grown from it (it only grows), so an
    ``add`` in which the user states something new checks only the entries that carry
    one of the new keys, not the whole ledger."""

    __slots__ = ("covered", "positions")

    def __init__(self) -> None:
        self.covered = 0
        self.positions: dict[str, list[int]] = {}

    def extend(self, entries: Sequence[LedgerEntry]) -> None:
        positions = self.positions
        for i in range(self.covered, len(entries)):
            e = entries[i]
            for k in match_keys(e.value, e.category):
                found = positions.get(k)
                if found is None:
                    positions[k] = [i]
                else:
                    found.append(i)
        self.covered = len(entries)


@dataclass(frozen=True)
class EntityLedger:
    """Values seen so far, deduplicated by value, in first-seen order (newest last).

    Adding a value already present only refreshes its recency (used for trimming); it
    keeps its place and label, so the rendered block changes only by growing at the end
    and stays a cacheable prefix.

    Internally each tier keeps its entries' positions in the order they were last seen,
    so the entries a render keeps (highest tier, most recently seen first) are read off
    the ends of those lists: rendering costs what it shows, not the ledger's size.
    """

    entries: tuple[LedgerEntry, ...] = ()
    seq: int = 0
    header: str = DEFAULT_HEADER
    # value -> position; shared with the ledger this one grew from while it only grows
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    # per tier: (last_seen, position), oldest first; stale pairs (refreshed since) skipped
    _tiers: tuple[tuple[tuple[int, int], ...], ...] = field(default=(), compare=False, repr=False)
    # the match keys of the values the user stated (None: not computed yet)
    _stated: frozenset[str] | None = field(default=None, compare=False, repr=False)
    _renders: dict[tuple[int, Callable[[str], int]], str] = field(
        default_factory=dict, compare=False, repr=False
    )
    # match key -> positions (see _Keys); shared like _index, None: not built
    _keys: _Keys | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self._tiers:
            tiers: list[list[tuple[int, int]]] = [[] for _ in range(_TIERS)]
            for i, e in enumerate(self.entries):
                tiers[_rank_of(e)].append((e.last_seen, i))
            for t in tiers:
                t.sort()
            object.__setattr__(self, "_tiers", tuple(tuple(t) for t in tiers))

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entities: Iterable[Entity]) -> EntityLedger:
        """A new ledger with ``entities`` added (new values last, known ones refreshed:
        seen once more, marked by who wrote them, ranked again). The result does not
        depend on how the entities are split into calls: an entry matches the user's
        words whenever its keys meet those of a value the user stated, whatever came
        first."""
        entries = list(self.entries)
        n = len(entries)
        # The value -> position index is shared with the ledger this one came from (it
        # only grows); if another ledger grew it since, it holds values we lack: rebuild.
        index = self._index
        if len(index) != len(entries):
            index = {e.value: i for i, e in enumerate(entries)}
        tiers = [list(t) for t in self._tiers]
        seq = self.seq
        stated = self._stated_keys()
        grown: set[str] = set()  # keys the user states for the first time in this batch
        touched: list[int] = []
        for e in entities:
            seq += 1
            mark = _MARKS.get(e.origin, 0)
            i = index.get(e.value)
            if i is not None:
                old = entries[i]
                marks = old.marks | mark
                if marks & USER:
                    marks &= ~MATCH  # stated outright now: no longer only a match
                entry = LedgerEntry(
                    old.value, old.label, old.category, old.source_id, old.first_seen, seq,
                    old.hits + 1, marks,
                )  # fmt: skip
            else:
                i = index[e.value] = len(entries)
                category = e.category or e.label
                entry = LedgerEntry(e.value, e.label, category, e.source_id, seq, seq, 1, mark)
                entries.append(entry)
            if mark & USER:
                grown.update(k for k in match_keys(entry.value, entry.category) if k not in stated)
            entries[i] = entry
            touched.append(i)
            tiers[_rank_of(entry)].append((seq, i))
        if seq == self.seq:
            return self
        if grown:
            stated = stated | grown
        # entries that now match what the user stated: those this batch touched, and
        # when the user said something new, those carrying one of the new keys (the
        # others were checked against the older keys when added). The match-key index
        # finds them; without one, it is built (when no pruning follows) and looked up
        # for every stated key, which is what checking every entry found.
        keys = self._keys if self._keys is not None and self._keys.covered == n else None
        pruning = len(entries) > MAX_ENTRIES
        if keys is not None:
            keys.extend(entries)
        elif grown and not pruning:
            keys = _Keys()
            keys.extend(entries)
            grown = set(stated)
        elif grown:
            touched = list(range(len(entries)))
        if grown and keys is not None:
            found = keys.positions
            touched = sorted({*touched, *(i for k in grown for i in found.get(k, ()))})
        self._mark_matches(entries, tiers, stated, touched)
        if pruning:
            return _pruned(entries, tiers, seq, self.header)
        stale = sum(map(len, tiers)) - len(entries)
        if stale > len(entries):  # compact: refreshed values left old pairs behind
            return EntityLedger(tuple(entries), seq, self.header, index, _keys=keys)
        out = EntityLedger(
            tuple(entries), seq, self.header, index, tuple(map(tuple, tiers)), _keys=keys
        )
        object.__setattr__(out, "_stated", stated)
        return out

    def _stated_keys(self) -> frozenset[str]:
        """The match keys of every value the user stated (computed once per ledger)."""
        found = self._stated
        if found is None:
            found = frozenset(
                k for e in self.entries if e.marks & USER for k in match_keys(e.value, e.category)
            )
            object.__setattr__(self, "_stated", found)
        return found

    @staticmethod
    def _mark_matches(
        entries: list[LedgerEntry],
        tiers: list[list[tuple[int, int]]],
        stated: frozenset[str],
        positions: Iterable[int],
    ) -> None:
        """Mark the entries at ``positions`` whose keys meet ``stated`` (their recency
        unchanged: a match ranks a value up, it does not make it seen again)."""
        if not stated:
            return
        for i in positions:
            entry = entries[i]
            if entry.marks & (USER | MATCH):
                continue
            if any(k in stated for k in match_keys(entry.value, entry.category)):
                entries[i] = entry = LedgerEntry(*entry[:7], entry.marks | MATCH)
                bisect.insort(tiers[_rank_of(entry)], (entry.last_seen, i))

    @staticmethod
    def _keep_order(
        entries: Sequence[LedgerEntry],
        tiers: Sequence[Sequence[tuple[int, int]]],
        limit: int | None = None,
    ) -> Iterator[int]:
        """Positions, best first: highest rank, then most recently seen."""
        return (i for _, i in EntityLedger._ranked_order(entries, tiers, limit))

    @staticmethod
    def _ranked_order(
        entries: Sequence[LedgerEntry],
        tiers: Sequence[Sequence[tuple[int, int]]],
        limit: int | None = None,
    ) -> Iterator[tuple[int, int]]:
        """``(rank, position)`` pairs in :meth:`_keep_order`'s order."""
        given = 0
        for r in range(len(tiers) - 1, -1, -1):
            for last_seen, i in reversed(tiers[r]):
                e = entries[i]
                if e.last_seen != last_seen or _rank_of(e) != r:
                    continue  # refreshed or ranked up since: another pair stands for it
                if limit is not None and given >= limit:
                    return
                given += 1
                yield r, i

    def branch(self) -> EntityLedger:
        """The same ledger with an index of its own: grow it without making the ledger
        it came from rebuild its index on its next ``add`` (a side branch). Its renders
        are the same texts, so the render memo is shared."""
        index, tiers, renders = dict(self._index), self._tiers, self._renders
        return EntityLedger(self.entries, self.seq, self.header, index, tiers, _renders=renders)

    def values(self) -> list[str]:
        return [e.value for e in self.entries]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (a session stores its ledger): entries as compact rows, the
        ``seq`` counter and the header, so :meth:`from_dict` gives back an equal ledger."""
        rows = [list(e) for e in self.entries]
        return {"entries": rows, "seq": self.seq, "header": self.header}

    @classmethod
    def from_dict(cls, data: Any) -> EntityLedger:
        """The ledger :meth:`to_dict` wrote; ``ValueError`` names what is malformed."""
        try:
            entries = tuple(_entry(row) for row in data["entries"])
            return cls(entries, int(data["seq"]), str(data.get("header", DEFAULT_HEADER)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a stored entity ledger ({type(exc).__name__}: {exc})") from exc

    def stated(self) -> list[str]:
        """The values the user stated or that match them, in first-seen order."""
        return [e.value for e in self.entries if e.marks & (USER | MATCH)]

    def _render(self, positions: Iterable[int]) -> str:
        """One line per label, values in first-seen order: space-separated (a comma
        costs a token per value), comma-separated when one of them has a space."""
        groups: dict[str, list[str]] = {}
        for i in sorted(positions):
            e = self.entries[i]
            groups.setdefault(e.label, []).append(e.value)
        if not groups:
            return ""
        lines = [f"{label}: {_joined(values)}" for label, values in groups.items()]
        return "\n".join([self.header, *lines])

    def render(self, max_tokens: int, count: Callable[[str], int]) -> str:
        """The ledger as a system-block text of at most ``max_tokens`` ("" when empty).

        Over budget, entries are dropped lowest category tier first (plain numbers),
        then oldest (least recently seen) first. How many to keep is estimated from
        cached per-value costs, then the text is counted; only when the estimate was
        short does a binary search (exact counts) settle it.
        """
        memo = (max_tokens, count)
        if memo in self._renders:
            return self._renders[memo]
        text = self._fit(max_tokens, count)
        self._renders[memo] = text
        return text

    def _fit(self, max_tokens: int, count: Callable[[str], int]) -> str:
        if not self.entries or max_tokens <= 0:
            return ""
        order: list[int] = []
        labels: set[str] = set()
        table = _costs(count)
        used = _cost(table, count, self.header)
        entries = self.entries
        skipped = 0
        for _, i in self._ranked_order(entries, self._tiers):
            e = entries[i]
            step = table.get(e.value)
            if step is None:
                spaced = _SPACED.search(e.value) is not None
                step = table[e.value] = count(" " + listed(e.value)) + spaced
            if e.label not in labels:
                step += _cost(table, count, f"\n{e.label}:")
            if used + step > max_tokens:
                skipped += 1  # a shorter value further down may still fit
                if skipped > _SKIPS:
                    break
                continue
            used += step
            labels.add(e.label)
            order.append(i)
        text = self._render(order) if order else ""
        if not text or count(text) <= max_tokens:
            return text
        lo, hi, best = 1, len(order) - 1, ""
        while lo <= hi:  # the estimate was short: the most entries that fit, counted
            mid = (lo + hi) // 2
            candidate = self._render(order[:mid])
            if count(candidate) <= max_tokens:
                best, lo = candidate, mid + 1
            else:
                hi = mid - 1
        return best


def _pruned(
    entries: Sequence[LedgerEntry],
    tiers: Sequence[Sequence[tuple[int, int]]],
    seq: int,
    header: str,
) -> EntityLedger:
    """The ledger of the best ``MAX_ENTRIES // 2`` of ``entries`` (first-seen order kept),
    its tiers carried over from the ranking already done instead of ranking them again."""
    ranked: dict[int, int] = {}  # position -> tier, best first (a position may recur)
    for r, i in EntityLedger._ranked_order(entries, tiers, MAX_ENTRIES // 2):
        ranked.setdefault(i, r)
    order = sorted(ranked)
    moved = {i: j for j, i in enumerate(order)}
    kept: list[list[tuple[int, int]]] = [[] for _ in range(_TIERS)]
    for i, r in reversed(ranked.items()):  # each tier oldest first
        kept[r].append((entries[i].last_seen, moved[i]))
    return EntityLedger(tuple(entries[i] for i in order), seq, header, {}, tuple(map(tuple, kept)))


def _entry(row: Sequence[Any]) -> LedgerEntry:
    """A stored row: 8 fields, or the 6 of ledgers stored before ranking (seen once,
    unmarked)."""
    if len(row) not in (6, 8):
        raise ValueError(f"an entry has 6 or 8 fields, got {len(row)}")
    v, lb, c, src, first, last = row[:6]
    hits, marks = (int(row[6]), int(row[7])) if len(row) == 8 else (1, 0)
    return LedgerEntry(str(v), str(lb), str(c), str(src), int(first), int(last), hits, marks)
