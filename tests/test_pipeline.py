"""The one build pipeline (issue 10): explicit state, one path, user steps, pins, pairs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import ctxwarden
from ctxwarden import BuildState, Message, Policy, ToolCall, WindowConfig, build_context
from ctxwarden.core.errors import BudgetError, ConfigError
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import messages_from_openai, messages_to_openai
from ctxwarden.steps.drop_tagged import DropTagged
from ctxwarden.steps.ledger import ledger_memo
from ctxwarden.steps.state import PREFIX_DIGITS
from ctxwarden_bench.proxy import conversation
from ctxwarden_bench.traces import load_tau_bench


def _loop(history: list[Message], budget: int, start: int = 4) -> list[ctxwarden.BuiltContext]:
    """An agent loop: one build per message from ``start`` on, chained."""
    built, out = None, []
    for n in range(start, len(history) + 1):
        built = build_context(history[:n], "gpt-4o", budget, previous=built)
        out.append(built)
    return out


@pytest.fixture(scope="module")
def tau(tau_bench_path: Path) -> list[list[Message]]:
    return load_tau_bench(tau_bench_path)


# -- explicit state ----------------------------------------------------------------------------


def test_state_round_trips_every_field(tau: list[list[Message]]) -> None:
    built = _loop(tau[3], 1600)[-1]
    state = built.state
    ledger = ledger_memo(state)
    assert ledger is not None and ledger.memo is not None and state.window_start > 0
    assert set(state.memos) == {"window", "fit", "ledger"}  # (no summary: no scan)
    back = BuildState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state
    carried = ledger_memo(back)
    assert carried is not None and carried.memo is not None
    assert carried.memo.ledger.entries == ledger.memo.ledger.entries
    assert back.to_dict() == state.to_dict()


def test_the_loop_carries_its_turns(tau: list[list[Message]]) -> None:
    """The loop's model calls so far are carried build by build (a session reads only a
    slice of its store, so recounting over what a build is given would differ by path); a
    state stored before they were is read as none so far and builds the same context."""
    run = tau[3]
    built = _loop(run, 1600)[-1]
    history = run[: built.audit.history_messages]
    assert built.state.turns == sum(m.role == "assistant" for m in history)
    stored = built.state.to_dict()
    before = {k: v for k, v in stored.items() if k != "turns"}  # stored before the count
    nxt = len(history) + 2
    new_way = build_context(run[:nxt], "gpt-4o", 1600, previous=BuildState.from_dict(stored))
    old_way = build_context(run[:nxt], "gpt-4o", 1600, previous=BuildState.from_dict(before))
    assert old_way.messages == new_way.messages
    assert new_way.state.turns == sum(m.role == "assistant" for m in run[:nxt])


def test_growth_right_after_a_compaction_is_read_from_the_window() -> None:
    """What a call adds, before a compaction has measured it, is read from the window
    (which a session holds whole), not from the whole history (which only build_context
    holds): both paths weigh the same rewrite the same way."""
    from ctxwarden.pipeline.compaction import window_per_turn

    counter = TokenCounter.for_model("gpt-4o")
    window = messages_from_openai(conversation(12))[1:]
    turns = sum(m.role == "assistant" for m in window)
    assert turns > 0
    want = sum(map(counter.count_message, window)) / turns
    assert window_per_turn(window, counter.count_message) == want
    assert window_per_turn([m for m in window if m.role != "assistant"], len) == 0.0


def test_a_damaged_state_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a stored build state"):
        BuildState.from_dict({"ledger": {"upto": "x"}})
    for packed in ("not base64!", "AAAA"):  # not base64; 3 bytes, not whole digests
        with pytest.raises(ConfigError, match="not a stored build state"):
            BuildState.from_dict({"version": 3, "prefix": packed})


def test_the_prefix_is_stored_packed_and_a_state_stored_before_still_builds_the_same() -> None:
    history = messages_from_openai(conversation(80))
    first = build_context(history[:60], "gpt-4o", 3_000)
    state = first.state
    assert state.prefix == tuple(m.fingerprint[:PREFIX_DIGITS] for m in first.messages)
    stored = state.to_dict()
    assert isinstance(stored["prefix"], str) and len(stored["prefix"]) == 8 * len(state.prefix)
    # what version 2 stored: every fingerprint whole, in a list
    old = {**stored, "version": 2, "prefix": [m.fingerprint for m in first.messages]}
    assert BuildState.from_dict(old) == state
    assert BuildState.from_dict({**old, "version": 1}) == state
    for n in (61, 62, 70):
        new_way = build_context(history[:n], "gpt-4o", 3_000, previous=BuildState.from_dict(stored))
        old_way = build_context(history[:n], "gpt-4o", 3_000, previous=BuildState.from_dict(old))
        assert old_way.audit == new_way.audit and old_way.messages == new_way.messages
        assert old_way.state == new_way.state
        assert 0 < new_way.audit.prefix_shared_tokens < new_way.input_tokens
    # a prefix made by hand (not digests) is kept as it is
    odd = replace(state, prefix=("abc", "ABCDEF012345", *state.prefix))
    assert isinstance(odd.to_dict()["prefix"], list)
    assert BuildState.from_dict(json.loads(json.dumps(odd.to_dict()))) == odd
    assert BuildState.from_dict(replace(state, prefix=()).to_dict()).prefix == ()


def _flat(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored state as version 3 stored it: each step's memo a flat field."""
    old = {k: v for k, v in stored.items() if k != "memos"}
    memos = stored["memos"]
    ledger = memos.get("ledger", {"begin": 0, "memo": None})
    window = memos.get("window", {"flagged": [], "upto": 0})
    old.update(
        version=3,
        ledger_from=ledger["begin"],
        ledger=ledger["memo"],
        flagged=window["flagged"],
        flagged_upto=window["upto"],
        recall=memos.get("recall"),
        summary_scan=memos.get("layers"),
        kept_from=memos.get("fit", {"kept_from": ""})["kept_from"],
    )
    return old


def test_a_state_stored_with_flat_memo_fields_reads_the_same(tau: list[list[Message]]) -> None:
    """Version 3 kept the steps' memos as flat fields of the state (``ledger_from``,
    ``ledger``, ``flagged``, ``flagged_upto``, ``recall``, ``summary_scan``,
    ``kept_from``); such a state, stored by a build or a session, reads as the state it
    was, and the next builds are the same."""
    from ctxwarden.session.rows import state_for, sticky_from

    chat = messages_from_openai(conversation(80))
    policy = Policy(recall=ctxwarden.RecallRelevant())
    for history, budget, pol in ((tau[3], 1600, Policy()), (chat, 3_000, policy)):
        built, builds = None, []
        for n in range(4, len(history) + 1):
            built = build_context(history[:n], "gpt-4o", budget, previous=built, policy=pol)
            builds.append(built)
        for chosen in (builds[len(builds) // 2], builds[-2]):
            state = chosen.state
            stored = json.loads(json.dumps(state.to_dict()))
            old = _flat(stored)
            # (version 3 did not keep where the newest user message was: a build without it
            # walks back to it, the same message)
            window = state.memos["window"]
            unknown = state.with_memo("window", replace(window, newest=None, seen=0))
            assert "memos" not in old and BuildState.from_dict(old) == unknown
            n = chosen.audit.history_messages + 1
            new_way = build_context(history[:n], "gpt-4o", budget, previous=state, policy=pol)
            old_way = build_context(
                history[:n], "gpt-4o", budget, previous=BuildState.from_dict(old), policy=pol
            )
            assert old_way.messages == new_way.messages and old_way.state == new_way.state
            # a session's stored decisions: the memos it keeps, and positions as seqs
            seqs = [10 * i for i in range(chosen.audit.history_messages)]
            sticky = sticky_from(state, seqs)
            flat = {k: v for k, v in _flat(sticky).items() if k in _V3_STICKY}
            assert state_for(flat, seqs) == state_for(sticky, seqs)
    assert "recall" in state.memos  # (the chat recalled: its memo was read too)


# what a session stored of a state in version 3 (flagged, ledger, summary_scan were not)
_V3_STICKY = (
    *("version", "history_length", "last_id", "window_start", "sticky", "prefix"),
    *("ledger_from", "recall", "input_tokens", "compacted_tokens", "held_calls", "kept_from"),
    *("layers_sent", "layers_key", "ledger_sent", "ledger_base_sent", "turns"),
    *("last_seq", "window_start_seq", "ledger_from_seq"),
)


_CHILD = """
import json, sys
from ctxwarden import BuildState, build_context
from ctxwarden_bench.traces import load_tau_bench
path, run, n, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
state = BuildState.from_dict(json.loads(sys.stdin.read()))
history = load_tau_bench(path)[run][:n]
built = build_context(history, "gpt-4o", budget, previous=state)
print(json.dumps(built.to_openai()))
"""


def test_the_next_turn_builds_the_same_in_a_new_process(
    tau: list[list[Message]], tau_bench_path: Path
) -> None:
    """Turn t in this process, its state stored; turn t+1 in a new process from it."""
    for run, budget in ((3, 1600), (11, 2000)):
        history = tau[run]
        builds = _loop(history, budget)
        for t in (len(builds) // 2, len(builds) - 2):
            stored = json.dumps(builds[t].state.to_dict())
            n = 4 + t + 1
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(tau_bench_path), str(run), str(n), str(budget)],
                input=stored,
                capture_output=True,
                text=True,
                check=True,
            )
            assert json.loads(out.stdout) == builds[t + 1].to_openai()


def test_eight_threads_build_what_one_thread_builds(tau: list[list[Message]]) -> None:
    runs = [tau[i] for i in range(0, 40, 5)]
    sequential = [[b.to_openai() for b in _loop(h, 1600)] for h in runs]
    results: dict[int, list[Any]] = {}

    def work(i: int) -> None:
        results[i] = [b.to_openai() for b in _loop(runs[i], 1600)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(runs))] == sequential


# -- one path ----------------------------------------------------------------------------------


def _store_urls(tmp_path: Path, pg_schema_url: str | None) -> list[str]:
    urls = [f"sqlite:///{tmp_path / 'one.db'}"]
    if pg_schema_url:
        urls.append(pg_schema_url)
    return urls


def test_session_and_build_context_give_the_same_context(
    tau: list[list[Message]], locomo_path: Path, tmp_path: Path, pg_schema_url: str | None
) -> None:
    from ctxwarden_bench.traces import load_locomo, locomo_transcript

    chats = [tau[3], tau[11], tau[27], locomo_transcript(load_locomo(locomo_path)[2])[:120]]
    for url in _store_urls(tmp_path, pg_schema_url):
        for history in chats:
            sid = f"one-path-{uuid.uuid4().hex[:8]}"
            with ctxwarden.Session(url, sid) as s:
                s.append(history[:4])
                built = None
                for n in range(5, len(history) + 1):
                    s.append(history[n - 1 : n])
                    built = build_context(history[:n], "gpt-4o", 1600, previous=built)
                    assert s.build(max_input_tokens=1600).to_openai() == built.to_openai()


def _summarised_both_ways(history: list[Message], url: str, budget: int) -> tuple[Any, Any]:
    direct = build_context(history, "gpt-4o", budget, summarizer="offline")
    sid = f"one-path-sum-{uuid.uuid4().hex[:8]}"
    with ctxwarden.Session(url, sid, summarizer="offline") as s:
        s.append(history)
        s.summarize_sync(max_input_tokens=budget)
        via_session = s.build(max_input_tokens=budget)
    return via_session.to_openai(), direct.to_openai()


def test_with_a_summariser_the_session_equals_build_context(
    locomo_path: Path, tmp_path: Path, pg_schema_url: str | None
) -> None:
    from ctxwarden_bench.traces import load_locomo, locomo_transcript

    chats = [locomo_transcript(c)[:160] for c in load_locomo(locomo_path)[:2]]
    for url in _store_urls(tmp_path, pg_schema_url):
        for history in chats:
            for budget in (1500, 4000):
                via_session, direct = _summarised_both_ways(history, url, budget)
                assert via_session == direct


def test_with_a_summariser_the_session_equals_build_context_on_tool_traces(
    tau: list[list[Message]], tmp_path: Path, pg_schema_url: str | None
) -> None:
    for url in _store_urls(tmp_path, pg_schema_url):
        for history in (tau[7], tau[19], tau[33]):
            for budget in (1500, 4000):
                via_session, direct = _summarised_both_ways(history, url, budget)
                assert via_session == direct


# -- user steps --------------------------------------------------------------------------------


def _tagged_history() -> list[Message]:
    return [
        Message.system("You are a support agent."),
        Message.user("My order is ORD-1."),
        Message.assistant("debug: cache miss on order lookup", meta={"tags": ["debug"]}),
        Message.assistant("Looking it up."),
        Message.user("Any news?"),
    ]


@pytest.mark.parametrize("how", ["python", "toml"])
def test_a_user_step_plugs_in_and_shows_in_the_audit(how: str) -> None:
    if how == "python":
        policy = Policy(steps=(DropTagged("debug"),))
    else:
        policy = Policy.from_toml(
            '[[steps]]\nuse = "ctxwarden.steps.drop_tagged:DropTagged"\ntag = "debug"\n'
        )
    history = _tagged_history()
    built = build_context(history, "gpt-4o", 2000, policy=policy)
    assert "debug: cache miss" not in json.dumps(built.to_openai())
    assert "drop_tagged" in built.audit.steps
    (action,) = [a for a in built.audit.actions if a.strategy == "drop_tagged"]
    assert (action.message_id, action.action) == (history[2].id, "dropped")
    plain = build_context(history, "gpt-4o", 2000)
    assert "debug: cache miss" in json.dumps(plain.to_openai())


def test_a_step_that_splits_a_pair_cannot_leave_an_orphan() -> None:
    history = [
        Message.system("sys"),
        Message.user("Check order ORD-7."),
        Message.assistant(None, tool_calls=(ToolCall("c1", "lookup", "{}"),), meta={"tags": ["x"]}),
        Message.tool('{"status": "shipped"}', tool_call_id="c1"),
        Message.assistant("It shipped."),
        Message.user("Thanks, and the refund?"),
    ]
    built = build_context(history, "gpt-4o", 2000, policy=Policy(steps=(DropTagged("x"),)))
    assert pairing_problems(list(built.messages)) == []
    assert any(a.action == "rejected" and "drop_tagged" in a.reason for a in built.audit.actions)


def test_bad_steps_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="is not a step"):
        Policy(steps=("nope",))
    with pytest.raises(ConfigError, match="cannot import step"):
        Policy.from_toml('[[steps]]\nuse = "no.such.module:Step"\n')
    with pytest.raises(ConfigError, match="module:attribute"):
        Policy.from_toml('[[steps]]\nuse = "nocolon"\n')


# -- pins and pairs (issue 11's reproductions) -------------------------------------------------


def _support_chat() -> list[dict[str, Any]]:
    h: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent."},
        {
            "role": "user",
            "content": "My account id is ACC-4471. Never forget it.",
            "ctxwarden": {"pinned": True},
        },
        {"role": "assistant", "content": "Noted."},
    ]
    for i in range(12):
        h.append(
            {
                "role": "user",
                "content": f"Question {i}: " + "please check the delivery status again " * 8,
            }
        )
        h.append(
            {
                "role": "assistant",
                "content": f"Answer {i}: " + "the parcel is on its way to you " * 8,
            }
        )
    h.append({"role": "user", "content": "What is my account id?"})
    return h


@pytest.mark.parametrize(
    "how",
    ["flag", "pin_first", "critical"],
)
def test_a_pinned_message_is_kept_when_the_budget_holds_it(how: str) -> None:
    h = _support_chat()
    policy = Policy()
    if how == "pin_first":
        del h[1]["ctxwarden"]
        policy = Policy(window=WindowConfig(pin_first=2))
    elif how == "critical":
        h[1]["ctxwarden"] = {"priority": "critical"}
    b = build_context(h, max_input_tokens=800, policy=policy)
    assert "ACC-4471" in json.dumps(b.to_openai())
    assert b.input_tokens <= 800
    assert not [a for a in b.audit.actions if a.message_id == "m1"]
    again = build_context(h, max_input_tokens=800, policy=policy, previous=b)
    assert again.to_openai() == b.to_openai()


def _parallel_calls(extra_turns: int = 6) -> list[Message]:
    h = [
        Message.system("You are an agent."),
        Message.user("Look up both orders."),
        Message.assistant(
            None,
            tool_calls=(
                ToolCall("c1", "lookup", '{"id": 1}'),
                ToolCall("c2", "lookup", '{"id": 2}'),
            ),
            priority="high",
        ),
        Message.tool('{"order": 1, "status": "shipped"}', tool_call_id="c1", pinned=True),
        Message.tool('{"order": 2, "status": "held"}', tool_call_id="c2"),
    ]
    for i in range(extra_turns):
        h.append(Message.user(f"Turn {i}: " + "what about the other thing " * 5))
        h.append(Message.assistant(f"Reply {i}: " + "here is the other thing " * 5))
    return h


def test_eviction_never_splits_a_call_from_its_results() -> None:
    h = _parallel_calls()
    for budget in range(60, 1201, 20):
        try:
            b = build_context(h, "gpt-4o", budget)
        except BudgetError as exc:
            assert exc.minimum is not None and exc.minimum > budget
            continue
        assert pairing_problems(list(b.messages)) == [], budget
        assert b.input_tokens <= budget


def test_the_newest_call_block_is_kept() -> None:
    h = [
        Message.system("Policy. " * 100),
        *[
            m
            for i in range(8)
            for m in (Message.user(f"Q{i} " * 40), Message.assistant(f"A{i} " * 40))
        ],
        Message.user("Find flight UA123."),
        Message.assistant(None, tool_calls=(ToolCall("c9", "search", '{"q": "UA123"}'),)),
        Message.tool('{"flight": "UA123", "seats": 4}', tool_call_id="c9"),
    ]
    for budget in (260, 300, 400, 800):
        b = build_context(h, "gpt-4o", budget)
        ids = {m.id for m in b.messages}
        assert {h[-3].id, h[-2].id, h[-1].id} <= ids, budget
        assert b.input_tokens <= budget


def test_layers_that_do_not_fit_are_cut_or_left_out_with_a_warning() -> None:
    h = [Message.system("sys"), Message.user("hello there")]
    big = "fact: " + "value " * 400
    b = build_context(h, "gpt-4o", 120, facts=big, summary="summary " * 300)
    assert b.input_tokens <= 120
    assert any("layer" in w and ("left out" in w or "cut" in w) for w in b.audit.warnings)
    # many lines: the newest that fit are shown, within the layer's share
    lines = "Summary:\n" + "\n".join(f"- event {i} on day {i}" for i in range(300))
    history = [Message.system("sys"), *[Message.user(f"turn {i}") for i in range(30)]]
    b = build_context(history, "gpt-4o", 1000, summary=lines)
    shown = next(m.text for m in b.messages if m.id == "ctxwarden:summary")
    assert shown.startswith("Summary:") and shown.endswith("- event 299 on day 299")
    assert b.audit.layers["summary"] <= 0.35 * 1000
    assert b.audit.layers["current"] > 0 and b.input_tokens <= 1000


def test_hundreds_of_facts_leave_room_for_the_conversation() -> None:
    h = [{"role": "system", "content": "You are an assistant."}]
    for i in range(200):
        h.append({"role": "user", "content": f"Update {i}: the shipment code is SHP-{1000 + i}."})
        h.append({"role": "assistant", "content": f"Noted update {i}."})
    b = build_context(h, max_input_tokens=2000, summarizer="offline")
    assert b.input_tokens <= 2000
    assert len(b.state.layers.facts) >= 100  # the record keeps every fact
    assert 0 < b.audit.layers["facts"] <= 0.2 * 2000
    assert b.audit.layers["window"] + b.audit.layers["current"] > 100
    assert any("most recent of" in w for w in b.audit.warnings)
    assert "SHP-1199" in json.dumps(b.to_openai())


def test_a_budget_below_the_system_prompt_names_the_minimum() -> None:
    h = [Message.system("sys " * 200), Message.user("hi")]
    with pytest.raises(BudgetError, match="at least") as info:
        build_context(h, "gpt-4o", 50)
    assert info.value.minimum is not None and info.value.minimum > 50


def test_messages_to_openai_is_the_wire_form() -> None:
    b = build_context(_tagged_history(), "gpt-4o", 2000)
    assert b.to_openai() == messages_to_openai(b.messages)


def test_a_newest_call_too_big_to_fit_is_sent_with_its_arguments_cut() -> None:
    """A call whose own arguments outgrow the budget (a heredoc writing a file) is sent
    with them cut, still a JSON object, beside the result it asked for: without it the
    model sees neither and writes the file again."""
    heredoc = json.dumps({"command": "cat > big.py <<'EOF'\n" + "x = 1\n" * 3000 + "EOF"})
    h = [
        Message.system("You are a coding agent."),
        Message.user("Write big.py."),
        Message.assistant(None, tool_calls=(ToolCall("c1", "bash", heredoc),)),
        Message.tool("<returncode>0</returncode><output></output>", tool_call_id="c1"),
    ]
    built = build_context(h, "gpt-4o", 1000)
    assert built.input_tokens <= 1000
    assert [m.id for m in built.messages] == [m.id for m in h]
    call = built.messages[2].tool_calls[0]
    assert (call.id, call.name) == ("c1", "bash") and len(call.arguments) < len(heredoc)
    assert json.loads(call.arguments)["command"].startswith("cat > big.py <<'EOF'\nx = 1\n")
    assert built.messages[3].text == h[3].text  # the result it asked for, whole
    cut = [a for a in built.audit.actions if a.message_id == h[2].id]
    assert [(a.action, a.strategy) for a in cut] == [("truncated", "priority")]
    assert any("arguments of newest tool call" in w for w in built.audit.warnings)
    assert not any(w.startswith("newest tool call") for w in built.audit.warnings)
    assert pairing_problems(list(built.messages)) == []
    _system, sent = built.to_anthropic()  # the cut input is still an object for Anthropic
    use = next(
        b for m in sent for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_use"
    )
    assert use["input"] == json.loads(call.arguments)


def test_a_newest_call_that_cannot_fit_even_cut_is_dropped_loudly_not_an_error() -> None:
    """When even the call's cut arguments leave no room for the block, it is dropped
    whole with a warning; the request stays."""
    h = [
        Message.system("You are a coding agent. " + "Follow the house rules. " * 40),
        Message.user("Write big.py."),
        Message.assistant(
            None, tool_calls=(ToolCall("c1", "bash", json.dumps({"command": "x" * 4000})),)
        ),
        Message.tool(
            "<returncode>0</returncode><output>" + "ok " * 50 + "</output>", tool_call_id="c1"
        ),
    ]
    count = TokenCounter.for_model("gpt-4o").count_message
    budget = count(h[0]) + count(h[1]) + 12
    built = build_context(h, "gpt-4o", budget)
    assert built.input_tokens <= budget
    assert [m.id for m in built.messages] == [h[0].id, h[1].id]
    assert any(
        w.startswith("newest tool call c1") or w.startswith(f"newest tool call {h[2].id}")
        for w in built.audit.warnings
    )
    assert pairing_problems(list(built.messages)) == []


def test_the_ledger_takes_back_the_room_a_cut_call_left(tau: list[list[Message]]) -> None:
    """tau-bench dev run 38 at 1,600 tokens (a 1,252-token system prompt): the newest
    ``book_reservation`` is 300 tokens of arguments. The ledger is cut to nothing to make
    room; the call's arguments are then cut, and the ledger takes back what is left, so
    the model sees its call, the error it got, and the values of the run."""
    run, loop = tau[38], None
    for k in range(1, 33):  # the agent loop: a build before every assistant message
        if run[k].role == "assistant":
            loop = build_context(run[:k], "gpt-4o", 1600, previous=loop)
    assert loop is not None
    sent = list(loop.messages)
    assert sent[-1].id == run[31].id and sent[-2].id == run[30].id  # the call and its result
    assert json.loads(sent[-2].tool_calls[0].arguments)["user_id"] == "mohamed_silva_9265"
    assert loop.audit.layers["ledger"] > 0 and loop.input_tokens <= 1600
    assert any("rendered again" in w for w in loop.audit.warnings)


def _one_command(task: str, thought: str, command: str, output: str) -> list[Message]:
    """A coding agent's first turn: its task, its reasoning beside one bash command, the
    command's output."""
    call = ToolCall("c1", "bash", json.dumps({"command": command}))
    return [
        Message.system("You are a coding agent."),
        Message.user(task),
        Message.assistant(thought, tool_calls=(call,)),
        Message.tool(output, tool_call_id="c1"),
    ]


def test_a_newest_call_whose_own_text_outgrows_the_budget_keeps_the_call_and_its_result() -> None:
    """A coding agent's long reasoning beside a short command (swebench-mini dev: a
    3,000-token thought before a 20-token ``sed``): the text is cut head and tail, the
    call and the result it asked for stay, where the whole block used to be dropped."""
    thought = "THOUGHT: Let me look at the handler first. " + " ".join(
        f"Step {i}: the middleware chain may skip handler_{i} when MiddlewareNotUsed is raised."
        for i in range(300)
    )
    h = _one_command(
        "Fix the middleware bug in django/core/handlers/base.py.",
        thought,
        "sed -n '97,140p' django/core/handlers/base.py",
        "    97  def load_middleware(self, is_async=False):",
    )
    built = build_context(h, "gpt-4o", 1000)
    assert built.input_tokens <= 1000
    call = next(m for m in built.messages if m.tool_calls)
    assert call.tool_calls == h[2].tool_calls  # the call whole
    assert call.text.startswith("THOUGHT: Let me look at the handler first.")
    assert len(call.text) < len(thought) and "cut" in call.text
    assert any(m.text == h[3].text for m in built.messages)  # its result whole
    cut = [a for a in built.audit.actions if a.message_id == h[2].id]
    assert [a.action for a in cut] == ["truncated"] and cut[0].tokens_after < cut[0].tokens_before
    assert not any(w.startswith("newest tool call") for w in built.audit.warnings)
    assert any("text of newest tool call" in w for w in built.audit.warnings)
    assert pairing_problems(list(built.messages)) == []


@pytest.mark.slow
def test_no_default_build_of_the_dev_traces_drops_the_newest_call_block(
    tau: list[list[Message]],
) -> None:
    """The bench's "newest dropped" column, on the dev traces where it was not 0: tau-bench
    at 1,600 tokens (3 builds: a 300-token call beside a 1,252-token system prompt) and the
    swebench-mini run whose 3,745-token task leaves 141 tokens at 4,000 (4 builds). And the
    tau-bench row's retention at 1,600 tokens, issue 39's target (>= .98): .9812 (.9750
    before the ledger ranked up the fields the agent passes)."""
    from conftest import SHARED_DATA

    from ctxwarden_bench.retention import engine_builder
    from ctxwarden_bench.swebench import load_swebench, swebench_retention
    from ctxwarden_bench.traces import tau_retention

    tau_row = tau_retention(tau, 1600, engine_builder())
    assert (tau_row.newest_dropped, tau_row.violations, tau_row.over_budget) == (0, 0, 0)
    assert tau_row.retention >= 0.98
    swebench = SHARED_DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"
    if swebench.exists():
        run = load_swebench(swebench)[24]
        coding = swebench_retention([run], 4000, engine_builder())
        assert (coding.newest_dropped, coding.violations, coding.over_budget) == (0, 0, 0)


def test_the_newest_calls_cut_prose_lists_the_names_it_cut() -> None:
    """The newest call's text, cut head and tail to fit, lists the paths and names of its
    cut middle, as a cut result does, in the room the cut leaves: the next command reuses
    what the reasoning settled on (swebench-mini dev @4,000, responses-client runs:
    retention .9619 -> .9643; the cut is no longer, the block fits the same budget)."""
    middle = " ".join(f"Step {i}: the handler may skip it." for i in range(200))
    thought = (
        "THOUGHT: Let me look at the handler first. "
        + middle
        + " The fix belongs in django/core/handlers/exception.py at convert_exception_to_response. "
        + middle
        + " So I read the file."
    )
    h = _one_command(
        "Fix the middleware bug.",
        thought,
        "sed -n '1,40p' django/core/handlers/base.py",
        "    1  def load_middleware(self, is_async=False):",
    )
    built = build_context(h, "gpt-4o", 1000)
    assert built.input_tokens <= 1000
    call = next(m for m in built.messages if m.tool_calls)
    assert call.tool_calls == h[2].tool_calls and len(call.text) < len(thought)
    head, _, listing = call.text.rpartition("\n[values in the cut part: ")
    assert "django/core/handlers/exception.py" not in head  # cut from the prose ...
    assert "django/core/handlers/exception.py" in listing  # ... and listed after it
    assert "convert_exception_to_response" in listing
    assert "django/core/handlers/base.py" not in listing  # the call's own, shown whole
    off = Policy.from_toml("[truncate]\ncut_values_tokens = 0\n")
    plain = next(m for m in build_context(h, "gpt-4o", 1000, policy=off).messages if m.tool_calls)
    assert "values in the cut part" not in plain.text and len(plain.text) < len(thought)


def test_the_newest_calls_prose_beside_a_thinking_block_is_cut_the_block_kept() -> None:
    """The newest call's text is cut the same when it is one text part beside other parts
    (a signed thinking block, a reasoning item): the text part cut, the others as they came."""
    from ctxwarden.core.messages import RawPart, TextPart

    thinking = RawPart({"type": "thinking", "thinking": "Plan the read.", "signature": "sig"})
    prose = "THOUGHT: the handler may skip middleware. " * 200
    h = [
        Message.system("You are a coding agent."),
        Message.user("Fix the middleware bug."),
        Message.assistant(
            (thinking, TextPart(prose)),
            tool_calls=(ToolCall("c1", "bash", json.dumps({"command": "sed -n 1,9p base.py"})),),
        ),
        Message.tool("    1  def load_middleware(self):", tool_call_id="c1"),
    ]
    built = build_context(h, "gpt-4o", 600)
    assert built.input_tokens <= 600
    call = next(m for m in built.messages if m.tool_calls)
    assert call.tool_calls == h[2].tool_calls and isinstance(call.content, tuple)
    assert call.content[0] == thinking
    assert isinstance(call.content[1], TextPart) and len(call.content[1].text) < len(prose)
    assert call.content[1].text.startswith("THOUGHT: the handler may skip middleware.")
    assert any(m.text == h[3].text for m in built.messages)
