"""Layers of an earlier build found in a history: recognised, carried and replaced, never stacked.

A build adds up to three layers after the system prompt — the summary, the facts, the
ledger of values that left the window — as system messages of their own or folded into the
one system prompt (:mod:`~ctxwarden.steps.fold`, and the adapters of frameworks that take
one prompt). Each begins with its heading, which is
the marker: the text is the one thing that the OpenAI and Anthropic formats and every
framework's message types (a LangChain ``SystemMessage``, a pydantic-ai
``SystemPromptPart``, the Agents SDK's instructions) carry unchanged, and the heading
costs no token the layer did not already spend.

Frameworks hand an adapter's output back as the next turn's history (pydantic-ai's plain
history processor keeps it as the run's history; a user may do the same with any
framework). Built again as they stand, those layers would count as part of the system
prompt and a new ledger would be added after them: seven system messages after a few
turns, and a budget that no longer holds the prompt. :func:`strip_layers` takes them out
of the history's leading system block and returns what they said as :class:`Carried`;
the build then shows it again in the one place each layer has — the summary and facts
as the layers' texts, the ledger's values as the ledger of the messages the history no
longer holds (``earlier_entities``), merged with the values of what leaves the window
now. So a build of a built context is that context again, and the next turn gives what
the original history would have given, as far as the layers can say it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ctxwarden.core.handles import HANDLE_PREFIX
from ctxwarden.core.messages import Message, TextPart
from ctxwarden.memory.entities import Entity, extract_from_json
from ctxwarden.memory.entity_ledger import DEFAULT_HEADER, EntityLedger
from ctxwarden.memory.facts import FACTS_HEADING
from ctxwarden.steps.fold import FOLD_SEPARATOR
from ctxwarden.steps.layers import SUMMARY_HEADING
from ctxwarden.steps.ledger import CarriedLedger

__all__ = [
    "LAYER_HEADINGS",
    "LAYER_ORDER",
    "Carried",
    "layer_name",
    "split_folded",
    "strip_layers",
]

#: The layers a build places after the system prompt, in layout order.
LAYER_ORDER = ("summary", "facts", "ledger")
#: The order builds placed them in before the summary came first (a history a framework
#: hands back from an earlier version is still recognised).
_FORMER_ORDER = ("facts", "ledger", "summary")
#: Each layer's first line: the marker it is recognised by.
LAYER_HEADINGS = {
    "facts": FACTS_HEADING,
    "ledger": DEFAULT_HEADER,
    "summary": SUMMARY_HEADING.rstrip("\n"),
}

_STARTS = re.compile(
    "|".join(re.escape(FOLD_SEPARATOR + h + "\n") for h in LAYER_HEADINGS.values())
)
_STANDALONE = re.compile(r"[\d_]")
_HANDLE = re.compile(r" \(" + re.escape(HANDLE_PREFIX) + r"([^()\s]+)\)")
_QUOTED_LIST = re.compile(r'"((?:[^"]|"(?!, |$))*)"(?:, |$)|([^,]+(?:,(?! )[^,]*)*)(?:, |$)')


def layer_name(text: str) -> str | None:
    """The layer ``text`` is (``"facts"``, ``"ledger"``, ``"summary"``), by its heading;
    ``None`` for any other text."""
    for name, heading in LAYER_HEADINGS.items():
        if text.startswith(heading + "\n"):
            return name
    return None


def split_folded(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``(prompt, [(layer, text), ...])`` for a system text with layers folded after the
    prompt (each after :data:`FOLD_SEPARATOR`, in layout order, each at most once).

    The layers begin at the first heading from which the rest is a run of layers; a
    text without one is all prompt."""
    for found in _STARTS.finditer(text):
        start = found.start()
        layers = _layers_from(text[start + len(FOLD_SEPARATOR) :])
        if layers is not None:
            return text[:start], layers
    return text, []


def _layers_from(text: str) -> list[tuple[str, str]] | None:
    """``text`` cut into layers at each heading, or ``None`` when it is not a run of
    layers in layout order."""
    cuts = [0, *(m.start() + len(FOLD_SEPARATOR) for m in _STARTS.finditer(text))]
    pieces = [
        text[a:b].removesuffix(FOLD_SEPARATOR) for a, b in zip(cuts, [*cuts[1:], None], strict=True)
    ]
    names = [layer_name(p) for p in pieces]
    if None in names:
        return None
    if not any(_in_order(names, order) for order in (LAYER_ORDER, _FORMER_ORDER)):
        return None
    return [(n, p) for n, p in zip(names, pieces, strict=True) if n is not None]


def _in_order(names: list[str | None], order: tuple[str, ...]) -> bool:
    """Whether ``names`` follow ``order``, each at most once."""
    at = [order.index(n) for n in names if n is not None]
    return at == sorted(set(at))


@dataclass(frozen=True)
class Carried:
    """What the layers found in a history said, to show again (``None``: not found)."""

    facts: str | None = None
    ledger: str | None = None
    summary: str | None = None

    def __bool__(self) -> bool:
        return any((self.facts, self.ledger, self.summary))

    def with_layer(self, name: str, text: str) -> Carried:
        """With ``text`` as layer ``name``: the later of two copies of one layer wins
        (a ledger's values are merged: stacked ledgers each hold some)."""
        if name == "ledger" and self.ledger:
            body = text.split("\n", 1)[1] if "\n" in text else ""
            return Carried(self.facts, f"{self.ledger}\n{body}".rstrip("\n"), self.summary)
        fields = {"facts": self.facts, "ledger": self.ledger, "summary": self.summary}
        fields[name] = text
        return Carried(**fields)

    def earlier_entities(self) -> EntityLedger | None:
        """The carried ledger's values as a ledger (``None`` when none was carried): the
        values of messages no longer in the history, which a build extends with those
        that leave the window."""
        if not self.ledger:
            return None
        read = EntityLedger().add(ledger_entities(self.ledger))
        return CarriedLedger(read.entries, read.seq, text=self.ledger)


def ledger_entities(text: str) -> list[Entity]:
    """The values a rendered ledger lists, with their labels and the message each came
    from (its handle), in the order it lists them."""
    out: list[Entity] = []
    for line in text.splitlines()[1:]:
        label, sep, rest = line.partition(": ")
        if not sep:
            continue
        spaced = ", " in rest
        runs = _HANDLE.split(rest)  # [values, id, values, id, ..., values]
        for k in range(0, len(runs), 2):
            source = runs[k + 1] if k + 1 < len(runs) else ""
            for value in _values(runs[k].strip(", "), spaced):
                out.append(_entity(value, label, source))
    return out


def _values(text: str, spaced: bool) -> list[str]:
    """The values of one run of a ledger line. A line whose values hold spaces lists them
    ", "-separated; a line without ", " lists space-free values, or is one value with
    spaces ("281 Spruce Street", "San Diego"): read as separate values when every word
    is shaped like a value of its own (a digit, an underscore or capitals: ids, dates,
    codes, numbers), else as one."""
    if not text:
        return []
    if not spaced:
        words = text.split()
        if all(_STANDALONE.search(w) or (w.isupper() and len(w) > 1) for w in words):
            return words
        return [text]
    values = []
    for quoted, plain in _QUOTED_LIST.findall(text):
        value = quoted or plain.strip()
        if value:
            values.append(value)
    return values


def _entity(value: str, label: str, source: str) -> Entity:
    """A carried value as a tool's JSON ``{label: value}`` would give it (its category
    from its label and shape); a value that reading would not give back whole is kept
    as a plain value under its label."""
    for e in extract_from_json({label: value}, source, "tool"):
        if e.value == value:
            return Entity(value, label, source, e.category, "tool")
    return Entity(value, label, source, "value", "tool")


def strip_layers(history: Sequence[Message]) -> tuple[list[Message], Carried]:
    """``history`` without the layers an earlier build put in its leading system block
    (or as system messages of their own after the task, :mod:`~ctxwarden.steps.layout`),
    and what they said.

    A system message that is a layer goes; a system message with layers folded after
    its prompt keeps the prompt alone (same id). A history with none is returned as it
    is (the same messages)."""
    carried = Carried()
    out: list[Message] = []
    leading = True
    for m in history:
        if not leading and m.role == "system" and isinstance(m.content, str):
            name = layer_name(m.content)  # a layer placed after the task (steps.layout)
            if name is not None:
                carried = carried.with_layer(name, m.content)
                continue
        if not leading or m.role != "system":
            leading = False
            out.append(m)
            continue
        prompt, layers = _message_layers(m)
        for name, text in layers:
            carried = carried.with_layer(name, text)
        if prompt is not None:
            out.append(prompt)
    if not carried:
        return list(history), carried
    return out, carried


def _message_layers(m: Message) -> tuple[Message | None, list[tuple[str, str]]]:
    """A system message as (its prompt part, the layers in it): ``(None, [...])`` for a
    message that is one layer, ``(m, [])`` for one with none."""
    content = m.content
    if isinstance(content, str):
        name = layer_name(content)
        if name is not None:
            return None, [(name, content)]
        prompt, layers = split_folded(content)
        return (m.with_content(prompt) if layers else m), layers
    if isinstance(content, tuple) and content and isinstance(content[-1], TextPart):
        # a framework that keeps the prompt as parts got the layers as one more part
        last = content[-1].text
        layers = _layers_from(last) or []
        if layers:
            rest = content[:-1]
            return (m.with_content(rest) if rest else None), layers
        prompt, layers = split_folded(last)
        if layers:
            return m.with_content((*content[:-1], TextPart(prompt))), layers
    return m, []
