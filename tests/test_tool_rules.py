"""Per-tool rules (issue 40, item 1): ``[tools.NAME]`` in the policy, loaded and checked up
front, applied by the steps that touch tool results, broken only by the budget, with a
warning that names the rule; no ``[tools]`` table changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ctxwarden import Policy, build_context
from ctxwarden.cli.main import app
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.pipeline.cascade import steps_for
from ctxwarden.steps.tool_rules import CLEARED, ToolRule, ToolRules, result_tool
from ctxwarden_bench.session_path import model_calls
from ctxwarden_bench.traces import load_tau_bench

TOOL = "get_reservation_details"


def rules(text: str) -> Policy:
    return Policy.from_toml(text)


# -- loading and checking ------------------------------------------------------------------------


def test_rules_load_from_toml_and_a_named_tool_wins_over_the_default() -> None:
    policy = rules(
        '[tools."*"]\nkeep_last = 2\nclear_inputs = true\n'
        '[tools.search]\nkeep_last = 0\ntruncate = "log"\n[tools.read_todo]\nmask = false\n'
    )
    assert policy.tools.for_tool("search") == ToolRule(
        keep_last=0, truncate="log", clear_inputs=True
    )
    assert policy.tools.for_tool("read_todo") == ToolRule(
        mask=False, keep_last=2, clear_inputs=True
    )
    assert policy.tools.for_tool("anything") == ToolRule(keep_last=2, clear_inputs=True)
    assert policy.tools.to_dict()["search"] == {"keep_last": 0, "truncate": "log"}
    # the same rules given in Python, as a mapping, are the same policy data
    same = Policy(tools=policy.tools.to_dict())
    assert same.tools == policy.tools


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("[tools.search]\nmasc = false\n", "unknown key(s) in [tools.search]: masc"),
        ('[tools."*"]\npinned = true\n', "unknown key(s) in [tools.*]: pinned"),
        ("[tools.search]\nkeep_last = -1\n", "[tools.search] keep_last must be"),
        ("[tools.search]\nkeep_last = true\n", "[tools.search] keep_last must be"),
        ('[tools.search]\ntruncate = "yaml"\n', "[tools.search] truncate must be"),
        ('[tools.search]\nmask = "no"\n', "[tools.search] mask must be true or false"),
        ("[tools.search]\npin = 1\n", "[tools.search] pin must be true or false"),
        ("[tools]\nsearch = 3\n", "[tools.search] must be a table"),
        ("tools = 3\n", "[tools] must be a table"),
    ],
)
def test_an_unknown_key_or_bad_value_is_a_config_error_naming_it(toml: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        rules(toml)
    assert named in str(caught.value)


def test_no_tools_table_adds_no_step_and_a_table_adds_its_own() -> None:
    assert not Policy().tools
    names = [s.name for s in steps_for(Policy())]
    assert "tool_pins" not in names and "tool_rules" not in names
    names = [s.name for s in steps_for(rules("[tools.a]\nmask = false\n"))]
    assert names[-1] == "tool_rules" and "tool_pins" not in names
    assert next(s.name for s in steps_for(rules("[tools.a]\npin = true\n"))) == "tool_pins"


def test_explain_shows_the_rules(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[tools."*"]\nkeep_last = 1\n[tools.lookup_order]\nmask = false\n')
    done = CliRunner().invoke(app, ["explain", "--example", "--policy", str(policy)])
    assert done.exit_code == 0, done.output
    assert "Tool rules ([tools.NAME]" in done.output
    assert "lookup_order" in done.output and "mask = false, keep_last = 1" in done.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[tools.lookup_order]\nmask_after = 2\n")
    done = CliRunner().invoke(app, ["explain", "--example", "--policy", str(bad)])
    assert done.exit_code != 0 and "mask_after" in done.output


# -- the done-when of the issue: tau-bench dev at 8,000 tokens -----------------------------------


def _masked_results(built: Any, tool: str) -> tuple[int, int]:
    """(results of ``tool`` in the built context, how many of them are masked)."""
    ms = list(built.messages)
    mine = [m for i, m in enumerate(ms) if m.role == "tool" and result_tool(ms, i) == tool]
    return len(mine), sum("masked_from" in m.meta for m in mine)


def test_tau_bench_dev_mask_false_leaves_every_result_of_the_tool_unmasked(
    tau_bench_path: Path,
) -> None:
    """Every model call of every dev run, built in an agent loop at 8,000 tokens: with
    ``[tools.get_reservation_details] mask = false`` no result of that tool is masked in
    any built context; with the default policy some are."""
    runs = load_tau_bench(tau_bench_path)
    rule = rules(f"[tools.{TOOL}]\nmask = false\n")
    found = {}
    for name, policy in (("default", Policy()), ("rule", rule)):
        sent = masked = calls = 0
        for run in runs:
            previous = None
            for k in model_calls(run):
                previous = build_context(run[:k], "gpt-4o", 8000, policy=policy, previous=previous)
                n, hidden = _masked_results(previous, TOOL)
                sent, masked, calls = sent + n, masked + hidden, calls + 1
        found[name] = (calls, sent, masked)
    assert found["default"][0] == found["rule"][0] > 1000
    assert found["default"][2] > 0  # the default masks some of them
    assert found["rule"][1] > 0 and found["rule"][2] == 0


# -- each rule on a small agent history ----------------------------------------------------------


def _body(tag: str, lines: int = 40) -> str:
    return "\n".join(
        f"{tag} row {i}: value {tag}-{i * 7919 % 1000} status ok" for i in range(lines)
    )


def agent(rounds: list[tuple[str, str]], *, answered: bool = False) -> list[dict[str, Any]]:
    """A system prompt, a user request, then one call and result per ``(tool, body)``;
    ``answered`` adds the assistant's reply after the last result."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. Use the tools."},
        {"role": "user", "content": "Check the account of user mia_li_3668 and fix it."},
    ]
    for n, (tool, body) in enumerate(rounds):
        args = json.dumps({"query": f"{tool} number {n}", "filters": ["a" * 40, "b" * 40]})
        call = {"id": f"c{n}", "type": "function", "function": {"name": tool, "arguments": args}}
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"c{n}", "content": body})
    if answered:
        out.append({"role": "assistant", "content": "Done."})
        out.append({"role": "user", "content": "Thanks, anything else?"})
    return out


def _results(built: Any) -> dict[str, Message]:
    """The built context's tool results by their call id."""
    return {m.tool_call_id: m for m in built.messages if m.role == "tool"}


def built_audit(history: list[dict[str, Any]], policy: Policy) -> tuple[Any, ...]:
    return build_context(history, max_input_tokens=100_000, policy=policy).audit.actions


EVERY_RESULT = "[mask]\nbatch_tokens = 0\n"  # mask every maskable result at once


def test_keep_last_is_each_tools_own_masking_depth() -> None:
    history = agent([("search" if n % 2 == 0 else "read_file", _body(f"r{n}")) for n in range(16)])
    default = _results(build_context(history, max_input_tokens=100_000, policy=rules(EVERY_RESULT)))
    assert {c for c, m in default.items() if "masked_from" not in m.meta} == {"c13", "c14", "c15"}
    policy = rules(EVERY_RESULT + "[tools.read_file]\nkeep_last = 5\n")
    built = _results(build_context(history, max_input_tokens=100_000, policy=policy))
    kept = {c for c, m in built.items() if "masked_from" not in m.meta}
    assert kept == {"c7", "c9", "c11", "c13", "c15", "c14"}  # read_file's 5, search in the last 3
    reasons = {a.reason for a in built_audit(history, policy) if a.action == "masked"}
    assert reasons == {
        "tool result older than the last 3",
        "tool result older than the last 5 results of read_file",
    }
    policy = rules(EVERY_RESULT + '[tools."*"]\nkeep_last = 0\n[tools.read_file]\nkeep_last = 2\n')
    built = _results(build_context(history, max_input_tokens=100_000, policy=policy))
    assert {c for c, m in built.items() if "masked_from" not in m.meta} == {"c13", "c15"}


def test_mask_false_keeps_a_tool_out_of_masking_even_when_it_flushes() -> None:
    history = agent([("search" if n % 2 else "read_todo", _body(f"r{n}")) for n in range(16)])
    # over budget unmasked (~7,500 tokens of results): masking flushes every maskable
    # result; at 8,000 the rule's unmasked results still leave the window room for all
    # rounds (lower, the window drops to its low-water mark and only the newest stay)
    budget = 8000
    default = _results(build_context(history, max_input_tokens=budget))
    todo = [f"c{n}" for n in range(0, 16, 2)]
    assert any("masked_from" in default[c].meta for c in todo if c in default)
    built = build_context(history, max_input_tokens=budget, policy=rules(
        "[tools.read_todo]\nmask = false\n"))  # fmt: skip
    results = _results(built)
    assert [c for c in todo if c in results]  # some of them are in the context
    assert all("masked_from" not in results[c].meta for c in todo if c in results)
    assert any("masked_from" in m.meta for c, m in results.items() if c not in todo)
    assert built.input_tokens <= budget


def test_truncate_false_and_a_forced_kind() -> None:
    text = " ".join(
        f"Paragraph {i}. The quick brown fox number {i} jumps over the lazy dog by the river."
        for i in range(300)
    )
    history = agent([("dump", text), ("other", "short")], answered=True)
    default = _results(build_context(history, max_input_tokens=100_000))["c0"]
    assert "truncated_from" in default.meta and default.kind == "article"
    kept = _results(
        build_context(
            history, max_input_tokens=100_000, policy=rules("[tools.dump]\ntruncate = false\n")
        )
    )["c0"]
    assert kept.content == text
    built = build_context(
        history, max_input_tokens=100_000, policy=rules('[tools.dump]\ntruncate = "text"\n')
    )
    forced = _results(built)["c0"]
    assert forced.kind == "text" and "truncated_from" in forced.meta
    assert forced.content != default.content  # cut as text (head and tail), not as an article
    assert "Paragraph 299." in forced.text and "Paragraph 299." not in default.text  # a tail
    (action,) = [a for a in built.audit.actions if a.message_id == forced.id]
    assert action.action == "truncated" and "text tool result" in action.reason
    # a rule on another tool leaves this one's cut as the default's
    other = _results(
        build_context(
            history, max_input_tokens=100_000, policy=rules("[tools.other]\ntruncate = false\n")
        )
    )["c0"]
    assert other.content == default.content


def test_pin_keeps_a_tools_results_when_the_window_moves_past_them() -> None:
    rounds = [("get_user", _body("user", 10))] + [("search", _body(f"s{n}")) for n in range(20)]
    history = agent(rounds, answered=True)
    default = build_context(history, max_input_tokens=3000)
    assert "c0" not in _results(default)
    built = build_context(history, max_input_tokens=3000, policy=rules(
        "[tools.get_user]\npin = true\n"))  # fmt: skip
    results = _results(built)
    assert results["c0"].content == history[3]["content"]  # whole: pinned, never cut or masked
    assert any(m.tool_calls and m.tool_calls[0].id == "c0" for m in built.messages)  # its call
    assert built.layers[results["c0"].id] == "pinned"
    assert built.input_tokens <= 3000 and not built.audit.warnings


def test_clear_inputs_masks_a_masked_results_call_arguments() -> None:
    history = agent([("search" if n % 2 else "read_file", _body(f"r{n}")) for n in range(10)])
    policy = rules(EVERY_RESULT + "[tools.search]\nclear_inputs = true\n")
    built = build_context(history, max_input_tokens=100_000, policy=policy)
    results = _results(built)
    calls = {c.id: c for m in built.messages for c in m.tool_calls}
    assert set(calls) == {f"c{n}" for n in range(10)}  # every call kept, with its result
    for n in range(10):
        call, masked = calls[f"c{n}"], "masked_from" in results[f"c{n}"].meta
        original = history[2 + 2 * n]["tool_calls"][0]["function"]["arguments"]
        assert call.name == ("search" if n % 2 else "read_file")
        if n % 2 and masked:
            assert json.loads(call.arguments) == json.loads(
                CLEARED.format(handle=f"cw:msg:m{2 + 2 * n}")
            )
        else:
            assert call.arguments == original
    assert sum(1 for n in range(1, 10, 2) if "masked_from" in results[f"c{n}"].meta) >= 3
    cleared = [a for a in built.audit.actions if "clear_inputs" in a.reason]
    assert cleared and all(a.tokens_after < a.tokens_before for a in cleared)
    _, turns = built.to_anthropic()  # still a valid tool_use input for every provider
    inputs = [b["input"] for t in turns if isinstance(t["content"], list) for b in t["content"]
              if b.get("type") == "tool_use"]  # fmt: skip
    assert all(isinstance(i, dict) for i in inputs) and len(inputs) == 10
    # the next build sends the same cleared calls (a stable prefix)
    again = build_context(
        [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}],
        max_input_tokens=100_000,
        policy=policy,
        previous=built,
    )
    before = {m.id: m for m in built.messages if m.tool_calls or "masked_from" in m.meta}
    assert before and all(m == before[m.id] for m in again.messages if m.id in before)


# -- budget still wins ---------------------------------------------------------------------------


def test_a_pin_the_budget_cannot_hold_is_broken_with_a_warning_naming_the_rule() -> None:
    rounds = [("get_user", _body(f"u{n}", 60)) for n in range(4)]
    rounds += [("search", _body(f"s{n}", 5)) for n in range(6)]
    history = agent(rounds, answered=True)
    built = build_context(history, max_input_tokens=2500, policy=rules(
        "[tools.get_user]\npin = true\n"))  # fmt: skip
    assert built.input_tokens <= 2500
    broken = [w for w in built.audit.warnings if w.startswith("[tools.get_user] pin = true")]
    assert broken and "evicted to fit the budget" in broken[0]
    assert len(broken) == 4 - sum(1 for c in ("c0", "c1", "c2", "c3") if c in _results(built))


def test_truncate_false_the_budget_cannot_hold_is_broken_with_a_warning() -> None:
    text = "\n".join(f"line {i}: the quick brown fox number {i} jumps" for i in range(600))
    history = agent([("dump", text)])  # the newest result, not answered yet
    policy = rules('[tools."*"]\ntruncate = false\n')
    built = build_context(history, max_input_tokens=2000, policy=policy)
    assert built.input_tokens <= 2000
    assert "truncated_from" in _results(built)["c0"].meta
    (warning,) = [w for w in built.audit.warnings if w.startswith("[tools.")]
    assert warning.startswith('[tools."*"] truncate = false broken: result m3 cut from')
    roomy = build_context(history, max_input_tokens=20_000, policy=policy)
    assert _results(roomy)["c0"].content == text and not roomy.audit.warnings


def test_result_tool_reads_the_name_or_the_call() -> None:
    call = Message.assistant(None, tool_calls=(ToolCall("x", "t1"), ToolCall("y", "t2")))
    ms = [call, Message.tool("a", tool_call_id="x"), Message.tool("b", tool_call_id="y")]
    assert [result_tool(ms, i) for i in range(3)] == [None, "t1", "t2"]
    assert result_tool([Message.tool("a", tool_call_id="x", name="own")], 0) == "own"
    assert ToolRules().for_tool("t1") == ToolRule()
