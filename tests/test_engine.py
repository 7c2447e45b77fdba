"""The context engine: invariants on random conversations, and its behaviours one by one."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxwarden
from ctxwarden.core.errors import BudgetError, ConfigError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.pairing import pairing_problems
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import message_to_openai
from ctxwarden.pipeline.engine import BuiltContext, build_context
from ctxwarden.pipeline.policy import Policy
from ctxwarden.steps.ledger import ledger_begin

COUNTER = TokenCounter.for_model("gpt-4o")
WORDS = ["flight", "HAT123", "booking", "ZFA04Y", "please", "2024-05-20", "Mia", "refund", "ok"]


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    text = st.tuples(st.integers(0, 40), st.integers(0, 10_000)).map(
        lambda t: " ".join(WORDS[(t[1] + i * 7) % len(WORDS)] for i in range(t[0]))
    )
    msgs = [Message.system("You are an airline agent. " + draw(text), id="sys")]
    turns = draw(st.integers(min_value=1, max_value=14))
    n = 0
    for _ in range(turns):
        n += 1
        msgs.append(Message.user(draw(text) or "hi", id=f"u{n}"))
        for _ in range(draw(st.integers(0, 3))):
            calls = draw(st.integers(1, 3))
            tool_calls = tuple(
                ToolCall(f"call_{draw(st.integers(0, 3))}", "lookup", json.dumps({"q": draw(text)}))
                for _ in range(calls)
            )
            n += 1
            msgs.append(Message.assistant(draw(st.none() | text), tool_calls, id=f"a{n}"))
            for call in tool_calls:
                n += 1
                size = draw(st.sampled_from([0, 5, 60, 900]))
                item = draw(text)
                body = (
                    json.dumps({"items": [f"{item} #{i}" for i in range(size // 5)]})
                    if size
                    else ""
                )
                msgs.append(Message.tool(body, call.id, name="lookup", id=f"t{n}"))
        if draw(st.booleans()):
            n += 1
            msgs.append(Message.assistant(draw(text) or "done", id=f"a{n}"))
    if draw(st.booleans()):  # end with the newest user message
        n += 1
        msgs.append(Message.user(draw(text) or "and now?", id=f"u{n}"))
    return msgs


def check_invariants(history: list[Message], built: BuiltContext, budget: int) -> None:
    sent = list(built.messages)
    assert COUNTER.count_messages(sent).tokens == built.input_tokens <= budget
    assert pairing_problems(sent) == []
    assert sent[0] == history[0]  # the system prompt, first and unchanged
    ids = [m.id for m in sent]
    assert len(ids) == len(set(ids))
    newest_user = [m for m in history if m.role == "user"][-1]
    assert newest_user in sent
    assert [m.id for m in sent if m.role == "user"] == sorted(
        (m.id for m in sent if m.role == "user"), key=[m.id for m in history].index
    )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(history=conversations(), budget=st.integers(min_value=60, max_value=3000))
def test_built_context_invariants(history: list[Message], budget: int) -> None:
    try:
        built = build_context(history, "gpt-4o", budget)
    except BudgetError as exc:
        assert exc.minimum is not None and exc.minimum > budget
        return
    check_invariants(history, built, budget)
    again = build_context(history, "gpt-4o", budget)
    assert again.to_openai() == built.to_openai()  # deterministic


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(history=conversations(), budget=st.integers(min_value=400, max_value=2500))
def test_invariants_hold_turn_by_turn_with_sticky_state(
    history: list[Message], budget: int
) -> None:
    previous = None
    for end in range(2, len(history) + 1):
        prefix = history[:end]
        if not any(m.role == "user" for m in prefix):
            continue
        try:
            built = build_context(prefix, "gpt-4o", budget, previous=previous)
        except BudgetError:
            previous = None
            continue
        check_invariants(prefix, built, budget)
        previous = built


def _agent_session(turns: int) -> list[Message]:
    msgs = [Message.system("You are a helpful booking agent.", id="sys")]
    for t in range(turns):
        msgs.append(Message.user(f"Turn {t}: please check reservation R{t:04d}X", id=f"u{t}"))
        call = ToolCall(f"c{t}", "get_reservation", json.dumps({"reservation_id": f"R{t:04d}X"}))
        msgs.append(Message.assistant(None, (call,), id=f"a{t}"))
        notes = "The passenger asked about seating and meals on this booking. " * 12
        body = {"reservation_id": f"R{t:04d}X", "status": "confirmed", "notes": notes}
        msgs.append(Message.tool(json.dumps(body), f"c{t}", name="get_reservation", id=f"t{t}"))
        msgs.append(Message.assistant(f"Reservation R{t:04d}X is confirmed.", id=f"r{t}"))
    return msgs


def test_dropped_identifiers_stay_in_the_ledger() -> None:
    history = _agent_session(30)
    built = build_context(history, "gpt-4o", 1500)
    text = "\n".join(m.text for m in built.messages)
    assert "R0000X" in text  # from the first turn, long gone from the window
    assert built.audit.layers["ledger"] > 0
    assert built.audit.by_action("dropped")
    assert built.layers["ctxwarden:ledger"] == "ledger"


def test_earlier_entities_reach_back_past_the_given_history() -> None:
    from ctxwarden.memory.entities import extract_entities
    from ctxwarden.memory.entity_ledger import EntityLedger

    older = _agent_session(3)
    earlier = EntityLedger().add(e for m in older for e in extract_entities(m))
    recent = [older[0], *_agent_session(30)[1 + 4 * 20 :]]  # system + turns 20..29
    without = build_context(recent, "gpt-4o", 1500)
    built = build_context(recent, "gpt-4o", 1500, earlier_entities=earlier)
    assert "R0001X" not in "\n".join(m.text for m in without.messages)
    assert "R0001X" in "\n".join(m.text for m in built.messages)
    assert built.input_tokens <= 1500


def test_sticky_window_gives_a_stable_prefix() -> None:
    history = _agent_session(50)
    previous = None
    hits = 0
    for end in range(8, len(history) + 1, 4):
        built = build_context(history[:end], "gpt-4o", 3000, previous=previous)
        if (
            previous is not None
            and built.audit.prefix_shared_tokens >= built.audit.cacheable_prefix_tokens
        ):
            hits += 1
        previous = built
    assert hits >= 0.7 * (len(range(8, len(history) + 1, 4)) - 1)


def test_budget_too_small_names_the_minimum() -> None:
    history = [Message.system("x " * 500), Message.user("hello")]
    with pytest.raises(BudgetError, match=r"budget must be at least [\d,]+ tokens") as info:
        build_context(history, "gpt-4o", 100)
    assert info.value.minimum is not None and info.value.minimum > 100


def test_orphan_tool_results_are_reported_not_sent() -> None:
    history = [
        Message.system("sys"),
        Message.user("hi", id="u1"),
        Message.tool("stray result", "nope", id="orphan"),
        Message.user("again", id="u2"),
    ]
    built = build_context(history, "gpt-4o", 1000)
    assert "orphan" not in [m.id for m in built.messages]
    rejected = built.audit.by_action("rejected")
    assert [a.message_id for a in rejected] == ["orphan"]
    assert "no matching tool call" in rejected[0].reason


def test_pending_tool_call_is_not_sent() -> None:
    call = ToolCall("c1", "lookup", "{}")
    history = [Message.system("sys"), Message.user("hi"), Message.assistant(None, (call,), id="a1")]
    built = build_context(history, "gpt-4o", 1000)
    assert "a1" not in [m.id for m in built.messages]


def test_large_tool_results_are_truncated_and_old_ones_masked() -> None:
    history = _agent_session(14)
    big = json.dumps(
        {"flights": [{"flight_number": f"HAT{i:03d}", "price": 100 + i} for i in range(300)]}
    )
    history[3] = Message.tool(big, "c0", name="get_reservation", id="t0")
    built = build_context(history, "gpt-4o", 50_000)
    truncated = built.audit.by_action("truncated")
    assert [a.message_id for a in truncated] == ["t0"] and truncated[0].tokens_saved > 1000
    masked = built.audit.by_action("masked")
    assert masked and all(a.tokens_saved > 0 for a in masked)
    last_result = [m for m in built.messages if m.role == "tool"][-1]
    assert "masked" not in last_result.text


def test_pinned_messages_survive_and_appear_once() -> None:
    history = _agent_session(30)
    history[1] = Message.user("My budget is 1500 USD and I need size L.", id="u0", pinned=True)
    built = build_context(history, "gpt-4o", 1500)
    ids = [m.id for m in built.messages]
    assert ids.count("u0") == 1
    assert built.layers["u0"] == "pinned"


def test_pin_first_keeps_a_whole_block() -> None:
    history = _agent_session(30)
    built = build_context(
        history, "gpt-4o", 1500, policy=Policy(window=ctxwarden.WindowConfig(pin_first=2))
    )
    assert pairing_problems(list(built.messages)) == []
    assert {"u0", "a0", "t0"} <= {m.id for m in built.messages}


def test_outputs_for_both_providers() -> None:
    history = _agent_session(10)
    built = build_context(history, "gpt-4o", 2000)
    assert built.to_openai()[0] == message_to_openai(history[0])
    system, turns = built.to_anthropic()
    assert system is not None and turns[0]["role"] == "user"
    marks = json.dumps([system, turns]).count("cache_control")
    assert 1 <= marks <= 4


def test_accepts_openai_dicts_and_reports_cost() -> None:
    history = [message_to_openai(m) for m in _agent_session(5)]
    built = build_context(history, "gpt-4o", 2000)
    assert built.audit.estimated_cost_usd is not None and built.audit.estimated_cost_usd > 0
    assert built.audit.fill_ratio is not None and 0 < built.audit.fill_ratio < 1
    assert json.loads(json.dumps(built.audit.to_dict()))["input_tokens"] == built.input_tokens


def test_policy_from_toml_and_errors(tmp_path: object) -> None:
    policy = Policy.from_toml(
        "max_input_tokens = 900\n[mask]\nkeep_last = 1\n[window]\npin_first = 1\n"
    )
    assert policy.max_input_tokens == 900 and policy.mask is not None and policy.mask.keep_last == 1
    assert Policy.from_toml("truncate = false\n").truncate is None
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        Policy.from_toml("bogus = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[window\]: pinfirst"):
        Policy.from_toml("[window]\npinfirst = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[truncate\]: _config_id"):
        Policy.from_toml("[truncate]\n_config_id = 3\n")  # internal fields are not settings
    assert Policy.from_toml("[truncate]\ncut_values_tokens = 0\n").truncate.cut_values_tokens == 0
    with pytest.raises(ConfigError, match="not valid TOML"):
        Policy.from_toml("[window\n")


def test_a_pending_call_does_not_feed_the_ledger() -> None:
    """A call still waiting for its result is rejected, not dropped: its arguments must not
    enter the ledger (the ledger sits near the top, so that would break the cached prefix)."""
    history = _agent_session(30)
    before = build_context(history, "gpt-4o", 1500)
    call = ToolCall("c-new", "get_reservation", json.dumps({"reservation_id": "ZZZ999"}))
    pending = build_context(
        [*history, Message.assistant(None, (call,), id="a-new")], "gpt-4o", 1500, previous=before
    )
    assert pending.audit.by_action("rejected")
    ledger_before = next(m for m in before.messages if m.id == "ctxwarden:ledger")
    ledger_pending = next(m for m in pending.messages if m.id == "ctxwarden:ledger")
    assert ledger_pending.text == ledger_before.text and "ZZZ999" not in ledger_pending.text


def test_a_registry_model_builds_with_its_window_counts_and_prices() -> None:
    """A user's model (tests/test_registry.py MY_LLAMA: 6,000-token window, factor 1.5,
    $1 / $0.25 cached per 1M input) given as ``registry=``."""
    from test_registry import my_llama

    registry = my_llama()
    history = _agent_session(40)
    with pytest.raises(ConfigError, match="no budget"):  # the default registry lacks it
        build_context(history, "my-llama")
    built = build_context(history, "my-llama", registry=registry)
    audit = built.audit
    assert (audit.context_window, audit.budget) == (6_000, 6_000 - Policy().response_reserve)
    assert audit.by_action("dropped") and audit.input_tokens <= audit.budget
    counter = TokenCounter("my-llama", registry=registry)  # a fresh counter, not the shared one
    assert counter.factor == 1.5 and not audit.exact
    assert audit.input_tokens == counter.count_messages(built.messages).tokens
    by_family = TokenCounter.for_model("my-llama")  # the name alone: llama's 1.02
    assert audit.input_tokens > by_family.count_messages(built.messages).tokens * 1.4
    assert audit.estimated_cost_usd == pytest.approx(audit.input_tokens * 1.0 / 1e6)
    turn = [Message.user("And reservation R0039X?", id="u-next")]
    again = build_context([*history, *turn], "my-llama", previous=built, registry=registry)
    shared = again.audit.prefix_shared_tokens
    assert shared > 0
    expected = ((again.input_tokens - shared) * 1.0 + shared * 0.25) / 1e6
    assert again.audit.effective_cost_usd == pytest.approx(expected)


def test_a_cold_build_reads_ledger_values_a_bounded_way_back() -> None:
    """Cold, the ledger reaches ``lookback`` messages before the window (it was placed);
    with ``previous`` an agent loop keeps where its ledger began, so it loses nothing."""
    from ctxwarden.pipeline.policy import LedgerConfig

    history = _agent_session(400)  # 1,601 messages
    cold = build_context(history, "gpt-4o", 1500)
    unbounded = Policy(ledger=LedgerConfig(lookback=None))
    everything = build_context(history, "gpt-4o", 1500, policy=unbounded)
    assert len(history) - 1100 < ledger_begin(cold.state) < cold.state.window_start
    assert ledger_begin(everything.state) == 1  # just after the system prompt
    start = cold.state.window_start
    recent = f"R{(start - 2) // 4:04d}X"  # the turn just before the window
    ledger = next(m.text for m in cold.messages if m.id == "ctxwarden:ledger")
    # its reply may still be in the window (then the ledger may leave it to the window);
    # the turn before it is wholly in the ledger
    assert recent in "\n".join(m.text for m in cold.messages)
    assert f"R{(start - 2) // 4 - 1:04d}X" in ledger
    assert build_context(history, "gpt-4o", 1500).to_openai() == cold.to_openai()

    loop = None
    for end in range(10, len(history) + 1, 40):  # an agent loop from the start
        loop = build_context(history[:end], "gpt-4o", 1500, previous=loop)
    assert loop is not None and ledger_begin(loop.state) == 1
    with pytest.raises(ConfigError, match="lookback"):
        LedgerConfig(lookback=-1)
    with pytest.raises(ConfigError, match="lookback_budgets"):
        LedgerConfig(lookback_budgets=-1.0)


def test_the_ledger_grows_with_what_the_budget_leaves_free() -> None:
    """With much free budget the ledger may take ``free_share`` of it, more than
    ``max_tokens``: a long session's dropped ids stay at 8,000 tokens that a fixed 600
    cannot hold; at a small budget the cap is the same as before."""
    from ctxwarden.pipeline.policy import LedgerConfig

    history = _agent_session(600)
    fixed = Policy(ledger=LedgerConfig(free_share=0.0))
    for budget in (1500, 8000):
        grown = build_context(history, "gpt-4o", budget)
        flat = build_context(history, "gpt-4o", budget, policy=fixed)
        assert grown.input_tokens <= budget and flat.input_tokens <= budget
        if budget == 1500:
            assert grown.to_openai() == flat.to_openai()
        else:
            assert flat.audit.layers["ledger"] <= 600
            assert grown.audit.layers["ledger"] > 1000
            assert grown.audit.layers["ledger"] <= 0.25 * (budget - 20) + 5
    with pytest.raises(ConfigError, match="free_share"):
        LedgerConfig(free_share=1.5)


def test_the_ledger_does_not_repeat_what_the_system_prompt_or_facts_show() -> None:
    """A value the system prompt (or the facts layer) shows needs no second mention in
    the ledger; the values only dropped messages held are still there."""
    note = " ".join(["the parcel left the depot"] * 30)
    history = [Message.system("You are a support agent for account acct_5521.")]
    history.append(Message.user("Check my orders please, account acct_5521.", id="u0"))
    for i in range(20):
        args = json.dumps({"order_id": f"ORD-{700 + i}", "account": "acct_5521"})
        history.append(Message.assistant(tool_calls=(ToolCall(f"c{i}", "get_order", args),)))
        body = {"order_id": f"ORD-{700 + i}", "account": "acct_5521", "note": note}
        history.append(Message.tool(json.dumps(body), f"c{i}", id=f"t{i}"))
    history.append(Message.user("Which was the first?", id="u1"))
    built = build_context(history, "gpt-4o", 1200)
    ledger = next(m.text for m in built.messages if m.id == "ctxwarden:ledger")
    assert "ORD-700" in ledger and "acct_5521" not in ledger
    plain = [m for m in history if m.role != "system"]
    again = build_context([Message.system("You are a support agent."), *plain], "gpt-4o", 1200)
    assert "acct_5521" in next(m.text for m in again.messages if m.id == "ctxwarden:ledger")


def test_a_newest_result_cut_to_fit_gives_its_values_to_the_ledger() -> None:
    """Under a budget that cannot hold the newest result whole, its cut values go to the
    ledger (ranked with the rest, each once) instead of a list inside the result."""
    rules = " ".join(f"Rule {i}: be careful and precise with every booking." for i in range(60))
    rows = [{"booking_id": f"BK-{9900 + i}", "city": "Lisbon", "seat": f"{i}A"} for i in range(40)]
    history = [
        Message.system(rules),
        Message.user("My user id is ana_reis_77. List my bookings.", id="u0"),
        Message.assistant("Looking them up.", id="a0"),
        Message.user("Thanks.", id="u1"),
        Message.assistant(tool_calls=(ToolCall("c1", "list_bookings", "{}"),), id="a1"),
        Message.tool(json.dumps(rows), "c1", id="t1"),
    ]
    counter = TokenCounter.for_model("gpt-4o")
    budget = counter.count_message(history[0]) + 300
    built = build_context(history, "gpt-4o", budget)
    cut = next(m for m in built.messages if m.id == "t1")
    assert counter.count_message(cut) < counter.count_message(history[-1])
    assert "values cut" not in cut.text and "cw:msg:t1" in cut.text
    ledger = next(m.text for m in built.messages if m.id == "ctxwarden:ledger")
    assert "BK-99" in ledger and built.audit.input_tokens <= budget


def test_a_ledger_cut_to_fit_leaves_out_what_the_window_shows() -> None:
    """When the newest results are cut to fit, the ledger is rendered for this build
    alone (its size follows the newest turn): a value the newest call passes shows in
    the window, so the block spends its tokens on values the context would lose."""
    history = [Message.system("You are a support agent. " + "Be brief. " * 300)]
    history.append(Message.user("Check my orders please.", id="u0"))
    for i in range(12):
        args = json.dumps({"order_id": f"ORD-{700 + i}"})
        history.append(Message.assistant(tool_calls=(ToolCall(f"c{i}", "get_order", args),)))
        body = {"order_id": f"ORD-{700 + i}", "sku": f"SKU-{400 + i}X", "note": "left depot " * 20}
        history.append(Message.tool(json.dumps(body), f"c{i}", id=f"t{i}"))
    history.append(Message.user("Refund the first one, ORD-700.", id="u1"))
    args = json.dumps({"order_id": "ORD-700", "sku": "SKU-400X", "reason": "late"})
    history.append(Message.assistant(tool_calls=(ToolCall("cr", "refund", args),), id="a1"))
    history.append(Message.tool(json.dumps({"log": ["step ok " * 40] * 20}), "cr", id="tr"))
    built = build_context(history, "gpt-4o", 1100)
    assert built.input_tokens <= 1100
    assert "the newest tool-call block was cut to fit the budget" in built.audit.warnings
    ledger = next(m.text for m in built.messages if m.id == "ctxwarden:ledger")
    assert "SKU-400X" not in ledger and "ORD-700" not in ledger  # the window's call shows them
    assert "SKU-411X" in ledger and "ORD-711" in ledger
    # with room, the block is the cacheable one: it does not follow the window
    roomy = build_context(history, "gpt-4o", 1300)
    # the result, not answered yet, is cut to what the budget leaves it (after the
    # ledger's cap), and the warning says so; nothing is evicted or cut harder
    (warning,) = roomy.audit.warnings
    assert warning.startswith("newest tool result tr cut from 1,648 to ")
    assert "ORD-700" in next(m.text for m in roomy.messages if m.id == "ctxwarden:ledger")


def test_a_step_context_counts_with_its_own_counter() -> None:
    """``StepContext.count`` is its counter's ``count_message`` (set on the instance), in
    a copy made with another counter too."""
    from dataclasses import replace

    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.steps.base import StepContext
    from ctxwarden.steps.state import BuildState

    message = Message.user("how many tokens does this sentence take? " * 20)
    ours, theirs = TokenCounter.for_model("gpt-4o"), TokenCounter.for_model("claude-sonnet-4-5")
    ctx = StepContext(counter=ours, budget=1000, policy=Policy(), previous=BuildState())
    other = replace(ctx, counter=theirs)
    assert ctx.count(message) == ours.count_message(message)
    assert other.count(message) == theirs.count_message(message) != ctx.count(message)
