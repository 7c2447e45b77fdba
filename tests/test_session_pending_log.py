"""A build whose log is written later (``Session.build_unlogged``): the proxy sends the
context upstream first and logs while upstream reads it. Until the log is written the
store holds the session as before the build; a log never written changes nothing the
next build sees; and a proxied call whose request never left still ends with its row."""

from __future__ import annotations

import httpx
from service_harness import ProxyServer, add_tenant, db_url, free_port, sid

from ctxwarden import Session
from ctxwarden.store.service_tables import list_builds

__all__ = ["db_url"]  # the store fixture: SQLite, and PostgreSQL when configured


def _history(s: Session, turns: int) -> None:
    s.append([{"role": "system", "content": "You help with orders."}])
    for i in range(turns):
        s.append([
            {"role": "user", "content": f"where is order {1000 + i}?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"c{i}", "type": "function",
                "function": {"name": "lookup", "arguments": f'{{"order": {1000 + i}}}'}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"order {1000 + i}: " + "x" * 900},
            {"role": "assistant", "content": f"Order {1000 + i} ships Monday."},
        ])  # fmt: skip
    s.append([{"role": "user", "content": "and the last one?"}])


def test_the_log_is_written_when_asked_once_and_not_before(db_url: str) -> None:
    with Session(db_url, "chat", tenant="acme") as s:
        _history(s, 8)
        before = s.record.sticky
        pending = s.build_unlogged(build_id="b1", status="forwarded")
        assert not pending.logged
        assert list_builds(s.store, "acme", "chat") == []
        assert s.record.sticky == before  # the sticky decisions wait for the log too
        assert pending.log() == "b1" and pending.logged
        assert pending.log() == "b1"  # once: a second call writes nothing
        [row] = list_builds(s.store, "acme", "chat")
        assert (row.build_id, row.status) == ("b1", "forwarded")
        assert row.input_tokens == pending.built.input_tokens
        assert s.record.sticky != before and "window_start_seq" in s.record.sticky


def test_a_log_never_written_changes_nothing_the_next_build_sees(db_url: str) -> None:
    with Session(db_url, "chat", tenant="acme") as s:
        _history(s, 12)
        s.build(build_id="b1")
        s.build_unlogged(build_id="lost")  # as a crash after the context went upstream
        s.append([{"role": "assistant", "content": "It ships Tuesday."},
                  {"role": "user", "content": "thanks; and order 1003?"}])  # fmt: skip
        after = s.build(build_id="b2")
        assert [r.build_id for r in list_builds(s.store, "acme", "chat")] == ["b1", "b2"]
    with Session(db_url, "chat", tenant="acme") as fresh:  # what the store alone gives
        again = fresh.build_unlogged()
        assert again.built.messages == after.messages
        assert again.built.input_tokens == after.input_tokens


def test_a_call_whose_request_never_left_still_ends_with_its_row(db_url: str) -> None:
    """No upstream listens: the log is written when the call ends (502), not skipped."""
    key = add_tenant(db_url, "acme")
    proxy = ProxyServer(db_url, upstream=f"http://127.0.0.1:{free_port()}/v1")
    try:
        session = sid()
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            answer = client.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {key}", "x-ctxwarden-session": session},
            )
        assert answer.status_code == 502, answer.text
        status, builds = proxy.get(f"/v1/sessions/{session}/builds", key)
        assert status == 200, builds
        assert [b["status"] for b in builds["builds"]] == ["upstream_502"]
    finally:
        proxy.stop()
