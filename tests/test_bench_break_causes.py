"""The break-causes bench (issue 37): it prices the same calls as the bench's cost columns,
and every break it counts has the cause the audit gave it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import LOCOMO, SHARED_DATA, TAU_BENCH

from ctxwarden_bench.break_causes import _parse_rows, break_causes, main, side_json

SWEBENCH = SHARED_DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"


@pytest.mark.skipif(not SWEBENCH.exists(), reason=f"swebench-mini data not found at {SWEBENCH}")
def test_it_prices_the_calls_the_bench_prices() -> None:
    from ctxwarden_bench.retention import engine_builder
    from ctxwarden_bench.swebench import load_swebench, swebench_retention

    runs = load_swebench(SWEBENCH)[:3]
    row = break_causes(runs, 4000, "coding")
    bench = swebench_retention(runs, 4000, engine_builder()).cost
    assert row.ours.units == pytest.approx(bench.anthropic)
    assert row.sawtooth.units == pytest.approx(bench.sawtooth_anthropic)
    assert row.ours.calls == bench.calls
    # each call whose previous context is not a prefix is a break the audit named
    breaks = side_json(row.ours)["breaks"]
    assert breaks == sum(c.count for c in row.causes.values()) > 0
    assert len(row.before_break) == len(row.after_break) == breaks
    assert all("N" in c or not any(ch.isdigit() for ch in c) for c in row.causes)


@pytest.mark.skipif(not TAU_BENCH.exists(), reason=f"tau-bench data not found at {TAU_BENCH}")
def test_the_command_prints_each_row_and_writes_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "causes.json"
    args = ["--data", str(SHARED_DATA), "--rows", "tau@2000", "--runs", "2", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "tau @2,000: ours" in printed and "of the sawtooth's cost" in printed
    (row,) = json.loads(out.read_text("utf-8"))
    assert row["row"] == "tau" and row["budget"] == 2000
    assert row["ours"]["breaks"] == sum(c["breaks"] for c in row["causes"])
    assert row["ours"]["calls"] == row["sawtooth"]["calls"] > 0


@pytest.mark.skipif(not TAU_BENCH.exists(), reason=f"tau-bench data not found at {TAU_BENCH}")
def test_a_policy_file_replaces_the_default(tmp_path: Path) -> None:
    """A lower low-water mark makes each compaction drop more, so it breaks the prefix
    less often and sends less: the policy the file names is the one replayed."""
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden_bench.traces import load_tau_bench

    runs = load_tau_bench(TAU_BENCH)[:4]
    default = break_causes(runs, 2000, "tau")
    path = tmp_path / "policy.toml"
    path.write_text("[window]\nrefill_ratio = 0.2\n", encoding="utf-8")
    low = break_causes(runs, 2000, "tau", Policy.from_toml(path))
    assert low.ours.input_tokens < default.ours.input_tokens
    assert low.sawtooth.units == default.sawtooth.units  # the baseline is the same
    bad = tmp_path / "bad.toml"
    bad.write_text("[window]\nrefill_ratio = 3\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"--policy: .*refill_ratio"):
        main(["--data", str(SHARED_DATA), "--rows", "tau@2000", "--policy", str(bad)])


@pytest.mark.skipif(not TAU_BENCH.exists(), reason=f"tau-bench data not found at {TAU_BENCH}")
def test_a_budget_below_the_system_prompt_counts_each_build_as_an_error() -> None:
    from ctxwarden_bench.traces import load_tau_bench

    row = break_causes(load_tau_bench(TAU_BENCH)[:1], 300, "tau")
    assert row.errors == row.ours.calls > 0  # each priced as the plain window a caller sends
    assert not row.causes and row.to_json()["median_after_break"] is None


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo data not found at {LOCOMO}")
def test_the_locomo_row_prices_the_chat_loop_the_bench_prices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The LoCoMo row replays the chat loop the bench's LoCoMo cost columns price (the
    offline summariser, its layers and recall): the same cost, each break with its cause,
    the recall block's among them (it follows every new request)."""
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden_bench.break_causes import _chat_loop
    from ctxwarden_bench.traces import load_locomo, locomo_loop_cost, locomo_transcript

    transcripts = [locomo_transcript(c) for c in load_locomo(LOCOMO)[:1]]
    row = break_causes(transcripts, 4000, "locomo", None, _chat_loop)
    bench = locomo_loop_cost(transcripts, 4000, Policy())["ctxwarden"]
    assert row.ours.units == pytest.approx(bench["cache_cost_units"], abs=1)  # (rounded there)
    assert row.ours.units / row.sawtooth.units == pytest.approx(
        bench["cache_cost_vs_sawtooth"], abs=1e-4
    )
    breaks = side_json(row.ours)["breaks"]
    assert breaks == sum(c.count for c in row.causes.values()) > 0
    assert any(c.startswith("the recall block follows") for c in row.causes)
    args = ["--data", str(SHARED_DATA), "--rows", "locomo@4000", "--runs", "1"]
    assert main(args) == 0
    assert "locomo @4,000: ours" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["tau", "tau@", "chat@2000", "coding@-5", "coding@4k"])
def test_a_malformed_row_is_named(bad: str) -> None:
    with pytest.raises(SystemExit, match="is not TRACE@BUDGET"):
        _parse_rows(f"coding@4000,{bad}")
