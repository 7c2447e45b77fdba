"""Benchmark: do the names a coding agent uses next survive the truncation of its results?

On the swebench-mini coding-agent traces (``../shared/data/swebench-mini/``: a bash tool
on SWE-bench tasks, results shaped ``<returncode>0</returncode><output>...</output>``), the
*needed-later tokens* of a command are, as the data's README defines them, its tokens
(split on ``[^\\w./-]+``) of length >= 4 that are not in the system prompt or the task
and that contain ``/``, ``.``, ``_``, a camelCase step or are all digits: paths, dotted
names, identifiers, line numbers. For every tool result over the truncation threshold,
this counts the needed-later tokens of *later* commands of the same run that occur in the
result (whole-token match), and how many of those still occur in the result as
:class:`~ctxwarden.TruncateToolResults` (default policy) cuts it — the cut-values note
included, since it is part of what is sent. ``next`` counts only the next command's.

It uses the public API only, so the same file measures another checkout::

    python -m ctxwarden_bench.coding_truncation [--data PATH] [--json]
    PYTHONPATH=/path/to/other/src python benchmarks/src/ctxwarden_bench/coding_truncation.py
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import ctxwarden
from ctxwarden import Message, StrategyContext, TokenCounter, TruncateToolResults
from ctxwarden_bench.data_files import find_data

__all__ = ["find_traces", "main", "measure", "needed_tokens"]

_FILE = "swebench-mini/swebench-verified-mini-gemini3-dev.json"
_SPLIT = re.compile(r"[^\w./-]+")
_CAMEL = re.compile(r"[a-z][A-Z]")


def find_traces(data: str | None = None) -> Path | None:
    """The swebench-mini file: ``data`` itself when it is a file, else found under it,
    ``$CTXWARDEN_DATA``, ``../shared/data`` or ``./data`` (:func:`find_data`)."""
    if data and Path(data).is_file():
        return Path(data)
    return find_data(_FILE, data)


def _occurs(token: str, text: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(token)}(?![\w])", text) is not None


def needed_tokens(command: str, known: str) -> list[str]:
    """The README's distinctive tokens of ``command`` that ``known`` (the system prompt
    and the task) does not contain."""
    out: dict[str, None] = {}
    for token in _SPLIT.split(command):
        if len(token) < 4 or token in out:
            continue
        if not (any(c in token for c in "/._") or _CAMEL.search(token) or token.isdigit()):
            continue
        if not _occurs(token, known):
            out[token] = None
    return list(out)


def _command(message: Message) -> str:
    parts = []
    for call in message.tool_calls:
        try:
            parts.append(str(json.loads(call.arguments).get("command", "")))
        except (ValueError, AttributeError):
            parts.append(call.arguments)
    return "\n".join(parts)


def measure(path: Path, step: TruncateToolResults | None = None) -> dict[str, Any]:
    """Share of needed-later tokens kept by truncation, over all results over threshold."""
    step = step or TruncateToolResults()
    counter = TokenCounter.for_model("gpt-4o")
    ctx = StrategyContext(
        count=counter.count_message,
        budget=1_000_000,
        total=lambda ms: counter.count_messages(ms).tokens,
        count_text=counter.count_text,
    )
    runs = json.loads(path.read_text())
    totals: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    for run in runs:
        history = ctxwarden.messages_from_openai(run["traj"])
        known = "\n".join(m.text for m in history[:2])
        cut = step(history, ctx).messages
        commands = [(i, _command(m)) for i, m in enumerate(history) if m.tool_calls]
        for i, message in enumerate(history):
            if message.role != "tool" or counter.count_message(message) <= step.threshold_tokens:
                continue
            later = [c for k, c in commands if k > i]
            totals["results"] += 1
            kind = by_kind.setdefault(str(message.kind), Counter())
            kind["results"] += 1
            for scope, cmds in (("all", later), ("next", later[:1])):
                for command in cmds:
                    for token in needed_tokens(command, known):
                        if not _occurs(token, message.text):
                            continue
                        kept = _occurs(token, cut[i].text)
                        totals[f"{scope}_needed"] += 1
                        totals[f"{scope}_kept"] += kept
                        if scope == "all":
                            kind["needed"] += 1
                            kind["kept"] += kept
    share = {s: totals[f"{s}_kept"] / max(totals[f"{s}_needed"], 1) for s in ("all", "next")}
    return {"file": str(path), "totals": dict(totals), "share": share, "by_kind": by_kind}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctxwarden_bench.coding_truncation")
    parser.add_argument("--data", help="the swebench-mini file or the data folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    path = find_traces(args.data)
    if path is None:
        parser.error("swebench-mini traces not found (set --data or $CTXWARDEN_DATA)")
    report = measure(path)
    if args.json:
        print(json.dumps(report, indent=2, default=dict))
        return 0
    t = report["totals"]
    print(f"{t.get('results', 0)} tool results over the threshold in {path.name}")
    for scope, label in (("all", "later commands"), ("next", "the next command")):
        print(
            f"needed-later tokens of {label} kept: {t.get(f'{scope}_kept', 0):,} of "
            f"{t.get(f'{scope}_needed', 0):,} ({report['share'][scope]:.1%})"
        )
    for kind, c in sorted(report["by_kind"].items()):
        share = c["kept"] / c["needed"] if c["needed"] else 0.0
        counts = f"{c['kept']:>5} of {c['needed']:>5} kept ({share:.1%})"
        print(f"  {kind:<12} {c['results']:>4} results  {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
