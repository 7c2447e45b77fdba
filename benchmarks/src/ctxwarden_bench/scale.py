"""Past one machine: two replicas and a worker, with summaries due versus off (R16).

Run: ``python -m ctxwarden_bench.scale [--db postgresql://...] [--broker redis://...]
[--sessions 4] [--turns 80] [--summary-delay 2]``.

Started as processes: a local upstream (:mod:`ctxwarden_bench.scale_upstream`, in this
process: a tool-using agent that answers at once, and a summariser whose summary answers
take ``--summary-delay`` seconds), two ``ctxwarden serve --broker`` replicas and one
``ctxwarden worker`` (summaries as Celery jobs: **due**), and two plain ``ctxwarden
serve`` replicas (**off**: no summariser at all), all on one fresh PostgreSQL schema
(dropped after) and one Redis queue of their own. Each of ``--sessions`` agents runs
``--turns`` turns on each topology side by side, in its own thread, alternating the two
replicas turn by turn; the summary trigger (``max_messages = 40, keep_recent = 12``)
makes summaries due every few turns.

Reported, per topology: request latency p50 / p95 (client-side, whole request), the
p95 ratio due / off (the target: within 1.5x), sessions x turns served, errors,
summaries landed (session versions) and summary job attempts by outcome; and for every
session, messages lost or duplicated (the stored history against what the client sent
and received). The machine has two shared cores: compare the ratio, and read the
absolute figures as this run's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxwarden_bench.local_servers import free_port, stop_process
from ctxwarden_bench.scale_upstream import ScaleUpstream, first_turn, next_turn, what_it_says

__all__ = ["main"]

BUDGET = 2500
POLICY = "[summary]\nmax_messages = 40\nkeep_recent = 12\n"


@dataclass
class Agent:
    """One agent session on one topology: what it sent and got, and how long each took."""

    urls: list[str]
    key: str
    session: str = field(default_factory=lambda: f"scale-{uuid.uuid4().hex[:10]}")
    history: list[dict[str, Any]] = field(default_factory=first_turn)
    sent: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    errors: int = 0

    def turn(self, http: Any, n: int) -> None:
        body = json.dumps({"model": "gpt-4o", "messages": self.history})
        headers = {
            "content-type": "application/json",
            "authorization": f"Bearer {self.key}",
            "x-ctxwarden-session": self.session,
            "x-ctxwarden-max-input-tokens": str(BUDGET),
        }
        url = self.urls[n % len(self.urls)] + "/v1/chat/completions"
        started = time.perf_counter()
        got = http.post(url, content=body, headers=headers)
        self.latencies.append(time.perf_counter() - started)
        if got.status_code != 200:
            self.errors += 1
            return
        msg = got.json()["choices"][0]["message"]
        reply = {k: msg[k] for k in ("role", "content", "tool_calls") if k in msg}
        self.sent, self.reply = self.history, reply
        self.history = next_turn(self.history, reply)


def _cli() -> str:
    return str(Path(sys.executable).with_name("ctxwarden"))


def _serve(
    db: str, upstream: str, policy: Path, env: dict[str, str], *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [_cli(), "serve", "--db", db, "--port", str(port), "--upstream", upstream,
         "--policy", str(policy), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ctxwarden serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("ctxwarden serve did not become ready")


def _worker(db: str, broker: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    proc = subprocess.Popen(
        [_cli(), "worker", "--db", db, "--broker", broker, "--summarizer",
         "openai:gpt-4o-mini", "--concurrency", "4"],
        stdout=out, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while b" ready." not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"ctxwarden worker did not start: {log.read_text()[-1500:]}")
        time.sleep(0.1)
    return proc


def _check(store: Any, tenant: str, agent: Agent) -> tuple[int, int, int]:
    """(lost, duplicated, summary version) of one agent's stored session."""
    from ctxwarden import Session

    session = Session(store, agent.session, tenant=tenant)
    stored = [what_it_says(m) for m in session.export()]
    expected = [what_it_says(m) for m in [*agent.sent, agent.reply]] if agent.sent else []
    lost = sum(1 for m in expected if m not in stored)
    dup = len(stored) - len(set(stored))
    return lost, dup, session.record.version


def _quantiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (0.0, 0.0)
    q = statistics.quantiles(values, n=20)
    return statistics.median(values), q[18]


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(dsn: str, broker: str, sessions: int, turns: int, summary_delay: float) -> dict[str, Any]:
    """Start the topology, run the agents, check the store; the figures as a dict."""
    import httpx2

    from ctxwarden.service.keys import hash_key, new_key, shown_prefix
    from ctxwarden.store import open_store
    from ctxwarden.store.job_log import job_attempts
    from ctxwarden.store.service_tables import add_tenant

    schema = f"ctxw_scale_{uuid.uuid4().hex[:10]}"
    db = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    queue = f"ctxwarden-scale-{uuid.uuid4().hex[:8]}"
    upstream = ScaleUpstream(summary_delay=summary_delay).start()
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="ctxw-scale-"))
    policy = tmp / "policy.toml"
    policy.write_text(POLICY)
    env = {**os.environ, "CTXWARDEN_JOB_QUEUE": queue, "OPENAI_BASE_URL": upstream.url,
           "OPENAI_API_KEY": "sk-local", "CTXWARDEN_UPSTREAM_API_KEY": "sk-local"}  # fmt: skip
    key = new_key()
    try:
        with open_store(db) as store:
            add_tenant(store, "bench", key_hash=hash_key(key), key_prefix=shown_prefix(key))
        procs.append(_worker(db, broker, env, tmp / "worker.log"))
        due_urls, off_urls = [], []
        for _ in range(2):
            proc, url = _serve(db, upstream.url, policy, env, "--broker", broker)
            procs.append(proc)
            due_urls.append(url)
        for _ in range(2):
            proc, url = _serve(db, upstream.url, policy, env)
            procs.append(proc)
            off_urls.append(url)
        pairs = [(Agent(due_urls, key), Agent(off_urls, key)) for _ in range(sessions)]

        def drive(due: Agent, off: Agent) -> None:
            with httpx2.Client(timeout=60) as http:
                for n in range(turns):  # side by side: one turn on each topology
                    due.turn(http, n)
                    off.turn(http, n)

        started = time.perf_counter()
        threads = [threading.Thread(target=drive, args=pair) for pair in pairs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        deadline = time.monotonic() + 30 + summary_delay * 4  # let the last jobs end
        with open_store(db) as store:
            while time.monotonic() < deadline:
                attempts = [a for d, _ in pairs for a in job_attempts(store, "bench", d.session)]
                if all(a.outcome for a in attempts):
                    break
                time.sleep(0.25)
            checks = {
                name: [_check(store, "bench", agent[i]) for agent in pairs]
                for i, name in enumerate(("due", "off"))
            }
            attempts = [a for d, _ in pairs for a in job_attempts(store, "bench", d.session)]
    finally:
        for proc in procs:
            stop_process(proc, timeout=20)
        upstream.stop()
        try:
            _drop_schema(dsn, schema)
        except Exception as exc:  # the figures matter more than the clean-up
            print(f"warning: schema {schema} not dropped: {exc}", file=sys.stderr)
    out: dict[str, Any] = {"sessions": sessions, "turns": turns, "wall_s": round(wall, 1),
                           "summary_delay_s": summary_delay}  # fmt: skip
    for i, name in enumerate(("due", "off")):
        lat = [x for pair in pairs for x in pair[i].latencies]
        p50, p95 = _quantiles(lat)
        rows = checks[name]
        out[name] = {
            "requests": len(lat),
            "errors": sum(pair[i].errors for pair in pairs),
            "p50_ms": round(p50 * 1000, 1),
            "p95_ms": round(p95 * 1000, 1),
            "lost": sum(r[0] for r in rows),
            "duplicated": sum(r[1] for r in rows),
            "summaries_landed": sum(r[2] for r in rows),
        }
    out["p95_ratio_due_over_off"] = round(out["due"]["p95_ms"] / max(out["off"]["p95_ms"], 1e-9), 2)
    out["job_attempts"] = dict(Counter(a.outcome or "died" for a in attempts))
    out["upstream_requests"] = dict(upstream.counts)
    return out


def _report(r: dict[str, Any]) -> None:
    print(f"ctxwarden bench scale: 2 replicas + 1 worker (due) vs 2 replicas (off), "
          f"{r['sessions']} sessions x {r['turns']} turns each side, summary answers take "
          f"{r['summary_delay_s']:g} s; wall {r['wall_s']} s")  # fmt: skip
    print(f"{'topology':<10}{'requests':>9}{'errors':>7}{'p50 ms':>9}{'p95 ms':>9}"
          f"{'lost':>6}{'dup':>5}{'summaries':>11}")  # fmt: skip
    for name in ("due", "off"):
        t = r[name]
        print(f"{name:<10}{t['requests']:>9}{t['errors']:>7}{t['p50_ms']:>9}{t['p95_ms']:>9}"
              f"{t['lost']:>6}{t['duplicated']:>5}{t['summaries_landed']:>11}")  # fmt: skip
    verdict = "met" if r["p95_ratio_due_over_off"] <= 1.5 else "MISSED"
    print(f"p95 due / off = {r['p95_ratio_due_over_off']} (target <= 1.5: {verdict})")
    print(f"summary job attempts: {r['job_attempts']}; upstream requests: {r['upstream_requests']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ctxwarden_bench.scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--db", default=os.environ.get("CTXWARDEN_TEST_POSTGRES"),
                        help="PostgreSQL DSN (a fresh schema is made and dropped); "
                        "default $CTXWARDEN_TEST_POSTGRES")  # fmt: skip
    parser.add_argument(
        "--broker", default=os.environ.get("CTXWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=80)
    parser.add_argument("--summary-delay", type=float, default=2.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if not args.db or not args.db.startswith(("postgresql://", "postgres://")):
        parser.error("give --db postgresql://... (or set CTXWARDEN_TEST_POSTGRES)")
    if args.sessions < 1 or args.turns < 2:
        parser.error("--sessions must be >= 1 and --turns >= 2")
    result = run(args.db, args.broker, args.sessions, args.turns, args.summary_delay)
    if args.json:
        print(json.dumps(result))
    else:
        _report(result)
    bad = result["due"]["lost"] + result["off"]["lost"] + result["due"]["duplicated"]
    return 1 if bad or result["due"]["errors"] or result["off"]["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
