"""Anthropic's Messages API through the official ``anthropic`` SDK (R12).

What this adds over a plain call:

* **Prompt caching.** ``cache_breakpoints`` (message ids, at most 4) become
  ``cache_control: {"type": "ephemeral"}`` on the last block of those messages, via
  :func:`ctxwarden.formats.anthropic.messages_to_anthropic`; the layout marks where
  its stable prefix ends. Usage keeps cache reads and writes apart
  (``cache_read_input_tokens``, ``cache_creation_input_tokens``), normalised by
  :meth:`Usage.from_anthropic` so ``input_tokens`` counts every input token.
* **JSON mode.** Anthropic has no schema-free JSON switch, and prefilling the
  assistant turn with ``{`` (the old trick) is rejected by current models (Opus 4.6
  and later answer 400). So ``json_mode`` appends a system block asking for one JSON
  object only (after the caller's system blocks, so their cache prefix holds) and
  cuts the reply down to its outermost ``{...}`` when the model wraps it in prose or
  a code fence. Callers still parse defensively (``facts`` uses json-repair).
* **Server-side compaction** (``compaction=True``), passed through unchanged. As
  documented at https://platform.claude.com/docs/en/build-with-claude/compaction
  (checked 2026; beta header listed in the SDK's ``AnthropicBetaParam``):
  beta header ``anthropic-beta: compact-2026-01-12`` and the request field
  ``context_management = {"edits": [{"type": "compact_20260112",
  "trigger": {"type": "input_tokens", "value": N}, "pause_after_compaction": bool,
  "instructions": str}]}`` (trigger default 150,000, minimum 50,000 tokens). The
  reply may then carry a ``compaction`` block (kept in ``Completion.raw``; send it
  back first on the next request) and ``stop_reason == "compaction"`` when paused.
  Compaction's own tokens are reported in ``usage.iterations`` and are *not* in the
  top-level usage, so they are added here. Other edits of the same beta family
  (``clear_tool_uses_20250919``, ``clear_thinking_20251015``; header
  ``context-management-2025-06-27``, https://platform.claude.com/docs/en/build-with-claude/context-editing)
  can be passed in ``context_edits``. Both go through ``client.beta.messages.create``
  with ``betas=[...]`` and ``extra_body``, so older SDKs without typed parameters work.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from typing import Any

from ctxwarden.core.errors import ConfigError, MissingDependencyError, ProviderError
from ctxwarden.core.messages import Message, Part, RawPart, TextPart, ToolCall
from ctxwarden.core.registry.usage import Usage
from ctxwarden.formats.anthropic import messages_to_anthropic
from ctxwarden.llm.base import DEFAULT_TIMEOUT, Completion, LoopLocal, SDKModel, TextStream
from ctxwarden.llm.retry import RetryPolicy, SDKErrors

__all__ = [
    "COMPACTION_BETA",
    "CONTEXT_MANAGEMENT_BETA",
    "AnthropicModel",
    "assistant_message",
    "extract_json_object",
]

COMPACTION_BETA = "compact-2026-01-12"
COMPACTION_EDIT = "compact_20260112"
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
MIN_COMPACTION_TRIGGER = 50_000
_JSON_HINT = (
    "Reply with a single JSON object and nothing else: no prose, no code fence. "
    "Start with { and end with }."
)


def _import_anthropic() -> Any:
    try:
        import anthropic
    except ImportError as exc:
        raise MissingDependencyError("the Anthropic client", "anthropic") from exc
    return anthropic


def extract_json_object(text: str) -> str:
    """The outermost ``{...}`` of ``text`` (prose and code fences dropped), else ``text``."""
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text


def _block_dict(block: Any) -> dict[str, Any]:
    if isinstance(block, Mapping):
        return dict(block)
    data: dict[str, Any] = block.to_dict(mode="json")  # exactly the fields the server sent
    return data


def assistant_message(completion: Completion, **kw: Any) -> Message:
    """The reply as an assistant :class:`Message` to append to the history.

    Blocks we do not model (``compaction``, ``thinking``) ride along verbatim as
    :class:`RawPart` and are sent back unchanged, which server-side compaction needs:
    the next request must carry the ``compaction`` block, and the API then drops
    everything before it. ``tool_use`` blocks become :class:`ToolCall`.
    """
    parts: list[Part] = []
    calls: list[ToolCall] = []
    for block in getattr(completion.raw, "content", None) or ():
        data = _block_dict(block)
        if data.get("type") == "text":
            parts.append(TextPart(str(data.get("text", ""))))
        elif data.get("type") == "tool_use":
            args = json.dumps(data.get("input", {}))
            calls.append(ToolCall(str(data["id"]), str(data["name"]), args))
        else:
            parts.append(RawPart(data))
    if not parts and not calls:
        parts.append(TextPart(completion.text))
    content: str | tuple[Part, ...] | None = tuple(parts) or None
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        content = parts[0].text
    return Message(role="assistant", content=content, tool_calls=tuple(calls), **kw)


def _int(obj: Any, name: str) -> int:
    value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
    return int(value or 0)


def usage_from_anthropic(raw: Any) -> Usage:
    """Top-level usage plus any ``compaction`` iterations (billed, but not in the total)."""
    if raw is None:
        return Usage()
    fields = (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    )
    totals = [_int(raw, f) for f in fields]
    for it in getattr(raw, "iterations", None) or ():
        kind = it.get("type") if isinstance(it, Mapping) else getattr(it, "type", None)
        if kind == "compaction":
            totals = [t + _int(it, f) for t, f in zip(totals, fields, strict=True)]
    return Usage.from_anthropic(*totals)


class AnthropicModel(SDKModel):
    """A Claude model through ``AsyncAnthropic``.

    The key comes from ``api_key`` or the SDK's environment (``ANTHROPIC_API_KEY``,
    ``ANTHROPIC_AUTH_TOKEN``, ``ANTHROPIC_PROFILE``); ``base_url`` from the argument or
    ``ANTHROPIC_BASE_URL``. ``max_tokens`` is required by the API, hence a default.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 1024,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float | None = None,
        retry: RetryPolicy | None = None,
        compaction: bool = False,
        compaction_trigger: int | None = None,
        compaction_instructions: str | None = None,
        pause_after_compaction: bool = False,
        context_edits: Sequence[Mapping[str, Any]] = (),
        betas: Collection[str] = (),
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ConfigError("anthropic: a model name is required")
        if max_tokens < 1:
            raise ConfigError(f"anthropic: max_tokens must be at least 1, got {max_tokens}")
        if compaction_trigger is not None and compaction_trigger < MIN_COMPACTION_TRIGGER:
            raise ConfigError(
                f"anthropic: compaction_trigger must be at least {MIN_COMPACTION_TRIGGER:,} "
                f"input tokens (the API's minimum), got {compaction_trigger:,}"
            )
        anthropic = _import_anthropic()
        env = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE")
        if not api_key and not any(os.environ.get(name) for name in env):
            raise ConfigError(
                "anthropic: no API key; pass api_key=... or set the ANTHROPIC_API_KEY "
                "environment variable"
            )
        self.model = model
        self.name = f"anthropic:{model}"
        self.provider = "anthropic"
        self.max_tokens = max_tokens
        self.timeout = timeout  # per attempt
        self.deadline = timeout if deadline is None else deadline  # the whole call
        self.retry = retry or RetryPolicy()
        self.extra_body = dict(extra_body or {})
        edits = [dict(e) for e in context_edits]
        beta_names = list(betas)
        if compaction:
            edit: dict[str, Any] = {"type": COMPACTION_EDIT}
            if compaction_trigger is not None:
                edit["trigger"] = {"type": "input_tokens", "value": compaction_trigger}
            if pause_after_compaction:
                edit["pause_after_compaction"] = True
            if compaction_instructions:
                edit["instructions"] = compaction_instructions
            edits.append(edit)
            beta_names.append(COMPACTION_BETA)
        if any(e.get("type") != COMPACTION_EDIT for e in edits):
            beta_names.append(CONTEXT_MANAGEMENT_BETA)
        self.betas = tuple(dict.fromkeys(beta_names))  # ordered, unique
        if edits:
            self.extra_body["context_management"] = {"edits": edits}
        self._errors = SDKErrors(anthropic, "anthropic")
        self._client: LoopLocal[Any] = LoopLocal(
            lambda: anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
            )
        )

    def _create(self, client: Any) -> Any:
        """``messages.create`` or, with betas, ``beta.messages.create(betas=...)``."""
        return client.beta.messages.create if self.betas else client.messages.create

    def _params(
        self,
        messages: Sequence[Message],
        max_tokens: int | None,
        temperature: float | None,
        json_mode: bool,
        cache_breakpoints: Collection[str],
    ) -> dict[str, Any]:
        system, turns = messages_to_anthropic(messages, cache_breakpoints=cache_breakpoints)
        if json_mode:
            system = [*(system or []), {"type": "text", "text": _JSON_HINT}]
        params: dict[str, Any] = {
            "model": self.model,
            "messages": turns,
            "max_tokens": max_tokens or self.max_tokens,
        }
        if system:
            params["system"] = system
        if self.betas:
            params["betas"] = list(self.betas)
        extra = dict(self.extra_body)
        if temperature is not None:  # the 2.x SDK dropped the typed parameter; the API reads it
            extra["temperature"] = temperature
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
        """One message, retried per the policy; raises ProviderError / ProviderTimeout."""
        params = self._params(messages, max_tokens, temperature, json_mode, cache_breakpoints)
        create = self._create(self._client.get())
        response = await self._call(lambda: create(**params))
        content = getattr(response, "content", None)
        if content is None:
            raise ProviderError(
                "anthropic: the response has no content", status=200, provider="anthropic"
            )
        text = "".join(b.text for b in content if getattr(b, "type", None) == "text")
        if json_mode:
            text = extract_json_object(text)
        return Completion(
            text=text,
            usage=usage_from_anthropic(getattr(response, "usage", None)),
            model=getattr(response, "model", None) or self.model,
            finish_reason=getattr(response, "stop_reason", None),
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
        """Stream text deltas. Input and cache usage arrive in ``message_start``, output
        tokens and the stop reason in ``message_delta``. Only opening is retried."""
        params = self._params(messages, max_tokens, temperature, json_mode, cache_breakpoints)
        params["stream"] = True

        async def deltas(out: TextStream) -> AsyncGenerator[str, None]:
            create = self._create(self._client.get())
            events = await self._call(lambda: create(**params))
            counts = {"input": 0, "output": 0, "read": 0, "write": 0}
            async with self._sdk_stream(events):
                async for event in events:
                    out.raw.append(event)
                    kind = getattr(event, "type", None)
                    if kind == "message_start":
                        u = event.message.usage
                        counts.update(
                            input=_int(u, "input_tokens"),
                            output=_int(u, "output_tokens"),
                            read=_int(u, "cache_read_input_tokens"),
                            write=_int(u, "cache_creation_input_tokens"),
                        )
                    elif kind == "content_block_delta" and event.delta.type == "text_delta":
                        yield event.delta.text
                    elif kind == "message_delta":
                        out.finish_reason = event.delta.stop_reason
                        counts["output"] = _int(event.usage, "output_tokens")
                    out.usage = Usage.from_anthropic(
                        counts["input"], counts["output"], counts["read"], counts["write"]
                    )

        return TextStream(deltas, self.model)

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, betas={list(self.betas)!r})"
