"""An append that expects the session's length checks its pairs against where the
session ends without reading it: the store's append checks that length, and that the
session is the one the build read (not deleted and created again), in its transaction."""

from __future__ import annotations

import pytest
from service_harness import db_url

from ctxwarden import Session
from ctxwarden.core.errors import InvalidMessageError, VersionConflict
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.store.service_tables import delete_session

__all__ = ["db_url"]  # the store fixture: SQLite, and PostgreSQL when configured

_CALL = Message.assistant(None, (ToolCall("c1", "lookup", "{}"),))


def _built(url: str) -> Session:
    s = Session(url, "chat", tenant="acme")
    s.append([Message.system("You help."), Message.user("find it"), _CALL])
    s.build()  # (the session's cache now holds its messages and the session they are of)
    return s


def test_results_are_checked_against_the_stored_call_when_the_length_is_expected(
    db_url: str,
) -> None:
    with _built(db_url) as s:
        with pytest.raises(InvalidMessageError, match="c9"):
            s.append([Message.tool("x", "c9")], expect_next=3)  # no call c9 before it
        assert s.append([Message.tool("found", "c1")], expect_next=3) == [3]
        with pytest.raises(InvalidMessageError):  # the call's results came: c1 is done
            s.append([Message.tool("again", "c1")], expect_next=4)
        with pytest.raises(VersionConflict):  # a length it no longer has
            s.append([Message.user("next")], expect_next=3)
        assert [m.text for m in s.messages()][-1] == "found"


def test_a_session_deleted_and_made_again_meanwhile_refuses_the_append(db_url: str) -> None:
    with _built(db_url) as s, Session(db_url, "chat", tenant="acme") as other:
        assert delete_session(other.store, "acme", "chat")  # another process, say
        other.store.create_session("acme", "chat")
        other.append([Message.system("Other."), Message.user("mine"), _CALL])
        with pytest.raises(VersionConflict):  # as long as before, but not the same one
            s.append([Message.tool("found", "c1")], expect_next=3)
        assert [m.text for m in other.messages()] == ["Other.", "mine", ""]
