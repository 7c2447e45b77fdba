"""Type-aware truncation of long tool results (R4), the cheapest step of the cascade.

A tool result over ``threshold_tokens`` is cut to about ``target_tokens`` according to its
``kind`` (:mod:`~ctxwarden.core.kinds`), by the cutter for that kind
(:mod:`~ctxwarden.cutters`; ``cutters`` adds kinds), so that what an agent needs from it
survives:

* a **stack trace** keeps its error lines, the first frame and the application's own
  frames (:mod:`~ctxwarden.cutters.stack_trace`);
* **JSON** stays valid JSON, pruned level by level (:mod:`~ctxwarden.cutters.json_doc`);
* a **code listing** keeps the lines with what the agent looked for, the signatures and
  the line numbers; **command output and logs** their head, tail, error and warning lines;
  a **diff** its file and hunk headers and changed lines (:mod:`~ctxwarden.cutters.code`,
  :mod:`~ctxwarden.cutters.log`, :mod:`~ctxwarden.cutters.diff`);
* an **HTML** page becomes its visible text and links (:mod:`~ctxwarden.cutters.html_page`);
* an **article** keeps its lead paragraphs; **text** its head and its tail.

What the agent looked for are the *terms* of the request that produced the result: the
names and paths in the call's arguments and in the assistant's text around the call (a
fixed message, so the cut is the same at every turn). Every marker says what was cut and
how much, and the values of the cut part are listed after it
(:mod:`~ctxwarden.cutters.values`). Work is bounded: at most ``max_chars`` of a result
are examined, and no draft longer than the target can hold is ever counted.

A **recall result** (the answer to a ``ctxwarden_recall`` call: the original the model
asked for by its handle) is not cut here: cutting it again would send the model back to
recall it. The budget still binds it — the newest block is cut to fit when it must
(:mod:`~ctxwarden.steps.evict`) — and an older one is masked or dropped like any result.

Output is a function of the message, its request and the configuration only, so a result
truncated at turn *t* is byte-identical at turn *t+1* and the prompt prefix stays
cacheable. The memo that makes repeated builds cheap (:class:`_Memo`) is bounded,
thread-safe, keyed by message id, fingerprint, request, configuration and counter — never
by ``id()`` — and caches that pure function only: without it every output is the same.
A result's last outcome is kept on the message itself too, with the request object,
configuration and counters it was computed for (``_KEPT_ATTR``), so the next build of
the session reads it back without computing the memo's key or counting again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ctxwarden.core.caching import BoundedCache
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.handles import RECALL_TOOL_NAME, handle_for
from ctxwarden.core.kinds import load_json
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import counting_key
from ctxwarden.cutters.by_kind import (
    CUTTERS,
    MAX_CHARS,
    Cut,
    Cutter,
    truncate_by_kind,
    with_cutters,
)
from ctxwarden.cutters.stack_trace import DEFAULT_LIBRARY_PATTERNS, library_regex
from ctxwarden.cutters.terms import argument_values, request_terms, stated_terms
from ctxwarden.cutters.text import fmt
from ctxwarden.cutters.values import with_cut_values
from ctxwarden.steps.base import (
    Action,
    Edit,
    StepContext,
    StrategyContext,
    StrategyResult,
    edit_marker,
    same_action,
)
from ctxwarden.steps.mask import is_masked
from ctxwarden.steps.newest import newest_user_text, unanswered_results
from ctxwarden.steps.tool_rules import as_kind, truncate_rule

__all__ = [
    "TruncateToolResults",
    "cut_to_share",
    "cut_values_room",
    "lists_cut_values",
    "truncated_from",
]


_MEMO: BoundedCache[Hashable, Message] = BoundedCache("truncate.cuts", 4096)

_KEPT_ATTR = "_cw_truncate_outcome"
"""A result's outcome in the last build, kept on the (frozen, never-changing) message:
``(request, inputs, the cut or None, action)``. The outcome is a pure function of the
message, its request (the same object: the session's decoded messages come back build
after build), the configuration and the counters (``inputs``), so when those are the
ones kept, the kept outcome is the one computing it gives, and a session's build skips
the memo's key and the counts for each of its results."""


_DETECTED_ATTR = "_cw_detected_kind"
"""The kind a policy's detectors gave a result: ``(detectors, kind)`` (see ``kind_of``)."""


FULL_RESULT_KEY = "…full result"


def _full_result_mark(message: Message) -> str:
    """The line after a cut that names the whole result's handle (the recall tool gives
    it back); the same at every turn, as the message id is."""
    return f"\n[cut; the full result: {handle_for(message.id)}]"


def _with_mark(text: str, message: Message) -> str:
    """``text`` (a cut) with the whole result's handle: a ``"…full result"`` key of a
    JSON object or a last item of a JSON array (the cut stays valid JSON), else a line."""
    doc = load_json(text)[1]
    if isinstance(doc, dict):
        pretty = "\n" in text.strip()
        doc = {**doc, FULL_RESULT_KEY: handle_for(message.id)}
        return json.dumps(doc, ensure_ascii=False, indent=1 if pretty else None)
    if isinstance(doc, list):
        pretty = "\n" in text.strip()
        doc = [*doc, _full_result_mark(message).strip()]
        return json.dumps(doc, ensure_ascii=False, indent=1 if pretty else None)
    return text + _full_result_mark(message)


def _terms(request: Message | None, call_id: str | None, stated: str) -> tuple[str, ...]:
    """What a cut keeps: the request's terms and the values its arguments name, and for
    a result not answered yet what the newest user message states."""
    terms = request_terms(request, call_id) + argument_values(request, call_id)
    return terms + stated_terms(stated) if stated else terms


def stated_words(stated: str) -> tuple[str, ...]:
    """The words of the newest user message (4+ letters), as the key names a JSON cut of
    a result not answered yet keeps ("the status and total of ..." keeps those keys)."""
    return tuple(dict.fromkeys(w.lower() for w in _WORDS.findall(stated)))[:48] if stated else ()


_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,40}")


def _recall_result(message: Message, request: Message | None = None) -> bool:
    """The result of a ``ctxwarden_recall`` call: named so, or its call is."""
    if message.role != "tool":
        return False
    if message.name == RECALL_TOOL_NAME:
        return True
    calls = request.tool_calls if request is not None else ()
    return any(c.id == message.tool_call_id and c.name == RECALL_TOOL_NAME for c in calls)


@dataclass(frozen=True)
class TruncateToolResults:
    """Cut tool results over ``threshold_tokens`` to about ``target_tokens``, by kind.

    Defaults: 500/300 tokens. A typical useful tool result (a record, a short search
    page) stays under 500 and is left alone; a 300-token cut keeps a traceback's error
    and app frames or the first few items of a list, while a 10k-token dump costs 3%.
    Pinned and ``critical`` messages are never cut. Results are memoised by message
    fingerprint, request and configuration, so repeated builds do not redo the work.

    The identifiers, dates and amounts of the cut part are listed after the cut, within
    ``cut_values_tokens`` more tokens (0 turns it off; see
    :mod:`~ctxwarden.cutters.values`): the agent keeps them while the result is
    in the window, and the entity ledger — whose changes would break the cached prefix —
    takes them only once the result is masked or leaves. The eviction step's cut of the
    newest call's own text lists its cut values the same way, within the same setting
    (:mod:`~ctxwarden.steps.evict`).

    ``max_chars`` caps how much of one result is examined (the first and last parts of a
    longer one; JSON is parsed whole up to 16 times that). ``count_text`` (a text
    counter, e.g. ``TokenCounter.count_text``) is used while searching for the cut;
    without it each candidate is counted as a whole message through ``ctx.count``.

    ``newest_whole`` (default on): the threshold applies to results the model has
    already answered; the ones it has not (after the last assistant message) are kept
    verbatim while they fit the room the build leaves them (``ctx.newest_room``, see
    :mod:`~ctxwarden.steps.newest`), and when they must be cut each keeps its share of
    that room (at least ``target_tokens``) and what its call's arguments and the newest
    user message name, with an action and a warning saying so. Off, every result over
    the threshold is cut at once (the seeds' rule; their bench scenarios set it).

    ``cutters`` adds kinds, or replaces a built-in kind's cut: kind name -> a function
    ``(text, ask) -> str | None``, a :class:`~ctxwarden.cutters.Cutter`, or
    ``"module:attribute"`` (TOML ``[truncate.cutters]``); a ``[tools.NAME]`` rule's
    ``truncate = "kind"`` may then name the kind (see :mod:`~ctxwarden.cutters.by_kind`).
    """

    threshold_tokens: int = 500
    target_tokens: int = 300
    library_patterns: tuple[str, ...] = DEFAULT_LIBRARY_PATTERNS
    keep_fields: tuple[str, ...] = ()
    cut_values_tokens: int = 120
    max_chars: int = MAX_CHARS
    newest_whole: bool = True
    cutters: Mapping[str, Cut | Cutter | str] | tuple[tuple[str, Cutter], ...] = ()
    count_text: Callable[[str], int] | None = field(default=None, compare=False, repr=False)
    name: str = field(default="truncate")
    keeps_pairs: ClassVar[bool] = True  # cuts results in place
    _config_key: str = field(default="", init=False, compare=False, repr=False)
    _kinds: Mapping[str, Cutter] = field(
        default_factory=lambda: CUTTERS, init=False, compare=False, repr=False, hash=False
    )
    _detects: tuple[tuple[str, Callable[[str], bool]], ...] = field(
        default=(), init=False, compare=False, repr=False, hash=False
    )

    def __post_init__(self) -> None:
        if self.target_tokens < 1:
            raise ConfigError(f"target_tokens must be at least 1, got {self.target_tokens}")
        if self.cut_values_tokens < 0:
            raise ConfigError(f"cut_values_tokens must be >= 0, got {self.cut_values_tokens}")
        if self.threshold_tokens < self.target_tokens:
            raise ConfigError(
                f"threshold_tokens ({self.threshold_tokens}) must be >= target_tokens "
                f"({self.target_tokens}): a result between them would grow"
            )
        if self.max_chars < 1_000:
            raise ConfigError(f"max_chars must be at least 1,000, got {self.max_chars}")
        object.__setattr__(self, "library_patterns", tuple(self.library_patterns))
        object.__setattr__(self, "keep_fields", tuple(self.keep_fields))
        library_regex(self.library_patterns)  # fail early on a bad regex
        if self.cutters:  # kind -> Cutter pairs, sorted (hashable, like the policy)
            given = dict(self.cutters) if isinstance(self.cutters, tuple) else self.cutters
            kinds = with_cutters(given)
            added = tuple(sorted((k, kinds[k]) for k in given))
            object.__setattr__(self, "cutters", added)
            object.__setattr__(self, "_kinds", kinds)
            detects = tuple((k, c.detect) for k, c in added if c.detect is not None)
            object.__setattr__(self, "_detects", detects)
        # The configuration as one string for the memo's keys: a str caches its hash
        # (hashing the tuple on every message of every build showed in the agent loop).
        config: tuple[object, ...] = (
            self.threshold_tokens,
            self.target_tokens,
            self.library_patterns,
            self.keep_fields,
            self.cut_values_tokens,
            self.max_chars,
        )
        if self.cutters:  # (the kinds a policy adds cut differently: their own key)
            config += (self.cutters,)
        object.__setattr__(self, "_config_key", repr(config))

    @property
    def kinds(self) -> Mapping[str, Cutter]:
        """Each kind this step cuts -> its cutter: the built-in ones and ``cutters``."""
        return self._kinds

    def kind_of(self, message: Message) -> str | None:
        """The kind ``message`` is cut as (a tool's rule aside): the first of the kinds
        ``cutters`` adds, in the order of their names, whose ``detect`` claims its text,
        else the kind the built-in classifier gave it (``message.kind``). Kept on the
        message for these detectors, so a session's builds detect once per result."""
        if not self._detects or not self._cuttable(message):
            return message.kind
        kept = message._memo.get(_DETECTED_ATTR)
        if kept is not None and kept[0] == self._detects:
            found: str | None = kept[1]
            return found
        found = message.kind
        text = message.text
        for kind, detect in self._detects:
            if detect(text):
                found = kind
                break
        message._memo[_DETECTED_ATTR] = (self._detects, found)
        return found

    def truncate(
        self,
        message: Message,
        count: Callable[[Message], int],
        count_text: Callable[[str], int] | None = None,
        request: Message | None = None,
        stated: str = "",
    ) -> Message:
        """``message`` cut to the target (the same object when nothing is cut);
        ``count_text`` counts the drafts (else ``self.count_text``, else ``count``);
        ``request`` is the assistant message that made the call (its terms are kept);
        ``stated`` the newest user message's text, for a result the model has not
        answered yet (what it names is kept too)."""
        drafts = self.count_text or count_text
        counter = counting_key(drafts) if drafts is not None else counting_key(count)
        return self._truncate(message, count, drafts, counter, request, stated)

    def _truncate(
        self,
        message: Message,
        count: Callable[[Message], int],
        drafts: Callable[[str], int] | None,
        counter: Hashable | None,
        request: Message | None,
        stated: str = "",
        kind: str | None = None,
    ) -> Message:
        """``message`` cut as ``kind`` (default: its own), memoised."""
        if not self._cuttable(message):
            return message
        before = count(message)
        if before <= self.threshold_tokens:
            return message
        kind = self.kind_of(message) if kind is None else kind
        key: Hashable | None = None
        if counter is not None:
            # the cut message itself is memoised (per id: the fingerprint ignores ids),
            # so every build sends the very same object and its count is cached
            asked = request.fingerprint if request is not None else ""
            key = (message.id, message.fingerprint, asked, stated, self._config_key, counter)
            key += (kind,)  # (a tool's rule may force the kind it is cut as)
            key += (before,)
            hit = _MEMO.get(key)
            if hit is not None:
                return message if hit.content == message.content else hit
        cut = self._cut(message, count, drafts, request, before, stated, kind)
        if key is not None:
            _MEMO.put(key, cut)
        return cut

    def _cut(
        self,
        message: Message,
        count: Callable[[Message], int],
        drafts: Callable[[str], int] | None,
        request: Message | None,
        before: int,
        stated: str = "",
        kind: str | None = None,
    ) -> Message:
        overhead = max(count(message.with_content("")), 0)
        count_text = drafts or (lambda s: count(message.with_content(s)) - overhead)
        mark = _full_result_mark(message)
        text = truncate_by_kind(
            message.text,  # the content itself: _cuttable admits string content only
            message.kind if kind is None else kind,
            target_tokens=max(self.target_tokens - overhead - count_text(mark), 1),
            count=count_text,
            library_patterns=self.library_patterns,
            keep_fields=self.keep_fields,
            terms=_terms(request, message.tool_call_id, stated),
            total=max(before - overhead, 1),
            max_chars=self.max_chars,
            fields=stated_words(stated),
            cutters=self._kinds,
        )
        listed = 0
        if text != message.content:
            text, listed = with_cut_values(
                message, text, max_tokens=self.cut_values_tokens, count=count_text
            )
        if text == message.content:
            return message
        text = _with_mark(text, message)
        if listed:
            return message.with_content(text, truncated_from=before, values_listed=listed)
        return message.with_content(text, truncated_from=before)

    def _cuttable(self, message: Message) -> bool:
        """A text tool result this strategy may cut (not pinned, not critical)."""
        return (
            message.role == "tool"
            and isinstance(message.content, str)
            and not message.pinned
            and message.priority != "critical"
        )

    def sent_tokens(self, message: Message, tokens: int) -> int:
        """At most how many tokens ``message`` (``tokens`` long) is sent as once this
        strategy has run, without cutting it: what the summary triggers count."""
        if (
            tokens > self.threshold_tokens
            and self._cuttable(message)
            and not _recall_result(message)
        ):
            return min(tokens, self.target_tokens + self.cut_values_tokens)
        return tokens

    def __call__(self, messages: Sequence[Message], ctx: StrategyContext) -> StrategyResult:
        out: list[Message] = []
        actions: list[Action] = []
        requests: dict[str, Message] = {}  # tool_call_id -> the assistant message
        drafts = self.count_text or ctx.count_text
        counter = counting_key(drafts) if drafts is not None else counting_key(ctx.count)
        count, over = ctx.count, fmt(self.threshold_tokens)
        # what this call's outcome for a message depends on besides the message and its
        # request (see _KEPT_ATTR); None: a counter not known to be pure, nothing is kept
        inputs = None if counter is None else (self._config_key, counter, counting_key(count))
        newest = self._unanswered(messages, ctx)
        for index, message in enumerate(messages):
            if message.role != "tool":  # only tool results are cut (see _cuttable)
                for call in message.tool_calls:
                    requests[call.id] = message
                out.append(message)
                continue
            request = requests.get(message.tool_call_id or "")
            if index in newest:  # not answered yet: cut only to fit (see _newest)
                out.append(message)
                continue
            kind: str | None = message.kind
            ruled = False
            if ctx.tool_rules:  # a tool's rule: never cut, or cut as a kind it names
                rule = truncate_rule(messages, index, ctx.tool_rules)
                if rule is False:
                    out.append(message)
                    continue
                kind = _rule_kind(message, rule)
                ruled = isinstance(rule, str)
            if not ruled and self._detects:  # a kind the policy's cutters detect
                kind = self.kind_of(message)
            if kind != message.kind and not _recall_result(message, request):
                # (a built-in kind: cut as a copy of that kind; a kind the policy's
                # cutters add: the message itself, cut as that kind; see as_kind)
                subject = as_kind(message, kind)
                new = self._truncate(subject, count, drafts, counter, request, kind=kind)
                if new is not subject:
                    why = " (its tool's rule)" if ruled else ""
                    reason = f"{kind} tool result over {over} tokens{why}"
                    before, after = count(message), count(new)
                    actions.append(
                        same_action(message.id, "truncated", reason, before, after, self.name)
                    )
                out.append(message if new is subject else new)
                continue
            kept = message._memo.get(_KEPT_ATTR)
            if kept is not None and kept[0] is request and kept[1] == inputs:
                new, action = kept[2] or message, kept[3]
            else:
                new, action = message, None
                if not _recall_result(message, request):
                    new = self._truncate(message, count, drafts, counter, request)
                if new is not message:
                    reason = f"{message.kind} tool result over {over} tokens"
                    before, after = count(message), count(new)
                    action = same_action(message.id, "truncated", reason, before, after, self.name)
                if inputs is not None:  # (None: the message itself, kept without a cycle)
                    cut = None if new is message else new
                    message._memo[_KEPT_ATTR] = (request, inputs, cut, action)
            if action is not None:
                actions.append(action)
            out.append(new)
        warnings: list[str] = []
        if newest:
            self._newest(out, newest, requests, ctx, drafts, counter, actions, warnings)
        return StrategyResult(out, actions, warnings, _listed(out, actions))

    def _unanswered(self, messages: Sequence[Message], ctx: StrategyContext) -> dict[int, int]:
        """Position -> tokens of each result the model has not answered yet, when this
        build keeps them whole while they fit (``newest_whole`` and a room given)."""
        if not self.newest_whole or ctx.newest_room is None:
            return {}
        return {i: ctx.count(messages[i]) for i in unanswered_results(messages)}

    def _newest(
        self,
        out: list[Message],
        newest: dict[int, int],
        requests: dict[str, Message],
        ctx: StrategyContext,
        drafts: Callable[[str], int] | None,
        counter: Hashable | None,
        actions: list[Action],
        warnings: list[str],
    ) -> None:
        """Keep the unanswered results whole while they fit the room; else cut each over
        its share of it (at least ``target_tokens``), keeping what its call and the newest
        user message name, and say so (in ``out``, ``actions`` and ``warnings``)."""
        room = ctx.newest_room if ctx.newest_room is not None else ctx.budget
        total = sum(newest.values())
        if total <= room:
            return
        stated = newest_user_text(out)
        for index, before in newest.items():
            message = out[index]
            share = max(room * before // max(total, 1), self.target_tokens)
            if before <= max(share, self.threshold_tokens) or not self._cuttable(message):
                continue
            rule = truncate_rule(out, index, ctx.tool_rules) if ctx.tool_rules else None
            if rule is False:
                continue  # the budget still binds it: the eviction step cuts it if it must
            if _recall_result(message, requests.get(message.tool_call_id or "")):
                continue  # the eviction step cuts a recalled original only if it must
            cutter = replace(self, threshold_tokens=share, target_tokens=share)
            request = requests.get(message.tool_call_id or "")
            kind = rule if isinstance(rule, str) else self.kind_of(message)
            subject = as_kind(message, kind)
            new = cutter._truncate(subject, ctx.count, drafts, counter, request, stated, kind)
            if new is subject:
                continue
            out[index] = new
            after = ctx.count(new)
            reason = (
                f"newest {message.kind} tool result, not answered yet: over the "
                f"{fmt(max(room, 0))} tokens the budget leaves it"
            )
            actions.append(same_action(message.id, "truncated", reason, before, after, self.name))
            warnings.append(
                f"newest tool result {message.id} cut from {before:,} to {after:,} tokens: "
                f"the budget leaves it {max(room, 0):,} after the system prompt, layers and "
                "the rest of the newest turn (the cut keeps what its call and the newest "
                "user message name; the whole result is recallable by its handle)"
            )


def cut_to_share(
    message: Message,
    share: int,
    ctx: StepContext,
    request: Message | None,
    stated: str,
    *,
    listed: bool,
    within: bool = False,
) -> Message:
    """``message`` cut to about ``share`` tokens as the policy's truncation cuts (its
    kinds and settings; the defaults when it is off), listing the cut values only when
    ``listed``: the eviction step's last resort for the newest results, which asks here
    rather than reading this step's configuration. ``within``: the list takes its
    tokens out of the share (the result is cut to three quarters of it, or to what
    ``cut_values_tokens`` leaves, and the list has the rest), so the cut and its list
    together stay within ``share``."""
    base = _policy_cutter(ctx)
    listing = base.cut_values_tokens if listed else 0
    cutter = replace(base, threshold_tokens=share, target_tokens=share, cut_values_tokens=listing)
    if within and listing:  # the list takes what the cut leaves of the share: cuts land
        target = max(share - min(listing, share // 4), 1)  # short of their target, or over
        plain = replace(cutter, target_tokens=target, cut_values_tokens=0)
        cut = plain.truncate(message, ctx.count, ctx.counter.count_text, request, stated)
        if cut is message:
            return cut
        cutter = replace(plain, cut_values_tokens=max(share - ctx.count(cut), 0))
    return cutter.truncate(message, ctx.count, ctx.counter.count_text, request, stated)


def cut_values_room(ctx: StepContext) -> int:
    """The tokens a cut may list the values it removed in, as the policy's truncation
    sets it (``cut_values_tokens``; 0: no list): the eviction step's cut of the newest
    call's own text asks here rather than reading this step's configuration."""
    return _policy_cutter(ctx).cut_values_tokens


def _policy_cutter(ctx: StepContext) -> TruncateToolResults:
    """The policy's truncation, or the defaults when it is off."""
    return ctx.policy.truncate or TruncateToolResults()


def _listed(out: Sequence[Message], actions: Sequence[Action]) -> dict[str, Edit]:
    """The markers of the results cut here that list their cut values in place: the ledger
    need not carry those values (:func:`~ctxwarden.steps.ledger.ledger_sources`). A masking
    placeholder that came back with the key lists nothing."""
    cut = {a.message_id for a in actions}
    if not cut:
        return {}
    listed = edit_marker("truncated", listed=True)
    return {m.id: listed for m in out if m.id in cut and lists_cut_values(m)}


def truncated_from(message: Message) -> int | None:
    """The tokens ``message`` had before a truncation cut it (``None``: not a cut)."""
    before: int | None = message.meta.get("truncated_from")
    return before


def lists_cut_values(message: Message) -> bool:
    """Whether ``message`` is a cut that lists the values it removed (a masking
    placeholder that came back with the key lists nothing)."""
    return "values_listed" in message.meta and not is_masked(message)


def _rule_kind(message: Message, rule: bool | str | None) -> str | None:
    """The kind a tool's rule cuts ``message`` as: the one it names, else its own."""
    return rule if isinstance(rule, str) else message.kind
