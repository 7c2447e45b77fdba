"""The one session-id grammar (:mod:`ctxwarden.store.ids`) and what the store refuses."""

from __future__ import annotations

import pytest
from service_harness import db_url

from ctxwarden import Session
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.store import open_store
from ctxwarden.store.ids import new_id_problem, readable_id_problem, storable_id_problem

__all__ = ["db_url"]


@pytest.mark.parametrize(
    ("session_id", "new", "readable"),
    [
        ("chat-1", True, True),
        ("team_1:agent@run-2.5", True, True),
        ("x" * 200, True, True),
        ("chat-1~b7", False, True),  # the proxy's branch: read, never given
        ("chat-1~b7~b2", False, True),
        ("x" * 201, False, False),
        ("a/b/c", False, False),
        (".", False, False),
        ("..", False, False),
        (".hidden", False, False),
        ("with space", False, False),
        ("é", False, False),
        ("", False, False),
    ],
)
def test_the_grammar(session_id: str, new: bool, readable: bool) -> None:
    assert (new_id_problem(session_id) is None) == new
    assert (readable_id_problem(session_id) is None) == readable


@pytest.mark.parametrize("bad", ["a\x00b", "cut \ud800", "x" * 1001, ""])
def test_the_store_refuses_only_what_it_cannot_hold(db_url: str, bad: str) -> None:
    assert storable_id_problem(bad) is not None
    with open_store(db_url) as store:
        assert store.get_session("t", bad) is None  # a read never fails on it
        with pytest.raises((InvalidMessageError, ValueError)):
            store.create_session("t", bad)
        for fine in ("a/b/c", "with space", "é"):  # a library caller's own ids keep working
            with Session(store, fine, tenant="t") as s:
                s.append([{"role": "user", "content": "x"}])
            assert store.get_session("t", fine) is not None
