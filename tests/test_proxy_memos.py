"""The proxy's per-process memos change no output: a call served by a process that has
served the session before equals one served by a fresh process (cold memos)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxwarden import Session, Usage
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.formats import message_from_openai, openai_json
from ctxwarden.service.config import ServiceConfig
from ctxwarden.service.history import wire_key
from ctxwarden.service.hub import Hub
from ctxwarden.service.key_memo import KeyMemo
from ctxwarden.service.keys import hash_key, new_key, shown_prefix
from ctxwarden.service.metrics import Metrics
from ctxwarden.service.openai_proxy import OpenAIWire, _reply
from ctxwarden.service.proxied_call import Call, finish, prepare
from ctxwarden.session.build_log import context_json, context_rows, context_utf8
from ctxwarden.store.base import json_text
from ctxwarden.store.service_tables import (
    add_tenant,
    list_builds,
    logged_context,
    tenant_by_key_hash,
)
from ctxwarden_bench.proxy import conversation, history_at
from ctxwarden_bench.proxy_upstream import REPLY_TEXT


def test_key_memo_gives_every_message_its_own_key() -> None:
    memo = KeyMemo()
    base = conversation(40)
    grown = [*base, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    edited = [dict(m) for m in grown]
    edited[7] = {**edited[7], "content": "changed"}
    typed = [dict(m) for m in grown]  # 1 == 1.0 == True to Python, not to the key
    typed[2] = {**typed[2], "tool_calls": [{**typed[2]["tool_calls"][0], "id": True}]}
    surrogate = [*grown, {"role": "user", "content": "lone \ud800"}]
    for messages in (base, grown, grown, edited, grown, typed, surrogate, base[:10], base):
        assert memo.keys(("t", "s"), messages) == [wire_key(m) for m in messages]
    assert memo.keys(("t", "other"), base) == [wire_key(m) for m in base]


def test_key_memo_is_bounded() -> None:
    memo = KeyMemo(sessions=3, max_bytes=10_000)
    for i in range(10):
        memo.keys(("t", str(i)), conversation(6))
    assert len(memo._entries) <= 3 and memo._bytes <= 10_000


def test_context_json_is_the_context_rows_as_stored(tmp_path: Path) -> None:
    history = history_at(conversation(60), 2)
    history[3] = {**history[3], "content": "naïve ✓ 🙂", "name": "ann"}
    history.append({"role": "user", "content": "last", "ctxwarden": {"meta": {"n": 1, "ok": True}}})
    with Session(f"sqlite:///{tmp_path / 'c.db'}", "c") as s:
        s.keep_contexts = 1  # each logged whole (from a base: tests/test_context_bases.py)
        s.append(history)
        for _ in range(2):  # the second time from the memo
            built = s.build(max_input_tokens=3_000, build_id=f"b{_}")
            assert context_json(built) == json_text(context_rows(built))
            assert context_utf8(built) == json_text(context_rows(built)).encode()
            assert not context_json(built).isascii()  # the UTF-8 of its text, not escapes
            # logged as text (bound as UTF-8 bytes and cast), the same text
            conn = s.store._connection()  # type: ignore[attr-defined]
            row = conn.execute(
                "SELECT typeof(context), context FROM ctxwarden_build_contexts WHERE build_id = ?",
                (f"b{_}",),
            ).fetchone()
            # a stored message as stored is logged as its number (a run of them as the
            # first number and a count), and read back whole
            assert row[0] == "text"
            raw = json.loads(row[1])
            assert any(r.get("count", 1) > 1 for r in raw)
            logged = [
                {**r, "seq": r["seq"] + k} if "seq" in r else r
                for r in raw
                for k in range(r.pop("count", 1))
            ]
            refs = [r for r in logged if "seq" in r]
            assert len(refs) > len(logged) // 2 and all("message" not in r for r in refs)
            stored = list(s.messages())
            by_id = {m.id: seq for seq, m in enumerate(stored)}
            for r, m in zip(logged, built.messages, strict=True):
                assert ("seq" in r) == (m.id in by_id and m in stored)
                assert r.get("seq", by_id.get(m.id)) == by_id.get(m.id)
                assert r["layer"] == built.layers.get(m.id, "window")
            assert len(row[1]) < len(json_text(context_rows(built))) / 1.5
            assert logged_context(s.store, "default", "c", f"b{_}") == context_rows(built)
    odd = message_from_openai({"role": "user", "content": "lone \ud800 surrogate"})
    from dataclasses import replace

    built = replace(built, messages=[*built.messages, odd])
    for _ in range(2):  # the second time with each message's bytes memoised
        assert context_json(built) == json_text(context_rows(built))
        assert context_json(built).isascii()  # written as the store can hold it
        assert context_utf8(built) == json_text(context_rows(built)).encode()
    assert context_json(replace(built, messages=[])) == "[]"
    assert len({built.layers.get(m.id, "window") for m in built.messages}) > 1  # rows per layer


def test_the_cached_last_block_checks_pairs_as_the_store_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    fn = {"name": "f", "arguments": "{}"}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": fn}]}  # fmt: skip
    errors = []
    with Session(url, "p") as warm:
        warm.append([{"role": "user", "content": "hi"}])
        warm.build()
        warm.append([call])
        for s in (warm, Session(url, "p")):  # from the cache, then read from the store
            with pytest.raises(InvalidMessageError) as raised:
                s.append([{"role": "user", "content": "moving on"}])
            errors.append(str(raised.value))
    assert errors[0] == errors[1] and "c1" in errors[0]


class _Proxy:
    """The proxy's per-call work without HTTP: a hub on a store, calls through
    ``prepare`` and ``finish`` as the route makes them."""

    def __init__(self, db: str, key: str | None = None) -> None:
        self.hub = Hub(ServiceConfig(db=db, upstream="http://127.0.0.1:9/v1"), Metrics())
        if key is None:
            key = new_key()
            add_tenant(self.hub.store, "t", key_hash=hash_key(key), key_prefix=shown_prefix(key))
        self.key = key
        record = tenant_by_key_hash(self.hub.store, hash_key(key))
        assert record is not None
        self.tenant = self.hub.tenant(record)

    def call(self, messages: list[dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
        data = json.loads(json.dumps({"model": "gpt-4o", "messages": messages}))
        wire = data["messages"]

        def parse(start: int) -> list[Any]:
            return [message_from_openai(m, index=i) for i, m in enumerate(wire[start:], start)]

        call = Call(
            api="openai",
            tenant=self.tenant,
            client_id="chat",
            model="gpt-4o",
            keys=self.hub.keys.keys(("t", "chat"), wire),
            parse=parse,
            max_input_tokens=6_000,
        )
        prepared = prepare(self.hub, call)
        body = OpenAIWire(data, False).body(prepared)
        reply = _reply({"role": "assistant", "content": REPLY_TEXT})
        finish(self.hub, prepared, reply, Usage.from_openai(900, 7, 0), "complete")
        return body, {**prepared.headers(), "x-ctxwarden-build-id": ""}

    def log(self) -> tuple[Any, Any]:
        store = self.hub.store
        last = list_builds(store, "t", "chat", limit=1_000)[-1]
        stored = [m.message for m in store.iter_messages("t", "chat")]
        return (last.audit, logged_context(store, "t", "chat", last.build_id)), stored


def test_a_call_served_warm_equals_one_served_cold(tmp_path: Path) -> None:
    base = conversation(120)
    warm = _Proxy(f"sqlite:///{tmp_path / 'warm.db'}")
    first = _Proxy(f"sqlite:///{tmp_path / 'cold.db'}")
    turns = 6
    for step in range(turns):
        warm.call(history_at(base, step))
        first.call(history_at(base, step))
    first.hub.close()
    openai_json._MEMO.clear()  # a new process: no memo of any kind
    openai_json._META_MEMO.clear()
    cold = _Proxy(f"sqlite:///{tmp_path / 'cold.db'}", first.key)
    for step in range(turns, turns + 3):  # the cold proxy's first call, then warm again
        got_warm, got_cold = warm.call(history_at(base, step)), cold.call(history_at(base, step))
        assert got_warm == got_cold
        assert warm.log() == cold.log()


@pytest.mark.parametrize("budget", [400, 100_000])  # the tail cut by the budget, or whole
def test_the_remembered_tail_is_the_stored_one(tmp_path: Path, budget: int) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    history = history_at(conversation(30), 0)
    with Session(url, "t") as warm, Session(url, "t") as other:
        warm.append(history)
        for turn in range(12):
            if turn % 5 == 4:  # another writer: the memo cannot know what it wrote
                other.append([{"role": "user", "content": f"from elsewhere {turn}"}])
            warm.append([{"role": "user", "content": f"question {turn} " * (turn % 3 * 40)}])
            with Session(url, "t") as cold:
                assert warm.context_messages(budget) == cold.context_messages(budget)
            warm.append([{"role": "assistant", "content": f"answer {turn}"}])


@pytest.mark.parametrize("count", [0, 1, 5])
def test_the_history_chain_hashes_as_one_key_at_a_time(count: int) -> None:
    """``history._chain`` (two joined runs) gives the running hash and the digest after
    ``upto`` keys of hashing the keys one at a time; ``None`` past the keys."""
    import hashlib

    from ctxwarden.service.history import _chain

    keys = [hashlib.sha256(str(i).encode()).digest()[:16] for i in range(count)]
    for upto in range(count + 2):
        h = hashlib.sha256()
        at = h.hexdigest() if upto == 0 else None
        for i, key in enumerate(keys, 1):
            h.update(key)
            at = h.hexdigest() if i == upto else at
        running, got = _chain(keys, upto)
        assert (running.hexdigest(), got) == (h.hexdigest(), at)
