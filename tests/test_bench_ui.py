"""The session-page bench (``python -m ctxwarden_bench.ui``) runs to its end: the page from
a running ``ctxwarden serve`` is fetched signed in as a browser is (the key posted to the
sign-in form, the server's signed cookie kept), not with a cookie the server never signs."""

from __future__ import annotations

import pytest
from conftest import SHARED_DATA, TAU_BENCH

from ctxwarden_bench.ui import main


@pytest.mark.skipif(not TAU_BENCH.exists(), reason=f"tau-bench data not found at {TAU_BENCH}")
def test_the_bench_fetches_the_page_from_a_running_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--turns", "12", "--repeat", "1", "--data", str(SHARED_DATA)]) == 0
    out = capsys.readouterr().out
    assert "session page at 12 turns" in out
    assert "from a running ctxwarden serve, client wall time on loopback" in out
    assert "session show --html, every turn in one file" in out
