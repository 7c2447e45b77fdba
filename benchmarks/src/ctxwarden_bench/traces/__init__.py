"""Real traces: tau-bench id retention and LoCoMo answer recall, per strategy.

**tau-bench retention** (context-engine issue). At every assistant tool call of every
run, the context is built from the messages before it (model gpt-4o, exact counts). The
*needed values* of the call are the string leaves of its parsed arguments under the keys
``user_id``, ``reservation_id``, ``flight_number`` and ``payment_id`` (nested lists such
as ``flights[]`` and ``payment_methods[]`` included) that occur in an earlier message: a
whole-token, case-sensitive match in the message's text (content, plus function name and
arguments for a tool call). A call's retention is the share of its needed values that
still occur, by the same rule, in the built context; the figure is the mean over calls
with at least one needed value. Reduction is ``1 - sum(built tokens) / sum(full-history
tokens)`` over the same calls (system prompt and reply priming included in both).

The baseline is a plain pair-safe "newest that fit" window
(:func:`~ctxwarden_bench.metrics.plain_window`: system prompt, then blocks newest first,
a block that does not fit skipped). On the 120-run dev file it gives, at 2,000 tokens,
75.8 % retention at 40.5 % reduction (issue: 76.6 % / 40.6 %) and at 1,600 tokens 54.7 %
at 50.8 % (issue: 54.3 % / 50.9 %). Variants tried, as (2,000; 1,600) retention: all
string leaves per value 80.9 / 57.7; the four id keys per value 74.0 / 51.0; ids plus
dates, airports and names 79.2 / 54.2; a window that stops at the first block that does
not fit gives the right retention for all leaves (75.8 / 52.8) but 44.0 / 53.7 reduction.
The skipping window matches the reductions to 0.15 point; per-call mean over id keys is
the definition closest on retention.

**LoCoMo answer recall** (summaries issue). Transcript: a system line, then per session a
user message ``[<session date>]`` and one message per turn ``Speaker: text`` (plus
`` [shares a photo: <caption>]``), the first speaker as user, the second as assistant;
each question of categories 1-4 is asked as a final user message. Content words are
lowercase alphanumeric runs minus a short stop list (a, an, the). A context's recall of
a gold answer is the mean of (a) the share of the answer's content words present in the
context and (b) the share of its consecutive content-word pairs present consecutively in
the context's word stream (for one-word answers, (b) = (a)). The question itself is not
counted as context. At 4,000 tokens on the 6-conversation dev file: full history 0.782,
window only 0.355 (issue: 0.79 / 0.35); a longer stop list (articles, pronouns,
auxiliaries) gives 0.786 / 0.337.

ctxwarden (window + offline summary + facts) runs through the public path, as a user
calls it, with the default policy: ``build_context(history, model, budget,
summarizer="offline", previous=<last build>)``, fed the transcript session by session,
then one build per question (the question is the newest user message). With no
``summary_share`` set the summary view fills what the system line, facts, the
unsummarised tail and the ledger's cap leave (:func:`~ctxwarden.steps.layers.fill_room`),
out of a store of two budgets of sentences
(:data:`~ctxwarden.pipeline.summarize.STORE_BUDGETS`). Cache-aware compaction (issue 37) with
``[cache] hold_layers = true`` (the summary view held between compactions unless the
focused one would show mostly other lines) measured 0.530, no summariser 0.440, the LoCoMo
loop at 68% / 37% of the full history's cost with caching (before it: 273% / 51%); the
default leaves the layers free. Before it, measured at 4,000 tokens: 0.592, mean
input 3,769 tokens (the defaults before: 0.434 on 2,269 tokens, the summary as written
cut to 35 % of the budget; the fill with a one-budget store 0.550); the same builds
without a summariser (row ``ctxwarden, no summariser``) 0.446. At 2,000 tokens 0.470
(no summariser 0.363). The tuned split of the bench before, ``summary_share=0.5`` with
:func:`locomo_trigger` (fold when the unsummarised messages pass the window's room,
keep the newest 3/5 of it), stays available as ``locomo_recall(...,
summary_share=0.5)``: it measured 0.554 with a one-budget store.
With ``--summarizer`` a real model writes the
summaries (shown as written, a model's summary cannot be focused) through the bench's
own loop (:class:`~.metrics.OursStrategy`), which counts and prices its calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import messages_from_openai
from ctxwarden.tune.measures import ID_KEYS, MIN_VALUE_CHARS, json_leaves, needed_values
from ctxwarden_bench.metrics import plain_window
from ctxwarden_bench.retention import (
    Builder,
    Mentions,
    Retention,
    call_retention,
    engine_builder,
    plain_builder,
)
from ctxwarden_bench.summarizers import Account, summarizer_for

__all__ = [
    "ID_KEYS",
    "MIN_VALUE_CHARS",
    "Retention",
    "answer_recall",
    "content_words",
    "engine_builder",
    "json_leaves",
    "load_locomo",
    "load_tau_bench",
    "locomo_loop_cost",
    "locomo_recall",
    "locomo_transcript",
    "locomo_trigger",
    "needed_values",
    "plain_builder",
    "tau_retention",
]

STOP_WORDS = frozenset({"a", "an", "the"})
_WORD = re.compile(r"\w+")
_CONTENT = re.compile(r"[a-z0-9]+")

Progress = Callable[[str], None] | None


def _load(path: str | Path, what: str) -> Any:
    p = Path(path)
    if not p.exists():
        raise InvalidMessageError(f"{what} file not found: {p}")
    try:
        return json.loads(p.read_text("utf-8"))
    except ValueError as exc:
        raise InvalidMessageError(f"{what} file {p} is not JSON: {exc}") from exc


def load_tau_bench(path: str | Path) -> list[list[Message]]:
    """tau-bench trajectories (a JSON list of runs with ``traj``) as message lists."""
    runs = _load(path, "tau-bench")
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "traj" in r for r in runs):
        raise InvalidMessageError(f"{path}: expected a list of runs, each with a 'traj' list")
    return [messages_from_openai(r["traj"]) for r in runs]


# -- tau-bench retention ----------------------------------------------------------------------


def _tau_needed(m: Message, earlier: Mentions, before: Sequence[Message]) -> list[tuple[str, str]]:
    found: dict[str, str] = {}
    for c in m.tool_calls:
        for v, g in needed_values(c.parsed_arguments(), earlier):
            found.setdefault(v, g)
    return list(found.items())


def tau_retention(
    runs: Sequence[Sequence[Message]],
    budget: int,
    builder: Builder,
    model: str = "gpt-4o",
    progress: Progress = None,
) -> Retention:
    """Every needed argument value of every tool call, kept by ``builder`` at ``budget``
    (``retention``); ``groups["ids"]`` is the id subset, ``per_call_retention`` the id
    share averaged per call (the figure this bench reported before)."""
    return call_retention(
        runs,
        budget,
        builder,
        _tau_needed,
        model=model,
        primary="ids",
        progress=progress,
        label="tau-bench run",
    )


# -- LoCoMo answer recall ---------------------------------------------------------------------


def load_locomo(path: str | Path) -> list[dict[str, Any]]:
    """LoCoMo conversations (a JSON list with ``conversation`` and ``qa``)."""
    convs = _load(path, "LoCoMo")
    if not isinstance(convs, list) or not all(
        isinstance(c, dict) and "conversation" in c and "qa" in c for c in convs
    ):
        raise InvalidMessageError(f"{path}: expected a list of objects with 'conversation', 'qa'")
    return convs


def locomo_transcript(conv: dict[str, Any]) -> list[Message]:
    """The transcript the recall measure is defined on (see the module docstring)."""
    c = conv["conversation"]
    a, b = c["speaker_a"], c["speaker_b"]
    sessions = sorted(
        (k for k in c if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1])
    )
    out = [Message.system(f"A conversation between {a} and {b}, over several sessions.", id="sys")]
    for s in sessions:
        out.append(Message.user(f"[{c.get(s + '_date_time', s)}]", id=f"{s}-date"))
        for turn in c[s]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            tid = str(turn.get("dia_id", len(out)))
            first = turn["speaker"] == a
            out.append(Message.user(text, id=tid) if first else Message.assistant(text, id=tid))
    return out


def content_words(text: str) -> list[str]:
    return [w for w in _CONTENT.findall(text.lower()) if w not in STOP_WORDS]


def answer_recall(answer: str, words: set[str], pairs: set[tuple[str, str]]) -> float | None:
    """Recall of one gold answer against a context's content words and word pairs."""
    gold = content_words(answer)
    if not gold:
        return None
    share = sum(w in words for w in gold) / len(gold)
    gold_pairs = list(pairwise(gold))
    if not gold_pairs:
        return share
    return (share + sum(p in pairs for p in gold_pairs) / len(gold_pairs)) / 2


def _vocabulary(messages: Iterable[Message]) -> tuple[set[str], set[tuple[str, str]]]:
    stream = [w for m in messages for w in content_words(m.text)]
    return set(stream), set(pairwise(stream))


NO_SUMMARY = "ctxwarden, no summariser"
"""The row of the same builds without a summariser: window, ledger (what a summary adds)."""

LOCOMO_SUMMARY_SHARE = 0.5
"""The budget split the LoCoMo bench uses: half for the summary, half for the window.
Its questions ask about any session of a long chat, so memory weighs as much as the
recent turns (0.4 and 0.6 measure within about 1.5 points of it)."""


def locomo_trigger(budget: int, summary_share: float = LOCOMO_SUMMARY_SHARE) -> Any:
    """Rolling summaries consistent with the split: the window's room is what the summary
    share and a small allowance for the system line, facts and question leave; fold
    when the unsummarised tail outgrows that room, keep its newest 3/5 verbatim (so the
    tail always fits the window and nothing falls between summary and window)."""
    from ctxwarden.memory.summaries import SummaryTrigger

    room = max(1, budget - int(budget * summary_share) - _LAYER_ALLOWANCE)
    return SummaryTrigger(
        max_messages=None,
        max_tokens=room,
        keep_recent=60,
        keep_recent_tokens=max(1, room * 3 // 5),
        fill_ratio=None,
        summary_share=summary_share,
    )


_LAYER_ALLOWANCE = 150  # system line + facts layer + the question, in tokens


def locomo_policy(budget: int, summary_share: float = LOCOMO_SUMMARY_SHARE) -> Any:
    """The policy the LoCoMo row passes to ``build_context``: the defaults, with
    :func:`locomo_trigger` as the summary trigger (the only knobs the bench sets)."""
    from ctxwarden.pipeline.policy import Policy

    return Policy(summary=locomo_trigger(budget, summary_share))


def locomo_recall(
    convs: Sequence[dict[str, Any]],
    budget: int = 4000,
    model: str = "gpt-4o",
    progress: Progress = None,
    *,
    summary_share: float | None = None,
    summarizer: Any = None,
    peers: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """Answer recall and reduction for full history, window only, ctxwarden (window
    + offline summary + facts) and the same builds without a summariser.

    ctxwarden is fed the transcript session by session, as a live agent would be, then
    builds one context per question (the question is the newest user message). With the
    default offline summariser every build is ``build_context(..., summarizer="offline",
    previous=...)`` with the default policy; a ``summary_share`` uses
    ``policy=locomo_policy(budget, summary_share)`` instead (the row's ``policy`` says
    which knobs it sets); a ``summarizer`` callable (``(messages, previous) -> text``), a
    provider spec or a :class:`~.summarizers.BenchSummarizer` (e.g. a real model) is
    shown as it writes; its calls, failures and usage are added to the ctxwarden row.
    ``peers`` (names of :data:`~.peers.PEERS`) adds their rows, each given the transcript
    and the question as OpenAI dicts and the budget (``over_budget`` and ``errors`` say
    where one did not hold it)."""
    account = Account()
    if summarizer is None:
        result = _locomo_recall(convs, budget, model, progress, summary_share, None, account, peers)
        ours = result["ctxwarden"]
        ours["summarizer"] = 'offline, build_context(summarizer="offline") (query-aware view)'
        ours["policy"] = (
            "default"
            if summary_share is None
            else {"summary": _knobs(locomo_trigger(budget, summary_share))}
        )
        ours.update(account.to_json())
        return result
    with summarizer_for(summarizer) as given:
        result = _locomo_recall(
            convs, budget, model, progress, summary_share, given, account, peers
        )
        cost = given.cost(account.usage, model)
    ours = result["ctxwarden"]
    ours["summarizer"] = given.label
    ours["summarizer_calls"] = account.usage.calls
    ours["summarizer_input_tokens"] = account.usage.input_tokens
    ours["summarizer_output_tokens"] = account.usage.output_tokens
    ours["summarizer_cost_usd"] = round(cost, 6)
    ours.update(account.to_json())
    return result


def _locomo_recall(
    convs: Sequence[dict[str, Any]],
    budget: int,
    model: str,
    progress: Progress,
    summary_share: float | None,
    summarizer: Any,
    account: Account,
    peers: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden_bench.metrics import EngineStrategy, OursStrategy

    others: dict[str, Any] = {}
    if peers:
        from ctxwarden_bench.peers import peer_builders

        others = peer_builders(model, peers)
    over = dict.fromkeys(others, 0)

    counter = TokenCounter.for_model(model)
    scores: dict[str, list[float]] = {
        "full history": [],
        "window only": [],
        "ctxwarden": [],
        NO_SUMMARY: [],
        **{name: [] for name in others},
    }
    tokens: dict[str, list[int]] = {name: [] for name in scores}
    transcripts: list[list[Message]] = []
    for n, conv in enumerate(convs):
        transcript = locomo_transcript(conv)
        counts = [counter.count_message(m) for m in transcript]
        qas = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and "answer" in q]
        if not qas:
            continue
        transcripts.append(transcript)
        policy = Policy() if summary_share is None else locomo_policy(budget, summary_share)
        ours: EngineStrategy | OursStrategy = (
            OursStrategy(model, budget, trigger=policy.summary, summarizer=summarizer)
            if summarizer
            else EngineStrategy(model, budget, policy=policy)
        )
        bare = EngineStrategy(model, budget, policy=policy, summarizer=None)
        for i, m in enumerate(transcript):  # feed session by session, as a live agent would
            if m.id.endswith("-date") and i > 1:
                ours(transcript[:i])
                bare(transcript[:i])
        ours(transcript)
        bare(transcript)
        account.add(ours.account.usage)
        account.errors += ours.account.errors
        full = _vocabulary(transcript)
        full_tokens = counter.count_messages(transcript).tokens
        for qa in qas:
            question = Message.user(str(qa["question"]), id="question")
            q_tokens = counter.count_message(question)
            kept, used = plain_window([*transcript, question], [*counts, q_tokens], budget)
            window = _vocabulary(transcript[i] for i in kept if i < len(transcript))
            built = ours.build([*transcript, question])
            plain = bare.build([*transcript, question])
            for name, (words, pairs) in (
                ("full history", full),
                ("window only", window),
                ("ctxwarden", _vocabulary(m for m in built if m.id != question.id)),
                (NO_SUMMARY, _vocabulary(m for m in plain if m.id != question.id)),
            ):
                r = answer_recall(str(qa["answer"]), words, pairs)
                if r is not None:
                    scores[name].append(r)
            tokens["full history"].append(full_tokens + q_tokens)
            tokens["window only"].append(used)
            tokens["ctxwarden"].append(counter.count_messages(built).tokens)
            tokens[NO_SUMMARY].append(counter.count_messages(plain).tokens)
            asked = [*transcript, question]
            for name, peer in others.items():
                sent = peer(asked, [*counts, q_tokens], budget)
                r = answer_recall(
                    str(qa["answer"]), *_vocabulary(m for m in sent if m.text != question.text)
                )
                if r is not None:
                    scores[name].append(r)
                tokens[name].append(counter.count_messages(sent).tokens)
                over[name] += tokens[name][-1] > budget
        if progress:
            progress(f"LoCoMo conversation {n + 1}/{len(convs)}")
    full_sum = sum(tokens["full history"]) or 1
    rows = {
        name: {
            "answer_recall": round(sum(v) / len(v), 4) if v else 0.0,
            "questions": len(v),
            "input_tokens_per_turn": tokens[name],
            "total_input_tokens": sum(tokens[name]),
            "reduction": round(1 - sum(tokens[name]) / full_sum, 4),
        }
        for name, v in scores.items()
    }
    for name, peer in others.items():
        rows[name] |= {"over_budget": over[name], "errors": peer.errors}
    if summarizer is None:  # (a model summariser would be called at every step of the loop)
        policy = Policy() if summary_share is None else locomo_policy(budget, summary_share)
        for name, cost in locomo_loop_cost(transcripts, budget, policy, model).items():
            rows[name] |= cost
    return rows


class _StrategyBuilder:
    """An :class:`~ctxwarden_bench.metrics.EngineStrategy` as a retention builder."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        return list(self.strategy(before))


def locomo_loop_cost(
    transcripts: Sequence[Sequence[Message]], budget: int, policy: Any, model: str = "gpt-4o"
) -> dict[str, dict[str, Any]]:
    """The LoCoMo loop at cache prices: each transcript replayed as an agent loop (a build
    before every message of the second speaker, chained; ctxwarden with the offline
    summariser, as its recall row runs), priced like the retention rows
    (:class:`~ctxwarden_bench.retention.LoopCost`) for the full history, the window only,
    ctxwarden and ctxwarden without a summariser."""
    from ctxwarden_bench.metrics import EngineStrategy
    from ctxwarden_bench.retention import call_retention

    def everything(before: Sequence[Message], counts: Sequence[int], n: int) -> list[Message]:
        return list(before)

    builders: dict[str, Any] = {
        "full history": everything,
        "window only": plain_builder(),
        "ctxwarden": _StrategyBuilder(EngineStrategy(model, budget, policy=policy)),
        NO_SUMMARY: engine_builder(model, policy=policy),
    }
    return {
        name: call_retention(transcripts, budget, b, lambda *a: [], model=model).cost.to_json()
        for name, b in builders.items()
    }


def _knobs(trigger: Any) -> dict[str, Any]:
    """The trigger fields that differ from the defaults: what the bench set."""
    from dataclasses import fields

    from ctxwarden.memory.summaries import SummaryTrigger

    default = SummaryTrigger()
    return {
        f.name: getattr(trigger, f.name)
        for f in fields(trigger)
        if getattr(trigger, f.name) != getattr(default, f.name)
    }
