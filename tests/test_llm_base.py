"""The provider-neutral parts of ctxwarden.llm: retry arithmetic, the retry loop, specs."""

from __future__ import annotations

import subprocess
import sys
from email.utils import formatdate

import pytest

from ctxwarden.core.errors import ConfigError, ProviderError, ProviderTimeout, UsageError
from ctxwarden.llm import (
    AnthropicModel,
    OpenAICompatible,
    RetryPolicy,
    parse_retry_after,
    parse_spec,
)
from ctxwarden.llm.retry import Failure, call_with_retry


def test_backoff_doubles_and_is_capped() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=3.0, jitter=0.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(base_delay=1.0, jitter=0.2)
    assert policy.delay(1, rand=lambda: 0.0) == pytest.approx(0.8)
    assert policy.delay(1, rand=lambda: 1.0) == pytest.approx(1.2)


def test_retry_after_replaces_the_backoff() -> None:
    assert RetryPolicy(base_delay=5.0).delay(3, retry_after=0.25) == 0.25


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    header = formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"Retry-After": header}, now=now) == pytest.approx(30, abs=1)


def test_bad_policies_are_refused() -> None:
    with pytest.raises(UsageError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(UsageError, match="jitter"):
        RetryPolicy(jitter=2)


class Flaky(Exception):
    pass


async def test_call_with_retry_sleeps_per_policy_then_succeeds() -> None:
    slept: list[float] = []
    outcomes: list[object] = [Flaky(), Flaky(), "done"]

    async def attempt() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    def classify(exc: BaseException) -> Failure | None:
        return Failure(ProviderError("flaky", status=503), retryable=True)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    policy = RetryPolicy(base_delay=1.0, jitter=0.0)
    assert await call_with_retry(attempt, classify, policy, sleep=sleep) == "done"
    assert slept == [1.0, 2.0]


async def test_call_with_retry_keeps_the_timeout_type_and_reraises_unknown_errors() -> None:
    async def times_out() -> str:
        raise Flaky()

    def as_timeout(exc: BaseException) -> Failure | None:
        return Failure(ProviderTimeout("slow", provider="x"), retryable=True)

    async def no_sleep(seconds: float) -> None:
        pass

    with pytest.raises(ProviderTimeout, match="after 2 attempts"):
        await call_with_retry(times_out, as_timeout, RetryPolicy(max_attempts=2), sleep=no_sleep)
    with pytest.raises(Flaky):  # not a provider failure: a bug, raised as is
        await call_with_retry(times_out, lambda exc: None, RetryPolicy(), sleep=no_sleep)


def test_importing_ctxwarden_llm_does_not_import_the_sdks() -> None:
    code = "import sys, ctxwarden.llm; print('openai' in sys.modules, 'anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# --- spec strings --------------------------------------------------------------------------


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-a")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-r")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def test_offline_spec_is_returned_as_is() -> None:
    assert parse_spec("offline") == "offline"
    assert parse_spec("  Offline ") == "offline"


@pytest.mark.usefixtures("keys")
@pytest.mark.parametrize(
    ("spec", "name", "model", "base_url"),
    [
        ("openai:gpt-4o-mini", "openai:gpt-4o-mini", "gpt-4o-mini", "https://api.openai.com/v1"),
        ("ollama:qwen3:8b", "ollama:qwen3:8b", "qwen3:8b", "http://localhost:11434/v1"),
        (
            "openrouter:meta-llama/llama-3.1-8b-instruct",
            "openrouter:meta-llama/llama-3.1-8b-instruct",
            "meta-llama/llama-3.1-8b-instruct",
            "https://openrouter.ai/api/v1",
        ),
        (
            "vllm:meta-llama/Llama-3.1-8B-Instruct@http://gpu-box:8000/v1",
            "vllm:meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-8B-Instruct",
            "http://gpu-box:8000/v1",
        ),
        ("lmstudio:qwen2.5-7b", "lmstudio:qwen2.5-7b", "qwen2.5-7b", "http://localhost:1234/v1"),
        (
            "ollama:qwen3:8b@http://10.0.0.5:11434/v1",
            "ollama:qwen3:8b",
            "qwen3:8b",
            "http://10.0.0.5:11434/v1",
        ),
    ],
)
def test_openai_compatible_specs(spec: str, name: str, model: str, base_url: str) -> None:
    client = parse_spec(spec)
    assert isinstance(client, OpenAICompatible)
    assert (client.name, client.model, client.base_url) == (name, model, base_url)


@pytest.mark.usefixtures("keys")
def test_anthropic_spec_keeps_an_at_that_is_not_a_url() -> None:
    client = parse_spec("anthropic:claude-3-5-sonnet@20240620", timeout=5.0)
    assert isinstance(client, AnthropicModel)
    assert client.model == "claude-3-5-sonnet@20240620"
    assert client.timeout == 5.0


@pytest.mark.usefixtures("keys")
def test_spec_passes_the_retry_policy() -> None:
    policy = RetryPolicy(max_attempts=2)
    client = parse_spec("anthropic:claude-haiku-4-5", retry=policy)
    assert isinstance(client, AnthropicModel) and client.retry is policy


@pytest.mark.parametrize("spec", ["", "gpt-4o", "openai:", "bogus:model", "vllm:@http://x:1/v1"])
def test_bad_specs_list_the_valid_forms(spec: str) -> None:
    with pytest.raises(ConfigError, match="valid forms: offline") as info:
        parse_spec(spec)
    assert "ollama:qwen3:8b" in str(info.value)


def test_unknown_provider_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown provider 'bogus'"):
        parse_spec("bogus:model")
