"""The last resort (R9, R11): what must go when the budget cannot hold what should stay.

After the window's fit, the context may still be over budget: the pinned messages, the
protected blocks and the layers are more than the budget holds. In order, each with a
warning (drift is silent; the audit makes it visible):

1. the text beside the newest tool calls (the model's reasoning before them) is cut,
   head and tail, to what the budget leaves (at least :data:`PROSE_KEPT` tokens), the
   calls whole: the results the model asked for matter more than its own prose about
   asking (swebench-mini dev @4,000: 19 builds dropped the newest call block whole, a
   3,000-token thought beside a 20-token command; with this, 4, and retention
   0.952 -> 0.959; @8,000 0.985 -> 0.986). The cut lists the paths, names and values of
   its cut middle as a cut result does (:mod:`~ctxwarden.cutters.values`), in the room
   the list takes from the cut (a quarter of it at most, ``truncate.cut_values_tokens``:
   0 lists nothing): the next command reuses what the reasoning settled on (the same
   runs as a Responses client sends them, @4,000: 0.9619 -> 0.9643);
2. the tool results of the newest call block are cut to share what is left (never to
   something longer: a short result with its values listed grows);
3. the entity ledger is rendered smaller;
4. pinned and critical blocks are evicted by importance, lowest first
   (:func:`~ctxwarden.steps.priority.eviction_order`), a tool call with all its results;
5. the recall layer, the summary layer, then the facts layer, are left out (a build
   that fits without its layers never fails because of them);
6. the tool results of the newest call block are cut harder, to what is left, each
   from the result as it came and listing the identifiers, dates and amounts it cut
   within its share (the result cut to three quarters of it, the list taking what the
   cut leaves): the ledger, rendered before this cut, cannot take them, and they are
   what the next call passes (tau-bench dev at 1,600 tokens: the ``reservations`` of a
   user record cut after its payment methods, and the next call asked for the first of
   them; every argument value .9722 -> .9732, with the ledger's reading order,
   :mod:`~ctxwarden.memory.entity_ledger`, .9750; with the fields the agent passes
   ranked up, :mod:`~ctxwarden.memory.entity_rank`, .9812);
7. if the call itself still does not fit (its own arguments outgrow the budget), its
   arguments are cut to what is left, JSON kept valid (an object stays an object: each
   provider takes it back as the call's input), long strings and arrays first: the model
   sees the call it made, shortened, beside the result it asked for, where without it
   the model would see neither and call again (tau-bench dev at 1,600 tokens: a
   ``book_reservation`` of 300 tokens, tried three times; swebench-mini dev at 4,000: a
   3,745-token task leaving 141 tokens for each command and its output);
8. if that is not enough either, the newest call block is dropped whole.

If the system prompt and the newest user message still do not fit, the build fails with a
:class:`~ctxwarden.core.errors.BudgetError` naming the minimum budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

from ctxwarden.core.errors import BudgetError
from ctxwarden.core.kinds import load_json
from ctxwarden.core.messages import Message, TextPart, sole_text
from ctxwarden.core.pairing import group_blocks
from ctxwarden.cutters.json_doc import truncate_json
from ctxwarden.cutters.text import truncate_text
from ctxwarden.cutters.values import with_cut_values
from ctxwarden.steps.base import Action, Draft, Edit, StepContext, StepResult
from ctxwarden.steps.priority import eviction_order
from ctxwarden.steps.truncate import cut_to_share, cut_values_room
from ctxwarden.steps.window import is_pinned

__all__ = ["PROSE_KEPT", "EvictStep", "context_tokens"]

PROSE_KEPT = 64
"""Tokens of the newest call's own text kept at least when it is cut: its opening
sentences, which most often say what the call is for."""


def context_tokens(draft: Draft, ctx: StepContext) -> int:
    """What the draft sends, counted as the audit counts it."""
    parts = [m for _, m in draft.layers]
    parts.extend(m for m in (draft.ledger_base, draft.ledger) if m is not None)
    parts.extend(draft.pinned_messages)
    parts.extend(draft.window)
    return ctx.fixed + ctx.total(parts)


def _ledger_tokens(draft: Draft, ctx: StepContext) -> int:
    """The ledger's tokens as sent (its kept block too, when there is one); cut to fit,
    it is rendered again as one block."""
    return ctx.total([m for m in (draft.ledger_base, draft.ledger) if m is not None])


@dataclass(frozen=True)
class EvictStep:
    """Brings an over-budget draft within budget (see the module docstring)."""

    name: str = "priority"
    keeps_pairs: ClassVar[bool] = True  # evicts whole blocks, cuts results in place
    # its cuts are made for this build's budget: the next build decides again
    edits_stick: ClassVar[bool] = False

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        over = context_tokens(draft, ctx) - ctx.budget
        if over <= 0:
            return StepResult(draft)
        actions: list[Action] = []
        warnings: list[str] = []
        draft, over = self._cut_newest_prose(draft, ctx, over, actions, warnings)
        if over > 0:
            cut = len(actions)
            draft, over = self._shrink_newest(
                draft, ctx, over, actions, warnings, listed=draft.ledger is None
            )
            if draft.ledger is not None and len(actions) > cut:
                draft, over = self._refill_ledger(draft, ctx, over)
        if over > 0:
            draft, over = self._shrink_ledger(draft, ctx, over, warnings)
        if over > 0:
            draft, over = self._evict_pinned(draft, ctx, over, actions, warnings)
        for layer in ("recall", "summary", "facts"):
            if over <= 0:
                break
            kept = [(n, m) for n, m in draft.layers if n != layer]
            if len(kept) < len(draft.layers):
                draft = draft.but(layers=tuple(kept))
                over = context_tokens(draft, ctx) - ctx.budget
                warnings.append(f"{layer} layer left out: the budget cannot hold it")
        if over > 0:
            draft, over = self._shrink_newest(
                draft, ctx, over, actions, warnings, listed=True, within=True
            )
        if over > 0:
            cut = len(actions)
            draft, over = self._cut_newest_arguments(draft, ctx, over, actions, warnings)
            if len(actions) > cut and over < 0:
                draft, over = self._regrow_ledger(draft, ctx, over, warnings)
        if over > 0:
            draft, over = self._drop_newest_call(draft, ctx, actions, warnings)
        if over > 0:
            minimum = ctx.budget + over
            raise BudgetError(
                f"budget of {ctx.budget:,} tokens cannot hold the system prompt, the newest "
                f"user message and the newest tool-call block: budget must be at least "
                f"{minimum:,} tokens",
                minimum=minimum,
            )
        return StepResult(draft, tuple(actions), tuple(warnings))

    @staticmethod
    def _refill_ledger(draft: Draft, ctx: StepContext, over: int) -> tuple[Draft, int]:
        """The ledger again, now with the values cut from the newest results, within the
        tokens it had plus what the cut freed (at most its cap). Listed inside the
        result, those values would sit beside a ledger that may already show them (the
        user id, the dates) and could not be ranked against it; in the ledger each
        costs one mention, and the one the next call needs competes on rank."""
        assert draft.ledger is not None
        cap = ctx.ledger_cap(draft)
        room = min(_ledger_tokens(draft, ctx) - over, cap)
        draft = draft.but(ledger=_ledger_within(draft, ctx, cap, room), ledger_base=None)
        return draft, context_tokens(draft, ctx) - ctx.budget

    @staticmethod
    def _shrink_ledger(
        draft: Draft, ctx: StepContext, over: int, warnings: list[str]
    ) -> tuple[Draft, int]:
        if draft.ledger is None:
            return draft, over
        before = _ledger_tokens(draft, ctx)
        smaller = _ledger_within(draft, ctx, ctx.ledger_cap(draft), before - over)
        after = ctx.count(smaller) if smaller else 0
        warnings.append(f"entity ledger cut from {before:,} to {after:,} tokens to fit the budget")
        draft = draft.but(ledger=smaller, ledger_base=None)
        return draft, context_tokens(draft, ctx) - ctx.budget

    @staticmethod
    def _evict_pinned(
        draft: Draft, ctx: StepContext, over: int, actions: list[Action], warnings: list[str]
    ) -> tuple[Draft, int]:
        """Pinned blocks before the window, and pinned blocks inside it that are not the
        newest user message or call block, evicted whole by importance."""
        h = draft.history
        candidates: list[Message] = draft.pinned_messages
        anchor = draft.anchors
        in_window = [m for m in draft.window if is_pinned(m) and m.id not in anchor]
        candidates.extend(in_window)
        if not candidates:
            return draft, over
        blocks = {m.id: b for b in group_blocks(draft.pinned_messages) for m in b.messages}
        blocks.update({m.id: b for b in group_blocks(draft.window) for m in b.messages})
        current = h[draft.newest].text if draft.newest is not None else ""
        gone: set[str] = set()
        for m in eviction_order(candidates, current=current):
            if over <= 0:
                break
            if m.id in gone:
                continue
            block = blocks[m.id]
            if any(x.id in anchor for x in block.messages):
                continue
            for x in block.messages:
                gone.add(x.id)
                tokens = ctx.count(x)
                over -= tokens
                reason = "pinned, but the budget cannot hold it"
                actions.append(Action(x.id, "evicted", reason, tokens, 0, "priority"))
            warnings.append(f"pinned message {m.id} evicted to fit the budget")
        pinned = tuple(i for i in draft.pinned if h[i].id not in gone)
        window = tuple(m for m in draft.window if m.id not in gone)
        draft = draft.but(pinned=pinned, window=window)
        return draft, context_tokens(draft, ctx) - ctx.budget

    @staticmethod
    def _cut_newest_prose(
        draft: Draft, ctx: StepContext, over: int, actions: list[Action], warnings: list[str]
    ) -> tuple[Draft, int]:
        """The text beside the newest call's tool calls (the model's reasoning before
        it) cut head and tail to what the budget leaves, at least :data:`PROSE_KEPT`
        tokens; the calls themselves stay whole, and so do the parts beside one text
        part (a reasoning item, a signed thinking block: sent as they came)."""
        count_text = ctx.counter.count_text

        room_for_list = cut_values_room(ctx)

        def cut(m: Message, over: int) -> Message | None:
            prose = sole_text(m)
            if not prose:
                return None
            total = count_text(prose)
            keep = max(total - over, PROSE_KEPT)
            if keep >= total:
                return None
            listing = min(room_for_list, keep // 4)
            text = truncate_text(prose, target_tokens=keep - listing, count=count_text, total=total)
            if text == prose:
                return None
            if listing:  # what it cut, listed in the room the list was kept (else the cut's)
                text, listed = with_cut_values(
                    Message.assistant(prose, id=m.id),
                    text,
                    max_tokens=keep - count_text(text),
                    count=count_text,
                )
                if not listed:
                    text = truncate_text(prose, target_tokens=keep, count=count_text, total=total)
            return _with_prose(m, text)

        what = (
            "the newest tool call's own text cut: the budget cannot hold it whole",
            "the text of newest tool call {} was cut to fit the budget",
        )
        return _cut_newest_calls(draft, ctx, over, actions, warnings, cut, what)

    @staticmethod
    def _cut_newest_arguments(
        draft: Draft, ctx: StepContext, over: int, actions: list[Action], warnings: list[str]
    ) -> tuple[Draft, int]:
        """The arguments of the newest tool calls cut to share what the budget leaves
        them (:func:`~ctxwarden.cutters.json_doc.truncate_json`: valid JSON, the shape
        kept); a call whose arguments would not stay a JSON object, as they were, is
        left whole."""
        count_text = ctx.counter.count_text

        def cut(m: Message, over: int) -> Message | None:
            sizes = [count_text(c.arguments) for c in m.tool_calls]
            total = sum(sizes)
            room = max(total - over, 0)
            calls = []
            for call, size in zip(m.tool_calls, sizes, strict=True):
                share = room * size // max(total, 1)
                args = call.arguments
                if size > share:
                    args = truncate_json(call.arguments, target_tokens=share, count=count_text)
                calls.append(
                    call if _unusable_cut(call.arguments, args) else replace(call, arguments=args)
                )
            if all(a is b for a, b in zip(calls, m.tool_calls, strict=True)):
                return None
            return replace(m, tool_calls=tuple(calls))

        what = (
            "the newest tool call's arguments cut: the budget cannot hold them whole",
            "the arguments of newest tool call {} were cut to fit the budget",
        )
        return _cut_newest_calls(draft, ctx, over, actions, warnings, cut, what)

    @staticmethod
    def _regrow_ledger(
        draft: Draft, ctx: StepContext, over: int, warnings: list[str]
    ) -> tuple[Draft, int]:
        """The ledger again, in the room the arguments' cut left (it was cut before, for
        room that cut has made since), at most its cap."""
        if ctx.ledger is None:
            return draft, over
        cap = ctx.ledger_cap(draft)
        had = _ledger_tokens(draft, ctx)
        room = min(had - over, cap)
        grown = _ledger_within(draft, ctx, cap, room) if room > had else None
        if grown is None or ctx.count(grown) <= had:
            return draft, over
        draft = draft.but(ledger=grown, ledger_base=None)
        warnings.append(
            f"entity ledger rendered again in {ctx.count(grown):,} tokens: the room the "
            "arguments' cut left"
        )
        return draft, context_tokens(draft, ctx) - ctx.budget

    @staticmethod
    def _drop_newest_call(
        draft: Draft, ctx: StepContext, actions: list[Action], warnings: list[str]
    ) -> tuple[Draft, int]:
        """When even its cut results do not fit (a call whose own arguments outgrow the
        budget), the newest call block goes whole, loudly: the newest user message stays."""
        h = draft.history
        newest = {h[draft.newest].id} if draft.newest is not None else set()
        block = draft.anchors - newest
        gone = [m for m in draft.window if m.id in block]
        if not gone:
            return draft, context_tokens(draft, ctx) - ctx.budget
        reason = "the newest tool call and its results do not fit the budget, even cut"
        for m in gone:
            actions.append(Action(m.id, "dropped", reason, ctx.count(m), 0, "priority"))
        warnings.append(
            f"newest tool call {gone[0].id} dropped: it does not fit the budget even with "
            "its results cut (the model will see the request without it)"
        )
        draft = draft.but(window=tuple(m for m in draft.window if m.id not in block))
        return draft, context_tokens(draft, ctx) - ctx.budget

    @staticmethod
    def _shrink_newest(
        draft: Draft,
        ctx: StepContext,
        over: int,
        actions: list[Action],
        warnings: list[str],
        *,
        listed: bool = False,
        within: bool = False,
    ) -> tuple[Draft, int]:
        """Cut the protected block's tool results to share what is left of the budget
        (``listed``: each lists the values it cut; ``within``: inside its share)."""
        results = [m for m in draft.window if m.role == "tool" and m.id in draft.protected]
        if not results:
            return draft, over
        sizes = {m.id: ctx.count(m) for m in results}
        total = sum(sizes.values())
        room = max(total - over, 0)
        window = list(draft.window)
        edits = dict(draft.edits)
        # what the calls asked for and the newest user message names survive the cut
        requests = {c.id: m for m in window for c in m.tool_calls}
        stated = draft.history[draft.newest].text if draft.newest is not None else ""
        # each is cut from the result as it came (an earlier cut's markers are not values)
        originals = {m.id: m for m in draft.history[draft.start :] if m.id in sizes}
        for i, m in enumerate(window):
            if m.id not in sizes:
                continue
            share = max(room * sizes[m.id] // max(total, 1), 16)
            source = originals.get(m.id, m)
            unpinned = (
                source
                if not (source.pinned or source.priority == "critical")
                else replace(source, pinned=False, priority="high")
            )
            request = requests.get(m.tool_call_id or "")
            cut = cut_to_share(unpinned, share, ctx, request, stated, listed=listed, within=within)
            if cut is unpinned or ctx.count(cut) >= sizes[m.id]:
                continue  # (a short result "cut" with its values listed grows)
            cut = replace(cut, pinned=m.pinned, priority=m.priority)
            window[i] = cut
            if not listed:  # its cut values go to the ledger (ledger_sources reads edits)
                edits[m.id] = Edit("truncated")
            after = ctx.count(cut)
            reason = "newest tool result cut harder: the budget cannot hold it whole"
            actions.append(Action(m.id, "truncated", reason, sizes[m.id], after, "priority"))
        if window != list(draft.window):
            warnings.append("the newest tool-call block was cut to fit the budget")
        draft = draft.but(window=tuple(window), edits=edits)
        return draft, context_tokens(draft, ctx) - ctx.budget


def _cut_newest_calls(
    draft: Draft,
    ctx: StepContext,
    over: int,
    actions: list[Action],
    warnings: list[str],
    cut: Callable[[Message, int], Message | None],
    what: tuple[str, str],
) -> tuple[Draft, int]:
    """Each message of the newest call block that makes calls, replaced by ``cut(message,
    tokens over budget)`` when that is shorter (``None``: nothing to cut), until the draft
    fits; each cut audited (``what``: the action's reason, the warning with ``{}`` for
    the message's id)."""
    window = list(draft.window)
    for i, m in enumerate(window):
        if over <= 0:
            break
        if not (m.role == "assistant" and m.tool_calls and m.id in draft.anchors):
            continue
        shorter = cut(m, over)
        if shorter is None:
            continue
        before, after = ctx.count(m), ctx.count(shorter)
        if after >= before:
            continue
        window[i] = shorter
        over -= before - after
        actions.append(Action(m.id, "truncated", what[0], before, after, "priority"))
        warnings.append(what[1].format(m.id))
    draft = draft.but(window=tuple(window))
    return draft, context_tokens(draft, ctx) - ctx.budget


def _with_prose(m: Message, text: str) -> Message:
    """``m`` with ``text`` in place of its :func:`~ctxwarden.core.messages.sole_text`
    (its other parts as they were)."""
    if isinstance(m.content, str) or m.content is None:
        return m.with_content(text)
    return m.with_content(
        tuple(TextPart(text) if isinstance(p, TextPart) else p for p in m.content)
    )


def _unusable_cut(arguments: str, cut: str) -> bool:
    """Whether ``cut`` cannot stand in for ``arguments``: it cut nothing, or a JSON object
    stopped being one (Anthropic's and Gemini's calls carry their input as an object)."""
    if cut == arguments:
        return True
    was_object = isinstance(load_json(arguments)[1], dict)
    return was_object and not isinstance(load_json(cut)[1], dict)


def _ledger_within(draft: Draft, ctx: StepContext, cap: int, max_tokens: int) -> Message | None:
    """The draft's ledger rendered again within ``max_tokens``, as the ledger renders it
    (``ctx.ledger``, :meth:`~ctxwarden.steps.ledger.EntityLedgerBlocks.within`)."""
    return ctx.ledger.within(draft, ctx, cap, max_tokens) if ctx.ledger is not None else None
