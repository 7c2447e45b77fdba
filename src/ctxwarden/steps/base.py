"""The protocols of the build's steps, and what they report.

A **step** is one stage of the pipeline: ``step(draft, ctx)`` takes the :class:`Draft`
(the context as built so far) and the :class:`StepContext` (counting, the budget, the
policy, the previous state) and returns a :class:`StepResult`: a new draft and the
:class:`Action` s and warnings it adds to the audit. Steps are pure: no I/O, no model
calls, never mutating their input. The engine folds the policy's steps in order and,
after each one, checks that no tool call was separated from its results.

A **strategy** is the simpler shape the editing steps (truncation, masking) and a user's
own message filter may take: ``strategy(messages, ctx)`` returns a
:class:`StrategyResult` with a new list of the window's messages;
:class:`~ctxwarden.steps.edit.EditStep` runs it as a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ctxwarden.core.caching import memoize
from ctxwarden.core.messages import Message
from ctxwarden.steps.memos import memos_with

if TYPE_CHECKING:
    from ctxwarden.core.registry.cache_cost import CachePrices
    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.memory.layer_state import LayerState
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.steps.state import BuildState, SummaryDue
    from ctxwarden.steps.tool_rules import ToolRules

__all__ = [
    "Action",
    "ActionKind",
    "CountedAction",
    "Draft",
    "Edit",
    "LedgerBlocks",
    "LedgerSettling",
    "Step",
    "StepContext",
    "StepResult",
    "Strategy",
    "StrategyContext",
    "StrategyResult",
    "edits_stick",
    "held_view",
    "keeps_pairs",
    "lays_out",
    "system_block",
]

ActionKind = Literal[
    "truncated", "masked", "dropped", "evicted", "summarized", "rejected", "recalled"
]


@dataclass(frozen=True)
class Action:
    """One thing a strategy did to one message, with the reason and the tokens it saved."""

    message_id: str
    action: ActionKind
    reason: str
    tokens_before: int = 0
    tokens_after: int = 0
    strategy: str = ""

    @property
    def tokens_saved(self) -> int:
        return self.tokens_before - self.tokens_after


class CountedAction(Action):
    """An :class:`Action` whose ``tokens_before`` is counted when first read.

    A cold build reports everything before its window as one dropped span; its tokens
    are a figure of the audit only (no decision needs them), and on a short history
    counting every old message was a third of a fresh process's build. The count is a
    pure function of the messages, so the value read is the one an eager action holds:
    it equals, hashes, prints and pickles (as a plain :class:`Action`) the same.
    ``tokens_before`` may be given as a number too (``dataclasses.replace``)."""

    def __init__(
        self,
        message_id: str,
        action: ActionKind,
        reason: str,
        tokens_before: int | Callable[[], int] = 0,
        tokens_after: int = 0,
        strategy: str = "",
    ) -> None:
        own = self.__dict__
        own.update(message_id=message_id, action=action, reason=reason)
        own.update(tokens_after=tokens_after, strategy=strategy)
        own["_count"], own["_tokens"] = (
            (tokens_before, None) if callable(tokens_before) else (None, tokens_before)
        )

    @property
    def tokens_before(self) -> int:
        own = self.__dict__
        found: int | None = own["_tokens"]
        if found is None:  # two threads may both count: the same number
            found = own["_tokens"] = int(own["_count"]())
        return found

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Action):
            return NotImplemented
        return _values(self) == _values(other)

    __hash__ = Action.__hash__

    def __repr__(self) -> str:
        return repr(Action(*_values(self)))

    def __reduce__(self) -> tuple[type[Action], tuple[Any, ...]]:
        return Action, _values(self)


def _values(action: Action) -> tuple[Any, ...]:
    return (
        action.message_id,
        action.action,
        action.reason,
        action.tokens_before,
        action.tokens_after,
        action.strategy,
    )


@memoize(256)
def system_block(text: str, block_id: str = "") -> Message:
    """``Message.system(text, id=block_id)``, the same object for the same text and id
    (bounded): the ledger, facts and summary blocks of a conversation are the same text
    build after build, and a new message would be checked, fingerprinted (its whole text
    dumped and hashed) and looked up in the count cache again at every build."""
    return Message.system(text, id=block_id) if block_id else Message.system(text)


@memoize(65_536, typed=True)
def same_action(
    message_id: str, action: ActionKind, reason: str, before: int, after: int, strategy: str
) -> Action:
    """``Action(message_id, action, reason, before, after, strategy)``, the same object
    as the last build's when the values are the same: a session's builds cut and mask
    the same messages for the same reasons call after call, and a reused action keeps
    its logged JSON (the build log caches it on the action). Bounded; values of another
    type (``1.0`` for ``1``) make another action."""
    return Action(message_id, action, reason, before, after, strategy)


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy may read: counting, the budget, and earlier decisions.

    ``count`` returns the tokens of one message as sent (cached by the counter).
    ``budget`` is the input-token budget for the whole context; ``protected`` holds ids
    no strategy may remove (the system prompt, the newest user message).
    ``sticky`` maps message id -> the action an earlier build took on it, so a message
    masked or truncated at turn t stays so at t+1 and the prompt prefix stays stable.
    ``count_text`` counts a bare string (no framing): strategies that try drafts use it
    instead of wrapping each draft in a message. ``newest_room`` is what the tool results
    the model has not answered yet may take whole (:func:`~ctxwarden.steps.newest.newest_room`;
    the build gives it when its window holds such a result, ``None`` otherwise and when a
    strategy is called on its own).
    ``tool_rules`` are the policy's per-tool rules (:mod:`~ctxwarden.steps.tool_rules`;
    ``None``: none). ``compacting`` says the build rewrites
    the context anyway (:mod:`ctxwarden.pipeline.compaction`): an edit a strategy would
    batch for later is cheapest now, in the same move.
    """

    count: Callable[[Message], int]
    budget: int
    total: Callable[[Sequence[Message]], int]
    protected: frozenset[str] = frozenset()
    sticky: Mapping[str, ActionKind] = field(default_factory=dict)
    count_text: Callable[[str], int] | None = None  # a bare string, when the caller has one
    newest_room: int | None = None
    tool_rules: ToolRules | None = None
    compacting: bool = False  # a cache-aware compaction: apply every pending edit now


@dataclass(frozen=True)
class StrategyResult:
    """The new messages, the actions, the warnings; ``edits``: the markers later steps read
    of a message an action stands for, when the strategy knows more than the action says
    (a truncated result that lists its cut values: ``Edit("truncated", listed=True)``)."""

    messages: list[Message]
    actions: list[Action] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    edits: dict[str, Edit] = field(default_factory=dict)


@runtime_checkable
class Strategy(Protocol):
    """A message strategy: the window's messages in, new ones out."""

    @property
    def name(self) -> str: ...

    def __call__(self, messages: Sequence[Message], ctx: StrategyContext) -> StrategyResult: ...


# -- the pipeline's protocol ------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """What a step did to a window message in place (a typed marker for later steps):
    ``listed`` says a truncated result lists the values it cut inside itself, so the
    ledger need not carry them."""

    action: ActionKind
    listed: bool = False


@memoize(64)
def edit_marker(action: ActionKind, listed: bool = False) -> Edit:
    """``Edit(action, listed)``, one shared object per value (a build marks one per cut
    or masked message, and the markers are immutable)."""
    return Edit(action, listed)


@dataclass(frozen=True)
class Draft:
    """The context as built so far.

    ``history`` is the caller's list; ``start`` the window start in it (``reopened``: the
    previous build's start, when this one's window opens again at the user request that
    build sent pinned: :func:`~ctxwarden.steps.window.reopened`); ``task`` the
    position of the agent run's task in it (:func:`~ctxwarden.steps.window.agent_task`,
    a pin), ``task_form`` the task as the pinned layer sends it (:mod:`~ctxwarden.steps.task`:
    cut to its share); ``window`` the
    window's messages as they will be sent (edited copies, in order; dropped ones gone);
    ``pinned`` the positions before the window kept as pinned; ``layers`` the system
    blocks after the system prompt, as ``(layer name, message)`` in layout order;
    ``ledger`` the entity-ledger block (placed among the layers by the layout), after
    ``ledger_base`` when the block a compaction sent is kept and ``ledger`` shows only
    the values it does not (:func:`~ctxwarden.steps.ledger.stacked_ledger`);
    ``floor`` where the summary's coverage ends (the window starts at or after it);
    ``edits`` what editing steps did, by message id; ``rejected`` ids a provider would
    refuse (an unanswered call, an orphan result); ``protected`` ids no step may drop
    (the newest user message and the newest tool-call block, which are ``anchors``: not
    even eviction removes those, and pinned messages in the window). The layout step fills
    ``ordered``, ``layer_of`` and ``breakpoints``. ``compact`` is set by a step of a
    held build (:attr:`StepContext.hold`) that found a rewrite worth its cost: the engine
    then compacts (:mod:`ctxwarden.pipeline.compaction`). ``memos`` holds what each step
    carries to the next build, by the step's name (:mod:`ctxwarden.steps.memos`: a step
    sets its own with :meth:`with_memo`); the engine stores them in the build's state.
    """

    history: Sequence[Message]
    sys_end: int
    newest: int | None
    start: int = 0
    reopened: int | None = None  # the previous start, when the window reopened at a request
    task: int | None = None  # the agent run's task (steps.window.agent_task), if any
    task_form: Message | None = None  # the task as the pinned layer sends it (steps.task)
    window: tuple[Message, ...] = ()
    pinned: tuple[int, ...] = ()
    layers: tuple[tuple[str, Message], ...] = ()
    ledger: Message | None = None
    ledger_base: Message | None = None  # an earlier ledger block kept in place before it
    floor: int = 0
    edits: Mapping[str, Edit] = field(default_factory=dict)
    rejected: frozenset[str] = frozenset()
    protected: frozenset[str] = frozenset()
    anchors: frozenset[str] = frozenset()
    summary_due: SummaryDue | None = None
    ordered: tuple[Message, ...] = ()
    layer_of: Mapping[str, str] = field(default_factory=dict)
    breakpoints: tuple[str, ...] = ()
    folded: tuple[tuple[str, str], ...] = ()  # (layer, text) folded into the system prompt
    compact: str | None = None  # what a held build held back (the engine weighs a rewrite)
    edited_from: str = ""  # the first window message a held build's tail edit changed
    memos: Mapping[str, Any] = field(default_factory=dict)  # each step's, by its name

    def but(self, **changes: Any) -> Draft:
        """A copy with ``changes`` (drafts are never mutated). Steps make several per
        build, so this copies the fields directly instead of ``dataclasses.replace``
        (which re-runs ``__init__``); unknown names are an error all the same."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"Draft has no field(s) {', '.join(sorted(unknown))}")
        new = object.__new__(Draft)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def with_memo(self, step: str, memo: Any) -> Draft:
        """A copy holding ``memo`` as the memo of ``step`` for the next build (``None``:
        none; :mod:`ctxwarden.steps.memos`)."""
        return self.but(memos=memos_with(self.memos, step, memo))

    @property
    def system(self) -> Sequence[Message]:
        return self.history[: self.sys_end]

    @property
    def pinned_messages(self) -> list[Message]:
        return self.pinned_at(self.pinned)

    def pinned_at(self, positions: Sequence[int]) -> list[Message]:
        """The messages at ``positions`` as the pinned layer sends them (the agent's task
        in its form: :mod:`~ctxwarden.steps.task`)."""
        task, form = self.task, self.task_form
        if task is None or form is None or task not in positions:
            return [self.history[i] for i in positions]
        return [form if i == task else self.history[i] for i in positions]


@dataclass(frozen=True)
class StepContext:
    """What a step may read: the counter, the budget, the policy, the previous build's
    state, the summary and facts to show, and the earlier-entities seed. ``fixed`` is
    what the context costs whatever the steps do: reply priming, tool definitions and
    the system prompt. ``hold`` marks a build between compactions: the editing steps send
    every message the previous context held as it was sent (cache-aware compaction,
    :mod:`ctxwarden.pipeline.compaction`), weighing a change at ``prices`` with ``growth``.
    ``sent`` (read through :meth:`sent_tokens`), ``reserve`` (:meth:`reserved`),
    ``ledger`` (:meth:`ledger_cap`) and ``refill_ratio`` are what a step may foresee
    of the others: the size a message is sent at once cut, the room later steps' layers
    take (the recall block), the entity ledger's cap, and the share of its room the
    window's fit refills to when it moves (:mod:`~ctxwarden.steps.fit`). The engine sets
    them from what the policy's steps declare
    (:func:`~ctxwarden.pipeline.cascade.foreseen`): no step reads another's
    configuration."""

    counter: TokenCounter
    budget: int
    policy: Policy
    previous: BuildState
    layer_state: LayerState | None = None
    summarizer: Any = None  # only to focus the summary's view (no model call)
    earlier: Any = None  # EntityLedger of messages older than ``history``
    fixed: int = 0
    tools_tokens: int = 0
    summary_text: str | None = None  # caller-managed layers (build_context(summary=...))
    facts_text: str | None = None
    one_system: bool = False  # the model takes one system message: layers fold into it
    # the model's wire keeps a system message where it stands among the others (OpenAI's;
    # Anthropic's and Gemini's take every one before the messages): steps.layout
    system_in_place: bool = False
    vectors: Any = None  # RecallVectors (steps.recall_fusion): embedding recall's input
    hold: bool = False  # between compactions: what was sent is sent again as it was
    prices: CachePrices | None = None  # the model's cache prices (the rewrite decision)
    growth: float = 0.0  # tokens a call adds, on average since the last compaction
    calls: int = 0  # the loop's model calls so far: the whole history's assistant turns
    compacting: bool = False  # a held build could not be sent: this one rewrites
    # a compaction foreseen, not sent: the entity ledger's blocks are the ones sent
    # before, neither rendered nor extended (pipeline.engine weighs an early compaction
    # on it first: the ledger is most of a compacting build's work)
    forecast: bool = False
    # what the steps foresee of each other, set by the engine from the steps themselves
    # (no step reads another's configuration): see sent_tokens and refill_ratio
    sent: Callable[[Message, int], int] | None = None
    reserve: Callable[[Draft, StepContext], int] | None = None  # see reserved
    ledger: LedgerBlocks | None = None  # the entity ledger the fit renders: see ledger_cap
    refill_ratio: float = 0.5  # the fit's low-water mark (window.refill_ratio)
    max_messages: int | None = None  # the window's cap, which the fit keeps too

    def __post_init__(self) -> None:
        # ``count`` is the counter's own bound method, set on the instance: steps call it
        # hundreds of times a build, and the method below would add a frame to each call
        object.__setattr__(self, "count", self.counter.count_message)

    def count(self, message: Message) -> int:
        """Tokens of ``message`` (the counter's ``count_message``; see ``__post_init__``)."""
        return self.counter.count_message(message)  # pragma: no cover (shadowed)

    def sent_tokens(self, message: Message, tokens: int) -> int:
        """At most how many tokens ``message`` (``tokens`` long) is sent as once the
        editing steps have run, without running them (the steps that cut say so, as
        :func:`~ctxwarden.pipeline.cascade.sent_tokens_for` finds them; a step that must
        foresee it asks here, not the truncation's configuration)."""
        return tokens if self.sent is None else self.sent(message, tokens)

    def reserved(self, draft: Draft) -> int:
        """The tokens the steps that add a layer of their own later (the recall block)
        will take of the budget of ``draft``, as they say (a step's ``reserve(draft,
        ctx)``; 0 when none does): what the newest results must leave them."""
        return 0 if self.reserve is None else self.reserve(draft, self)

    def ledger_cap(self, draft: Draft, *, grows: bool = True) -> int:
        """The most the entity-ledger block may take of the budget of ``draft``, as the
        ledger says (:meth:`LedgerBlocks.cap`; 0: no ledger); ``grows=False``: its fixed
        cap alone, without the share of a larger budget."""
        return 0 if self.ledger is None else self.ledger.cap(draft, self, grows)

    def total(self, messages: Sequence[Message]) -> int:
        return self.counter.total(messages)


class LedgerBlocks(Protocol):
    """The entity ledger's side of the window's fit: what the fit (and the steps that
    must foresee the ledger) know of it, and all they know
    (:class:`~ctxwarden.steps.ledger.EntityLedgerBlocks` is the built-in one).

    The ledger is not a step of its own: the window's room is what the ledger block
    leaves, and the block holds the values of what the window drops, so the fit settles
    both together, asking :meth:`settle` for a :class:`LedgerSettling` and it for the
    blocks of each window it tries. The step that renders it declares it
    (``FitStep.ledger_blocks``); the engine hands it to every step as ``ctx.ledger``."""

    def cap(self, draft: Draft, ctx: StepContext, grows: bool = True) -> int:
        """The most the ledger block may take of the budget of ``draft``."""
        ...

    def settle(self, draft: Draft, ctx: StepContext) -> LedgerSettling:
        """The ledger of this build, before the window is fitted."""
        ...

    def within(self, draft: Draft, ctx: StepContext, cap: int, max_tokens: int) -> Message | None:
        """The ledger of ``draft`` (as the fit left it) rendered again within
        ``max_tokens`` (the eviction's last resort; ``None``: empty)."""
        ...

    def regrowth(self, draft: Draft, ctx: StepContext, shown: int) -> int:
        """Tokens a ledger of ``shown`` tokens, sent by a compaction, grows back into
        before the next one (0: none foreseen); the fit keeps them out of the window's
        low-water mark."""
        ...

    def compaction_span(self, draft: Draft, ctx: StepContext) -> tuple[int, int] | None:
        """The least and the most that the blocks a compaction sends and their
        :meth:`regrowth` can take together, known before they are settled (one number
        twice: exactly that; ``None``: nothing is known)."""
        ...


class LedgerSettling(Protocol):
    """One build's ledger while the fit tries windows (:meth:`LedgerBlocks.settle`)."""

    def blocks(
        self, draft: Draft, window: Sequence[Message]
    ) -> tuple[Message | None, Message | None]:
        """The ledger blocks sent with ``window`` (``draft``: its start and pinned
        messages): a block kept as sent before (or ``None``) and the block after it."""
        ...

    def carried(self, draft: Draft) -> Draft:
        """``draft`` with the ledger's memo for the next build (after the last
        :meth:`blocks`)."""
        ...


@dataclass(frozen=True)
class StepResult:
    draft: Draft
    actions: tuple[Action, ...] = ()
    warnings: tuple[str, ...] = ()


@runtime_checkable
class Step(Protocol):
    """One stage of the build (see the module docstring).

    Besides ``name`` and ``__call__`` a step may declare what the engine needs to know
    of it, as class attributes or methods (a user's step declares none, and gets the
    safe defaults; the engine reads them through :func:`keeps_pairs`,
    :func:`edits_stick` and :func:`held_view`, and never by a step's name):

    * ``keeps_pairs: bool`` (default ``False``): the step never leaves a tool call
      without its results (it edits messages in place, or moves whole blocks), so the
      engine need not check the window after it;
    * ``edits_stick: bool`` (default ``True``): a message it masks or truncates stays so
      in the next builds (``BuildState.sticky``); the eviction's last-resort cuts, made
      for one build's budget, do not;
    * ``lays_out: bool`` (default ``False``): the step orders the context to send (the
      layout); after the last step the engine checks the pairs once more and, when it
      took a split pair out, runs this step again;
    * ``held(draft, ctx) -> Draft``: in a build with a previous context (``ctx.hold``,
      or ``ctx.compacting``: a compaction), what the previous context sent of what the
      step made, as far as the step keeps it (the layers step: the facts and summary
      blocks as they were sent);
    * ``sent_tokens(message, tokens) -> int``, ``reserve(draft, ctx) -> int`` and
      ``ledger_blocks`` (a :class:`LedgerBlocks`): what the step lets the others foresee
      of it (:class:`StepContext`; :func:`~ctxwarden.pipeline.cascade.foreseen` gathers
      them).
    """

    @property
    def name(self) -> str: ...

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult: ...


def keeps_pairs(step: object) -> bool:
    """Whether ``step`` declares it never splits a tool call from its results
    (``keeps_pairs``; default ``False``: the engine checks the window after it)."""
    return bool(getattr(step, "keeps_pairs", False))


def edits_stick(step: object) -> bool:
    """Whether the masks and cuts ``step`` makes stay in the next builds
    (``edits_stick``; default ``True``)."""
    return bool(getattr(step, "edits_stick", True))


def lays_out(step: object) -> bool:
    """Whether ``step`` declares it orders the context to send (``lays_out``; default
    ``False``)."""
    return bool(getattr(step, "lays_out", False))


def held_view(step: object) -> Callable[[Draft, StepContext], Draft] | None:
    """``step``'s ``held(draft, ctx)``: what a build with a previous context sends of
    what the step made; ``None`` when the step declares none."""
    held = getattr(step, "held", None)
    return held if callable(held) else None
