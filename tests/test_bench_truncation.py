"""The hostile-input and coding-truncation benchmarks run and measure what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxwarden.core.kinds import load_json
from ctxwarden_bench import coding_truncation, hostile


def test_hostile_shapes_are_what_they_claim() -> None:
    for shape in hostile.SHAPES:
        text = hostile.hostile_text(shape, 100_000)
        assert 100_000 <= len(text) < 102_000, shape
    deep = hostile.hostile_text("deep-json", 200_000)
    assert deep.startswith('[{"a": {"a": ') and load_json(deep) == (False, None)


def test_hostile_bench_times_each_shape_in_fresh_processes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert hostile.main(["--size", "30000", "--shapes", "log-lines,deep-json", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["shape"] for r in rows] == ["log-lines", "deep-json"]
    for row in rows:
        parts = row["parts"]
        assert "error" not in parts, row
        assert parts["tokens"] <= 300 + 120 < parts["tokens_in"]
    assert rows[0]["build"]["build_s"] > 0 and rows[0]["build"]["tokens"] <= 8000
    assert rows[1]["parts"]["kind"] == "text"  # 10,000 deep: read as text, no RecursionError
    # the whole build of the deep shape is reported either way (a failure names its error)
    assert "build_s" in rows[1]["build"] or rows[1]["build"]["error"]


def _trace(tmp_path: Path) -> Path:
    listing = "\n".join([f"def helper_{i}(x):\n    return x + {i}\n" for i in range(300)])

    def call(k: int, cmd: str) -> dict[str, object]:
        arguments = json.dumps({"command": cmd})
        return {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }

    traj = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug in src/app.py."},
        {"role": "assistant", "content": "", "tool_calls": [call(1, "cat src/helpers.py")]},
        {"role": "tool", "tool_call_id": "c1", "content": listing},
        {"role": "assistant", "content": "", "tool_calls": [call(2, "grep -n helper_17 src/x.py")]},
        {"role": "tool", "tool_call_id": "c2", "content": "12:def helper_17(x):"},
        {"role": "assistant", "content": "", "tool_calls": [call(3, "sed -n 1p helper_299.txt")]},
        {"role": "tool", "tool_call_id": "c3", "content": "ok"},
    ]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([{"id": "r1", "traj": traj}]))
    return path


def test_coding_truncation_counts_later_tokens_found_in_the_result(tmp_path: Path) -> None:
    assert coding_truncation.needed_tokens("grep -n helper_17 src/x.py", "src/app.py") == [
        "helper_17",
        "src/x.py",
    ]
    report = coding_truncation.measure(_trace(tmp_path))
    totals = report["totals"]
    assert totals["results"] == 1  # only the listing is over the threshold
    # of the later commands' tokens only helper_17 occurs (whole) in the listing:
    # src/x.py and helper_299.txt do not
    assert totals["all_needed"] == 1 and totals["next_needed"] == 1
    assert 0 <= totals["all_kept"] <= 1
    assert report["share"]["all"] == totals["all_kept"]
