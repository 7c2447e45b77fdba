"""The recall tool on ``/v1/responses``: with ``recall_tool = true`` the proxy offers it
(in the Responses tool shape), answers the model's recall call from the store and asks
upstream again; the ``openai`` SDK's ``responses.create`` sees only the final answer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from llm_servers import Recorded, Reply, ScriptedServer
from responses_servers import response_events, response_json
from service_harness import ProxyServer, add_tenant, module_db, sid

from ctxwarden.session.recall import RECALL_TOOL_NAME

__all__ = ["module_db"]  # the fixture, re-exported for pytest

HANDLE = re.compile(r"cw:msg:[A-Za-z0-9_.-]+")
SECRET_LOG = "\n".join(f"line {i}: build step {i} ok, artifact-{i * 7}.tar" for i in range(400))


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_r", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def model(request: Recorded) -> Reply:
    """Asks for the handle it sees while the tool is offered and unanswered, then says
    how long the recalled text is."""
    body = request.json
    offered = any(t.get("name") == RECALL_TOOL_NAME for t in body.get("tools", []))
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    answered = [i["output"] for i in outputs if i["call_id"] == "call_r1"]
    handles = HANDLE.findall(json.dumps(body["input"]))
    if offered and not answered and handles:
        arguments = json.dumps({"handle": handles[-1]})
        call = {"type": "function_call", "id": "fc_r1", "call_id": "call_r1",
                "name": RECALL_TOOL_NAME, "arguments": arguments}  # fmt: skip
        output = [call]
    else:
        got = answered[0] if answered else ""
        output = [_message(f"recalled {len(got)} chars")]
    response = response_json(output)
    return Reply(events=response_events(response)) if body.get("stream") else Reply(body=response)


@pytest.fixture(scope="module")
def proxy(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    policy = Path(tmp_path_factory.mktemp("policy") / "policy.toml")
    policy.write_text("recall_tool = true\n", encoding="utf-8")
    upstream = ScriptedServer(model).start()
    key = add_tenant(module_db, "acme")
    server = ProxyServer(module_db, upstream=upstream.url + "/v1", extra=("--policy", str(policy)))
    try:
        yield server, upstream, key
    finally:
        server.stop()
        upstream.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_the_client_sees_only_the_answer_after_the_recall_round(proxy: Any, stream: bool) -> None:
    server, upstream, key = proxy
    session = sid()
    items = [
        {"role": "user", "content": "Fetch the build log."},
        {"type": "function_call", "call_id": "call_0", "name": "build_log", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0", "output": SECRET_LOG},
        # answered: the newest results arrive whole, an answered one is cut (with its handle)
        {"type": "message", "role": "assistant", "content": "The build log is in."},
        {"role": "user", "content": "Which artifact did step 321 make?"},
    ]
    first = len(upstream.requests)
    headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"}
    kw: dict[str, Any] = dict(model="gpt-4o", input=items, extra_headers=headers,
                              instructions="You are a release agent.")  # fmt: skip
    with openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0) as client:
        if stream:
            with client.responses.stream(**kw) as events:
                text = events.get_final_response().output_text
        else:
            text = client.responses.create(**kw).output_text
    assert text == f"recalled {len(SECRET_LOG)} chars"
    sent = upstream.requests[first:]
    assert len(sent) == 2
    assert SECRET_LOG not in json.dumps(sent[0].json["input"])
    assert sent[1].json["input"][-1] == {"type": "function_call_output", "call_id": "call_r1",
                                         "output": SECRET_LOG}  # fmt: skip
    status, body = server.get(f"/v1/sessions/{session}/messages?limit=100", key)
    assert status == 200 and not any(RECALL_TOOL_NAME in json.dumps(m) for m in body["messages"])
    _, builds = server.get(f"/v1/sessions/{session}/builds", key)
    assert [b["status"] for b in builds["builds"]].count("recalled") == 1
