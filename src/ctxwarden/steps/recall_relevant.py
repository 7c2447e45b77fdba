"""Relevance recall: bring back the passages of left-out history the request is about.

A window keeps the newest messages; what an agent needs now may be older — the flight
the user booked an hour ago, the ``grep`` output whose path the next command edits. When
history was dropped, summarised, masked or truncated, this step scores the passages of
those originals against the query (the newest user message; with ``query_calls`` also
the newest tool call's arguments) by BM25 (the ``bm25s`` library) and shows the best in
one ``recall`` layer, within ``share`` of the budget (at most ``max_tokens``), each under
the stable handle of its message (``cw:msg:<id>``: the recall tool returns it whole),
placed right before the newest user message (:mod:`~ctxwarden.steps.layout`; a user
message, since Anthropic folds every system message into the system prompt)::

    Recalled from earlier in this conversation (most relevant to the current request):
    [cw:msg:m12 tool search_flights] {"flight_number": "HAT170", "origin": "EWR", ...

The default policy runs it with ``auto=True``: the conversation decides whether and how
much (:mod:`~ctxwarden.steps.recall_gate`) — nothing in an agent loop (where it cost
coding retention and loop speed, and the entity ledger keeps what left the window), up
to the cap in a chat whose newest request names what only the dropped history holds.
``Policy(recall=RecallRelevant())`` or ``[recall]`` in TOML recalls at every build;
``recall = false`` turns it off; ``only_summarized`` limits it to builds that keep a
summary. Measured with the default policy (LoCoMo dev, 4,000 tokens, fed session by
session): 0.446 -> 0.593 answer recall without a summariser; with the offline one see
``docs/recall.md``. A :class:`~ctxwarden.Session` whose newest messages are chat-shaped
reads the ``lookback`` messages before its slice as well
(:func:`~ctxwarden.steps.recall_gate.recall_reads_back`), so it recalls from the sources
``build_context`` recalls from; an agent loop's session reads no more than before.

It runs before the window's fit, so the fit makes room for it. Its sources are the
messages before the window that the fit will certainly leave out (everything the newest
tail that the budget can hold does not reach, protected and pinned blocks aside) and the
originals of the window's masked and truncated results. Both change only when the
window moves or a batch is masked, so for an unchanged query the layer is byte-identical
from build to build and the cached prefix holds.

It needs ``pip install "ctxwarden[recall]"`` (bm25s, numpy only); without it a build
with the step on fails with a :class:`~ctxwarden.core.errors.MissingDependencyError` naming
the extra. The step is pure: the index is built from the history it is given, at most ``lookback``
messages before the window (and ``max_chars`` of each), and the previous build's
:class:`RecallMemo` (part of the explicit :class:`~ctxwarden.steps.state.BuildState`,
under ``memos["recall"]``)
gives the same block back without re-indexing when none of its inputs changed. A
session does not store the memo: its build reads a slice bounded by the budget, so the
sources, and the work, are bounded there already.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ctxwarden.core.errors import ConfigError, MissingDependencyError
from ctxwarden.core.handles import handle_for
from ctxwarden.core.messages import Message
from ctxwarden.steps.base import Action, Draft, StepContext, StepResult
from ctxwarden.steps.memos import memo_of, register_memo
from ctxwarden.steps.recall_fusion import fuse, vector_ranking
from ctxwarden.steps.recall_gate import chat_shaped, recall_fraction, words_of
from ctxwarden.steps.window import is_pinned, newest_call_block

__all__ = ["RECALL_HEADING", "RECALL_ID", "RecallMemo", "RecallRelevant"]

RECALL_ID = "ctxwarden:recall"
RECALL_HEADING = (
    "Recalled from earlier in this conversation (most relevant to the current request):"
)
_WORD = re.compile(r"(?u)\b\w\w+\b")
_SKIPS = 24  # passages tried past the first that does not fit (a shorter one may)


@dataclass(frozen=True)
class RecallMemo:
    """The recall block last rendered (``text``; ``None``: nothing relevant), the ids it
    shows with their tokens, and what it was rendered for (``key``): the next build
    reuses it without re-indexing when the query and the sources are unchanged."""

    key: str
    text: str | None = None
    shown: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "text": self.text, "shown": [list(s) for s in self.shown]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecallMemo:
        text = data.get("text")
        shown = tuple((str(i), int(t)) for i, t in data.get("shown", ()))
        return cls(str(data["key"]), None if text is None else str(text), shown)


register_memo("recall", RecallMemo)


@dataclass(frozen=True)
class _Passage:
    pos: int  # the message's position in the history (window originals: theirs too)
    part: int  # the passage's place in its message
    text: str


@dataclass(frozen=True)
class RecallRelevant:
    """The recall step (see the module docstring).

    Defaults and why: ``share=0.1`` of the budget (the window keeps nine tenths; at
    4,000 tokens that is 400 tokens, three or four passages), at most ``max_tokens=800``;
    passages of about ``passage_tokens=80`` tokens (a dialogue turn, a search hit, a few
    lines of a listing: small enough that one relevant line does not bring a page with
    it); sources at most ``lookback=2000`` messages before the window and the first
    ``max_chars=20000`` characters of each, so a build's work is bounded whatever the
    history. ``query_calls`` adds the newest tool call's arguments to the query (the
    step an agent is in); off by default, so builds for one user message share the layer.
    ``only_summarized``: only in builds that keep a summary (see above).
    ``embeddings`` (a spec such as ``"openai:text-embedding-3-small"``, default none)
    also ranks the sources by vector similarity and fuses both rankings
    (:mod:`~ctxwarden.steps.recall_fusion`), with the vectors the build is given.

    ``auto`` (the default policy's): the conversation decides whether and how much
    (:mod:`~ctxwarden.steps.recall_gate`): nothing in an agent loop, in a chat up to
    the cap when the request names what only the dropped history holds; without
    ``bm25s`` it recalls nothing and says so in a warning.
    """

    share: float = 0.1
    max_tokens: int = 800
    passage_tokens: int = 80
    lookback: int = 2000
    max_chars: int = 20_000
    query_calls: bool = False
    only_summarized: bool = False
    embeddings: str | None = None
    auto: bool = False
    name: str = field(default="recall")
    keeps_pairs: ClassVar[bool] = True  # adds a layer, not window messages

    def __post_init__(self) -> None:
        if not 0.0 < self.share <= 0.5:
            raise ConfigError(f"recall.share must be in (0, 0.5], got {self.share}")
        for key in ("max_tokens", "passage_tokens", "lookback", "max_chars"):
            if getattr(self, key) < 1:
                raise ConfigError(f"recall.{key} must be >= 1, got {getattr(self, key)}")
        if self.embeddings is not None:
            from ctxwarden.llm.embeddings import check_embeddings_spec

            try:
                check_embeddings_spec(self.embeddings)
            except ConfigError as exc:
                raise ConfigError(f"recall.embeddings: {exc}") from None

    def __call__(self, draft: Draft, ctx: StepContext) -> StepResult:
        if self.only_summarized and not _summarized(ctx):
            return StepResult(draft)
        if self.auto and not chat_shaped(draft):  # an agent loop: before any other work
            return StepResult(draft)
        query = self._query(draft)
        cap = self.cap(ctx)
        if not query or cap < self.passage_tokens:  # too small to hold one passage
            return StepResult(draft)
        lo, hi = self._span(draft, ctx)
        sources = self._sources(draft, lo, hi)
        if not sources:
            return StepResult(draft)
        if self.auto:  # the gate reads what the window shows now: never taken from a memo
            cap = int(cap * recall_fraction(draft, query, sources))
            if cap < self.passage_tokens:  # nothing the request names is only there
                return StepResult(draft)
            if not _has_bm25s():
                note = 'relevance recall skipped: pip install "ctxwarden[recall]" (bm25s)'
                return StepResult(draft, (), (note,))
        vector = self._query_vector(draft, ctx)
        key = _key(draft, query, lo, hi, sources, cap, ctx.counter.model, self)
        if vector is not None:
            key += ctx.vectors.digest(vector, [m.id for _, m in sources])
        memo = memo_of(ctx.previous, "recall", RecallMemo) if ctx.previous.history_length else None
        if memo is not None and memo.key == key:
            text, shown = memo.text, memo.shown
        else:
            text, shown = self._render(sources, query, cap, draft, ctx, vector)
        new = draft.with_memo("recall", RecallMemo(key, text, shown))
        if text is None:
            return StepResult(new)
        block = Message.user(text, id=RECALL_ID)  # a system block would join Anthropic's system
        how = "BM25" if vector is None else "BM25 and embeddings, fused"
        actions = tuple(
            Action(
                mid, "recalled", f"relevant to the current request ({how})", 0, tokens, self.name
            )
            for mid, tokens in shown
        )
        return StepResult(new.but(layers=(*new.layers, ("recall", block))), actions)

    def reserve(self, draft: Draft, ctx: StepContext) -> int:
        """The room the newest results leave for the recall block
        (:meth:`~ctxwarden.steps.base.StepContext.reserved`, :mod:`~ctxwarden.steps.newest`):
        the cap, when this step may recall (with ``auto``, the window is chat-shaped);
        else 0 (an agent loop's newest result is never cut to make room for a recall that
        its shape rules out)."""
        if self.auto and not chat_shaped(draft):
            return 0
        return self.cap(ctx)

    def cap(self, ctx: StepContext) -> int:
        """The most the block may take: ``share`` of the budget, at most ``max_tokens``."""
        return min(self.max_tokens, int(self.share * (ctx.budget - ctx.fixed)))

    # -- what to score, and against what -------------------------------------------------------

    def _query(self, draft: Draft) -> str:
        h = draft.history
        parts = [h[draft.newest].text] if draft.newest is not None else []
        if self.query_calls:
            after = draft.newest if draft.newest is not None else draft.sys_end - 1
            for i in newest_call_block(h, after):
                parts.extend(f"{c.name} {c.arguments}" for c in h[i].tool_calls)
        return "\n".join(p for p in parts if p)

    def _query_vector(self, draft: Draft, ctx: StepContext) -> Sequence[float] | None:
        """The newest user message's vector, when this step ranks by embeddings and the
        build was given vectors of its spec (else ``None``: BM25 alone)."""
        vectors = ctx.vectors
        if self.embeddings is None or vectors is None or draft.newest is None:
            return None
        from ctxwarden.llm.embeddings import embeddings_key

        if vectors.model != embeddings_key(self.embeddings):
            return None
        return vectors.by_id.get(draft.history[draft.newest].id) or None

    def _span(self, draft: Draft, ctx: StepContext) -> tuple[int, int]:
        """``[lo, hi)``: the history before the window that this build certainly leaves
        out — before the window start, and before the oldest window message the newest
        tail the budget holds cannot reach (at the fit's refill target when it moves)."""
        room = ctx.budget - ctx.fixed - ctx.total([m for _, m in draft.layers])
        room -= ctx.total(draft.pinned_messages)
        protected = draft.protected
        window = [m for m in draft.window if m.id not in protected]
        room -= ctx.total([m for m in draft.window if m.id in protected])
        hi = draft.start
        sizes = list(map(ctx.count, window))
        if sum(sizes) > room:  # the fit will move the window: to its refill target
            history = draft.history[draft.start :]
            positions = {m.id: i for i, m in enumerate(history, draft.start)}
            target = int(room * ctx.refill_ratio)
            used = 0
            for m, size in zip(reversed(window), reversed(sizes), strict=True):
                used += size
                if used > target:
                    hi = max(hi, positions.get(m.id, draft.start))
                    break
        return max(draft.sys_end, hi - self.lookback), hi

    def _sources(self, draft: Draft, lo: int, hi: int) -> list[tuple[int, Message]]:
        """The originals to score: ``history[lo:hi]`` less pinned, protected and rejected
        messages, then the window's masked and truncated results, in history order."""
        h = draft.history
        skip = draft.protected | draft.rejected
        pinned = set(draft.pinned)
        out = [
            (i, h[i])
            for i in range(lo, hi)
            if i not in pinned
            and h[i].id not in skip
            and not is_pinned(h[i])
            and h[i].role != "system"
        ]
        if draft.edits:
            out.extend(
                (i, h[i])
                for i in range(max(hi, draft.start), len(h))
                if h[i].id in draft.edits and draft.edits[h[i].id].action in ("masked", "truncated")
            )
        return out

    # -- scoring and the block -------------------------------------------------------------

    def _render(
        self,
        sources: Sequence[tuple[int, Message]],
        query: str,
        cap: int,
        draft: Draft,
        ctx: StepContext,
        vector: Sequence[float] | None = None,
    ) -> tuple[str | None, tuple[tuple[str, int], ...]]:
        passages = self._passages(sources)
        ranked = _rank(passages, query)
        if vector is not None:
            ranked = fuse(ranked, passages, vector_ranking(vector, sources, ctx.vectors))
        if not ranked:
            return None, ()
        labels = _labels(draft.history, sources)
        count = ctx.counter.count_text
        used = count(RECALL_HEADING) + 5  # the heading and the message's framing
        chosen: dict[int, list[_Passage]] = {}
        cost: dict[int, int] = {}
        skipped = 0
        shown = _layer_words(draft)
        for p in ranked:
            if words_of(p.text) <= shown:  # says nothing the layers do not already say
                continue
            step = count("\n" + p.text) + (0 if p.pos in chosen else count(labels[p.pos]) + 1)
            if used + step > cap:
                skipped += 1
                if skipped > _SKIPS:
                    break
                continue
            used += step
            chosen.setdefault(p.pos, []).append(p)
            cost[p.pos] = cost.get(p.pos, 0) + step
        if not chosen:
            return None, ()
        lines = [RECALL_HEADING]
        for pos in sorted(chosen):
            parts = sorted(chosen[pos], key=lambda p: p.part)
            lines.append(labels[pos] + " " + "\n…\n".join(p.text for p in parts))
        ids = {pos: m.id for pos, m in sources}
        return "\n".join(lines), tuple((ids[pos], cost[pos]) for pos in sorted(chosen))

    def _passages(self, sources: Sequence[tuple[int, Message]]) -> list[_Passage]:
        """Each source's text cut into passages of about ``passage_tokens`` tokens, on
        line breaks where it has them (4 characters a token: only the split is estimated,
        the block is counted exactly)."""
        size = self.passage_tokens * 4
        out: list[_Passage] = []
        for pos, message in sources:
            text = _text_of(message)[: self.max_chars].strip()
            if not text:
                continue
            part, current = 0, ""
            for line in text.splitlines():
                while len(line) > size:  # a long line (JSON on one line): cut at a space
                    cut = line.rfind(" ", size // 2, size)
                    cut = cut if cut > 0 else size
                    if current:
                        out.append(_Passage(pos, part, current))
                        part, current = part + 1, ""
                    out.append(_Passage(pos, part, line[:cut].strip()))
                    part, line = part + 1, line[cut:]
                if current and len(current) + len(line) + 1 > size:
                    out.append(_Passage(pos, part, current))
                    part, current = part + 1, ""
                current = f"{current}\n{line}" if current else line
            if current.strip():
                out.append(_Passage(pos, part, current))
        return [p for p in out if p.text.strip()]


def _layer_words(draft: Draft) -> frozenset[str]:
    """The content words the layers before the block show (the facts, the summary's
    view). A passage none of whose words is missing from them repeats what the context
    already says (most often a sentence the summary's view quotes), so the block gives
    its room to the next passage: LoCoMo dev, all 885 questions asked cold at 4,000
    tokens with the offline summariser, 0.6788 answer recall -> 0.6830."""
    words: set[str] = set()
    for _, layer in draft.layers:
        words |= words_of(layer.text)
    return frozenset(words)


def _summarized(ctx: StepContext) -> bool:
    """The build keeps a summary (a summariser is in use, or the state holds one)."""
    layers = ctx.layer_state
    kept = layers is not None and bool(layers.summary.summaries or layers.summary.meta_summary)
    return ctx.summarizer is not None or bool(ctx.summary_text) or kept


def _text_of(message: Message) -> str:
    """What a source shows of itself: its text, and for a tool call its calls."""
    calls = " ".join(f"{c.name} {c.arguments}" for c in message.tool_calls)
    return f"{message.text}\n{calls}" if calls else message.text


def _labels(history: Sequence[Message], sources: Sequence[tuple[int, Message]]) -> dict[int, str]:
    """``[cw:msg:<id> role]`` per source (``tool <name>`` for a tool result)."""
    names: dict[str, str] = {}
    for m in history:
        for c in m.tool_calls:
            names[c.id] = c.name
    out: dict[int, str] = {}
    for pos, m in sources:
        role: str = m.role
        if m.role == "tool":
            role = f"tool {m.name or names.get(m.tool_call_id or '', 'result')}"
        out[pos] = f"[{handle_for(m.id)} {role}]"
    return out


def _tokens(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased words of two or more characters, English stop words out (bm25s)."""
    bm25s = _bm25s()
    stop = set(bm25s.stopwords.STOPWORDS_EN)
    return [[w for w in _WORD.findall(t.lower()) if w not in stop] for t in texts]


def _rank(passages: Sequence[_Passage], query: str) -> list[_Passage]:
    """Passages with a positive BM25 score for ``query``, best first (ties: older
    first, so the order is the same at every build)."""
    terms = _tokens([query])[0]
    if not passages or not terms:
        return []
    corpus = _tokens([p.text for p in passages])
    bm25s = _bm25s()
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    scores = index.get_scores(terms)
    order = sorted(
        (i for i in range(len(passages)) if scores[i] > 0),
        key=lambda i: (-round(float(scores[i]), 6), passages[i].pos, passages[i].part),
    )
    return [passages[i] for i in order]


def _has_bm25s() -> bool:
    try:
        _bm25s()
    except MissingDependencyError:
        return False
    return True


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError:
        raise MissingDependencyError("the recall step (BM25, bm25s)", "recall") from None
    return bm25s


def _key(
    draft: Draft,
    query: str,
    lo: int,
    hi: int,
    sources: Sequence[tuple[int, Message]],
    cap: int,
    model: str,
    step: RecallRelevant,
) -> str:
    """What the block depends on, as a short digest (the memo's key)."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"{lo}|{hi}|{cap}|{model}|{step!r}|{draft.pinned}|".encode())
    h.update(query.encode("utf-8", "surrogatepass"))
    for name, layer in draft.layers:  # what the block need not repeat (see _layer_words)
        h.update(f"|{name}:{layer.fingerprint}".encode())
    if hi > 0:
        h.update(draft.history[hi - 1].fingerprint.encode())
    for pos, m in sources:
        if pos >= hi:  # window originals: which ones, not their (fixed) text
            h.update(f"|{pos}:{m.fingerprint}".encode())
    return h.hexdigest()
