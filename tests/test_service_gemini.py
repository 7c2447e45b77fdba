"""``ctxwarden serve`` with the real ``google-genai`` SDK as client and a local upstream
speaking the Gemini API (``generateContent`` JSON, ``streamGenerateContent`` SSE,
``countTokens``), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    gemini_error,
    gemini_response,
    gemini_stream,
    gemini_usage,
)
from service_harness import ProxyServer, add_tenant, module_db, sid

from ctxwarden import TokenCounter
from ctxwarden.formats.gemini import messages_from_gemini, messages_to_gemini
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.service.gemini_proxy import _tools_as_openai
from ctxwarden.session.recall import RECALL_TOOL_NAME

__all__ = ["module_db"]

MODEL = "gemini-2.5-flash"
BUDGET = 2_500
SIGNATURE = "c2lnbmVkLXRob3VnaHQtMQ=="  # base64, as Gemini sends thought signatures
SYSTEM = "You are a travel agent. Answer with the weather and the local time."
HANDLE = re.compile(r"cw:msg:m\d+")
SECRET_LOG = "\n".join(f"line {i}: build step {i} ok, artifact-{i * 7}.tar" for i in range(400))
FILLER = " ".join(f"reading{i} of the station log, humidity and wind noted;" for i in range(60))


def _next_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The fake model's next turn: a new question gets two weather calls (no ids, a
    thought first, the first call signed); their answers a time call (with an id); its
    answer the final text."""
    contents = body["contents"]
    n = len(contents)
    last = contents[-1]["parts"]
    answered = [p["functionResponse"]["name"] for p in last if "functionResponse" in p]
    if not answered:
        return [
            {"text": "The user wants weather; call the tool twice.", "thought": True},
            {"functionCall": {"name": "get_weather", "args": {"city": f"Paris {n}"}},
             "thoughtSignature": SIGNATURE},
            {"functionCall": {"name": "get_weather", "args": {"city": f"Rome {n}"}}},
        ]  # fmt: skip
    if answered[0] == "get_weather":
        return [{"functionCall": {"id": f"time-{n}", "name": "get_time", "args": {"tz": "CET"}}}]
    return [{"text": f"Done after {n} turns: sunny and 10:00."}]


def _recall_parts(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """With the recall tool offered: recall the last handle in the context, then say how
    long the recalled text is; None when the tool is not offered."""
    offered = [d["name"] for t in body.get("tools", []) for d in t.get("functionDeclarations", [])]
    if RECALL_TOOL_NAME not in offered:
        return None
    last = body["contents"][-1]["parts"]
    for part in last:
        answer = part.get("functionResponse", {})
        if answer.get("name") == RECALL_TOOL_NAME:
            return [{"text": f"recalled {len(answer['response']['output'])} chars"}]
    handle = HANDLE.findall(json.dumps(body["contents"]))[-1]
    return [{"functionCall": {"name": RECALL_TOOL_NAME, "args": {"handle": handle}}}]


def fake_gemini(request: Recorded) -> Reply:
    body = request.json
    if request.path.split("?")[0].endswith(":countTokens"):
        return Reply(body={"totalTokens": 42})
    parts = _recall_parts(body) or _next_parts(body)
    usage = gemini_usage(prompt=len(request.body) // 4, output=7, cached=16)
    if ":streamGenerateContent" not in request.path:
        return Reply(body=gemini_response(parts, usage=usage))
    chunks: list[list[dict[str, Any]]] = []
    for part in parts:  # text in pieces, as Gemini streams it; a call whole
        text = part.get("text")
        if isinstance(text, str) and not part.get("thought"):
            chunks += [[{"text": text[:5]}], [{"text": text[5:]}]]
        else:
            chunks.append([part])
    return Reply(events=gemini_stream(chunks, usage=usage))


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    key: str

    def client(self, session: str | None = None, key: str | None = None) -> genai.Client:
        headers = {"X-Ctxwarden-Max-Input-Tokens": str(BUDGET)}
        if session:
            headers["X-Ctxwarden-Session"] = session
        options = types.HttpOptions(base_url=self.proxy.url, headers=headers)
        return genai.Client(api_key=key or self.key, http_options=options)

    def stored(self, session: str) -> list[dict[str, Any]]:
        status, body = self.proxy.get(f"/v1/sessions/{session}/messages?meta=true", self.key)
        assert status == 200, body
        return list(body["messages"])


@pytest.fixture(scope="module")
def env(module_db: str) -> Iterator[Env]:
    upstream = ScriptedServer(fake_gemini).start()
    key = add_tenant(module_db, "acme")
    proxy = ProxyServer(module_db, gemini_upstream=upstream.url)
    try:
        yield Env(proxy, upstream, key)
    finally:
        proxy.stop()
        upstream.stop()


WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}
    ),
)
TIME = types.FunctionDeclaration(
    name="get_time",
    description="The local time in a time zone.",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"tz": types.Schema(type=types.Type.STRING)}
    ),
)
CONFIG = types.GenerateContentConfig(
    system_instruction=SYSTEM,
    tools=[types.Tool(function_declarations=[WEATHER, TIME])],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
)


def _run_tool(call: types.FunctionCall) -> dict[str, Any]:
    args = call.args or {}
    return {"output": f"{call.name}({json.dumps(args)}): {FILLER}"}


def _merged(parts: list[types.Part]) -> list[types.Part]:
    """A streamed reply's parts as one turn, text pieces joined (what an agent keeps)."""
    out: list[types.Part] = []
    for part in parts:
        last = out[-1] if out else None
        if (
            last is not None
            and part.text is not None
            and last.text is not None
            and bool(part.thought) == bool(last.thought)
            and last.thought_signature is None
        ):
            out[-1] = last.model_copy(update={"text": last.text + part.text})
        else:
            out.append(part)
    return out


def _agent_loop(env: Env, session: str, *, stream: bool, questions: int) -> list[types.Content]:
    """A multi-turn function-calling agent on the SDK: each question until the model
    stops calling tools. Returns the whole conversation it kept."""
    client = env.client(session)
    contents: list[types.Content] = []
    for q in range(questions):
        contents.append(types.Content(role="user", parts=[types.Part(text=f"Trip {q}: weather?")]))
        while True:
            if stream:
                got: list[types.Part] = []
                for chunk in client.models.generate_content_stream(
                    model=MODEL, contents=contents, config=CONFIG
                ):
                    got += chunk.candidates[0].content.parts or []  # type: ignore[index,union-attr]
                content = types.Content(role="model", parts=_merged(got))
            else:
                response = client.models.generate_content(
                    model=MODEL, contents=contents, config=CONFIG
                )
                content = response.candidates[0].content  # type: ignore[index,assignment]
            contents.append(content)
            calls = [p.function_call for p in content.parts or () if p.function_call]
            if not calls:
                break
            answers = [
                types.Part(
                    function_response=types.FunctionResponse(
                        id=c.id, name=c.name, response=_run_tool(c)
                    )
                )
                for c in calls
            ]
            contents.append(types.Content(role="user", parts=answers))
    return contents


def _check_pairs(contents: list[dict[str, Any]]) -> int:
    """Every functionCall is answered in the next turn, by id where it has one, else by
    name and order; no functionResponse without its call. Returns the calls seen."""
    seen = 0
    owed: list[dict[str, Any]] = []
    for turn in contents:
        calls = [p["functionCall"] for p in turn["parts"] if "functionCall" in p]
        answers = [p["functionResponse"] for p in turn["parts"] if "functionResponse" in p]
        if turn["role"] == "model":
            assert not owed, f"calls left unanswered: {owed}"
            owed = calls
            seen += len(calls)
            continue
        assert len(answers) == len(owed), (answers, owed)
        for call, answer in zip(owed, answers, strict=True):
            assert answer["name"] == call["name"]
            assert answer.get("id") == call.get("id")
        owed = []
    assert not owed
    return seen


def _wire(contents: list[types.Content]) -> list[dict[str, Any]]:
    return [c.model_dump(mode="json", exclude_none=True, by_alias=True) for c in contents]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_function_calling_loop_through_the_proxy(env: Env, stream: bool) -> None:
    session = sid()
    start = len(env.upstream.requests)
    contents = _agent_loop(env, session, stream=stream, questions=4)

    sent = env.upstream.requests[start:]
    assert len(sent) == 4 * 3  # three model turns a question
    counter = TokenCounter.for_model(MODEL)
    trimmed = 0
    calls = 0
    for request in sent:
        path = f"/v1/models/{MODEL}:" + ("streamGenerateContent?alt=sse" if stream
                                              else "generateContent")  # fmt: skip
        assert request.path == path
        assert request.headers["x-goog-api-key"] == "sk-upstream-gemini"  # never the tenant's
        body = request.json
        assert body["systemInstruction"]["parts"][0] == {"text": SYSTEM}
        assert body["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
        built = messages_from_gemini(body["systemInstruction"], body["contents"])
        count = counter.count_messages(built, _tools_as_openai(body["tools"]))
        assert count.method == "estimate:gemini"  # Gemini is counted as a labelled estimate
        assert count.tokens <= BUDGET
        calls += _check_pairs(body["contents"])
        client_side = contents[: len(body["contents"])]
        trimmed += body["contents"] != _wire(client_side)
        for turn in body["contents"]:  # signatures go back on their call, in place
            for part in turn["parts"]:
                if part.get("functionCall", {}).get("args", {}).get("city", "").startswith("P"):
                    assert part["thoughtSignature"] == SIGNATURE
    assert trimmed >= 3  # the history outgrew the budget: the proxy built within it
    assert calls >= 4 * 3

    # the stored session is the conversation, and writes back exactly what came in
    stored = [message_from_openai(m) for m in env.stored(session)]
    system, written = messages_to_gemini(stored)
    assert system == {"parts": [{"text": SYSTEM}], "role": "user"}
    assert written == _wire(contents)
    _, detail = env.proxy.get(f"/v1/sessions/{session}", env.key)
    assert detail["usage"]["calls"] == 12
    assert detail["usage"]["cached_input_tokens"] == 12 * 16  # cachedContentTokenCount
    assert detail["usage"]["output_tokens"] == 12 * 7


def test_unknown_parts_go_upstream_byte_for_byte_and_are_stored(env: Env) -> None:
    session = sid()
    odd_user = {"futurePart": {"nested": [1, 2.5, "ü", None], "z": {"a": True}}}
    odd_model = {"someNewThing": {"payload": "x" * 10}, "thoughtSignature": "AAEC"}
    image = {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    contents = [
        {"role": "user", "parts": [{"text": "look"}, image, odd_user]},
        {"role": "model", "parts": [odd_model, {"text": "seen"}]},
        {"role": "user", "parts": [{"text": "and now?"}]},
    ]
    body = {"contents": contents, "generationConfig": {"temperature": 0.2}}
    url = f"{env.proxy.url}/v1beta/models/{MODEL}:generateContent?key={env.key}"
    r = httpx2.post(url, json=body, headers={"X-Ctxwarden-Session": session})
    assert r.status_code == 200, r.text
    sent = env.upstream.requests[-1]
    assert "key=" not in sent.path  # the tenant key never goes upstream
    raw = sent.body.decode()
    for part in (odd_user, odd_model, image):
        assert json.dumps(part, separators=(",", ":"), ensure_ascii=False) in raw
    assert sent.json["contents"] == contents
    assert sent.json["generationConfig"] == {"temperature": 0.2}
    stored = [message_from_openai(m) for m in env.stored(session)]
    _, written = messages_to_gemini(stored)
    reply = r.json()["candidates"][0]["content"]
    assert written == [*contents, reply]


def test_wrong_key_is_refused_in_geminis_error_shape(env: Env) -> None:
    start = len(env.upstream.requests)
    client = env.client(key="cw-not-a-key")  # (kept: a dropped client closes its connections)
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model=MODEL, contents="hi")
    assert caught.value.code == 401
    assert caught.value.status == "UNAUTHENTICATED"
    r = httpx2.post(
        f"{env.proxy.url}/v1beta/models/{MODEL}:generateContent?key=wrong",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert r.status_code == 401
    assert r.json()["error"]["status"] == "UNAUTHENTICATED"
    assert len(env.upstream.requests) == start  # nothing went upstream


def test_count_tokens_is_forwarded_and_nothing_stored(env: Env) -> None:
    session = sid()
    client = env.client(session)
    got = client.models.count_tokens(model=MODEL, contents="how many?")
    assert got.total_tokens == 42
    sent = env.upstream.requests[-1]
    assert sent.path == f"/v1/models/{MODEL}:countTokens"
    assert sent.headers["x-goog-api-key"] == "sk-upstream-gemini"
    status, _ = env.proxy.get(f"/v1/sessions/{session}", env.key)
    assert status == 404


def test_a_budget_too_small_is_a_gemini_400(env: Env) -> None:
    options = types.HttpOptions(
        base_url=env.proxy.url, headers={"X-Ctxwarden-Max-Input-Tokens": "5"}
    )
    client = genai.Client(api_key=env.key, http_options=options)
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(
            model=MODEL, contents="x " * 200, config=types.GenerateContentConfig(
                system_instruction="Keep me.")
        )  # fmt: skip
    assert caught.value.code == 400
    assert caught.value.status == "INVALID_ARGUMENT"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_recall_round_is_answered_by_the_proxy(env: Env, stream: bool, tmp_path: Any) -> None:
    """A tenant whose policy offers the recall tool: the model's recall call is answered
    by the proxy (the whole original, paired by name and order: no synthetic id goes
    upstream) and the client sees only the final answer."""
    policy = tmp_path / "policy.toml"
    policy.write_text("recall_tool = true\n", encoding="utf-8")
    key = add_tenant(env.proxy.db, f"recaller-{stream}", "--policy", str(policy))
    session = sid()
    options = types.HttpOptions(base_url=env.proxy.url, headers={
        "X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": "9000"})  # fmt: skip
    client = genai.Client(api_key=key, http_options=options)
    contents = [
        {"role": "user", "parts": [{"text": "Fetch the build log."}]},
        {"role": "model", "parts": [{"functionCall": {"name": "build_log", "args": {}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "build_log", "response": {"output": SECRET_LOG}}}]},
        # answered: the newest results arrive whole, an answered one is cut (with its handle)
        {"role": "model", "parts": [{"text": "The build log is in."}]},
        {"role": "user", "parts": [{"text": "Which artifact did step 321 make?"}]},
    ]  # fmt: skip
    first = len(env.upstream.requests)
    if stream:
        chunks = client.models.generate_content_stream(model=MODEL, contents=contents)
        text = "".join(c.text or "" for c in chunks)
    else:
        text = client.models.generate_content(model=MODEL, contents=contents).text or ""
    assert text == f"recalled {len(SECRET_LOG)} chars"
    sent = env.upstream.requests[first:]
    assert len(sent) == 2
    assert SECRET_LOG not in sent[0].body.decode()
    call, answer = sent[1].json["contents"][-2:]
    assert call["parts"][0]["functionCall"]["name"] == RECALL_TOOL_NAME
    assert "id" not in call["parts"][0]["functionCall"]
    response = answer["parts"][0]["functionResponse"]
    assert response == {"name": RECALL_TOOL_NAME, "response": {"output": SECRET_LOG}}
    status, body = env.proxy.get(f"/v1/sessions/{session}/messages", key)
    assert status == 200
    assert not any(RECALL_TOOL_NAME in json.dumps(m) for m in body["messages"])
    assert body["messages"][-1]["content"] == text


def test_an_upstream_error_passes_through_with_its_status_and_nothing_is_stored(env: Env) -> None:
    session = sid()
    env.upstream.reply(Reply(429, gemini_error(429, "Quota exceeded", "RESOURCE_EXHAUSTED")))
    client = env.client(session)
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model=MODEL, contents="hi")
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"
    assert caught.value.message == "Quota exceeded"
    messages = env.stored(session)
    assert [m["role"] for m in messages] == ["user"]  # the question, no reply
    status, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
    assert status == 200 and builds["builds"][0]["status"] == "upstream_429"


def test_a_tenants_own_gemini_key_goes_upstream_instead_of_the_servers(env: Env) -> None:
    key = add_tenant(env.proxy.db, "own-gemini-key", "--gemini-key", "sk-tenant-gemini")
    client = env.client(sid(), key=key)
    assert client.models.generate_content(model=MODEL, contents="Hi").function_calls
    assert env.upstream.requests[-1].headers["x-goog-api-key"] == "sk-tenant-gemini"
    assert client.models.count_tokens(model=MODEL, contents="Hi").total_tokens == 42
    assert env.upstream.requests[-1].headers["x-goog-api-key"] == "sk-tenant-gemini"
