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
