"""The body memo reads every body exactly as ``json.loads`` does, reuses what an earlier
body of the scope shares with it, and changes no output of the proxy."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_servers import Recorded, Reply, ScriptedServer, anthropic_message
from starlette.testclient import TestClient

from ctxwarden.formats import message_from_openai, messages_from_anthropic, messages_to_anthropic
from ctxwarden.formats.anthropic import system_from_anthropic, turns_from_anthropic
from ctxwarden.service import ServiceConfig, create_app
from ctxwarden.service.body_memo import BodyMemo, Reading
from ctxwarden.service.keys import hash_key, new_key, shown_prefix
from ctxwarden.store import open_store
from ctxwarden.store.service_tables import add_tenant
from ctxwarden_bench.proxy import conversation, history_at


def _same(got: Any, want: Any) -> bool:
    """Equal values, dict key order and NaN included."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and list(got) == list(want)
            and all(_same(got[k], want[k]) for k in want)
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(_same(a, b) for a, b in zip(got, want, strict=True))
        )
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return type(got) is type(want) and got == want


def _read(memo: BodyMemo, raw: bytes, scope: str = "s") -> Reading | None:
    """Read, check against json.loads, and keep (as the route does)."""
    got = memo.read(scope, raw)
    try:
        want = json.loads(raw)
    except ValueError:
        assert got is None
        return None
    if got is not None:
        assert _same(got.data, want)
        memo.keep(got, tuple(b"%d" % i for i in range(len(got.data["messages"]))))
    return got


def _body(messages: list[Any], *, head: str = '"model": "m", ', tail: str = "") -> bytes:
    inner = ", ".join(json.dumps(m) for m in messages)
    return ("{" + head + f'"messages": [{inner}]' + tail + "}").encode()


def test_a_grown_history_reuses_the_messages_read_before() -> None:
    memo = BodyMemo()
    base = conversation(60)
    first = _read(memo, json.dumps({"model": "m", "messages": base, "stream": True}).encode())
    assert first is not None and first.reused == 0 and first.made is None
    grown = history_at(base, 2)
    second = _read(memo, json.dumps({"model": "m", "messages": grown, "stream": False}).encode())
    assert second is not None and second.reused == 60
    assert second.made == tuple(b"%d" % i for i in range(60))  # what keep() was given
    assert all(
        a is b for a, b in zip(second.data["messages"], first.data["messages"], strict=False)
    )
    assert second.data["stream"] is False  # pairs after the messages are read afresh


def test_a_history_written_in_other_scripts_reuses_each_call_what_it_read() -> None:
    """Characters of two to four bytes, written raw (not escaped), before and after each
    front's end: every call reuses all the messages of the last one, and only those."""
    memo = BodyMemo()
    texts = ["é ü", "Привіт, світ", "日本語のテキスト", "emoji 😀👍", "ascii", "ż" * 40]
    history: list[Any] = []
    for call, text in enumerate(texts * 2):
        history = [*history, {"role": "user", "content": f"{text} {call}"}]
        raw = json.dumps({"model": "m", "messages": history, "t": "ü"}, ensure_ascii=False)
        got = _read(memo, raw.encode())
        assert got is not None and got.reused == call


def test_the_same_history_sent_again_reuses_all_of_it() -> None:
    memo = BodyMemo()
    raw = _body(conversation(9))
    _read(memo, raw)
    again = _read(memo, raw)
    assert again is not None and again.reused == 9


@pytest.mark.parametrize(
    "changed",
    [
        lambda ms: [{**ms[0], "content": "edited"}, *ms[1:]],  # an edit at the start
        lambda ms: ms[2:],  # the client trimmed its oldest messages
        lambda ms: [*ms[:-1], {**ms[-1], "content": "other"}],  # the last one changed
    ],
)
def test_a_changed_history_is_read_whole(changed: Any) -> None:
    memo = BodyMemo()
    ms = conversation(12)
    _read(memo, _body(ms))
    got = _read(memo, _body(changed(ms)))
    assert got is not None and got.reused == 0


def test_a_number_ending_the_front_is_not_taken_for_a_whole_value() -> None:
    memo = BodyMemo()
    assert memo.read("s", b'{"messages": [{"a": 1}, 12]}') is None  # not objects: not walked
    _read(memo, b'{"messages": [{"a": 1}], "n": 1}')
    got = _read(memo, b'{"messages": [{"a": 1}], "n": 12}')
    assert got is not None and got.data["n"] == 12


@pytest.mark.parametrize(
    "raw",
    [
        b"[1, 2]",
        b'{"model": "m"}',
        b'{"messages": []}',
        b'{"messages": {"role": "user"}}',
        b'{"messages": [{"role": "user"}], "messages": [{"role": "system"}]}',
        b'{"messages": [{"role": "user"}]} x',
        b'{"messages": [{"role": "user"}],}',
        b'\xef\xbb\xbf{"messages": [{"role": "user"}]}',  # a BOM: json.loads takes it as bytes
        b'{"messages": [{"role": "\xff"}]}',  # not UTF-8
        b'{"messages": [{"role": "user"}',
        b"",
    ],
)
def test_bodies_it_does_not_walk_are_left_to_the_ordinary_parse(raw: bytes) -> None:
    assert BodyMemo().read("s", raw) is None


def test_duplicate_keys_and_escapes_read_as_json_loads_reads_them() -> None:
    memo = BodyMemo()
    raw = (
        b'{"model": "a", "model": "b", "messages": [{"role": "user", "content": "\\u00e9\\ud83d'
        b'\\ude00 \\"q\\"", "role": "tool"}], "t": NaN, "model": "c", "big": 1' + b"0" * 30 + b"}"
    )
    got = _read(memo, raw)
    assert got is not None and got.data["model"] == "c" and next(iter(got.data)) == "model"
    grown = raw.replace(b'"tool"}]', b'"tool"} ,\n {"role": "user", "content": "x"}\n]')
    again = _read(memo, grown)
    assert again is not None and again.reused == 1


def test_a_scope_that_keeps_missing_is_walked_ever_more_rarely() -> None:
    memo = BodyMemo()
    walked = []
    for call in range(1, 18):  # each call trims its oldest message: never a prefix
        got = memo.read("s", _body(conversation(40)[call:]))
        if got is not None:
            walked.append(call)
            memo.keep(got, [b""] * len(got.data["messages"]))
    assert walked == [1, 2, 4, 8, 16]
    grown = _body([*conversation(40)[16:], {"role": "user", "content": "more"}])
    hit = memo.read("s", grown)
    assert hit is not None and hit.reused == 24  # a hit again, and walking resumes
    memo.keep(hit, [b""] * 25)
    assert memo.read("s", _body(conversation(40)[30:])) is not None  # its 1st miss


def test_each_client_of_a_shared_scope_keeps_its_own_front() -> None:
    memo = BodyMemo()  # three clients without a session header: one scope
    chats = [conversation(10, seed=s) for s in range(3)]
    reused = []
    for turn in range(3):
        for k, chat in enumerate(chats):
            chats[k] = [*chat, {"role": "user", "content": f"turn {turn}"}]
            got = _read(memo, _body(chats[k]), scope="tenant")
            reused.append(got.reused if got is not None else None)
    # the third client's first body is a third miss in a row: not walked (see BodyMemo);
    # its second is, and from then on every client reuses its own front
    assert reused == [0, 0, None, 11, 11, 0, 12, 12, 12]


def test_the_memo_is_bounded_in_bytes_and_scopes() -> None:
    raw = _body(conversation(30))
    memo = BodyMemo(scopes=3, max_bytes=len(raw) * 10)
    for scope in range(8):
        _read(memo, raw, scope=str(scope))
    assert memo.size_bytes <= len(raw) * 10
    assert memo.read("0", raw) is not None and memo.read("0", raw).reused == 0  # type: ignore[union-attr]
    assert memo.read("7", raw).reused == 30  # type: ignore[union-attr]


_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_MESSAGE = st.dictionaries(_TEXT, _VALUE, max_size=4)
_WS = st.sampled_from(["", " ", "\n", "\t ", "\r\n  "])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(_MESSAGE, min_size=1, max_size=5),
            st.dictionaries(_TEXT, _VALUE, max_size=2),
            st.dictionaries(_TEXT, _VALUE, max_size=2),
            st.integers(0, 3),
            _WS,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_every_body_reads_as_json_loads_reads_it(calls: list[Any]) -> None:
    memo = BodyMemo()
    history: list[Any] = []
    for n, (new, head, tail, keep_from_start, ws) in enumerate(calls):
        history = [*history[keep_from_start:], *new] if keep_from_start % 3 else [*history, *new]
        head_text = "".join(f"{json.dumps(k)}:{ws}{json.dumps(v)},{ws}" for k, v in head.items())
        tail_text = "".join(f",{ws}{json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items())
        inner = f",{ws}".join(json.dumps(m) for m in history)
        raw = f'{ws}{{{head_text}"messages":{ws}[{ws}{inner}{ws}]{tail_text}}}{ws}'.encode()
        got = _read(memo, raw)  # None, or exactly what json.loads reads
        if n == 0 and "messages" not in head and "messages" not in tail:
            assert got is not None and got.reused == 0


def _app(tmp_path: Path, name: str, **upstreams: str) -> tuple[TestClient, str]:
    """The app on a fresh SQLite store with tenant ``t``, and its key."""
    db = f"sqlite:///{tmp_path / name}"
    key = new_key()
    with open_store(db) as store:
        add_tenant(store, "t", key_hash=hash_key(key), key_prefix=shown_prefix(key))
    return TestClient(create_app(ServiceConfig(db=db, **upstreams))), key


def _without_memo(client: TestClient) -> None:
    client.app.state.hub.bodies.read = lambda scope, raw, field="messages": None  # type: ignore[attr-defined]


def _reuses(client: TestClient) -> list[int | None]:
    """What each read of the client's memo reused (``None``: not walked), as calls go."""
    memo = client.app.state.hub.bodies  # type: ignore[attr-defined]
    reused: list[int | None] = []
    real = memo.read

    def read(scope: Any, raw: bytes, field: str = "messages") -> Reading | None:
        got = real(scope, raw, field=field)
        reused.append(got.reused if got is not None else None)
        return got

    memo.read = read
    return reused


def _post_both(
    clients: list[tuple[TestClient, str]],
    path: str,
    raw: bytes,
    auth: Callable[[str], dict[str, str]],
) -> list[Any]:
    """``raw`` posted to ``path`` of each (client, key), each answering 200."""
    replies = []
    for client, key in clients:
        headers = {**auth(key), "content-type": "application/json"}
        replies.append(client.post(path, content=raw, headers=headers))
        assert replies[-1].status_code == 200, replies[-1].text
    return replies


def _sent_alike(
    upstream: ScriptedServer, replies: list[Any], memo_hub: Any, scope: Any, raw: bytes
) -> None:
    """The memo's call and the bare one (the upstream's last two requests) sent the same
    body and reported the same tokens, and nothing the proxy did changed the values the
    memo keeps for the next call (the scope's newest front)."""
    assert upstream.requests[-2].body == upstream.requests[-1].body
    for name in ("x-ctxwarden-input-tokens", "x-ctxwarden-saved-tokens"):
        assert replies[0].headers[name] == replies[1].headers[name]
    front = memo_hub.bodies._scopes[scope].fronts[-1]
    assert _same(list(front.messages), json.loads(raw)["messages"])


def _stored_alike(memo_hub: Any, bare_hub: Any, session: str) -> None:
    stored = [hub.store.iter_messages("t", session) for hub in (memo_hub, bare_hub)]
    assert [m.message for m in stored[0]] == [m.message for m in stored[1]]


def _answer(request: Recorded) -> Reply:
    n = len(request.json["messages"])
    return Reply(body={"choices": [{"message": {"role": "assistant", "content": f"ok {n}"}}]})


def test_the_proxy_sends_and_stores_the_same_with_and_without_the_memo(tmp_path: Path) -> None:
    upstream = ScriptedServer(_answer).start()
    try:
        memo_client, memo_key = _app(tmp_path, "memo.db", upstream=upstream.url + "/v1")
        bare_client, bare_key = _app(tmp_path, "bare.db", upstream=upstream.url + "/v1")
        base = conversation(40)
        with memo_client, bare_client:
            memo_hub, bare_hub = memo_client.app.state.hub, bare_client.app.state.hub  # type: ignore[attr-defined]
            _without_memo(bare_client)
            reused = _reuses(memo_client)
            history = list(base)
            for step in range(6):
                if step == 3:  # the client edits an old message: a miss, read whole
                    history[5] = {**history[5], "content": "edited"}
                body = {"model": "gpt-4o", "messages": history, "temperature": step / 10}
                raw = json.dumps(body).encode()
                replies = _post_both(
                    [(memo_client, memo_key), (bare_client, bare_key)],
                    "/v1/chat/completions",
                    raw,
                    lambda key: {"authorization": f"Bearer {key}", "x-ctxwarden-session": "c"},
                )
                _sent_alike(upstream, replies, memo_hub, ("openai", "t", "c"), raw)
                history = [*history, replies[0].json()["choices"][0]["message"]]
                history.append({"role": "user", "content": f"step {step}"})
            assert reused == [0, 40, 42, 0, 46, 48]  # the edit: read whole, then reused again
            _stored_alike(memo_hub, bare_hub, "c")
    finally:
        upstream.stop()


def _anthropic_turns() -> tuple[Any, list[Any]]:
    """A tool-using conversation in Anthropic's format, with a thinking block and an
    error result (so names, raw parts and meta all cross the split)."""
    system, turns = messages_to_anthropic([message_from_openai(m) for m in conversation(30)])
    turns = json.loads(json.dumps(turns))
    turns[2]["content"].insert(0, {"type": "thinking", "thinking": "hm", "signature": "s"})
    turns[3]["content"][0]["is_error"] = True
    return system, turns


def test_anthropic_turns_convert_the_same_in_two_parts_as_at_once() -> None:
    system, turns = _anthropic_turns()
    whole, names = turns_from_anthropic(turns)
    assert messages_from_anthropic(system, turns) == [*system_from_anthropic(system), *whole]
    for k in range(len(turns) + 1):
        first, after = turns_from_anthropic(turns[:k])
        rest, final = turns_from_anthropic(turns, k, after)
        assert [*first, *rest] == whole and final == names
    assert any(m.role == "tool" and m.name == "lookup" for m in whole)


def _anthropic_answer(request: Recorded) -> Reply:
    return Reply(body=anthropic_message(f"seen {len(request.json['messages'])}", input_tokens=20))


def test_the_anthropic_route_sends_and_stores_the_same_with_and_without_the_memo(
    tmp_path: Path,
) -> None:
    upstream = ScriptedServer(_anthropic_answer).start()
    try:
        memo_client, memo_key = _app(tmp_path, "memo.db", anthropic_upstream=upstream.url)
        bare_client, bare_key = _app(tmp_path, "bare.db", anthropic_upstream=upstream.url)
        system, turns = _anthropic_turns()
        with memo_client, bare_client:
            memo_hub, bare_hub = memo_client.app.state.hub, bare_client.app.state.hub  # type: ignore[attr-defined]
            _without_memo(bare_client)
            reused = _reuses(memo_client)
            history = turns[:20]
            for step in range(5):
                if step == 3:  # an edit: read and converted whole
                    history[4] = {**history[4], "content": "edited"}
                body = {"messages": history, "model": "claude-sonnet-4-5", "max_tokens": 64}
                raw = json.dumps({**body, "system": system}).encode()
                replies = _post_both(
                    [(memo_client, memo_key), (bare_client, bare_key)],
                    "/v1/messages",
                    raw,
                    lambda key: {"x-api-key": key, "x-ctxwarden-session": "a"},
                )
                _sent_alike(upstream, replies, memo_hub, ("anthropic", "t", "a"), raw)
                reply = replies[0].json()
                history = [*history, {"role": "assistant", "content": reply["content"]}]
                history.append({"role": "user", "content": f"step {step}"})
            assert reused == [0, 20, 22, 0, 26]
            _stored_alike(memo_hub, bare_hub, "a")
    finally:
        upstream.stop()


def test_the_anthropic_route_refuses_nan_and_forwards_the_word(tmp_path: Path) -> None:
    """``NaN`` is not JSON: a body holding it as a value is a 400 naming it, whether the
    memo read the body or the ordinary parse did (the memo's flag only says the text may
    hold it); the word inside a text is forwarded as it is."""
    upstream = ScriptedServer(_anthropic_answer).start()
    try:
        client, key = _app(tmp_path, "nan.db", anthropic_upstream=upstream.url)
        headers = {"x-api-key": key, "content-type": "application/json", "x-ctxwarden-session": "n"}
        turns = [{"role": "user", "content": "hi NaN"}]
        with client:
            for value, status in (("0.5", 200), ("NaN", 400), ("Infinity", 400), ("0.25", 200)):
                head = '{"model": "claude-sonnet-4-5", "max_tokens": 9, "temperature": '
                raw = (head + value + ', "messages": ' + json.dumps(turns) + "}").encode()
                got = client.post("/v1/messages", content=raw, headers=headers)
                assert got.status_code == status, got.text
                if status == 400:
                    assert got.json()["error"]["code"] == "invalid_json"
                    assert value in got.json()["error"]["message"]
            assert len(upstream.requests) == 2  # the refused bodies never went upstream
            assert (
                json.loads(upstream.requests[-1].body)["messages"][0]["content"][0]["text"]
                == "hi NaN"
            )
    finally:
        upstream.stop()


def test_the_memo_says_whether_a_body_holds_nan_looking_only_at_new_text() -> None:
    memo = BodyMemo()
    ms = [{"role": "user", "content": "a"}]
    flags = []
    for tail, more in [("", []), (', "t": NaN', []), ("", [{"content": "NaN here"}]), ("", [])]:
        ms = [*ms, *more]
        got = _read(memo, _body(ms, tail=tail))
        assert got is not None
        flags.append(got.nonfinite)
    # NaN after the messages marks that body only; in a message, every later body
    assert flags == [False, True, True, True]
    assert BodyMemo().read("s", _body([{"x": 1}], tail=', "t": Infinity')).nonfinite  # type: ignore[union-attr]
