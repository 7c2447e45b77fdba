"""The summariser and fact extractor one bench run shares, offline or a real model.

Every strategy that summarises (the seeds' hand-written ones and ours) calls the same
:class:`BenchSummarizer`, so a ``--summarizer`` spec changes them all at once. It
returns each call's text *and* its cost, because the report prices summariser calls:

* offline (the default) or a plain callable ``(messages, previous) -> str``: the usage
  is what the call *would* cost on a model (:func:`summary_usage`), priced at the
  scenario's model, so strategies compare as the seeds compare them;
* a model (a spec such as ``openai:gpt-4o-mini``, a :class:`~ctxwarden.llm.ChatModel`
  or an :class:`~ctxwarden.llm.summarizers.LLMSummarizer`): the provider's reported
  usage, priced at that model's registry price (unpriced, with a note, when the
  registry does not know it). Facts come from an
  :class:`~ctxwarden.llm.summarizers.LLMFactExtractor` on the same model.

A failed model call never changes what a strategy holds: the call comes back with
``error`` set and no text, the strategy keeps its messages (falling back to its
window) and its :class:`Account` counts the failure for the report.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ctxwarden.core.errors import RuntimeFailure, UnknownModelError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.memory.facts import Facts, FactSchema
from ctxwarden_bench.live import ModelRunner, describe_failure

__all__ = [
    "Account",
    "BenchSummarizer",
    "FactsCall",
    "Summarizer",
    "SummaryCall",
    "extractive_summary",
    "get_summarizer",
    "registry_price",
    "summarizer_for",
    "summary_usage",
]


class Summarizer(Protocol):
    """Merges ``previous`` (the last summary, if any) with what ``messages`` say."""

    def __call__(self, messages: Sequence[Message], previous: str | None) -> str: ...


@dataclass(frozen=True)
class SummaryCall:
    """One summariser call: the new text (``None`` when it failed) and its usage."""

    text: str | None
    usage: Usage
    error: str | None = None


@dataclass(frozen=True)
class FactsCall:
    """One fact extraction: the merged facts (the old ones when it failed) and its usage."""

    facts: Facts
    usage: Usage
    error: str | None = None


@dataclass
class Account:
    """What one strategy's summariser and extractor calls cost, and which ones failed.

    Mutable on purpose: a strategy adds each call as it makes it.
    """

    usage: Usage = field(default_factory=lambda: Usage(calls=0))
    errors: list[str] = field(default_factory=list)

    def add(self, usage: Usage, error: str | None = None) -> None:
        self.usage = self.usage + usage
        if error is not None:
            self.errors.append(error)

    def to_json(self) -> dict[str, Any]:
        return {"summarizer_failures": len(self.errors), "summarizer_errors": self.errors[:3]}


def summary_usage(
    counter: TokenCounter, fold: Sequence[Message], previous: str | None, text: str
) -> Usage:
    """What one summariser call would cost on a model: the folded messages and the
    previous summary in, the new summary out (priced even when the summariser is
    offline, so strategies compare as the seed compares them)."""
    prompt = counter.count_messages(fold).tokens + (counter.count_text(previous) if previous else 0)
    return Usage(input_tokens=prompt + 100, output_tokens=counter.count_text(text))


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def extractive_summary(
    messages: Sequence[Message], previous: str | None, max_sentences: int = 12
) -> str:
    """A deliberately plain extractive summary: the previous one, then the first
    sentence of each user and assistant text (tool output left out). Used only when the
    package's offline summariser is not installed."""
    lines = [previous] if previous else []
    picked = 0
    for m in messages:
        if m.role not in ("user", "assistant") or not m.text.strip():
            continue
        first = _SENTENCE.split(m.text.strip(), maxsplit=1)[0]
        lines.append(f"The {m.role} said: {first[:240]}")
        picked += 1
        if picked >= max_sentences:
            break
    return "\n".join(lines)


class BenchSummarizer:
    """Summaries and facts for every strategy of one bench run (see the module docstring).

    Build it with :func:`get_summarizer`. ``real`` says whether calls go to a model;
    ``label`` names the summariser in the report; ``priced_as`` is the registry model its
    calls are priced at (``None``: the scenario's model when offline, unpriced when the
    registry does not know the model). Close it (or use it as a context manager) to
    release a model's connections.
    """

    def __init__(
        self,
        label: str,
        *,
        write: Summarizer | None = None,
        llm: Any = None,
        extractor: Any = None,
    ) -> None:
        from ctxwarden.llm.offline import RuleBasedFactExtractor

        self.label = label
        self.real = llm is not None
        self._write = write
        self._llm = llm
        self._extractor = extractor
        self._rules = RuleBasedFactExtractor()
        self._runner: ModelRunner | None = ModelRunner() if self.real else None
        self.priced_as: str | None = None
        self.price_note = "priced at the scenario's model (what the call would cost there)"
        if self.real:
            self.priced_as, self.price_note = registry_price(llm.model)

    # -- summaries --------------------------------------------------------------------------

    def summarize(
        self, fold: Sequence[Message], previous: str | None, counter: TokenCounter
    ) -> SummaryCall:
        """One summary of ``fold`` merged with ``previous``; failures come back as data."""
        if self._runner is None:  # offline: never fails, usage as a model call would be
            assert self._write is not None
            text = self._write(fold, previous)
            return SummaryCall(text, summary_usage(counter, fold, previous, text))
        try:
            result = self._runner.run(self._llm.summarize(fold, previous))
        except RuntimeFailure as exc:
            return SummaryCall(None, Usage(calls=0), describe_failure(exc))
        return SummaryCall(result.text, result.usage)

    # -- facts ------------------------------------------------------------------------------

    def extract(
        self, messages: Sequence[Message], existing: Facts, schema: FactSchema = None
    ) -> FactsCall:
        """Facts from ``messages`` merged into ``existing``: rule-based and free offline,
        one model call (JSON for all facts) otherwise; a failure keeps ``existing``."""
        if self._runner is None:
            return FactsCall(self._rules.extract_sync(messages, existing, schema), Usage(calls=0))
        try:
            facts, usage = self._runner.run(
                self._extractor.extract_with_usage(messages, existing, schema)
            )
        except RuntimeFailure as exc:
            return FactsCall(existing, Usage(calls=0), "facts: " + describe_failure(exc))
        return FactsCall(facts, usage)

    # -- pricing and reporting --------------------------------------------------------------

    def cost(self, usage: Usage, scenario_model: str) -> float:
        """Dollars for ``usage`` of this summariser (see ``priced_as``)."""
        from ctxwarden.core.registry.cost import estimate_cost

        if not usage.calls:
            return 0.0
        if not self.real:
            return estimate_cost(usage, scenario_model)
        return estimate_cost(usage, self.priced_as) if self.priced_as else 0.0

    def describe(self) -> dict[str, Any]:
        """The report's record of which summariser ran and how its calls are priced."""
        return {
            "name": self.label,
            "real_model": self.real,
            "priced_as": self.priced_as,
            "pricing": self.price_note,
        }

    def close(self) -> None:
        """Release a model's connections (later calls are a usage error)."""
        if self._runner is not None:
            self._runner.close(self._llm.model)

    def __enter__(self) -> BenchSummarizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def registry_price(model: Any) -> tuple[str | None, str]:
    """``(registry name or None, how calls are priced)`` for a model client."""
    from ctxwarden.core.registry.catalog import get_model

    name = str(getattr(model, "model", None) or getattr(model, "name", "model"))
    try:
        found = get_model(name).name
    except UnknownModelError:
        return None, f"{name} is not in the model registry: its calls are counted, not priced"
    return found, f"at the registry's {found} price, from the provider's reported usage"


SummarizerSpec = str | Summarizer | BenchSummarizer | Any
"""``"offline"``, a provider spec, a ChatModel, an LLMSummarizer, a callable, or a
ready :class:`BenchSummarizer`."""


def get_summarizer(spec: SummarizerSpec = "offline") -> BenchSummarizer:
    """The :class:`BenchSummarizer` for a spec or object (see :data:`SummarizerSpec`).

    A bad spec or a missing key is a :class:`~ctxwarden.core.errors.ConfigError` raised here,
    before any scenario runs.
    """
    from ctxwarden.llm.base import ChatModel
    from ctxwarden.llm.summarizers import LLMFactExtractor, LLMSummarizer

    if isinstance(spec, BenchSummarizer):
        return spec
    if isinstance(spec, str):
        if spec.strip().lower() == "offline":
            found = _package_offline_summarizer()
            if found is not None:
                return BenchSummarizer("offline", write=found)
            return BenchSummarizer("extractive-fallback", write=extractive_summary)
        from ctxwarden.llm.spec import parse_spec

        parsed = parse_spec(spec)
        assert not isinstance(parsed, str)  # only "offline" stays a string
        spec = parsed
    if isinstance(spec, LLMSummarizer):
        return BenchSummarizer(spec.model.name, llm=spec, extractor=LLMFactExtractor(spec.model))
    if isinstance(spec, ChatModel):
        return BenchSummarizer(spec.name, llm=LLMSummarizer(spec), extractor=LLMFactExtractor(spec))
    if callable(spec):
        name = getattr(spec, "__name__", type(spec).__name__)
        return BenchSummarizer(str(name), write=spec)
    from ctxwarden.core.errors import ConfigError

    raise ConfigError(
        f"a bench summariser is 'offline', a provider spec (openai:gpt-4o-mini, ...), a "
        f"ChatModel, an LLMSummarizer or a (messages, previous) -> str callable; got {spec!r}"
    )


def _package_offline_summarizer() -> Summarizer | None:
    """Adapter to :class:`ctxwarden.llm.offline.OfflineSummarizer` (extractive, no model)."""
    try:
        from ctxwarden.llm.offline import OfflineSummarizer
    except ImportError:  # pragma: no cover - ships with the package
        return None
    engine = OfflineSummarizer()

    def summarize(messages: Sequence[Message], previous: str | None) -> str:
        return engine.summarize_sync(messages, previous).text

    return summarize


@contextmanager
def summarizer_for(spec: SummarizerSpec) -> Iterator[BenchSummarizer]:
    """:func:`get_summarizer` for one scenario run: closed at the end unless the caller
    passed a ready :class:`BenchSummarizer` (its owner closes it)."""
    summarizer = get_summarizer(spec)
    try:
        yield summarizer
    finally:
        if summarizer is not spec:
            summarizer.close()
