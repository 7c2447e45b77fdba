"""One system message where the model's chat template takes one (issue 40, item 4).

A built context carries up to four system messages: the system prompt, then the summary,
the facts and the ledger layers. Many local models' chat templates (served by Ollama,
vLLM, LM Studio) take one system message, first, and raise on a second (Mistral's:
"Only user and assistant roles are supported, with the exception of an initial optional
system message!"). For a model the registry marks ``system_messages = "one"`` the layout
folds every system message of the context into the first, in order, each after
:data:`FOLD_SEPARATOR`: the prompt's text comes first and unchanged, so the cached
prefix holds, and each layer still begins with its heading, so a context fed back as
history is recognised (:mod:`ctxwarden.pipeline.carried`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxwarden.core.messages import Message, Part, TextPart

__all__ = ["FOLD_SEPARATOR", "fold_system"]

#: What separates the prompt and each layer folded after it.
FOLD_SEPARATOR = "\n\n"


def fold_system(ordered: Sequence[Message]) -> list[Message]:
    """``ordered`` with its system messages folded into the first one (where it stands,
    its id kept); the same list when it holds one or none."""
    systems = [m for m in ordered if m.role == "system"]
    if len(systems) < 2:
        return list(ordered)
    first = systems[0]
    folded = first.with_content(_joined(systems))
    out: list[Message] = []
    for m in ordered:
        if m is first:
            out.append(folded)
        elif m.role != "system":
            out.append(m)
    return out


def _joined(systems: Sequence[Message]) -> str | tuple[Part, ...]:
    """The texts of ``systems`` joined; parts (an image in a prompt) are kept as parts,
    each later message's text one more part after them."""
    if all(isinstance(m.content, str) for m in systems):
        return FOLD_SEPARATOR.join(m.text for m in systems)
    parts: list[Part] = []
    for m in systems:
        if isinstance(m.content, tuple):
            parts.extend(m.content)
        elif m.text:
            parts.append(TextPart(m.text))
    return tuple(parts)
