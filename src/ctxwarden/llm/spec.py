"""Provider spec strings for the CLI and config files: ``provider:model[@base_url]``.

The grammar is deliberately small:

* ``offline`` — the built-in extractive summariser; returned as the string
  ``"offline"`` for the caller to wire (it is not a :class:`ChatModel`).
* ``PROVIDER:MODEL`` — the first colon ends the provider, so model names keep their
  own colons (``ollama:qwen3:8b``) and slashes (``openrouter:meta-llama/llama-3.1-8b-instruct``).
* ``PROVIDER:MODEL@URL`` — an explicit base URL, recognised only when ``@`` is
  followed by ``http://`` or ``https://`` (model ids such as Vertex's
  ``claude-3-5-sonnet@20240620`` keep their ``@``):
  ``vllm:meta-llama/Llama-3.1-8B-Instruct@http://gpu-box:8000/v1``.

Providers: ``openai``, ``anthropic``, ``openrouter``, ``ollama``, ``vllm``, ``lmstudio``.
Keys come from the environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
``OPENROUTER_API_KEY``, ``VLLM_API_KEY``), never from the spec, so specs can be logged.
"""

from __future__ import annotations

import re
from typing import Any

from ctxwarden.errors import ConfigError
from ctxwarden.llm.base import ChatModel
from ctxwarden.llm.retry import RetryPolicy

__all__ = ["PROVIDERS", "parse_spec"]

PROVIDERS = ("openai", "anthropic", "openrouter", "ollama", "vllm", "lmstudio")
_URL = re.compile(r"^(?P<model>.+?)@(?P<url>https?://\S+)$")
_FORMS = (
    "offline | openai:gpt-4o-mini | anthropic:claude-haiku-4-5 | ollama:qwen3:8b | "
    "openrouter:meta-llama/llama-3.1-8b-instruct | vllm:MODEL@http://host:8000/v1 | "
    "lmstudio:MODEL (any provider takes @http(s)://base-url)"
)


def parse_spec(
    spec: str, *, timeout: float | None = None, retry: RetryPolicy | None = None
) -> ChatModel | str:
    """Build the client a spec names (``"offline"`` stays a string).

    Raises :class:`ConfigError` listing the valid forms for anything else.
    """
    text = spec.strip()
    if text.lower() == "offline":
        return "offline"
    provider, sep, rest = text.partition(":")
    provider = provider.lower()
    if not sep or not rest or provider not in PROVIDERS:
        reason = (
            f"unknown provider {provider!r}" if sep and provider not in PROVIDERS else "no model"
        )
        raise ConfigError(f"bad model spec {spec!r} ({reason}); valid forms: {_FORMS}")
    model, base_url = rest, None
    match = _URL.match(rest)
    if match:
        model, base_url = match["model"], match["url"]
    if not model or model.startswith("@"):
        raise ConfigError(f"bad model spec {spec!r} (no model); valid forms: {_FORMS}")
    options: dict[str, Any] = {}
    if timeout is not None:
        options["timeout"] = timeout
    if retry is not None:
        options["retry"] = retry
    if base_url is not None:
        options["base_url"] = base_url
    if provider == "anthropic":
        from ctxwarden.llm.anthropic_client import AnthropicModel

        return AnthropicModel(model, **options)
    from ctxwarden.llm.openai_compat import OpenAICompatible

    if provider == "openai":
        return OpenAICompatible(model, **options)
    preset = getattr(OpenAICompatible, provider)
    client: ChatModel = preset(model, **options)
    return client
