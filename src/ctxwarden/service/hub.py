"""What every request shares: the store, the open sessions, per-session locks, policies.

One :class:`Hub` per app. Sessions are kept open in a small LRU (a
:class:`~ctxwarden.Session` caches decoded messages across builds, so the next turn's
build decodes only what is new). Calls on one client session are serialised by an
``asyncio`` lock held for the whole call, so a reply is always stored right after the
history it answers; calls on different sessions run concurrently. Store work and builds run
through :meth:`Hub.run` (:class:`~ctxwarden.service.workers.Workers`):

- on PostgreSQL, in 4 worker threads, at most 4 at once (psycopg waits on the network;
  its pool);
- on SQLite, one at a time on the event loop itself by default: SQLite is one writer anyway (more
  threads only meet in its busy-wait, which sleeps up to 100 ms per retry), its work is
  local, and a thread's hand-overs cost ~15% of a proxied call's CPU. The loop does wait
  while another process holds the database's write lock (the ``tenant`` commands do, for
  milliseconds); ``ctxwarden serve --store-threads 1`` moves the work to a thread instead.
  With ``--broker`` it is in one thread: a build that finds a summary due publishes a
  job, and a broker that does not answer would hold the loop for its timeout.

What a person waits for rather than an agent (the session pages, the session API) goes
through :meth:`Hub.run_aside`: on the loop's SQLite it runs in a thread of its own, so a
2,000-turn session page (~0.4 s of work) does not hold up the proxied calls meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ctxwarden import Policy, Session
from ctxwarden.core.caching import memoize
from ctxwarden.service.body_memo import BodyMemo
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.key_memo import KeyMemo
from ctxwarden.service.workers import Workers
from ctxwarden.store import SessionStore, open_store
from ctxwarden.store.service_tables import TenantRecord

if TYPE_CHECKING:
    from ctxwarden.service.metrics import Metrics

__all__ = ["Hub", "Tenant"]

_OPEN_SESSIONS = 512
_POOL_WAIT = 5.0
"""Seconds a call waits for a PostgreSQL connection before it is answered 503: a server
that is down must not hold every call for the pool's default 30 s."""
T = TypeVar("T")


@dataclass(frozen=True)
class Tenant:
    """The authenticated caller: its record and the policy its calls are built with."""

    record: TenantRecord
    policy: Policy

    @property
    def name(self) -> str:
        return self.record.tenant


def _store_options(config: ServiceConfig) -> dict[str, Any]:
    """PostgreSQL: a bounded wait for a pooled connection. An SQLite file: its log copied
    into the file in a thread of its own, not inside a request's commit, unless the
    config says otherwise (:mod:`~ctxwarden.store.sqlite_checkpoint`)."""
    url = config.db
    if url.startswith(("postgresql://", "postgres://")):
        return {"timeout": _POOL_WAIT}
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return {"background_checkpoint": config.background_checkpoint}
    return {}


@memoize(256)
def _tenant_policy(text: str) -> Policy:
    return Policy.from_toml(text)


class Hub:
    def __init__(self, config: ServiceConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.store: SessionStore = open_store(config.db, **_store_options(config))
        checkpoint = getattr(self.store, "checkpoint", None)  # an SQLite file's thread
        if checkpoint is not None:
            metrics.watch_checkpoint(checkpoint)
        self.policy = config.policy or Policy()
        self._sessions: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self._sessions_lock = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self.keys = KeyMemo()  # the client messages' keys, per client session (speed only)
        self.bodies = BodyMemo()  # the bodies' unchanged fronts, read once (speed only)
        self.summaries: Any = None  # service.summaries.Summaries with --summarizer
        from ctxwarden.service.embeddings import Embeddings

        self.embeddings = Embeddings()  # vectors after a call ([recall] embeddings)
        threads = config.store_threads
        if threads is None:  # see the module docstring
            sqlite = self.store.url.startswith("sqlite")
            threads = (0 if config.broker is None else 1) if sqlite else 4
        self._workers = Workers(threads)
        self._aside = Workers(1, "ctxwarden pages") if threads == 0 else self._workers

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` within the store's concurrency (see the module docstring)."""
        return await self._workers.run(fn, *args)

    async def run_aside(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` for a page or the session API: never on the loop (see the module
        docstring)."""
        return await self._aside.run(fn, *args)

    def close(self) -> None:
        self._workers.close()
        if self._aside is not self._workers:
            self._aside.close()
        self.store.close()

    def tenant(self, record: TenantRecord) -> Tenant:
        policy = _tenant_policy(record.policy) if record.policy else self.policy
        return Tenant(record, policy)

    def session(self, tenant: str, session_id: str, model: str | None = None) -> Session:
        """An open :class:`Session` (created in the store when new)."""
        key = (tenant, session_id)
        with self._sessions_lock:
            found = self._sessions.get(key)
            if found is not None:
                self._sessions.move_to_end(key)
        if found is None:
            found = Session(self.store, session_id, tenant=tenant, registry=self.config.registry)
            found.keep_builds = self.config.keep_builds
            found.keep_contexts = self.config.keep_contexts
            with self._sessions_lock:
                self._sessions[key] = found
                while len(self._sessions) > _OPEN_SESSIONS:
                    self._sessions.popitem(last=False)
        if model is not None:
            found.model = model
        return found

    def forget(self, tenant: str, session_id: str) -> None:
        """Drop a deleted session (and its branches) from the open ones."""
        with self._sessions_lock:
            for key in [k for k in self._sessions if k[0] == tenant]:
                if key[1] == session_id or key[1].startswith(session_id + "~b"):
                    del self._sessions[key]

    @asynccontextmanager
    async def locked(self, tenant: str, client_id: str) -> AsyncIterator[None]:
        """Hold the lock of one client session for the whole call."""
        key = (tenant, client_id)
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
