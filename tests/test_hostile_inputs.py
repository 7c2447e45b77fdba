"""Hostile input: every bad argument or message ends in a ctxwarden error naming it, every
odd but valid one in a correct build, and nothing takes unbounded time.

A proxy feeds the build bodies nobody checked. Each case here is one such body (huge,
deep, wide, odd types, odd unicode); the property tests at the end throw arbitrary
JSON-like values at the public entry points and accept only ctxwarden errors.
"""

from __future__ import annotations

import json
import math
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_servers import Reply, ScriptedServer, openai_completion
from typer.testing import CliRunner

import ctxwarden
from ctxwarden import (
    Message,
    OfflineSummarizer,
    RuleBasedFactExtractor,
    Session,
    SummaryTrigger,
    build_context,
)
from ctxwarden.cli.main import app
from ctxwarden.core.errors import (
    ConfigError,
    CtxwardenError,
    InvalidMessageError,
    ProviderTimeout,
    StoreError,
)
from ctxwarden.core.tokens.chunked import count_long, safe_chunks
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.core.tokens.encodings import get_encoding
from ctxwarden.formats import messages_from_anthropic, messages_from_openai
from ctxwarden.llm import parse_spec
from ctxwarden.memory.facts import parse_facts_json

SYSTEM = {"role": "system", "content": "You are a support agent."}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}


def user(text: str = "hello", **meta: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "user", "content": text}
    if meta:
        out["ctxwarden"] = meta
    return out


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    with Session(f"sqlite:///{tmp_path / 's.db'}", "hostile") as s:
        yield s


# -- the messages argument -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, "hello", b"hi", 5, 3.5, {"role": "user"}, object()])
def test_messages_that_are_not_a_list_are_an_error(bad: Any) -> None:
    with pytest.raises(InvalidMessageError, match="messages must be a list"):
        build_context(bad, max_input_tokens=500)
    with pytest.raises(InvalidMessageError, match="messages must be a list"):
        messages_from_openai(bad)


@pytest.mark.parametrize("item", [None, 5, "user", ["role", "user"], 2.5])
def test_an_item_that_is_not_a_message_names_its_index(item: Any) -> None:
    with pytest.raises(InvalidMessageError, match="message 1: a message must be a JSON object"):
        build_context([user(), item], max_input_tokens=500)


def test_a_generator_of_messages_is_accepted() -> None:
    built = build_context((m for m in [SYSTEM, user()]), max_input_tokens=500)
    assert [m.role for m in built.messages] == ["system", "user"]


# -- fields ----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", [["user"], {"r": 1}, 5, None, "robot", ""])
def test_a_bad_role_names_index_and_field(role: Any) -> None:
    with pytest.raises(InvalidMessageError) as info:
        messages_from_openai([user(), {"role": role, "content": "x"}])
    assert (info.value.index, info.value.field) == (1, "role")


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ([1, 2], "ctxwarden"),
        (7, "ctxwarden"),
        ("pinned", "ctxwarden"),
        ({"meta": [1]}, "ctxwarden.meta"),
        ({"meta": 3}, "ctxwarden.meta"),
        ({"pinned": "yes"}, "ctxwarden.pinned"),
        ({"pinned": 1}, "ctxwarden.pinned"),
        ({"priority": ["high"]}, "ctxwarden.priority"),
        ({"priority": "urgent"}, "priority"),
        ({"kind": {"x": 1}}, "ctxwarden.kind"),
        ({"id": {"a": 1}}, "ctxwarden.id"),
        ({"id": True}, "ctxwarden.id"),
        ({"created_at": "yesterday"}, "ctxwarden.created_at"),
        ({"created_at": math.nan}, "ctxwarden.created_at"),
        ({"created_at": True}, "ctxwarden.created_at"),
        ({"created_at": [2026]}, "ctxwarden.created_at"),
    ],
)
def test_bad_metadata_names_index_and_field(meta: Any, field: str) -> None:
    message = {"role": "user", "content": "x", "ctxwarden": meta}
    with pytest.raises(InvalidMessageError) as info:
        build_context([SYSTEM, message], max_input_tokens=500)
    assert (info.value.index, info.value.field) == (1, field)


def test_iso_created_at_is_parsed_and_stored_as_seconds(session: Session) -> None:
    [parsed] = messages_from_openai([user(created_at="2026-12-01T10:00:00Z")])
    assert parsed.created_at == 1_796_119_200.0
    naive = Message.user("x", created_at="2026-12-01T10:00:00")  # no zone: UTC
    assert naive.created_at == parsed.created_at
    session.append([user(created_at="2026-12-01T10:00:00+02:00")])
    [stored] = list(session.messages())
    assert stored.created_at == parsed.created_at - 7200


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("content", 5),
        ("content", {"text": "x"}),
        ("content", [5]),
        ("name", 5),
        ("tool_calls", "c1"),
        ("tool_calls", [{"id": 5, "function": {"name": "f"}}]),
        ("tool_calls", [{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}]),
    ],
)
def test_bad_wire_fields_name_the_field(key: str, value: Any) -> None:
    message = {"role": "assistant", "content": "x", key: value}
    with pytest.raises(InvalidMessageError) as info:
        messages_from_openai([message])
    assert info.value.field == key


def test_message_objects_check_their_field_types() -> None:
    with pytest.raises(InvalidMessageError, match=r"ctxwarden\.pinned"):
        Message.user("x", pinned="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="content"):
        Message(role="user", content=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match=r"ctxwarden\.created_at"):
        Message.user("x", created_at="yesterday")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="tool call's id"):
        ctxwarden.ToolCall(id=5, name="f")  # type: ignore[arg-type]


def test_unmodelled_keys_must_be_json_and_not_too_deep() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5_000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(InvalidMessageError, match="nested more than 100") as info:
        messages_from_openai([user(), {"role": "user", "content": "x", "audio": deep}])
    assert (info.value.index, info.value.field) == (1, "audio")
    with pytest.raises(InvalidMessageError, match="JSON values only"):
        messages_from_openai([{"role": "user", "content": "x", "when": object()}])
    shallow = messages_from_openai([{"role": "user", "content": "x", "audio": {"id": [1, 2]}}])
    assert shallow[0].extra == {"audio": {"id": [1, 2]}}


# -- the budget and other arguments ----------------------------------------------------------


@pytest.mark.parametrize(
    "budget", [math.nan, math.inf, -math.inf, "2000", True, False, -5, 0, 2.5, 2000.0, 10**12]
)
def test_a_bad_budget_is_a_config_error(budget: Any, session: Session) -> None:
    with pytest.raises(ConfigError, match="max_input_tokens"):
        build_context([SYSTEM, user()], max_input_tokens=budget)
    session.append([SYSTEM, user()])
    with pytest.raises(ConfigError, match="max_input_tokens"):
        session.build(max_input_tokens=budget)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"model": 5}, "model"),
        ({"model": ""}, "model"),
        ({"policy": {"window": 3}}, "policy"),
        ({"summary": ["a"]}, "summary"),
        ({"facts": 3}, "facts"),
        ({"tools": "search"}, "tools"),
        ({"tools": [5]}, r"tools\[0\]"),
        ({"previous": "state"}, "previous"),
    ],
)
def test_bad_build_arguments_are_config_errors(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        build_context([SYSTEM, user()], max_input_tokens=500, **kwargs)


def test_session_build_refuses_what_the_session_supplies(session: Session) -> None:
    session.append([SYSTEM, user()])
    with pytest.raises(ConfigError, match="previous"):
        session.build(max_input_tokens=500, previous=None)


# -- duplicate ids ---------------------------------------------------------------------------


def test_duplicate_ids_name_both_indices() -> None:
    big = "filler " * 3000
    history = [SYSTEM, user(big, id="x"), {"role": "assistant", "content": "ok"}, user(id="x")]
    with pytest.raises(InvalidMessageError, match="messages 1 and 3") as info:
        build_context(history, max_input_tokens=1000)
    assert (info.value.index, info.value.field) == (3, "ctxwarden.id")
    # an explicit id that takes a position id (m2) is a duplicate too
    with pytest.raises(InvalidMessageError, match="messages 0 and 2"):
        messages_from_openai([user(id="m2"), user(), user()])


def test_duplicate_ids_among_message_objects_also_in_an_agent_loop() -> None:
    history = [Message.system("s"), Message.user("a", id="u1"), Message.assistant("b", id="a1")]
    with pytest.raises(InvalidMessageError, match="messages 1 and 3"):
        build_context([*history, Message.user("c", id="u1")], max_input_tokens=500)
    built = build_context(history, max_input_tokens=500)
    history.append(Message.user("again", id="u2"))
    built = build_context(history, max_input_tokens=500, previous=built)
    history.append(Message.user("sneaky", id="a1"))  # only the new message is checked
    with pytest.raises(InvalidMessageError, match="messages 2 and 4"):
        build_context(history, max_input_tokens=500, previous=built)


def test_a_chained_build_of_dicts_is_checked_when_parsed() -> None:
    history = [SYSTEM, user("a", id="u1"), {"role": "assistant", "content": "b"}]
    built = build_context(history, max_input_tokens=500)
    assert build_context(history, max_input_tokens=500, previous=built).messages
    mixed = [*history, Message.user("c", id="u2")]
    assert build_context(mixed, max_input_tokens=500, previous=built).messages[-1].text == "c"
    with pytest.raises(InvalidMessageError, match="messages 1 and 3"):
        build_context([*history, Message.user("d", id="u1")], max_input_tokens=500, previous=built)


def test_identical_messages_without_ids_are_not_duplicates() -> None:
    history = [Message.system("s"), Message.user("ok"), Message.assistant("a"), Message.user("ok")]
    assert history[1].id == history[3].id  # content-derived ids coincide by design
    built = build_context(history, max_input_tokens=500)
    assert built.messages[-1].text == "ok"


# -- odd unicode -----------------------------------------------------------------------------

ODD_TEXTS = [
    "lone \ud800 surrogate",
    "low \udfff then high \udbff",
    "nul \x00 in the middle",
    "Привет, 你好, مرحبا, שָׁלוֹם, e\u0301, 🧑🏽‍💻, \u202eRTL\u202c, \ufeffBOM",
    "\u0000" * 50,
]


@pytest.mark.parametrize("text", ODD_TEXTS)
def test_odd_unicode_builds_counts_and_round_trips_through_sqlite(
    text: str, session: Session
) -> None:
    history = [SYSTEM, user(text), CALL, {"role": "tool", "tool_call_id": "c1", "content": text}]
    for model in ("gpt-4o", "claude-sonnet-4-5"):
        built = build_context([*history, user(text)], model=model, max_input_tokens=2000)
        assert built.messages[-1].text == text
    session.append(history)
    assert [m.text for m in session.messages()][1::2] == [text, text]
    assert session.build(max_input_tokens=2000).messages[1].text == text


def test_odd_unicode_round_trips_through_postgres() -> None:
    url = _postgres_url()
    texts = ODD_TEXTS * 3
    with Session(url, f"hostile-{uuid.uuid4().hex}") as s:
        s.append([SYSTEM, *[user(t + " Order ORD-4471 is late.") for t in texts]])
        assert [m.text for m in s.messages()][1:] == [t + " Order ORD-4471 is late." for t in texts]
        fold = SummaryTrigger(max_messages=5, keep_recent=2, fill_ratio=None)
        written = s.summarize_sync(OfflineSummarizer(), RuleBasedFactExtractor(), trigger=fold)
        assert written is not None and s.summary  # a summary of such text can be stored
        assert "\x00" not in s.summary


def _postgres_url() -> str:
    import os

    url = os.environ.get("CTXWARDEN_TEST_POSTGRES")
    if not url:
        pytest.skip("set CTXWARDEN_TEST_POSTGRES to a PostgreSQL DSN to run this test")
    return f"{url}{'&' if '?' in url else '?'}schema=hostile_{uuid.uuid4().hex[:12]}"


# -- huge, deep, wide ------------------------------------------------------------------------


def test_a_five_megabyte_token_run_counts_in_bounded_time() -> None:
    counter = TokenCounter("gpt-4o")
    counter.count_text("warm up")
    for text in ("a" * 5_000_000, " " * 1_000_000, "!" * 2_000_000, "中" * 1_000_000):
        started = time.perf_counter()
        tokens = counter.count_message(Message.user(text))
        assert time.perf_counter() - started < 3.0  # ~0.2 s here; generous for a busy CI
        assert tokens > 0
        assert counter.measure(Message.user(text))[1] is False  # estimated, and says so


def test_long_ordinary_text_is_counted_exactly_in_chunks() -> None:
    encoding = get_encoding("o200k_base")
    prose = 'The parcel ORD-4471 left the depot at 10:32.\nIt weighs 3.5 kg; {"eta": 2}\n'
    samples = {
        "prose": prose * 2_000,
        "json": json.dumps(
            [{"id": i, "name": f"item{i}", "tags": ["a", "b"]} for i in range(4000)]
        ),
        "minified": json.dumps({f"k{i}": i * 7 for i in range(20_000)}, separators=(",", ":")),
        "base64": __import__("base64").b64encode(bytes(range(256)) * 400).decode(),
    }
    for name, text in samples.items():
        assert len(safe_chunks(text)) > 1, name
        whole = len(encoding.encode(text, disallowed_special=()))
        assert count_long(encoding, text) == (whole, True), name


def test_a_huge_whitespace_run_does_not_crash_tiktoken() -> None:
    # tiktoken alone raises ValueError ("Max stack size exceeded") on this
    assert TokenCounter("gpt-4o").count_text(" " * 1_200_000) > 0


def test_a_five_megabyte_user_message_fails_fast_with_the_minimum() -> None:
    build_context([SYSTEM, user("warm")], max_input_tokens=500)
    started = time.perf_counter()
    with pytest.raises(ctxwarden.BudgetError, match="at least"):
        build_context([SYSTEM, user("a" * 5_000_000)], max_input_tokens=2000)
    assert time.perf_counter() - started < 5.0


def test_deep_json_text_is_a_tool_result_kind_not_a_recursion_error() -> None:
    deep = "[" * 10_000 + "]" * 10_000
    [result] = messages_from_openai([{"role": "tool", "tool_call_id": "c1", "content": deep}])
    assert result.kind == "text"  # too deep to be JSON to us
    call = ctxwarden.ToolCall(id="c1", name="f", arguments=deep)
    assert call.parsed_arguments() == {}
    _system, turns = ctxwarden.messages_to_anthropic([Message.assistant(None, (call,))])
    assert turns[0]["content"][0]["input"] == {"_raw_arguments": deep}


def test_a_deep_json_tool_result_builds() -> None:
    deep = "[" * 10_000 + "]" * 10_000
    tool = {"role": "tool", "tool_call_id": "c1", "content": deep}
    build_context([SYSTEM, user("go"), CALL, tool, user("and?")], max_input_tokens=2000)


def test_wide_inputs_build() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in range(300)
    ]
    wide = [SYSTEM, user("go"), {"role": "assistant", "content": None, "tool_calls": calls}]
    wide += [{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"} for i in range(300)]
    wide += [user(f"turn {i}") for i in range(2000)]
    many_keys = {"role": "user", "content": "x", "audio": {f"k{i}": i for i in range(20_000)}}
    built = build_context([*wide, many_keys], max_input_tokens=4000)
    assert built.input_tokens <= 4000
    assert ctxwarden.pairing_problems(built.messages) == []


# -- Anthropic input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system", "messages"),
    [
        (None, "hello"),
        (None, [5]),
        (None, [{"role": ["user"], "content": "x"}]),
        (None, [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]),
        (
            None,
            [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}],
                }
            ],
        ),
        ([5], []),
        ([{"text": 5}], []),
    ],
)
def test_bad_anthropic_requests_are_invalid_message_errors(system: Any, messages: Any) -> None:
    with pytest.raises(InvalidMessageError):
        messages_from_anthropic(system, messages)


def test_odd_anthropic_image_sources_are_kept_raw() -> None:
    block = {"type": "image", "source": {"type": "base64", "data": 5}}
    [message] = messages_from_anthropic(None, [{"role": "user", "content": [block]}])
    assert isinstance(message.content, tuple)
    assert message.content[0] == ctxwarden.RawPart(block)


# -- summariser deadlines --------------------------------------------------------------------


def test_spec_options_set_timeout_and_retries() -> None:
    model = parse_spec("vllm:llama@http://127.0.0.1:9/v1?timeout=2.5&retries=1")
    assert (model.timeout, model.deadline, model.retry.max_attempts) == (2.5, 2.5, 2)  # type: ignore[union-attr]
    assert model.base_url == "http://127.0.0.1:9/v1"  # type: ignore[union-attr]
    assert parse_spec("offline?timeout=3") == "offline"
    explicit = parse_spec("ollama:qwen3:8b?timeout=9", timeout=1.0)
    assert explicit.timeout == 1.0  # type: ignore[union-attr]
    for bad in (
        "ollama:m?timeout=nan",
        "ollama:m?timeout=-1",
        "ollama:m?retries=x",
        "ollama:m?colour=red",
        "ollama:m?timeout=inf",
    ):
        with pytest.raises(ConfigError):
            parse_spec(bad)


def test_a_hanging_summariser_is_bounded_by_its_spec_timeout() -> None:
    server = ScriptedServer().start()
    try:
        server.reply(*[Reply(body=openai_completion("late"), delay=5.0) for _ in range(8)])
        history = [SYSTEM]
        for i in range(40):
            history += [user(f"question {i} about ORD-{i}"), {"role": "assistant", "content": "ok"}]
        spec = f"openai:gpt-4o-mini@{server.url}/v1?timeout=0.5&retries=3"
        parse_spec(spec)  # import the SDK before timing
        started = time.monotonic()
        built = build_context(history, max_input_tokens=3000, summarizer=spec)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert elapsed < 2.5  # four attempts of 0.5 s would be >= 2 s plus waits
    assert len(server.requests) == 1
    assert any("0.5s deadline" in w for w in built.audit.warnings)


async def test_the_deadline_also_bounds_a_direct_call() -> None:
    server = ScriptedServer().start()
    try:
        server.reply(*[Reply(body=openai_completion("late"), delay=5.0) for _ in range(4)])
        model = parse_spec(f"openai:gpt-4o-mini@{server.url}/v1?timeout=0.4&retries=3")
        started = time.monotonic()
        with pytest.raises(ProviderTimeout):
            await model.complete([Message.user("hi")])  # type: ignore[union-attr]
        assert time.monotonic() - started < 1.2
    finally:
        server.stop()


# -- facts cut off ---------------------------------------------------------------------------


def test_a_cut_off_facts_answer_keeps_only_complete_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert parse_facts_json('{"budget": "1,500 EUR", "order": "ORD-') == {"budget": "1,500 EUR"}
    assert "order" in caplog.text
    assert parse_facts_json('{"size": "L", "items": ["a", "b') == {"size": "L"}
    assert parse_facts_json('{"size": "L", "budget": 15') == {"size": "L", "budget": 15}
    assert parse_facts_json('{"size": "L", "budget": 15', truncated=True) == {"size": "L"}
    assert parse_facts_json('{"a": "x\\"y", "b": "ORD-7"}') == {"a": 'x"y', "b": "ORD-7"}


# -- the CLI ---------------------------------------------------------------------------------


def _cli(*args: str, stdin: str | None = None) -> Any:
    return CliRunner().invoke(app, list(args), input=stdin)


def test_cli_bad_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([user(created_at="yesterday")]))
    result = _cli("build", str(bad), "-b", "500")
    assert result.exit_code == 2
    assert "created_at" in result.output
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps([user(id="x"), user(id="x")]))
    assert _cli("build", str(dup), "-b", "500").exit_code == 2
    good = tmp_path / "good.json"
    good.write_text(json.dumps([SYSTEM, user()]))
    result = _cli("build", str(good), "--summarizer", "offline", "--summarizer-timeout", "0")
    assert result.exit_code == 2 and "--summarizer-timeout" in result.output


def test_cli_session_add_refuses_orphan_results_and_stores_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    first = tmp_path / "first.json"
    first.write_text(json.dumps([SYSTEM, user("go"), CALL]))
    assert _cli("session", "add", "--db", db, "-s", "s1", str(first)).exit_code == 0
    orphan = tmp_path / "orphan.json"
    orphan.write_text(json.dumps([{"role": "tool", "tool_call_id": "zz", "content": "?"}]))
    result = _cli("session", "add", "--db", db, "-s", "s1", str(orphan))
    assert result.exit_code == 2
    assert "message 0" in result.output and "'zz'" in result.output
    moved_on = tmp_path / "moved.json"
    moved_on.write_text(json.dumps([user("and?")]))
    result = _cli("session", "add", "--db", db, "-s", "s1", str(moved_on))
    assert result.exit_code == 2 and "'c1'" in result.output
    with Session(db, "s1") as s:
        assert len(s) == 3  # nothing from the refused calls
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps([{"role": "tool", "tool_call_id": "c1", "content": "ok"}]))
    assert _cli("session", "add", "--db", db, "-s", "s1", str(answer)).exit_code == 0
    assert _cli("session", "build", "--db", db, "-s", "s1").exit_code == 0


# -- stores ----------------------------------------------------------------------------------


def test_an_unresponsive_postgres_fails_fast_naming_the_url_without_password() -> None:
    pytest.importorskip("psycopg")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts, never answers: libpq waits for the greeting
    port = silent.getsockname()[1]
    try:
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            Session(f"postgresql://bob:s3cret@127.0.0.1:{port}/db?connect_timeout=2", "x")
        assert time.monotonic() - started < 5.0
        with pytest.raises(StoreError, match=r"refused|failed"):
            Session("postgresql://bob:s3cret@127.0.0.1:1/db", "x")
    finally:
        silent.close()
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "s3cret" not in str(info.value) and "bob:***@" in str(info.value)


def test_session_append_rejects_a_non_list(session: Session) -> None:
    with pytest.raises(InvalidMessageError):
        session.append(None)  # type: ignore[arg-type]


# -- property tests: only ctxwarden errors come out ------------------------------------------

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["\ud800", "a\x00b", "Привет 你好", "2026-12-01T10:00:00Z", "user", "tool"]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_ANY = st.deferred(lambda: _JSON)  # one branch of a one_of (a bare _JSON counts as eight)
_META = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.sampled_from(["a", "b", "m1"]), _ANY),
        "pinned": _ANY,
        "priority": st.one_of(st.sampled_from(["critical", "high", "low"]), _ANY),
        "kind": st.one_of(st.sampled_from(["json", "text", "article"]), _ANY),
        "created_at": _ANY,
        "meta": _ANY,
    },
)
_CALLS = st.lists(
    st.fixed_dictionaries(
        {"id": st.one_of(st.sampled_from(["c1", "c2"]), _ANY)},
        optional={
            "type": st.just("function"),
            "function": st.one_of(
                _ANY,
                st.fixed_dictionaries(
                    {"name": st.one_of(st.just("f"), _ANY)},
                    optional={"arguments": st.one_of(st.just('{"a": 1}'), _ANY)},
                ),
            ),
        },
    ),
    max_size=3,
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(
            st.sampled_from(["system", "user", "assistant", "tool", "developer"]), _ANY
        )
    },
    optional={
        "content": st.one_of(
            st.text(max_size=40),
            st.lists(
                st.one_of(_ANY, st.fixed_dictionaries({"type": st.just("text"), "text": _ANY}))
            ),
            _ANY,
        ),
        "tool_calls": st.one_of(_CALLS, _ANY),
        "tool_call_id": st.one_of(st.sampled_from(["c1", "c2"]), _ANY),
        "name": _ANY,
        "ctxwarden": st.one_of(_META, _ANY),
        "audio": _ANY,
    },
)
_HISTORY = st.one_of(st.lists(st.one_of(_MESSAGE, _ANY), max_size=8), _ANY)
_BUDGET = st.one_of(st.integers(min_value=-5, max_value=5000), st.deferred(lambda: _SCALARS))
_SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _only_ctxwarden_errors(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except CtxwardenError:
        return None


@_SETTINGS
@given(history=_HISTORY, budget=_BUDGET)
def test_build_context_raises_only_ctxwarden_errors(history: Any, budget: Any) -> None:
    _only_ctxwarden_errors(messages_from_openai, history)
    built = _only_ctxwarden_errors(build_context, history, max_input_tokens=budget)
    if built is not None:
        assert built.input_tokens <= built.audit.budget
        assert budget is None or built.audit.budget == budget
        assert ctxwarden.pairing_problems(built.messages) == []


@_SETTINGS
@given(history=st.lists(st.one_of(_MESSAGE, _JSON), max_size=6))
def test_session_append_raises_only_ctxwarden_errors(history: Any, session: Session) -> None:
    before = len(session)
    seqs = _only_ctxwarden_errors(session.append, history)
    assert len(session) == before + (len(seqs) if seqs is not None else 0)  # all or nothing
    if seqs:
        stored = list(session.messages())[before:]
        assert len(stored) == len(history)


_ODD = st.sampled_from([None, 5, "x", True, 1.5, "\ud800", [], {}])  # one branch, not six
_INNER_BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "document"])},
    optional={
        "text": _SCALARS,
        "source": st.one_of(
            _SCALARS,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["base64", "url"])},
                optional={"media_type": _SCALARS, "data": _SCALARS, "url": _SCALARS},
            ),
        ),
    },
)
_BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking"])},
    optional={
        "text": _SCALARS,
        "id": st.one_of(st.just("t1"), _SCALARS),
        "name": st.one_of(st.just("f"), _SCALARS),
        "input": st.one_of(st.dictionaries(st.text(max_size=5), _JSON, max_size=3), _JSON),
        "tool_use_id": st.one_of(st.just("t1"), _SCALARS),
        "content": st.one_of(st.lists(st.one_of(_INNER_BLOCK, _ODD), min_size=1, max_size=3), _ODD),
        "source": _JSON,
        "is_error": _SCALARS,
    },
)
_TURN = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"])},
    optional={
        "content": st.one_of(
            st.lists(st.one_of(_BLOCK, _ODD), min_size=1, max_size=4), st.text(max_size=20)
        )
    },
)
_TURNS = st.one_of(
    st.lists(_TURN, min_size=1, max_size=5), st.lists(st.one_of(_TURN, _ANY), max_size=3), _ANY
)


@_SETTINGS
@given(
    system=st.one_of(st.sampled_from([None, "Be brief."]), _ANY),
    turns=_TURNS,
)
def test_messages_from_anthropic_raises_only_ctxwarden_errors(system: Any, turns: Any) -> None:
    parsed = _only_ctxwarden_errors(messages_from_anthropic, system, turns)
    if parsed is not None:
        _only_ctxwarden_errors(build_context, parsed, max_input_tokens=2000)
