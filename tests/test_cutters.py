"""The ``kind -> cutter`` registry (issue 38): the built-in kinds cut as before, and a
policy adds a kind of its own (``[truncate.cutters]``) that a tool's rule names
(``[tools.X] truncate = "csv"``), or replaces the cut of a kind the classifier gives."""

from __future__ import annotations

import pytest

from ctxwarden import Message, Policy, ToolCall, build_context
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.kinds import RESULT_KINDS
from ctxwarden.cutters import CUTTERS, CutRequest, truncate_by_kind
from ctxwarden.steps.truncate import TruncateToolResults

CSV_MARK = "[csv cut to its header and the rows the call named]"


def cut_csv(text: str, ask: CutRequest) -> str | None:
    """A user's cutter: the header row and the rows holding a term of the request."""
    header, *rows = text.splitlines()
    kept = [r for r in rows if any(t in r for t in ask.terms)]
    return "\n".join([header, *kept, CSV_MARK])


def _history(tool: str = "export_rows") -> list[Message]:
    rows = "\n".join(f"{i},order-{i},shipped,{i * 7}.50" for i in range(600))
    call = ToolCall("c1", tool, '{"order": "order-417"}')
    return [
        Message.system("You are a support agent."),
        Message.user("Export the orders, I need order-417."),
        Message.assistant(None, tool_calls=(call,)),
        Message.tool("id,order,status,total\n" + rows, tool_call_id="c1"),
        Message.assistant("Found it."),
        Message.user("What was its total?"),
    ]


def _sent_result(policy: Policy, tool: str = "export_rows") -> str:
    built = build_context(_history(tool), "gpt-4o", 8000, policy=policy)
    return next(m.text for m in built.messages if m.role == "tool")


def test_the_built_in_kinds_are_the_classifier_kinds() -> None:
    assert set(CUTTERS) == set(RESULT_KINDS)
    assert TruncateToolResults().kinds is CUTTERS


def test_a_tool_rule_names_a_kind_the_policy_adds_in_toml() -> None:
    policy = Policy.from_toml(
        '[truncate.cutters]\ncsv = "test_cutters:cut_csv"\n[tools.export_rows]\ntruncate = "csv"\n'
    )
    assert policy.truncate is not None and "csv" in policy.truncate.kinds
    sent = _sent_result(policy)
    assert sent.startswith("id,order,status,total\n417,order-417,shipped,2919.50\n" + CSV_MARK)
    assert CSV_MARK not in _sent_result(policy, tool="other_tool")  # no rule: its own kind
    assert CSV_MARK not in _sent_result(Policy())


def test_a_kind_the_policy_adds_in_python_is_used_by_the_rule() -> None:
    policy = Policy(
        truncate=TruncateToolResults(cutters={"csv": cut_csv}),
        tools={"export_rows": {"truncate": "csv"}},
    )
    built = build_context(_history(), "gpt-4o", 8000, policy=policy)
    (action,) = [a for a in built.audit.actions if a.action == "truncated"]
    assert action.reason.startswith("csv tool result over 500 tokens (its tool's rule)")
    assert CSV_MARK in next(m.text for m in built.messages if m.role == "tool")


def test_a_cutter_replaces_the_cut_of_a_classified_kind() -> None:
    history = _history()
    kind = history[3].kind
    assert kind is not None and kind in CUTTERS
    policy = Policy(truncate=TruncateToolResults(cutters={kind: cut_csv}))
    assert CSV_MARK in _sent_result(policy, tool="any_tool")  # no rule: the classifier's kind


def test_truncate_by_kind_uses_the_registry_given() -> None:
    text = "id,n\n" + "\n".join(f"{i},x" for i in range(2000))
    words = len
    kinds = TruncateToolResults(cutters={"csv": cut_csv}).kinds
    cut = truncate_by_kind(
        text, "csv", target_tokens=50, count=words, terms=("17,",), cutters=kinds
    )
    assert cut.startswith("id,n\n17,x\n") and cut.endswith(CSV_MARK)
    plain = truncate_by_kind(text, "csv", target_tokens=50, count=words)  # no such kind: text
    assert CSV_MARK not in plain and plain == truncate_by_kind(
        text, None, target_tokens=50, count=words
    )


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[tools.export_rows]\ntruncate = "csv"\n', "[tools.export_rows] truncate must be"),
        ('[truncate.cutters]\ncsv = "nocolon"\n', "truncate.cutters.csv = 'nocolon' must look"),
        ('[truncate.cutters]\ncsv = "no.such.module:cut"\n', "cannot import cutter"),
        ("[truncate.cutters]\ncsv = 3\n", "truncate.cutters.csv: a cutter is a function"),
        ('[truncate.cutters]\n"my kind" = "test_cutters:cut_csv"\n', "a kind is a name"),
        ('[tools.export_rows]\ntruncate = "csv kind"\n', "[tools.export_rows] truncate must be"),
    ],
)
def test_a_bad_kind_or_cutter_is_a_config_error_naming_it(toml: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Policy.from_toml(toml)
    assert named in str(caught.value)


def test_a_policy_with_cutters_stays_hashable_and_equal_by_value() -> None:
    a = TruncateToolResults(cutters={"csv": cut_csv})
    b = TruncateToolResults(cutters={"csv": cut_csv})
    assert a == b and hash(a) == hash(b) and a != TruncateToolResults()
    assert hash(Policy(truncate=a)) == hash(Policy(truncate=b))


def looks_like_csv(text: str) -> bool:
    """A user's detector: the first lines have the same number of commas (two or more)."""
    head = text.splitlines()[:5]
    commas = {line.count(",") for line in head}
    return len(head) >= 2 and len(commas) == 1 and min(commas) >= 2


def test_a_kind_registered_with_a_detector_is_detected_and_cut_by_its_cutter() -> None:
    """Issue 38: a user registers a kind with its detector through the public API (an
    explicit value of the policy, no module state), and a build detects it on a tool's
    output no rule names and cuts it with the user's cutter."""
    from ctxwarden.cutters import Cutter

    truncate = TruncateToolResults(cutters={"csv": Cutter(cut_csv, detect=looks_like_csv)})
    policy = Policy(truncate=truncate)
    history = _history(tool="any_tool")
    assert history[3].kind != "csv"  # the built-in classifier knows no such kind
    assert truncate.kind_of(history[3]) == "csv"
    built = build_context(history, "gpt-4o", 8000, policy=policy)
    sent = next(m.text for m in built.messages if m.role == "tool")
    assert sent.startswith("id,order,status,total\n417,order-417,shipped,2919.50\n" + CSV_MARK)
    (action,) = [a for a in built.audit.actions if a.action == "truncated"]
    assert action.reason == "csv tool result over 500 tokens"
    # the next build of the loop sends the very same cut (the prefix stays cached)
    longer = [*history, Message.assistant("It was 2,919.50.")]
    again = build_context(longer, "gpt-4o", 8000, policy=policy, previous=built)
    assert next(m.text for m in again.messages if m.role == "tool") == sent
    # a result the detector does not claim keeps the classifier's kind and its cut
    log = "\n".join(f"line {i}: step {i} done" for i in range(600))
    other = [*history[:3], Message.tool(log, tool_call_id="c1"), *history[4:]]
    plain = build_context(other, "gpt-4o", 8000, policy=Policy())
    mine = build_context(other, "gpt-4o", 8000, policy=policy)
    assert [m.text for m in mine.messages] == [m.text for m in plain.messages]
    # without the detector the kind is cut only where a tool's rule names it
    only_ruled = Policy(truncate=TruncateToolResults(cutters={"csv": cut_csv}))
    assert CSV_MARK not in _sent_result(only_ruled, tool="any_tool")


def test_a_detector_in_toml_and_a_rule_naming_another_kind_wins() -> None:
    policy = Policy.from_toml(
        "[truncate.cutters]\n"
        'csv = { cut = "test_cutters:cut_csv", detect = "test_cutters:looks_like_csv" }\n'
        '[tools.export_rows]\ntruncate = "text"\n'
    )
    assert policy.truncate is not None and policy.truncate.kinds["csv"].detect is looks_like_csv
    assert CSV_MARK in _sent_result(policy, tool="any_tool")  # detected: no rule names it
    assert CSV_MARK not in _sent_result(policy)  # the tool's rule: cut as text


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('csv = { detect = "test_cutters:looks_like_csv" }', "a cutter table has cut ="),
        ('csv = { cut = "test_cutters:cut_csv", find = "x:y" }', "a cutter table has cut ="),
        ('csv = { cut = "test_cutters:cut_csv", detect = 3 }', "truncate.cutters.csv.detect"),
    ],
)
def test_a_bad_cutter_table_is_a_config_error(table: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Policy.from_toml(f"[truncate.cutters]\n{table}\n")
    assert named in str(caught.value)
