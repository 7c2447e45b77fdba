"""The entity ledger: values seen so far, deduplicated, trimmed to a token cap (issue 3, item 5).

:func:`~ctxwarden.memory.entities.extract_entities` finds the values; :class:`EntityLedger` keeps
them (first-seen order, so its rendering grows at the end and stays cacheable) and
renders a compact system block, dropping the least useful entries to fit a token
budget. :mod:`ctxwarden.steps.ledger` decides which messages feed it in a build.

**What survives pressure** is ranked by :mod:`ctxwarden.memory.entity_rank`: by signals
that hold in any domain, not by one data set's keys. The block lists one line per
label, values separated by spaces (a comma costs a token per value); a line with a
value that holds a space is comma-separated, and a value is quoted only when it holds
", " itself ("$1,625" is not), so a cap holds about a fifth more values.

A render leaves out what the context shows elsewhere (the system prompt, the facts layer,
pinned messages: ``skip``) and names the messages that left the context by their handle,
after their values and in place of plain numbers (``placed``; see :meth:`render`).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.handles import handle_for
from ctxwarden.memory.entities import Entity
from ctxwarden.memory.entity_rank import (
    AGENT,
    CALL,
    KIND,
    LOW_RANK,
    MATCH,
    MAX_RANK,
    MIN_RANKED_CHARS,
    PROSE,
    TOOL,
    USER,
    kind_of,
    match_keys,
    rank,
)
from ctxwarden.memory.entity_rank import MARKS as _MARKS
from ctxwarden.memory.entity_rank import rank_of as _rank_of

__all__ = [
    "AGENT",
    "CALL",
    "DEFAULT_HEADER",
    "LOW_RANK",
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


#: Five tokens (the header before was 14): under a tight budget every token of the
#: block is a value, and "earlier messages" says what the old wording spelled out.
DEFAULT_HEADER = "Values from earlier messages:"


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
_COSTS: BoundedCache[Callable[[str], int], dict[str, int]] = BoundedCache("ledger.costs", 64)
_COSTS_MAX = 100_000  # texts per counter; a table past it starts anew


def _costs(count: Callable[[str], int]) -> dict[str, int]:
    table = _COSTS.get(count)
    if table is None or len(table) > _COSTS_MAX:
        table = _COSTS.put(count, {})  # (its writes are single-key: safe in any thread)
    return table


def _cost(table: dict[str, int], count: Callable[[str], int], text: str) -> int:
    found = table.get(text)
    if found is None:
        found = table[text] = count(text)
    return found


def listed(value: str) -> str:
    """A value as a ", "-separated list shows it: quoted when it holds a comma and a
    space after it (only then could it be read as two; "$1,625" needs no quotes)."""
    return f'"{value}"' if _LIST_SEPARATOR.search(value) else value


_LIST_SEPARATOR = re.compile(r",\s")
_SPACED = re.compile(r"\s")  # a value with a space: its line is ", "-separated
_SKIPS = 32  # entries that do not fit a render tries past before it stops
_GROWN_KEPT = 4  # side branches a ledger keeps (EntityLedger.grown)


_RenderKey = tuple[int, Callable[[str], int], frozenset[str] | None, Callable[[str], bool] | None]


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
    Within one tool result the values it lists first count as the most recent
    (:func:`_reading_stamps`): a ledger with room for part of a record's list of
    reservations keeps the first ones, which an agent works through first.
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
    # the kinds (kind_of) of the values the agent passed in tool calls (None: not yet)
    _kinds: frozenset[str] | None = field(default=None, compare=False, repr=False)
    _renders: dict[_RenderKey, str] = field(default_factory=dict, compare=False, repr=False)
    # match key -> positions (see _Keys); shared like _index, None: not built
    _keys: _Keys | None = field(default=None, compare=False, repr=False)
    # side branches grown from this ledger, by what they were grown with (see grown)
    _grown: dict[tuple[Hashable, ...], EntityLedger] = field(
        default_factory=dict, compare=False, repr=False
    )
    # each entry's rank, by position: kept by every add, so a render's walk down the
    # tiers reads a rank instead of computing it for every entry it visits
    _ranks: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        entries = self.entries
        ranks = self._ranks
        if len(ranks) != len(entries):
            ranks = tuple(map(_rank_of, entries))
            object.__setattr__(self, "_ranks", ranks)
        if not self._tiers:
            tiers: list[list[tuple[int, int]]] = [[] for _ in range(_TIERS)]
            for i, e in enumerate(entries):
                tiers[ranks[i]].append((e.last_seen, i))
            for t in tiers:
                t.sort()
            object.__setattr__(self, "_tiers", tuple(tuple(t) for t in tiers))

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entities: Iterable[Entity]) -> EntityLedger:
        """A new ledger with ``entities`` added (new values last, known ones refreshed:
        seen once more, marked by who wrote them, ranked again). The result does not
        depend on how the entities are split into calls between their messages: an entry
        matches the user's words whenever its keys meet those of a value the user stated,
        whatever came first, and a ledger over :data:`MAX_ENTRIES` is pruned after the
        message whose values took it over, however many messages the call holds (so an
        open session, which adds what left the window at each build, and a replica, which
        adds the same messages in one call, keep the same values)."""
        items = list(entities)
        if len(self.entries) + len(items) <= MAX_ENTRIES:
            return self._add(items)  # (no message can take it over: one step)
        out, at = self, 0
        while at < len(items):  # up to the message that takes it over, if any
            end = _taking_over(out, items, at)
            out = out._add(items[at:end])
            at = end
        return out

    def _add(self, items: list[Entity]) -> EntityLedger:
        """:meth:`add`, pruned once at the end."""
        entries = list(self.entries)
        n = len(entries)
        index = self._own_index()
        tiers = [list(t) for t in self._tiers]
        ranks = list(self._ranks)
        seq = self.seq
        stated = self._stated_keys()
        grown: set[str] = set()  # keys the user states for the first time in this batch
        kinds = self._passed_kinds()
        new_kinds: set[str] = set()  # kinds the agent passes for the first time in it
        touched: list[int] = []
        tooled: bool | None = None  # a tool used so far (found when first needed)
        marks_of, new = _MARKS.get, tuple.__new__  # LedgerEntry(...) without its Python __new__
        stamps = _reading_stamps(items, seq)
        tails = [len(t) for t in tiers]
        for e, stamp in zip(items, stamps, strict=True):
            mark = marks_of(e.origin, 0)
            if mark & (AGENT | CALL) and e.category == "number":
                mark = 0  # a number in the agent's arithmetic or prose is not one it reuses
            if mark & (TOOL | CALL):
                tooled = True
            elif mark & AGENT:
                if tooled is None:
                    tooled = self._tooled()
                if tooled:  # an agent that calls tools restates and sums their results
                    mark |= PROSE
            value = e.value
            i = index.get(value)
            if i is not None:
                old = entries[i]
                marks = old.marks | mark
                if marks & USER:
                    marks &= ~MATCH  # stated outright now: no longer only a match
                if (kinds or marks & CALL) and not marks & KIND:
                    marks = _of_kind(old.label, marks, kinds, new_kinds)
                hits = old.hits + 1
                category = old.category
                last = max(old.last_seen, stamp)
                entry = new(
                    LedgerEntry,
                    (value, old.label, category, old.source_id, old.first_seen, last, hits, marks),
                )
                entries[i] = entry
                r = _rank_of(entry)
                fresh = last != old.last_seen or r != ranks[i]
                ranks[i] = r
            else:
                i = index[value] = len(entries)
                category = e.category or e.label
                if kinds or mark & CALL:
                    mark = _of_kind(e.label, mark, kinds, new_kinds)
                entry = new(
                    LedgerEntry, (value, e.label, category, e.source_id, stamp, stamp, 1, mark)
                )
                entries.append(entry)
                r = _rank_of(entry)
                ranks.append(r)
                fresh = True
            if mark & USER:
                grown.update(k for k in match_keys(value, category) if k not in stated)
            touched.append(i)
            if fresh:
                tiers[r].append((entry.last_seen, i))
        if not items:
            return self
        seq += len(items)
        for t, tail in zip(tiers, tails, strict=True):
            if len(t) - tail > 1:
                t[tail:] = sorted(t[tail:])
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
        self._mark_matches(entries, tiers, ranks, stated, touched)
        if new_kinds:
            _mark_kinds(entries, tiers, ranks, new_kinds)
            kinds = kinds | new_kinds
        if pruning:
            return _pruned(entries, tiers, ranks, seq, self.header)
        stale = sum(map(len, tiers)) - len(entries)
        if stale > len(entries):  # compact: refreshed values left old pairs behind
            return EntityLedger(
                tuple(entries), seq, self.header, index, _keys=keys, _ranks=tuple(ranks)
            )
        out = EntityLedger(
            tuple(entries),
            seq,
            self.header,
            index,
            tuple(map(tuple, tiers)),
            _keys=keys,
            _ranks=tuple(ranks),
        )
        object.__setattr__(out, "_stated", stated)
        object.__setattr__(out, "_kinds", kinds)
        return out

    def _own_index(self) -> dict[str, int]:
        """Value -> position of this ledger's entries. The index is shared with the ledger
        this one came from (it only grows); if another ledger grew it since, it holds
        values this one lacks, and a new one is made."""
        index = self._index
        if len(index) != len(self.entries):
            index = {e.value: i for i, e in enumerate(self.entries)}
        return index

    def _tooled(self) -> bool:
        """Whether a tool was called or returned a value among the values so far."""
        return any(e.marks & (TOOL | CALL) for e in reversed(self.entries))

    def _stated_keys(self) -> frozenset[str]:
        """The match keys of every value the user stated (computed once per ledger)."""
        found = self._stated
        if found is None:
            found = frozenset(
                k for e in self.entries if e.marks & USER for k in match_keys(e.value, e.category)
            )
            object.__setattr__(self, "_stated", found)
        return found

    def _passed_kinds(self) -> frozenset[str]:
        """The kinds of the values the agent passed (computed once per ledger): those of
        the entries marked as passed or as of a passed kind (a pruned ledger may have
        lost the passed values of a kind whose other values it keeps)."""
        found = self._kinds
        if found is None:
            found = frozenset(
                k
                for e in self.entries
                if e.marks & (CALL | KIND) and (k := kind_of(e.label)) is not None
            )
            object.__setattr__(self, "_kinds", found)
        return found

    @staticmethod
    def _mark_matches(
        entries: list[LedgerEntry],
        tiers: list[list[tuple[int, int]]],
        ranks: list[int],
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
            if not stated.isdisjoint(match_keys(entry.value, entry.category)):
                entries[i] = entry = LedgerEntry(*entry[:7], entry.marks | MATCH)
                # a rank unchanged (too short for a bonus, or at the top) keeps its pair:
                # a second one with the same recency would list the value twice
                r = _rank_of(entry)
                if r != ranks[i]:
                    ranks[i] = r
                    bisect.insort(tiers[r], (entry.last_seen, i))

    def _keep_order(self, limit: int | None = None) -> Iterator[int]:
        """Positions, best first: highest rank, then most recently seen."""
        return (i for _, i in _ranked_order(self.entries, self._tiers, self._ranks, limit))

    def branch(self) -> EntityLedger:
        """The same ledger with an index of its own: grow it without making the ledger
        it came from rebuild its index on its next ``add`` (a side branch). Its renders
        are the same texts, so the render memo is shared, and so are what the user stated
        and the kinds the agent passed (the same entries: not found again)."""
        index, tiers, renders = dict(self._index), self._tiers, self._renders
        return EntityLedger(
            self.entries,
            self.seq,
            self.header,
            index,
            tiers,
            _stated=self._stated,
            _kinds=self._kinds,
            _renders=renders,
            _ranks=self._ranks,
        )

    def grown(
        self, parts: tuple[Hashable, ...], entities: Callable[[int], Iterable[Entity]]
    ) -> EntityLedger:
        """``branch().add(entities(0))``: this ledger grown with the values of some
        messages, named in order by ``parts`` (equal parts, equal values; ``entities(k)``
        gives those of the messages from the ``k``-th on). Kept on this ledger: a build
        renders one ledger with the values of the window's edited messages several times
        (each try of the fit, the block stacked after a kept one), and the builds after
        it do again until the window moves, most often with one more message edited: a
        branch kept for the first messages is grown by the rest (the values do not depend
        on how the messages are split into adds). The last :data:`_GROWN_KEPT` are kept."""
        found = self._grown.get(parts)
        if found is None:
            base, done = self, 0
            for kept, branch in self._grown.items():
                if done < len(kept) < len(parts) and parts[: len(kept)] == kept:
                    base, done = branch, len(kept)
            if len(self._grown) >= _GROWN_KEPT:
                del self._grown[next(iter(self._grown))]
            found = self._grown[parts] = base.branch().add(entities(done))
        return found

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
            seq, header = int(data["seq"]), str(data.get("header", DEFAULT_HEADER))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a stored entity ledger ({type(exc).__name__}: {exc})") from exc
        ledger = cls(entries, seq, header)
        # a ledger stored before kinds were marked: its values of a passed kind, marked
        kinds = ledger._passed_kinds()
        marked = tuple(
            e._replace(marks=e.marks | KIND) if _unmarked_of(e, kinds) else e for e in entries
        )
        return ledger if marked == entries else cls(marked, seq, header)

    def stated(self) -> list[str]:
        """The values the user stated or that match them, in first-seen order."""
        return [e.value for e in self.entries if e.marks & (USER | MATCH)]

    def _render(self, positions: Iterable[int], marked: frozenset[str] = frozenset()) -> str:
        """One line per label, values in first-seen order: space-separated (a comma
        costs a token per value), comma-separated when one of them has a space. A run
        of values from a source in ``marked`` is followed by its handle."""
        groups: dict[str, list[LedgerEntry]] = {}
        entries = self.entries
        for i in sorted(positions):
            e = entries[i]
            group = groups.get(e.label)
            if group is None:
                groups[e.label] = [e]
            else:
                group.append(e)
        if not groups:
            return ""
        lines = [f"{label}: {_line(group, marked)}" for label, group in groups.items()]
        return "\n".join([self.header, *lines])

    def _with_handles(
        self,
        order: Sequence[int],
        text: str,
        tokens: int,
        count: Callable[[str], int],
        placed: frozenset[str],
    ) -> str:
        """``text`` (``tokens`` long) with the handles of the messages its values came
        from (sources in ``placed`` show their handle themselves: masked or truncated
        messages still in the context). A handle may displace the lowest-ranked values (rank
        :data:`LOW_RANK` or less, last kept first): a whole message to recall is worth
        more than a plain number from it, but not more than an id, a name or a date the
        model would otherwise lose. It never makes the block bigger: the ledger is
        rendered up to its cap and the window fills the rest, so a handle in spare room
        would be paid for by a window message (tau-bench dev @1,600: reduction 50.91%
        -> 50.79%, below the plain window's 50.8%, for no value kept). The messages that
        gave the most shown values come first."""
        entries = self.entries
        shown = Counter(
            entries[i].source_id
            for i in sorted(order)
            if entries[i].source_id and entries[i].source_id not in placed
        )
        if not shown:
            return text
        table = _costs(count)
        ranks = self._ranks
        low = [i for i in order if ranks[i] <= LOW_RANK]
        slack = sum(table.get(entries[i].value, 1) for i in low)
        if slack <= 0:
            return text
        lines: dict[str, set[str]] = {}
        for i in order:
            lines.setdefault(entries[i].source_id, set()).add(entries[i].label)
        chosen: list[str] = []
        for source, _ in shown.most_common():
            step = len(lines[source]) * _cost(table, count, f" ({handle_for(source)})")
            if step <= slack:
                chosen.append(source)
                slack -= step
        gone: set[int] = set()
        limit = tokens  # never a bigger block
        while chosen:
            kept = [i for i in order if i not in gone]
            if not kept:  # every value gave way: handles of no value are no block
                return text
            candidate = self._render(kept, frozenset(chosen))
            over = count(candidate) - limit
            if over <= 0:
                return candidate
            if not low:
                chosen.pop()  # the estimate was short: fewer handles
            while low and over > 0:  # make room: the lowest-ranked values last kept go
                i = low.pop()
                gone.add(i)
                over -= table.get(entries[i].value, 1)
        return text

    def render(
        self,
        max_tokens: int,
        count: Callable[[str], int],
        placed: frozenset[str] | None = None,
        skip: Callable[[str], bool] | None = None,
    ) -> str:
        """The ledger as a system-block text of at most ``max_tokens`` ("" when empty).

        Over budget, entries are dropped lowest category tier first (plain numbers),
        then oldest (least recently seen) first. How many to keep is estimated from
        cached per-value costs, then the text is counted; only when the estimate was
        short does a binary search (exact counts) settle it.

        ``placed`` (None: no handles): the ids of messages that show their own handle
        in the context. The handle of any other message the shown values came from (a
        message that left the context) follows its values, as room allows once the
        values are placed (see :meth:`_with_handles`): a handle never displaces an id,
        a name or a date, so under a tight budget the block costs what it did, and the
        model can recall a dropped message.

        ``skip``: which values to leave out (the context shows them elsewhere); a
        hashable predicate (the render is memoised on it). Values of rank
        :data:`LOW_RANK` or less from a message in ``placed`` are left out too: that
        message shows its handle, and a plain number (a year, a count an article
        mentions) is not worth a place in the block when its message is one recall away.
        """
        memo = (max_tokens, count, placed, skip)
        if memo in self._renders:
            return self._renders[memo]
        order, text, tokens = self._fit(max_tokens, count, skip, placed or frozenset())
        if text and placed is not None:
            text = self._with_handles(order, text, tokens, count, placed)
        self._renders[memo] = text
        return text

    def _fit(
        self,
        max_tokens: int,
        count: Callable[[str], int],
        skip: Callable[[str], bool] | None = None,
        placed: frozenset[str] = frozenset(),
    ) -> tuple[list[int], str, int]:
        """The positions of the entries the block shows (best first), its text and
        its tokens."""
        if not self.entries or max_tokens <= 0:
            return [], "", 0
        order: list[int] = []
        steps: list[int] = []  # each kept entry's estimated cost
        for i, step in self._chosen(max_tokens, count, skip, placed):
            order.append(i)
            steps.append(step)
        if not order:
            return [], "", 0
        text = self._render(order)
        tokens = count(text)
        if tokens <= max_tokens:
            return order, text, tokens
        return self._most_that_fit(order, steps, tokens, max_tokens, count)

    def _chosen(
        self,
        max_tokens: int,
        count: Callable[[str], int],
        skip: Callable[[str], bool] | None,
        placed: frozenset[str],
    ) -> Iterator[tuple[int, int]]:
        """The entries :meth:`_fit` takes, best first, each with its estimated cost: the
        values not shown elsewhere whose estimated costs fit ``max_tokens`` together."""
        labels: set[str] = set()
        table = _costs(count)
        used = _cost(table, count, self.header)
        entries = self.entries
        skipped = 0
        skip = skip or None  # (asked once: a Shown of no messages is false)
        for r, i in _ranked_order(entries, self._tiers, self._ranks):
            e = entries[i]
            if (r <= LOW_RANK and e.source_id in placed) or (skip is not None and skip(e.value)):
                continue  # shown elsewhere; or a plain number of a message one recall away
            step = table.get(e.value)
            if step is None:
                spaced = _SPACED.search(e.value) is not None
                step = table[e.value] = count(" " + listed(e.value)) + spaced
            if e.label not in labels:
                step += _cost(table, count, f"\n{e.label}:")
            if used + step > max_tokens:
                skipped += 1  # a shorter value further down may still fit
                if skipped > _SKIPS:
                    return
                continue
            used += step
            labels.add(e.label)
            yield i, step

    def shows_any(
        self,
        max_tokens: int,
        count: Callable[[str], int],
        placed: frozenset[str] | None = None,
        skip: Callable[[str], bool] | None = None,
    ) -> bool:
        """Whether :meth:`render` with these arguments gives a block (not ""), found from
        its first value alone: the longest prefix of the values that fits is not empty
        exactly when the first fits alone (:meth:`_most_that_fit` tries it last)."""
        if not self.entries or max_tokens <= 0:
            return False
        first = next(self._chosen(max_tokens, count, skip, placed or frozenset()), None)
        return first is not None and count(self._render([first[0]])) <= max_tokens

    def _most_that_fit(
        self,
        order: list[int],
        steps: Sequence[int],
        tokens: int,
        max_tokens: int,
        count: Callable[[str], int],
    ) -> tuple[list[int], str, int]:
        """The longest prefix of ``order`` rendered within ``max_tokens`` (all of it,
        ``tokens`` long, is not): back from the end until the estimated ``steps`` cover
        the excess and a prefix fits, then up one, two, four entries to the first that
        does not (tokens grow with entries). Three counts where a binary search over
        the whole order took eight: on tau-bench the estimate is a few tokens short."""
        keep, text, n = len(order), "", tokens
        while n > max_tokens:  # back from the end, by estimate, until a prefix fits
            over, excess = keep, n - max_tokens
            while keep > 0 and excess > 0:
                keep -= 1
                excess -= steps[keep]
            if keep == 0:
                text, n = "", 0
                break
            text = self._render(order[:keep])
            n = count(text)
        # ``keep`` fits, ``over`` does not: the first that does not, above ``keep``
        jump = 1
        while keep + 1 < over:
            mid = min(keep + jump, over - 1)
            candidate = self._render(order[:mid])
            tokens = count(candidate)
            if tokens <= max_tokens:
                keep, text, n = mid, candidate, tokens
                jump *= 2
            else:
                over, jump = mid, 1
        return order[:keep], text, n


def _line(group: Sequence[LedgerEntry], marked: frozenset[str]) -> str:
    """One label's values; after a run from a ``marked`` source, its handle."""
    values = [e.value for e in group]
    # (one search of the values joined by a character that is not a space)
    spaced = _SPACED.search("\x00".join(values)) is not None
    if not marked:
        return ", ".join(map(listed, values)) if spaced else " ".join(values)
    parts: list[str] = []
    for k, e in enumerate(group):
        piece = listed(e.value) if spaced else e.value
        last_of_run = k + 1 == len(group) or group[k + 1].source_id != e.source_id
        if last_of_run and e.source_id in marked:
            piece += f" ({handle_for(e.source_id)})"
        parts.append(piece)
    return (", " if spaced else " ").join(parts)


def _of_kind(label: str, marks: int, kinds: frozenset[str], new_kinds: set[str]) -> int:
    """``marks`` with :data:`KIND` when the value labelled ``label`` is of a kind the
    agent passed; a value it passes now of a kind not yet passed adds that kind to
    ``new_kinds`` (the values of it seen before are marked after the batch)."""
    kind = kind_of(label)
    if kind is None:
        return marks
    if kind not in kinds:
        if not marks & CALL:
            return marks
        new_kinds.add(kind)
    return marks | KIND


def _unmarked_of(entry: LedgerEntry, kinds: Set[str]) -> bool:
    """Whether ``entry`` is of one of ``kinds`` (kinds the agent passed) and not yet
    marked so."""
    return not entry.marks & KIND and kind_of(entry.label) in kinds


def _mark_kinds(
    entries: list[LedgerEntry],
    tiers: list[list[tuple[int, int]]],
    ranks: list[int],
    new_kinds: set[str],
) -> None:
    """Mark every entry of one of ``new_kinds`` (kinds the agent passed for the first
    time) as of a passed kind. Rare: once per kind in a conversation."""
    for i, entry in enumerate(entries):
        if not _unmarked_of(entry, new_kinds):
            continue
        entries[i] = entry = LedgerEntry(*entry[:7], entry.marks | KIND)
        r = _rank_of(entry)
        if r != ranks[i]:  # (see _mark_matches: an unchanged rank keeps its pair)
            ranks[i] = r
            bisect.insort(tiers[r], (entry.last_seen, i))


def _taking_over(ledger: EntityLedger, items: Sequence[Entity], at: int) -> int:
    """The end of the messages of ``items`` from ``at`` that one ``_add`` takes: up to and
    with the first whose new values take ``ledger`` over :data:`MAX_ENTRIES` (the ledger
    is pruned after it), or all of them. New values, not entities: a ledger near its cap
    sees mostly values it holds (a coding agent's paths and names recur in every
    result), and an add per message copied the whole ledger for each of them."""
    known = ledger._own_index()
    room, new = MAX_ENTRIES - len(ledger.entries), set[str]()
    end = at
    while end < len(items):
        start, end = end, _message_end(items, end)
        new.update(e.value for e in items[start:end] if e.value not in known)
        if len(new) > room:
            break
    return end


def _message_end(entities: Sequence[Entity], at: int) -> int:
    """The end of the run of ``entities`` from ``at`` that one message gave (one source)."""
    source, end = entities[at].source_id, at + 1
    while end < len(entities) and entities[end].source_id == source:
        end += 1
    return end


def _reading_stamps(entities: Sequence[Entity], seq: int) -> list[int]:
    """Each entity's recency stamp, after ``seq``: a later message's values are more
    recent than an earlier one's. Within one tool result the values it lists first count
    as the most recent: a record is read in order (its list of reservations is worked
    through from the first); within prose, the user's or the agent's, the value stated
    last is (a sum's result, the date settled on after the ones weighed)."""
    stamps: list[int] = []
    k = 0
    while k < len(entities):
        end = k + 1
        source = entities[k].source_id
        while end < len(entities) and entities[end].source_id == source:
            end += 1
        n = end - k
        if all(e.origin == "tool" for e in entities[k:end]):
            stamps.extend(seq + k + n - j for j in range(n))
        else:
            stamps.extend(range(seq + k + 1, seq + end + 1))
        k = end
    return stamps


def _ranked_order(
    entries: Sequence[LedgerEntry],
    tiers: Sequence[Sequence[tuple[int, int]]],
    ranks: Sequence[int],
    limit: int | None = None,
) -> Iterator[tuple[int, int]]:
    """``(rank, position)`` pairs of a ledger's entries (``ranks``: each one's rank), best
    first: highest rank, then most recently seen; a stale pair (its entry refreshed or
    ranked up since) is passed over, another pair stands for it."""
    given = 0
    for r in range(len(tiers) - 1, -1, -1):
        for last_seen, i in reversed(tiers[r]):
            if ranks[i] != r or entries[i].last_seen != last_seen:
                continue
            if limit is not None and given >= limit:
                return
            given += 1
            yield r, i


def _pruned(
    entries: Sequence[LedgerEntry],
    tiers: Sequence[Sequence[tuple[int, int]]],
    ranks: Sequence[int],
    seq: int,
    header: str,
) -> EntityLedger:
    """The ledger of the best ``MAX_ENTRIES // 2`` of ``entries`` (first-seen order kept),
    its tiers carried over from the ranking already done instead of ranking them again."""
    ranked: dict[int, int] = {}  # position -> tier, best first (a position may recur)
    for r, i in _ranked_order(entries, tiers, ranks, MAX_ENTRIES // 2):
        ranked.setdefault(i, r)
    order = sorted(ranked)
    moved = {i: j for j, i in enumerate(order)}
    kept: list[list[tuple[int, int]]] = [[] for _ in range(_TIERS)]
    for i, r in reversed(ranked.items()):  # each tier oldest first
        kept[r].append((entries[i].last_seen, moved[i]))
    return EntityLedger(
        tuple(entries[i] for i in order),
        seq,
        header,
        {},
        tuple(map(tuple, kept)),
        _ranks=tuple(ranked[i] for i in order),
    )


def _entry(row: Sequence[Any]) -> LedgerEntry:
    """A stored row: 8 fields, or the 6 of ledgers stored before ranking (seen once,
    unmarked)."""
    if len(row) not in (6, 8):
        raise ValueError(f"an entry has 6 or 8 fields, got {len(row)}")
    v, lb, c, src, first, last = row[:6]
    hits, marks = (int(row[6]), int(row[7])) if len(row) == 8 else (1, 0)
    return LedgerEntry(str(v), str(lb), str(c), str(src), int(first), int(last), hits, marks)
