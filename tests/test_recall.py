"""Reversible compression and relevance recall: handles, the recall tool, recall from
memory and from SQLite / PostgreSQL byte for byte, and the BM25 recall step."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from hypothesis import given
from hypothesis import strategies as st
from service_harness import db_url

from ctxwarden import Message, Policy, Session, ToolCall, build_context, recall, recall_tool
from ctxwarden.core.errors import ConfigError, UnknownHandleError
from ctxwarden.core.handles import handle_for, message_id_of
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import message_to_openai
from ctxwarden.session.recall import RECALL_TOOL_NAME, original_content, recall_arguments
from ctxwarden.steps.memos import memo_of
from ctxwarden.steps.recall_gate import (
    FULL_AT,
    MAX_TOOL_SHARE,
    named_only_there,
    tool_share,
    words_of,
)
from ctxwarden.steps.recall_relevant import RECALL_HEADING, RECALL_ID, RecallMemo, RecallRelevant
from ctxwarden.steps.state import BuildState
from ctxwarden.store.service_tables import list_builds

SWEBENCH = SHARED_DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"
__all__ = ["db_url"]  # the fixture (SQLite, or a fresh PostgreSQL schema), for pytest
HANDLE = re.compile(r"cw:msg:[\w:.-]+")


@pytest.fixture(scope="module")
def swebench_run() -> list[Message]:
    if not SWEBENCH.exists():
        pytest.skip(f"swebench-mini data not found at {SWEBENCH} (set CTXWARDEN_DATA)")
    from ctxwarden_bench.swebench import load_swebench

    # a run where a masked result is needed later (with cache-aware compaction, issue 37,
    # run 5 keeps what its later commands use: no longer such a run)
    return load_swebench(SWEBENCH)[12]


# -- handles and the tool definition ---------------------------------------------------------


def test_handles_round_trip_and_malformed_ones_are_named() -> None:
    assert handle_for("m12") == "cw:msg:m12"
    assert message_id_of(" 'cw:msg:m12' ") == "m12"
    for bad in ("m12", "cw:msg:", "", "msg:12"):
        with pytest.raises(UnknownHandleError, match="cw:msg:<message id>"):
            message_id_of(bad)


def test_recall_tool_in_both_shapes() -> None:
    openai = recall_tool()
    assert openai["type"] == "function" and openai["function"]["name"] == RECALL_TOOL_NAME
    assert openai["function"]["parameters"]["required"] == ["handle"]
    anthropic = recall_tool("anthropic")
    assert anthropic["name"] == RECALL_TOOL_NAME
    assert anthropic["input_schema"] == openai["function"]["parameters"]
    openai["function"]["parameters"]["required"].append("x")  # a copy: the next is intact
    assert recall_tool()["function"]["parameters"]["required"] == ["handle"]
    with pytest.raises(ValueError, match="shape"):
        recall_tool("gemini")  # type: ignore[arg-type]
    assert recall_arguments('{"handle": "cw:msg:m3"}') == "cw:msg:m3"
    with pytest.raises(UnknownHandleError):
        recall_arguments('{"id": 3}')


# -- placeholders and markers carry handles, the same at every turn ----------------------------


def _agent(n: int, size: int = 400) -> list[Message]:
    out = [Message.system("You are a coding agent."), Message.user("Fix the failing test.")]
    for i in range(n):
        cmd = json.dumps({"command": f"cat src/module_{i}.py"})
        out.append(Message.assistant(tool_calls=(ToolCall(f"c{i}", "bash", cmd),), id=f"a{i}"))
        body = "\n".join(
            f"def function_{i}_{j}(value): return value + {j}" for j in range(size // 12)
        )
        out.append(Message.tool(body, f"c{i}", name="bash", id=f"t{i}"))
    return out


def test_masked_and_truncated_results_name_their_handle_stably() -> None:
    history = _agent(12, size=900)
    first = build_context(history, max_input_tokens=6000)
    more = [*history, Message.assistant("next", id="x2")]
    second = build_context(more, max_input_tokens=6000, previous=first)
    shown = {m.id: m.text for m in first.messages if HANDLE.search(m.text)}
    assert shown, "some result was masked or truncated"
    for mid, text in shown.items():
        if first.layers[mid] != "recall":
            assert handle_for(mid) in text
    again = {m.id: m.text for m in second.messages}
    assert all(again[mid] == text for mid, text in shown.items() if mid in again)


def test_a_cut_json_result_stays_json_with_its_handle() -> None:
    rows = {"files": [{"id": f"r-{i}", "path": f"src/f_{i}.py", "n": i} for i in range(300)]}
    history = [
        Message.system("agent"),
        Message.user("list the files"),
        Message.assistant(tool_calls=(ToolCall("c1", "list_files", "{}"),)),
        Message.tool(json.dumps(rows), "c1", id="big"),
    ]
    built = build_context(history, max_input_tokens=3000, policy=Policy(recall=None))
    cut = next(m for m in built.messages if m.id == "big")
    doc = json.loads(cut.text)
    assert doc["…full result"] == "cw:msg:big"


# -- recall: from the history in memory, and from a store ---------------------------------------


def test_recall_from_memory_returns_the_original_and_its_audit_entry() -> None:
    history = _agent(10, size=300)
    built = build_context(history, max_input_tokens=3000)
    masked = next(m for m in built.messages if m.meta.get("masked_from"))
    handle = HANDLE.search(masked.text).group(0)  # type: ignore[union-attr]
    got = recall(history, handle)
    original = next(m for m in history if m.id == masked.id)
    assert got.content.encode() == original.text.encode()
    assert got.action.action == "recalled" and got.action.tokens_after == got.tokens > 0
    dicts = [message_to_openai(m, with_meta=True) for m in history]  # OpenAI dicts too
    assert recall(dicts, handle).content == original.text
    with pytest.raises(UnknownHandleError, match="no message with id 'nope'"):
        recall(history, "cw:msg:nope")


def test_a_recall_result_is_sent_whole_when_it_fits_and_cut_only_to_fit() -> None:
    """Truncating the original the model recalled would send it back to recall it again:
    the result of a recall call is not truncated; only the budget cuts it."""
    log = "\n".join(f"line {i}: step {i} ok, artifact-{i * 7}.tar" for i in range(300))
    call = ToolCall("r1", RECALL_TOOL_NAME, json.dumps({"handle": "cw:msg:m3"}))
    other = ToolCall("r2", "build_log", "{}")
    history = [
        Message.user("Which artifact did step 211 make?"),
        Message.assistant(None, (call,)),
        Message.tool(log, "r1"),  # a client's answer: no name, its call says what it is
        Message.assistant(None, (other,)),
        Message.tool(log, "r2"),
        # answered: the size threshold applies to r2 (a result not answered yet is kept
        # whole while it fits, issue 35)
        Message.assistant("Step 211 made artifact-1477.tar."),
    ]
    built = build_context(history, max_input_tokens=20_000)
    sent = {m.tool_call_id: m.text for m in built.messages if m.role == "tool"}
    assert sent["r1"] == log and sent["r2"] != log  # the plain result is cut as always
    assert [a.message_id for a in built.audit.actions if a.action == "truncated"] == [history[4].id]
    tight = build_context(history[:3], max_input_tokens=800)
    assert tight.input_tokens <= 800 and "artifact-7.tar" in tight.messages[-1].text


def _later_commands(history: list[Message], after: int) -> str:
    return " ".join(c.arguments for m in history[after:] for c in m.tool_calls)


def test_a_masked_result_needed_later_comes_back_byte_for_byte(
    db_url: str, swebench_run: list[Message]
) -> None:
    """A recorded coding-agent trace, built turn by turn in a session: a result masked in
    the context holds a path a later command uses and the context lacks; the recall
    tool's handle gives it back byte for byte, and the recall is audited."""
    sid = f"recall-{uuid.uuid4().hex[:8]}"
    run = swebench_run
    case: tuple[str, Message, str] | None = None
    with Session(db_url, sid) as s:
        appended = 0
        for i, m in enumerate(run):
            if not m.is_tool_call or i < 4:
                continue
            s.append(run[appended:i])
            appended = i
            built = s.build(max_input_tokens=4000)
            context = "\n".join(x.text for x in built.messages)
            for x in built.messages:
                if not x.meta.get("masked_from"):
                    continue
                original = run[int(x.id[1:])]
                later = _later_commands(run, i)
                needed = [
                    t
                    for t in set(re.findall(r"[\w./-]{8,}", original.text))
                    if t in later and t not in context
                ]
                if needed:
                    case = (HANDLE.search(x.text).group(0), original, needed[0])  # type: ignore[union-attr]
                    break
            if case:
                break
        assert case is not None, "the trace has a masked result needed later"
        handle, original, token = case
        got = s.recall(handle)
        assert got.content.encode("utf-8") == original.text.encode("utf-8")
        assert token in got.content and got.seq == int(original.id[1:])
        audits = [b for b in list_builds(s.store, "default", sid) if b.status == "recalled"]
        assert [a.audit["recalled"][0]["handle"] for a in audits] == [handle]
        with pytest.raises(UnknownHandleError):
            s.recall("cw:msg:m999999")
        assert len([b for b in list_builds(s.store, "default", sid) if b.status == "recalled"]) == 1


def test_a_session_recalls_explicit_ids_too(db_url: str) -> None:
    text = "line one\r\nline two\ttabbed \u00e9\U0001f600 \\n not a newline\n"
    with Session(db_url, f"ids-{uuid.uuid4().hex[:8]}") as s:
        s.append([{"role": "user", "content": "hi"}, Message.assistant(text, id="note-7")])
        assert s.recall("cw:msg:note-7").content == text
        assert s.recall("cw:msg:m0").content == "hi"


# -- the recall step --------------------------------------------------------------------------


def _chat(question: str) -> list[Message]:
    out = [Message.system("You are a travel assistant.")]
    topics = ["the weather", "a museum", "dinner plans", "a train strike", "a concert"]
    for i in range(60):
        out.append(Message.user(f"Tell me about {topics[i % 5]} on day {i}.", id=f"u{i}"))
        out.append(Message.assistant(f"On day {i} {topics[i % 5]} was fine. " * 6, id=f"r{i}"))
    out[10] = Message.assistant("Your booking code for the Lisbon ferry is FERRY-8812.", id="r4")
    out.append(Message.user(question, id="q"))
    return out


ALWAYS = Policy(recall=RecallRelevant(only_summarized=False))


def test_the_recall_step_brings_back_the_relevant_dropped_message() -> None:
    history = _chat("What was my booking code for the Lisbon ferry?")
    built = build_context(history, max_input_tokens=1200, policy=ALWAYS)
    assert "r4" not in {m.id for m in built.messages}
    block = next(m for m in built.messages if m.id == RECALL_ID)
    assert block.text.startswith(RECALL_HEADING)
    assert (
        "[cw:msg:r4 assistant] Your booking code for the Lisbon ferry is FERRY-8812." in block.text
    )
    assert built.layers[RECALL_ID] == "recall"
    assert [a.message_id for a in built.audit.by_action("recalled")][:1] == ["r4"]
    assert built.audit.input_tokens <= 1200
    off = build_context(history, max_input_tokens=1200, policy=Policy(recall=None))
    assert "Lisbon ferry is FERRY-8812" not in "\n".join(m.text for m in off.messages)


def test_the_recall_layer_is_stable_for_an_unchanged_query_and_pure() -> None:
    history = _chat("What was my booking code for the Lisbon ferry?")
    first = build_context(history, max_input_tokens=1200, policy=ALWAYS)
    loop = [*history, Message.assistant("Let me look.", id="x1")]
    second = build_context(loop, max_input_tokens=1200, previous=first, policy=ALWAYS)
    block = {m.id: m.text for m in first.messages}[RECALL_ID]
    assert {m.id: m.text for m in second.messages}[RECALL_ID] == block
    # the memo carried in the state gives what a cold recompute gives
    restored = BuildState.from_dict(json.loads(json.dumps(first.state.to_dict())))
    assert memo_of(restored, "recall", RecallMemo) == memo_of(first.state, "recall", RecallMemo)
    cold = build_context(loop, max_input_tokens=1200, previous=None, policy=ALWAYS)
    warm = build_context(loop, max_input_tokens=1200, previous=restored, policy=ALWAYS)
    assert {m.id: m.text for m in cold.messages}[RECALL_ID] == block
    assert {m.id: m.text for m in warm.messages}[RECALL_ID] == block


def test_by_default_a_chat_recalls_what_its_question_names_and_an_agent_loop_does_not() -> None:
    """The default policy decides from the conversation (steps.recall_gate): a chat whose
    question names what only the dropped history holds recalls it; the same chat asking
    about what the window shows, and an agent loop, recall nothing."""
    history = _chat("What was my booking code for the Lisbon ferry?")
    default = build_context(history, max_input_tokens=1200)
    block = next(m.text for m in default.messages if m.id == RECALL_ID)
    assert "[cw:msg:r4 assistant] Your booking code for the Lisbon ferry is FERRY-8812." in block
    assert default.audit.input_tokens <= 1200
    order = [default.layers[m.id] for m in default.messages]
    assert order.index("recall") == order.index("current") - 1  # right before the question
    shown = build_context(_chat("Tell me about a concert on day 59."), max_input_tokens=1200)
    assert RECALL_ID not in shown.layers and not shown.audit.by_action("recalled")
    loop = _agent_loop("What was my booking code for the Lisbon ferry?")
    assert tool_share(loop[-12:]) > MAX_TOOL_SHARE
    built = build_context(loop, max_input_tokens=1200)
    assert RECALL_ID not in built.layers and not built.audit.by_action("recalled")


def _agent_loop(question: str) -> list[Message]:
    """The chat of :func:`_chat`, then tool rounds whose results fill the window."""
    out = _chat(question)
    for i in range(20):
        call = ToolCall(f"c{i}", "lookup", json.dumps({"day": i}))
        out.append(Message.assistant("", tool_calls=[call], id=f"a{i}"))
        rows = json.dumps({"day": i, "rows": [f"row {i}.{k}" for k in range(8)]})
        out.append(Message.tool(rows, f"c{i}", id=f"t{i}"))
    return out


_GATE_WORDS = ["ferry", "ferryboat", "Ferry,", "boat", "the", "ab", "x9y", "Lisbon", "lisbon."]


def test_the_gate_reads_the_shape_and_the_names() -> None:
    assert named_only_there("the Lisbon ferry code", ["a concert"], ["Lisbon ferry FERRY"]) == 2
    assert named_only_there("the Lisbon ferry code", ["Lisbon ferry"], ["Lisbon ferry"]) == 0
    assert named_only_there("what did we say?", [], ["anything said"]) == 0  # stop words only
    chat = [Message.user("hello there friend"), Message.assistant("hi, how can I help")]
    assert tool_share(chat) == 0.0
    assert tool_share(_agent_loop("x")[-10:]) > MAX_TOOL_SHARE


def test_a_shown_text_clears_only_whole_words_it_holds() -> None:
    # "ferry" inside "ferryboat" is not the word: the text is split, and the word stays
    # asked; a text holding no asked word at all (not even inside another) clears none
    assert named_only_there("ferry times", ["the ferryboat"], ["ferry at 9"]) == 1
    assert named_only_there("ferry times", ["the ferry"], ["ferry at 9, times"]) == 1
    assert named_only_there("ferry times", ["Ferry! TIMES."], ["ferry times"]) == 0


@given(
    st.lists(st.sampled_from(_GATE_WORDS), min_size=1, max_size=6).map(" ".join),
    st.lists(st.lists(st.sampled_from(_GATE_WORDS), max_size=8).map(" ".join), max_size=6),
    st.lists(st.lists(st.sampled_from(_GATE_WORDS), max_size=8).map(" ".join), max_size=6),
)
def test_the_gate_counts_as_splitting_every_shown_text_would(
    query: str, shown: list[str], dropped: list[str]
) -> None:
    asked = words_of(query)
    for text in shown:
        asked -= words_of(text)
    found = {w for w in asked if any(w in d.lower() for d in dropped)}
    # the scan stops once FULL_AT words are found: the gate reads no more than that
    assert min(named_only_there(query, shown, dropped), FULL_AT) == min(len(found), FULL_AT)


def test_the_step_can_wait_for_a_summary() -> None:
    history = _chat("What was my booking code for the Lisbon ferry?")
    assert RECALL_ID not in build_context(history, max_input_tokens=1200, policy=OFF).layers
    waiting = Policy(recall=RecallRelevant(only_summarized=True))
    assert RECALL_ID not in build_context(history, max_input_tokens=1200, policy=waiting).layers
    assert (
        build_context(history, max_input_tokens=1200, policy=waiting).state.memos.get("recall")
        is None
    )
    summarised = build_context(history, "gpt-4o", 1500, summarizer="offline", policy=waiting)
    assert (
        memo_of(summarised.state, "recall", RecallMemo) is not None
    )  # the step ran: the build keeps a summary
    # (the summary's view quotes the ferry's line, so the block does not repeat it: below)
    given = build_context(
        history, max_input_tokens=1500, summary="Earlier: travel.", policy=waiting
    )
    assert given.audit.by_action("recalled")
    order = [given.layers[m.id] for m in given.messages]
    assert order.index("recall") == order.index("current") - 1  # right before the question


OFF = Policy(recall=None)


def test_the_block_does_not_repeat_what_the_summary_shows() -> None:
    """A passage whose every word the layers already show (a sentence the summary's view
    quotes) gives its room to the next one; the same build with a summary that does not
    quote it recalls it."""
    history = _chat("What was my booking code for the Lisbon ferry?")
    line = "Your booking code for the Lisbon ferry is FERRY-8812."
    summarised = build_context(history, "gpt-4o", 1500, summarizer="offline", policy=ALWAYS)
    summary = next(m.text for m in summarised.messages if m.id == "ctxwarden:summary")
    assert line in summary
    assert "\n".join(m.text for m in summarised.messages).count(line) == 1
    assert "r4" not in {a.message_id for a in summarised.audit.by_action("recalled")}
    given = build_context(history, max_input_tokens=1500, summary="Earlier: travel.", policy=ALWAYS)
    block = next(m.text for m in given.messages if m.id == RECALL_ID)
    assert f"[cw:msg:r4 assistant] {line}" in block


def test_the_recall_step_is_configured_from_toml_and_checked() -> None:
    policy = Policy.from_toml("[recall]\nshare = 0.2\nmax_tokens = 300\n")
    assert policy.recall == RecallRelevant(share=0.2, max_tokens=300)
    assert Policy.from_toml("recall = false\n").recall is None
    assert Policy.from_toml("recall = true\n").recall == RecallRelevant()
    assert Policy().recall == RecallRelevant(auto=True)  # the conversation decides
    assert Policy.from_toml("recall_tool = true\n").recall_tool is True
    with pytest.raises(ConfigError, match=r"recall.share must be in \(0, 0.5\]"):
        Policy.from_toml("[recall]\nshare = 0.9\n")
    with pytest.raises(ConfigError, match="unknown key"):
        Policy.from_toml("[recall]\nsize = 3\n")


def test_without_the_extra_the_step_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ctxwarden.core.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    history = _chat("What was my booking code for the Lisbon ferry?")
    with pytest.raises(MissingDependencyError, match=r"ctxwarden\[recall\]"):
        build_context(history, max_input_tokens=1200, policy=ALWAYS)


# -- the ledger names the messages that left the context ---------------------------------------


def _orders(n: int) -> list[Message]:
    """A support agent that looked up ``n`` orders for a user who gave an account id."""
    note = " ".join(["the parcel left the depot"] * 30)
    out = [
        Message.system("You are a support agent."),
        Message.user("Where are my orders? My account is acct_7731.", id="u0"),
    ]
    for i in range(n):
        call = ToolCall(f"c{i}", "get_order", json.dumps({"order_id": f"ORD-{1000 + i}"}))
        out.append(Message.assistant(tool_calls=(call,), id=f"a{i}"))
        body = {"order_id": f"ORD-{1000 + i}", "weight_g": 1200 + 37 * i, "note": note}
        out.append(Message.tool(json.dumps(body), f"c{i}", id=f"t{i}"))
    out.append(Message.user("Thanks. When did the first one ship?", id="u1"))
    return out


def _ledger_of(built: object) -> str:
    return next(m.text for m in built.messages if m.id == "ctxwarden:ledger")  # type: ignore[attr-defined]


def test_a_dropped_message_is_named_in_the_ledger_and_comes_back_byte_for_byte() -> None:
    history = _orders(30)
    built = build_context(history, max_input_tokens=1000)
    sent = {m.id for m in built.messages}
    assert "u0" not in sent, "the user's first message left"
    ledger = _ledger_of(built)
    # values are followed by the handle of the message they came from, in place of the
    # plain numbers ("weight_g": 1237) the block would show last
    named = re.findall(r"(ORD-\d+|acct_7731) \((cw:msg:[\w-]+)\)", ledger)
    ids = {m.id for m in history}
    assert named and all(message_id_of(h) in ids - sent for _, h in named), ledger
    for value, handle in named:
        got = recall(history, handle)
        original = next(m for m in history if m.id == message_id_of(handle))
        assert got.content.encode() == original_content(original).encode()
        assert value in got.content  # a tool call's arguments, or the user's words
    # a masked result still in the context shows its own handle, not a second one here
    edited = {m.id for m in built.messages if HANDLE.search(m.text) and m.role == "tool"}
    assert not edited & {message_id_of(h) for _, h in named}


def test_a_session_recalls_a_message_the_ledger_names(db_url: str) -> None:
    history = _orders(30)
    with Session(db_url, f"ledger-{uuid.uuid4().hex[:8]}") as s:
        s.append(history)
        ledger = _ledger_of(s.build(max_input_tokens=1000))
        found = re.search(r"(ORD-\d+|acct_7731) \((cw:msg:([\w-]+))\)", ledger)
        assert found is not None, ledger
        got = s.recall(found.group(2))
        original = next(m for m in history if m.id == found.group(3))
        assert got.content.encode("utf-8") == original_content(original).encode("utf-8")
        assert found.group(1) in got.content


def test_under_a_tight_budget_no_handle_displaces_a_value() -> None:
    """Handles only take the place of plain numbers: a block cut for room shows the
    same ids with or without them, and no more tokens."""
    from ctxwarden.memory.entities import Entity
    from ctxwarden.memory.entity_ledger import EntityLedger

    count = TokenCounter.for_model("gpt-4o").count_text
    ledger = EntityLedger().add(
        [Entity(f"ORD-{i}", "order_id", f"t{i}", "id") for i in range(40)]
        + [Entity(str(1990 + i), "year", f"t{i}", "number") for i in range(6)]
    )
    plain = ledger.render(60, count)
    named = ledger.render(60, count, placed=frozenset())
    ids = re.compile(r"ORD-\d+")
    assert ids.findall(named) == ids.findall(plain) and count(named) <= 60
    roomy = ledger.render(2000, count, placed=frozenset({"t3"}))
    assert "ORD-0 (cw:msg:t0)" in roomy and "cw:msg:t3" not in roomy  # t3 shows its own
    assert "1990" not in roomy  # a year gave its place to a handle
    assert count(roomy) <= count(ledger.render(2000, count))  # a handle never adds tokens
    assert "ORD-5" not in ledger.render(2000, count, skip={"ORD-5"}.__contains__)


def test_a_chat_session_recalls_what_build_context_recalls(tmp_path: Path) -> None:
    """A stored chat without a summary reads the recall's sources before its slice, so a
    session built turn by turn sends what build_context sends, recall block included;
    an agent loop's session reads no more than before and recalls nothing."""
    from ctxwarden_bench.session_path import sent

    history = _chat("What was my booking code for the Lisbon ferry?")
    with Session(f"sqlite:///{tmp_path}/chat.db", "chat", model="gpt-4o") as s:
        s.append(history[:-1])
        s.build(max_input_tokens=1200)
        s.append(history[-1:])
        built = s.build(max_input_tokens=1200)
    first = build_context(history[:-1], max_input_tokens=1200)
    want = build_context(history, max_input_tokens=1200, previous=first)  # the same loop
    assert RECALL_ID in want.layers
    assert sent(built.messages) == sent(want.messages)
    loop = _agent_loop("What was my booking code for the Lisbon ferry?")
    with Session(f"sqlite:///{tmp_path}/loop.db", "loop", model="gpt-4o") as s:
        s.append(loop)
        built = s.build(max_input_tokens=1200)
    assert RECALL_ID not in built.layers
    assert sent(built.messages) == sent(build_context(loop, max_input_tokens=1200).messages)
