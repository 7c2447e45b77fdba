"""The count-cache benchmark runs and reports consistent figures (timing is not asserted)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ctxwarden_bench import count_cache


def test_on_tau_bench_history(tau_bench_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tau_bench_path.parent.parent
    # 4,000 > the file's 3,516 non-system messages: the runs are cycled
    assert (
        count_cache.main(["--messages", "4000", "--repeats", "2", "--json", "--data", str(data)])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["messages"] == 4000 and "tau-bench" in report["source"]
    assert report["consistent"] is True
    assert report["recount_tokens"] > report["scratch_tokens"]
    assert report["recount_ms"] < report["scratch_ms"]
    assert (
        0 < report["ratio"] == pytest.approx(report["recount_ms"] / report["scratch_ms"], rel=1e-3)
    )


def test_cycled_history_repeats_no_message(tau_bench_path: Path) -> None:
    history, _ = count_cache.build_history(4000, tau_bench_path.parent.parent)
    assert len(history) == 4000
    first_cycle = {m.fingerprint for m in history if not m.id.startswith("c1")}
    later = [m for m in history if m.id.startswith("c1")]
    assert len(later) > 400
    assert not any(m.fingerprint in first_cycle for m in later)
    assert len({m.id for m in history}) == 4000


def test_synthetic_history_and_text_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert count_cache.main(["--messages", "500", "--repeats", "1", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "synthetic" in out
    assert re.search(r"re-count / scratch: \d+\.\d\d%", out)
    assert "cached re-count equals a fresh count: yes" in out
