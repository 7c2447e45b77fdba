"""Type-aware truncation of tool results (R4)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.cutters.json_doc import truncate_json
from ctxwarden.cutters.stack_trace import truncate_stack_trace
from ctxwarden.cutters.text import truncate_article, truncate_text
from ctxwarden.steps.base import Strategy, StrategyContext
from ctxwarden.steps.truncate import TruncateToolResults

COUNTER = TokenCounter.for_model("gpt-4o")
count = COUNTER.count_text


def words(s: str) -> int:
    """A cheap stand-in tokenizer for property tests: words and punctuation marks."""
    return len(re.findall(r"\w+|[^\w\s]", s))


def ctx(budget: int = 100_000) -> StrategyContext:
    return StrategyContext(
        count=COUNTER.count_message,
        budget=budget,
        total=lambda ms: COUNTER.count_messages(ms).tokens,
    )


# -- stack traces ------------------------------------------------------------------------------

LIB = "/srv/app/.venv/lib/python3.11/site-packages"


def python_trace(n_lib: int, error: str = "ValueError: reservation ZFA04Y not found") -> str:
    lines = ["Traceback (most recent call last):"]
    lines += ['  File "/srv/app/main.py", line 12, in <module>', "    run()"]
    for i in range(n_lib):
        lines += [f'  File "{LIB}/framework/core_{i}.py", line {i + 10}, in dispatch_{i}']
        lines += [f"    return self.handler_{i}(request, *args, **kwargs)", "           ^^^^^^^^^"]
    lines += ['  File "/srv/app/booking.py", line 88, in find', "    raise LookupError(rid)"]
    lines.append(error)
    return "\n".join(lines)


def test_python_trace_keeps_error_app_frames_and_counts_library_frames_cut() -> None:
    trace = python_trace(40)
    out = truncate_stack_trace(trace, target_tokens=300, count=count)
    assert count(out) <= 300 < count(trace)
    assert out.splitlines()[-1] == "ValueError: reservation ZFA04Y not found"
    assert '"/srv/app/main.py", line 12' in out and '"/srv/app/booking.py", line 88' in out
    assert "[... 40 library frames cut ...]" in out and "core_" not in out
    assert "^^^" not in out


def test_java_trace_keeps_exception_caused_by_and_app_frames() -> None:
    frames = [
        f"\tat org.springframework.web.Filter{i}.doFilter(Filter{i}.java:{i})" for i in range(60)
    ]
    trace = "\n".join(
        [
            'Exception in thread "main" java.lang.IllegalStateException: order #W1234 closed',
            "\tat com.shop.OrderService.close(OrderService.java:41)",
            *frames,
            "\tat com.shop.Main.main(Main.java:9)",
            "Caused by: java.sql.SQLException: connection refused",
            "\tat com.shop.Db.open(Db.java:17)",
            "\t... 61 more",
        ]
    )
    out = truncate_stack_trace(trace, target_tokens=200, count=count)
    assert count(out) <= 200
    for kept in (
        "IllegalStateException: order #W1234 closed",
        "OrderService.java:41",
        "Main.java:9",
    ):
        assert kept in out
    assert "Caused by: java.sql.SQLException: connection refused" in out
    assert re.search(r"\[\.\.\. \d+ library frames cut \.\.\.\]", out)


def test_node_trace_drops_node_modules_frames() -> None:
    frames = [
        f"    at Layer.handle (/app/node_modules/express/lib/layer{i}.js:95:5)" for i in range(50)
    ]
    trace = "\n".join(
        [
            "TypeError: Cannot read properties of undefined (reading 'id')",
            "    at getUser (/app/src/users.js:14:22)",
            *frames,
            "    at node:internal/process/task_queues:95:5",
        ]
    )
    out = truncate_stack_trace(trace, target_tokens=150, count=count)
    assert count(out) <= 150
    assert out.startswith("TypeError: Cannot read properties of undefined")
    assert "/app/src/users.js:14:22" in out
    assert "library frames cut" in out


def test_custom_library_patterns_and_bad_regex() -> None:
    trace = python_trace(30).replace(LIB, "/opt/vendor")
    default = truncate_stack_trace(trace, target_tokens=300, count=count)
    custom = truncate_stack_trace(
        trace, target_tokens=300, count=count, library_patterns=(r"/opt/vendor",)
    )
    assert "library frames cut" not in default  # vendor frames look like app frames by default
    assert "library frames cut" in custom
    with pytest.raises(ConfigError, match="invalid regex"):
        TruncateToolResults(library_patterns=("(unclosed",))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_lib=st.integers(0, 80),
    message=st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=80),
    target=st.integers(40, 400),
)
def test_stack_trace_always_keeps_the_last_error_line(
    n_lib: int, message: str, target: int
) -> None:
    error = f"KeyError: {message.strip()!r}"
    trace = python_trace(n_lib, error)
    out = truncate_stack_trace(trace, target_tokens=target, count=words)
    assert error in out.splitlines()
    if words(trace) > target:
        assert words(out) <= target


# -- JSON --------------------------------------------------------------------------------------


def flights(n: int) -> list[dict[str, object]]:
    return [
        {
            "flight_number": f"HAT{i:03d}",
            "origin": "JFK",
            "destination": "SEA",
            "status": "available",
            "prices": {"basic_economy": 50 + i, "economy": 120 + i, "business": 400 + i},
            "notes": "Seats are limited; fares may change before booking. " * 3,
        }
        for i in range(n)
    ]


def test_json_prunes_arrays_with_a_count_and_stays_valid() -> None:
    text = json.dumps({"query": "JFK-SEA", "results": flights(40)})
    out = truncate_json(text, target_tokens=300, count=count)
    data = json.loads(out)
    assert count(out) <= 300
    assert data["query"] == "JFK-SEA"
    assert data["results"][0]["flight_number"] == "HAT000"
    marker = data["results"][-1]
    assert isinstance(marker, str) and re.fullmatch(r"\[… \d+ more items cut\]", marker)
    kept = len(data["results"]) - 1
    assert marker == f"[… {40 - kept} more items cut]"


def test_json_keep_fields_survive_in_items_that_were_cut() -> None:
    text = json.dumps(flights(40))
    out = json.loads(
        truncate_json(text, target_tokens=500, count=count, keep_fields=["flight_number"])
    )
    numbers = [item["flight_number"] for item in out if isinstance(item, dict)]
    assert numbers == [f"HAT{i:03d}" for i in range(40)]


def test_json_long_strings_are_shortened_with_their_cut_length() -> None:
    text = json.dumps({"id": "ZFA04Y", "body": "word " * 2000})
    out = json.loads(truncate_json(text, target_tokens=200, count=count))
    assert out["id"] == "ZFA04Y"
    match = re.search(r"…\[([\d,]+) chars cut\]$", out["body"])
    assert match and len(out["body"]) < 10_000
    assert len(out["body"]) - len(match.group(0)) + int(match.group(1).replace(",", "")) == 10_000


def test_json_that_does_not_parse_is_cut_as_text() -> None:
    text = '{"broken": ' + "x" * 5000
    out = truncate_json(text, target_tokens=100, count=count)
    assert count(out) <= 100 and "[... cut" in out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=200),
    lambda children: (
        st.lists(children, max_size=30)
        | st.dictionaries(st.text(max_size=12), children, max_size=12)
    ),
    max_leaves=200,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=json_values, target=st.integers(1, 200), keep=st.lists(st.text(max_size=5), max_size=2)
)
def test_truncate_json_is_valid_json_and_never_grows(
    value: object, target: int, keep: list[str]
) -> None:
    text = json.dumps(value, ensure_ascii=False)
    out = truncate_json(text, target_tokens=target, count=words, keep_fields=keep)
    json.loads(out)
    assert words(out) <= words(text)
    assert out == truncate_json(text, target_tokens=target, count=words, keep_fields=keep)


# -- articles and text ---------------------------------------------------------------------------


def test_article_keeps_the_lead_and_says_how_much_was_cut() -> None:
    lead = "The airline changed its baggage policy on May 20th. Passengers may now carry two bags."
    body = "\n\n".join(
        f"Paragraph {i} explains a detail of the new rules at length." * 5 for i in range(40)
    )
    text = f"{lead}\n\n{body}"
    out = truncate_article(text, target_tokens=120, count=count)
    assert out.startswith(lead)
    assert count(out) <= 120
    m = re.search(r"\[\.\.\. cut ([\d,]+) of ([\d,]+) tokens \.\.\.\]$", out)
    assert m and int(m.group(2).replace(",", "")) == count(text)
    assert 0 < int(m.group(1).replace(",", "")) < count(text)


def test_article_with_a_huge_first_paragraph_is_cut_at_a_sentence() -> None:
    text = "This sentence is about the refund. " * 300
    out = truncate_article(text, target_tokens=60, count=count)
    assert count(out) <= 60 and out.split("\n\n")[0].endswith("refund.")


def test_text_keeps_head_and_tail() -> None:
    lines = [f"line {i}: status ok" for i in range(500)]
    text = "\n".join(lines)
    out = truncate_text(text, target_tokens=100, count=count)
    assert count(out) <= 100
    assert out.startswith("line 0: status ok\n") and out.endswith("line 499: status ok")
    assert re.search(r"\[\.\.\. cut [\d,]+ of [\d,]+ tokens, [\d,]+ lines \.\.\.\]", out)


@settings(deadline=None)
@given(st.text(max_size=3000), st.integers(5, 300))
def test_text_fits_or_is_untouched(text: str, target: int) -> None:
    out = truncate_text(text, target_tokens=target, count=words)
    assert words(out) <= words(text)
    if words(text) <= target:
        assert out == text
    elif target >= 20:  # room for the marker
        assert words(out) <= target


# -- the strategy --------------------------------------------------------------------------------


def conversation(result: str) -> list[Message]:
    return [
        Message.system("You are a booking agent.", id="s"),
        Message.user("Find flights", id="u"),
        Message.assistant(tool_calls=(ToolCall("c1", "search", '{"q": "JFK-SEA"}'),), id="a"),
        Message.tool(result, tool_call_id="c1", name="search", id="t"),
    ]


def test_strategy_truncates_only_over_threshold_and_reports_tokens() -> None:
    small = conversation(json.dumps(flights(1)))
    big = conversation(json.dumps(flights(60)))
    strategy = TruncateToolResults()
    assert isinstance(strategy, Strategy) and strategy.name == "truncate"

    result = strategy(small, ctx())
    assert all(a is b for a, b in zip(result.messages, small, strict=True))
    assert result.actions == []

    result = strategy(big, ctx())
    assert [m.id for m in result.messages] == ["s", "u", "a", "t"]
    assert all(a is b for a, b in zip(result.messages[:3], big[:3], strict=True))
    (action,) = result.actions
    assert (action.message_id, action.action, action.strategy) == ("t", "truncated", "truncate")
    assert action.tokens_before == COUNTER.count_message(big[3]) > 500
    assert action.tokens_after == COUNTER.count_message(result.messages[3]) <= 300
    json.loads(result.messages[3].text)
    assert strategy(big, ctx()).messages[3] == result.messages[3]  # deterministic


def test_pinned_and_critical_results_are_not_cut() -> None:
    big = conversation("x " * 3000)
    pinned = [*big[:3], Message.tool("x " * 3000, tool_call_id="c1", id="t", pinned=True)]
    critical = [*big[:3], Message.tool("x " * 3000, tool_call_id="c1", id="t", priority="critical")]
    assert TruncateToolResults()(pinned, ctx()).actions == []
    assert TruncateToolResults()(critical, ctx()).actions == []
    assert len(TruncateToolResults()(big, ctx()).actions) == 1


def test_text_counter_option_gives_the_same_kind_of_cut() -> None:
    big = conversation(json.dumps(flights(60)))
    result = TruncateToolResults(count_text=count)(big, ctx())
    assert result.actions[0].tokens_after <= 300


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ConfigError, match="threshold_tokens"):
        TruncateToolResults(threshold_tokens=100, target_tokens=300)
    with pytest.raises(ConfigError, match="target_tokens"):
        TruncateToolResults(target_tokens=0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.fixed_dictionaries(
            {"id": st.text(min_size=1, max_size=12), "note": st.text(max_size=120)}
        ),
        max_size=60,
    ),
    st.integers(5, 400),
)
def test_json_walk_from_a_guess_finds_the_gentlest_fitting_level(
    items: list[dict[str, str]], target: int
) -> None:
    """The walk gives what a binary search over every level gives."""
    from ctxwarden.cutters.json_doc import JSON_LEVELS as _JSON_LEVELS
    from ctxwarden.cutters.json_doc import prune as _prune

    text = json.dumps({"results": items, "total": len(items)})
    got = truncate_json(text, target_tokens=target, count=words)
    if words(text) <= target:
        assert got == text
        return
    levels = [
        json.dumps(_prune(json.loads(text), lv, frozenset()), ensure_ascii=False)
        for lv in _JSON_LEVELS
    ]
    fitting = [c for c in levels if words(c) <= target]
    expected = fitting[0] if fitting else levels[-1]
    assert got == (expected if words(expected) < words(text) else text)
