"""The path a user takes: record agent sessions through the proxy, tune on the store
(``ctxwarden tune --db URL --tenant T``), then run with the tuned policy — ``ctxwarden
serve --policy``, ``ctxwarden tenant add --policy`` and ``build_context(policy=
Policy.from_toml(...))``. Real server process, real OpenAI SDK, scripted upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from llm_servers import Recorded, Reply, ScriptedServer, openai_completion, openai_tool_calls
from service_harness import ProxyServer, add_tenant, cli

from ctxwarden import Policy, TokenCounter, build_context, messages_from_openai, pairing_problems
from ctxwarden.integrations._common import ContextBuilder

pytest.importorskip("optuna")

BUDGET = 1200


def _script(n: int, turns: int = 4) -> list[dict[str, Any]]:
    """An order agent: each turn looks an order up, then tracks the parcel the lookup
    named (a value a later call needs), then answers."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are an order agent."}]
    for t in range(turns):
        order, parcel = f"ORD-{n}-{t}", f"PCL{n}{t}X"
        out += [
            {"role": "user", "content": f"Where is order {order}? (session {n}, turn {t})"},
            _call(f"c{n}{t}a", "lookup_order", {"order_id": order}),
            {"role": "tool", "tool_call_id": f"c{n}{t}a",
             "content": json.dumps({"order": order, "parcel": parcel, "log": f"{n}{t} " * 300})},
            _call(f"c{n}{t}b", "track_parcel", {"parcel_id": parcel}),
            {"role": "tool", "tool_call_id": f"c{n}{t}b",
             "content": json.dumps({"parcel": parcel, "where": "Lyon", "log": f"{t}{n} " * 300})},
            {"role": "assistant", "content": f"{order} ships as {parcel}, now in Lyon."},
        ]  # fmt: skip
    return out


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


SCRIPTS = [_script(n) for n in range(4)]


def _said(message: dict[str, Any]) -> str:
    """What identifies the message a call ends on: a result's call id (the build may
    have cut the result), else its text."""
    return str(message.get("tool_call_id") or message["content"])


# The upstream "model" answers with the script's next assistant message, found by the
# newest message it was sent (always kept, whatever the build dropped before it).
NEXT = {
    _said(s[k - 1]): s[k] for s in SCRIPTS for k in range(1, len(s)) if s[k]["role"] == "assistant"
}


def _model(request: Recorded) -> Reply:
    reply = NEXT[_said(request.json["messages"][-1])]
    if reply.get("tool_calls"):
        call = reply["tool_calls"][0]
        args = json.loads(call["function"]["arguments"])
        return Reply(body=openai_tool_calls([(call["id"], call["function"]["name"], args)]))
    return Reply(body=openai_completion(reply["content"]))


def _replay(client: openai.OpenAI, script: list[dict[str, Any]], session: str) -> None:
    """The agent loop: one call before every assistant message of the script."""
    for k in range(1, len(script)):
        if script[k]["role"] == "assistant":
            client.chat.completions.create(
                model="gpt-4o", messages=script[:k], extra_headers={"X-Ctxwarden-Session": session}
            )


def _sent_tokens(upstream: ScriptedServer) -> int:
    sent = messages_from_openai(upstream.requests[-1].json["messages"])
    assert pairing_problems(sent) == []
    return TokenCounter.for_model("gpt-4o").count_messages(sent).tokens


def test_record_through_the_proxy_tune_on_the_store_and_serve_the_policy(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'service.db'}"
    upstream = ScriptedServer(_model).start()
    key = add_tenant(db, "acme")
    recording = ProxyServer(db, upstream=upstream.url + "/v1")
    try:
        client = openai.OpenAI(base_url=recording.url + "/v1", api_key=key, max_retries=0)
        for n, script in enumerate(SCRIPTS):
            _replay(client, script, f"orders-{n}")
    finally:
        recording.stop()

    policy, report = tmp_path / "policy.toml", tmp_path / "tune"
    tuned = cli(
        "tune", "--db", db, "--tenant", "acme", "--budget", str(BUDGET), "--trials", "3",
        "--jobs", "1", "--out", str(policy), "--report", str(report),
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    data = json.loads(report.with_suffix(".json").read_text("utf-8"))
    assert len(data["fit_sessions"]) == len(data["check_sessions"]) == 2
    assert all(name.startswith(f"{db}#acme/orders-") for name in data["fit_sessions"])
    assert data["default"]["check"]["values"] > 0  # the parcels the agent tracked
    assert Policy.from_toml(policy).max_input_tokens == BUDGET

    # ctxwarden tenant add --policy stores it; ctxwarden serve --policy applies it to the
    # tenants without their own: both calls are built within the tuned budget.
    own = add_tenant(db, "beta", "--policy", str(policy))
    serving = ProxyServer(db, upstream=upstream.url + "/v1", extra=("--policy", str(policy)))
    try:
        for tenant_key in (key, own):
            client = openai.OpenAI(base_url=serving.url + "/v1", api_key=tenant_key, max_retries=0)
            client.chat.completions.create(
                model="gpt-4o", messages=SCRIPTS[0][:-1], extra_headers={"X-Ctxwarden-Session": "x"}
            )
            assert _sent_tokens(upstream) <= BUDGET
    finally:
        serving.stop()
        upstream.stop()

    # in-process, and the adapters' shared builder (LangChain, Agents SDK, pydantic-ai)
    built = build_context(SCRIPTS[1][:-1], model="gpt-4o", policy=Policy.from_toml(policy))
    assert built.audit.input_tokens <= BUDGET
    adapter = ContextBuilder("gpt-4o", policy=Policy.from_toml(policy))
    assert adapter.build(messages_from_openai(SCRIPTS[2][:-1])).audit.input_tokens <= BUDGET
