"""The per-process copy of a session's entity-ledger checkpoint when several replicas
build the session (issue 14): a copy left far behind by the others' builds gives way
to the stored checkpoint, a current one is used without reading the store."""

from __future__ import annotations

from pathlib import Path

from ctxwarden.core.messages import Message
from ctxwarden.memory.entities import extract_entities
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.store import open_store
from ctxwarden.store.ledger_checkpoint import (
    LedgerCheckpoint,
    load_checkpoint,
    remember_checkpoint,
)


def _ledger(text: str) -> EntityLedger:
    return EntityLedger().add(extract_entities(Message.user(text)))


def test_a_copy_far_behind_gives_way_to_the_stored_checkpoint(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        record = store.create_session("t", "s")
        stale = LedgerCheckpoint(upto=5, ledger=_ledger("order ORD-1 for 10 EUR"), saved=5)
        remember_checkpoint(store, "t", "s", record.created_at, stale)
        stored = LedgerCheckpoint(upto=300, ledger=_ledger("order ORD-2 for 20 EUR"))
        store.save_sticky("t", "s", {}, ledger=stored.encode())
        near, _ = load_checkpoint(store, "t", "s", record.created_at, needed_upto=40)
        assert near is stale  # a few turns behind: advanced from memory, no read
        far, damage = load_checkpoint(store, "t", "s", record.created_at, needed_upto=310)
        assert damage is None and far.upto == 300
        assert far.ledger.to_dict() == stored.ledger.to_dict()
        # a copy ahead of what is stored (this replica built last) stays in use
        ahead = LedgerCheckpoint(upto=320, ledger=_ledger("order ORD-3"), saved=300)
        remember_checkpoint(store, "t", "s", record.created_at, ahead)
        assert load_checkpoint(store, "t", "s", record.created_at, needed_upto=500)[0] is ahead
