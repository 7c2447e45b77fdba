"""Invariant sweep: many random histories, cold, chained and with the offline summariser.

    python -m ctxwarden_bench.sweep [--histories 10000] [--budgets 300,800,2000] [--json]

For each random history (:func:`~ctxwarden_bench.random_histories.random_history`) and
budget, three builds: a cold one, an agent loop's chained builds over its last messages,
and ``summarizer="offline"``. Each must hold every invariant of
:func:`~ctxwarden_bench.random_histories.check_build`, or end in a ``BudgetError`` that the
same build without a summariser also raises (layers never make a build fail).

Then the policy's count and age rules (issue 35): each history also draws a policy —
``window.max_messages``, ``window.pin_first`` and masking (on or off, its depth and
batch) — and is built with it at each budget and at the budget its count and age rules
alone need (:mod:`~ctxwarden_bench.spare_budget`): a build with budget to spare that
drops, evicts, masks or cuts more than those rules ask, or warns, is counted in
``spare_budget_violations``, as is a drop that names the wrong cause. Prints the counts;
exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from typing import Any

from ctxwarden.core.errors import BudgetError
from ctxwarden.pipeline.engine import build_context
from ctxwarden.pipeline.policy import Policy, WindowConfig
from ctxwarden.steps.mask import MaskObservations
from ctxwarden_bench.random_histories import check_build, random_history
from ctxwarden_bench.spare_budget import reference_build, spare_budget, spare_budget_problems

__all__ = ["main", "sweep"]


def _one(
    history: list[Any], budget: int, tally: Counter[str], examples: list[str], seed: int
) -> None:
    try:
        cold = build_context(history, "gpt-4o", budget)
    except BudgetError:
        tally["budget_error_cold"] += 1
        cold = None
    if cold is not None:
        tally["builds"] += 1
        for p in check_build(history, cold, budget):
            tally["violations"] += 1
            examples.append(f"seed {seed} @{budget} cold: {p}")
    built = None
    for n in range(max(2, len(history) - 6), len(history) + 1):
        try:
            built = build_context(history[:n], "gpt-4o", budget, previous=built)
        except BudgetError:
            built = None
            continue
        tally["builds"] += 1
        for p in check_build(history[:n], built, budget):
            tally["violations"] += 1
            examples.append(f"seed {seed} @{budget} chained n={n}: {p}")
    try:
        summed = build_context(history, "gpt-4o", budget, summarizer="offline")
    except BudgetError:
        if cold is not None:
            tally["violations"] += 1
            tally["budget_error_from_layers"] += 1
            examples.append(f"seed {seed} @{budget}: BudgetError with the summariser only")
        return
    tally["builds"] += 1
    for p in check_build(history, summed, budget):
        tally["violations"] += 1
        examples.append(f"seed {seed} @{budget} summariser: {p}")


def random_policy(seed: int) -> Policy:
    """A policy drawn from ``seed``: a message cap (or none), ``pin_first`` and masking."""
    rng = random.Random(f"policy-{seed}")
    cap = rng.choice((None, 1, 2, 3, 5, 8, 12, 20))
    masking = rng.random() < 0.7
    mask = MaskObservations(keep_last=rng.randint(0, 4), batch_tokens=rng.choice((0, 200, 1000)))
    return Policy(
        window=WindowConfig(max_messages=cap, pin_first=rng.randint(0, 4)),
        mask=mask if masking else None,
    )


def _with_policy(
    history: list[Any],
    budgets: tuple[int, ...],
    seed: int,
    tally: Counter[str],
    examples: list[str],
) -> None:
    """The policy's count and age rules at each budget and at the one they need."""
    policy = random_policy(seed)
    reference = reference_build(history, policy)
    spare = spare_budget(reference, int(reference.input_tokens * 1.2), policy)
    for budget in (*budgets, spare, spare + spare // 2):
        try:
            built = build_context(history, "gpt-4o", budget, policy=policy)
        except BudgetError:
            continue
        tally["policy_builds"] += 1
        problems = check_build(history, built, budget)
        problems += spare_budget_problems(history, built, budget, reference, policy)
        for p in problems:
            tally["spare_budget_violations"] += 1
            examples.append(f"seed {seed} @{budget} {policy.window} mask={policy.mask}: {p}")


def sweep(
    histories: int, budgets: tuple[int, ...], first_seed: int = 0, progress: bool = False
) -> dict[str, Any]:
    tally: Counter[str] = Counter()
    examples: list[str] = []
    start = time.perf_counter()
    for seed in range(first_seed, first_seed + histories):
        history = random_history(seed)
        for budget in budgets:
            _one(history, budget, tally, examples, seed)
        _with_policy(history, budgets, seed, tally, examples)
        done = seed - first_seed + 1
        if progress and done % 500 == 0:
            print(f"{done:,} histories, {tally['violations']} violations", file=sys.stderr)
    return {
        "histories": histories,
        "budgets": list(budgets),
        "builds": tally["builds"],
        "violations": tally["violations"],
        "budget_error_cold": tally["budget_error_cold"],
        "budget_error_from_layers": tally["budget_error_from_layers"],
        "policy_builds": tally["policy_builds"],
        "spare_budget_violations": tally["spare_budget_violations"],
        "seconds": round(time.perf_counter() - start, 1),
        "examples": examples[:20],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--histories", type=int, default=10_000)
    parser.add_argument("--budgets", default="300,800,2000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    budgets = tuple(int(b) for b in args.budgets.split(","))
    result = sweep(args.histories, budgets, args.seed, progress=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key in (
            "histories",
            "builds",
            "violations",
            "budget_error_cold",
            "budget_error_from_layers",
            "policy_builds",
            "spare_budget_violations",
            "seconds",
        ):
            print(f"{key:>26}: {result[key]}")
        for line in result["examples"]:
            print("  ", line)
    return 1 if result["violations"] or result["spare_budget_violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
