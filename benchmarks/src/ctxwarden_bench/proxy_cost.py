"""What a proxied call costs, counted so that two runs compare: instructions per call
under callgrind, or CPU per call, with the app in this process (R14).

Run: ``python -m ctxwarden_bench.proxy_cost [--api openai|anthropic|responses] [--stream]
[--sessions 2] [--calls 11] [--warm 4] [--cold MB] [--callgrind] [--against CHECKOUT]
[--db URL]``.

Why: on a shared two-core machine a fixed piece of work takes up to twice as long from
one minute to the next, more than most changes save, so :mod:`ctxwarden_bench.proxy`'s
figures cannot tell two versions apart; the instructions a call executes can. The app
(:func:`ctxwarden.service.create_app`, SQLite in a temporary file unless ``--db``, the
default policy)
serves in this process through httpx's ASGI transport, so the client's share (the same
in every run) is counted too, against the bench's instant upstream (its own process).
Each session stores the bench's 200-message conversation, makes ``--warm`` calls, then
``--calls`` measured ones, each echoing the reply and adding a question, as an agent does.

``--callgrind`` runs it under ``valgrind --tool=callgrind`` (``apt-get install
valgrind``), instrumented only while the measured calls run (switched by
``callgrind_control``), and reports instructions per call. ``--against CHECKOUT`` runs
the same with another checkout's ``src`` first on ``PYTHONPATH`` (``git worktree add``
of the commit to compare) and reports both and their ratio.

The store's log is copied into the database inside the commit that fills it (SQLite's
own way), not by the thread ``ctxwarden serve`` runs for it: that thread's work lands
in or out of the measured calls with the wall clock, which moved the count of one code
by 3% from one run to the next; in the commit it is counted the same every run, as in
a checkout from before the thread.

``--cold MB`` writes to every cache line of an MB-sized buffer before each measured call
(outside the time measured), as a client does between its calls when it spends tens of
milliseconds of its own (the ``openai`` SDK preparing a 330 KB body), or as 63 other
sessions' calls do at 64 clients: the call then finds none of its session's objects in
the CPU's caches. Its CPU per call against the same without ``--cold`` is what the
memory a call touches costs (``--cold 48`` flushes this machine's 32 MB L3); instructions
do not change with it, so it is a CPU figure only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "callgrind_command",
    "callgrind_control",
    "callgrind_counting",
    "callgrind_instructions",
    "checkout_src",
    "main",
    "measure",
]

_TOTALS = ("totals:", "summary:")
_ROUTES = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
}
_POLL = 0.2  # seconds between looks at the marker files (valgrind runs ~50x slower)


def _wait_for(path: Path, proc: subprocess.Popen[bytes] | None = None) -> None:
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the measured process ended early (exit {proc.returncode})")
        time.sleep(_POLL)


def _bodies(api: str, stream: bool, count: int) -> list[bytes]:
    from ctxwarden_bench.proxy import MODEL, anthropic_bodies, conversation, history_at

    base = conversation(200)
    if api == "anthropic":
        requests = anthropic_bodies(base, count)
    elif api == "responses":  # (a checkout from before the route has no such bodies)
        from ctxwarden_bench.proxy import responses_request

        requests = [responses_request(base, k) for k in range(count)]
    else:
        requests = [{"model": MODEL, "messages": history_at(base, k)} for k in range(count)]
    return [json.dumps({**r, "stream": stream}).encode() for r in requests]


async def _run(
    api: str,
    stream: bool,
    sessions: int,
    calls: int,
    warm: int,
    markers: Path | None,
    port: int,
    cold_mb: int = 0,
    db: str | None = None,
) -> tuple[int, float]:
    import httpx

    from ctxwarden.service import create_app
    from ctxwarden.service.config import ServiceConfig
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix
    from ctxwarden.store import open_store
    from ctxwarden.store.service_tables import add_tenant

    tmp = tempfile.TemporaryDirectory(prefix="ctxwarden-proxy-cost-")
    db, key = db or f"sqlite:///{Path(tmp.name) / 'cost.db'}", new_key()
    tenant = f"cost-{uuid.uuid4().hex[:12]}"  # its own, in a database that is kept
    with open_store(db) as store:
        add_tenant(store, tenant, key_hash=hash_key(key), key_prefix=shown_prefix(key))
    try:
        url = f"http://127.0.0.1:{port}"
        config: dict[str, Any] = {"db": db, "upstream": f"{url}/v1", "anthropic_upstream": url}
        if "background_checkpoint" in {f.name for f in dataclasses.fields(ServiceConfig)}:
            config["background_checkpoint"] = False  # see the module docstring
        app = create_app(ServiceConfig(**config))
        bodies = _bodies(api, stream, 1 + warm + calls)
        path = _ROUTES[api]
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://proxy") as client,
        ):

            async def call(session: int, step: int) -> None:
                ask = {**headers, "x-ctxwarden-session": f"cost-{session}"}
                response = await client.post(path, content=bodies[step], headers=ask)
                if response.status_code != 200:
                    raise SystemExit(f"the proxy answered {response.status_code}: {response.text}")

            for session in range(sessions):
                for step in range(1 + warm):
                    await call(session, step)
            if markers is not None:  # the parent switches callgrind's instrumentation on
                (markers / "ready").touch()
                _wait_for(markers / "go")
            flush = bytearray(cold_mb * 1024 * 1024)
            lines = bytes(len(flush[::64]))
            cpu = 0.0
            for session in range(sessions):
                for step in range(1 + warm, 1 + warm + calls):
                    flush[::64] = lines  # a byte in every cache line (none when not cold)
                    started = time.process_time()
                    await call(session, step)
                    cpu += time.process_time() - started
            if markers is not None:  # ... and off
                (markers / "done").touch()
                _wait_for(markers / "stop")
        return sessions * calls, cpu
    finally:
        tmp.cleanup()


def measure(
    api: str = "openai",
    stream: bool = False,
    sessions: int = 2,
    calls: int = 11,
    warm: int = 4,
    markers: Path | None = None,
    cold_mb: int = 0,
    db: str | None = None,
) -> tuple[int, float]:
    """The measured calls made and the CPU seconds they took (this process's, the
    in-process client's included); with ``markers``, handshakes with a parent through
    files there around the measured calls (``ready``/``go``, ``done``/``stop``); with
    ``cold_mb``, the CPU's caches flushed before each (see the module docstring); with
    ``db``, that store (its own tenant) instead of SQLite in a temporary file."""
    from ctxwarden_bench.local_servers import free_port, stop_process

    port = free_port()
    # not proxy_upstream.running: a checkout from before that helper may be the one run
    upstream = subprocess.Popen(
        [sys.executable, "-m", "ctxwarden_bench.proxy_upstream", str(port)],
        stdout=subprocess.PIPE,
    )
    try:
        assert upstream.stdout is not None
        upstream.stdout.readline()  # it says when it listens
        return asyncio.run(_run(api, stream, sessions, calls, warm, markers, port, cold_mb, db))
    finally:
        stop_process(upstream)
        if upstream.stdout is not None:
            upstream.stdout.close()


# the measured process runs this file, not the module: ``--against`` puts another
# checkout's ``ctxwarden`` first on the path, which may not have this bench
_CHILD = "import runpy, sys; del sys.argv[0]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _child(markers: str) -> list[str]:
    return [sys.executable, "-c", _CHILD, str(Path(__file__).resolve()), "--child", markers]


def _tune_gc() -> None:
    """The collector as ``ctxwarden serve`` runs it (a measured process is its own):
    with the default, a full collection falling inside or outside the measured calls
    moved ``/v1/messages`` by 10% from one window of calls to the next. A checkout from
    before the server tuned it keeps the default."""
    from ctxwarden import service

    tune = getattr(service, "_tune_gc", None)
    if tune is not None:
        tune()


def _child_args(args: argparse.Namespace) -> list[str]:
    out = ["--api", args.api, "--sessions", str(args.sessions), "--calls", str(args.calls)]
    out += ["--warm", str(args.warm), "--cold", str(args.cold)]
    out += ["--db", args.db] if args.db else []
    return out + (["--stream"] if args.stream else [])


def checkout_src(ap: argparse.ArgumentParser, checkout: Path) -> Path:
    """The ``src`` of the checkout ``--against`` names, or a usage error without one."""
    src = checkout.resolve() / "src"
    if not (src / "ctxwarden" / "__init__.py").is_file():
        ap.error(f"--against {checkout}: no src/ctxwarden there (give a checkout's root)")
    return src


def _environment(src: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(src), env.get("PYTHONPATH"))))
    return env


def _cpu_per_call(args: argparse.Namespace, src: Path | None) -> float:
    """CPU ms per call, measured in a new process (with ``src`` first on its path)."""
    done = subprocess.run(
        _child("-") + _child_args(args),
        env=_environment(src),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the measured process failed:\n{done.stderr[-2000:]}")
    calls, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return float(cpu) / int(calls) * 1000


def _instructions_per_call(args: argparse.Namespace, src: Path | None) -> float:
    """Instructions per measured call under callgrind (with ``src`` first on the path)."""
    with tempfile.TemporaryDirectory(prefix="ctxwarden-callgrind-") as tmp:
        markers, out = Path(tmp), Path(tmp) / "callgrind.out"
        proc = subprocess.Popen(
            [*callgrind_command(out), *_child(str(markers)), *_child_args(args)],
            env=_environment(src),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(markers / "ready", proc)
            with callgrind_counting(proc.pid):
                (markers / "go").touch()
                _wait_for(markers / "done", proc)
            (markers / "stop").touch()
            stdout, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        if proc.returncode != 0:
            raise SystemExit(f"the process under callgrind failed (exit {proc.returncode})")
        calls, _cpu = json.loads(stdout.decode().strip().splitlines()[-1])
        return callgrind_instructions(out) / int(calls)


def callgrind_command(out: Path) -> list[str]:
    """The command that runs a process under callgrind, writing to ``out``, counting
    nothing until switched on (:func:`callgrind_counting`)."""
    return ["valgrind", "-q", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}"]  # fmt: skip


@contextmanager
def callgrind_counting(pid: int) -> Iterator[None]:
    """Callgrind counts ``pid``'s instructions while the block runs, then dumps them (the
    counts are in the dump, not in the file at exit). Nothing is dumped when the block
    fails: its caller reads no count then, and the failure is not hidden by a control
    call on a process that may be gone."""
    callgrind_control("-i", "on", pid)
    yield
    callgrind_control("-i", "off", pid)
    callgrind_control("-d", pid)


def callgrind_control(*words: object) -> None:
    """``callgrind_control WORDS`` (``-i on PID``: count from now on; ``-d PID``: dump)."""
    subprocess.run(["callgrind_control", *map(str, words)], capture_output=True, check=True)


def callgrind_instructions(out: Path) -> int:
    """The instructions callgrind counted: its dump's and its file at exit's, added (each
    file's ``totals:`` line, or ``summary:`` where that is the one that counts)."""
    found = 0
    for part in sorted(out.parent.glob(out.name + "*")):
        lines = part.read_text().splitlines()
        found += max((int(x.split()[1]) for x in lines if x.startswith(_TOTALS)), default=0)
    if not found:
        raise SystemExit(f"callgrind counted nothing (files {out}*)")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxwarden_bench.proxy_cost", description=__doc__)
    ap.add_argument("--api", choices=tuple(_ROUTES), default="openai")
    ap.add_argument("--stream", action="store_true", help="streamed calls (default: JSON)")
    ap.add_argument("--sessions", type=int, default=2)
    ap.add_argument("--calls", type=int, default=11, help="measured calls per session")
    ap.add_argument("--warm", type=int, default=4, help="calls per session before them")
    ap.add_argument("--cold", type=int, default=0, metavar="MB",
                    help="flush the CPU's caches before each measured call (CPU only)")  # fmt: skip
    ap.add_argument("--callgrind", action="store_true", help="count instructions (valgrind)")
    ap.add_argument("--db", help="store URL (default: SQLite in a temporary file); the "
                    "calls' sessions go to a tenant of their own")  # fmt: skip
    ap.add_argument("--against", type=Path, help="another checkout to compare with")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a measured process: its marker dir
    args = ap.parse_args(argv)
    for name in ("sessions", "calls"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.warm < 0:
        ap.error("--warm must be at least 0")
    if args.cold < 0:
        ap.error("--cold must be at least 0 (MB)")
    if args.cold and args.callgrind:
        ap.error("--cold is a CPU figure: a flushed cache changes no instruction count")
    if args.db and args.child is None:  # said here, not as a measured process's traceback
        from ctxwarden.core.errors import CtxwardenError
        from ctxwarden.store import open_store

        try:
            open_store(args.db).close()
        except CtxwardenError as exc:
            ap.error(f"--db: {exc}")
    if args.child is not None:
        markers = None if args.child == "-" else Path(args.child)
        _tune_gc()
        print(json.dumps(measure(args.api, args.stream, args.sessions, args.calls, args.warm,
                                 markers, args.cold, args.db)))  # fmt: skip
        return 0
    against = checkout_src(ap, args.against) if args.against is not None else None
    if args.callgrind and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        ap.error("--callgrind needs valgrind (apt-get install valgrind)")
    figure = _instructions_per_call if args.callgrind else _cpu_per_call
    unit = "M instructions" if args.callgrind else " ms CPU"
    scale = 1e-6 if args.callgrind else 1.0
    route = _ROUTES[args.api]
    cold = f", caches flushed ({args.cold} MB) before each" if args.cold else ""
    print(f"{route}, {'streams' if args.stream else 'JSON'}: {args.sessions} sessions x "
          f"{args.calls} calls after {args.warm} warm ones each{cold}", flush=True)  # fmt: skip
    ours = figure(args, None) * scale
    print(f"this checkout: {ours:.2f}{unit} per call", flush=True)
    if against is not None:
        theirs = figure(args, against) * scale
        print(f"{args.against}: {theirs:.2f}{unit} per call")
        print(f"ratio (this / that): {ours / theirs:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
