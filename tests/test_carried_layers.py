"""Layers of an earlier build fed back as history: recognised by their headings through
every format, and replaced, never stacked (issue 35, item 4; :mod:`ctxwarden.pipeline.carried`).

The adapters' own loops are in ``test_integration_*.py``; here the property they rest on,
over the recorded dev runs: a built context built again is the same context.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest import SHARED_DATA
from test_integration_common import load_replay

import ctxwarden
from ctxwarden import Message
from ctxwarden.core.errors import BudgetError
from ctxwarden.formats.anthropic import messages_from_anthropic, messages_to_anthropic
from ctxwarden.integrations._common import ContextBuilder
from ctxwarden.pipeline.carried import (
    Carried,
    layer_name,
    ledger_entities,
    split_folded,
    strip_layers,
)
from ctxwarden_bench.swebench import load_swebench

SWEBENCH = SHARED_DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"


def _texts(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in messages]


def _built_again_is_itself(
    runs: list[list[Message]], budgets: Sequence[int], step: int, model: str = "gpt-4o"
) -> tuple[int, set[str | None]]:
    """How many prefixes of ``runs`` were built twice, and the layers seen."""
    seen: set[str | None] = set()
    n = 0
    for summarizer in (None, "offline"):
        for messages in runs:
            for budget in budgets:
                for end in range(2, len(messages) + 1, step):
                    history = messages[:end]
                    if history[-1].role not in ("user", "tool"):
                        continue
                    try:
                        first = ContextBuilder(model, budget, summarizer=summarizer).build(history)
                    except BudgetError:
                        continue
                    again = ContextBuilder(model, budget, summarizer=summarizer).build(
                        list(first.messages)
                    )
                    assert _texts(again.messages) == _texts(first.messages), (budget, end)
                    seen.update(layer_name(m.text) for m in first.messages if m.role == "system")
                    n += 1
    return n, seen


def test_a_built_context_built_again_is_itself_tau_bench() -> None:
    trace = ctxwarden.messages_from_openai(load_replay().trace[:-1])
    n, seen = _built_again_is_itself([trace], (1600, 4000), 3)
    assert n >= 40 and {"ledger", "facts"} <= seen


def test_a_built_context_built_again_is_itself_swebench() -> None:
    if not SWEBENCH.exists():
        pytest.skip(f"swebench-mini dev runs not found at {SWEBENCH}")
    runs = load_swebench(SWEBENCH)[:4]
    n, seen = _built_again_is_itself(runs, (4000,), 9)
    assert n >= 20 and {"ledger", "facts", "summary"} <= seen


def _layered() -> ctxwarden.BuiltContext:
    trace = ctxwarden.messages_from_openai(load_replay().trace[:-1])
    built = ContextBuilder("gpt-4o", 1600, summarizer="offline").build(trace)
    assert sum(m.role == "system" for m in built.messages) >= 3
    return built


def test_the_marker_survives_the_openai_and_anthropic_formats() -> None:
    built = _layered()
    expected = strip_layers(list(built.messages))
    openai = ctxwarden.messages_from_openai(ctxwarden.messages_to_openai(built.messages))
    system, turns = messages_to_anthropic(built.messages)
    anthropic = messages_from_anthropic(system, turns)
    for history in (openai, anthropic):
        stripped, carried = strip_layers(history)
        assert carried == expected[1]
        assert _texts(stripped) == _texts(expected[0])
        # built again, each layer is shown once
        again = ContextBuilder("gpt-4o", 1600, summarizer="offline").build(history)
        systems = [m.text for m in again.messages if m.role == "system"]
        names = [layer_name(t) for t in systems]
        assert names[0] is None and len(set(names)) == len(names) == 4
    # through the OpenAI format (ids aside, what a client sends back) the very context;
    # the Anthropic format regroups tool results into user turns, so the window may differ
    again = ContextBuilder("gpt-4o", 1600, summarizer="offline").build(openai)
    assert _texts(again.messages) == _texts(built.messages)


def test_folded_layers_split_back_and_a_prompt_that_quotes_a_heading_stays() -> None:
    built = _layered()
    layers = [m for m in built.messages[1:] if m.role == "system"]
    prompt = built.messages[0].text
    folded = "\n\n".join([prompt, *(m.text for m in layers)])
    assert split_folded(folded) == (prompt, [(layer_name(m.text), m.text) for m in layers])
    # headings not where a build puts them are the prompt's own words
    own = "Reply with a line 'Values from earlier messages:' and nothing else."
    assert split_folded(own) == (own, [])
    inline = "Rules.\nQuote the Summary of the earlier conversation: heading as is."
    assert split_folded(inline) == (inline, [])
    # a tail out of layout order (this one's or the former one's, facts-ledger-summary):
    # only the part from which it is a run of layers goes
    assert [layer_name(m.text) for m in layers] == ["summary", "facts", "ledger"]
    summary, facts, ledger = layers
    swapped = "\n\n".join([prompt, ledger.text, facts.text])
    assert split_folded(swapped) == (
        "\n\n".join([prompt, ledger.text]),
        [("facts", facts.text)],
    )
    # a history an earlier version folded (facts, ledger, summary) is still recognised
    former = "\n\n".join([prompt, facts.text, ledger.text, summary.text])
    assert split_folded(former) == (
        prompt,
        [("facts", facts.text), ("ledger", ledger.text), ("summary", summary.text)],
    )


def test_a_carried_ledger_reads_back_its_values_and_handles() -> None:
    text = (
        "Values from earlier messages:\n"
        "id: omar_davis_3817 JG7FMM (cw:msg:m3) LQ940Q\n"
        'address: 281 Spruce Street, "Suite 9, B" (cw:msg:m5)\n'
        "city: San Diego"
    )
    got = [(e.value, e.label, e.source_id) for e in ledger_entities(text)]
    assert got == [
        ("omar_davis_3817", "id", "m3"),
        ("JG7FMM", "id", "m3"),
        ("LQ940Q", "id", ""),
        ("281 Spruce Street", "address", "m5"),
        ("Suite 9, B", "address", "m5"),
        ("San Diego", "city", ""),
    ]
    ledger = Carried(ledger=text).earlier_entities()
    assert ledger is not None and ledger.values() == [v for v, _, _ in got]
