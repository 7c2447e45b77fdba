"""The bench's builds through a stored :class:`~ctxwarden.Session`, the path the service runs.

``ctxwarden serve`` keeps each conversation in a session: every call appends what is new,
a worker (or the caller) folds what a summary is due for, and the build reads the store.
:class:`SessionBuilder` does the same for a recorded run — one session per run, appended
turn by turn, summarised with ``Session.summarize_sync`` when a summariser is given, and
built before each model call — so a bench row made with it measures the service's path,
beside the in-memory row of :class:`~ctxwarden_bench.retention.EngineBuilder`.
:func:`compare_paths` replays runs through both at every model call (every assistant
message) and counts the calls whose contexts differ: the two paths must send the same
context, so a difference is a failure, not a footnote.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.core.handles import handle_for
from ctxwarden.core.messages import Message
from ctxwarden.formats.openai import message_to_openai
from ctxwarden_bench.metrics import plain_window
from ctxwarden_bench.retention import EngineBuilder

__all__ = ["PathCheck", "SessionBuilder", "compare_paths", "model_calls", "sent"]


def sent(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """A context as the wire carries it (OpenAI dicts, no metadata): what is compared."""
    return [message_to_openai(m) for m in messages]


def model_calls(run: Sequence[Message]) -> list[int]:
    """Positions of a run's model calls: every assistant message after the first message
    (the history before it is what the model was called with)."""
    return [k for k, m in enumerate(run) if k and m.role == "assistant"]


class SessionBuilder:
    """A bench builder through :class:`~ctxwarden.Session` (see the module docstring).

    ``store`` is a store URL (SQLite or PostgreSQL); each run gets its own session (a new
    id whenever the messages do not extend the last run's). ``summarizer`` (a spec such
    as ``"offline"``) is run with ``Session.summarize_sync`` before each build, as the
    worker does when the proxy finds a summary due. A build the budget cannot hold
    (:class:`~ctxwarden.core.errors.BudgetError`) counts in ``errors`` and the plain window is
    sent instead, as :class:`~ctxwarden_bench.retention.EngineBuilder` does."""

    def __init__(
        self,
        store: str,
        model: str = "gpt-4o",
        *,
        policy: Any = None,
        summarizer: Any = None,
        prefix: str | None = None,
    ) -> None:
        self.store, self.model, self.policy, self.summarizer = store, model, policy, summarizer
        self.prefix = prefix or f"bench-{uuid.uuid4().hex[:8]}"
        self.errors = 0
        self.error_examples: list[str] = []
        self.last: Any = None  # the last BuiltContext (None after an error)
        self._runs = itertools.count()
        self._session: Any = None
        self._run: list[Message] = []

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> SessionBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _extends(self, before: Sequence[Message]) -> bool:
        n = len(self._run)
        return (
            self._session is not None
            and 0 < n <= len(before)
            and before[n - 1].fingerprint == self._run[-1].fingerprint
        )

    def build(self, before: Sequence[Message], budget: int) -> Any:
        """Append what is new, summarise when a summariser is given, build; the
        :class:`~ctxwarden.BuiltContext` (raises what the build raises)."""
        from ctxwarden.session import Session

        if not self._extends(before):
            self.close()
            sid = f"{self.prefix}-{next(self._runs)}"
            self._session = Session(self.store, sid, model=self.model, policy=self.policy)
            self._run = []
        new = list(before[len(self._run) :])
        if new:
            self._session.append(new)
            self._run.extend(new)
        if self.summarizer is not None:
            self._session.summarize_sync(
                self.summarizer, policy=self.policy, max_input_tokens=budget
            )
        return self._session.build(self.model, self.policy, max_input_tokens=budget)

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        from ctxwarden.core.errors import BudgetError

        try:
            self.last = self.build(before, budget)
        except BudgetError as exc:
            self.errors += 1
            if len(self.error_examples) < 3:
                self.error_examples.append(str(exc)[:200])
            self.last = None
            kept, _ = plain_window(before, counts, budget)
            return [before[i] for i in kept]
        return list(self.last.messages)


@dataclass
class PathCheck:
    """What :func:`compare_paths` found: model calls replayed, how many sent the same
    context on every path, and the first differences."""

    calls: int = 0
    equal: int = 0
    user_missing: int = 0  # session builds without the newest user message
    errors: int = 0  # calls where one path raised and the other did not
    examples: list[str] = field(default_factory=list)

    @property
    def differ(self) -> int:
        return self.calls - self.equal

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "equal": self.equal,
            "differ": self.differ,
            "newest_user_missing": self.user_missing,
            "examples": self.examples,
        }


def _holds(sent: Message, user: Message) -> bool:
    """Whether ``sent`` is the user message ``user``: whole, or the agent's task cut to
    its share (:mod:`ctxwarden.steps.task`: same id, its handle in the text)."""
    return sent.text == user.text or (sent.id == user.id and handle_for(user.id) in sent.text)


def _newest_user(before: Sequence[Message]) -> Message | None:
    return next((m for m in reversed(before) if m.role == "user"), None)


def compare_paths(
    runs: Sequence[Sequence[Message]],
    budget: int,
    paths: dict[str, Callable[[Sequence[Message], int], Any]],
    *,
    reference: Callable[[Sequence[Message], int], Any],
    progress: Callable[[str], None] | None = None,
) -> dict[str, PathCheck]:
    """Replay ``runs`` at every model call through ``reference`` (the in-memory build)
    and each of ``paths`` (``(messages before the call, budget) -> BuiltContext``), and
    compare what each sends with the reference's, message for message."""
    from ctxwarden.core.errors import BudgetError

    checks = {name: PathCheck() for name in paths}
    for n, run in enumerate(runs):
        for k in model_calls(run):
            before = run[:k]
            try:
                want: list[dict[str, Any]] | None = sent(reference(before, budget).messages)
            except BudgetError:
                want = None
            user = _newest_user(before)
            for name, path in paths.items():
                check = checks[name]
                check.calls += 1
                try:
                    built = path(before, budget)
                except BudgetError:
                    check.equal += want is None
                    check.errors += want is not None
                    continue
                got = sent(built.messages)
                if user is not None and not any(_holds(m, user) for m in built.messages):
                    check.user_missing += 1
                if got == want:
                    check.equal += 1
                elif len(check.examples) < 5:
                    check.examples.append(_difference(n, k, want, got))
        if progress:
            progress(f"run {n + 1}/{len(runs)}")
    return checks


def _difference(
    run: int, call: int, want: list[dict[str, Any]] | None, got: list[dict[str, Any]]
) -> str:
    if want is None:
        return f"run {run} call {call}: the reference raised BudgetError, this path built"
    first = next(
        (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
        min(len(want), len(got)),
    )
    return (
        f"run {run} call {call}: {len(want)} against {len(got)} messages, "
        f"first difference at message {first}"
    )


def engine_path(
    model: str = "gpt-4o", *, policy: Any = None, summarizer: Any = None
) -> Callable[[Sequence[Message], int], Any]:
    """The in-memory reference: ``build_context`` in an agent loop (``previous`` = the
    last build of the same run), with ``summarizer`` when given."""
    engine = EngineBuilder(model, policy=policy, summarizer=summarizer)
    return engine.build


LoCoMoPath = Callable[[Sequence[Message], int], list[dict[str, Any]]]
"""(the messages of one question, budget) -> the context a path sends, as OpenAI dicts."""


def session_locomo_path(store: str, model: str = "gpt-4o", *, prefix: str | None = None) -> Any:
    """The session path of one LoCoMo question: a new session, ``append`` the messages,
    ``summarize_sync("offline")``, ``build()`` with no summariser given (the stored
    summary is laid out as the summariser that wrote it says)."""
    from ctxwarden.session import Session

    names = itertools.count()
    tag = prefix or f"locomo-{uuid.uuid4().hex[:8]}"

    def path(messages: Sequence[Message], budget: int) -> list[dict[str, Any]]:
        with Session(store, f"{tag}-{next(names)}", model=model) as s:
            s.append(messages)
            s.summarize_sync("offline", max_input_tokens=budget)
            return sent(s.build(model, max_input_tokens=budget).messages)

    return path


def locomo_paths(
    convs: Sequence[dict[str, Any]],
    budget: int = 4000,
    model: str = "gpt-4o",
    *,
    paths: dict[str, LoCoMoPath],
    questions: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """LoCoMo answer recall and fill per path, and how many questions each path sent the
    in-memory context for. Each question is asked of the whole transcript with the
    default policy and the offline summariser: in memory ``build_context(messages,
    summarizer="offline")``, and through each of ``paths`` (``questions``: the first
    that many of each conversation, all by default). Messages carry the ids a store
    gives them (``m<seq>``), the question last."""
    from ctxwarden import build_context
    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden_bench.traces import _vocabulary, answer_recall, locomo_transcript

    counter = TokenCounter.for_model(model)
    names = ["build_context", *paths]
    recall: dict[str, list[float]] = {n: [] for n in names}
    fill: dict[str, list[float]] = {n: [] for n in names}
    equal = dict.fromkeys(paths, 0)
    asked = 0
    for n, conv in enumerate(convs):
        transcript = locomo_transcript(conv)
        qas = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and "answer" in q]
        for qa in qas[:questions]:
            question = Message.user(str(qa["question"]))
            # ids as a store names them: a proxy's client sends none, and the summary
            # names the span it folded by them
            messages = [m.with_id(f"m{i}") for i, m in enumerate([*transcript, question])]
            want = sent(build_context(messages, model, budget, summarizer="offline").messages)
            contexts = {"build_context": want}
            for name, path in paths.items():
                contexts[name] = got = path(messages, budget)
                equal[name] += got == want
            asked += 1
            for name, context in contexts.items():
                shown = [m for m in _parsed(context) if m.text != question.text]
                r = answer_recall(str(qa["answer"]), *_vocabulary(shown))
                if r is not None:
                    recall[name].append(r)
                fill[name].append(counter.count_messages(_parsed(context)).tokens / budget)
        if progress:
            progress(f"LoCoMo conversation {n + 1}/{len(convs)}")
    return {
        name: {
            "answer_recall": round(sum(recall[name]) / len(recall[name]), 4)
            if recall[name]
            else 0.0,
            "fill": round(sum(fill[name]) / len(fill[name]), 4) if fill[name] else 0.0,
            "questions": asked,
            **({"same_as_build_context": equal[name]} if name in equal else {}),
        }
        for name in names
    }


def _parsed(context: list[dict[str, Any]]) -> list[Message]:
    from ctxwarden.formats.openai import messages_from_openai

    return messages_from_openai(context)
