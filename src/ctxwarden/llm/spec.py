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

* ``...?timeout=SECONDS&retries=N`` — options at the end of any spec: ``timeout`` is
  the deadline of a whole call (retries included), ``retries`` how many times a failed
  call is retried (``openai:gpt-4o-mini?timeout=5&retries=1``). The ``timeout=`` and
  ``retry=`` arguments of :func:`parse_spec`, when given, take precedence.

Providers: ``openai``, ``anthropic``, ``openrouter``, ``ollama``, ``vllm``, ``lmstudio``.
Keys come from the environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
``OPENROUTER_API_KEY``, ``VLLM_API_KEY``), never from the spec, so specs can be logged.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.llm.base import ChatModel
from ctxwarden.llm.retry import RetryPolicy

__all__ = [
    "PROVIDERS",
    "SPEC_OPTIONS",
    "check_spec",
    "check_timeout",
    "parse_spec",
    "split_options",
]

PROVIDERS = ("openai", "anthropic", "openrouter", "ollama", "vllm", "lmstudio")
_URL = re.compile(r"^(?P<model>.+?)@(?P<url>https?://\S+)$")
_OPTIONS = re.compile(r"^(?P<body>.*?)\?(?P<options>\w+=[^&?=]*(?:&\w+=[^&?=]*)*)$")
SPEC_OPTIONS = ("timeout", "retries")
_FORMS = (
    "offline | openai:gpt-4o-mini | anthropic:claude-haiku-4-5 | ollama:qwen3:8b | "
    "openrouter:meta-llama/llama-3.1-8b-instruct | vllm:MODEL@http://host:8000/v1 | "
    "lmstudio:MODEL (any provider takes @http(s)://base-url)"
)


def check_spec(spec: str) -> tuple[str, str, str | None, float | None, RetryPolicy | None]:
    """``(provider, model, base_url, timeout, retry)`` a spec names, read without making a
    client (an argument check up front costs nothing); ``("offline", "", ...)`` for the
    offline one. Raises :class:`ConfigError` listing the valid forms for anything else."""
    if not isinstance(spec, str):
        raise ConfigError(f"a model spec must be a str, got {type(spec).__name__}")
    text, timeout, retry = split_options(spec.strip())
    if text.lower() == "offline":
        return "offline", "", None, timeout, retry
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
    return provider, model, base_url, timeout, retry


def parse_spec(
    spec: str, *, timeout: float | None = None, retry: RetryPolicy | None = None
) -> ChatModel | str:
    """Build the client a spec names (``"offline"`` stays a string).

    Raises :class:`ConfigError` listing the valid forms for anything else.
    """
    provider, model, base_url, spec_timeout, spec_retry = check_spec(spec)
    timeout = check_timeout(timeout) if timeout is not None else spec_timeout
    retry = retry if retry is not None else spec_retry
    if provider == "offline":
        return "offline"
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


def check_timeout(value: object, name: str = "timeout") -> float:
    """A timeout in seconds: a finite number above zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number of seconds above 0, got {value!r}")
    return float(value)


def split_options(spec: str) -> tuple[str, float | None, RetryPolicy | None]:
    """``(spec without options, timeout, retry policy)`` from a ``...?timeout=5&retries=1``
    suffix; an unknown option or a bad value is a :class:`ConfigError`."""
    match = _OPTIONS.match(spec)
    if match is None:
        return spec, None, None
    timeout: float | None = None
    retry: RetryPolicy | None = None
    for item in match["options"].split("&"):
        key, _, value = item.partition("=")
        if key == "timeout":
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            timeout = check_timeout(seconds, f"spec option timeout={value!r}: the timeout")
        elif key == "retries":
            if not value.isdigit() or int(value) > 100:
                raise ConfigError(
                    f"spec option retries={value!r}: retries must be a whole number 0..100"
                )
            retry = RetryPolicy(max_attempts=int(value) + 1)
        else:
            raise ConfigError(
                f"unknown spec option {key!r} in {spec!r}; options: {', '.join(SPEC_OPTIONS)}"
            )
    return match["body"], timeout, retry
