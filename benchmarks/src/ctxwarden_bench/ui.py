"""Server time of the session page at 2,000 turns (R15).

Run: ``python -m ctxwarden_bench.ui [--turns 2000] [--budget 2000] [--postgres DSN]``.

A session is filled as an agent loop fills it: the recorded tau-bench runs
(``tau-bench/airline-gpt-4o-dev.json`` under ``--data``, ``$CTXWARDEN_DATA``,
``../shared/data`` or ``data``) replayed one after another, system prompt once, and a
:meth:`~ctxwarden.Session.build` before every assistant message until ``--turns``
builds are logged. Then what ``GET /ui/sessions/{id}`` does on the server is timed
(median of ``--repeat``): read the session row and every logged build, lay out the
chart, read the selected turn's originals and built messages, render the template.
The target: under 1 s at 2,000 turns. Printed beside it: each part, the page's size,
the turn fragment the page's script asks for, the same page fetched from a running
``ctxwarden serve`` (client wall time on loopback, with the server extra), the
``session show --html`` file (every turn in it), and what logging a build costs inside
``Session.build``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ctxwarden.core.messages import Message
from ctxwarden.session import session as session_module
from ctxwarden.session.session import Session
from ctxwarden.store.service_tables import list_builds
from ctxwarden.ui import render_report, render_session, render_turn, session_page, turn_view
from ctxwarden.ui.chart import chart
from ctxwarden_bench.data_files import find_data
from ctxwarden_bench.local_servers import start_serve, stop_process

TARGET_SECONDS = 1.0


def _trace(data: str | None) -> Path:
    found = find_data("tau-bench/airline-gpt-4o-dev.json", data)
    if found is None:
        sys.exit("tau-bench data not found: give --data DIR (holding tau-bench/) or CTXWARDEN_DATA")
    return found


def _messages(path: Path) -> Iterator[Message]:
    """The runs one after another, forever; the system prompt only once."""
    from ctxwarden_bench.traces import load_tau_bench

    runs = load_tau_bench(path)
    yield runs[0][0]
    while True:
        for run in runs:
            yield from (m for m in run if m.role != "system")


def _median(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def fill(s: Session, path: Path, turns: int, budget: int) -> tuple[float, float]:
    """Log ``turns`` builds; return the median build and the median logging, in seconds."""
    logging: list[float] = []
    builds: list[float] = []
    names = vars(session_module)  # Session.build calls the module's log_build
    real = names["log_build"]

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            logging.append(time.perf_counter() - t)

    names["log_build"] = timed
    try:
        pending: list[Message] = []
        done = 0
        for m in _messages(path):
            if m.role == "assistant" and pending and pending[-1].role != "system":
                s.append(pending)
                pending = []
                t = time.perf_counter()
                s.build(max_input_tokens=budget)
                builds.append(time.perf_counter() - t)
                done += 1
                if done % 250 == 0:
                    print(f"  {done} builds", file=sys.stderr)
                if done == turns:
                    break
            pending.append(m)
    finally:
        names["log_build"] = real
    return statistics.median(builds), statistics.median(logging)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--budget", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data", default=None)
    ap.add_argument("--postgres", default=None, help="a PostgreSQL DSN (a schema is made)")
    args = ap.parse_args(argv)
    path = _trace(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        schema = f"ctxw_bench_ui_{uuid.uuid4().hex[:8]}"
        url = (
            f"{args.postgres}{'&' if '?' in args.postgres else '?'}schema={schema}"
            if args.postgres
            else f"sqlite:///{tmp}/ui.db"
        )
        try:
            with Session(url, "long") as s:
                t0 = time.perf_counter()
                build_s, log_s = fill(s, path, args.turns, args.budget)
                print(
                    f"filled {len(s):,} messages, {args.turns:,} builds in "
                    f"{time.perf_counter() - t0:.0f} s; median build {build_s * 1e3:.1f} ms, "
                    f"of which logging it {log_s * 1e3:.2f} ms"
                )
                _report(s, args.repeat)
        finally:
            if args.postgres:
                import psycopg

                with psycopg.connect(args.postgres, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


def _served(s: Session, repeat: int) -> float | None:
    """The page through a real ``ctxwarden serve`` on loopback: the client's median wall
    time (server time plus moving the page over loopback); ``None`` without the server
    extra."""
    try:
        import httpx
        import uvicorn  # noqa: F401
    except ImportError:
        return None
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix
    from ctxwarden.store.service_tables import add_tenant

    key = new_key()
    add_tenant(s.store, s.tenant, key_hash=hash_key(key), key_prefix=shown_prefix(key))
    proc, base = start_serve(
        ["--db", s.store.url, "--upstream", "http://127.0.0.1:9/v1"], quiet=True
    )
    try:
        with httpx.Client(base_url=base, timeout=30) as client:  # (it answered /healthz)
            # signed in as a browser is: the key posted to the form, the signed cookie kept
            signed = client.post("/ui/login", data={"key": key})
            if signed.status_code != 303:
                raise RuntimeError(f"signing in to the page failed: HTTP {signed.status_code}")

            def get() -> int:
                answer = client.get(f"/ui/sessions/{s.session_id}")
                answer.raise_for_status()
                return len(answer.content)

            get()  # the first request opens the session and warms the templates
            wall, _ = _median(get, repeat)
            return wall
    finally:
        stop_process(proc)


def _report(s: Session, repeat: int) -> None:
    store, tenant, sid = s.store, s.tenant, s.session_id

    def page() -> str:
        record = store.get_session(tenant, sid)
        assert record is not None
        return render_session(session_page(store, tenant, record), root="/ui", tenant=tenant)

    total, html = _median(page, repeat)
    builds = list_builds(store, tenant, sid, limit=100_000)
    read, _ = _median(lambda: list_builds(store, tenant, sid, limit=100_000), repeat)
    record = store.get_session(tenant, sid)
    assert record is not None
    view = session_page(store, tenant, record)
    layout, _ = _median(lambda: chart(view.builds, view.layers), repeat)
    turn, _ = _median(lambda: turn_view(store, tenant, builds[-1], builds[-2]), repeat)
    render, _ = _median(lambda: render_session(view, root="/ui", tenant=tenant), repeat)
    mid = len(builds) // 2
    fragment, _ = _median(
        lambda: render_turn(turn_view(store, tenant, builds[mid], builds[mid - 1])), repeat
    )
    report_s, report = _median(lambda: render_report(store, tenant, record), 1)
    verdict = "met" if total < TARGET_SECONDS else "MISSED"
    print(
        f"session page at {len(builds):,} turns: {total * 1e3:.0f} ms server time "
        f"(target < {TARGET_SECONDS * 1e3:.0f} ms: {verdict}); {len(html) / 1e6:.2f} MB of HTML"
    )
    print(
        f"  read the logged builds {read * 1e3:.0f} ms, chart layout {layout * 1e3:.0f} ms, "
        f"selected turn {turn * 1e3:.0f} ms, template {render * 1e3:.0f} ms"
    )
    print(f"turn fragment (the script's request): {fragment * 1e3:.0f} ms")
    wall = _served(s, repeat)
    if wall is not None:
        print(f"GET /ui/sessions/{{id}} from a running ctxwarden serve, client wall time on "
              f"loopback: {wall * 1e3:.0f} ms")  # fmt: skip
    print(f"session show --html, every turn in one file: {report_s:.1f} s, "
          f"{len(report) / 1e6:.1f} MB")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
