"""The shared backend: PostgreSQL through psycopg 3 and a psycopg_pool connection pool.

For many processes and machines (R13, R16). Connections run in autocommit and every
operation opens an explicit, short transaction, so a connection is back in the pool —
never ``idle in transaction`` — between operations, and in particular during a model
call. Appenders serialise on the session row (``UPDATE ... RETURNING next_seq``), so
sequence numbers are dense and never collide across processes.

``?schema=NAME`` in the URL puts the tables in that schema (created when missing), so
one database can host several stores (tests use a fresh schema each). psycopg and
psycopg_pool are imported lazily: without them the error says which extra to install.

An unreachable server fails at once with a :class:`StoreError` naming the URL (password
masked): one direct connection is made first with libpq's ``connect_timeout``
(``connect_timeout=`` seconds, default 3, unless the URL sets one), instead of the pool
retrying in the background until its 30 s timeout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ctxwarden.core.errors import MissingDependencyError, StoreError, StoreUnavailable
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.migrations import Tx, check_schema, migrate

__all__ = ["PostgresStore", "split_schema"]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def split_schema(url: str) -> tuple[str, str | None]:
    """Take ``schema=`` out of a PostgreSQL URL (psycopg would reject it)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    rest = [(k, v) for k, v in query if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


class _PgTx:
    def __init__(self, cursor: Any) -> None:
        self._cur = cursor

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cur.execute(sql.replace("?", "%s"), tuple(params))
        return list(self._cur.fetchall()) if self._cur.description else []

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if len(rows) == 1:  # psycopg's executemany enters pipeline mode: one more sync
            self._cur.execute(sql.replace("?", "%s"), tuple(rows[0]))
            return
        self._cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])


class PostgresStore(SqlStore):
    """A :class:`~ctxwarden.store.SessionStore` in PostgreSQL (``postgresql://...``)."""

    _select_for_update = True
    # The per-build write need not wait for the WAL flush (its fsync varies from 0.5 to
    # 6 ms on a busy disk); messages and summaries keep synchronous commits.
    _advisory_write = "SET LOCAL synchronous_commit TO OFF"

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 30.0,
        connect_timeout: float = 3.0,
        application_name: str = "ctxwarden",
        migrate_upto: str | None = None,
    ) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise MissingDependencyError("the PostgreSQL session store", "postgres") from exc
        self._psycopg_error: type[Exception] = psycopg.Error
        self._unavailable: type[Exception] = psycopg.OperationalError  # PoolTimeout is one
        self.url = url
        dsn, schema = split_schema(url)
        self.schema = schema or "public"
        if not _IDENT.match(self.schema):
            raise StoreError(f"schema name {self.schema!r} is not a plain SQL identifier")
        kwargs: dict[str, Any] = {"autocommit": True}
        if "application_name" not in dsn:
            kwargs["application_name"] = application_name
        if "connect_timeout" not in dsn:  # libpq's own minimum is 2 seconds
            kwargs["connect_timeout"] = max(2, math.ceil(connect_timeout))
        try:  # one direct connection first: an unreachable server fails now, with its reason
            psycopg.connect(dsn, **kwargs).close()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {_redact(dsn)}: {exc}") from None
        self._pool = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            configure=self._configure,
            timeout=timeout,
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
            self._setup(migrate_upto)
        except self._psycopg_error as exc:
            self._pool.close()
            raise StoreError(f"cannot use PostgreSQL at {_redact(dsn)}: {exc}") from exc
        except BaseException:
            self._pool.close()
            raise

    def _configure(self, conn: Any) -> None:
        conn.execute(f'SET search_path TO "{self.schema}"')

    # -- transactions -----------------------------------------------------------------------

    @contextmanager
    def _said(self) -> Iterator[None]:
        """psycopg's errors as ours: the server gone (or no connection came) is
        :class:`StoreUnavailable`, any other a :class:`StoreError`."""
        try:
            yield
        except self._unavailable as exc:
            raise StoreUnavailable(f"PostgreSQL is unavailable: {exc}") from exc
        except self._psycopg_error as exc:
            raise StoreError(f"PostgreSQL error: {exc}") from exc

    @contextmanager
    def _transaction(self, read_only: bool, lock: bool = False) -> Iterator[Tx]:
        with self._said(), self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor()
            if read_only:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if lock:  # serialise concurrent openers of a new database
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
                cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            yield _PgTx(cur)

    def _read(self) -> AbstractContextManager[Tx]:
        return self._transaction(True)

    @contextmanager
    def _read_one(self) -> Iterator[Tx]:
        """One statement in autocommit: it sees one snapshot by itself, so the ``BEGIN``,
        ``SET TRANSACTION`` and ``COMMIT`` around it (three round trips to the server
        of its four) are left out."""
        with self._said(), self._pool.connection() as conn:
            yield _PgTx(conn.cursor())

    def _write(self) -> AbstractContextManager[Tx]:
        return self._transaction(False)

    def connections_in_use(self) -> int:
        """Connections checked out of the pool right now (0 between operations)."""
        stats = self._pool.get_stats()
        return int(stats.get("pool_size", 0)) - int(stats.get("pool_available", 0))

    def release(self) -> None:
        """Nothing to do: every operation already returned its connection to the pool."""

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening ----------------------------------------------------------------------------

    def _setup(self, migrate_upto: str | None) -> None:
        with self._read() as tx:
            names = {
                row[0]
                for row in tx.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
                    (self.schema,),
                )
            }
        ours = {"ctxwarden_sessions", "ctxwarden_messages"} & names
        if ours and "ctxwarden_migrations" not in names:
            raise StoreError(
                f"schema {self.schema} has tables {', '.join(sorted(ours))} that ctxwarden did "
                "not create (no ctxwarden_migrations); left untouched — use another schema"
            )
        migrate(lambda: self._transaction(False, lock=True), upto=migrate_upto, backend="postgres")
        if migrate_upto is None:
            check_schema(self._columns)

    def _columns(self, table: str) -> set[str]:
        with self._read() as tx:
            rows = tx.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = ? AND table_name = ?",
                (self.schema, table),
            )
        return {r[0] for r in rows}


def _redact(dsn: str) -> str:
    """The URL without its password (in the user part or a ``password=`` parameter)."""
    parts = urlsplit(dsn)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "password" for k, _ in query):
        shown = [(k, "***" if k == "password" else v) for k, v in query]
        parts = parts._replace(query=urlencode(shown, safe="*"))
    return urlunsplit(parts)
