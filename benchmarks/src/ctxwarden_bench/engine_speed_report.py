"""The printed report of :mod:`ctxwarden_bench.engine_speed`: tables and verdicts."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["print_report"]


def _f(value: float | None, unit: str = " ms", digits: int = 3) -> str:
    return "—" if value is None else f"{value:,.{digits}f}{unit}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:,.{0 if value >= 10 else 2}f}x"


def _verdict(ok: bool | None) -> str:
    return {True: "[green]OK[/]", False: "[red]MISSED[/]", None: "[yellow]not run[/]"}[ok]


def print_report(report: dict[str, Any], *, per_call: bool = True) -> None:
    """Tables: build time per size, speed-ups, prefix stability per call, verdicts."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 132)
    console.print(
        f"[bold]engine speed[/] · {report['model']} · budget {report['budget']:,} tokens · "
        f"{report['source']}"
    )
    if report["langchain_core"] is None:
        console.print(
            "[yellow]langchain-core is not installed: the trim_messages comparison is skipped "
            "(pip install langchain-core to run it; it is not a ctxwarden dependency).[/]"
        )
    table = Table(title="build time (median of repeats; agent loop: mean over calls)")
    for col in ("messages", "history tokens", "trim_messages", "agent loop (mean)"):
        table.add_column(col, justify="right")
    for col in ("loop median", "cold, warm caches", "cold, fresh process", "kept / tokens"):
        table.add_column(col, justify="right")
    for r in report["sizes"]:
        table.add_row(
            f"{r['messages']:,}",
            f"{r['history_tokens']:,}",
            _f(r.get("trim_ms"), digits=1),
            f"{_f(r['loop_mean_ms'])} (n={r['loop_calls']})",
            _f(r["loop_median_ms"]),
            _f(r["cold_warm_ms"]),
            _f(r["cold_fresh_ms"]),
            f"{r['kept']} / {r['input_tokens']:,}",
        )
    console.print(table)
    if report["langchain_core"] is not None:
        ratios = Table(
            title=f"speed-up over trim_messages (langchain-core {report['langchain_core']})"
        )
        for col in ("messages", "agent loop", "cold, warm caches", "cold, fresh process"):
            ratios.add_column(col, justify="right")
        for r in report["sizes"]:
            cells = [r.get(f"speedup_{k}") for k in ("loop_mean", "cold_warm", "cold_fresh")]
            ratios.add_row(f"{r['messages']:,}", *(_ratio(c) for c in cells))
        console.print(ratios)
    p = report["prefix"]
    if per_call:
        calls = Table(
            title=f"prefix stability: {len(p['calls'])}-call session, budget {p['budget']:,}"
        )
        for col in ("call", "history", "input", "stable prefix", "shared (audit)"):
            calls.add_column(col, justify="right")
        for col in ("shared (JSON)", "share", "hit", "masked", "dropped"):
            calls.add_column(col, justify="right")
        for c in p["calls"]:
            calls.add_row(
                str(c["call"]),
                str(c["history_messages"]),
                f"{c['input_tokens']:,}",
                f"{c['cacheable_prefix_tokens']:,}",
                f"{c['prefix_shared_tokens']:,}",
                f"{c['json_shared_tokens']:,}",
                f"{c['share']:.0%}",
                "yes" if c["cache_hit"] else ("—" if c["call"] == 1 else "[red]no[/]"),
                str(c["masked"]),
                str(c["dropped"]),
            )
        console.print(calls)
    console.print(
        f"prefix: mean share of input tokens repeating the previous call {p['mean_share']:.1%} "
        f"(median {p['median_share']:.1%}); calls that cache-hit their whole stable prefix "
        f"{p['hit_rate']:.1%} of calls 2..{len(p['calls'])}; audit equals JSON cross-check: "
        f"{'yes' if p['audit_matches_json'] else '[red]NO[/]'}"
    )
    big = max(report["sizes"], key=lambda r: r["messages"])
    t, ok = report["targets"], report["passed"]
    speedups = [v for k, v in big.items() if k in ("speedup_loop_mean", "speedup_cold_warm")]
    console.print(f"[bold]targets at {big['messages']:,} messages[/]")
    runs = big.get("loop_means_ms")
    spread = (
        f"  (median of {len(runs)} processes: {', '.join(f'{m:.3f}' for m in runs)})"
        if runs
        else ""
    )
    console.print(
        f"  agent loop {big['loop_mean_ms']:.3f} ms <= {t['loop_ms']} ms  "
        f"{_verdict(ok['loop_ms'])}{spread}"
    )
    console.print(
        f"  cold build, warm caches {big['cold_warm_ms']:.3f} ms <= {t['cold_ms']} ms  "
        f"{_verdict(ok['cold_ms'])}"
    )
    console.print(
        f"  cold build, fresh process {_f(big['cold_fresh_ms'])} <= {t['fresh_cold_ms']} ms  "
        f"{_verdict(ok.get('fresh_cold_ms'))}  (of which garbage collection "
        f"{_f(big.get('cold_fresh_gc_ms'))}; from a stored state in a fresh process: "
        f"{_f(big.get('fresh_state_ms'))}, of which loading the state "
        f"{_f(big.get('fresh_state_load_ms'))}; a stored session in a fresh process, "
        f"Session.build (read, build, log): {_f(big.get('fresh_session_ms'))})"
    )
    small = min(report["sizes"], key=lambda r: r["messages"])
    if "fresh_cold_small" in ok:
        console.print(
            f"  cold build, fresh process at {small['messages']:,} messages "
            f"{_f(small['cold_fresh_ms'])} < trim_messages {_f(small.get('trim_ms'))}  "
            f"{_verdict(ok['fresh_cold_small'])}  (a stored session in a fresh process, "
            f"Session.build: {_f(small.get('fresh_session_ms'))})"
        )
    for row in [small] if small is big else [small, big]:
        if row.get("cold_fresh_lookback0_ms") is not None:
            console.print(
                f"    where the fresh cold build's time goes, at {row['messages']:,} messages: "
                f"reading no message before its window (LedgerConfig(lookback=0)) "
                f"{_f(row['cold_fresh_lookback0_ms'])} (garbage collection "
                f"{_f(row.get('cold_fresh_lookback0_gc_ms'))}); without the entity ledger "
                f"{_f(row.get('cold_fresh_no_ledger_ms'))}; the default policy "
                f"{_f(row['cold_fresh_ms'])}"
            )
    if "loop_speedup" in ok:
        gc_ms = big.get("loop_gc_ms")
        beside = ""
        if gc_ms is not None and "trim_ms" in big:
            rest = big["loop_mean_ms"] - gc_ms
            beside = (
                f"  (garbage collection {gc_ms:.3f} ms of the mean, "
                f"{big.get('loop_full_gcs', 0)} full collections; the rest alone "
                f"{_ratio(big['trim_ms'] / rest if rest > 0 else None)})"
            )
        console.print(
            f"  agent loop speed-up over trim_messages {_ratio(big.get('speedup_loop_mean'))} "
            f">= {t['loop_speedup']:.0f}x  {_verdict(ok['loop_speedup'])}{beside}"
        )
    console.print(
        f"  speed-up over trim_messages {_ratio(min(speedups) if speedups else None)} "
        "(smaller of loop, cold warm) "
        f">= {t['speedup']:.0f}x  {_verdict(ok['speedup'])}"
    )
    console.print(
        f"  cache hits {p['hit_rate']:.1%} >= {t['cache_hit']:.0%}  {_verdict(ok['cache_hit'])}"
    )
    console.print(f"  every context within budget  {_verdict(ok['within_budget'])}")
    _cold_build_targets(console, report)


def _cold_build_targets(console: Any, report: dict[str, Any]) -> None:
    """The three cold-build figures beside their targets (issue 35)."""
    t, ok = report["targets"], report["passed"]
    big = max(report["sizes"], key=lambda r: r["messages"])
    small = min(report["sizes"], key=lambda r: r["messages"])
    trim = big.get("trim_ms")
    cold = big.get("cold_fresh_ms")
    ratio = cold / trim if cold and trim else None
    console.print("[bold]cold builds[/] (timings on a shared machine: compare side by side)")
    console.print(
        f"  a replica's first build of a stored session, fresh process, at "
        f"{big['messages']:,} messages {_f(big.get('fresh_session_ms'))} <= "
        f"{t['fresh_session_ms']} ms  {_verdict(ok.get('fresh_session_ms'))}"
    )
    console.print(
        f"  a cold build, no stored state, fresh process, at {big['messages']:,} messages "
        f"{_f(cold)} = {_ratio(ratio)} trim_messages ({_f(trim, digits=1)}) <= "
        f"{t['fresh_cold_trim_ratio']}x  {_verdict(ok.get('fresh_cold_trim_ratio'))}"
    )
    console.print(
        f"  a cold build, no stored state, fresh process, at {small['messages']:,} messages "
        f"{_f(small.get('cold_fresh_ms'))} <= {t['fresh_cold_small_ms']} ms  "
        f"{_verdict(ok.get('fresh_cold_small_ms'))}"
    )
