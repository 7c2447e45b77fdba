"""Where the cache cost goes: prefix breaks by cause, beside the sawtooth window (issue 37).

A dev trace is replayed as an agent loop (a build before every assistant message,
``previous=`` chained, the default policy for gpt-4o) beside the plain sawtooth window
(:func:`~ctxwarden_bench.metrics.sawtooth_window`) at the same calls. For each, at
Anthropic's cache prices (0.1x read, 1.25x write; the idealised cache of the bench, no
minimum length): the calls, the mean context, the tokens read from the cache and written,
the calls whose previous context is not a whole prefix (breaks), and the cost. For ours,
every break's cause as the audit names it (numbers left out, so that one cause is one row),
with the tokens it wrote again that an earlier call had sent and what that cost over
reading them; and the median context right before a break and right after it (how far a
compaction takes the context down, so how many calls it covers).

``LoopCost`` (the bench's cost columns) says *whether* a default build costs more than the
sawtooth; this says *why*, in the terms a change to the policy moves. Session 32 read it
on the dev data (issue 37's note): the extra cost at 4,000 (coding) and 2,000 (tau-bench)
tokens comes from compactions that leave the context near the budget, so the next call
breaks again.

The LoCoMo row (``locomo@4000``) replays the chat loop the bench's LoCoMo cost columns
price (:func:`~ctxwarden_bench.traces.locomo_loop_cost`): ``build_context`` with the
offline summariser, so the summary, facts and recall layers' breaks show beside the
window's.

Run: ``python -m ctxwarden_bench.break_causes --rows coding@4000,tau@2000,locomo@4000``
(``--runs N`` for the first N runs of each trace, ``--json PATH`` for the figures,
``--policy FILE`` for a policy of your own instead of the default: what a change to the
low-water mark or the ledger would cost, and why).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxwarden.core.errors import BudgetError
from ctxwarden.core.messages import Message
from ctxwarden.core.registry.cache_cost import ANTHROPIC, CacheCost, session_cache_cost
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.pipeline.built import BuiltContext
from ctxwarden_bench.data_files import find_data
from ctxwarden_bench.metrics import cache_calls
from ctxwarden_bench.retention import SawtoothBuilder, engine_builder, plain_builder, policy_file

__all__ = ["BreakCause", "RowCauses", "break_causes", "main", "side_json"]

MODEL = "gpt-4o"
ROWS = ("coding@4000", "coding@8000", "tau@2000", "tau@4000", "locomo@4000")
_NUMBER = re.compile(r"\d[\d,]*")


_NONE = CacheCost(0, 0, 0, 0.0, 0, 0)


def side_json(side: CacheCost) -> dict[str, Any]:
    """One builder's calls over a row (:class:`CacheCost` at Anthropic's prices) as JSON:
    tokens written are those not read from the cache; breaks, the later calls whose
    previous context is not a whole prefix."""
    return {
        "calls": side.calls,
        "input_tokens": side.input_tokens,
        "read_tokens": side.shared_tokens,
        "written_tokens": side.input_tokens - side.shared_tokens,
        "breaks": side.later_calls - side.whole_prefix_calls,
        "units": round(side.units, 1),
    }


@dataclass
class BreakCause:
    """The breaks of one cause: how many, and the tokens they wrote again."""

    cause: str
    count: int = 0
    rewritten_tokens: int = 0

    @property
    def units(self) -> float:
        """What writing them again cost over reading them, at Anthropic's prices."""
        return (ANTHROPIC.write - ANTHROPIC.read) * self.rewritten_tokens


@dataclass
class RowCauses:
    """One row (a trace at a budget): ours and the sawtooth, ours' breaks by cause."""

    name: str
    budget: int
    ours: CacheCost = _NONE  # at Anthropic's prices, summed over the runs
    sawtooth: CacheCost = _NONE
    causes: dict[str, BreakCause] = field(default_factory=dict)
    before_break: list[int] = field(default_factory=list)  # context of the call before
    after_break: list[int] = field(default_factory=list)
    errors: int = 0  # builds that raised BudgetError (the plain window was sent)

    @property
    def vs_sawtooth(self) -> float:
        return self.ours.units / self.sawtooth.units if self.sawtooth.units else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.name,
            "budget": self.budget,
            "ours": side_json(self.ours),
            "sawtooth": side_json(self.sawtooth),
            "ours_vs_sawtooth": round(self.vs_sawtooth, 4),
            "causes": [
                {"cause": c.cause, "breaks": c.count, "rewritten_tokens": c.rewritten_tokens}
                for c in sorted(self.causes.values(), key=lambda c: -c.rewritten_tokens)
            ],
            "median_before_break": _median(self.before_break),
            "median_after_break": _median(self.after_break),
            "errors": self.errors,
        }


def _median(values: Sequence[int]) -> float | None:
    return statistics.median(values) if values else None


Build = Callable[[Sequence[Message]], BuiltContext]
"""One loop's builds: the history so far in, the built context out (chained)."""


def _engine_loop(budget: int, policy: Any) -> Build:
    """The bench's agent loop (no summariser): what the coding and tau-bench rows build."""
    engine = engine_builder(MODEL, policy=policy)
    return lambda history: engine.build(history, budget)


def _chat_loop(budget: int, policy: Any) -> Build:
    """The LoCoMo loop's builds: ``build_context`` with the offline summariser, its summary,
    facts and recall as the bench's LoCoMo cost row builds them
    (:func:`~ctxwarden_bench.traces.locomo_loop_cost`)."""
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden_bench.metrics import EngineStrategy

    strategy = EngineStrategy(MODEL, budget, policy=policy if policy is not None else Policy())

    def build(history: Sequence[Message]) -> BuiltContext:
        strategy(history)
        built: BuiltContext = strategy.last
        return built

    return build


def break_causes(
    runs: Sequence[Sequence[Message]],
    budget: int,
    name: str = "",
    policy: Any = None,
    loop: Callable[[int, Any], Build] = _engine_loop,
) -> RowCauses:
    """Replay ``runs`` as agent loops at ``budget``, ours (the default policy, or
    ``policy``; each run's builds made by ``loop(budget, policy)``) beside the sawtooth
    window (see the module docstring)."""
    counter = TokenCounter.for_model(MODEL)
    row = RowCauses(name, budget)
    for run in runs:
        counts = [counter.count_message(m) for m in run]
        build, sawtooth = loop(budget, policy), SawtoothBuilder()
        ours: list[list[Message]] = []
        saws: list[list[Message]] = []
        before = 0
        for k, m in enumerate(run):
            if m.role != "assistant" or not k:
                continue
            saws.append(sawtooth(run[:k], counts[:k], budget))
            try:
                built = build(run[:k])
            except BudgetError:  # the caller's fallback, as the retention rows send it
                row.errors += 1
                ours.append(plain_builder()(run[:k], counts[:k], budget))
                continue
            ours.append(list(built.messages))
            audit = built.audit
            if audit.prefix_break is not None:
                cause = _NUMBER.sub("N", audit.prefix_break.cause)
                entry = row.causes.setdefault(cause, BreakCause(cause))
                entry.count += 1
                entry.rewritten_tokens += audit.prefix_break.rewritten_tokens
                row.before_break.append(before)
                row.after_break.append(audit.input_tokens)
            before = audit.input_tokens
        row.ours += session_cache_cost(cache_calls(ours, counter), ANTHROPIC)
        row.sawtooth += session_cache_cost(cache_calls(saws, counter), ANTHROPIC)
    return row


def _loaders(data: str | None) -> dict[str, Callable[[], list[list[Message]]]]:
    from ctxwarden_bench.coding_truncation import find_traces
    from ctxwarden_bench.count_cache import find_tau_bench
    from ctxwarden_bench.swebench import load_swebench
    from ctxwarden_bench.traces import load_tau_bench

    def coding() -> list[list[Message]]:
        path = find_traces(data)
        if path is None:
            raise SystemExit("swebench-mini traces not found (set --data or $CTXWARDEN_DATA)")
        return [list(r) for r in load_swebench(path)]

    def tau() -> list[list[Message]]:
        path = find_tau_bench(data)
        if path is None:
            raise SystemExit("tau-bench traces not found (set --data or $CTXWARDEN_DATA)")
        return load_tau_bench(path)

    def locomo() -> list[list[Message]]:
        from ctxwarden_bench.traces import load_locomo, locomo_transcript

        found = find_data(_LOCOMO, data)
        if found is None:
            raise SystemExit("LoCoMo conversations not found (set --data or $CTXWARDEN_DATA)")
        return [locomo_transcript(c) for c in load_locomo(found)]

    return {"coding": coding, "tau": tau, "locomo": locomo}


_LOCOMO = Path("locomo") / "locomo-dev.json"
_LOOPS: dict[str, Callable[[int, Any], Build]] = {"locomo": _chat_loop}
"""The traces whose loop is not the bench's agent loop (default :func:`_engine_loop`)."""


def _parse_rows(text: str) -> list[tuple[str, int]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        trace, _, budget = part.partition("@")
        if trace not in ("coding", "tau", "locomo") or not budget.isdigit() or int(budget) <= 0:
            raise SystemExit(
                f"--rows: {part!r} is not TRACE@BUDGET (coding, tau or locomo, e.g. tau@2000)"
            )
        out.append((trace, int(budget)))
    return out


def report(row: RowCauses) -> str:
    """The row as the terminal shows it."""
    lines = [f"{row.name} @{row.budget:,}: ours {row.vs_sawtooth:.1%} of the sawtooth's cost"]
    lines.append(
        f"  {'':9} {'calls':>6} {'mean ctx':>9} {'read':>10} {'written':>10} "
        f"{'breaks':>7} {'cost (units)':>13}"
    )
    for label, side in (("ours", row.ours), ("sawtooth", row.sawtooth)):
        f = side_json(side)
        mean = side.input_tokens / side.calls if side.calls else 0
        lines.append(
            f"  {label:9} {side.calls:>6} {mean:>9,.0f} {f['read_tokens']:>10,} "
            f"{f['written_tokens']:>10,} {f['breaks']:>7} {side.units:>13,.0f}"
        )
    lines.append(
        f"  ours' context around a break (median): {_median(row.before_break) or 0:,.0f} "
        f"tokens on the call before, {_median(row.after_break) or 0:,.0f} after"
    )
    lines.append(f"  {'breaks':>7} {'rewritten':>10} {'units':>9}  cause")
    for c in sorted(row.causes.values(), key=lambda c: -c.rewritten_tokens):
        lines.append(f"  {c.count:>7} {c.rewritten_tokens:>10,} {c.units:>9,.0f}  {c.cause}")
    if row.errors:
        lines.append(f"  {row.errors} build(s) raised BudgetError (the plain window was sent)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxwarden_bench.break_causes",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--data", help="the shared data folder (default: $CTXWARDEN_DATA)")
    ap.add_argument(
        "--rows",
        default=",".join(ROWS),
        help="TRACE@BUDGET, comma-separated; TRACE is coding (swebench-mini), tau "
        "(tau-bench airline) or locomo (the LoCoMo chat loop, with the offline summariser); "
        "default: %(default)s",
    )
    ap.add_argument("--runs", type=int, default=0, help="only the first N runs of each trace")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--policy", type=Path, help="a policy TOML file instead of the default")
    args = ap.parse_args(argv)
    rows = _parse_rows(args.rows)
    policy = policy_file(args.policy)
    loaders = _loaders(args.data)
    loaded: dict[str, list[list[Message]]] = {}
    out = []
    for trace, budget in rows:
        if trace not in loaded:
            runs = loaders[trace]()
            loaded[trace] = runs[: args.runs] if args.runs else runs
        row = break_causes(loaded[trace], budget, trace, policy, _LOOPS.get(trace, _engine_loop))
        print(report(row), flush=True)
        out.append(row.to_json())
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
