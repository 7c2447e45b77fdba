"""The entity ledger: values seen so far, deduplicated, trimmed to a token cap (issue 3, item 5).

:func:`~ctxwarden.memory.entities.extract_entities` finds the values; :class:`EntityLedger` keeps
them (first-seen order, so its rendering grows at the end and stays cacheable) and
renders a compact system block, dropping the least useful entries (low-value categories
first, then the least recently seen) to fit a token budget. :mod:`ctxwarden.steps.ledger`
decides which messages feed it in a build.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ctxwarden.memory.entities import CATEGORY_TIERS, Entity

__all__ = ["DEFAULT_HEADER", "MAX_ENTRIES", "EntityLedger", "LedgerEntry", "listed"]


DEFAULT_HEADER = "Known values from earlier messages (may have been removed from the context):"


class LedgerEntry(NamedTuple):
    """One remembered value (a named tuple: ledgers make thousands of them)."""

    value: str
    label: str
    category: str
    source_id: str
    first_seen: int
    last_seen: int


#: Entries a ledger keeps at most; beyond, the lowest tier and least recently seen go
#: (down to half, so pruning is rare). A rendered block holds far fewer (one token each
#: at least, and the ledger's cap is hundreds of tokens), so pruning never changes what
#: is rendered for caps below ``MAX_ENTRIES // 2`` tokens (the default cap is 600). Smaller is
#: faster: every ``add`` copies the ledger.
MAX_ENTRIES = 2_048
_TIERS = 1 + max(CATEGORY_TIERS.values())

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
    """A value as a ledger line lists it: quoted when it holds the list's comma."""
    return f'"{value}"' if "," in value else value


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
    _renders: dict[tuple[int, Callable[[str], int]], str] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not self._tiers:
            tiers: list[list[tuple[int, int]]] = [[] for _ in range(_TIERS)]
            for i, e in enumerate(self.entries):
                tiers[CATEGORY_TIERS.get(e.category, 1)].append((e.last_seen, i))
            for t in tiers:
                t.sort()
            object.__setattr__(self, "_tiers", tuple(tuple(t) for t in tiers))

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entities: Iterable[Entity]) -> EntityLedger:
        """A new ledger with ``entities`` added (new values last, known ones refreshed)."""
        entries = list(self.entries)
        # The value -> position index is shared with the ledger this one came from (it
        # only grows); if another ledger grew it since, it holds values we lack: rebuild.
        index = self._index
        if len(index) != len(entries):
            index = {e.value: i for i, e in enumerate(entries)}
        tiers = [list(t) for t in self._tiers]
        seq = self.seq
        for e in entities:
            seq += 1
            i = index.get(e.value)
            if i is not None:
                old = entries[i]
                entries[i] = LedgerEntry(
                    old.value, old.label, old.category, old.source_id, old.first_seen, seq
                )
                category = old.category
            else:
                i = index[e.value] = len(entries)
                category = e.category or e.label
                entries.append(LedgerEntry(e.value, e.label, category, e.source_id, seq, seq))
            tiers[CATEGORY_TIERS.get(category, 1)].append((seq, i))
        if seq == self.seq:
            return self
        if len(entries) > MAX_ENTRIES:
            kept = set(self._keep_order(entries, tiers, MAX_ENTRIES // 2))
            entries = [e for i, e in enumerate(entries) if i in kept]
            return EntityLedger(tuple(entries), seq, self.header)
        stale = sum(map(len, tiers)) - len(entries)
        if stale > len(entries):  # compact: refreshed values left old pairs behind
            return EntityLedger(tuple(entries), seq, self.header, index)
        return EntityLedger(tuple(entries), seq, self.header, index, tuple(map(tuple, tiers)))

    @staticmethod
    def _keep_order(
        entries: Sequence[LedgerEntry],
        tiers: Sequence[Sequence[tuple[int, int]]],
        limit: int | None = None,
    ) -> Iterator[int]:
        """Positions, best first: highest tier, then most recently seen."""
        given = 0
        for tier in reversed(tiers):
            for last_seen, i in reversed(tier):
                if entries[i].last_seen != last_seen:
                    continue  # refreshed since: a newer pair stands for it
                if limit is not None and given >= limit:
                    return
                given += 1
                yield i

    def branch(self) -> EntityLedger:
        """The same ledger with an index of its own: grow it without making the ledger
        it came from rebuild its index on its next ``add`` (a side branch)."""
        return EntityLedger(self.entries, self.seq, self.header, dict(self._index), self._tiers)

    def values(self) -> list[str]:
        return [e.value for e in self.entries]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (a session stores its ledger): entries as compact rows, the
        ``seq`` counter and the header, so :meth:`from_dict` gives back an equal ledger."""
        rows = [
            [e.value, e.label, e.category, e.source_id, e.first_seen, e.last_seen]
            for e in self.entries
        ]
        return {"entries": rows, "seq": self.seq, "header": self.header}

    @classmethod
    def from_dict(cls, data: Any) -> EntityLedger:
        """The ledger :meth:`to_dict` wrote; ``ValueError`` names what is malformed."""
        try:
            entries = tuple(
                LedgerEntry(str(v), str(lb), str(c), str(src), int(first), int(last))
                for v, lb, c, src, first, last in data["entries"]
            )
            return cls(entries, int(data["seq"]), str(data.get("header", DEFAULT_HEADER)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a stored entity ledger ({type(exc).__name__}: {exc})") from exc

    def _render(self, positions: Iterable[int]) -> str:
        groups: dict[str, list[str]] = {}
        for i in sorted(positions):
            e = self.entries[i]
            groups.setdefault(e.label, []).append(listed(e.value))
        if not groups:
            return ""
        lines = [f"- {label}: {', '.join(values)}" for label, values in groups.items()]
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
        for i in self._keep_order(entries, self._tiers):
            e = entries[i]
            step = table.get(e.value)
            if step is None:
                step = table[e.value] = count(" " + listed(e.value)) + 1
            if e.label not in labels:
                step += _cost(table, count, f"\n- {e.label}:") - 1
            if used + step > max_tokens:
                break
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
