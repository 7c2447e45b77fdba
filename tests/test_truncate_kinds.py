"""Truncation of what coding and ops agents read, and bounded work on hostile input."""

from __future__ import annotations

import json
import re
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwarden.core.kinds import load_json, nests_deeper
from ctxwarden.core.messages import Message, ToolCall, detect_kind
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.cutters.by_kind import truncate_by_kind
from ctxwarden.cutters.code import truncate_code
from ctxwarden.cutters.diff import truncate_diff
from ctxwarden.cutters.html_page import html_to_text, truncate_html
from ctxwarden.cutters.json_doc import truncate_json
from ctxwarden.cutters.log import truncate_log
from ctxwarden.cutters.terms import request_terms
from ctxwarden.steps.base import StrategyContext
from ctxwarden.steps.truncate import TruncateToolResults

COUNTER = TokenCounter.for_model("gpt-4o")
count = COUNTER.count_text


def words(s: str) -> int:
    return len(re.findall(r"\w+|[^\w\s]", s))


def python_module(n: int) -> str:
    out = ["import os", "from django.db import models", ""]
    for i in range(n):
        out += [
            f"def helper_{i}(value, scale=2):",
            f'    """Scale value {i} for the report."""',
            f"    result = value * scale + {i}",
            "    return result",
            "",
        ]
    return "\n".join(out)


def ctx() -> StrategyContext:
    return StrategyContext(
        count=COUNTER.count_message,
        budget=100_000,
        total=lambda ms: COUNTER.count_messages(ms).tokens,
        count_text=count,
    )


# -- detection -----------------------------------------------------------------------------------


def test_kinds_are_detected_from_content() -> None:
    numbered = "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(python_module(5).split("\n")))
    log = "\n".join(f"2024-05-01 12:00:{i % 60:02d} INFO worker ready {i}" for i in range(30))
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n d\n"
    page = "<!DOCTYPE html><html><body><p>Hello</p></body></html>"
    assert detect_kind(python_module(5)) == "code"
    assert detect_kind(numbered) == "code"
    assert detect_kind(log) == "log"
    assert detect_kind(diff) == "diff"
    assert detect_kind(page) == "html"
    assert detect_kind('{"a": [1, 2]}') == "json"
    assert detect_kind("ok") == "text"


def test_json_nested_10000_deep_is_text_and_never_raises() -> None:
    deep = '{"a": ' * 10_000 + "1" + "}" * 10_000
    assert nests_deeper(deep) and load_json(deep) == (False, None)
    message = Message.tool(deep, "c1", id="t1")
    assert message.kind == "text"
    out = truncate_json(deep, target_tokens=100, count=count)  # parsed: no RecursionError
    assert count(out) <= 100 and "[... cut" in out
    cut = TruncateToolResults().truncate(message, COUNTER.count_message, count)
    assert COUNTER.count_message(cut) <= 300 + 120


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = json.dumps({"a": "[[[{{" * 200, "b": 'say \\"[[[\\"', "c": "é[" * 300})
    assert not nests_deeper(text)
    assert load_json(text)[0]
    assert nests_deeper("[" * 129 + "]" * 129) and not nests_deeper("[" * 128 + "]" * 128)
    assert nests_deeper("[" * 130 + "]" * 100)  # brackets that do not pair up: not JSON


# -- code listings -------------------------------------------------------------------------------


def test_code_keeps_what_was_searched_for_and_the_signatures() -> None:
    text = python_module(60)
    out = truncate_code(text, target_tokens=200, count=count, terms=("helper_41",))
    assert out is not None and count(out) <= 200
    assert "def helper_41(value, scale=2):" in out
    assert "    result = value * scale + 41" in out  # context around what was looked for
    assert "from django.db import models" in out
    assert re.search(r"\[\.\.\. \d+ lines cut \.\.\.\]", out)
    plain = truncate_code(text, target_tokens=200, count=count)  # no terms: signatures first
    assert plain is not None and plain.count("def helper_") > plain.count("result =")


def test_a_numbered_listing_keeps_its_numbers_and_says_which_lines_were_cut() -> None:
    lines = python_module(60).split("\n")
    text = "\n".join(f"{i + 100:>6}\t{line}" for i, line in enumerate(lines))
    out = truncate_code(text, target_tokens=150, count=count, terms=("helper_30",))
    assert out is not None and count(out) <= 150
    kept = [line for line in out.split("\n") if not line.startswith("[...")]
    assert all(line in text.split("\n") for line in kept)  # whole lines, numbers and all
    spans = re.findall(r"\[\.\.\. ([\d,]+) lines cut: (\d+)-(\d+) \.\.\.\]", out)
    assert spans and all(int(b) - int(a) + 1 == int(n.replace(",", "")) for n, a, b in spans)


# -- command output and logs ---------------------------------------------------------------------


def test_a_log_keeps_head_tail_errors_and_counts_what_it_cut() -> None:
    lines = [f"12:00:{i % 60:02d} INFO request {i} served" for i in range(2000)]
    lines[700] = "12:11:40 ERROR payment gateway refused order ORD-7781"
    for k in range(900, 960):
        lines[k] = f"12:15:{k % 60:02d} WARN slow response {k}"
    lines.append("=== 1 failed, 1999 passed in 12.3s ===")
    text = "\n".join(lines)
    out = truncate_log(text, target_tokens=250, count=count)
    assert out is not None and count(out) <= 250
    assert out.startswith("12:00:00 INFO request 0 served")
    assert out.endswith("=== 1 failed, 1999 passed in 12.3s ===")
    assert "ERROR payment gateway refused order ORD-7781" in out
    cut = [int(n.replace(",", "")) for n in re.findall(r"\[\.\.\. ([\d,]+) lines? cut", out)]
    assert sum(cut) + len([x for x in out.split("\n") if not x.startswith("[...")]) == 2001
    warned = sum(int(w) for w in re.findall(r"(\d+) warnings?", out))
    assert warned + out.count("WARN slow") == 60  # every warning kept or counted


def test_a_repeated_line_gives_way_to_distinct_ones() -> None:
    lines = ["downloading chunk 1 of 5000"] + [
        f"downloading chunk {i} of 5000" for i in range(2, 4000)
    ]
    lines[2500] = "checksum mismatch in chunk 2501"
    out = truncate_log("\n".join(lines), target_tokens=200, count=count)
    assert out is not None and "checksum mismatch in chunk 2501" in out
    assert "downloading chunk 1000 of" not in out


# -- diffs and HTML ------------------------------------------------------------------------------


def test_a_diff_keeps_every_header_and_the_changes() -> None:
    files = []
    for f in range(6):
        body = "\n".join(f" context line {k}" for k in range(40))
        files.append(
            f"diff --git a/src/m{f}.py b/src/m{f}.py\n--- a/src/m{f}.py\n+++ b/src/m{f}.py\n"
            f"@@ -10,43 +10,43 @@ def f{f}():\n{body}\n-    return {f}\n+    return {f} + 1\n{body}"
        )
    text = "\n".join(files)
    out = truncate_diff(text, target_tokens=600, count=count)
    assert out is not None and count(out) <= 600 < count(text)
    for f in range(6):
        assert f"diff --git a/src/m{f}.py b/src/m{f}.py" in out
        assert f"@@ -10,43 +10,43 @@ def f{f}():" in out
        assert f"+    return {f} + 1" in out and f"-    return {f}" in out
    assert "context line 20" not in out


def test_html_becomes_visible_text_and_links() -> None:
    page = (
        "<!DOCTYPE html><html><head><title>Fares &amp; rules</title><style>p{color:red}</style>"
        "<script>var secret = 1;</script></head><body><nav><a href='/home'>Home</a></nav>"
        "<p>Basic fares are <b>non-refundable</b>.</p><!-- hidden -->"
        '<p>See <a href="https://air.example/rules">the rules</a>.</p></body></html>'
    )
    text = html_to_text(page)
    assert "Fares & rules" in text and "Basic fares are non-refundable." in text
    assert "the rules (https://air.example/rules)" in text and "Home (/home)" in text
    assert "secret" not in text and "color" not in text and "hidden" not in text and "<" not in text
    big = page.replace("<p>See", "<p>" + "Long paragraph of fare text. " * 400 + "</p><p>See")
    out = truncate_html(big, target_tokens=200, count=count)
    assert count(out) <= 200 and out.startswith("Fares & rules")


def test_hostile_markup_is_read_in_one_pass() -> None:
    pages = ["<" * 20_000, "<script" * 5_000, "<a href=" * 5_000, "<!--" + "x" * 10_000]
    pages += ["<p>" * 20_000, "<script>" + "x" * 10_000, "<a href='u'>" * 10_000 + "</a>"]
    for page in pages:  # not a tag without its '>': text; an unclosed script: the rest
        text = html_to_text(page)
        assert len(text) <= len(page) and "<p>" not in text and "<a href='u'>" not in text
    assert html_to_text("<script>" + "x" * 10_000) == ""


# -- the step: terms, memo, bounds -----------------------------------------------------------------


def _listing_call(command: str, listing: str) -> list[Message]:
    args = json.dumps({"command": command})
    return [
        Message.system("You are a coding agent.", id="s"),
        Message.user("Fix the bug.", id="u"),
        Message.assistant("Let me look at the file.", (ToolCall("c1", "bash", args),), id="a"),
        Message.tool(listing, "c1", name="bash", id="t"),
    ]


def test_the_call_that_asked_decides_what_a_listing_keeps() -> None:
    history = _listing_call("grep -n 'helper_52' -A 3 src/report.py", python_module(80))
    assert history[-1].kind == "code"
    assert request_terms(history[2], "c1")[:2] == ("helper_52", "src/report.py")
    out = TruncateToolResults()(history, ctx()).messages[-1]
    assert "def helper_52(value, scale=2):" in out.text
    assert COUNTER.count_message(out) <= 300 + 120


def test_a_hostile_call_gives_terms_without_raising() -> None:
    deep = '{"a": ' * 10_000 + '"helper_3"' + "}" * 10_000
    request = Message.assistant("", (ToolCall("c1", "bash", deep),), id="a")
    assert "helper_3" in request_terms(request, "c1")


def test_the_memo_changes_no_output_and_is_shared_safely_by_threads() -> None:
    histories = [
        _listing_call(f"grep -n helper_{k}x src/a.py", python_module(40 + k)) for k in range(8)
    ]
    fresh = [  # a counter the memo cannot name: computed every time
        TruncateToolResults().truncate(h[-1], COUNTER.count_message, lambda s: count(s), h[2])
        for h in histories
    ]
    results: dict[int, Message] = {}

    def run(k: int) -> None:
        for _ in range(3):
            results[k] = TruncateToolResults()(histories[k], ctx()).messages[-1]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[k].text for k in range(8)] == [m.text for m in fresh]


def test_huge_results_are_never_counted_whole_while_cutting() -> None:
    seen: list[int] = []

    def counting(s: str) -> int:
        seen.append(len(s))
        return count(s)

    log = "\n".join(f"line {i} status=ok path=/srv/{i}" for i in range(100_000))
    for text, kind in (("a" * 2_000_000, "text"), (log, "log"), (log, "code"), (log, "article")):
        seen.clear()
        out = truncate_by_kind(text, kind, target_tokens=300, count=counting, total=10**6)
        assert counting(out) <= 300
        assert max(seen) <= 300 * 64 + 200, kind  # no draft longer than the target can hold


def test_a_result_over_the_cap_says_how_much_was_not_examined() -> None:
    log = "\n".join(f"12:00 INFO line {i}" for i in range(60_000))
    out = truncate_by_kind(log, "log", target_tokens=300, count=count, max_chars=100_000)
    assert re.search(r"\[\.\.\. not examined: [\d,]+ characters, [\d,]+ lines \.\.\.\]", out)
    with pytest.raises(Exception, match="max_chars"):
        TruncateToolResults(max_chars=10)


def test_any_str_is_safe_surrogates_and_nul_included() -> None:
    text = "x\ud800y\x00z " * 20_000
    for kind in ("text", "log", "code", "diff", "html", "article", "json", "stack_trace"):
        out = truncate_by_kind(text, kind, target_tokens=100, count=words)
        assert words(out) <= 100


lines_st = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8"), max_size=60),
        st.sampled_from(["def run(x):", "ERROR boom", "+added", "-removed", "@@ -1 +1 @@", ""]),
    ),
    min_size=1,
    max_size=200,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=lines_st, target=st.integers(20, 300), kind=st.sampled_from(["code", "log", "diff"]))
def test_line_cuts_fit_never_grow_and_are_deterministic(
    lines: list[str], target: int, kind: str
) -> None:
    text = "\n".join(lines)
    out = truncate_by_kind(text, kind, target_tokens=target, count=words, terms=("run",))
    assert words(out) <= words(text)
    if words(text) > target:
        assert words(out) <= target or out == text
    assert out == truncate_by_kind(text, kind, target_tokens=target, count=words, terms=("run",))


def test_a_cut_page_lists_values_of_its_text_not_of_its_markup() -> None:
    rows = "".join(
        f'<tr><td><a href="https://shop.example/p/SKU-{i:05d}">Item {i}</a></td>'
        f"<td>{i}.99 EUR</td></tr>"
        for i in range(300)
    )
    page = f"<!DOCTYPE html><html><head><title>Catalogue</title></head><body><table>{rows}"
    page += "</table></body></html>"
    message = Message.tool(page, "c1", id="t1")
    assert message.kind == "html"
    cut = TruncateToolResults().truncate(message, COUNTER.count_message, count)
    assert "<td>" not in cut.text and "/title" not in cut.text and "/td" not in cut.text
    assert "SKU-00299" in cut.text or "more]" in cut.text
