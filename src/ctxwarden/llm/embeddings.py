"""Embedding vectors from any OpenAI-compatible ``/v1/embeddings`` endpoint.

Embedding recall (``[recall] embeddings = "openai:text-embedding-3-small"``) ranks the
history a build leaves out by vector similarity beside BM25. The vectors are computed
here, outside the build: by :meth:`ctxwarden.Session.embed` after a call and, for the
newest user message (the recall query), just before a session's build. The build only
reads them (:mod:`ctxwarden.steps.recall_fusion`).

The spec is the summariser's grammar (:mod:`ctxwarden.llm.spec`):
``PROVIDER:MODEL[@http(s)://base-url][?timeout=S&retries=N]`` with an OpenAI-compatible
provider (``openai``, ``openrouter``, ``ollama``, ``vllm``, ``lmstudio``): Anthropic has
no embeddings endpoint and the offline summariser no model, so both are a
:class:`~ctxwarden.core.errors.ConfigError` naming the spec. The base URL and the key come as
they do for the chat client (:class:`~ctxwarden.llm.openai_compat.OpenAICompatible`): the
spec's ``@url``, else the provider's preset (``OPENAI_BASE_URL`` for ``openai``); the key
from the provider's variable (``OPENAI_API_KEY``, ``OPENROUTER_API_KEY``,
``VLLM_API_KEY``; a self-hosted server gets a placeholder).

The client is the ``openai`` SDK's own embeddings resource, with the SDK's retries
(``max_retries``: the spec's ``retries``, else the SDK's default of 2) and a timeout per
attempt (the spec's ``timeout``, else :data:`DEFAULT_TIMEOUT`): an embedding is one short
request, and the SDK already retries 408/429/5xx and connection errors with backoff.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import ConfigError, ProviderError

__all__ = [
    "DEFAULT_TIMEOUT",
    "EMBEDDING_PROVIDERS",
    "Embedder",
    "EmbeddingSpec",
    "check_embeddings_spec",
    "embeddings_key",
]

EMBEDDING_PROVIDERS = ("openai", "openrouter", "ollama", "vllm", "lmstudio")
DEFAULT_TIMEOUT = 10.0
"""Seconds per attempt: the query's vector is computed on the request path."""
BATCH = 64
"""Inputs per request (the endpoints accept more; a batch keeps one request small)."""
SDK_RETRIES = 2  # the openai SDK's own default
_FORMS = (
    "openai:text-embedding-3-small | ollama:nomic-embed-text | "
    "vllm:MODEL@http://host:8000/v1 | lmstudio:MODEL | openrouter:MODEL "
    "(any of them takes @http(s)://base-url and ?timeout=S&retries=N)"
)


@dataclass(frozen=True)
class EmbeddingSpec:
    """What an embeddings spec names: provider, model, base URL (``None``: the
    provider's), seconds per attempt and retries (``None``: the defaults)."""

    spec: str
    provider: str
    model: str
    base_url: str | None
    timeout: float | None
    retries: int | None

    @property
    def key(self) -> str:
        """What names the vectors' space: ``provider:model`` (a spec's timeout, retries
        or base URL do not change the vectors it makes)."""
        return f"{self.provider}:{self.model}"


def check_embeddings_spec(spec: object) -> EmbeddingSpec:
    """The spec read, without making a client; a :class:`ConfigError` naming it and
    listing the valid forms when it is malformed or names no embeddings provider."""
    from ctxwarden.llm.spec import PROVIDERS, check_spec

    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"embeddings must be a spec such as {_FORMS.split(' | ')[0]!r}, "
                          f"got {spec!r}")  # fmt: skip
    head, sep, _ = spec.strip().partition(":")
    if sep and head.lower() not in EMBEDDING_PROVIDERS:
        what = "provider" if head.lower() in PROVIDERS else "unknown embeddings provider"
        raise ConfigError(
            f"bad embeddings spec {spec!r}: {what} {head!r} has no OpenAI-compatible "
            f"/v1/embeddings endpoint; valid forms: {_FORMS}"
        )
    try:
        provider, model, base_url, timeout, retry = check_spec(spec)
    except ConfigError as exc:
        raise ConfigError(f"bad embeddings spec {spec!r}: {exc}") from None
    if provider not in EMBEDDING_PROVIDERS:
        raise ConfigError(
            f"bad embeddings spec {spec!r}: provider {provider!r} has no OpenAI-compatible "
            f"/v1/embeddings endpoint; valid forms: {_FORMS}"
        )
    retries = None if retry is None else retry.max_attempts - 1
    return EmbeddingSpec(spec, provider, model, base_url, timeout, retries)


@memoize(64)
def embeddings_key(spec: str) -> str:
    """:attr:`EmbeddingSpec.key` of ``spec`` (checked)."""
    return check_embeddings_spec(spec).key


def _base_url(parsed: EmbeddingSpec) -> str:
    from ctxwarden.llm import openai_compat as oc

    if parsed.base_url is not None:
        return parsed.base_url.rstrip("/")
    presets = {
        "openrouter": oc.OPENROUTER_URL,
        "ollama": oc.OLLAMA_URL,
        "vllm": oc.VLLM_URL,
        "lmstudio": oc.LMSTUDIO_URL,
    }
    url = presets.get(parsed.provider) or os.environ.get("OPENAI_BASE_URL") or oc.OPENAI_URL
    return url.rstrip("/")


def _api_key(parsed: EmbeddingSpec, url: str, given: str | None) -> str:
    from ctxwarden.llm import openai_compat as oc

    env = {"openai": "OPENAI_API_KEY", "openrouter": "OPENROUTER_API_KEY", "vllm": "VLLM_API_KEY"}
    name = env.get(parsed.provider)
    key = given or (os.environ.get(name) if name else None)
    if not key and url in (oc.OPENAI_URL, oc.OPENROUTER_URL):
        raise ConfigError(
            f"embeddings {parsed.spec!r}: no API key; set the {name} environment variable"
        )
    return key or "EMPTY"  # a self-hosted server usually checks no key; the SDK needs one


class Embedder:
    """A client for one embeddings spec (see the module docstring). :meth:`embed` is
    synchronous: a session's build and the background jobs that call it run in threads."""

    def __init__(self, spec: str, *, api_key: str | None = None) -> None:
        from ctxwarden.llm.openai_compat import _import_openai

        self.parsed = check_embeddings_spec(spec)
        self.spec = spec
        self.model = self.parsed.model
        self.base_url = _base_url(self.parsed)
        self.endpoint = f"{self.base_url}/embeddings"
        self._key = _api_key(self.parsed, self.base_url, api_key)
        self._openai = _import_openai()
        self._client: Any = None

    def _sdk(self) -> Any:
        if self._client is None:
            self._client = self._openai.OpenAI(
                base_url=self.base_url,
                api_key=self._key,
                max_retries=SDK_RETRIES if self.parsed.retries is None else self.parsed.retries,
                timeout=self.parsed.timeout or DEFAULT_TIMEOUT,
            )
        return self._client

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """One vector per text, in order; :class:`~ctxwarden.core.errors.ProviderError`
        naming the endpoint when it fails (after the SDK's retries) or answers wrong."""
        out: list[tuple[float, ...]] = []
        for start in range(0, len(texts), BATCH):
            batch = list(texts[start : start + BATCH])
            try:
                reply = self._sdk().embeddings.create(
                    model=self.model, input=batch, encoding_format="float"
                )
            except self._openai.APIStatusError as exc:
                raise ProviderError(
                    f"embeddings endpoint {self.endpoint} ({self.spec}) answered "
                    f"{exc.status_code}: {exc.message}",
                    status=exc.status_code,
                    provider=self.parsed.provider,
                ) from None
            except self._openai.APIError as exc:  # connection refused, timeout
                raise ProviderError(
                    f"embeddings endpoint {self.endpoint} ({self.spec}) is unreachable: "
                    f"{type(exc).__name__}: {exc}",
                    provider=self.parsed.provider,
                ) from None
            rows = sorted(reply.data, key=lambda d: d.index)
            if len(rows) != len(batch) or any(not r.embedding for r in rows):
                raise ProviderError(
                    f"embeddings endpoint {self.endpoint} ({self.spec}) returned "
                    f"{len(rows)} vectors for {len(batch)} inputs",
                    provider=self.parsed.provider,
                )
            out.extend(tuple(float(x) for x in r.embedding) for r in rows)
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __repr__(self) -> str:
        return f"Embedder({self.spec!r}, endpoint={self.endpoint!r})"
