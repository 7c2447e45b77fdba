"""``ctxwarden tune`` end to end: read the sessions, search, write the policy and report.

The CLI parses its options into a :class:`TuneRequest` and calls :func:`run_tune`;
everything it prints comes from the callbacks (problems, progress) and the result.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ctxwarden.core.errors import ConfigError, InvalidMessageError
from ctxwarden.pipeline.policy import Policy
from ctxwarden.tune.policy_file import policy_toml
from ctxwarden.tune.replay import ANTHROPIC, CachePrices
from ctxwarden.tune.search import Progress, TuneResult, tune_policy
from ctxwarden.tune.sources import Problem, Sessions, read_sessions, read_store

__all__ = ["TuneOutput", "TuneRequest", "run_tune"]


@dataclass(frozen=True)
class TuneRequest:
    traces: tuple[Path, ...]
    budget: int
    model: str = "gpt-4o"
    db: str | None = None
    tenant: str | None = None
    out: Path = Path("policy.toml")
    report: Path | None = Path("tune-report")  # .png, .html and .json beside; None: none
    base: Path | None = None
    trials: int = 40
    jobs: int = 1
    seed: int = 0
    prices: CachePrices = ANTHROPIC
    summarizer: str | None = None
    shrink: bool = False


@dataclass(frozen=True)
class TuneOutput:
    result: TuneResult
    policy_file: Path
    report_files: tuple[Path, ...]


def run_tune(
    request: TuneRequest,
    *,
    on_problem: Callable[[Problem], None] = lambda p: None,
    progress: Progress | None = None,
) -> TuneOutput:
    """Read, tune, write: the policy file and the report files (module doc)."""
    if request.budget < 1:
        raise ConfigError(f"--budget must be at least 1, got {request.budget}")
    found = _read(request)
    for problem in found.problems:
        on_problem(problem)
    if not found.sessions:
        where = ", ".join(str(t) for t in request.traces) or request.db or "nothing"
        raise InvalidMessageError(f"no readable session in {where}")
    base_data, base = _base(request.base)
    result = tune_policy(
        [(s.name, s.messages) for s in found.sessions],
        request.budget,
        model=request.model,
        base=base,
        trials=request.trials,
        jobs=request.jobs,
        seed=request.seed,
        prices=request.prices,
        summarizer=request.summarizer,
        shrink=request.shrink,
        progress=progress,
    )
    result = replace(result, problems=tuple(str(p) for p in found.problems))
    header = [
        f"ctxwarden tune: {request.model} at {request.budget:,} tokens, "
        f"{len(result.fit_sessions)} fitting / {len(result.check_sessions)} checking sessions, "
        f"{request.trials} trials, seed {request.seed}",
        f"checking half: retention {result.base_check.retention:.2%} -> "
        f"{result.tuned_check.retention:.2%}, cost vs full + cache "
        f"{result.base_check.cost:.1%} -> {result.tuned_check.cost:.1%}",
    ]
    if result.tuned_trial is None:
        header.append("no trial beat the default on every fitting session: the default is kept")
    text = policy_toml(
        result.tuned,
        budget=request.budget,
        summarizer=request.summarizer is not None,
        base=base_data,
        header=header,
    )
    Policy.from_toml(text)  # what we write loads back
    request.out.write_text(text, "utf-8")
    return TuneOutput(result, request.out, _write_report(result, request.report))


def _read(request: TuneRequest) -> Sessions:
    parts: list[Sessions] = []
    if request.traces:
        parts.append(read_sessions(request.traces))
    if request.db:
        parts.append(read_store(request.db, request.tenant))
    if not parts:
        raise ConfigError("give the recorded sessions: TRACES... (files, folders) or --db URL")
    return Sessions(
        tuple(s for p in parts for s in p.sessions), tuple(q for p in parts for q in p.problems)
    )


def _base(path: Path | None) -> tuple[dict[str, object] | None, Policy | None]:
    """The base policy's TOML data (kept in the output) and the policy it loads as."""
    if path is None:
        return None, None
    policy = Policy.from_toml(path)  # names the file and the problem
    return tomllib.loads(path.read_text("utf-8")), policy


def _write_report(result: TuneResult, prefix: Path | None) -> tuple[Path, ...]:
    if prefix is None:
        return ()
    from ctxwarden.tune.report import result_json, write_figure, write_html

    prefix.parent.mkdir(parents=True, exist_ok=True)
    files: Sequence[Path] = (
        write_figure(result, prefix.with_suffix(".png")),
        write_html(result, prefix.with_suffix(".html")),
    )
    data = prefix.with_suffix(".json")
    data.write_text(json.dumps(result_json(result), indent=2), "utf-8")
    return (*files, data)
