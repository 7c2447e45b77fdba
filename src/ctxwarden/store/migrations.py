"""Ordered, named schema steps recorded in ``ctxwarden_migrations`` (simonw/llm style).

One schema serves SQLite and PostgreSQL: the statements below use only types and syntax
both accept (``BIGINT``, ``DOUBLE PRECISION``, ``TEXT``, partial indexes), and JSON is
kept as ``TEXT`` so the two backends read and write the same bytes. Steps are applied on
open, all pending ones in one transaction under the backend's write lock, so two
processes opening a new database at once cannot both apply a step, and a crash leaves
either the old schema or the new one. A step is never edited once released: changes
are new steps, and a database created at any earlier step upgrades to the latest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from ctxwarden.core.errors import StoreError

__all__ = ["MIGRATIONS", "REQUIRED_COLUMNS", "Migration", "Tx", "check_schema", "migrate"]


class Tx(Protocol):
    """A cursor inside an open transaction; SQL uses ``?`` placeholders on every backend."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


Statement = str | Callable[[Tx], None]
"""SQL text, or a function that runs its own statements (a step that must look first)."""


@dataclass(frozen=True)
class Migration:
    """A named step; ``postgres``, when given, replaces ``statements`` on PostgreSQL (a
    type the two backends spell differently)."""

    name: str
    statements: tuple[Statement, ...]
    postgres: tuple[Statement, ...] | None = None


def _pg_embedding_column(tx: Tx) -> None:
    """``embedding`` as pgvector's ``vector`` where ``CREATE EXTENSION vector`` works,
    else a plain ``REAL[]`` (the store reads either as ``REAL[]`` and writes a float
    array, which pgvector casts on assignment). The attempt runs in a savepoint, so a
    server without the extension (or a role that may not create it) keeps the step's
    transaction."""
    tx.execute("SAVEPOINT ctxwarden_vector")
    try:
        tx.execute("CREATE EXTENSION IF NOT EXISTS vector")
        kind = "vector"
    except Exception:  # not installed, or not allowed: psycopg's error, whatever it is
        tx.execute("ROLLBACK TO SAVEPOINT ctxwarden_vector")
        kind = "REAL[]"
    tx.execute("RELEASE SAVEPOINT ctxwarden_vector")
    tx.execute(f"ALTER TABLE ctxwarden_messages ADD COLUMN embedding {kind}")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "001_initial",
        (
            """CREATE TABLE ctxwarden_sessions (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                summary TEXT,
                facts TEXT NOT NULL DEFAULT '{}',
                sticky TEXT NOT NULL DEFAULT '{}',
                version BIGINT NOT NULL DEFAULT 0,
                next_seq BIGINT NOT NULL DEFAULT 0,
                summary_upto BIGINT NOT NULL DEFAULT -1,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (tenant, session_id)
            )""",
            """CREATE TABLE ctxwarden_messages (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                message TEXT NOT NULL,
                role TEXT NOT NULL,
                kind TEXT,
                pinned INTEGER NOT NULL DEFAULT 0,
                priority TEXT NOT NULL DEFAULT 'medium',
                token_counts TEXT NOT NULL DEFAULT '{}',
                created_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (tenant, session_id, seq),
                FOREIGN KEY (tenant, session_id)
                    REFERENCES ctxwarden_sessions (tenant, session_id) ON DELETE CASCADE
            )""",
        ),
    ),
    Migration(
        "002_usage_and_pinned_index",
        (
            "ALTER TABLE ctxwarden_sessions ADD COLUMN usage TEXT NOT NULL DEFAULT '{}'",
            # the build reads pinned messages on every call: keep that read off the history
            """CREATE INDEX ctxwarden_messages_pinned
                ON ctxwarden_messages (tenant, session_id, seq) WHERE pinned = 1""",
        ),
    ),
    Migration(
        "003_ledger_and_summary_levels",
        (
            # The entity ledger of the messages no build reads any more (derived data: a
            # checkpoint each build advances by what left its slice). A table of its own:
            # the sessions row is rewritten by every append, and this value is large.
            """CREATE TABLE ctxwarden_ledgers (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                upto BIGINT NOT NULL,
                ledger TEXT NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (tenant, session_id),
                FOREIGN KEY (tenant, session_id)
                    REFERENCES ctxwarden_sessions (tenant, session_id) ON DELETE CASCADE
            )""",
            # the summary's two tiers: level-one summaries since the last meta-summary, and it
            "ALTER TABLE ctxwarden_sessions ADD COLUMN summary_levels TEXT NOT NULL DEFAULT '{}'",
        ),
    ),
    Migration(
        "004_service_tenants_builds_heads",
        (
            # API keys of the service's tenants: only a SHA-256 of the key is kept (keys
            # are 256-bit random, so a fast hash is not reversible); caps and an optional
            # per-tenant policy (TOML text) and upstream keys ride along.
            """CREATE TABLE ctxwarden_tenants (
                tenant TEXT PRIMARY KEY,
                key_hash TEXT NOT NULL UNIQUE,
                key_prefix TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                revoked_at DOUBLE PRECISION,
                max_input_tokens BIGINT,
                spend_cap_usd DOUBLE PRECISION,
                spent_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
                policy TEXT,
                upstream_api_key TEXT,
                anthropic_api_key TEXT
            )""",
            # one row per build the service forwarded: its audit, for /v1/sessions/{id}/builds
            """CREATE TABLE ctxwarden_builds (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                build_id TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                model TEXT NOT NULL,
                history_tokens BIGINT NOT NULL,
                input_tokens BIGINT NOT NULL,
                status TEXT NOT NULL,
                audit TEXT NOT NULL,
                PRIMARY KEY (tenant, session_id, build_id),
                FOREIGN KEY (tenant, session_id)
                    REFERENCES ctxwarden_sessions (tenant, session_id) ON DELETE CASCADE
            )""",
            """CREATE INDEX ctxwarden_builds_time
                ON ctxwarden_builds (tenant, session_id, created_at)""",
            # the proxy's view of a client's history: which stored session (branch) a
            # client session id writes to, how many messages of it the client has seen,
            # the chained hash of those messages, and their tokens
            """CREATE TABLE ctxwarden_heads (
                tenant TEXT NOT NULL,
                client_id TEXT NOT NULL,
                session_id TEXT NOT NULL,
                branch BIGINT NOT NULL DEFAULT 0,
                count BIGINT NOT NULL DEFAULT 0,
                chain TEXT NOT NULL DEFAULT '',
                history_tokens BIGINT NOT NULL DEFAULT 0,
                updated_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (tenant, client_id)
            )""",
        ),
    ),
    Migration(
        "005_summary_job_log",
        (
            # one row per attempt of a summary job (ctxwarden.jobs): started, then how it
            # ended; a started row left without an end is an attempt whose worker died
            """CREATE TABLE ctxwarden_summary_jobs (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                job_id TEXT NOT NULL,
                attempt BIGINT NOT NULL,
                started_at DOUBLE PRECISION NOT NULL,
                ended_at DOUBLE PRECISION,
                outcome TEXT,
                error TEXT,
                PRIMARY KEY (tenant, session_id, job_id, attempt, started_at)
            )""",
        ),
    ),
    Migration(
        "006_build_log",
        (
            # every Session.build is logged (not only the proxy's), bounded per session:
            # ``turn`` numbers a session's builds, ``upto_seq`` is the newest message the
            # build saw (the full-history size of the next one is this one's plus what
            # came after), ``context`` the built messages, kept for the newest builds only
            "ALTER TABLE ctxwarden_builds ADD COLUMN turn BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE ctxwarden_builds ADD COLUMN upto_seq BIGINT NOT NULL DEFAULT -1",
            "ALTER TABLE ctxwarden_builds ADD COLUMN context TEXT",
            """CREATE INDEX ctxwarden_builds_turn
                ON ctxwarden_builds (tenant, session_id, turn)""",
            # the rows still holding their built messages: trimming them to the newest
            # few reads only those, not every kept audit
            """CREATE INDEX ctxwarden_builds_context
                ON ctxwarden_builds (tenant, session_id, turn) WHERE context IS NOT NULL""",
        ),
    ),
    Migration(
        "007_build_contexts",
        (
            # the built messages (tens to hundreds of KB) move to their own rows, written
            # once: closing a proxied call rewrites its small build row (the status), and a
            # database rewrites a whole row on update, context included
            """CREATE TABLE ctxwarden_build_contexts (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                build_id TEXT NOT NULL,
                turn BIGINT NOT NULL,
                context TEXT NOT NULL,
                PRIMARY KEY (tenant, session_id, build_id)
            )""",
            """CREATE INDEX ctxwarden_build_contexts_turn
                ON ctxwarden_build_contexts (tenant, session_id, turn)""",
            """INSERT INTO ctxwarden_build_contexts (tenant, session_id, build_id, turn, context)
                SELECT tenant, session_id, build_id, turn, context FROM ctxwarden_builds
                WHERE context IS NOT NULL""",
            "UPDATE ctxwarden_builds SET context = NULL WHERE context IS NOT NULL",
        ),
    ),
    Migration(
        "008_build_ends",
        (
            # how a forwarded call ended (its build's final status), a small row written
            # once: updating the status in the build row rewrote that row with its audit
            # (~17 KB for a proxied session: SQLite rewrites a row whose size changes, and
            # its overflow pages with it); a build without one keeps its status there
            """CREATE TABLE ctxwarden_build_ends (
                tenant TEXT NOT NULL,
                session_id TEXT NOT NULL,
                build_id TEXT NOT NULL,
                status TEXT NOT NULL,
                PRIMARY KEY (tenant, session_id, build_id)
            )""",
        ),
    ),
    Migration(
        "009_drop_builds_time_index",
        (
            # no read orders or finds builds by time since 006 numbered them (turn), and
            # every logged build wrote a page of this index
            "DROP INDEX IF EXISTS ctxwarden_builds_time",
        ),
    ),
    Migration(
        "010_build_context_bases",
        (
            # a logged context may start with the first messages of an earlier build's
            # (its base, named here): consecutive builds of a session share most of their
            # context, and writing it whole again was most of the bytes a call wrote
            "ALTER TABLE ctxwarden_build_contexts ADD COLUMN base TEXT",
        ),
    ),
    Migration(
        "011_service_secrets",
        (
            # the server secret that signs the session page's cookies
            # (ctxwarden.store.page_auth): shared by every replica, rotated on request
            """CREATE TABLE IF NOT EXISTS ctxwarden_secrets (
                name TEXT PRIMARY KEY,
                value TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL
            )""",
        ),
    ),
    Migration(
        "012_tenant_gemini_key",
        # a tenant's own key for the Gemini API upstream, beside its OpenAI and Anthropic ones
        ("ALTER TABLE ctxwarden_tenants ADD COLUMN gemini_api_key TEXT",),
    ),
    Migration(
        "013_message_embeddings",
        # embedding recall (ctxwarden.store.vectors): a message's vector, stored once, and
        # the embeddings spec that made it (a vector of another model counts as missing)
        (
            "ALTER TABLE ctxwarden_messages ADD COLUMN embedding BLOB",
            "ALTER TABLE ctxwarden_messages ADD COLUMN embedding_model TEXT",
        ),
        postgres=(
            _pg_embedding_column,
            "ALTER TABLE ctxwarden_messages ADD COLUMN embedding_model TEXT",
        ),
    ),
)

REQUIRED_COLUMNS: dict[str, frozenset[str]] = {
    "ctxwarden_sessions": frozenset(
        [
            "tenant",
            "session_id",
            "summary",
            "facts",
            "sticky",
            "version",
            "next_seq",
            "summary_upto",
            "created_at",
            "updated_at",
            "usage",
            "summary_levels",
        ]
    ),
    "ctxwarden_messages": frozenset(
        [
            "tenant",
            "session_id",
            "seq",
            "message",
            "role",
            "kind",
            "pinned",
            "priority",
            "token_counts",
            "created_at",
            "embedding",
            "embedding_model",
        ]
    ),
    "ctxwarden_ledgers": frozenset(["tenant", "session_id", "upto", "ledger", "updated_at"]),
    "ctxwarden_tenants": frozenset(
        [
            "tenant",
            "key_hash",
            "key_prefix",
            "created_at",
            "revoked_at",
            "max_input_tokens",
            "spend_cap_usd",
            "spent_usd",
            "policy",
            "upstream_api_key",
            "anthropic_api_key",
            "gemini_api_key",
        ]
    ),
    "ctxwarden_builds": frozenset(
        [
            "tenant",
            "session_id",
            "build_id",
            "created_at",
            "model",
            "history_tokens",
            "input_tokens",
            "status",
            "audit",
            "turn",
            "upto_seq",
            "context",
        ]
    ),
    "ctxwarden_build_contexts": frozenset(
        ["tenant", "session_id", "build_id", "turn", "context", "base"]
    ),
    "ctxwarden_build_ends": frozenset(["tenant", "session_id", "build_id", "status"]),
    "ctxwarden_heads": frozenset(
        [
            "tenant",
            "client_id",
            "session_id",
            "branch",
            "count",
            "chain",
            "history_tokens",
            "updated_at",
        ]
    ),
    "ctxwarden_summary_jobs": frozenset(
        [
            "tenant",
            "session_id",
            "job_id",
            "attempt",
            "started_at",
            "ended_at",
            "outcome",
            "error",
        ]
    ),
}

_CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS ctxwarden_migrations "
    "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)


def migrate(
    begin: Callable[[], AbstractContextManager[Tx]],
    *,
    upto: str | None = None,
    backend: str = "sqlite",
) -> list[str]:
    """Apply the pending steps (up to and including ``upto``) in one transaction.

    ``begin`` opens a write transaction that holds the backend's migration lock. Returns
    the names applied (``backend``: ``"postgres"`` runs a step's PostgreSQL statements
    where it has its own). A database that records a step this version does not know was
    migrated by a newer ctxwarden and is refused rather than guessed at.
    """
    known = [m.name for m in MIGRATIONS]
    if upto is not None and upto not in known:
        raise ValueError(f"unknown migration {upto!r}; known: {', '.join(known)}")
    applied: list[str] = []
    with begin() as tx:
        tx.execute(_CREATE_TABLE)
        done = {row[0] for row in tx.execute("SELECT name FROM ctxwarden_migrations")}
        unknown = sorted(done - set(known))
        if unknown:
            raise StoreError(
                f"this database was migrated by a newer ctxwarden (unknown steps: "
                f"{', '.join(unknown)}); upgrade ctxwarden to open it"
            )
        for step in MIGRATIONS:
            if step.name not in done:
                own = step.postgres if backend == "postgres" else None
                for statement in own if own is not None else step.statements:
                    if callable(statement):
                        statement(tx)
                    else:
                        tx.execute(statement)
                tx.execute(
                    "INSERT INTO ctxwarden_migrations (name, applied_at) VALUES (?, ?)",
                    (step.name, time.time()),
                )
                applied.append(step.name)
            if step.name == upto:
                break
    return applied


def check_schema(columns: Callable[[str], set[str]]) -> None:
    """Fail with a clear error when a table or column the store needs is missing
    (a table dropped by hand, or a half-copied database)."""
    for table, needed in REQUIRED_COLUMNS.items():
        have = columns(table)
        if not have:
            raise StoreError(
                f"table {table} is missing although the migrations table says it was created; "
                "the database was changed by hand — restore it from a backup or use a new one"
            )
        missing = sorted(needed - have)
        if missing:
            raise StoreError(f"table {table} lacks columns {', '.join(missing)}")
