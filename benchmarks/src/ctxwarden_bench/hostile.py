"""Benchmark: one hostile 5 MB tool result, of every shape, through a whole build.

Issue 11 asks that a 5 MB message of any shape build in under a second on this machine
(and that truncation be linear in the input, with a hard cap per message). Each shape
below is one tool result of about ``--size`` characters in a five-message agent history;
for each, in **fresh processes** (nothing cached, as a replica meets a request):

* ``message``: making the :class:`~ctxwarden.Message` (kind detection, id hash);
* ``count``: counting it once, cold;
* ``truncate``: :class:`~ctxwarden.TruncateToolResults` alone on it, its count cached
  (the step's own work: detection, the kind's cut, the cut-values note);
* ``build``: the whole :func:`ctxwarden.build_context` from OpenAI dicts, 8,000 tokens.

A child that raises prints the exception's type (a bare ``ValueError`` or
``UnicodeEncodeError`` out of a public call is itself a finding); one that takes longer
than ``--timeout`` seconds is reported as such. Shapes: one long token-run, log lines,
JSON nested 10,000 deep, a JSON array of 100k items, an HTML page, a unified diff, a
code listing, text with lone surrogates and NULs::

    python -m ctxwarden_bench.hostile [--size 5000000] [--shapes run,log] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["SHAPES", "hostile_text", "main"]


def _fill(size: int, piece: Callable[[int], str], head: str = "", tail: str = "") -> str:
    parts, n, i = [head], len(head) + len(tail), 0
    while n < size:
        part = piece(i)
        parts.append(part)
        n += len(part)
        i += 1
    parts.append(tail)
    return "".join(parts)


def _log(i: int) -> str:
    level = "ERROR" if i % 997 == 0 else "WARN" if i % 211 == 0 else "INFO"
    return (
        f"2024-05-01 12:{i // 60 % 60:02d}:{i % 60:02d} {level} worker-{i % 7} processed "
        f"request id={i} path=/api/v1/items/{i} in {i % 97} ms\n"
    )


def _deep(size: int) -> str:
    nested = '{"a": ' * 10_000 + "1" + "}" * 10_000
    items = _fill(size - len(nested), lambda i: f', {{"id": {i}, "name": "item {i}"}}')
    return f"[{nested}{items}]"


def _wide(size: int) -> str:
    return _fill(
        size, lambda i: f'{", " if i else ""}{{"id": {i}, "sku": "SKU-{i:06d}", "ok": true}}',
        "[", "]",
    )  # fmt: skip


def _html(size: int) -> str:
    return _fill(
        size,
        lambda i: (
            f'<div class="row"><a href="https://shop.example.com/p/{i}">Product {i}</a>'
            f'<span class="price">${i}.99</span><script>track({i});</script></div>\n'
        ),
        "<!DOCTYPE html><html><head><title>Catalogue</title><style>body{margin:0}</style>"
        "</head><body>\n",
        "</body></html>",
    )


def _diff(i: int) -> str:
    return (
        f"diff --git a/src/mod{i}.py b/src/mod{i}.py\nindex 1234567..89abcde 100644\n"
        f"--- a/src/mod{i}.py\n+++ b/src/mod{i}.py\n@@ -10,7 +10,7 @@ def func_{i}():\n"
        "     x = 1\n     y = 2\n-    return x + y\n+    return x * y\n     # end\n"
    )


def _code(i: int) -> str:
    return (
        f'def function_{i}(arg, other=None):\n    """Compute value {i}."""\n'
        f"    value = arg + {i}\n    if other is not None:\n        value += other\n"
        "    return value\n\n"
    )


SHAPES: dict[str, Callable[[int], str]] = {
    "token-run": lambda size: "a" * size,
    "log-lines": lambda size: _fill(size, _log),
    "deep-json": _deep,
    "wide-json": _wide,
    "html": _html,
    "diff": lambda size: _fill(size, _diff),
    "code": lambda size: _fill(size, _code),
    "odd-unicode": lambda size: _fill(size, lambda i: f"x\ud800y\x00z\U0001f600 {i} "),
}


def hostile_text(shape: str, size: int) -> str:
    """The hostile result of ``shape``, about ``size`` characters."""
    return SHAPES[shape](size)


def _history(text: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    return [
        {"role": "system", "content": "You are an operations agent."},
        {"role": "user", "content": "Fetch the output."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": text},
        {"role": "user", "content": "What does it say?"},
    ]


def _child(shape: str, size: int, mode: str) -> dict[str, Any]:
    """Run one measurement in this (fresh) process."""
    import ctxwarden
    from ctxwarden.core.tokens.counter import TokenCounter

    counter = TokenCounter.for_model("gpt-4o")
    counter.count_text("warm up the tokenizer")
    text = hostile_text(shape, size)
    out: dict[str, Any] = {"shape": shape, "chars": len(text), "mode": mode}
    if mode == "build":
        history = _history(text)
        t0 = time.perf_counter()
        built = ctxwarden.build_context(history, "gpt-4o", 8000)
        out["build_s"] = time.perf_counter() - t0
        out["tokens"] = built.input_tokens
        return out
    t0 = time.perf_counter()
    message = ctxwarden.Message.tool(text, "c1", id="t1")
    out["message_s"] = time.perf_counter() - t0
    out["kind"] = message.kind
    t0 = time.perf_counter()
    tokens = counter.count_message(message)
    out["count_s"] = time.perf_counter() - t0
    out["tokens_in"] = tokens
    t0 = time.perf_counter()
    cut = ctxwarden.TruncateToolResults().truncate(
        message, counter.count_message, counter.count_text
    )
    out["truncate_s"] = time.perf_counter() - t0
    out["tokens"] = counter.count_message(cut)
    return out


def _run(shape: str, size: int, mode: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ctxwarden_bench.hostile", "--child", shape, mode, str(size)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"shape": shape, "mode": mode, "error": f"timeout > {timeout:g} s"}
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"shape": shape, "mode": mode, "error": lines[-1][:90] if lines else "failed"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _cell(row: dict[str, Any], key: str) -> str:
    if "error" in row:
        return "error"
    value = row.get(key)
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctxwarden_bench.hostile")
    parser.add_argument("--size", type=int, default=5_000_000, help="characters per result")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per child")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--child", nargs=3, metavar=("SHAPE", "MODE", "SIZE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        shape, mode, size = args.child
        print(json.dumps(_child(shape, int(size), mode)))
        return 0
    rows = []
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            parser.error(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
        parts = _run(shape, args.size, "parts", args.timeout)
        build = _run(shape, args.size, "build", args.timeout)
        rows.append({"shape": shape, "parts": parts, "build": build})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"hostile tool result of {args.size:,} characters, fresh process per cell (seconds)")
    header = f"{'shape':<12} {'kind':<11} {'message':>8} {'count':>8} {'truncate':>9} {'build':>8}"
    print(header + "  tokens in -> sent")
    for row in rows:
        p, b = row["parts"], row["build"]
        sent = b.get("tokens", "-") if "error" not in b else "-"
        line = (
            f"{row['shape']:<12} {p.get('kind', '-'):<11} {_cell(p, 'message_s'):>8} "
            f"{_cell(p, 'count_s'):>8} {_cell(p, 'truncate_s'):>9} {_cell(b, 'build_s'):>8}"
            f"  {p.get('tokens_in', '-')} -> {sent}"
        )
        print(line)
        for part in (p, b):
            if "error" in part:
                print(f"    {part['mode']}: {part['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
