"""Build latency from the session store at 100, 10,000 and 100,000 messages (R13).

Run: ``python -m ctxwarden_bench.store_latency [--postgres DSN] [--sizes 100,10000,100000]``.
PostgreSQL runs when a DSN is given (or ``CTXWARDEN_TEST_POSTGRES`` is set); its tables
go to a fresh schema that is dropped afterwards. SQLite uses a temporary file.

What is timed is the agent loop: append the new user message, then
:meth:`Session.build` (store reads — session row, pinned messages, the tail that can fit,
the messages that left the slice since the entity ledger's checkpoint — plus the
engine), the median over ``--builds`` turns after the first. The claim checked: the
100,000-message build is within 2x of the 100-message one, because the build reads a
slice bounded by the budget and by how far the window moved, never the history.

The first build of a session filled behind its back (as here, or imported, or stored
before the ledger was) is reported apart as ``cold``: it seeds the entity ledger of what
lies before the slice from the last ``LEDGER_BACKFILL`` (1,000) messages before it
instead of reading the whole history, and stores that checkpoint for every later
build. The second claim checked: the cold build of the largest session is within 2x of
the cold build of the smallest one longer than that look-back (10,000 messages by
default), so it does not grow with the history either.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.session.session import Session, count_key
from ctxwarden.store import SessionStore, open_store
from ctxwarden.store.ledger_checkpoint import LEDGER_BACKFILL

__all__ = ["Row", "main", "measure"]

SIZES = (100, 10_000, 100_000)
BUDGET = 1_000
MODEL = "gpt-4o"


@dataclass(frozen=True)
class Row:
    backend: str
    messages: int
    fill_seconds: float
    cold_ms: float
    build_ms: float
    build_p90_ms: float
    read_ms: float


def _turn(i: int, tag: str = "") -> Message:
    """About 60 tokens, so even the 100-message session (~6,000 tokens) overflows the
    budget: every size builds from a slice of the same length, and any difference left
    is what the history's length costs. ``tag`` makes each session's texts its own, so
    no session's cold build finds its messages' entities cached by an earlier one."""
    if i % 2 == 0:
        return Message.user(
            f"Turn {i}{tag}: please check order ORD-{i:06d} for customer c{i % 97}. It was placed "
            "last week, paid by card, and the tracking page still shows it as pending, "
            "which is odd because the confirmation promised dispatch within two days."
        )
    return Message.assistant(
        f"Order{tag} ORD-{i - 1:06d} ships on day {i % 28 + 1}; total {i % 500} EUR. The warehouse "
        "confirmed the parcel is packed and the carrier collects it tomorrow morning; the "
        "tracking page updates after the first scan at the depot."
    )


def _fill(store: SessionStore, session_id: str, n: int, counter: TokenCounter) -> None:
    store.create_session("bench", session_id)
    tag = f" ({session_id.rsplit('-', 1)[-1]})"
    key = count_key(counter)
    system = Message.system("You are the order desk of a shop. Be brief and exact.")
    batch: list[Message] = [system]
    for i in range(n - 1):
        batch.append(_turn(i, tag))
        if len(batch) == 1000:
            store.append(
                "bench", session_id, batch, [{key: counter.count_message(m)} for m in batch]
            )
            batch = []
    if batch:
        store.append("bench", session_id, batch, [{key: counter.count_message(m)} for m in batch])


def _median_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1000


def measure(url: str, backend: str, sizes: Sequence[int], builds: int) -> list[Row]:
    """Fill one session per size in the store at ``url`` and time the agent-loop build."""
    counter = TokenCounter.for_model(MODEL)
    rows: list[Row] = []
    store = open_store(url)
    try:
        for n in [sizes[0], *sizes]:  # the first pass warms imports and caches; not reported
            sid = f"bench-{n}-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            _fill(store, sid, n, counter)
            fill = time.perf_counter() - started
            with Session(store, sid, tenant="bench", model=MODEL) as session:
                build_times: list[float] = []
                read_times: list[float] = []
                for turn in range(builds + 1):
                    session.append([Message.user(f"Follow-up {turn}: where is ORD-{turn:06d}?")])
                    build_times.append(_timed(lambda: session.build(max_input_tokens=BUDGET)))
                    read_times.append(_timed(lambda: session.context_messages(BUDGET)))
            cold = build_times[0] * 1000
            build_times, read_times = build_times[1:], read_times[1:]  # drop the cold build
            p90 = sorted(build_times)[int(0.9 * (len(build_times) - 1))] * 1000
            rows.append(
                Row(
                    backend,
                    n,
                    fill,
                    cold,
                    _median_ms(build_times),
                    p90,
                    _median_ms(read_times),
                )
            )
        rows = rows[1:]
    finally:
        store.close()
    return rows


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _print(rows: Sequence[Row]) -> bool:
    print(
        f"Session.build latency, budget {BUDGET} tokens, model {MODEL} (median of the agent loop)"
    )
    print(
        f"{'backend':<10}{'messages':>10}{'fill s':>9}{'cold ms':>10}{'build ms':>10}"
        f"{'p90 ms':>9}{'read ms':>9}{'vs 100':>8}"
    )
    ok = True
    for backend in dict.fromkeys(r.backend for r in rows):
        mine = [r for r in rows if r.backend == backend]
        base = mine[0].build_ms
        for r in mine:
            ratio = r.build_ms / base if base else float("nan")
            print(
                f"{r.backend:<10}{r.messages:>10,}{r.fill_seconds:>9.1f}{r.cold_ms:>10.1f}"
                f"{r.build_ms:>10.2f}"
                f"{r.build_p90_ms:>9.2f}{r.read_ms:>9.2f}{ratio:>7.2f}x"
            )
        ratio = mine[-1].build_ms / base if base else float("nan")
        verdict = "OK" if ratio <= 2.0 else "FAIL"
        ok = ok and ratio <= 2.0
        print(
            f"{backend}: {mine[-1].messages:,} vs {mine[0].messages:,} messages = "
            f"{ratio:.2f}x (target <= 2x): {verdict}"
        )
        ok = _print_cold(backend, mine) and ok
    return ok


def _print_cold(backend: str, rows: Sequence[Row]) -> bool:
    """The cold-build claim over the sizes longer than the ledger's look-back."""
    long = [r for r in rows if r.messages > LEDGER_BACKFILL + 1]
    if len(long) < 2:
        return True  # nothing to compare: every cold build read its whole history
    ratio = long[-1].cold_ms / long[0].cold_ms
    verdict = "OK" if ratio <= 2.0 else "FAIL"
    print(
        f"{backend}: cold build {long[-1].messages:,} vs {long[0].messages:,} messages = "
        f"{ratio:.2f}x (ledger seeded from the last {LEDGER_BACKFILL:,}; target <= 2x): "
        f"{verdict}"
    )
    return ratio <= 2.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctxwarden_bench.store_latency")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("CTXWARDEN_TEST_POSTGRES"),
        help="PostgreSQL DSN (default: $CTXWARDEN_TEST_POSTGRES; none: skip)",
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--builds", type=int, default=50, help="agent-loop turns per size")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += measure(f"sqlite:///{Path(tmp) / 'bench.db'}", "sqlite", sizes, args.builds)
    if args.postgres:
        schema = f"ctxw_bench_{uuid.uuid4().hex[:8]}"
        sep = "&" if "?" in args.postgres else "?"
        try:
            rows += measure(f"{args.postgres}{sep}schema={schema}", "postgres", sizes, args.builds)
        finally:
            _drop_schema(args.postgres, schema)
    else:
        print("postgres: skipped (no --postgres DSN and CTXWARDEN_TEST_POSTGRES unset)")
    return 0 if _print(rows) else 1


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    sys.exit(main())
