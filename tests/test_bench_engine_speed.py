"""The engine-speed benchmark runs end to end and reports consistent figures.

Timings are printed, never asserted (the machine is shared); what is asserted is what
the figures rest on: every ctxwarden context is within budget by a fresh exact count,
the audit's shared-prefix figure agrees with the JSON cross-check, and the traffic is
deterministic and well formed.
"""

from __future__ import annotations

import importlib.util
import json
from itertools import islice

import pytest

from ctxwarden.core.pairing import group_blocks
from ctxwarden_bench import engine_speed, trim_baseline
from ctxwarden_bench.traffic import session_calls

HAS_LANGCHAIN = importlib.util.find_spec("langchain_core") is not None


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    return engine_speed.run(
        sizes=(100,), budget=2_000, repeats=1, calls=8, fresh_runs=1, session_calls_n=12
    )


def test_size_rows_are_within_budget(report: dict[str, object]) -> None:
    rows = report["sizes"]
    assert isinstance(rows, list) and len(rows) == 1
    row = rows[0]
    assert row["messages"] == 100
    assert row["history_tokens"] > 2_000  # the budget really forces trimming
    assert 0 < row["input_tokens"] <= 2_000
    assert row["fresh_input_tokens"] == row["input_tokens"]  # audit == a fresh exact count
    assert 0 < row["loop_max_input_tokens"] <= 2_000
    assert row["within_budget"] is True
    assert row["loop_calls"] == 8
    assert 0 < row["fresh_session_input_tokens"] <= 2_000  # the replica's build, too
    timed = ("loop_mean_ms", "loop_median_ms", "cold_warm_ms", "cold_fresh_ms")
    for key in (*timed, "fresh_state_ms", "fresh_session_ms"):
        assert row[key] > 0
    assert row["loop_median_ms"] <= row["loop_max_ms"]
    # where the fresh cold build's time goes: the same build with the policy variants
    assert set(engine_speed.COLD_VARIANTS) == {"lookback0", "no_ledger"}
    for variant in engine_speed.COLD_VARIANTS:
        assert row[f"cold_fresh_{variant}_ms"] > 0
        assert row[f"cold_fresh_{variant}_gc_ms"] >= 0


def test_cold_variant_policies_change_the_ledger() -> None:
    """A variant's policy is what its build runs: without the ledger, the context
    holds no ledger block; the default one, on 100 messages, does."""
    from ctxwarden.steps.ledger import LEDGER_ID

    history = engine_speed.history_source("synthetic", 100)[0]
    for variant, has_ledger in (("no_ledger", False), ("", True)):
        policy = engine_speed.COLD_VARIANTS[variant] if variant else engine_speed._POLICY
        built = engine_speed._build(history, 2_000, None, policy)
        assert any(m.id == LEDGER_ID for m in built.messages) is has_ledger


def test_trim_messages_compared_when_installed(report: dict[str, object]) -> None:
    row = report["sizes"][0]  # type: ignore[index]
    if HAS_LANGCHAIN:
        assert report["langchain_core"]
        assert row["trim_ms"] > 0 and 1 <= row["trim_kept"] < 100
        assert row["speedup_loop_mean"] == pytest.approx(row["trim_ms"] / row["loop_mean_ms"])
    else:
        assert report["langchain_core"] is None and "trim_ms" not in row


def test_prefix_stability_figures(report: dict[str, object]) -> None:
    prefix = report["prefix"]
    assert isinstance(prefix, dict)
    calls = prefix["calls"]
    assert [c["call"] for c in calls] == list(range(1, 13))
    assert calls[0]["prefix_shared_tokens"] == 0 and calls[0]["cache_hit"] is False
    assert prefix["audit_matches_json"] is True
    assert prefix["within_budget"] is True
    for c in calls:
        assert 0 <= c["prefix_shared_tokens"] <= c["input_tokens"] <= 4_000
        assert 0.0 <= c["share"] <= 1.0
    # early calls of a session append only: the whole previous context is reused
    assert calls[1]["cache_hit"] is True and calls[1]["share"] > 0.5
    assert 0.0 <= prefix["hit_rate"] <= 1.0
    assert set(report["passed"]) >= {"loop_ms", "cold_ms", "speedup", "cache_hit"}  # type: ignore[arg-type]


def test_the_three_cold_build_figures_stand_beside_their_targets(
    report: dict[str, object],
) -> None:
    """Issue 35: a stored session in a fresh process, and a cold build with no stored
    state against trim_messages and alone, each judged (or ``None`` when not run)."""
    targets, passed = report["targets"], report["passed"]
    assert isinstance(targets, dict) and isinstance(passed, dict)
    assert targets["fresh_session_ms"] == targets["fresh_cold_small_ms"] == 20.0
    assert targets["fresh_cold_trim_ratio"] == 0.25
    (row,) = report["sizes"]  # type: ignore[misc]
    assert passed["fresh_session_ms"] == (row["fresh_session_ms"] <= 20.0)
    assert passed["fresh_cold_small_ms"] == (row["cold_fresh_ms"] <= 20.0)
    if "trim_ms" in row:
        ratio = row["cold_fresh_ms"] / row["trim_ms"]
        assert passed["fresh_cold_trim_ratio"] == (ratio <= 0.25)


def test_traffic_is_deterministic_and_well_formed() -> None:
    a = list(islice(engine_speed.agent_traffic(3), 300))
    b = list(islice(engine_speed.agent_traffic(3), 300))
    assert [m.fingerprint for m in a] == [m.fingerprint for m in b]
    assert a[0].role == "system" and len({m.id for m in a}) == 300
    blocks = group_blocks(a[1:-5])  # cut at the end may split a step; the body may not
    assert all(blk.sendable for blk in blocks[:-3])
    kinds = {m.kind for m in a if m.role == "tool"}
    assert "json" in kinds
    assert any(len(m.tool_calls) == 2 for m in a)  # parallel calls occur


def test_session_calls_end_at_model_call_points() -> None:
    for history in islice(session_calls(1, 20), 20):
        last = history[-1]
        assert last.role in ("user", "tool")


def test_cli_json_without_langchain(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(engine_speed, "langchain_messages", lambda: None)
    monkeypatch.setattr(trim_baseline, "langchain_messages", lambda: None)
    argv = ["--sizes", "60", "--repeats", "1", "--calls", "3", "--fresh-runs", "0", "--brief"]
    assert engine_speed.main(argv) == 0
    out = capsys.readouterr().out
    assert "langchain-core is not installed" in out and "skipped" in out
    assert engine_speed.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["langchain_core"] is None and data["passed"]["speedup"] is None
    assert data["sizes"][0]["cold_fresh_ms"] is None


def test_cli_rejects_bad_sizes() -> None:
    with pytest.raises(SystemExit):
        engine_speed.main(["--sizes", "ten"])


def test_one_prompt_source_is_a_coding_agents_run(capsys: pytest.CaptureFixture[str]) -> None:
    """``--source one-prompt``: one user request, then only the model's steps (the shape
    whose window region is the whole history), well formed, and timed within budget."""
    history, about = engine_speed.history_source("one-prompt", 400)
    assert [i for i, m in enumerate(history) if m.role == "user"] == [1]
    assert "one user request" in about
    assert all(blk.sendable for blk in group_blocks(history[1:-5])[:-3])
    assert sum(m.role == "tool" for m in history) > 100
    argv = ["--source", "one-prompt", "--sizes", "200", "--repeats", "1", "--calls", "3"]
    assert engine_speed.main([*argv, "--fresh-runs", "0", "--brief", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["sizes"][0]
    assert row["history_tokens"] > 2_000 and row["within_budget"] is True
    assert 0 < row["loop_max_input_tokens"] <= 2_000 and row["loop_calls"] == 3
