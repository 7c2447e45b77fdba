"""Whether a build spends budget on recalled history, and how much: read from the
conversation's shape, not from a switch.

Relevance recall (:mod:`~ctxwarden.steps.recall_relevant`) pays where a request asks about
something only the left-out history holds: a chat whose user asks "when did Caroline go
to the support group?" long after she said so. It does not pay in an agent loop: there
the entity ledger keeps the values that left the window (ids, paths, amounts), every
call would re-index the dropped history, and the budget it takes is the newest results'.
With the default policy (``RecallRelevant(auto=True)``) the step asks this module
first, and the answer is a share of its cap between 0 and 1:

1. **Tool traffic.** When more than :data:`MAX_TOOL_SHARE` of the newest
   :data:`SHAPE_SPAN` messages are tool results or tool calls, the conversation is an
   agent loop: no recall. This is read before any source is gathered, so an agent loop
   pays fifty role checks and nothing else.
2. **Out of the window.** With nothing dropped (no source), nothing to recall.
3. **Named only there.** The newest user message's content words (three letters or
   more, stop words out) that occur in the dropped sources and nowhere in what the
   build already shows verbatim (the window, the facts). None: no recall. One: half the
   cap; two or more: all of it (:data:`FULL_AT`). The summary layer is not read here: a
   focused view is chosen for the request, so it names the request's words whether or
   not it holds the answer (LoCoMo dev, all 885 questions asked cold at 4,000 tokens with
   the offline summariser: with it read, half the builds recalled nothing, answer recall
   0.6478; without, 846 of 885 recall, 0.6788), and a summary names what was talked
   about, not the detail asked for.

The same answer comes back for the same draft (pure, no state), so an unchanged request
keeps a byte-identical recall block and the cached prefix holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ctxwarden.core.messages import Message
from ctxwarden.steps.base import Draft

if TYPE_CHECKING:
    from ctxwarden.steps.recall_relevant import RecallRelevant

__all__ = [
    "FULL_AT",
    "MAX_TOOL_SHARE",
    "SHAPE_READ",
    "SHAPE_SPAN",
    "chat_shaped",
    "history_chat_shaped",
    "named_only_there",
    "recall_fraction",
    "recall_reads_back",
    "tool_share",
]

MAX_TOOL_SHARE = 0.3
"""Above this share of the window's messages being tool results and calls, a
conversation is an agent loop and the ledger, not recall, keeps what it left out."""

SHAPE_SPAN = 50
"""How many of the newest messages the shape is read from: enough that a few chat turns
between tool rounds do not make an agent loop look like a chat (a window of ten
messages does), few enough that the test costs nothing."""

SHAPE_READ = SHAPE_SPAN + 8
"""How many of the newest messages a caller hands :func:`recall_reads_back`: the
:data:`SHAPE_SPAN` it reads, and room for system messages among them."""

FULL_AT = 2
"""Query words named only in the dropped history at which recall takes its whole cap."""

_WORD = re.compile(r"[a-z0-9]{3,}")
_STOP_WORDS = (
    "the and for are but not you all any can had her was one our out has him his how its "
    "may new now old see two way who did get got let say she too use what when where "
    "which why with this that these those from they them their there then than have will "
    "would could should about into over after before been being does doing done just like "
    "some also very really much many more most such only own same other each few both "
    "here your yours mine ours what's it's i'm don't didn't tell know think remember said"
)
_STOP = frozenset(_STOP_WORDS.split())


def tool_share(window: Sequence[Message]) -> float:
    """The share of the window's messages that are tool results or carry tool calls
    (counted, not sized: masking shrinks old results, not how many there were)."""
    if not window:
        return 0.0
    tool = sum(1 for m in window if m.role == "tool" or m.tool_calls)
    return tool / len(window)


def words_of(text: str) -> set[str]:
    """Lower-cased content words of three letters or more, stop words out."""
    return _words_in(text.lower())


def _words_in(low: str) -> set[str]:
    return {w for w in _WORD.findall(low) if w not in _STOP}


def named_only_there(query: str, shown: Iterable[str], dropped: Iterable[str]) -> int:
    """How many of ``query``'s content words occur in ``dropped`` texts (give them newest
    first: the scan stops at :data:`FULL_AT`) and in none of the ``shown`` ones. A word
    "occurs" in a dropped text when the lower-cased text contains it (a plain substring
    search, so the scan costs little; "ferry" also meets "ferrys")."""
    return _named_only_there(query, map(str.lower, shown), map(str.lower, dropped))


def _named_only_there(query: str, shown: Iterable[str], dropped: Iterable[str]) -> int:
    """:func:`named_only_there` of texts already lower-cased."""
    asked = words_of(query)
    if not asked:
        return 0
    for low in shown:
        # a word of the text is a substring of it: a text holding none of the asked
        # words as substrings removes none, and is not split into words (most are not)
        if any(map(low.__contains__, asked)):
            asked -= _words_in(low)
            if not asked:
                return 0
    found: set[str] = set()
    for low in dropped:
        found |= {w for w in asked - found if w in low}
        if len(found) >= FULL_AT:
            break
    return len(found)


_LOWER_ATTR = "recall_gate.lower"


def _lowered(message: Message) -> str:
    """``message.text.lower()``, kept in the message's memo (a pure function of it): the
    gate reads every window message's, build after build."""
    found: str | None = message._memo.get(_LOWER_ATTR)
    if found is None:
        found = message._memo[_LOWER_ATTR] = message.text.lower()
    return found


def recall_reads_back(recall: RecallRelevant | None, newest: Sequence[Message]) -> bool:
    """Whether a :class:`~ctxwarden.Session` reads the ``lookback`` messages before its
    slice for the recall step (``newest``: what it read, oldest first): when the policy
    recalls and, with ``auto``, the newest messages are chat-shaped. The build then
    sees the sources ``build_context`` sees over the whole history, so both recall the
    same; an agent loop's session reads no more than before."""
    if recall is None:
        return False
    if not recall.auto:
        return True
    said = [m for m in newest[-SHAPE_READ:] if m.role != "system"]
    return tool_share(said[-SHAPE_SPAN:]) <= MAX_TOOL_SHARE


def chat_shaped(draft: Draft) -> bool:
    """Rule 1: the conversation's newest :data:`SHAPE_SPAN` messages are not an agent
    loop's (see the module docstring)."""
    return history_chat_shaped(draft.history, draft.sys_end)


def history_chat_shaped(history: Sequence[Message], sys_end: int) -> bool:
    """:func:`chat_shaped` of a build over ``history`` (``sys_end``: its leading system
    messages), before the build: what a session asks of the slice it is about to build."""
    return tool_share(history[max(sys_end, len(history) - SHAPE_SPAN) :]) <= MAX_TOOL_SHARE


def recall_fraction(draft: Draft, query: str, sources: Sequence[tuple[int, Message]]) -> float:
    """The share of the recall cap this build spends (0: none), by the rules of the
    module docstring; ``sources`` are the dropped originals the step would score."""
    if not sources or not chat_shaped(draft):
        return 0.0
    asking = draft.history[draft.newest].id if draft.newest is not None else None
    shown = [m._memo.get(_LOWER_ATTR) or _lowered(m) for m in draft.window if m.id != asking]
    shown += [_lowered(m) for name, m in draft.layers if name != "summary"]  # see rule 3
    named = _named_only_there(query, shown, (_lowered(m) for _, m in reversed(sources)))
    return min(1.0, named / FULL_AT)
