"""The search: optuna's TPE over the policy space, scored on the fitting half.

Sessions are split by session (never inside one) into a fitting half and a checking
half, shuffled by the seed. The study has two objectives on the fitting half — needed-
later retention (up) and cost at cache prices (down) — and two constraints: no invariant
violation or build over budget, and no needed value lost that the base policy keeps
(:func:`losses`). The base policy is the first trial, so the search starts from it.

The tuned policy is the best of :func:`_candidates` (it says which trials qualify and
why); when none does, it is the base policy itself (the report says so). Both are then
scored on the checking half, which the search never saw.

Deterministic for a seed: trials are asked in batches of :data:`BATCH` whatever
``jobs`` is, scored (in ``jobs`` processes) and told in order, so the sampler sees the
same history on one core or many.
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from ctxwarden.core.errors import ConfigError, MissingDependencyError
from ctxwarden.core.messages import Message
from ctxwarden.pipeline.policy import Policy
from ctxwarden.tune.replay import ANTHROPIC, CachePrices, Needed, Score, needed_in, score_policy
from ctxwarden.tune.space import apply_params, default_params, params_for, searched

__all__ = ["BATCH", "TrialResult", "TuneResult", "split_sessions", "tune_policy"]

BATCH = 4
"""Trials asked of the sampler at once (constant, so results do not depend on ``jobs``)."""

Progress = Callable[[str, int, int], None]
"""(phase, done, total): called as trials and checks finish."""


@dataclass(frozen=True)
class TrialResult:
    number: int
    params: dict[str, float]
    score: Score


@dataclass(frozen=True)
class TuneResult:
    """Everything the report shows."""

    budget: int
    model: str
    seed: int
    prices: CachePrices
    summarizer: str | None
    base: Policy
    tuned: Policy
    base_params: dict[str, float]
    tuned_params: dict[str, float]
    tuned_trial: int | None  # None: no trial beat the base policy, it is kept
    trials: tuple[TrialResult, ...]
    front: tuple[int, ...]  # trial numbers on the fitting half's retention/cost front
    importance: dict[str, dict[str, float]]  # objective -> param -> share
    fit_sessions: tuple[str, ...]
    check_sessions: tuple[str, ...]
    base_check: Score
    tuned_check: Score
    seconds: float
    problems: tuple[str, ...] = field(default=())

    @property
    def base_fit(self) -> Score:
        return self.trials[0].score

    @property
    def holds(self) -> bool:
        """The tuned policy keeps at least the base's retention at no higher cost on the
        checking half, with no violation."""
        t, b = self.tuned_check, self.base_check
        return t.feasible and t.retention >= b.retention and t.cost <= b.cost


def split_sessions(names: Sequence[str], seed: int) -> tuple[list[int], list[int]]:
    """Indices of the fitting and checking halves, shuffled by ``seed`` (fitting gets the
    odd one out)."""
    if len(names) < 2:
        raise ConfigError(
            f"tuning needs at least 2 sessions (one to fit, one to check), got {len(names)}"
        )
    order = list(range(len(names)))
    random.Random(seed).shuffle(order)
    cut = (len(order) + 1) // 2
    return sorted(order[:cut]), sorted(order[cut:])


# -- scoring, in this process or a worker -----------------------------------------------------

_WORK: dict[str, Any] = {}


def _init(
    sessions: Sequence[Sequence[Message]],
    needed: Sequence[Needed],
    base: Policy,
    budget: int,
    model: str,
    prices: CachePrices,
    summarizer: str | None,
) -> None:
    _WORK.update(
        sessions=sessions,
        needed=needed,
        base=base,
        budget=budget,
        model=model,
        prices=prices,
        summarizer=summarizer,
    )


Job = tuple[Sequence[Sequence[Message]], Sequence[Needed], dict[str, float], int]
"""(sessions, their needed values, params, budget): one replay."""


def _score(params: dict[str, float]) -> Score:
    """The fitting half under ``params`` at the budget (in this process or a worker)."""
    return _score_on((_WORK["sessions"], _WORK["needed"], params, _WORK["budget"]))


def _score_on(job: Job) -> Score:
    sessions, needed, params, budget = job
    w = _WORK
    return score_policy(
        sessions,
        apply_params(w["base"], params),
        budget,
        model=w["model"],
        prices=w["prices"],
        summarizer=w["summarizer"],
        needed=needed,
    )


# -- the study --------------------------------------------------------------------------------


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise MissingDependencyError("ctxwarden tune (optuna)", "tune") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def tune_policy(
    sessions: Sequence[tuple[str, Sequence[Message]]],
    budget: int,
    *,
    model: str = "gpt-4o",
    base: Policy | None = None,
    trials: int = 40,
    jobs: int = 1,
    seed: int = 0,
    prices: CachePrices = ANTHROPIC,
    summarizer: str | None = None,
    shrink: bool = False,
    progress: Progress | None = None,
) -> TuneResult:
    """Fit the policy to ``sessions`` (``(name, messages)``) at ``budget`` (module doc)."""
    optuna = _optuna()
    if trials < 1:
        raise ConfigError(f"trials must be at least 1, got {trials}")
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, got {jobs}")
    started = time.monotonic()
    base = (base or Policy()).with_budget(budget)
    fit_at, check_at = split_sessions([n for n, _ in sessions], seed)
    fit = [sessions[i][1] for i in fit_at]
    check = [sessions[i][1] for i in check_at]
    fit_needed = [needed_in(run) for run in fit]
    check_needed = [needed_in(run) for run in check]
    start = default_params(base, summarizer is not None)
    setup = (base, budget, model, prices, summarizer)
    tick = progress or (lambda phase, done, total: None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            n_startup_trials=min(10, max(trials // 3, 1)),
        )
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    study.enqueue_trial(start)
    done: list[TrialResult] = []
    with _pool(jobs, fit, fit_needed, setup) as run:
        tick("fit", 0, trials)
        while len(done) < trials:
            asked = [study.ask() for _ in range(min(BATCH, trials - len(done)))]
            drawn = [params_for(t, summarizer is not None, start, shrink) for t in asked]
            for trial, params, score in zip(asked, drawn, run(_score, drawn), strict=True):
                done.append(TrialResult(trial.number, params, score))
                trial.set_constraint("violations", score.violations + score.over_budget)
                trial.set_constraint("losses", losses(score, done[0].score))
                study.tell(trial, [score.retention, score.cost])
                tick("fit", len(done), trials)
        chosen = next(iter(_candidates(done)), None)
        tuned_params = chosen.params if chosen else start
        tick("check", 0, 2)
        both = [(check, check_needed, start, budget), (check, check_needed, tuned_params, budget)]
        base_check, tuned_check = run(_score_on, both)
        tick("check", 2, 2)
    return TuneResult(
        budget=budget,
        model=model,
        seed=seed,
        prices=prices,
        summarizer=summarizer,
        base=base,
        tuned=apply_params(base, tuned_params),
        base_params=start,
        tuned_params=tuned_params,
        tuned_trial=chosen.number if chosen else None,
        trials=tuple(done),
        front=tuple(sorted(t.number for t in study.best_trials)),
        importance=_importance(optuna, study, summarizer is not None),
        fit_sessions=tuple(sessions[i][0] for i in fit_at),
        check_sessions=tuple(sessions[i][0] for i in check_at),
        base_check=base_check,
        tuned_check=tuned_check,
        seconds=time.monotonic() - started,
    )


def losses(score: Score, base: Score) -> int:
    """Needed values the base policy keeps at a call and ``score``'s policy does not
    (a value kept elsewhere does not pay for one lost)."""
    return len(base.kept_values - score.kept_values)


MIN_GAIN = 0.02
"""A candidate must cost at least 2% less than the base policy on the fitting half: a
smaller gain is within what the checking half moves by (tau-bench dev, 20 sessions
@2,000: -0.2% fitting, +3.8% checking)."""


def _cheaper_in_most(score: Score, base: Score) -> bool:
    pairs = zip(score.cost_per_session, base.cost_per_session, strict=True)
    signs = [(mine < theirs) - (mine > theirs) for mine, theirs in pairs]
    return sum(signs) > 0


def _candidates(done: Sequence[TrialResult]) -> list[TrialResult]:
    """The trials that may replace the base policy, best first.

    A candidate must be feasible, cost :data:`MIN_GAIN` less than the base policy and
    less in more fitting sessions than it costs more (a saving made in one long session
    did not carry: swebench-mini dev, 3 fitting sessions @4,000, -2% fitting, +19%
    checking), and keep at every
    call of the fitting half every needed value the base keeps there (no
    :func:`losses`; the search has this as a constraint too): a knob that matters in a
    few sessions only (the ledger's room when the system prompt leaves little) may not
    trade one call's losses for another's gains, the trade that did not carry to
    unseen sessions when the pooled share alone was compared (tau-bench dev @2,000:
    +0.4 points fitting, -2.7 checking). Best: the highest retention, then the lowest
    cost.
    """
    base = done[0].score
    better = [
        t
        for t in done[1:]
        if t.score.feasible
        and t.score.cost <= base.cost * (1 - MIN_GAIN)
        and _cheaper_in_most(t.score, base)
        and losses(t.score, base) == 0
    ]
    return sorted(better, key=lambda t: (-t.score.retention, t.score.cost, t.number))


def _importance(optuna: Any, study: Any, summarizer: bool) -> dict[str, dict[str, float]]:
    """PED-ANOVA importance of each knob for each objective: how differently the best
    quarter of the trials sets it from the rest (empty when there are too few trials;
    fANOVA would need scikit-learn)."""
    names = [p.name for p in searched(summarizer)]
    targets: dict[str, Callable[[Any], float]] = {
        "retention": lambda t: -t.values[0],  # the evaluator ranks low values best
        "cost": lambda t: t.values[1],
    }
    out: dict[str, dict[str, float]] = {}
    for objective, target in targets.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                found = optuna.importance.get_param_importances(
                    study,
                    evaluator=optuna.importance.PedAnovaImportanceEvaluator(target_quantile=0.25),
                    params=names,
                    target=target,
                )
        except (RuntimeError, ValueError, ZeroDivisionError):
            continue
        out[objective] = {k: float(v) for k, v in found.items()}
    return out


class _pool:
    """``run(fn, items) -> results in order``: in this process, or ``jobs`` forked workers
    that hold the sessions from the start (nothing is pickled per trial but the params)."""

    def __init__(
        self,
        jobs: int,
        sessions: Sequence[Sequence[Message]],
        needed: Sequence[Needed],
        setup: tuple[Any, ...],
    ):
        self.jobs, self.sessions, self.needed, self.setup = jobs, sessions, needed, setup
        self.executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> Callable[[Callable[[Any], Score], Sequence[Any]], list[Score]]:
        if self.jobs > 1:
            sys.stdout.flush()  # a forked worker would write out what is buffered again
            sys.stderr.flush()
            self.executor = ProcessPoolExecutor(
                self.jobs,
                mp_context=get_context("fork"),
                initializer=_init,
                initargs=(self.sessions, self.needed, *self.setup),
            )
        else:
            _init(self.sessions, self.needed, *self.setup)
        return self.run

    def run(self, fn: Callable[[Any], Score], items: Sequence[Any]) -> list[Score]:
        if self.executor is None:
            return [fn(i) for i in items]
        return list(self.executor.map(fn, items))

    def __exit__(self, *exc: object) -> None:
        if self.executor is not None:
            self.executor.shutdown(cancel_futures=True)
