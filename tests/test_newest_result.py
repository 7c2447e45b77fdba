"""The newest turn arrives whole (issue 35): a tool result the model has not answered yet
is kept verbatim while the budget has room; when it must be cut, the cut keeps what its
call's arguments and the newest user message name, and the audit and a warning say so.
The size threshold applies to results the model has already answered. In-process and
through ``ctxwarden serve`` (OpenAI and Anthropic routes, real SDKs, scripted upstream)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from llm_servers import Recorded, Reply, ScriptedServer, anthropic_message, openai_completion
from service_harness import ProxyServer, add_tenant, module_db, sid

from ctxwarden import Message, Policy, ToolCall, TruncateToolResults, build_context

__all__ = ["module_db"]  # the fixture, re-exported for pytest

ASKED = "ORD-10117"


def _orders() -> list[dict[str, Any]]:
    rng = random.Random(35)
    return [
        {
            "order_id": f"ORD-{10000 + i}",
            "customer": f"cust_{i:04d}",
            "status": rng.choice(["shipped", "pending", "cancelled"]),
            "items": [{"sku": f"SKU-{rng.randint(1000, 9999)}", "qty": rng.randint(1, 5)}] * 2,
            "total": round(rng.uniform(5, 500), 2),
        }
        for i in range(150)
    ]


ORDERS = _orders()
PAYLOAD = json.dumps({"orders": ORDERS})  # 24 KB of JSON, about 10,000 tokens
WANTED = next(o for o in ORDERS if o["order_id"] == ASKED)


def history() -> list[Message]:
    """One question, the call it made, the 24 KB result: the model has not answered it."""
    call = ToolCall("c1", "list_orders", json.dumps({"order_id": ASKED}))
    return [
        Message.system("You are a helpful support agent.", id="sys"),
        Message.user(f"What is the status and total of order {ASKED}?", id="u1"),
        Message.assistant(None, (call,), id="a1"),
        Message.tool(PAYLOAD, "c1", name="list_orders", id="t1"),
    ]


def test_the_payload_is_a_24_kb_result() -> None:
    assert 24_000 <= len(PAYLOAD.encode()) < 25_000


def test_no_budget_given_the_newest_result_is_sent_whole() -> None:
    built = build_context(history(), "gpt-4o")  # the window less the reserve: 123,904
    assert built.messages[-1].text == PAYLOAD
    assert not built.audit.by_action("truncated") and not built.audit.warnings


def test_a_budget_that_must_cut_it_keeps_what_the_call_and_the_user_name() -> None:
    built = build_context(history(), "gpt-4o", 3_000)
    assert built.input_tokens <= 3_000
    shown = built.messages[-1].text
    assert len(shown) < len(PAYLOAD) // 3
    doc = json.loads(shown)  # still JSON
    kept = next(o for o in doc["orders"] if isinstance(o, dict) and o["order_id"] == ASKED)
    assert kept["status"] == WANTED["status"] and kept["total"] == WANTED["total"]
    (action,) = built.audit.by_action("truncated")
    assert action.message_id == "t1" and "not answered yet" in action.reason
    (warning,) = built.audit.warnings
    assert warning.startswith("newest tool result t1 cut from ")
    assert "cw:msg:t1" in shown  # the whole result stays recallable


def test_a_harder_cut_to_fit_keeps_the_named_item_too() -> None:
    built = build_context(history(), "gpt-4o", 700)  # less than the 300-token target leaves
    assert built.input_tokens <= 700
    assert ASKED in built.messages[-1].text


def _user_record_turn() -> tuple[list[Message], list[str]]:
    """A support agent's long system prompt, then the user record it fetched: the ids the
    next call needs (the reservations) come last in the record (tau-bench dev's shape)."""
    rules = " ".join(
        f"Rule {i}: check the membership tier and the cabin before any change to a booking."
        for i in range(70)
    )
    cards = {f"gift_card_{n}": {"source": "gift_card", "amount": 22} for n in (3481935, 6847880)}
    cards |= {f"credit_card_{n}": {"brand": "visa", "last_four": "7803"} for n in (2929732, 95251)}
    reservations = ["JG7FMM", "LQ940Q", "2FBBAH", "X7BYG1", "EQ1G6C", "BOH180"]
    record = {
        "name": {"first_name": "Omar", "last_name": "Davis"},
        "address": {
            "address1": "281 Spruce Street",
            "address2": "Suite 942",
            "city": "San Diego",
            "country": "USA",
            "province": "CA",
            "zip": "92164",
        },
        "email": "omar.davis7857@example.com",
        "dob": "1982-10-19",
        "payment_methods": cards,
        "saved_passengers": [{"first_name": "Juan", "last_name": "Ahmed", "dob": "1992-11-19"}],
        "membership": "regular",
        "reservations": reservations,
    }
    call = ToolCall("c1", "get_user_details", json.dumps({"user_id": "omar_davis_3817"}))
    return [
        Message.system(f"You are an airline agent. {rules}", id="sys"),
        Message.user("Hi, please downgrade all my business flights to economy.", id="u1"),
        Message.assistant("Sure, what is your user id?", id="a1"),
        Message.user("omar_davis_3817; I don't know my reservation ids, look them up?", id="u2"),
        Message.assistant(None, (call,), id="a2"),
        Message.tool(json.dumps(record), "c1", name="get_user_details", id="t1"),
    ], reservations


@pytest.mark.parametrize("budget", [1_500, 1_550])
def test_a_result_cut_to_what_is_left_lists_the_ids_it_cut(budget: int) -> None:
    """When only the system prompt and the newest turn fit (no room for a ledger), the
    last-resort cut of the newest result lists the ids it cut inside its share, and
    cuts the result as it came: an earlier cut's markers are not cut again (the old
    code sent ``"……": "2 more keys cut"`` at 1,500 and no reservation id at either)."""
    h, reservations = _user_record_turn()
    built = build_context(h, "gpt-4o", budget)
    assert built.input_tokens <= budget
    shown = next(m for m in built.messages if m.id == "t1").text
    doc = json.loads(shown)  # still JSON
    assert "……" not in doc and "more keys cut" not in doc.get("…values cut", "")
    assert any(a.message_id == "t1" for a in built.audit.by_action("truncated"))
    listed = [r for r in reservations if r in shown]
    if budget >= 1_550:  # room for the list: every id the next call may pass
        assert listed == reservations
    else:  # a shorter list: ids first, the first of them kept, how many more said
        assert listed[:1] == reservations[:1] and "more" in doc["…values cut"]


def test_the_listed_cut_never_pushes_the_newest_call_out() -> None:
    """The list takes only what the cut leaves of the share: at every budget that holds
    the call block at all (the old code's too: from 1,360 tokens here), the call and its
    result are sent, within the budget."""
    h, _ = _user_record_turn()
    for budget in range(1_360, 1_700, 10):
        built = build_context(h, "gpt-4o", budget)
        assert built.input_tokens <= budget
        assert {"a2", "t1"} <= {m.id for m in built.messages}, budget


def test_once_answered_the_threshold_applies() -> None:
    answered = [*history(), Message.assistant("It was cancelled.", id="a2")]
    answered.append(Message.user("Thanks. Anything else open?", id="u2"))
    built = build_context(answered, "gpt-4o")
    cut = next(m for m in built.messages if m.id == "t1")
    assert len(cut.text) < 4_000  # the seeds' cost rule, for a result already read
    assert [a.reason for a in built.audit.by_action("truncated")] == [
        "json tool result over 500 tokens"
    ]
    assert not built.audit.warnings


def test_the_seeds_rule_is_a_setting() -> None:
    policy = Policy(truncate=TruncateToolResults(newest_whole=False))
    built = build_context(history(), "gpt-4o", policy=policy)
    assert len(built.messages[-1].text) < 4_000
    assert ASKED in built.messages[-1].text  # the call's argument names it: kept


def test_results_followed_by_the_users_turn_are_not_answered_either() -> None:
    """Anthropic's tool_result blocks come in the user's turn: tool messages, then the
    user's text; the model has not answered them."""
    msgs = [*history(), Message.user("Quick please.", id="u2")]
    built = build_context(msgs, "gpt-4o")
    assert next(m for m in built.messages if m.id == "t1").text == PAYLOAD


# -- through ctxwarden serve -------------------------------------------------------------------


def _upstream(request: Recorded) -> Reply:
    if request.path.endswith("/messages"):
        return Reply(body=anthropic_message("ok", input_tokens=50, output_tokens=2))
    return Reply(body=openai_completion("ok", prompt=50, completion=2))


@pytest.fixture(scope="module")
def served(module_db: str) -> Iterator[tuple[ProxyServer, ScriptedServer, str]]:
    upstream = ScriptedServer(_upstream).start()
    key = add_tenant(module_db, "acme")
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1", anthropic_upstream=upstream.url)
    try:
        yield proxy, upstream, key
    finally:
        proxy.stop()
        upstream.stop()


def _openai_history() -> list[dict[str, Any]]:
    return [m.to_openai() for m in history()]


@pytest.mark.parametrize("budget", [None, 3_000])
def test_through_the_openai_route(
    served: tuple[ProxyServer, ScriptedServer, str], budget: int | None
) -> None:
    proxy, upstream, key = served
    headers = {"X-Ctxwarden-Session": sid()}
    if budget is not None:
        headers["X-Ctxwarden-Max-Input-Tokens"] = str(budget)
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0) as client:
        client.chat.completions.create(
            model="gpt-4o",
            messages=_openai_history(),  # type: ignore[arg-type]
            extra_headers=headers,
        )
    body = upstream.requests[-1].json["messages"]
    assert any(m["role"] == "user" and ASKED in (m["content"] or "") for m in body)  # the task
    sent = body[-1]
    assert sent["role"] == "tool"
    if budget is None:
        assert sent["content"] == PAYLOAD
    else:
        assert len(sent["content"]) < len(PAYLOAD) // 3 and ASKED in sent["content"]


@pytest.mark.parametrize("budget", [None, 3_000])
def test_through_the_anthropic_route(
    served: tuple[ProxyServer, ScriptedServer, str], budget: int | None
) -> None:
    proxy, upstream, key = served
    headers = {"X-Ctxwarden-Session": sid()}
    if budget is not None:
        headers["X-Ctxwarden-Max-Input-Tokens"] = str(budget)
    question = f"What is the status and total of order {ASKED}?"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "list_orders",
                    "input": {"order_id": ASKED},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": PAYLOAD}],
        },
    ]
    with anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0) as client:
        client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=100,
            system="You are a helpful support agent.",
            messages=messages,  # type: ignore[arg-type]
            extra_headers=headers,
        )
    body = upstream.requests[-1].json
    block = body["messages"][-1]["content"][0]
    assert block["type"] == "tool_result"
    shown = block["content"] if isinstance(block["content"], str) else block["content"][0]["text"]
    if budget is None:
        assert shown == PAYLOAD
    else:
        assert len(shown) < len(PAYLOAD) // 3 and ASKED in shown
    assert body["messages"][0]["content"][0]["text"] == question or (
        body["messages"][0]["content"] == question
    )
