"""Benchmark: re-counting a long history after one append costs the new message (R2).

An agent counts its whole history before every call. Without a per-message cache that
is O(history) per turn and O(turns²) per session; with :class:`TokenCounter`'s cache
(keyed by message fingerprint and encoding) a turn costs the new messages plus a dict
lookup per old one. This script shows it on a 10,000-message history:

1. count the history from scratch with a fresh counter (every message tokenised);
2. append one message and count again with the same counter (median of ``--repeats``
   appends); the target is < 1 % of step 1;
3. check that the cached re-count equals a fresh counter's count of the same history.

The history is the tau-bench airline trajectories from ``../shared/data`` (the 120 runs
cycled, each cycle tagged so no message repeats and the scratch count gets no free cache
hits), or a synthetic agent loop of the same shape when the file is absent::

    python -m ctxwarden_bench.count_cache [--messages 10000] [--model gpt-4o] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import messages_from_openai
from ctxwarden_bench.data_files import find_data

__all__ = ["CountCacheResult", "build_history", "find_tau_bench", "main", "run"]

TARGET = 0.01
_TAU_BENCH = Path("tau-bench") / "airline-gpt-4o-dev.json"


@dataclass(frozen=True)
class CountCacheResult:
    model: str
    messages: int
    source: str
    scratch_ms: float
    scratch_tokens: int
    recount_ms: float
    recount_tokens: int
    fresh_recount_tokens: int
    repeats: int

    @property
    def ratio(self) -> float:
        return self.recount_ms / self.scratch_ms if self.scratch_ms else 0.0

    @property
    def consistent(self) -> bool:
        """The cached re-count equals counting the same history from scratch."""
        return self.recount_tokens == self.fresh_recount_tokens

    @property
    def passed(self) -> bool:
        return self.consistent and self.ratio < TARGET

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ratio=round(self.ratio, 6), consistent=self.consistent, passed=self.passed)
        out.update(target=TARGET)
        return out


def find_tau_bench(data: str | Path | None = None) -> Path | None:
    """The tau-bench file under ``data``, ``$CTXWARDEN_DATA``, ``../shared/data`` or ``./data``."""
    return find_data(_TAU_BENCH, data)


def _tau_history(path: Path, n: int) -> list[Message]:
    runs = json.loads(path.read_text("utf-8"))
    history = messages_from_openai(runs[0]["traj"][:1], id_prefix="sys")
    cycle = 0
    while len(history) < n:
        for r, run in enumerate(runs):
            raw = [_tag(m, cycle) for m in run["traj"][1:]] if cycle else run["traj"][1:]
            history += messages_from_openai(raw, id_prefix=f"c{cycle}r{r}m")
            if len(history) >= n:
                break
        cycle += 1
    return history[:n]


def _tag(message: dict[str, Any], cycle: int) -> dict[str, Any]:
    """A copy that differs from earlier cycles (content and call ids), same shape and size."""
    out = dict(message)
    if isinstance(out.get("content"), str):
        out["content"] = f"{out['content']} ({cycle})"
    if out.get("tool_call_id"):
        out["tool_call_id"] = f"{out['tool_call_id']}_{cycle}"
    if out.get("tool_calls"):
        out["tool_calls"] = [{**c, "id": f"{c['id']}_{cycle}"} for c in out["tool_calls"]]
    return out


_WORDS = [
    "flight",
    "reservation",
    "booking",
    "passenger",
    "baggage",
    "refund",
    "cabin",
    "economy",
    "business",
    "change",
    "date",
    "the",
    "a",
    "to",
    "of",
    "and",
    "for",
    "please",
    "confirm",
    "your",
    "my",
    "is",
    "was",
    "will",
    "can",
    "we",
    "I",
    "you",
    "need",
    "would",
    "like",
    "cancel",
    "upgrade",
    "seat",
    "payment",
    "certificate",
    "policy",
    "delayed",
    "airport",
    "membership",
    "gold",
    "silver",
]


def _synthetic_history(n: int, seed: int = 7) -> list[Message]:
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))) + "."

    history = [Message.system(text(300, 400), id="sys0")]
    turn = 0
    while len(history) < n:
        history.append(Message.user(text(10, 50), id=f"u{turn}"))
        if turn % 2 == 0:
            call = ToolCall(
                f"call_{turn}", "get_reservation_details", json.dumps({"id": f"R{turn:05d}"})
            )
            history.append(Message.assistant(None, (call,), id=f"a{turn}c"))
            record = {"reservation_id": f"R{turn:05d}", "notes": text(80, 250)}
            history.append(
                Message.tool(json.dumps(record), call.id, "get_reservation_details", id=f"t{turn}")
            )
        history.append(Message.assistant(text(30, 120), id=f"a{turn}"))
        turn += 1
    return history[:n]


def build_history(n: int, data: str | Path | None = None) -> tuple[list[Message], str]:
    """``n`` messages and a description of where they came from."""
    path = find_tau_bench(data)
    if path is not None:
        return _tau_history(path, n), f"tau-bench airline trajectories ({path})"
    return _synthetic_history(n), "synthetic agent loop (tau-bench file not found)"


def _timed(counter: TokenCounter, messages: Sequence[Message]) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = counter.count_messages(messages).tokens
    return (time.perf_counter() - start) * 1000, tokens


def run(
    n: int = 10_000, model: str = "gpt-4o", data: str | Path | None = None, repeats: int = 5
) -> CountCacheResult:
    """Build the history, time a scratch count and ``repeats`` append-and-recount steps."""
    history, source = build_history(n, data)
    counter = TokenCounter(model)  # a fresh counter: nothing cached
    scratch_ms, scratch_tokens = _timed(counter, history)
    recounts: list[float] = []
    tokens = scratch_tokens
    for i in range(max(repeats, 1)):
        history.append(
            Message.user(f"One more question, number {i}: can I add a bag?", id=f"new{i}")
        )
        elapsed, tokens = _timed(counter, history)
        recounts.append(elapsed)
    fresh = TokenCounter(model).count_messages(history).tokens
    return CountCacheResult(
        model=model,
        messages=n,
        source=source,
        scratch_ms=round(scratch_ms, 3),
        scratch_tokens=scratch_tokens,
        recount_ms=round(statistics.median(recounts), 3),
        recount_tokens=tokens,
        fresh_recount_tokens=fresh,
        repeats=len(recounts),
    )


def format_result(r: CountCacheResult) -> str:
    verdict = "OK" if r.passed else "MISSED"
    scratch = f"{r.scratch_ms:9.2f} ms ({r.scratch_tokens:,} tokens)"
    recount = f"{r.recount_ms:9.2f} ms ({r.recount_tokens:,} tokens, median of {r.repeats})"
    return "\n".join(
        [
            f"count-cache benchmark · {r.model} · {r.messages:,} messages",
            f"  history: {r.source}",
            f"  from scratch, fresh counter:    {scratch}",
            f"  after one append, same counter: {recount}",
            f"  re-count / scratch: {r.ratio:.2%}  (target < {TARGET:.0%})  {verdict}",
            f"  cached re-count equals a fresh count: {'yes' if r.consistent else 'NO'}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctxwarden_bench.count_cache")
    parser.add_argument("--messages", type=int, default=10_000, help="history length")
    parser.add_argument("--model", default="gpt-4o")
    parser.add_argument("--data", help="folder holding tau-bench/airline-gpt-4o-dev.json")
    parser.add_argument("--repeats", type=int, default=5, help="appends to time (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    result = run(args.messages, args.model, args.data, args.repeats)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_result(result))
    return 0 if result.consistent else 1


if __name__ == "__main__":
    raise SystemExit(main())
