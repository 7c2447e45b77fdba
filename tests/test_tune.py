"""``ctxwarden tune`` on the dev traces (small seeded subsets, bounded trials): the tuned
policy holds on the checking half, the search is deterministic for a seed whatever
``--jobs`` is, the written policy loads back, and the CLI names bad files and goes on."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from typer.testing import CliRunner

from ctxwarden import Message, Policy, build_context
from ctxwarden.cli.main import app
from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.pipeline.compaction import CacheConfig
from ctxwarden.tune import read_sessions, score_policy, tune_policy
from ctxwarden.tune.policy_file import tuned_tables
from ctxwarden.tune.replay import Score
from ctxwarden.tune.search import MIN_GAIN, TrialResult, TuneResult, _candidates, split_sessions
from ctxwarden.tune.space import apply_params, default_params

pytest.importorskip("optuna")

TAU = SHARED_DATA / "tau-bench"
SWEBENCH = SHARED_DATA / "swebench-mini"
needs_data = pytest.mark.skipif(
    not (TAU.exists() and SWEBENCH.exists()), reason=f"dev traces not found in {SHARED_DATA}"
)


def _sessions(
    path: Path, count: int, shortest: bool = False
) -> list[tuple[str, tuple[Message, ...]]]:
    found = read_sessions([path])
    assert found.problems == ()
    sessions = [(s.name, s.messages) for s in found.sessions]
    if shortest:
        sessions = sorted(sessions, key=lambda s: len(s[1]))
    return sessions[:count]


def _holds_and_loads(result: TuneResult, tmp_path: Path) -> None:
    assert result.trials[0].params == result.base_params  # the search starts at the default
    assert result.base_fit.feasible and result.tuned_check.feasible
    assert result.tuned_check.retention >= result.base_check.retention
    assert result.tuned_check.cost <= result.base_check.cost
    assert result.holds
    from ctxwarden.tune.policy_file import policy_toml

    path = tmp_path / "policy.toml"
    path.write_text(policy_toml(result.tuned, budget=result.budget, summarizer=False))
    loaded = Policy.from_toml(path)
    assert loaded.max_input_tokens == result.budget
    assert tuned_tables(loaded, False) == tuned_tables(result.tuned, False)


@needs_data
def test_tau_bench_subset_holds_and_is_deterministic_across_jobs(tmp_path: Path) -> None:
    sessions = _sessions(TAU, 16)
    one = tune_policy(sessions, 2000, trials=6, jobs=1, seed=3)
    two = tune_policy(sessions, 2000, trials=6, jobs=2, seed=3)

    _holds_and_loads(one, tmp_path)
    assert [t.params for t in one.trials] == [t.params for t in two.trials]
    assert [t.score for t in one.trials] == [t.score for t in two.trials]
    assert (one.tuned_params, one.tuned_check) == (two.tuned_params, two.tuned_check)
    assert len({json.dumps(t.params, sort_keys=True) for t in one.trials}) == 6
    assert set(one.fit_sessions).isdisjoint(one.check_sessions)
    assert len(one.fit_sessions) + len(one.check_sessions) == 16


@needs_data
def test_swebench_subset_holds(tmp_path: Path) -> None:
    result = tune_policy(_sessions(SWEBENCH, 10, shortest=True), 4000, trials=6, jobs=2, seed=0)
    _holds_and_loads(result, tmp_path)
    assert result.base_check.needed > 0 and result.base_check.calls > 0


@needs_data
def test_the_replay_scores_what_the_policy_changes() -> None:
    """A policy that masks a result on every call moves the prefix more often than the
    default's batched masking, keeps no more, and is priced differently. (Weighed at
    gpt-4o's own prices, ``[cache] prices = "model"``: the default cautious prices hold
    every mask until a forced compaction, so both policies build the same.) Which one
    costs less depends on what a rewrite writes again: since the layers may follow the
    task (steps.layout), a rewrite no longer writes the task, and on these three runs the
    eager masking costs 0.5124 against 0.5160."""
    runs = [m for _, m in _sessions(SWEBENCH, 3, shortest=True)]
    base = Policy(cache=CacheConfig(prices="model"))
    default = score_policy(runs, base, 4000)
    eager = score_policy(
        runs, apply_params(base, {"mask.keep_last": 1, "mask.batch_tokens": 0}), 4000
    )
    assert default.feasible and eager.feasible
    assert default.needed == eager.needed > 0
    assert eager.prefix_calls < default.prefix_calls  # its prefix moved at more calls
    assert eager.cost != default.cost
    assert eager.retention <= default.retention
    assert len(eager.cost_per_session) == len(runs) == len(default.cost_per_session)


def _score(kept: set[tuple[int, int, str]], cost: float, violations: int = 0) -> Score:
    return Score(
        retention=len(kept) / 4,
        cost=cost,
        kept=len(kept),
        needed=4,
        calls=4,
        violations=violations,
        over_budget=0,
        errors=0,
        tokens=100,
        full_tokens=200,
        prefix_calls=0.5,
        kept_values=frozenset(kept),
        cost_per_session=(cost / 2, cost / 2),
    )


def test_a_candidate_loses_nothing_the_default_keeps_and_saves_enough() -> None:
    a, b, c = (0, 1, "a"), (0, 2, "b"), (1, 1, "c")
    base = TrialResult(0, {}, _score({a, b}, 1.0))
    trials = [
        base,
        TrialResult(1, {}, _score({a, c}, 0.5)),  # more kept in all, but b is lost
        TrialResult(2, {}, _score({a, b}, 1 - MIN_GAIN / 2)),  # a gain within the noise
        TrialResult(3, {}, _score({a, b, c}, 0.9, violations=1)),  # breaks an invariant
        TrialResult(4, {}, _score({a, b}, 0.7)),
        TrialResult(5, {}, _score({a, b, c}, 0.9)),
        TrialResult(6, {}, replace(_score({a, b}, 0.7), cost_per_session=(0.1, 0.6))),  # one
    ]
    assert [t.number for t in _candidates(trials)] == [5, 4]  # retention first, then cost


def test_without_optuna_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed
    sessions = [("a", (Message.user("hi"),)), ("b", (Message.user("ho"),))]
    with pytest.raises(MissingDependencyError, match=r"ctxwarden\[tune\]"):
        tune_policy(sessions, 1000)


def test_the_cli_imports_neither_optuna_nor_matplotlib() -> None:
    code = (
        "import sys, ctxwarden.cli.main\n"
        "print('optuna' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_split_is_by_session_seeded_and_needs_two() -> None:
    names = [f"s{i}" for i in range(7)]
    fit, check = split_sessions(names, 1)
    assert (fit, check) == split_sessions(names, 1)
    assert sorted(fit + check) == list(range(7)) and len(fit) == 4
    assert split_sessions(names, 2) != (fit, check)
    with pytest.raises(Exception, match="at least 2 sessions"):
        split_sessions(["only"], 0)


def test_default_params_round_trip_to_the_default_policy() -> None:
    base = Policy()
    assert apply_params(base, default_params(base, False)) == base
    bigger = apply_params(base, {"ledger.max_tokens": 900, "window.refill_ratio": 0.9})
    assert (bigger.ledger.max_tokens, bigger.window.refill_ratio) == (900, 0.9)
    assert replace(bigger, ledger=base.ledger, window=base.window) == base


def test_the_written_policy_file_carries_the_knobs_into_a_build(tmp_path: Path) -> None:
    """``policy_toml`` over a base policy file keeps the base's own keys and sets the
    tuned ones; the build that loads it masks as the tuned knobs say."""
    from ctxwarden.tune.policy_file import policy_toml

    base_text = "recall_tool = true\n\n[recall]\nshare = 0.2\n"
    base_data = tomllib.loads(base_text)
    eager = apply_params(Policy(), {"mask.keep_last": 1, "mask.batch_tokens": 0})
    path = tmp_path / "policy.toml"
    path.write_text(policy_toml(eager, budget=5000, summarizer=False, base=base_data))
    loaded = Policy.from_toml(path)
    assert loaded.recall_tool and loaded.recall is not None and loaded.recall.share == 0.2
    assert (loaded.mask.keep_last, loaded.mask.batch_tokens, loaded.max_input_tokens) == (
        1,
        0,
        5000,
    )
    history: list[dict[str, object]] = [{"role": "system", "content": "Agent."}]
    for i in range(4):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        history += [
            {"role": "user", "content": f"Read part {i}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"part {i} " * 200},
        ]
    masked = len(build_context(history, policy=loaded).audit.by_action("masked"))
    default = len(build_context(history, max_input_tokens=5000).audit.by_action("masked"))
    assert (masked, default) == (3, 0)


@needs_data
def test_cli_names_bad_files_goes_on_and_writes_a_loadable_policy(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    runs = json.loads((TAU / "airline-gpt-4o-dev.json").read_text("utf-8"))[:6]
    (traces / "runs.json").write_text(json.dumps(runs), "utf-8")
    (traces / "bad.jsonl").write_text(
        json.dumps(runs[6 - 1]["traj"]) + "\n{oops\n", "utf-8"
    )  # line 1 is a session, line 2 is not JSON
    (traces / "broken.json").write_text('{"messages": [\n  {"role": "user"\n', "utf-8")
    out, report = tmp_path / "tuned.toml", tmp_path / "report" / "tune"

    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(traces),
            "--budget",
            "2000",
            "--trials",
            "3",
            "--jobs",
            "1",
            "--out",
            str(out),
            "--report",
            str(report),
        ],
    )

    assert result.exit_code == 0, result.output
    assert f"{traces / 'bad.jsonl'}:2: not valid JSON" in result.stderr
    assert f"{traces / 'broken.json'}:3: not valid JSON" in result.stderr
    assert "checking half" in result.stdout
    # piped (not a terminal), the tables are laid out wide: no header or knob cut short
    assert "cost vs full+cache" in result.stdout and "…" not in result.stdout
    policy = Policy.from_toml(out)
    assert policy.max_input_tokens == 2000
    for suffix in (".png", ".html", ".json"):
        assert report.with_suffix(suffix).stat().st_size > 0
    data = json.loads(report.with_suffix(".json").read_text("utf-8"))
    assert len(data["trials"]) == 3
    assert len(data["fit_sessions"]) + len(data["check_sessions"]) == 7
    assert len(data["problems"]) == 2
    assert "<svg" in report.with_suffix(".html").read_text("utf-8")


def test_cli_without_sessions_or_budget_is_a_one_line_error(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["tune", str(tmp_path), "--budget", "2000"])
    assert missing.exit_code == 2
    assert "no readable session" in missing.stderr
    no_budget = runner.invoke(app, ["tune", str(tmp_path)])
    assert no_budget.exit_code == 2 and "--budget" in no_budget.stderr


@needs_data
def test_with_a_summariser_the_summary_trigger_is_searched_and_written(tmp_path: Path) -> None:
    from ctxwarden.tune.policy_file import policy_toml

    result = tune_policy(_sessions(TAU, 4), 2000, trials=3, summarizer="offline", seed=1)
    assert {"summary.max_messages", "summary.keep_share", "summary.fill_ratio"} <= set(
        result.trials[1].params
    )
    assert result.base_check.feasible and result.holds
    text = policy_toml(result.tuned, budget=2000, summarizer=True)
    loaded = Policy.from_toml(text)
    assert loaded.summary.max_messages == result.tuned.summary.max_messages
    assert loaded.summary.keep_recent < loaded.summary.max_messages
