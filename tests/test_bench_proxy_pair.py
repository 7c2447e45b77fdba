"""``python -m ctxwarden_bench.proxy_pair``: two servers of two checkouts side by side,
CPU per call of each and their ratio."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ctxwarden_bench.proxy_pair import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mode", [[], ["--stream"]])
def test_two_servers_are_measured_side_by_side(
    mode: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--against", str(ROOT), "--sessions", "1", "--steps", "3", *mode]) == 0
    out = capsys.readouterr().out
    assert ("streams" if mode else "JSON") in out and "1 sessions x 2 calls" in out
    figures = [float(x) for x in re.findall(r": ([\d.]+) ms CPU per call", out)]
    assert len(figures) == 2 and all(f > 0 for f in figures)
    assert "ratio of CPU (this / that)" in out


def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in (
        (["--against", str(tmp_path)], "no src/ctxwarden there"),
        (["--against", str(ROOT), "--steps", "1"], "--steps must be at least 2"),
        (["--against", str(ROOT), "--sessions", "0"], "--sessions must be at least 1"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert said in capsys.readouterr().err
