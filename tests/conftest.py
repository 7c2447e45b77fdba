"""Shared fixtures: a guard that fails any test reaching past this machine, and data paths."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("CTXWARDEN_DATA", REPO.parent / "shared" / "data"))
TAU_BENCH = SHARED_DATA / "tau-bench" / "airline-gpt-4o-dev.json"
LOCOMO = SHARED_DATA / "locomo" / "locomo-dev.json"

_real_connect = socket.socket.connect


def _is_local(address: Any) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX path
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if not _is_local(address):
        raise AssertionError(f"test tried to reach the network: {address!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any test that connects anywhere but loopback (tests never call real providers)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    yield


@pytest.fixture(scope="session")
def tau_bench_path() -> Path:
    if not TAU_BENCH.exists():
        pytest.skip(f"tau-bench data not found at {TAU_BENCH} (set CTXWARDEN_DATA)")
    return TAU_BENCH


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not found at {LOCOMO} (set CTXWARDEN_DATA)")
    return LOCOMO


@pytest.fixture
def pg_schema_url() -> Iterator[str | None]:
    """A PostgreSQL URL on a fresh schema (dropped after), or None when no DSN is set.

    Tests never share the database's public schema: another branch's migrations there would
    make the store refuse to open it.
    """
    import uuid

    from service_harness import PG_DSN, drop_schema, pg_url

    if not PG_DSN:
        yield None
        return
    schema = f"ctxw_t_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)
