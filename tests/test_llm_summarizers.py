"""Model-backed summaries and facts, through a scripted ChatModel (the real SDKs are
tested with the provider clients); and the prompt templates they use."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from ctxwarden.core.errors import ConfigError, ProviderError, SummarizationError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.registry.usage import Usage
from ctxwarden.llm.base import ChatModel, Completion
from ctxwarden.llm.summarizers import LLMFactExtractor, LLMSummarizer
from ctxwarden.memory.facts import Facts
from ctxwarden.memory.prompts import (
    DOMAIN_TEMPLATES,
    custom_template,
    get_template,
    render_transcript,
)
from ctxwarden.memory.summaries import SummaryState, SummaryTrigger, summarize_cycle


class ScriptedModel:
    """Answers from a list (an exception is raised instead), recording every request."""

    name = "scripted"

    def __init__(self, answers: Sequence[str | Exception]) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_mode: bool = False,
        cache_breakpoints: Collection[str] = (),
    ) -> Completion:
        self.requests.append(
            {"prompt": messages[-1].text, "json_mode": json_mode, "max_tokens": max_tokens}
        )
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Completion(answer, Usage(input_tokens=200, output_tokens=30), "scripted-1")


CONVO = [
    Message.user("My budget is 1500 USD, size L.", id="m1"),
    Message.assistant(tool_calls=(ToolCall("c1", "search", '{"q": "parka"}'),), id="m2"),
    Message.tool("Arctic Parka id=847 1290 USD", "c1", name="search", id="m3"),
    Message.assistant("The Arctic Parka (847) fits your budget.", id="m4"),
]


def test_the_fake_speaks_the_protocol() -> None:
    assert isinstance(ScriptedModel([]), ChatModel)


async def test_summary_prompt_passes_the_previous_summary_and_domain_list() -> None:
    model = ScriptedModel(["New summary."])
    result = await LLMSummarizer(model, template="ecommerce").summarize(
        CONVO, previous="OLD SUMMARY"
    )
    assert result.text == "New summary." and result.usage.input_tokens == 200
    prompt = model.requests[0]["prompt"]
    assert "OLD SUMMARY" in prompt and "merge the summary so far" in prompt
    assert "clothing size" in prompt and "budget with its currency" in prompt
    assert 'Assistant: [called search({"q": "parka"})]' in prompt
    assert "Tool result (search): Arctic Parka id=847 1290 USD" in prompt


async def test_empty_answers_and_provider_errors_become_summarization_errors() -> None:
    with pytest.raises(SummarizationError, match="returned nothing"):
        await LLMSummarizer(ScriptedModel(["  \n"])).summarize(CONVO)
    with pytest.raises(SummarizationError, match="HTTP 500") as info:
        await LLMSummarizer(ScriptedModel([ProviderError("HTTP 500", status=500)])).summarize(CONVO)
    assert isinstance(info.value.__cause__, ProviderError)


async def test_meta_summary_merges_parts_in_order() -> None:
    model = ScriptedModel(["merged"])
    result = await LLMSummarizer(model).merge(["first part", "second part"])
    assert result.text == "merged"
    prompt = model.requests[0]["prompt"]
    assert prompt.index("--- Part 1 ---\nfirst part") < prompt.index("--- Part 2 ---\nsecond part")


async def test_one_call_extracts_all_facts_from_prose_wrapped_json() -> None:
    model = ScriptedModel(
        ['Here you go:\n```json\n{"size": "L", "budget": 1500, "colour": None,}\n```']
    )
    existing = Facts().merge({"colour": "olive"}, source="m0")
    extractor = LLMFactExtractor(model)
    facts, usage = await extractor.extract_with_usage(CONVO, existing)
    assert facts.to_dict() == {"colour": "olive", "size": "L", "budget": 1500}
    assert facts.source("size") == "m4" and usage.output_tokens == 30
    request = model.requests[0]
    assert request["json_mode"] is True and '"colour": "olive"' in request["prompt"]


async def test_unparseable_facts_raise() -> None:
    with pytest.raises(SummarizationError, match="JSON"):
        await LLMFactExtractor(ScriptedModel(["I am not sure what you mean."])).extract(
            CONVO, Facts()
        )


class Shop(BaseModel):
    size: str | None = None
    budget: float | None = None
    order_id: str | None = None


async def test_per_fact_mode_asks_once_per_field_and_skips_a_broken_one() -> None:
    model = ScriptedModel(['{"size": "L"}', "no idea, sorry", '{"order_id": null}'])
    facts = await LLMFactExtractor(model, Shop, per_fact=True).extract(CONVO, Facts())
    assert facts.to_dict() == {"size": "L"}
    assert [r["prompt"].split("What is the ")[1].split(" (")[0] for r in model.requests] == [
        "size",
        "budget",
        "order_id",
    ]
    failing = ScriptedModel(["?", "?", "?"])
    with pytest.raises(SummarizationError, match="every per-fact extraction failed"):
        await LLMFactExtractor(failing, Shop, per_fact=True).extract(CONVO, Facts())
    with pytest.raises(ConfigError, match="needs a schema"):
        LLMFactExtractor(model, None, per_fact=True)


async def test_cycle_with_model_counts_both_calls_and_survives_a_failure() -> None:
    msgs = [*CONVO, *[Message.user(f"q{i}", id=f"q{i}") for i in range(8)]]
    trigger = SummaryTrigger(max_messages=10, keep_recent=3, fill_ratio=None)
    model = ScriptedModel(['{"size": "L"}', "The user wants a parka in size L."])
    args: dict[str, Any] = {"trigger": trigger, "count": lambda m: 5}
    result = await summarize_cycle(
        msgs,
        state=SummaryState(),
        facts=Facts(),
        summarizer=LLMSummarizer(model),
        extractor=LLMFactExtractor(model),
        **args,
    )
    assert result.summarized and result.usage.calls == 2 and result.usage.input_tokens == 400
    assert result.facts["size"] == "L"
    broken = ScriptedModel(["not json at all"])
    failed = await summarize_cycle(
        msgs,
        state=SummaryState(),
        facts=Facts(),
        summarizer=LLMSummarizer(broken),
        extractor=LLMFactExtractor(broken),
        **args,
    )
    assert failed.error and "SummarizationError" in failed.error and not failed.summarized


def test_templates_cover_the_domains_and_check_placeholders() -> None:
    assert {"support", "debate", "document", "coding", "ecommerce"} <= set(DOMAIN_TEMPLATES)
    assert "file paths" in " ".join(DOMAIN_TEMPLATES["coding"].keep)
    assert "ticket, case and order ids" in DOMAIN_TEMPLATES["support"].keep
    custom = get_template('Keep JSON like {"a": 1}. Old: {previous_summary}\nNew: {conversation}')
    assert custom.render("U: hi", None) == 'Keep JSON like {"a": 1}. Old: (none yet)\nNew: U: hi'
    with pytest.raises(ConfigError, match=r"\{previous_summary\}"):
        custom_template("Summarise: {conversation}")
    with pytest.raises(ConfigError, match="unknown summary template 'legal'"):
        get_template("legal")


def test_transcript_leaves_out_system_messages() -> None:
    text = render_transcript([Message.system("secret rules"), *CONVO[:1]])
    assert text == "User: My budget is 1500 USD, size L."
