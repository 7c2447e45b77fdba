"""The service's own rows (migration 004): tenants, per-build audits, and the proxy's heads.

Kept out of :class:`~ctxwarden.store.SessionStore`, which is what every library caller
needs; these are only what ``ctxwarden serve`` needs, written with the same short
transactions of the SQL backends (SQLite and PostgreSQL share the statements).

- **tenants**: a tenant's API key is stored as its SHA-256 only (keys are 256-bit random
  strings, so a fast hash cannot be reversed or brute-forced), with its caps.
- **builds**: one row per :meth:`ctxwarden.Session.build` (whoever called it), with the
  build's audit as JSON, its turn number in the session, the newest message it saw, its
  built messages (kept for the newest builds only) and its status: ``built`` for a
  library build; the proxy's say how the call ended (``forwarded`` until it does: a row
  left so by a crash says so). The log is bounded per session (:func:`record_build`).
  Written once: how a call ended goes to a small row of its own (``ctxwarden_build_ends``,
  migration 008), which the reads put in place of the status it was logged with.
- **heads**: which stored session a client's session id writes to, how many messages of
  it the client has already sent or received, and a chained hash of them, so the proxy
  recognises the stored prefix in a full history without reading it back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.registry.usage import Usage
from ctxwarden.store._sql import SqlStore
from ctxwarden.store._sql import sql_store as _sql
from ctxwarden.store.base import SessionStore, json_text
from ctxwarden.store.build_marks import HistoryTokens, newest_build, stored_tokens_in
from ctxwarden.store.logged_build import audit_from_text, logged_context
from ctxwarden.store.migrations import Tx

__all__ = [
    "BuildRecord",
    "CallEnd",
    "Head",
    "HistoryTokens",
    "TenantRecord",
    "add_spend",
    "add_tenant",
    "delete_session",
    "end_call",
    "get_head",
    "latest_builds",
    "list_builds",
    "list_tenants",
    "logged_context",
    "put_head",
    "record_build",
    "revoke_tenant",
    "set_caps",
    "stored_tokens_in",
    "tenant_by_key_hash",
]

_TENANT_COLS = (
    "tenant, key_prefix, created_at, revoked_at, max_input_tokens, spend_cap_usd, spent_usd, "
    "policy, upstream_api_key, anthropic_api_key, gemini_api_key"
)


@dataclass(frozen=True)
class TenantRecord:
    """A tenant as stored (never its key: only the key's first characters, to tell keys apart)."""

    tenant: str
    key_prefix: str
    created_at: float
    revoked_at: float | None
    max_input_tokens: int | None
    spend_cap_usd: float | None
    spent_usd: float
    policy: str | None
    upstream_api_key: str | None
    anthropic_api_key: str | None
    gemini_api_key: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class Head:
    """The proxy's position in a client session: ``session_id`` is the stored session
    (branch) it writes to, ``count`` the messages of it the client has seen, ``chain``
    their chained hash, ``history_tokens`` their tokens."""

    tenant: str
    client_id: str
    session_id: str
    branch: int
    count: int
    chain: str
    history_tokens: int


@dataclass(frozen=True)
class BuildRecord:
    build_id: str
    session_id: str
    created_at: float
    model: str
    history_tokens: int
    input_tokens: int
    status: str
    audit: Mapping[str, Any]
    turn: int = 0
    upto_seq: int = -1
    has_context: bool = False


def _build(r: Any) -> BuildRecord:
    """A builds row: the ten columns of ``list_builds`` (an eleventh: whether it has a context)."""
    has_context = bool(r[10]) if len(r) > 10 else False
    return BuildRecord(
        r[0], r[1], float(r[2]), r[3], int(r[4]), int(r[5]), r[6], audit_from_text(r[7]), int(r[8]),
        int(r[9]), has_context,
    )  # fmt: skip


def _tenant(row: Any) -> TenantRecord:
    return TenantRecord(
        tenant=row[0],
        key_prefix=row[1],
        created_at=float(row[2]),
        revoked_at=None if row[3] is None else float(row[3]),
        max_input_tokens=None if row[4] is None else int(row[4]),
        spend_cap_usd=None if row[5] is None else float(row[5]),
        spent_usd=float(row[6]),
        policy=row[7],
        upstream_api_key=row[8],
        anthropic_api_key=row[9],
        gemini_api_key=row[10],
    )


# -- tenants ----------------------------------------------------------------------------------


def add_tenant(
    store: SessionStore,
    tenant: str,
    *,
    key_hash: str,
    key_prefix: str,
    max_input_tokens: int | None = None,
    spend_cap_usd: float | None = None,
    policy: str | None = None,
    upstream_api_key: str | None = None,
    anthropic_api_key: str | None = None,
    gemini_api_key: str | None = None,
) -> TenantRecord:
    """Store a new tenant, or give a revoked one a new key (its sessions are kept).
    An active tenant is refused: revoke it first, so a key is never replaced by accident."""
    sql = _sql(store)
    now = time.time()
    values = (key_hash, key_prefix, now, max_input_tokens, spend_cap_usd, policy)
    keys = (upstream_api_key, anthropic_api_key, gemini_api_key)
    with sql._write() as tx:
        rows = tx.execute("SELECT revoked_at FROM ctxwarden_tenants WHERE tenant = ?", (tenant,))
        if rows and rows[0][0] is None:
            raise ConfigError(
                f"tenant {tenant!r} exists and is active; revoke it first to issue a new key"
            )
        if rows:
            tx.execute(
                "UPDATE ctxwarden_tenants SET key_hash = ?, key_prefix = ?, created_at = ?, "
                "max_input_tokens = ?, spend_cap_usd = ?, policy = ?, revoked_at = NULL, "
                "upstream_api_key = ?, anthropic_api_key = ?, gemini_api_key = ? "
                "WHERE tenant = ?",
                (*values, *keys, tenant),
            )
        else:
            tx.execute(
                "INSERT INTO ctxwarden_tenants (key_hash, key_prefix, created_at, "
                "max_input_tokens, spend_cap_usd, policy, upstream_api_key, anthropic_api_key, "
                "gemini_api_key, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*values, *keys, tenant),
            )
        found = tx.execute(
            f"SELECT {_TENANT_COLS} FROM ctxwarden_tenants WHERE tenant = ?", (tenant,)
        )
    return _tenant(found[0])


def list_tenants(store: SessionStore) -> list[TenantRecord]:
    with _sql(store)._read() as tx:
        rows = tx.execute(f"SELECT {_TENANT_COLS} FROM ctxwarden_tenants ORDER BY tenant")
    return [_tenant(r) for r in rows]


def revoke_tenant(store: SessionStore, tenant: str) -> TenantRecord:
    """Revoke the tenant's key at once (its sessions stay stored)."""
    with _sql(store)._write() as tx:
        rows = tx.execute(
            "UPDATE ctxwarden_tenants SET revoked_at = ? WHERE tenant = ? AND revoked_at IS NULL "
            f"RETURNING {_TENANT_COLS}",
            (time.time(), tenant),
        )
        if not rows:
            known = tx.execute("SELECT 1 FROM ctxwarden_tenants WHERE tenant = ?", (tenant,))
            raise ConfigError(
                f"tenant {tenant!r} is already revoked"
                if known
                else f"no tenant {tenant!r} (see `ctxwarden tenant list`)"
            )
    return _tenant(rows[0])


def set_caps(
    store: SessionStore,
    tenant: str,
    max_input_tokens: int | None,
    spend_cap_usd: float | None,
    *,
    reset_spend: bool = False,
) -> TenantRecord:
    """Replace the tenant's caps (``None`` clears one); optionally zero its spend."""
    with _sql(store)._write() as tx:
        rows = tx.execute(
            "UPDATE ctxwarden_tenants SET max_input_tokens = ?, spend_cap_usd = ?, "
            "spent_usd = CASE WHEN ? = 1 THEN 0 ELSE spent_usd END WHERE tenant = ? "
            f"RETURNING {_TENANT_COLS}",
            (max_input_tokens, spend_cap_usd, 1 if reset_spend else 0, tenant),
        )
    if not rows:
        raise ConfigError(f"no tenant {tenant!r} (see `ctxwarden tenant list`)")
    return _tenant(rows[0])


def tenant_by_key_hash(store: SessionStore, key_hash: str) -> TenantRecord | None:
    """The active tenant whose key hashes to ``key_hash`` (revoked ones are not found)."""
    with _sql(store)._read_one() as tx:
        rows = tx.execute(
            f"SELECT {_TENANT_COLS} FROM ctxwarden_tenants "
            "WHERE key_hash = ? AND revoked_at IS NULL",
            (key_hash,),
        )
    return _tenant(rows[0]) if rows else None


def add_spend(store: SessionStore, tenant: str, dollars: float, tx: Tx | None = None) -> None:
    """Add ``dollars`` to the tenant's spend, in ``tx`` when given."""
    if dollars <= 0:
        return
    if tx is None:
        with _sql(store)._write() as own:
            return add_spend(store, tenant, dollars, own)
    tx.execute(
        "UPDATE ctxwarden_tenants SET spent_usd = spent_usd + ? WHERE tenant = ?",
        (dollars, tenant),
    )


# -- heads ------------------------------------------------------------------------------------


def get_head(store: SessionStore, tenant: str, client_id: str) -> Head | None:
    with _sql(store)._read_one() as tx:
        rows = tx.execute(
            "SELECT session_id, branch, count, chain, history_tokens FROM ctxwarden_heads "
            "WHERE tenant = ? AND client_id = ?",
            (tenant, client_id),
        )
    if not rows:
        return None
    r = rows[0]
    return Head(tenant, client_id, r[0], int(r[1]), int(r[2]), r[3], int(r[4]))


def put_head(
    store: SessionStore, head: Head, *, expected: Head | None, tx: Tx | None = None
) -> bool:
    """Move the head to ``head`` if it is still ``expected`` (``None``: none stored yet),
    in ``tx`` when given (e.g. the append of the messages it counts). Returns False when
    another writer moved it first (the caller re-reads)."""
    if tx is None:
        with _sql(store)._write() as own:
            return put_head(store, head, expected=expected, tx=own)
    now = time.time()
    new = (head.session_id, head.branch, head.count, head.chain, head.history_tokens, now)
    if expected is None:
        rows = tx.execute(
            "INSERT INTO ctxwarden_heads (session_id, branch, count, chain, history_tokens, "
            "updated_at, tenant, client_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, client_id) DO NOTHING RETURNING count",
            (*new, head.tenant, head.client_id),
        )
    else:
        rows = tx.execute(
            "UPDATE ctxwarden_heads SET session_id = ?, branch = ?, count = ?, chain = ?, "
            "history_tokens = ?, updated_at = ? WHERE tenant = ? AND client_id = ? "
            "AND session_id = ? AND count = ? AND chain = ? RETURNING count",
            (
                *new,
                head.tenant,
                head.client_id,
                expected.session_id,
                expected.count,
                expected.chain,
            ),
        )
    return bool(rows)


# -- builds -----------------------------------------------------------------------------------


def record_build(
    store: SessionStore,
    tenant: str,
    session_id: str,
    *,
    build_id: str,
    model: str,
    history_tokens: int | HistoryTokens,
    input_tokens: int,
    audit: Mapping[str, Any] | str,
    status: str = "forwarded",
    upto_seq: int = -1,
    context: Sequence[Mapping[str, Any]] | str | bytes | None = None,
    keep: int | None = None,
    keep_contexts: int | None = None,
    durable: bool = True,
    also: Callable[[Tx], object] | None = None,
    context_base: str | None = None,
    whole_context: Callable[[], bytes] | None = None,
) -> int:
    """Store a build's audit as the session's next turn and return the turn's number.

    ``context`` (the built messages as JSON-ready dicts, or their JSON text as
    :func:`~ctxwarden.store.base.json_text` writes it, or that text's UTF-8) is kept for
    the newest ``keep_contexts`` turns only, and only the newest ``keep`` rows are kept at
    all (``None``: no bound), in the same transaction, so the log of a long session stays
    the size of its bounds. ``durable=False`` lets the backend relax durability for
    this write (PostgreSQL: no wait for the WAL flush, which was most of the write):
    a crash may lose the newest rows, never a message. ``also(tx)`` writes more in the
    same transaction (the build's sticky decisions).

    ``context_base`` says ``context`` starts from the first messages of that build's
    logged context (its first row, ``{"base": ..., "count": n}``, see
    :mod:`ctxwarden.session.build_log`); the base must be stored whole (no base of its
    own), else ``whole_context()`` is written instead. A base stays while a kept context
    starts from it, though it is older than the bound.

    ``history_tokens`` may be a function of the transaction and the session's newest
    logged build's ``(history_tokens, upto_seq)`` (``None``: none), called in the
    transaction that writes the row: the full-history size is then the previous row's
    plus what came after, read where no other build can be logged in between."""
    sql = _sql(store)
    with sql._write() as tx:
        if not durable and sql._advisory_write:
            tx.execute(sql._advisory_write)
        if also is not None:
            also(tx)
        where = "WHERE tenant = ? AND session_id = ?"
        newest = newest_build(tx, tenant, session_id)
        turn = newest[0] + 1 if newest else 1
        if callable(history_tokens):
            history_tokens = history_tokens(tx, newest[1:] if newest else None)
        tx.execute(
            "INSERT INTO ctxwarden_builds (tenant, session_id, build_id, created_at, model, "
            "history_tokens, input_tokens, status, audit, turn, upto_seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                tenant,
                session_id,
                build_id,
                time.time(),
                model,
                history_tokens,
                input_tokens,
                status,
                audit if isinstance(audit, str) else json_text(dict(audit)),
                turn,
                upto_seq,
            ),
        )
        if context is not None:
            _insert_context(sql, tx, (tenant, session_id, build_id, turn), context, context_base,
                            whole_context)  # fmt: skip
        # (no row has a negative turn: a bound below zero has nothing to delete)
        if keep is not None and turn - max(1, keep) >= 0:
            params = (tenant, session_id, turn - max(1, keep))
            tx.execute(
                f"DELETE FROM ctxwarden_build_ends {where} AND build_id IN "
                f"(SELECT build_id FROM ctxwarden_builds {where} AND turn <= ?)",
                (tenant, session_id, *params),
            )
            tx.execute(f"DELETE FROM ctxwarden_builds {where} AND turn <= ?", params)
        bounds = [max(1, keep)] if keep is not None else []
        if keep_contexts is not None:
            bounds.append(max(0, keep_contexts))
        if bounds and turn - min(bounds) >= 0:  # the newest contexts only, and their bases
            oldest = turn - min(bounds)
            tx.execute(
                f"DELETE FROM ctxwarden_build_contexts {where} AND turn <= ? AND build_id NOT IN "
                f"(SELECT base FROM ctxwarden_build_contexts {where} AND turn > ? "
                "AND base IS NOT NULL)",
                (tenant, session_id, oldest, tenant, session_id, oldest),
            )
    return turn


def _insert_context(
    sql: SqlStore,
    tx: Tx,
    row: tuple[str, str, str, int],
    context: Sequence[Mapping[str, Any]] | str | bytes,
    base: str | None,
    whole_context: Callable[[], bytes] | None,
) -> None:
    """The build's logged context (see :func:`record_build`): from ``base`` only while
    that base is stored whole, checked by the insert itself; else ``whole_context()``."""
    columns = "INSERT INTO ctxwarden_build_contexts (tenant, session_id, build_id, turn, context"
    if base is not None:
        place, value = _context_value(sql, context)
        written = tx.execute(
            f"{columns}, base) SELECT ?, ?, ?, ?, {place}, ? WHERE EXISTS (SELECT 1 FROM "
            "ctxwarden_build_contexts WHERE tenant = ? AND session_id = ? AND build_id = ? "
            "AND base IS NULL) RETURNING turn",
            (*row, value, base, row[0], row[1], base),
        )
        if written:
            return
        if whole_context is None:  # (pruned by another writer, or never written)
            raise ValueError(f"the base context of build {base!r} is not stored")
        context = whole_context()
    place, value = _context_value(sql, context)
    tx.execute(f"{columns}) VALUES (?, ?, ?, ?, {place})", (*row, value))


def _context_value(
    sql: SqlStore, context: Sequence[Mapping[str, Any]] | str | bytes
) -> tuple[str, Any]:
    if isinstance(context, bytes):
        return sql._utf8_text(context)
    return "?", context if isinstance(context, str) else json_text([*context])


@dataclass(frozen=True)
class CallEnd:
    """How a forwarded call ended, for :func:`end_call`: the build's final ``status``, the
    upstream ``usage`` (``None``: none reported) priced at ``dollars`` for ``model``, and
    the head to move past the stored reply (``head``, if it is still ``expected``)."""

    tenant: str
    session_id: str
    build_id: str
    status: str
    usage: Usage | None = None
    model: str = ""
    dollars: float = 0.0
    head: Head | None = None
    expected: Head | None = None


def end_call(store: SessionStore, end: CallEnd, tx: Tx | None = None) -> bool:
    """Write how a call ended in one transaction (``tx`` when given, e.g. the reply's
    append): the usage on the session, its price on the tenant's spend, the build's
    status, and the head's move (compare-and-set as :func:`put_head`). Returns False when
    the head had moved (everything else is written)."""
    if tx is None:
        with _sql(store)._write() as own:
            return end_call(store, end, own)
    if end.usage is not None:
        _sql(store).record_usage_in(
            tx,
            end.tenant,
            end.session_id,
            end.usage,
            model=end.model,
            dollars=end.dollars,
            read_back=False,
        )
    # the build's row, audit and all, stays as written (see the module docstring)
    tx.execute(
        "INSERT INTO ctxwarden_build_ends (tenant, session_id, build_id, status) "
        "SELECT tenant, session_id, build_id, ? FROM ctxwarden_builds "
        "WHERE tenant = ? AND session_id = ? AND build_id = ? "
        "ON CONFLICT (tenant, session_id, build_id) DO UPDATE SET status = excluded.status",
        (end.status, end.tenant, end.session_id, end.build_id),
    )
    moved = True
    if end.head is not None and end.expected is not None:
        moved = put_head(store, end.head, expected=end.expected, tx=tx)
    if end.usage is not None:  # last: the tenant's row is shared
        add_spend(store, end.tenant, end.dollars, tx)
    return moved


# a build's status: how its call ended when it has, else the status it was logged with
_STATUS = "COALESCE(e.status, b.status)"
_ENDS = (
    "LEFT JOIN ctxwarden_build_ends e ON e.tenant = b.tenant AND e.session_id = b.session_id "
    "AND e.build_id = b.build_id"
)


def list_builds(
    store: SessionStore,
    tenant: str,
    session_id: str,
    *,
    limit: int = 50,
    offset: int = 0,
    since_turn: int = 0,
) -> list[BuildRecord]:
    """The session's builds from turn ``since_turn`` on, oldest first (their built
    messages: :func:`logged_context`)."""
    with _sql(store)._read() as tx:
        rows = tx.execute(
            "SELECT b.build_id, b.session_id, b.created_at, b.model, b.history_tokens, "
            f"b.input_tokens, {_STATUS}, b.audit, b.turn, b.upto_seq, EXISTS (SELECT 1 "
            "FROM ctxwarden_build_contexts c WHERE c.tenant = b.tenant "
            "AND c.session_id = b.session_id AND c.build_id = b.build_id) "
            f"FROM ctxwarden_builds b {_ENDS} "
            "WHERE b.tenant = ? AND b.session_id = ? AND b.turn >= ? "
            "ORDER BY b.turn, b.created_at, b.build_id LIMIT ? OFFSET ?",
            (tenant, session_id, since_turn, limit, offset),
        )
    return [_build(r) for r in rows]


def latest_builds(store: SessionStore, tenant: str) -> dict[str, BuildRecord]:
    """The newest logged build of each of the tenant's sessions, by session id (one read)."""
    with _sql(store)._read() as tx:
        rows = tx.execute(
            "SELECT b.build_id, b.session_id, b.created_at, b.model, b.history_tokens, "
            f"b.input_tokens, {_STATUS}, b.audit, b.turn, b.upto_seq FROM ctxwarden_builds b "
            "JOIN (SELECT session_id, MAX(turn) AS turn FROM ctxwarden_builds WHERE tenant = ? "
            "GROUP BY session_id) last ON b.session_id = last.session_id AND b.turn = last.turn "
            f"{_ENDS} WHERE b.tenant = ?",
            (tenant, tenant),
        )
    return {r[1]: _build(r) for r in rows}


def delete_session(store: SessionStore, tenant: str, session_id: str) -> bool:
    """Delete a session with its messages, ledger, builds and the heads that point to it."""
    with _sql(store)._write() as tx:
        params = (tenant, session_id)
        where = "WHERE tenant = ? AND session_id = ?"
        found = tx.execute(f"SELECT 1 FROM ctxwarden_sessions {where}", params)
        if not found:
            return False
        tables = (
            "ctxwarden_heads",
            "ctxwarden_build_contexts",
            "ctxwarden_build_ends",
            "ctxwarden_builds",
        )
        for table in (*tables, "ctxwarden_ledgers"):
            tx.execute(f"DELETE FROM {table} {where}", params)
        tx.execute(f"DELETE FROM ctxwarden_messages {where}", params)
        tx.execute(f"DELETE FROM ctxwarden_sessions {where}", params)
    return True
