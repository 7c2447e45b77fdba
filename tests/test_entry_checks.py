"""Arguments are checked up front at every public entry point (issue 35): a bad summariser,
policy, previous state or stored layers is a ctxwarden error naming the argument before
any work — whether or not a summary is due — and functions that take ``Message`` s refuse
wire dicts by name instead of failing on a missing attribute."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxwarden import (
    ConfigError,
    InvalidMessageError,
    Message,
    Session,
    build_context,
    group_blocks,
    pairing_problems,
    summarize_history_sync,
    validate_pairing,
)
from ctxwarden.memory.summaries import SummaryTrigger

SYSTEM = Message.system("You are a support agent.", id="sys")


def _history(turns: int) -> list[Message]:
    out = [SYSTEM]
    for i in range(turns):
        out.append(Message.user(f"question {i} about order ORD-{1000 + i}", id=f"u{i}"))
        out.append(Message.assistant(f"answer {i}: order ORD-{1000 + i} shipped", id=f"a{i}"))
    return out


SHORT = _history(1)  # no summary due
LONG = _history(40)  # 81 messages: the default trigger (30 messages) fires

BAD = [
    ({"summarizer": 5}, "summarizer"),
    ({"summarizer": "nope:x"}, "summarizer"),
    ({"summarizer": object()}, "summarizer"),
    ({"policy": "x"}, "policy"),
    ({"previous": 42}, "previous"),
    ({"layers": "x"}, "layers"),
    ({"summarizer": "offline", "facts_schema": 5}, "facts_schema"),
    ({"facts_schema": 5}, "facts_schema"),  # checked even without a summariser
    ({"earlier_entities": {}}, "earlier_entities"),
    ({"registry": "models.toml"}, "registry"),
]


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    with Session(f"sqlite:///{tmp_path / 's.db'}", "checks") as s:
        yield s


def test_the_long_history_has_a_summary_due() -> None:
    built = build_context(LONG, max_input_tokens=100_000, summarizer="offline")
    assert any(a.action == "summarized" for a in built.audit.actions)
    built = build_context(SHORT, max_input_tokens=100_000, summarizer="offline")
    assert not any(a.action == "summarized" for a in built.audit.actions)


@pytest.mark.parametrize("history", [SHORT, LONG], ids=["no-summary-due", "summary-due"])
@pytest.mark.parametrize(("kwargs", "name"), BAD)
def test_build_context_refuses_a_bad_argument_by_name(
    history: list[Message], kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(ConfigError, match=name):
        build_context(history, max_input_tokens=100_000, **kwargs)


@pytest.mark.parametrize("history", [SHORT, LONG], ids=["no-summary-due", "summary-due"])
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"summarizer": 5}, "summarizer"),
        ({"summarizer": "nope:x"}, "summarizer"),
        ({"policy": "x"}, "policy"),
        ({"window": 0}, "window"),
        ({"max_input_tokens": -1}, "max_input_tokens"),
        ({"summarizer": "offline", "schema": 5}, "facts_schema"),
    ],
)
def test_session_summarize_refuses_a_bad_argument_before_any_work(
    session: Session, history: list[Message], kwargs: dict[str, Any], name: str
) -> None:
    session.append(history)
    before = (session.record.version, session.summary, len(session))
    with pytest.raises(ConfigError, match=name):
        session.summarize_sync(**kwargs)
    assert (session.record.version, session.summary, len(session)) == before  # nothing lost


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"summarizer": 5}, "summarizer"),
        ({"summarizer": "nope:x"}, "summarizer"),
        ({"policy": "x"}, "policy"),
    ],
)
def test_session_build_and_constructor_refuse_a_bad_argument(
    session: Session, tmp_path: Path, kwargs: dict[str, Any], name: str
) -> None:
    session.append(LONG)
    with pytest.raises(ConfigError, match=name):
        session.build(**kwargs)
    with pytest.raises(ConfigError, match=name):
        Session(f"sqlite:///{tmp_path / 'other.db'}", "x", **kwargs)


@pytest.mark.parametrize("history", [SHORT, LONG], ids=["no-summary-due", "summary-due"])
@pytest.mark.parametrize(
    ("args", "kwargs", "name"),
    [
        ((), {"summarizer": 5}, "summarizer"),
        ((), {"summarizer": "nope:x"}, "summarizer"),
        ((42,), {"summarizer": "offline"}, "previous"),
        ((), {"summarizer": "offline", "trigger": "x"}, "trigger"),
    ],
)
def test_summarize_history_refuses_a_bad_argument(
    history: list[Message], args: tuple[Any, ...], kwargs: dict[str, Any], name: str
) -> None:
    previous = args[0] if args else None
    with pytest.raises(ConfigError, match=name):
        summarize_history_sync(history, previous, **kwargs)


def test_summarize_history_refuses_wire_dicts_by_name() -> None:
    with pytest.raises(InvalidMessageError, match=r"history\[0\] must be a Message"):
        summarize_history_sync(
            [{"role": "user", "content": "hi"}],  # type: ignore[list-item]
            None,
            summarizer="offline",
            trigger=SummaryTrigger(),
        )


@pytest.mark.parametrize("check", [validate_pairing, pairing_problems, group_blocks])
def test_pairing_functions_refuse_wire_dicts_by_name(check: Any) -> None:
    dicts = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidMessageError, match=r"messages\[0\] must be a Message.*from_openai"):
        check(dicts)
    with pytest.raises(InvalidMessageError, match="must be a list of Message, got str"):
        check("hello")
    check([Message.user("hi")])  # Messages pass


def test_a_good_spec_passes_the_check_and_calls_nothing_when_no_summary_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the client is made, never called
    built = build_context(SHORT, max_input_tokens=2_000, summarizer="openai:gpt-4o-mini")
    assert [m.id for m in built.messages][-1] == "a0"
