"""A session with one fact-like line per user turn: do the layers still fit?

    python -m ctxwarden_bench.fact_flood [--messages 100000] [--budget 4000] [--cycles 3]

Stores ``--messages`` messages ("Update N: the shipment code is SHP-…") in a fresh SQLite
session, then runs ``--cycles`` rounds of ``summarize_sync("offline")`` and ``build``,
printing the time of each, the input tokens, the tokens per layer and the warnings. Each
user turn adds a fact, so the record grows by a thousand facts a cycle; the facts layer must
stay within ``summary.max_facts_share`` and the build within the budget.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ctxwarden.session.session import Session

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--budget", type=int, default=4_000)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args(argv)
    msgs = [{"role": "system", "content": "You are an assistant."}]
    for i in range(args.messages // 2):
        msgs.append(
            {"role": "user", "content": f"Update {i}: the shipment code is SHP-{1000 + i}."}
        )
        msgs.append({"role": "assistant", "content": f"Noted update {i}."})
    ok = True
    with tempfile.TemporaryDirectory() as d, Session(f"sqlite:///{Path(d) / 'f.db'}", "f") as s:
        start = time.perf_counter()
        s.append(msgs)
        print(f"appended {len(s):,} messages in {time.perf_counter() - start:.1f} s")
        for cycle in range(1, args.cycles + 1):
            start = time.perf_counter()
            written = s.summarize_sync("offline", max_input_tokens=args.budget)
            took = time.perf_counter() - start
            folded = written.folded if written else 0
            print(
                f"cycle {cycle}: summarised {folded:,} messages in {took:.1f} s, "
                f"{len(s.facts):,} facts"
            )
            start = time.perf_counter()
            built = s.build(max_input_tokens=args.budget)
            took = (time.perf_counter() - start) * 1000
            ok = ok and built.input_tokens <= args.budget
            layers = {k: v for k, v in built.audit.layers.items() if v}
            print(f"  build {took:.0f} ms, {built.input_tokens:,} tokens, layers {layers}")
            for warning in built.audit.warnings:
                print(f"  warning: {warning}")
    print("every build within budget" if ok else "OVER BUDGET")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
