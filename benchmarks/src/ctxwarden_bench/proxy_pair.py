"""Two ``ctxwarden serve`` processes of two checkouts side by side, one client calling
each in turn: CPU per call of each server and their ratio (R14).

Run: ``python -m ctxwarden_bench.proxy_pair --against CHECKOUT [--stream]
[--sessions 4] [--steps 120]``.

Why: this machine's speed swings by up to ~2.8x from one minute to the next, so two
runs of :mod:`ctxwarden_bench.proxy` minutes apart cannot tell two versions apart, and
:mod:`ctxwarden_bench.proxy_cost` counts the app in-process, without the server's own
work (HTTP, the event loop, SQLite's checkpoint thread). Here both servers run at once,
each as ``ctxwarden serve`` does (its own SQLite file, one worker), against one instant
upstream (:mod:`ctxwarden_bench.proxy_upstream`), and every step of every session calls
one then the other (the order alternating), so both see the same minutes. Each session
stores the bench's 200-message conversation first (not measured), then ``--steps`` - 1
calls, each echoing the reply and adding a question, as an agent does; pre-built bodies
over one kept-alive connection per server (``http.client``: the client costs nothing to
either side). Reported per server: CPU per call (its process, all threads, from
``/proc``: :mod:`~ctxwarden_bench.process_cpu`), of it in the kernel, and the median
call as the client saw it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path

import ctxwarden
from ctxwarden_bench.local_servers import stop_process
from ctxwarden_bench.process_cpu import read_cpu, seconds_between
from ctxwarden_bench.proxy_cost import _environment, checkout_src
from ctxwarden_bench.proxy_upstream import running as running_upstream

__all__ = ["main"]

_SRC = Path(ctxwarden.__file__).resolve().parents[1]  # the src of the ctxwarden imported


class _Server:
    """One ``ctxwarden serve`` of the checkout whose ``src`` is ``src``."""

    def __init__(self, src: Path, upstream: int, key_hash: str, prefix: str, tmp: Path) -> None:
        from ctxwarden.store import open_store
        from ctxwarden.store.service_tables import add_tenant
        from ctxwarden_bench.local_servers import start_serve

        db = f"sqlite:///{tmp / 'pair.db'}"
        with open_store(db) as store:
            add_tenant(store, "bench", key_hash=key_hash, key_prefix=prefix)
        self.proc, base = start_serve(
            ["--db", db, "--upstream", f"http://127.0.0.1:{upstream}/v1"],
            env=_environment(src),  # (its src first on the path)
            quiet=True,
        )
        self.conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
        self.cpu = self.sys = 0.0
        self.latencies: list[float] = []

    def call(self, body: bytes, headers: dict[str, str], measured: bool) -> None:
        before, started = read_cpu(self.proc.pid), time.perf_counter()
        self.conn.request("POST", "/v1/chat/completions", body, headers)
        response = self.conn.getresponse()
        text = response.read()
        ended, after = time.perf_counter(), read_cpu(self.proc.pid)
        if response.status != 200:
            raise SystemExit(f"the proxy answered {response.status}: {text[:300]!r}")
        if measured:
            self.cpu += seconds_between(before, after)
            self.sys += after.kernel - before.kernel
            self.latencies.append(ended - started)

    def stop(self) -> None:
        self.conn.close()
        stop_process(self.proc, timeout=30)


def measure(
    against: Path, stream: bool = False, sessions: int = 4, steps: int = 120
) -> list[tuple[float, float, float, int]]:
    """For this checkout and ``against`` (a ``src`` directory): CPU ms per call, of it
    in the kernel, the median call's ms, and the calls measured."""
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix
    from ctxwarden_bench.local_servers import free_port
    from ctxwarden_bench.proxy import MODEL, conversation, history_at

    base = conversation(200)
    bodies = [
        json.dumps({"model": MODEL, "messages": history_at(base, k), "stream": stream}).encode()
        for k in range(steps)
    ]
    key, port = new_key(), free_port()
    servers: list[_Server] = []
    with (
        tempfile.TemporaryDirectory(prefix="ctxwarden-proxy-pair-") as tmp,
        running_upstream(port),
    ):
        try:
            for i, src in enumerate((_SRC, against)):
                (Path(tmp) / str(i)).mkdir()
                args = (port, hash_key(key), shown_prefix(key), Path(tmp) / str(i))
                servers.append(_Server(src, *args))
            ask = {"authorization": f"Bearer {key}", "content-type": "application/json"}
            for step in range(steps):
                for s in range(sessions):
                    headers = {**ask, "x-ctxwarden-session": f"pair-{s}"}
                    order = servers if (step + s) % 2 else servers[::-1]
                    for server in order:
                        server.call(bodies[step], headers, measured=step > 0)
        finally:
            for server in servers:
                server.stop()
    calls = sessions * (steps - 1)
    return [
        (s.cpu / calls * 1000, s.sys / calls * 1000, statistics.median(s.latencies) * 1000, calls)
        for s in servers
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxwarden_bench.proxy_pair", description=__doc__)
    ap.add_argument("--against", type=Path, required=True, help="the checkout to compare with")
    ap.add_argument("--stream", action="store_true", help="streamed calls (default: JSON)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument(
        "--steps", type=int, default=120, help="calls per session, the first unmeasured"
    )
    args = ap.parse_args(argv)
    if args.sessions < 1:
        ap.error("--sessions must be at least 1")
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first stores the conversation)")
    against = checkout_src(ap, args.against)
    mode = "streams" if args.stream else "JSON"
    print(f"/v1/chat/completions, {mode}: {args.sessions} sessions x {args.steps - 1} calls "
          "on each server, in turn", flush=True)  # fmt: skip
    ours, theirs = measure(against, args.stream, args.sessions, args.steps)
    for name, (cpu, kernel, p50, _) in (("this checkout", ours), (str(args.against), theirs)):
        print(f"{name}: {cpu:.2f} ms CPU per call ({kernel:.2f} in the kernel), p50 {p50:.2f} ms")
    ratio = f"{ours[0] / theirs[0]:.3f}" if theirs[0] > 0 else "n/a (no CPU measured)"
    print(f"ratio of CPU (this / that): {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
