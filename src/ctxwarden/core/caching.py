"""The one memo every module-level cache is made of: bounded, locked, and pure.

A build may run on many threads at once (the proxy builds on a thread pool) and many
of its inputs come from clients (model names, texts), so every memo kept between calls
is a :class:`BoundedCache`: a least-recently-used map with a size cap and a lock around
each operation. Values are computed outside the lock — two threads may compute the same
value, and the first one stored wins — so a slow computation never blocks another key.

Only results of pure functions belong in one: what a cache holds may be dropped at any
time without changing an output. State that a later build needs is never cached; it is
an explicit value (:class:`~ctxwarden.BuildState`, the store).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, ParamSpec, TypeVar

__all__ = ["BoundedCache", "all_caches", "clear_all", "memoize"]

P = ParamSpec("P")
R = TypeVar("R")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING: object = object()
_ALL: weakref.WeakSet[BoundedCache[object, object]] = weakref.WeakSet()
_MEMOISED: list[Any] = []  # functions made by memoize (module-level, so never collected)


class BoundedCache(Generic[K, V]):
    """A thread-safe LRU map of at most ``maxsize`` entries, named for diagnostics.

    Reads take no lock; writes (and the evictions they cause) take it."""

    __slots__ = (
        "__weakref__",
        "_data",
        "_lock",
        "_weigh",
        "_weight",
        "get",
        "max_weight",
        "maxsize",
        "name",
    )

    def __init__(
        self,
        name: str,
        maxsize: int,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
        recency: bool = True,
    ) -> None:
        """``maxsize`` entries at most; with ``weigh``, also at most ``max_weight`` in all
        (a memo of texts is bounded in characters as well as in entries). With
        ``recency=False`` the oldest entry leaves first whatever was read since (first in,
        first out), and a read takes no lock: one ``dict.get``, for the hottest memos (the
        token counter's, read for every message of every build)."""
        if maxsize < 1:
            raise ValueError(f"cache {name!r}: maxsize must be at least 1, got {maxsize}")
        if (weigh is None) != (max_weight is None):
            raise ValueError(f"cache {name!r}: give both max_weight and weigh, or neither")
        self.name = name
        self.maxsize = maxsize
        self.max_weight = max_weight
        self._weigh = weigh
        self._weight = 0
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.get: Callable[[K], V | None] = self._recent if recency else self._data.get
        _ALL.add(self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"BoundedCache({self.name!r}, {len(self)}/{self.maxsize})"

    def __len__(self) -> int:
        return len(self._data)

    def _recent(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or ``None``: what
        ``get`` is unless ``recency=False``. Lock-free: each of the two calls is one step
        of the C ``OrderedDict``, and a key another thread evicts in between is a
        ``KeyError`` here that changes nothing (the value read is still the right one)."""
        data = self._data
        found = data.get(key, _MISSING)
        if found is _MISSING:
            return None
        try:  # noqa: SIM105 (contextlib.suppress costs a context manager per read)
            data.move_to_end(key)
        except KeyError:
            pass
        return found  # type: ignore[return-value]

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key``, dropping the least recently used past the cap."""
        weigh = self._weigh
        with self._lock:
            if weigh is not None:
                old = self._data.get(key, _MISSING)
                self._weight += weigh(value) - (0 if old is _MISSING else weigh(old))  # type: ignore[arg-type]
            self._data[key] = value
            self._data.move_to_end(key)
            self._shrink()
        return value

    def put_unless(self, key: K, value: V, keep: Callable[[V], bool]) -> V:
        """Keep ``value`` under ``key`` unless the value kept already satisfies ``keep``
        (decided under the lock: two threads cannot both replace a better value); the key
        becomes the most recently used either way. Returns the value kept."""
        weigh = self._weigh
        with self._lock:
            old = self._data.get(key, _MISSING)
            if old is not _MISSING and keep(old):  # type: ignore[arg-type]
                self._data.move_to_end(key)
                return old  # type: ignore[return-value]
            if weigh is not None:
                self._weight += weigh(value) - (0 if old is _MISSING else weigh(old))  # type: ignore[arg-type]
            self._data[key] = value
            self._data.move_to_end(key)
            self._shrink()
            return value

    def _shrink(self) -> None:
        data, weigh = self._data, self._weigh
        while len(data) > self.maxsize or (
            weigh is not None and self.max_weight is not None and self._weight > self.max_weight
        ):
            dropped = data.popitem(last=False)[1]
            if weigh is not None:
                self._weight -= weigh(dropped)

    def pop(self, key: K) -> V | None:
        """Remove and return the value kept for ``key``, or ``None``."""
        with self._lock:
            found = self._data.pop(key, _MISSING)
            if found is _MISSING:
                return None
            if self._weigh is not None:
                self._weight -= self._weigh(found)  # type: ignore[arg-type]
            return found  # type: ignore[return-value]

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value for ``key``, made by ``make()`` (outside the lock) when missing."""
        found = self.get(key)
        if found is not None:
            return found
        return self.put(key, make())

    def resize(self, maxsize: int) -> None:
        """A new cap (tests shrink caches to make every thread evict)."""
        if maxsize < 1:
            raise ValueError(f"cache {self.name!r}: maxsize must be at least 1, got {maxsize}")
        with self._lock:
            self.maxsize = maxsize
            self._shrink()

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._weight = 0


def memoize(maxsize: int, *, typed: bool = False) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A pure function's memo, bounded to ``maxsize`` results: ``functools.lru_cache``
    (thread-safe, and in C: hot paths call these per message), always with a size, and
    known to :func:`clear_all`. Arguments fed by clients (model names, texts) can then
    never grow it without bound."""
    if maxsize < 1:
        raise ValueError(f"memoize: maxsize must be at least 1, got {maxsize}")

    def wrap(function: Callable[P, R]) -> Callable[P, R]:
        memoised = functools.lru_cache(maxsize=maxsize, typed=typed)(function)
        _MEMOISED.append(memoised)
        return memoised  # type: ignore[return-value]

    return wrap


def all_caches() -> Iterator[BoundedCache[object, object]]:
    """Every live cache, for diagnostics and tests."""
    return iter(sorted(_ALL, key=lambda cache: cache.name))


def clear_all() -> None:
    """Empty every cache: nothing an output depends on is lost (they hold pure results)."""
    for cache in list(_ALL):
        cache.clear()
    for function in _MEMOISED:
        function.cache_clear()
