"""Embedding recall through ``ctxwarden serve``: a tenant policy with ``[recall]
embeddings`` makes the proxy embed each stored message once, after the call, in the
background; a later call's build recalls a paraphrase BM25 cannot find; a tenant whose
endpoint is down is served all the same, the build's audit naming the endpoint. The
real ``openai`` SDK talks to the proxy, the proxy to a local upstream and to a local
``/v1/embeddings`` server (:mod:`embedding_servers`), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from embedding_servers import EmbeddingServer
from llm_servers import Recorded, Reply, ScriptedServer, openai_completion
from service_harness import ProxyServer, add_tenant, free_port, module_db, sid
from test_embedding_recall import QUESTION, TARGET, _history

from ctxwarden.steps.recall_fusion import embedding_text

__all__ = ["module_db"]  # the fixture, re-exported for pytest

NEUTRAL = "Thanks, that is all for the garden today."
REPLY = "Happy gardening."


def _policy(tmp: Path, name: str, spec: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(
        f'max_input_tokens = 1200\n\n[recall]\nshare = 0.25\nembeddings = "{spec}"\n',
        encoding="utf-8",
    )
    return path


@dataclass
class Env:
    proxy: ProxyServer
    upstream: ScriptedServer
    embeddings: EmbeddingServer
    key: str
    down_key: str
    down_endpoint: str


def _model(request: Recorded) -> Reply:
    return Reply(body=openai_completion(REPLY))


@pytest.fixture(scope="module")
def env(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("policy")
    embeddings = EmbeddingServer().start()
    upstream = ScriptedServer(_model).start()
    good = _policy(tmp, "acme", f"openai:toy-embed@{embeddings.url}/v1")
    key = add_tenant(module_db, "acme", "--policy", str(good))
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    down = _policy(tmp, "down", f"openai:toy-embed@{dead}?retries=0")
    down_key = add_tenant(module_db, "downco", "--policy", str(down))
    proxy = ProxyServer(module_db, upstream=upstream.url + "/v1")
    try:
        yield Env(proxy, upstream, embeddings, key, down_key, dead + "/embeddings")
    finally:
        proxy.stop()
        upstream.stop()
        embeddings.stop()


def _first_call() -> list[dict[str, Any]]:
    return [*_history()[:-1], {"role": "user", "content": NEUTRAL}]


def _call(env: Env, key: str, session: str, messages: list[dict[str, Any]]) -> str:
    client = openai.OpenAI(base_url=env.proxy.url + "/v1", api_key=key, max_retries=0)
    with client:
        reply = client.chat.completions.create(
            model="gpt-4o", messages=messages, extra_headers={"X-Ctxwarden-Session": session}
        )  # type: ignore[call-overload]
    return reply.choices[0].message.content or ""


def _wait_for(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the background embedding did not finish"
        time.sleep(0.05)


def _recall_block(body: dict[str, Any]) -> str:
    texts = [m.get("content") or "" for m in body["messages"]]
    return next((t for t in texts if isinstance(t, str) and t.startswith("Recalled from")), "")


def test_serve_embeds_each_message_once_and_recalls_a_paraphrase(env: Env) -> None:
    session = sid()
    first = _first_call()
    before = len(env.upstream.requests)
    assert _call(env, env.key, session, first) == REPLY
    assert TARGET not in _recall_block(env.upstream.requests[before].json)
    expected = {t for t in (embedding_text_of(m) for m in first[1:]) if t} | {REPLY}
    _wait_for(lambda: expected <= set(env.embeddings.inputs))  # after the call, off its path
    second = [*first, {"role": "assistant", "content": REPLY},
              {"role": "user", "content": QUESTION}]  # fmt: skip
    assert _call(env, env.key, session, second) == REPLY
    sent = env.upstream.requests[-1].json
    assert TARGET in _recall_block(sent)  # shares no word with the question
    assert QUESTION in json.dumps(sent)
    _wait_for(lambda: env.embeddings.inputs[REPLY] >= 2)  # the second reply's text is the same
    time.sleep(0.3)  # any run still under way ends; nothing more is asked
    texts = [embedding_text_of(m) for m in [*second[1:], {"role": "assistant",
             "content": REPLY}]]  # fmt: skip
    counts = env.embeddings.inputs
    for text in set(texts):  # each stored message embedded once (two replies share a text)
        assert counts[text] == texts.count(text), text
    status, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.key)
    assert status == 200
    newest = builds["builds"][0]["audit"]
    reasons = {a["reason"] for a in newest["actions"] if a["action"] == "recalled"}
    assert "relevant to the current request (BM25 and embeddings, fused)" in reasons


def test_a_down_endpoint_is_served_and_the_audit_names_it(env: Env) -> None:
    session = sid()
    assert _call(env, env.down_key, session, _history()) == REPLY
    assert TARGET not in _recall_block(env.upstream.requests[-1].json)
    status, builds = env.proxy.get(f"/v1/sessions/{session}/builds", env.down_key)
    assert status == 200
    warnings = builds["builds"][0]["audit"]["warnings"]
    assert any("embedding recall skipped" in w and env.down_endpoint in w for w in warnings)


def embedding_text_of(message: dict[str, Any]) -> str:
    from ctxwarden.formats.openai import message_from_openai

    return embedding_text(message_from_openai(message))


def test_with_a_broker_the_worker_embeds_after_the_call(
    env: Env, module_db: str, tmp_path: Path
) -> None:
    """``serve --broker``: the vectors are a ``ctxwarden worker`` job, not the proxy's."""
    import uuid

    from test_replicas import REDIS, Worker

    if not REDIS:
        pytest.skip("set CTXWARDEN_TEST_REDIS to a Redis URL to run the worker's jobs")
    queue = f"ctxw-embed-{uuid.uuid4().hex[:8]}"
    proxy = ProxyServer(
        module_db,
        upstream=env.upstream.url + "/v1",
        extra=("--broker", REDIS),
        env={"CTXWARDEN_JOB_QUEUE": queue},
    )
    log = tmp_path / "worker.log"
    worker = Worker(module_db, REDIS, queue, env.upstream.url + "/v1", log)
    try:
        queued = Env(proxy, env.upstream, env.embeddings, env.key, "", "")
        session = sid()
        first = [*_first_call()[:-1], {"role": "user", "content": "One more garden note."}]
        first[1] = {"role": "user", "content": TARGET + " (second trip)"}
        assert _call(queued, env.key, session, first) == REPLY
        wanted = embedding_text_of(first[1])
        _wait_for(lambda: env.embeddings.inputs[wanted] == 1)
        _wait_for(lambda: "embedding job of acme/" in log.read_text())
        second = [*first, {"role": "assistant", "content": REPLY},
                  {"role": "user", "content": QUESTION}]  # fmt: skip
        assert _call(queued, env.key, session, second) == REPLY
        # the proxied call (the worker's own model calls, a summary or facts job, may come
        # after it upstream)
        sent = next(
            r.json
            for r in reversed(env.upstream.requests)
            if any(m.get("content") == QUESTION for m in r.json.get("messages", []))
        )
        assert first[1]["content"] in _recall_block(sent)
        time.sleep(0.5)
        assert env.embeddings.inputs[wanted] == 1  # embedded once, by the worker
    finally:
        proxy.stop()
        worker.stop()
