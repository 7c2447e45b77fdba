"""Critical facts: robust parsing, schema validation, merge semantics and history."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from ctxwarden.core.errors import ConfigError, SummarizationError
from ctxwarden.memory.facts import (
    MAX_FACT_HISTORY,
    Facts,
    parse_facts_json,
    schema_for_prompt,
    validate_facts,
)

WANT = {"size": "L", "budget": 1500}

# What small models actually send back instead of a clean JSON object.
BROKEN: list[tuple[str, dict[str, Any]]] = [
    ('Sure! Here are the facts:\n```json\n{"size": "L", "budget": 1500}\n```\nLet me know!', WANT),
    ("```\n{'size': 'L', 'budget': 1500}\n```", WANT),
    ('{"size": "L", "budget": 1500,}', WANT),
    ('{"size": "L", "budget": 1500', WANT),
    ('{\n  "size": "L",\n  "budget": 1500\n', WANT),
    (
        "{'size': 'L', 'budget': None, 'in_stock_only': True}",
        {"size": "L", "budget": None, "in_stock_only": True},
    ),
    ('The JSON is {"size": "L", "budget": 1500} as requested.', WANT),
    ('{"size": "L" "budget": 1500}', WANT),
    ('{"facts": {"size": "L", "budget": 1500}}', WANT),
    ('[{"key": "size", "value": "L"}, {"key": "budget", "value": 1500}]', WANT),
    ('{"size": "L"}\n{"budget": 1500}', WANT),
    ('{"cart_items": [847, 923,], "size": "L"}', {"cart_items": [847, 923], "size": "L"}),
    ("{size: 'L', budget: 1500}", WANT),
]


@pytest.mark.parametrize(("text", "expected"), BROKEN)
def test_parse_repairs_small_model_output(text: str, expected: dict[str, Any]) -> None:
    assert parse_facts_json(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "I could not find any facts.", "[1, 2, 3]", '"L"'])
def test_unreadable_answers_raise_summarization_error(text: str) -> None:
    with pytest.raises(SummarizationError):
        parse_facts_json(text)


JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
        "budget": {"type": "number", "description": "budget in USD"},
        "cart_items": {"type": "array"},
        "in_stock_only": {"type": ["boolean", "null"]},
    },
}


def test_json_schema_validation_coerces_losslessly_and_drops_extras() -> None:
    data = {"Size": "L", "budget": "1500", "in_stock_only": "yes", "mood": "happy"}
    assert validate_facts(data, JSON_SCHEMA) == {"size": "L", "budget": 1500, "in_stock_only": True}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"budget": "about fifteen hundred"}, "budget"),
        ({"size": "Large"}, "size"),
        ({"cart_items": 3}, "cart_items"),
    ],
)
def test_json_schema_rejects_wrong_types_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(SummarizationError, match=field):
        validate_facts(data, JSON_SCHEMA)


def test_a_schema_without_properties_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="properties"):
        validate_facts({"a": 1}, {"type": "object"})
    with pytest.raises(ConfigError, match="pydantic"):
        validate_facts({"a": 1}, 42)  # type: ignore[arg-type]


class Shop(BaseModel):
    size: str | None = None
    budget: float | None = Field(default=None, description="budget in USD")
    in_stock_only: bool = False
    order_id: str


def test_pydantic_schema_partial_facts_are_fine_and_defaults_do_not_leak() -> None:
    # order_id is required but not known yet; in_stock_only's default must not appear
    assert validate_facts({"size": "L", "budget": "1500"}, Shop) == {"size": "L", "budget": 1500.0}
    full = {"size": "L", "order_id": "A-1", "in_stock_only": True}
    assert validate_facts(full, Shop) == full
    with pytest.raises(SummarizationError, match="budget"):
        validate_facts({"budget": "cheap"}, Shop)
    assert '"budget": float | None, budget in USD or null' in schema_for_prompt(Shop)


def test_free_schema_normalises_keys() -> None:
    assert validate_facts({"Order ID": "A-1", " budget ": 5}, None) == {
        "order_id": "A-1",
        "budget": 5,
    }


def test_merge_keeps_a_fact_until_a_newer_value_replaces_it() -> None:
    facts = Facts().merge({"size": "L", "budget": "1500 USD"}, source="m3")
    for i, update in enumerate(
        [{"size": None}, {"size": "null", "budget": ""}, {"size": "N/A"}, {"size": "L"}], start=10
    ):
        facts = facts.merge(update, source=f"m{i}")
    assert facts["size"] == "L" and facts.source("size") == "m3"  # "size L" stays "L"
    assert len(facts.history["size"]) == 1
    facts = facts.merge({"budget": "1800 USD"}, source="m20")
    assert facts["budget"] == "1800 USD"
    assert [(r.value, r.source) for r in facts.history["budget"]] == [
        ("1500 USD", "m3"),
        ("1800 USD", "m20"),
    ]


def test_values_are_stored_verbatim_and_frozen() -> None:
    raw = {"note": "  Size L — NOT 'large'  ", "cart": [847, 923]}
    facts = Facts().merge(raw)
    raw["cart"].append(1)
    assert facts["note"] == "Size L — NOT 'large'"
    assert facts.to_dict() == {"note": "Size L — NOT 'large'", "cart": [847, 923]}
    with pytest.raises(TypeError):
        facts.history["x"] = ()  # type: ignore[index]


def test_a_facts_history_keeps_its_newest_values_only() -> None:
    """A value restated differently every turn (a step counter) keeps the newest
    MAX_FACT_HISTORY values: the current one and the one before stay exact."""
    facts = Facts()
    for step in range(MAX_FACT_HISTORY * 3):
        facts = facts.merge({"step": step, "goal": "ship"}, source=f"m{step}")
    steps = facts.history["step"]
    assert len(steps) == MAX_FACT_HISTORY
    last = MAX_FACT_HISTORY * 3 - 1
    assert [r.value for r in steps] == list(range(last - MAX_FACT_HISTORY + 1, last + 1))
    assert facts["step"] == last and facts.source("step") == f"m{last}"
    assert "step: " + str(last) + f" (earlier: {last - 1})" in facts.render(with_changes=True)
    assert len(facts.history["goal"]) == 1
    assert Facts.from_json(facts.to_json()) == facts


def test_merge_without_change_returns_the_same_record() -> None:
    facts = Facts().merge({"size": "L"})
    assert facts.merge({"size": "L", "budget": None}) is facts
    assert facts.version == 1


def test_render_reads_as_statements() -> None:
    facts = Facts().merge({"size": "L", "in_stock_only": True, "cart_items": [847, 923]})
    facts = facts.merge({"size": "XL"})
    assert facts.render() == (
        "Known facts (exact values from the conversation; newer values replace older):\n"
        "size: XL\nin_stock_only: yes\ncart_items: 847, 923"
    )
    assert "size: XL (earlier: L)" in facts.render(with_changes=True)
    assert Facts().render() == ""


def test_json_round_trip_keeps_history() -> None:
    facts = (
        Facts().merge({"size": "L"}, source="m1").merge({"size": "M", "x": {"a": [1]}}, source="m9")
    )
    again = Facts.from_json(facts.to_json())
    assert again == facts and again.history["size"][0].source == "m1"


def test_changed_at_each_names_facts_restated_with_a_new_value_every_turn() -> None:
    facts = Facts().merge({"order_id": "A-1", "budget": "1500 USD"}, source="m1")
    facts = facts.merge({"order_id": "A-3"}, source="m3")
    facts = facts.merge({"order_id": "A-5", "size": "L"}, source="m5")
    assert facts.changed_at_each(["m3", "m5"]) == {"order_id"}
    assert facts.changed_at_each(["m1", "m3", "m5"]) == {"order_id"}
    assert facts.changed_at_each(["m5"]) == {"order_id", "size"}
    assert facts.changed_at_each(["m1", "m5"]) == frozenset()  # m3 came between
    assert facts.changed_at_each(["m3"]) == frozenset()  # not the newest value any more
    assert facts.changed_at_each([]) == frozenset()
    assert Facts().merge({"x": "1"}).merge({"x": "2"}).changed_at_each(["", ""]) == frozenset()


def test_render_can_leave_facts_out_and_keeps_them_in_the_record() -> None:
    facts = Facts().merge({"size": "L", "order_id": "A-1"}).merge({"order_id": "A-3"})
    assert facts.render(leave_out={"order_id"}) == (
        "Known facts (exact values from the conversation; newer values replace older):\nsize: L"
    )
    assert facts.render(leave_out={"order_id", "size"}) == ""
    assert [r.value for r in facts.history["order_id"]] == ["A-1", "A-3"]
    assert facts["order_id"] == "A-3"
