"""Embedding recall (``[recall] embeddings``): a paraphrase that BM25 cannot find is
recalled by vector similarity fused with BM25; vectors are computed outside the build,
stored once with the messages and read back (SQLite and PostgreSQL); a failing endpoint
leaves the build to BM25 with a warning naming it; a bad spec is a ConfigError.

The endpoint is :class:`embedding_servers.EmbeddingServer`, a real HTTP server speaking
the ``/v1/embeddings`` wire format with a deterministic toy model, reached through the
real ``openai`` SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from embedding_servers import EmbeddingServer, toy_vector
from llm_servers import Reply
from service_harness import db_url, free_port

from ctxwarden import Policy, Session, build_context
from ctxwarden.core.errors import ConfigError, ProviderError
from ctxwarden.formats.openai import messages_from_openai
from ctxwarden.llm.embeddings import Embedder, check_embeddings_spec, embeddings_key
from ctxwarden.steps.recall_fusion import RecallVectors, embedding_text
from ctxwarden.steps.recall_relevant import RECALL_ID, RecallRelevant
from ctxwarden.store._sql import SqlStore
from ctxwarden.store.vectors import read_vectors

__all__ = ["db_url"]  # the fixture, re-exported for pytest

BUDGET = 1200
TARGET = "Bad news from yesterday: the airline scrapped our Lisbon departure at the last minute."
QUESTION = "Was my flight cancelled?"
ALLERGY = "Note for the dinner: my sister Priya is allergic to peanuts."
QUESTION_2 = "What intolerance does my sibling have?"


def _history() -> list[dict[str, Any]]:
    """A chat where the flight news and the allergy are old: the window at
    :data:`BUDGET` tokens holds only the newest garden talk."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": TARGET},
        {"role": "assistant", "content": "Sorry to hear that; I have noted it."},
        {"role": "user", "content": ALLERGY},
        {"role": "assistant", "content": "Noted for the dinner."},
    ]
    for i in range(40):
        out.append({"role": "user", "content": f"Garden question {i}: how often should "
                    f"tomato bed {i} get compost, mulch and water during week {i}?"})  # fmt: skip
        out.append({"role": "assistant", "content": f"Bed {i}: compost monthly, mulch "
                    f"thickly, water deeply twice weekly around day {i % 7}."})  # fmt: skip
    out.append({"role": "user", "content": QUESTION})
    return out


def _recall_text(built: Any) -> str:
    return next((m.text for m in built.messages if m.id == RECALL_ID), "")


@pytest.fixture
def server() -> Iterator[EmbeddingServer]:
    s = EmbeddingServer().start()
    try:
        yield s
    finally:
        s.stop()


def _policy(spec: str | None) -> Policy:
    return Policy(max_input_tokens=BUDGET, recall=RecallRelevant(share=0.25, embeddings=spec))


# -- the pure step, given vectors ---------------------------------------------------------


def test_the_step_recalls_a_paraphrase_from_the_vectors_it_is_given() -> None:
    messages = messages_from_openai(_history())
    spec = "openai:toy-embed@http://127.0.0.1:9/v1"
    key = embeddings_key(spec)
    vectors = RecallVectors(
        key, {m.id: toy_vector(embedding_text(m)) for m in messages if m.role != "system"}
    )
    plain = build_context(messages, max_input_tokens=BUDGET, policy=_policy(None))
    assert TARGET not in _recall_text(plain)  # no word in common: BM25 cannot find it
    no_vectors = build_context(messages, max_input_tokens=BUDGET, policy=_policy(spec))
    assert _recall_text(no_vectors) == _recall_text(plain)  # without vectors: BM25 alone
    built = build_context(
        messages, max_input_tokens=BUDGET, policy=_policy(spec), recall_vectors=vectors
    )
    assert TARGET in _recall_text(built)
    assert built.audit.input_tokens <= BUDGET
    assert TARGET not in [m.text for m in built.messages if m.id != RECALL_ID]  # left out
    reasons = {a.reason for a in built.audit.actions if a.action == "recalled"}
    assert reasons == {"relevant to the current request (BM25 and embeddings, fused)"}
    again = build_context(
        messages,
        max_input_tokens=BUDGET,
        policy=_policy(spec),
        recall_vectors=vectors,
        previous=built,
    )
    assert _recall_text(again) == _recall_text(built)
    other = RecallVectors("openai:other-model", vectors.by_id)  # vectors of another model
    mixed = build_context(
        messages, max_input_tokens=BUDGET, policy=_policy(spec), recall_vectors=other
    )
    assert TARGET not in _recall_text(mixed)


# -- through a Session, on SQLite and PostgreSQL ------------------------------------------


def test_a_session_embeds_once_stores_and_recalls_the_paraphrase(
    db_url: str, server: EmbeddingServer
) -> None:
    spec = f"openai:toy-embed@{server.url}/v1"
    policy = _policy(spec)
    with Session(db_url, "trip", policy=policy, model="gpt-4o") as s:
        s.append(_history())
        first = s.build()  # only the query has a vector yet: computed before the build
        assert dict(server.inputs) == {QUESTION: 1}
        assert TARGET not in _recall_text(first)
        made = s.embed()
        assert made == len(_history()) - 2  # every message but the system prompt and the query
        built = s.build()
        assert TARGET in _recall_text(built)
        assert built.audit.input_tokens <= BUDGET and not built.audit.warnings
        bm25 = s.build(policy=_policy(None))
        assert TARGET not in _recall_text(bm25)  # BM25 alone does not recall it
        # another turn: the reply and a second paraphrased question
        s.append([{"role": "assistant", "content": "Checking the booking now."},
                  {"role": "user", "content": QUESTION_2}])  # fmt: skip
        turn = s.build()
        assert ALLERGY in _recall_text(turn)
        assert s.embed() == 1  # the reply; the question's vector came with the build
        s.build()
        assert s.embed() == 0
        stored = [m for m in s.messages() if m.role != "system"]
    assert sorted(server.inputs) == sorted(embedding_text(m) for m in stored)
    assert set(server.inputs.values()) == {1}  # each message sent to the endpoint once
    asked = sum(server.inputs.values())
    with Session(db_url, "trip", policy=policy, model="gpt-4o") as again:  # read back
        store = again.store
        assert isinstance(store, SqlStore)
        back = read_vectors(store, "default", "trip", range(len(again)), embeddings_key(spec))
        texts = {i: embedding_text(m) for i, m in enumerate(again.messages())}
        assert set(back) == set(range(1, len(again)))
        for seq, vector in back.items():
            assert vector == pytest.approx(toy_vector(texts[seq]), rel=1e-6)
        rebuilt = again.build()
        assert ALLERGY in _recall_text(rebuilt)
        assert again.embed() == 0
    assert sum(server.inputs.values()) == asked  # nothing computed again


def test_pinned_first_messages_do_not_hide_what_lies_after_them(
    db_url: str, server: EmbeddingServer
) -> None:
    from dataclasses import replace

    from ctxwarden.pipeline.policy import WindowConfig

    spec = f"openai:toy-embed@{server.url}/v1"
    policy = replace(_policy(spec), window=WindowConfig(pin_first=2))
    history = _history()
    history[1:1] = [{"role": "user", "content": "Hello there, the season starts."},
                    {"role": "assistant", "content": "Hello! Ready when you are."}]  # fmt: skip
    with Session(db_url, "pinned", policy=policy) as s:
        s.append(history)
        s.embed()
        s.build()  # warm: the next build reads its window region, the pinned two and
        built = s.build()  # the messages most like the question
        assert any(m.text.startswith("Hello there") for m in built.messages)  # pinned
        assert TARGET in _recall_text(built)


def test_a_down_endpoint_leaves_the_build_to_bm25_and_says_so(db_url: str) -> None:
    port = free_port()  # nothing listens there
    spec = f"openai:toy-embed@http://127.0.0.1:{port}/v1?retries=0&timeout=2"
    with Session(db_url, "down", policy=_policy(spec)) as s:
        s.append(_history())
        built = s.build()
        assert TARGET not in _recall_text(built)
        warned = [w for w in built.audit.warnings if "embedding recall skipped" in w]
        assert len(warned) == 1
        assert f"http://127.0.0.1:{port}/v1/embeddings" in warned[0]
        assert "unreachable" in warned[0] and "BM25 alone" in warned[0]
        assert built.audit.input_tokens <= BUDGET
        with pytest.raises(ProviderError, match=f"127.0.0.1:{port}/v1/embeddings"):
            s.embed()


def test_the_sdk_retries_a_failing_endpoint_as_its_settings_say(server: EmbeddingServer) -> None:
    server.reply(Reply(503, {"error": {"message": "busy", "type": "server_error"}}))
    embedder = Embedder(f"openai:toy-embed@{server.url}/v1?retries=1")
    try:
        assert embedder.embed(["hotel"]) == [tuple(toy_vector("hotel"))]
        assert len(server.embed_requests()) == 2  # the 503, then the retry
        server.reply(*[Reply(503, {"error": {"message": "busy"}})] * 2)
        with pytest.raises(ProviderError, match="answered 503"):
            embedder.embed(["inn"])
    finally:
        embedder.close()


# -- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("anthropic:claude-haiku-4-5", "provider 'anthropic' has no OpenAI-compatible"),
        ("nope:model", "unknown embeddings provider 'nope'"),
        ("openai:", "no model"),
        ("offline", "provider 'offline'"),
        ("text-embedding-3-small", "no model"),
        ("openai:m?speed=2", "unknown spec option 'speed'"),
    ],
)
def test_a_bad_embeddings_spec_is_a_config_error_naming_it(spec: str, named: str) -> None:
    text = f'[recall]\nembeddings = "{spec}"\n'
    with pytest.raises(ConfigError, match=r"recall\.embeddings") as caught:
        Policy.from_toml(text)
    assert named in str(caught.value) and repr(spec) in str(caught.value)
    with pytest.raises(ConfigError):
        Policy.from_toml("[recall]\nembeddings = 3\n")


def test_a_good_spec_reads_its_endpoint_and_the_default_needs_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = Policy().recall  # the offline default: recall decided by the conversation,
    assert default is not None and default.auto and default.embeddings is None  # no vectors
    assert RecallRelevant().embeddings is None
    parsed = check_embeddings_spec("ollama:nomic-embed-text?timeout=3&retries=4")
    assert (parsed.provider, parsed.model, parsed.timeout, parsed.retries) == (
        "ollama", "nomic-embed-text", 3.0, 4,
    )  # fmt: skip
    assert Embedder("ollama:nomic-embed-text").endpoint == "http://localhost:11434/v1/embeddings"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert Embedder("openai:text-embedding-3-small").endpoint == "http://127.0.0.1:9/v1/embeddings"
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Embedder("openai:text-embedding-3-small")
