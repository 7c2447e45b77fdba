"""``python -m ctxwarden_bench.responses_replay``: swebench-mini runs through ``/v1/responses``
with the real ``openai`` SDK, the context upstream got compared with the library's call
for call."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import SHARED_DATA

from ctxwarden_bench.responses_replay import as_responses_client, main
from ctxwarden_bench.swebench import load_swebench

SWEBENCH = SHARED_DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"
pytestmark = pytest.mark.skipif(
    not SWEBENCH.exists(), reason=f"swebench-mini data not found at {SWEBENCH}"
)


def test_a_run_as_a_responses_client_holds_it() -> None:
    """Ids kept, tool results without the tool name the wire has no place for; the rest
    (texts, calls, call ids) as recorded."""
    run = load_swebench(SWEBENCH)[0]
    assert any(m.role == "tool" and m.name for m in run)  # (the recording names them)
    held = as_responses_client(run)
    assert [m.id for m in held] == [m.id for m in run]
    assert all(m.name is None for m in held if m.role == "tool")
    for was, now in zip(run, held, strict=True):
        assert (now.role, now.text, now.tool_calls, now.tool_call_id) == (
            was.role,
            was.text,
            was.tool_calls,
            was.tool_call_id,
        )


@pytest.mark.parametrize("client", ["sdk", "httpx"])
def test_what_upstream_got_is_the_library_context_call_for_call(
    client: str, tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    argv = ["--data", str(SWEBENCH), "--runs", "2", "--budgets", "4000", "--json", str(out)]
    assert main([*argv, "--client", client]) == 0
    row = json.loads(out.read_text())["budgets"]["4000"]
    assert row["client"] == client
    calls = row["calls"]
    assert calls > 10
    assert row["contexts_equal_to_library"] == calls
    assert row["proxy"]["retention"] == row["library"]["retention"] == row["session"]["retention"]
    assert row["proxy"]["violations"] == row["proxy"]["over_budget"] == 0
    assert row["proxy_cpu_ms_per_call"] > 0
    assert 0 < row["direct_call_p50_ms"] < row["call_p50_ms"]  # (the same request, direct)
    # the two per-call targets judged on the figures beside them, and the machine's spell
    cpu, p50 = row["targets"]
    assert cpu["target"] == "CPU per call <= 5 ms"
    assert cpu["met"] == (row["proxy_cpu_ms_per_call"] <= 5)
    assert cpu["figures"] == f"{row['proxy_cpu_ms_per_call']:.1f}"
    assert p50["target"] == "p50 added <= 5 ms"
    assert p50["met"] == (row["added_p50_ms"] <= 5)
    assert p50["figures"] == f"{row['added_p50_ms']:+.1f}"
    assert row["reference_ms_before"] > 0 and row["reference_ms_after"] > 0


def test_each_budget_is_replayed_through_a_proxy_of_its_own(tmp_path: Path) -> None:
    """A proxy that had replayed the runs at one budget would meet every message of the
    next budget's pass in its caches (entities, token counts, cuts): its CPU per call
    would be a second sight's, which no message a real proxy receives gets."""
    out = tmp_path / "figures.json"
    argv = ["--data", str(SWEBENCH), "--runs", "1", "--budgets", "4000,8000", "--client"]
    assert main([*argv, "httpx", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["budgets"]
    assert rows["4000"]["proxy_pid"] != rows["8000"]["proxy_pid"]
    assert all(r["contexts_equal_to_library"] == r["calls"] > 0 for r in rows.values())


@pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("callgrind_control")),
    reason="needs valgrind (apt-get install valgrind)",
)
def test_the_proxy_counted_under_callgrind_gives_one_figure_per_call(tmp_path: Path) -> None:
    """``--callgrind``: the proxy's instructions per call, counted only while the proxied
    pass runs, the same from one run to the next; the CPU and p50 targets are not judged
    on a process valgrind slows ~50x, and the contexts are still the library's."""
    figures = []
    for k in range(2):
        out = tmp_path / f"figures-{k}.json"
        argv = ["--data", str(SWEBENCH), "--runs", "1", "--budgets", "4000", "--callgrind"]
        assert main([*argv, "--client", "httpx", "--json", str(out)]) == 0
        row = json.loads(out.read_text())["budgets"]["4000"]
        assert row["contexts_equal_to_library"] == row["calls"] > 0
        assert row["targets"] == []
        figures.append(row["proxy_instructions_per_call"])
    # more than the build's share alone (millions per call); the same within 1%
    assert all(f > 5e6 for f in figures), figures
    assert abs(figures[0] / figures[1] - 1) < 0.01, figures


def test_a_context_that_differs_fails_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A library fed the recording's tool names (what the wire cannot carry) builds other
    contexts: the command says so and exits non-zero."""
    import ctxwarden_bench.responses_replay as replay

    def named(run: list) -> list:  # type: ignore[type-arg]
        return [dataclasses.replace(m, name="bash") if m.role == "tool" else m for m in run]

    real = replay.engine_builder

    def naming(model: str, policy: object = None):  # type: ignore[no-untyped-def]
        inner = real(model, policy=policy)  # one builder for the whole replay, as made
        return lambda before, counts, budget: inner(named(before), counts, budget)

    monkeypatch.setattr(replay, "engine_builder", naming)
    out = tmp_path / "figures.json"
    argv = ["--data", str(SWEBENCH), "--runs", "1", "--budgets", "4000", "--json", str(out)]
    assert main(argv) == 1
    row = json.loads(out.read_text())["budgets"]["4000"]
    assert row["contexts_equal_to_library"] < row["calls"]


def test_a_policy_file_is_the_one_all_three_build_with(tmp_path: Path) -> None:
    """``--policy``: the library, the stored session and ``ctxwarden serve --policy``
    build with the file's policy. Without early compactions the second run at 8,000
    tokens gets other contexts than the default's, so a server that ignored the file
    would send other contexts than the library and fail the command."""
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden_bench.responses_replay import Recorded
    from ctxwarden_bench.retention import engine_builder
    from ctxwarden_bench.swebench import swebench_retention

    path = tmp_path / "policy.toml"
    path.write_text("[cache]\nearly_compaction = false\n", encoding="utf-8")
    runs = [as_responses_client(r) for r in load_swebench(SWEBENCH)[:2]]
    default, own = (
        Recorded(engine_builder()),
        Recorded(engine_builder(policy=Policy.from_toml(path))),
    )
    swebench_retention(runs, 8000, default)
    swebench_retention(runs, 8000, own)
    assert default.contexts != own.contexts  # (the file changes what is built here)
    out = tmp_path / "figures.json"
    argv = ["--data", str(SWEBENCH), "--runs", "2", "--budgets", "8000", "--json", str(out)]
    assert main([*argv, "--client", "httpx", "--policy", str(path)]) == 0
    row = json.loads(out.read_text())["budgets"]["8000"]
    assert row["contexts_equal_to_library"] == row["calls"] == len(own.contexts)
    bad = tmp_path / "bad.toml"
    bad.write_text('[cache]\nprices = "cheap"\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"--policy: .*cache\.prices"):
        main(["--data", str(SWEBENCH), "--runs", "1", "--policy", str(bad)])
