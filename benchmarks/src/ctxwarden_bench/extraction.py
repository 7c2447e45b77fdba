"""Entity extraction on hostile input: ``python -m ctxwarden_bench.extraction``.

A tool result can be anything: a 5 MB log, a minified bundle, JSON nested thousands
deep, a column of numbers. :func:`~ctxwarden.memory.entities.extract_entities` runs on
every message that leaves the window, so its cost must be bounded whatever the shape
(issue 11, item 4): linear in the text, at most
:data:`~ctxwarden.memory.entities.MAX_SCAN_CHARS` characters read per text, JSON walked
iteratively. This script times one extraction per shape (each message new, so no cache
helps) and prints the slowest; the target is well under a second at 5 MB.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.memory.entities import extract_entities

__all__ = ["SHAPES", "main", "time_shapes"]


def _deep_json(n: int) -> str:
    depth = min(n // 12, 10_000)
    return '{"a":' * depth + '"ABC123"' + "}" * depth


SHAPES: dict[str, Callable[[int], Message]] = {
    "numbers '100 '": lambda n: Message.user("100 " * (n // 4)),
    "dotted 'a.'": lambda n: Message.user("a." * (n // 2)),
    "hyphens 'a-'": lambda n: Message.user("a-" * (n // 2)),
    "thousands '1,000,'": lambda n: Message.user("1,000," * (n // 6)),
    "title words": lambda n: Message.user("Hello World foo " * (n // 16)),
    "capitals": lambda n: Message.user("ABC " * (n // 4)),
    "slashes": lambda n: Message.user("/a1" * (n // 3)),
    "one long word": lambda n: Message.user("x" * n),
    "blanks then a name": lambda n: Message.user(" " * n + "Mia Li"),
    "identifiers": lambda n: Message.user("fooBar_baz.qux " * (n // 15)),
    "e-mail-ish": lambda n: Message.user("a@b." * (n // 4)),
    "written dates": lambda n: Message.user("May 20th, 2024 " * (n // 15)),
    "agent log": lambda n: Message.tool(
        "user mia_li_3668 paid $1,234.56 on 2024-05-20 for HAT123 at /var/log/x.log;\n" * (n // 78),
        "c1",
    ),
    "JSON records": lambda n: Message.tool(
        json.dumps([{"id": f"X{i}A", "n": i, "s": "Mia Li " * 8} for i in range(n // 90)]), "c1"
    ),
    "JSON nested deep": lambda n: Message.tool(_deep_json(n), "c1"),
    "deep call arguments": lambda n: Message.assistant(None, (ToolCall("c1", "f", _deep_json(n)),)),
}


def time_shapes(size: int, names: Sequence[str] | None = None) -> dict[str, tuple[int, float]]:
    """Per shape: (characters, seconds of one extraction)."""
    out: dict[str, tuple[int, float]] = {}
    for name in names or SHAPES:
        message = SHAPES[name](size)
        chars = len(message.text) + sum(len(c.arguments) for c in message.tool_calls)
        start = time.perf_counter()
        extract_entities(message)
        out[name] = (chars, time.perf_counter() - start)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Entity extraction time on hostile shapes.")
    parser.add_argument("--size", type=int, default=5_000_000, help="characters per message")
    args = parser.parse_args(argv)
    results = time_shapes(args.size)
    for name, (chars, seconds) in results.items():
        print(f"{name:22} {chars:>11,} chars  {seconds * 1000:8.1f} ms")
    worst = max(results.items(), key=lambda kv: kv[1][1])
    print(f"slowest: {worst[0]}, {worst[1][1] * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
