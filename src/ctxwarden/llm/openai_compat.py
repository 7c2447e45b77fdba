"""Any OpenAI-compatible chat endpoint through the official ``openai`` SDK (R12).

OpenAI, OpenRouter, Ollama, vLLM and LM Studio differ only in base URL, key and a
quirk or two, so they are one class with preset constructors, not five clients
(the "API shape / endpoint / profile" split of pydantic-ai). The SDK is imported
when a client is built, never when ctxwarden is imported.

Quirks handled here:

* ``json_mode`` sends ``response_format={"type": "json_object"}``; OpenAI rejects that
  unless a message mentions "JSON", so a one-line system instruction is appended
  when none does (at the end, so the cached prompt prefix is unchanged).
* OpenAI's own endpoint takes ``max_completion_tokens`` (reasoning models reject
  ``max_tokens``); other servers get ``max_tokens``, which all of them accept.
* Prompt caching is automatic by prefix, so ``cache_breakpoints`` are ignored;
  ``prompt_cache_key`` routes requests sharing a prefix to the same cache.
* Usage: ``prompt_tokens`` (cached part in ``prompt_tokens_details.cached_tokens``)
  and ``completion_tokens``; a server that omits usage yields zeros.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from ctxwarden.core.errors import ConfigError, MissingDependencyError, ProviderError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.formats.openai import messages_to_openai
from ctxwarden.llm.base import DEFAULT_TIMEOUT, Completion, LoopLocal, SDKModel, TextStream
from ctxwarden.llm.retry import RetryPolicy, SDKErrors

__all__ = ["OpenAICompatible"]

OPENAI_URL = "https://api.openai.com/v1"
OPENROUTER_URL = "https://openrouter.ai/api/v1"
OLLAMA_URL = "http://localhost:11434/v1"
VLLM_URL = "http://localhost:8000/v1"
LMSTUDIO_URL = "http://localhost:1234/v1"
_JSON_HINT = "Reply with a single JSON object and nothing else."


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise MissingDependencyError("the OpenAI-compatible client", "openai") from exc
    return openai


def usage_from_openai(raw: Any) -> Usage:
    """Read an SDK ``CompletionUsage`` (or ``None``) into :class:`Usage`."""
    if raw is None:
        return Usage()
    details = getattr(raw, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0)
    written = int(getattr(details, "cache_write_tokens", 0) or 0)
    prompt = int(getattr(raw, "prompt_tokens", 0) or 0)
    usage = Usage.from_openai(prompt, int(getattr(raw, "completion_tokens", 0) or 0), cached)
    if written and cached + written <= prompt:
        usage = replace(usage, cache_write_tokens=written)
    return usage


class OpenAICompatible(SDKModel):
    """A chat model behind an OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` and ``api_key`` default to the SDK's environment variables
    (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``); a missing key for OpenAI or OpenRouter
    is a :class:`ConfigError` naming the variable to set (a self-hosted server gets a
    placeholder key). ``timeout`` is seconds per attempt and ``deadline`` seconds for
    the whole call, retries and their waits included (default: ``timeout``, so
    ``timeout=10`` gives up after 10 s); retries follow ``retry`` (the SDK's own retries
    are off). ``extra_body`` is merged into every request (provider extensions such as
    OpenRouter's ``provider`` routing).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float | None = None,
        retry: RetryPolicy | None = None,
        extra_body: Mapping[str, Any] | None = None,
        prompt_cache_key: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        max_tokens_field: Literal["max_tokens", "max_completion_tokens"] | None = None,
        provider: str = "openai",
        api_key_env: str = "OPENAI_API_KEY",
    ) -> None:
        if not model:
            raise ConfigError(f"{provider}: a model name is required")
        openai = _import_openai()
        url = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
        key = api_key or os.environ.get(api_key_env)
        if not key and url.rstrip("/") in (OPENAI_URL, OPENROUTER_URL):
            raise ConfigError(
                f"{provider}: no API key; pass api_key=... or set the {api_key_env} "
                "environment variable"
            )
        key = key or "EMPTY"  # a self-hosted server usually checks no key; the SDK needs one
        self.model = model
        self.provider = provider
        self.name = f"{provider}:{model}"
        self.base_url = url.rstrip("/")
        self.timeout = timeout
        self.deadline = timeout if deadline is None else deadline
        self.retry = retry or RetryPolicy()
        self.extra_body = dict(extra_body or {})
        self.prompt_cache_key = prompt_cache_key
        official = self.base_url == OPENAI_URL
        self.max_tokens_field = max_tokens_field or (
            "max_completion_tokens" if official else "max_tokens"
        )
        self._errors = SDKErrors(openai, provider)
        headers = dict(default_headers or {})
        self._client: LoopLocal[Any] = LoopLocal(
            lambda: openai.AsyncOpenAI(
                api_key=key,
                base_url=self.base_url,
                timeout=timeout,
                max_retries=0,
                default_headers=headers or None,
            )
        )

    # --- presets: same class, another endpoint ------------------------------------------

    @classmethod
    def openrouter(cls, model: str, *, api_key: str | None = None, **kw: Any) -> OpenAICompatible:
        """OpenRouter (key from ``OPENROUTER_API_KEY``)."""
        kw.setdefault("base_url", OPENROUTER_URL)
        return cls(
            model, api_key=api_key, provider="openrouter", api_key_env="OPENROUTER_API_KEY", **kw
        )

    @classmethod
    def ollama(cls, model: str, *, api_key: str | None = None, **kw: Any) -> OpenAICompatible:
        """A local Ollama server; it needs no key, the SDK needs a non-empty one."""
        kw.setdefault("base_url", OLLAMA_URL)
        return cls(model, api_key=api_key or "ollama", provider="ollama", **kw)

    @classmethod
    def vllm(cls, model: str, *, api_key: str | None = None, **kw: Any) -> OpenAICompatible:
        """A vLLM server (``vllm serve``); the key is ``VLLM_API_KEY`` if the server set one."""
        kw.setdefault("base_url", VLLM_URL)
        key = api_key or os.environ.get("VLLM_API_KEY") or "EMPTY"
        return cls(model, api_key=key, provider="vllm", **kw)

    @classmethod
    def lmstudio(cls, model: str, *, api_key: str | None = None, **kw: Any) -> OpenAICompatible:
        """LM Studio's local server."""
        kw.setdefault("base_url", LMSTUDIO_URL)
        return cls(model, api_key=api_key or "lm-studio", provider="lmstudio", **kw)

    # --- calls ----------------------------------------------------------------------------

    def _params(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        temperature: float | None,
        json_mode: bool,
    ) -> dict[str, Any]:
        wire = messages_to_openai(messages)
        params: dict[str, Any] = {"model": self.model, "messages": wire}
        if max_tokens is not None:
            params[self.max_tokens_field] = max_tokens
        if temperature is not None:
            params["temperature"] = temperature
        if json_mode:
            params["response_format"] = {"type": "json_object"}
            if not any("json" in m.text.lower() for m in messages):
                wire.append({"role": "system", "content": _JSON_HINT})
        extra = dict(self.extra_body)
        if self.prompt_cache_key is not None:  # in extra_body: SDKs before 1.9x lack the kwarg
            extra["prompt_cache_key"] = self.prompt_cache_key
        if extra:
            params["extra_body"] = extra
        return params

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_mode: bool = False,
        cache_breakpoints: Collection[str] = (),
    ) -> Completion:
        """One chat completion, retried per the policy; raises ProviderError / ProviderTimeout."""
        params = self._params(messages, max_tokens, temperature, json_mode)
        client = self._client.get()
        response = await self._call(lambda: client.chat.completions.create(**params))
        choices = getattr(response, "choices", None)
        if not choices:
            raise ProviderError(
                f"{self.provider}: the response has no choices", status=200, provider=self.provider
            )
        choice = choices[0]
        return Completion(
            text=choice.message.content or "",
            usage=usage_from_openai(getattr(response, "usage", None)),
            model=getattr(response, "model", None) or self.model,
            finish_reason=choice.finish_reason,
            raw=response,
        )

    def stream(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_mode: bool = False,
        cache_breakpoints: Collection[str] = (),
    ) -> TextStream:
        """Stream text deltas; usage comes from the final chunk (``include_usage``).

        Only opening the stream is retried: once text has been yielded, a failure is
        raised rather than silently restarting the answer.
        """
        params = self._params(messages, max_tokens, temperature, json_mode)
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}

        async def deltas(out: TextStream) -> AsyncGenerator[str, None]:
            client = self._client.get()
            events = await self._call(lambda: client.chat.completions.create(**params))
            async with self._sdk_stream(events):
                async for chunk in events:
                    out.raw.append(chunk)
                    if getattr(chunk, "usage", None) is not None:
                        out.usage = usage_from_openai(chunk.usage)
                    for choice in chunk.choices or ():
                        if choice.finish_reason:
                            out.finish_reason = choice.finish_reason
                        if choice.delta and choice.delta.content:
                            yield choice.delta.content

        return TextStream(deltas, self.model)

    def __repr__(self) -> str:
        return f"OpenAICompatible({self.model!r}, base_url={self.base_url!r})"
