"""Prompts for summaries and facts: domain templates and custom ones (R7, R8).

The prompt decides what a summary keeps more than the code does (seed 000): "compress
this into 5 sentences" keeps "the user was interested in jackets"; a domain prompt
that lists what to keep keeps "size L, budget up to 3,000 UAH, jacket id=847 in the
cart, in stock only". Each domain template names what its kind of agent must not lose;
every template passes the previous summary and asks to merge it, so the new summary
never forgets the old one.

A custom template is a string with the placeholders ``{previous_summary}`` and
``{conversation}`` (both required; other braces are left alone, so JSON examples in a
custom prompt need no escaping).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message

__all__ = [
    "DOMAIN_TEMPLATES",
    "SummaryTemplate",
    "custom_template",
    "fact_field_prompt",
    "facts_prompt",
    "get_template",
    "meta_summary_prompt",
    "render_transcript",
]

PLACEHOLDERS = ("{previous_summary}", "{conversation}")

SUMMARY_SYSTEM = (
    "You compress conversation transcripts for an AI agent that will continue the "
    "conversation with only your summary and the most recent messages. Write plain "
    "third-person statements. Never invent facts, numbers or names. Copy ids, numbers, "
    "amounts, sizes, dates, file paths, commands and error messages exactly as written."
)

_BODY = """Summary so far (may be empty):
{previous_summary}

New messages:
{conversation}

Write the updated summary: merge the summary so far with what the new messages add.
Keep every still-valid point of the summary so far; when a new message changes
something it states, give the new value and say that it changed.
Always keep: {keep}.
Leave out: {drop}.
Answer with the summary only."""


@dataclass(frozen=True)
class SummaryTemplate:
    """A summary prompt: ``text`` holds the two placeholders; ``keep`` says what matters."""

    name: str
    text: str
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = [p for p in PLACEHOLDERS if p not in self.text]
        if missing:
            raise ConfigError(
                f"summary template {self.name!r} lacks the placeholder(s) {', '.join(missing)}; "
                "a template must show the previous summary and the conversation"
            )

    def render(self, conversation: str, previous_summary: str | None) -> str:
        """The prompt with both placeholders filled (``(none yet)`` for no summary)."""
        return self.text.replace("{previous_summary}", previous_summary or "(none yet)").replace(
            "{conversation}", conversation
        )


_DROP = "greetings, thanks, small talk, repetition, and general phrases with no specifics"


def _domain(name: str, keep: Sequence[str], drop: str = _DROP) -> SummaryTemplate:
    body = _BODY.replace("{keep}", "; ".join(keep)).replace("{drop}", drop)
    return SummaryTemplate(name, body, tuple(keep))


DOMAIN_TEMPLATES: Mapping[str, SummaryTemplate] = MappingProxyType(
    {
        t.name: t
        for t in (
            _domain(
                "general",
                [
                    "key decisions and conclusions",
                    "important facts and figures",
                    "actions already taken and their results",
                    "the current task and what is still open",
                ],
            ),
            _domain(
                "support",
                [
                    "ticket, case and order ids",
                    "the customer's issue in their own words",
                    "troubleshooting steps already tried and their outcome",
                    "ticket status",
                    "deadlines and anything promised to the customer",
                    "account details the customer gave",
                ],
            ),
            _domain(
                "debate",
                [
                    "each side's position and who holds it",
                    "arguments accepted by both sides",
                    "theses rejected and why",
                    "the current point of disagreement",
                ],
            ),
            _domain(
                "document",
                [
                    "facts found, with their numbers and dates",
                    "the source of each (document, page, section)",
                    "conclusions already drawn",
                    "open questions",
                ],
            ),
            _domain(
                "coding",
                [
                    "file paths and function names",
                    "commands run and their results",
                    "error messages verbatim (type, file, line)",
                    "architecture decisions and why",
                    "known constraints",
                    "changes already made and what is still to do",
                ],
            ),
            _domain(
                "ecommerce",
                [
                    "clothing size",
                    "budget with its currency",
                    "products discussed, with ids, prices and stock",
                    "items in the cart (ids)",
                    "filters the user set (in stock only, category, brand)",
                    "order ids and delivery details",
                    "the language the user writes in",
                ],
                _DROP + "; do not invent catalog data",
            ),
        )
    }
)


def custom_template(text: str, name: str = "custom") -> SummaryTemplate:
    """A user's own prompt; it must contain ``{previous_summary}`` and ``{conversation}``."""
    return SummaryTemplate(name, text)


def get_template(spec: str | SummaryTemplate) -> SummaryTemplate:
    """A domain template by name, or a custom template when ``spec`` holds placeholders."""
    if isinstance(spec, SummaryTemplate):
        return spec
    if spec in DOMAIN_TEMPLATES:
        return DOMAIN_TEMPLATES[spec]
    if "{" in spec:
        return custom_template(spec)
    raise ConfigError(
        f"unknown summary template {spec!r}: use one of {', '.join(sorted(DOMAIN_TEMPLATES))}, "
        "or a custom prompt containing {previous_summary} and {conversation}"
    )


# -- transcripts ------------------------------------------------------------------------------


def render_transcript(messages: Sequence[Message]) -> str:
    """Messages as ``Role: text`` lines, tool calls as ``called name(args)``; system left out."""
    lines: list[str] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            lines.append(f"Tool result ({m.name or m.tool_call_id}): {m.text}")
            continue
        speaker = "User" if m.role == "user" else "Assistant"
        if m.name:
            speaker += f" ({m.name})"
        parts = [m.text] if m.text else []
        parts += [f"[called {c.name}({c.arguments})]" for c in m.tool_calls]
        lines.append(f"{speaker}: {' '.join(parts) if parts else '(no text)'}")
    return "\n".join(lines)


# -- meta-summary and facts -------------------------------------------------------------------

META_TEMPLATE = """Below are summaries of consecutive parts of one conversation, oldest first.
Merge them into one summary. When a later summary changes something an earlier one
states, keep the later value and say that it changed. Keep every id, number, name,
date, path and decision exactly as written. Answer with the merged summary only.

{summaries}"""


def meta_summary_prompt(summaries: Sequence[str]) -> str:
    """The prompt that folds level-one summaries into one meta-summary (seed 004)."""
    parts = [f"--- Part {i} ---\n{s.strip()}" for i, s in enumerate(summaries, 1)]
    return META_TEMPLATE.replace("{summaries}", "\n\n".join(parts))


FACTS_SYSTEM = (
    "You extract critical facts from a conversation into JSON. Copy values exactly as "
    "written (do not round, translate or paraphrase). Use null for facts not stated. "
    "Answer with one JSON object and nothing else."
)


def facts_prompt(schema_text: str, conversation: str, existing: Mapping[str, object]) -> str:
    """One call for all facts: the schema, the facts known so far, the new messages."""
    known = json.dumps(dict(existing), ensure_ascii=False, indent=1) if existing else "{}"
    return (
        f"Facts to extract (JSON object with these keys):\n{schema_text}\n\n"
        f"Facts known so far:\n{known}\n\n"
        f"Conversation:\n{conversation}\n\n"
        "Return one JSON object with the facts stated or changed in this conversation "
        "(null for the others). Only JSON, no explanation."
    )


def fact_field_prompt(field: str, description: str, conversation: str) -> str:
    """One call per fact, for small models that break a many-key JSON object."""
    return (
        f"Conversation:\n{conversation}\n\n"
        f"What is the {field} ({description})? Copy it exactly as written. "
        f'Answer with JSON only: {{"{field}": <value or null>}}'
    )
