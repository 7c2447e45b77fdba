"""Summaries and facts written by a model (R7, R8), through the :class:`ChatModel` protocol.

The summariser model can be cheaper than the agent's (seeds 000 and 004): any
:class:`ChatModel` will do. Failures become :class:`SummarizationError` — an empty
answer, unparseable or invalid facts, or the provider's own error (kept as the
cause) — so one ``except`` in the caller keeps every message in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxwarden.core.errors import ConfigError, RuntimeFailure, SummarizationError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.llm.base import ChatModel, Completion, run_sync
from ctxwarden.memory.facts import (
    Facts,
    FactSchema,
    normalize_key,
    parse_facts_json,
    schema_fields,
    schema_for_prompt,
    validate_facts,
)
from ctxwarden.memory.prompts import (
    FACTS_SYSTEM,
    SUMMARY_SYSTEM,
    SummaryTemplate,
    fact_field_prompt,
    facts_prompt,
    get_template,
    meta_summary_prompt,
    render_transcript,
)
from ctxwarden.memory.summaries import SummaryResult

__all__ = ["LLMFactExtractor", "LLMSummarizer", "run_sync"]


def _clip(messages: Sequence[Message], limit: int) -> list[Message]:
    """Bound each message's text so one huge tool result cannot blow the prompt."""
    out = []
    for m in messages:
        if m.content is not None and len(m.text) > limit:
            m = m.with_content(m.text[:limit] + f" …[{len(m.text) - limit} chars cut]")
        out.append(m)
    return out


async def _ask(model: ChatModel, system: str, prompt: str, **kw: Any) -> Completion:
    try:
        return await model.complete([Message.system(system), Message.user(prompt)], **kw)
    except RuntimeFailure as exc:
        raise SummarizationError(f"{getattr(model, 'name', 'model')}: {exc}") from exc


@dataclass(frozen=True)
class LLMSummarizer:
    """Summaries from a model with a domain or custom template (:mod:`ctxwarden.memory.prompts`)."""

    model: ChatModel
    template: str | SummaryTemplate = "general"
    max_tokens: int = 800
    meta_max_tokens: int = 1500
    temperature: float | None = 0.2
    max_chars_per_message: int = 4000

    def __post_init__(self) -> None:
        object.__setattr__(self, "template", get_template(self.template))

    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        if not messages:
            return SummaryResult(previous or "", Usage(calls=0))
        template = get_template(self.template)
        transcript = render_transcript(_clip(messages, self.max_chars_per_message))
        done = await _ask(
            self.model,
            SUMMARY_SYSTEM,
            template.render(transcript, previous),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
        )
        return _checked(done)

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        if len(summaries) == 1:
            return SummaryResult(summaries[0], Usage(calls=0))
        done = await _ask(
            self.model,
            SUMMARY_SYSTEM,
            meta_summary_prompt(summaries),
            max_tokens=self.meta_max_tokens,
            temperature=self.temperature,
        )
        return _checked(done)

    def summarize_sync(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        return run_sync(self.summarize(messages, previous))


def _checked(done: Completion) -> SummaryResult:
    text = done.text.strip()
    if not text:
        reason = f" (finish_reason={done.finish_reason})" if done.finish_reason else ""
        raise SummarizationError(f"the summariser model {done.model} returned nothing{reason}")
    return SummaryResult(text, done.usage)


@dataclass(frozen=True)
class LLMFactExtractor:
    """Facts from a model: one JSON call for all facts, or one call per field.

    ``per_fact=True`` suits small local models that break a many-key JSON object
    (seed 000); it needs a schema. In that mode a field whose answer cannot be read
    is skipped, and only when every field fails is it an error.
    """

    model: ChatModel
    schema: FactSchema = None
    per_fact: bool = False
    max_tokens: int = 600
    max_chars_per_message: int = 4000

    def __post_init__(self) -> None:
        if self.per_fact and self.schema is None:
            raise ConfigError("per-fact extraction needs a schema: its fields are the questions")
        schema_fields(self.schema)  # a bad schema fails here, not at the first call

    async def extract(
        self, messages: Sequence[Message], existing: Facts, schema: FactSchema = None
    ) -> Facts:
        facts, _ = await self.extract_with_usage(messages, existing, schema)
        return facts

    async def extract_with_usage(
        self, messages: Sequence[Message], existing: Facts, schema: FactSchema = None
    ) -> tuple[Facts, Usage]:
        """Like :meth:`extract`, also returning the tokens the calls used."""
        schema = schema if schema is not None else self.schema
        if not messages:
            return existing, Usage(calls=0)
        transcript = render_transcript(_clip(messages, self.max_chars_per_message))
        source = messages[-1].id or None
        if self.per_fact:
            return await self._per_fact(transcript, existing, schema, source)
        done = await _ask(
            self.model,
            FACTS_SYSTEM,
            facts_prompt(schema_for_prompt(schema), transcript, existing.to_dict()),
            max_tokens=self.max_tokens,
            temperature=0.0,
            json_mode=True,
        )
        found = validate_facts(parse_facts_json(done.text, truncated=_cut(done)), schema)
        return existing.merge(found, source=source), done.usage

    async def _per_fact(
        self, transcript: str, existing: Facts, schema: FactSchema, source: str | None
    ) -> tuple[Facts, Usage]:
        usage = Usage(calls=0)
        found: dict[str, Any] = {}
        errors: list[str] = []
        for name, desc in schema_fields(schema).items():
            try:
                done = await _ask(
                    self.model,
                    FACTS_SYSTEM,
                    fact_field_prompt(name, desc, transcript),
                    max_tokens=120,
                    temperature=0.0,
                    json_mode=True,
                )
                usage = usage + done.usage
                parsed = parse_facts_json(done.text, truncated=_cut(done))
                answer = {normalize_key(k): v for k, v in parsed.items()}
                if normalize_key(name) in answer:
                    found.update(validate_facts({name: answer[normalize_key(name)]}, schema))
            except SummarizationError as exc:
                errors.append(f"{name}: {exc}")
        if errors and len(errors) == len(schema_fields(schema)):
            raise SummarizationError("every per-fact extraction failed: " + "; ".join(errors))
        return existing.merge(found, source=source), usage

    def extract_sync(
        self, messages: Sequence[Message], existing: Facts | None = None, schema: FactSchema = None
    ) -> Facts:
        return run_sync(self.extract(messages, existing or Facts(), schema))


def _cut(done: Completion) -> bool:
    """Whether the answer stopped at ``max_tokens`` (OpenAI ``length``, Anthropic
    ``max_tokens``): its last value may be cut even outside a string."""
    return done.finish_reason in ("length", "max_tokens")
