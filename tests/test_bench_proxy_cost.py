"""``python -m ctxwarden_bench.proxy_cost``: a proxied call's cost counted so that two
checkouts compare (CPU per call in-process, or instructions under callgrind)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ctxwarden_bench.proxy_cost import main, measure

ROOT = Path(__file__).resolve().parents[1]


def test_measure_makes_the_measured_calls_on_both_routes() -> None:
    for api, stream in (("openai", False), ("anthropic", True)):
        calls, cpu = measure(api, stream, sessions=1, calls=2, warm=0)
        assert calls == 2 and cpu > 0


def test_cold_calls_are_made_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    """With the caches flushed before each call, the calls are made and measured, and
    the report says the figure is a cold one."""
    calls, cpu = measure("openai", False, sessions=1, calls=2, warm=1, cold_mb=8)
    assert calls == 2 and cpu > 0
    assert main(["--sessions", "1", "--calls", "1", "--warm", "0", "--cold", "8"]) == 0
    out = capsys.readouterr().out
    assert "caches flushed (8 MB) before each" in out and "ms CPU per call" in out


def test_a_given_store_is_measured_and_kept(tmp_path: Path) -> None:
    """``--db``: the calls go to that store, each run's sessions in a tenant of its own,
    so a second run on the same database does not meet the first's."""
    from ctxwarden.store import open_store
    from ctxwarden.store.service_tables import list_tenants
    from ctxwarden_bench.proxy import conversation, history_at

    base = conversation(200)
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    for _ in range(2):
        calls, cpu = measure("openai", False, sessions=1, calls=2, warm=1, db=url)
        assert calls == 2 and cpu > 0
    with open_store(url) as store:
        tenants = [t.tenant for t in list_tenants(store)]
        assert len(tenants) == 2 and all(t.startswith("cost-") for t in tenants)
        for tenant in tenants:  # the 4th call's history (first, warm, 2 measured), its reply
            (session,) = store.list_sessions(tenant)
            assert store.count(tenant, session.session_id) == len(history_at(base, 3)) + 1


def test_cpu_per_call_against_a_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sessions", "1", "--calls", "2", "--warm", "1", "--against", str(ROOT)]) == 0
    out = capsys.readouterr().out
    figures = [float(x) for x in re.findall(r": ([\d.]+) ms CPU per call", out)]
    assert len(figures) == 2 and all(f > 0 for f in figures)
    assert "ratio (this / that)" in out


def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in (
        (["--against", str(tmp_path)], "no src/ctxwarden there"),
        (["--calls", "0"], "--calls must be at least 1"),
        (["--warm", "-1"], "--warm must be at least 0"),
        (["--cold", "-1"], "--cold must be at least 0"),
        (["--cold", "8", "--callgrind"], "--cold is a CPU figure"),
        (["--db", "nonsense://x"], "--db: unknown store URL 'nonsense://x'"),
        (["--db", f"sqlite:///{tmp_path}/no/such/dir/x.db"], "--db: "),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert said in capsys.readouterr().err


@pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("callgrind_control")),
    reason="needs valgrind (apt-get install valgrind)",
)
def test_instructions_per_call_of_one_code_twice_agree(capsys: pytest.CaptureFixture[str]) -> None:
    """The same code counted twice (here, and as the checkout to compare with) gives
    nearly the same instructions per call: the figure holds from one run to the next."""
    argv = ["--sessions", "1", "--calls", "2", "--warm", "1", "--callgrind"]
    assert main([*argv, "--against", str(ROOT)]) == 0
    out = capsys.readouterr().out
    figures = [float(x) for x in re.findall(r": ([\d.]+)M instructions per call", out)]
    assert len(figures) == 2 and all(f > 1 for f in figures)
    assert 0.97 < figures[0] / figures[1] < 1.03, out
