"""``build_context``: one pipeline, folded over an explicit state (R4–R11).

The build is a short loop: the policy's steps (:func:`~ctxwarden.pipeline.cascade.steps_for`,
in the order of ``Policy.cascade``: by default layers, window, truncation, masking, a
user's own steps, recall, the fit with the entity ledger, priority eviction, layout) run
in order over a :class:`~ctxwarden.steps.base.Draft`;
after each step that changed the window, no tool call may be left without its results
(:func:`~ctxwarden.steps.keep_pairs.keep_pairs_whole`). The audit is assembled from what the
steps reported, and the :class:`~ctxwarden.steps.state.BuildState` for the next build from
what they decided. Every caller — ``build_context``, ``Session.build``, the proxy, the
adapters — goes through :func:`run_build`. The build never calls a model.

It is O(window + new messages), never O(history): the window start is sticky, the steps
run on the window alone, the ledger of what left the window is extended from the state,
and token counts and extracted entities are memoised per message.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from enum import Enum
from operator import attrgetter, itemgetter, ne
from typing import Any

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import BudgetError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.cache_cost import CachePrices, rewrite_pays
from ctxwarden.core.registry.catalog import ModelInfo, Registry
from ctxwarden.core.registry.cost import estimate_cost
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter
from ctxwarden.formats.openai import messages_from_openai
from ctxwarden.memory.entity_ledger import EntityLedger
from ctxwarden.memory.facts import FactSchema
from ctxwarden.memory.layer_state import LayerState
from ctxwarden.memory.summaries import Summarizer
from ctxwarden.pipeline.audit import LAYERS, Audit
from ctxwarden.pipeline.built import BuiltContext
from ctxwarden.pipeline.cascade import foreseen, sent_tokens_for, steps_for
from ctxwarden.pipeline.compaction import (
    RECALL_MOVED,
    first_difference,
    growth_per_call,
    held_cause,
    layers_key,
    layers_sent,
    loop_turns,
    prefix_break,
    recall_moved,
    window_per_turn,
)
from ctxwarden.pipeline.inputs import all_messages, check_build_arguments
from ctxwarden.pipeline.policy import Policy
from ctxwarden.steps.base import (
    Action,
    ActionKind,
    Draft,
    Step,
    StepContext,
    edits_stick,
    held_view,
    keeps_pairs,
    lays_out,
)
from ctxwarden.steps.fold import FOLD_SEPARATOR
from ctxwarden.steps.keep_pairs import keep_pairs_whole
from ctxwarden.steps.layout import STABLE_LAYERS, system_in_place
from ctxwarden.steps.recall_fusion import RecallVectors
from ctxwarden.steps.state import PREFIX_DIGITS, BuildState
from ctxwarden.steps.window import (
    agent_task,
    leading_system,
    newest_call_block,
    newest_user_after,
)
from ctxwarden.telemetry import BUILD_SPAN, built_attributes, traced

__all__ = ["BuiltContext", "build_context", "run_build"]


def _as_messages(messages: Iterable[Message | Mapping[str, Any]], known: int = 0) -> list[Message]:
    """Messages as a list; ``known`` leading items were Messages in the previous build,
    so only the new ones are checked (an agent loop stays O(new messages))."""
    items = messages if type(messages) is list else list(messages)
    if (
        0 < known <= len(items)
        and isinstance(items[known - 1], Message)
        and all_messages(items, known)
    ):
        return items  # type: ignore[return-value]
    if all_messages(items):
        return items  # type: ignore[return-value]
    return messages_from_openai(items)


def resume(previous: BuiltContext | BuildState | None, history: Sequence[Message]) -> BuildState:
    """The previous state if ``history`` extends the history it was built from."""
    state = previous.state if isinstance(previous, BuiltContext) else previous
    if state is None or state.history_length == 0 or state.history_length > len(history):
        return BuildState()
    if history[state.history_length - 1].id != state.last_id:
        return BuildState()
    return state


def model_info(model: str, registry: Registry | None = None) -> ModelInfo | None:
    """The registry's entry for ``model``; ``None`` for a model counted by its name's
    family alone (no window, no prices: the budget must be given)."""
    from ctxwarden.core.errors import UnknownModelError
    from ctxwarden.core.registry.catalog import get_model

    try:
        return get_model(model, registry)
    except UnknownModelError:
        return None


@traced(BUILD_SPAN, built_attributes)  # at the edge: the steps stay pure
def build_context(
    messages: Iterable[Message | Mapping[str, Any]],
    model: str = "gpt-4o",
    max_input_tokens: int | None = None,
    *,
    policy: Policy | None = None,
    previous: BuiltContext | BuildState | None = None,
    summary: str | None = None,
    facts: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    summarizer: str | Summarizer | None = None,
    facts_schema: FactSchema = None,
    earlier_entities: EntityLedger | None = None,
    registry: Registry | None = None,
    layers: LayerState | None = None,
    recall_vectors: RecallVectors | None = None,
) -> BuiltContext:
    """Build the context to send: within budget, pair-safe, stable prefix first, audited.

    ``messages`` are OpenAI dicts or :class:`Message` s (pass Messages in an agent loop:
    parsing dicts costs O(history)). ``previous`` is the last build (or its ``state``,
    perhaps stored and loaded with ``BuildState.to_dict``/``from_dict``) so decisions stay
    sticky. ``summary`` and ``facts`` are layer texts you manage yourself; ``layers`` a
    :class:`~ctxwarden.steps.layers.LayerState` made by
    :func:`ctxwarden.summarize_history` (default: the previous state's). ``summarizer``
    (``"offline"``, a provider spec such as ``"openai:gpt-4o-mini"``, or a summariser
    object) is a convenience: it runs :func:`ctxwarden.summarize_history` first — one
    cycle when the policy's ``summary`` trigger fires, facts kept current
    (``facts_schema``: a pydantic model or JSON schema) — then builds with its result.
    ``earlier_entities`` is the ledger of messages older than ``messages`` (a session
    passes the values of the history it did not read). ``registry`` is where ``model`` is
    looked up (default: the built-in registry plus ``CTXWARDEN_MODELS``).
    ``recall_vectors`` are the embedding vectors for ``[recall] embeddings``
    (:class:`~ctxwarden.steps.recall_fusion.RecallVectors`, computed by you beforehand;
    the newest user message's is the query): without them recall ranks by BM25 alone.
    """
    messages = check_build_arguments(messages, model, max_input_tokens, locals())
    policy = policy or Policy()
    prior = previous.state if isinstance(previous, BuiltContext) else previous
    history = _as_messages(messages, prior.history_length if prior is not None else 0)
    counter = TokenCounter.for_model(model, registry)
    info = model_info(model, registry)
    budget = policy.budget_for(info.context_window if info else None, max_input_tokens)
    state = resume(previous, history)
    layer_state = layers if layers is not None else state.layers
    pre: tuple[tuple[Action, ...], tuple[str, ...]] = ((), ())
    focus: Any = None
    if summarizer is not None:
        from ctxwarden.pipeline.summarize import resolve_summarizer, summarize_history_sync

        store = budget  # the offline summariser keeps one budget; builds show a view
        resolved = resolve_summarizer(summarizer, facts_schema, store_tokens=store)
        update = summarize_history_sync(
            history,
            layer_state,
            summarizer=summarizer,
            trigger=policy.summary,
            count=_as_sent(counter, policy),
            window=budget,
            schema=facts_schema,
            resolved=resolved,
        )
        layer_state, pre, focus = update.state, (update.actions, update.warnings), resolved[0]
    elif layer_state is not None:  # shown as the summariser that wrote it says
        from ctxwarden.pipeline.summarize import summary_viewer

        focus = summary_viewer(None, layer_state.summary)
    return run_build(
        history,
        model=model,
        budget=budget,
        policy=policy,
        counter=counter,
        state=state,
        info=info,
        layer_state=layer_state,
        summarizer=focus,
        earlier=earlier_entities,
        tools=tools,
        summary=summary,
        facts=facts,
        pre=pre,
        vectors=recall_vectors,
    )


def _as_sent(counter: TokenCounter, policy: Policy) -> Any:
    """A message's tokens as the cascade sends it, for the summary triggers: a long tool
    result counts as its cut (one long search page must not fire a needless summary;
    :func:`~ctxwarden.pipeline.cascade.sent_tokens_for`)."""
    sent = sent_tokens_for(policy)
    if sent is None:
        return counter.count_message

    def count(message: Message) -> int:
        return sent(message, counter.count_message(message))

    return count


class FindTask(Enum):
    """:func:`run_build` finds the agent's task in the history it is given."""

    FIND = "find"


FIND_TASK = FindTask.FIND


def _task_position(
    history: Sequence[Message],
    sys_end: int,
    task_id: str | FindTask | None,
    policy: Policy,
) -> int | None:
    """The position of the agent run's task (:func:`~ctxwarden.steps.window.agent_task`),
    or of the message ``task_id`` names; ``None`` when there is none, the policy keeps no
    task (``window.task_share = 0``), or it is not in ``history``."""
    if not policy.window.task_share:
        return None
    if task_id is FIND_TASK:
        return agent_task(history, sys_end)
    if task_id is None:
        return None
    return next((i for i in range(sys_end, len(history)) if history[i].id == task_id), None)


def run_build(
    history: Sequence[Message],
    *,
    model: str,
    budget: int,
    policy: Policy,
    counter: TokenCounter,
    state: BuildState,
    info: ModelInfo | None,
    layer_state: LayerState | None = None,
    summarizer: Any = None,
    earlier: EntityLedger | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    summary: str | None = None,
    facts: str | None = None,
    pre: tuple[tuple[Action, ...], tuple[str, ...]] = ((), ()),
    vectors: RecallVectors | None = None,
    task_id: str | FindTask | None = FIND_TASK,
) -> BuiltContext:
    """The build every caller shares: the steps folded over ``history`` and ``state``
    (``vectors``: embedding recall's input, computed by the caller before the build;
    ``task_id``: the agent run's task, found in ``history`` unless a caller that holds
    only a slice of it says which message it is, or ``None``: none)."""
    sys_end = leading_system(history)
    newest = newest_user_after(history, sys_end, state)
    tools_tokens = counter.count_tools(tools)
    fixed = REPLY_PRIMING + tools_tokens + sum(counter.count_message(m) for m in history[:sys_end])
    minimum = fixed + (counter.count_message(history[newest]) if newest is not None else 0)
    if minimum > budget:
        raise BudgetError(
            f"budget of {budget:,} tokens cannot hold the system prompt and the newest user "
            f"message: budget must be at least {minimum:,} tokens",
            minimum=minimum,
        )
    protected = {history[newest].id} if newest is not None else set()
    calls = newest_call_block(history, newest if newest is not None else sys_end - 1)
    protected.update(history[i].id for i in calls)
    prices = policy.cache.decision_prices(info)
    hold = policy.cache.append_only and state.history_length > 0 and bool(state.prefix)
    # (a cold build holds nothing: what is new to a loop, and its tokens, are not needed)
    new = history[state.history_length :] if state.history_length else ()
    new_tokens = sum(map(counter.count_message, new))
    first_held = hold and not state.held_calls  # right after a compaction, or a cold build
    steps = steps_for(policy)
    seen = foreseen(steps)  # what the steps let each other foresee (none reads another's config)
    ctx = StepContext(
        counter=counter,
        budget=budget,
        policy=policy,
        previous=state,
        layer_state=layer_state,
        summarizer=summarizer,
        earlier=earlier,
        fixed=fixed,
        tools_tokens=tools_tokens,
        summary_text=summary,
        facts_text=facts,
        one_system=info is not None and info.one_system_message,
        system_in_place=system_in_place(info),
        vectors=vectors,
        hold=hold,
        prices=prices,
        sent=seen.sent,
        reserve=seen.reserve,
        ledger=seen.ledger,
        refill_ratio=policy.window.refill_ratio,
        max_messages=policy.window.max_messages,
        growth=growth_per_call(
            state.input_tokens,
            state.compacted_tokens,
            state.held_calls,
            new_tokens,
            window_per_turn(history[max(state.window_start, sys_end) :], counter.count_message)
            if first_held
            else 0.0,
        ),
        calls=loop_turns(history, new, state),
    )
    anchors = frozenset(protected)
    task = _task_position(history, sys_end, task_id, policy)
    start = Draft(history, sys_end, newest, task=task, protected=anchors, anchors=anchors)
    draft, actions, warnings, names, sticking = _fold(start, ctx, steps, pre)
    cause = None
    held: tuple[Sequence[Message], tuple[str, ...]] | None = None  # a context's digests
    if hold:  # cache-aware compaction: send it held, or compact in one move
        total = REPLY_PRIMING + tools_tokens + ctx.total(draft.ordered)
        digests = tuple(map(_DIGEST, map(_FINGERPRINT, draft.ordered)))
        held = (draft.ordered, digests)
        cause = held_cause(draft, actions, total, budget, state.prefix, digests)
        early = cause is None and draft.compact is not None and policy.cache.early_compaction
        unheld = replace(ctx, hold=False, compacting=True) if cause is not None or early else ctx
        if early:  # only edits were held back: foreseen first, without the ledger's work
            ahead = _fold(start, replace(unheld, forecast=True), steps, pre)[0]
            early = _rewrite_may_pay(ahead, total, unheld, tools_tokens)
        if cause is not None or early:
            compacted = _fold(start, unheld, steps, pre)
            if cause is None:  # compact if the rewrite pays
                cause = _rewrite_pays(draft, compacted[0], total, unheld, tools_tokens)
            if cause is not None:
                ctx = unheld
                draft, actions, warnings, names, sticking = compacted
    elif state.history_length and not policy.cache.append_only:
        cause = "cache-aware compaction is off (cache.append_only = false)"
    if cause is None and ctx.hold and draft.edited_from:
        cause = "a tail edit: results sent whole cut once answered"
    elif cause is None and held is not None and recall_moved(draft, state.prefix, held[1]):
        cause = RECALL_MOVED
    return _finish(
        draft,
        ctx,
        model,
        info,
        tools,
        actions,
        warnings,
        tuple(names),
        layer_state,
        cause,
        sticking,
        held,
    )


FORECAST_MARGIN = 2
"""How far from paying an early compaction foreseen without the ledger's work
(``forecast``) may look and still be built in full and weighed: its rewrite may cost up
to this many times what it frees. The forecast sends the ledger blocks sent before; the
compaction renders them anew (stacked, or refilled to the ledger's low-water mark),
which changes what it frees and rewrites. On the dev traces as agent loops the forecast
put a compaction at most 1.58 times further from paying than the compaction itself
(swebench-mini @8,000; 1.46 @4,000, 1.22 on tau-bench @4,000), most often nearer (the
medians 0.71, 0.53, 0.77), and foresaw every compaction that paid as paying (at most
0.91): the margin leaves room for other agents. A forecast costs about a tenth of a
compacting build (~0.3 ms), so weighing is cheap where it is in vain: @8,000 438 of 824
weighings stop at the forecast, @4,000 273 of 342, with the same contexts."""


def _rewrite_terms(
    compacted: Draft, held_total: int, ctx: StepContext, tools_tokens: int
) -> tuple[int, int, int, float]:
    """What sending ``compacted`` instead of the held build (``held_total`` tokens)
    keeps of the previous context's prefix, rewrites, frees, and for how many calls
    (until the next forced compaction, at ``ctx.growth`` tokens a call)."""
    total = REPLY_PRIMING + tools_tokens + ctx.total(compacted.ordered)
    previous = ctx.previous.prefix
    digests = tuple(map(_DIGEST, map(_FINGERPRINT, compacted.ordered)))
    at = first_difference(previous, digests)
    kept = REPLY_PRIMING + tools_tokens + ctx.total(compacted.ordered[:at])
    calls = max(ctx.budget - held_total, 0) / ctx.growth if ctx.growth > 0 else 0.0
    return kept, total - kept, held_total - total, calls


def _rewrite_may_pay(foreseen: Draft, held_total: int, ctx: StepContext, tools_tokens: int) -> bool:
    """Whether the early compaction ``foreseen`` (a ``forecast`` build) is near enough to
    paying to be built and weighed: it would pay if it freed :data:`FORECAST_MARGIN`
    times what it frees (:func:`rewrite_pays`)."""
    if ctx.prices is None:
        return False
    kept, rewritten, freed, calls = _rewrite_terms(foreseen, held_total, ctx, tools_tokens)
    return rewrite_pays(kept, rewritten, FORECAST_MARGIN * freed, calls, ctx.prices)


def _rewrite_pays(
    held: Draft, compacted: Draft, held_total: int, ctx: StepContext, tools_tokens: int
) -> str | None:
    """Why sending ``compacted`` (the held-back edits applied, the window at its
    low-water mark) now is cheaper than the held build at the build's cache prices
    (``None``: it is not): the tokens it frees are read on every call until the next
    forced compaction, its rewrite is paid once (:func:`rewrite_pays`)."""
    kept, rewritten, freed, calls = _rewrite_terms(compacted, held_total, ctx, tools_tokens)
    if freed <= 0 or ctx.prices is None:
        return None
    if not rewrite_pays(kept, rewritten, freed, calls, ctx.prices):
        return None
    return (
        f"{held.compact}; applying them frees {freed:,} tokens for ~{calls:.0f} call(s), "
        f"more than rewriting {rewritten:,} tokens costs"
    )


def _fold(
    draft: Draft,
    ctx: StepContext,
    steps: Sequence[Step],
    pre: tuple[tuple[Action, ...], tuple[str, ...]],
) -> tuple[Draft, list[Action], list[str], list[str], list[Action]]:
    """The policy's ``steps`` (:func:`~ctxwarden.pipeline.cascade.steps_for`) folded over
    ``draft``: the final draft, the actions, the warnings, the names of the steps that
    ran, and the actions whose masks and cuts stay in the next builds (all but those of
    a step that declares ``edits_stick = False``)."""
    actions: list[Action] = list(pre[0])
    warnings: list[str] = list(pre[1])
    names: list[str] = []
    transient: set[int] = set()  # positions in ``actions`` of a step whose edits do not stick
    for step in steps:
        result = step(draft, ctx)
        first = len(actions)
        # Pair safety after every step that may have broken it: a user's own step, the
        # window (a call still waiting for its results). The steps that declare
        # ``keeps_pairs`` replace messages in place or move whole blocks, and the final
        # check covers them.
        if result.draft.window is not draft.window and not keeps_pairs(step):
            checked = keep_pairs_whole(result.draft, ctx, step.name)
            actions.extend(result.actions + checked.actions)
            draft = checked.draft
        else:
            actions.extend(result.actions)
            draft = result.draft
        if not edits_stick(step):
            transient.update(range(first, first + len(result.actions)))
        warnings.extend(result.warnings)
        names.append(step.name)
        held = held_view(step) if ctx.hold or ctx.compacting else None
        if held is not None:  # what was sent of it, as it was, while the step says so
            draft = held(draft, ctx)
    layout = next((step for step in steps if lays_out(step)), None)  # (the layout step)
    final = keep_pairs_whole(draft, ctx, layout.name if layout is not None else "pairing")
    if final.actions:  # a step left a split pair: take it out and lay out again
        actions.extend(final.actions)
        draft = layout(final.draft, ctx).draft if layout is not None else final.draft
    sticking = [a for i, a in enumerate(actions) if i not in transient] if transient else actions
    return draft, actions, warnings, names, sticking


_FINGERPRINT, _ID = attrgetter("fingerprint"), attrgetter("id")
_DIGEST = itemgetter(slice(PREFIX_DIGITS))  # what BuildState.prefix keeps of a fingerprint
_BULK_CONTEXT = 32  # contexts of this many messages or more are measured in C-level passes
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


@memoize(256)
def _prompt_cache_key(system: tuple[str, ...], model: str) -> str:
    """The ``prompt_cache_key`` for a system prompt and model (stable across builds)."""
    return "cw-" + hashlib.sha1(("".join(system) + model).encode()).hexdigest()[:16]


def _sums(
    ordered: Sequence[Message],
    layer_of: Mapping[str, str],
    digests: Sequence[str],
    ctx: StepContext,
) -> tuple[dict[str, int], int, int, bool]:
    """Tokens per layer, of the stable layers, and of the previous context's messages
    still at the front; and whether every count is exact. A long context is measured in
    C-level passes (the layout keeps each layer's messages together: a few runs); a short
    one, as an agent loop's, in one pass (the passes' set-up costs more than they save)."""
    layers = dict.fromkeys(LAYERS, 0)
    prefix = ctx.previous.prefix
    if len(ordered) < _BULK_CONTEXT:
        shared = cacheable = 0
        sharing = len(prefix)  # how many of the previous context's messages may still match
        exact, measure = True, ctx.counter.measure
        for i, m in enumerate(ordered):
            tokens, known = measure(m)
            exact = exact and known
            layer = layer_of[m.id]
            layers[layer] = layers.get(layer, 0) + tokens
            if layer in STABLE_LAYERS:
                cacheable += tokens
            if i < sharing and prefix[i] == digests[i]:
                shared += tokens
            else:
                sharing = 0
        return layers, cacheable, shared, exact
    measured = ctx.counter.measured(ordered)
    counts = list(map(_FIRST, measured))
    names = map(layer_of.__getitem__, map(_ID, ordered))
    for layer, run in itertools.groupby(zip(names, counts), _FIRST):  # noqa: B905 (as long)
        layers[layer] = layers.get(layer, 0) + sum(map(_SECOND, run))
    cacheable = sum(map(layers.__getitem__, STABLE_LAYERS))  # (all among LAYERS)
    matching = next(itertools.compress(itertools.count(), map(ne, prefix, digests)), None)
    shared = sum(counts[: min(len(prefix), len(digests)) if matching is None else matching])
    return layers, cacheable, shared, all(map(_SECOND, measured))


def _finish(
    draft: Draft,
    ctx: StepContext,
    model: str,
    info: ModelInfo | None,
    tools: Sequence[Mapping[str, Any]] | None,
    actions: list[Action],
    warnings: list[str],
    steps: tuple[str, ...],
    layer_state: LayerState | None,
    cause: str | None,
    sticking: Sequence[Action],
    held: tuple[Sequence[Message], tuple[str, ...]] | None = None,
) -> BuiltContext:
    """The built context of the final ``draft`` (``held``: a context and its digests the
    build already took, reused when the draft's context is that very one)."""
    h, ordered, layer_of = draft.history, draft.ordered, draft.layer_of
    if held is not None and held[0] is ordered:
        digests = held[1]
    else:
        digests = tuple(map(_DIGEST, map(_FINGERPRINT, ordered)))
    layers, cacheable, shared, known = _sums(ordered, layer_of, digests, ctx)
    for name, text in draft.folded:  # a layer folded into the system prompt keeps its tokens
        tokens = min(ctx.counter.count_text(FOLD_SEPARATOR + text), layers["system"])
        layers[name] = layers.get(name, 0) + tokens
        layers["system"] -= tokens
    previous = ctx.previous
    broken = None
    # (the counts only for a context that breaks the previous one's prefix)
    if (
        previous.history_length
        and previous.prefix
        and digests[: len(previous.prefix)] != tuple(previous.prefix)
    ):
        broken = prefix_break(
            previous.prefix,
            digests,
            ordered,
            list(map(ctx.count, ordered)),
            frozenset(m.id for m in h[previous.history_length :]),
            cause or "the previous context changed",
            policy_prices(ctx, info),
            info,
        )
    exact = ctx.counter.exact and not tools and known
    total = REPLY_PRIMING + ctx.tools_tokens + sum(layers.values())
    layers["tools"] = ctx.tools_tokens
    layers["framing"] = REPLY_PRIMING
    kept_ids = set(map(_ID, h[draft.start :]))
    sticky: dict[str, ActionKind] = {k: v for k, v in ctx.previous.sticky.items() if k in kept_ids}
    sticky.update((a.message_id, a.action) for a in sticking if a.action in ("masked", "truncated"))
    cost = effective = None
    if info is not None:
        cost = estimate_cost(Usage(input_tokens=total), info)
        cached = min(shared, total)
        effective = estimate_cost(Usage(input_tokens=total, cached_input_tokens=cached), info)
    audit = Audit(
        model=model,
        budget=ctx.budget,
        input_tokens=total,
        exact=exact,
        layers=layers,
        actions=tuple(actions),
        warnings=tuple(warnings),
        context_window=info.context_window if info is not None else None,
        history_messages=len(h),
        kept_messages=len(ordered),
        prefix_shared_tokens=shared,
        cacheable_prefix_tokens=cacheable,
        estimated_cost_usd=cost,
        effective_cost_usd=effective,
        prompt_cache_key=_prompt_cache_key(tuple(m.fingerprint for m in draft.system), model),
        cache_breakpoints=draft.breakpoints,
        summary_due=draft.summary_due,
        steps=steps,
        prefix_break=broken,
    )
    state = BuildState(
        history_length=len(h),
        last_id=h[-1].id if h else "",
        window_start=draft.start,
        sticky=sticky,
        prefix=digests,
        layers=layer_state,
        summary_due=draft.summary_due,
        input_tokens=total,
        compacted_tokens=previous.compacted_tokens if ctx.hold else total,
        held_calls=previous.held_calls + 1 if ctx.hold else 0,
        layers_sent=layers_sent(draft),
        layers_key=layers_key(ctx),
        ledger_sent=draft.ledger.text if draft.ledger is not None else "",
        ledger_base_sent=draft.ledger_base.text if draft.ledger_base is not None else "",
        turns=ctx.calls,
        memos=draft.memos,
    )
    return BuiltContext(ordered, audit, state, model, layer_of)


def policy_prices(ctx: StepContext, info: ModelInfo | None) -> CachePrices:
    """The cache prices the audit prices a break at (the policy's ``[cache] prices``;
    the rewrite decision weighs ``ctx.prices``: :meth:`CacheConfig.decision_prices`)."""
    return ctx.policy.cache.prices_for(info)
