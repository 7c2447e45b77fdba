"""``ctxwarden tune TRACES... --budget N``: fit the policy to your recorded sessions (R22).

Parses the options into a :class:`~ctxwarden.tune.run.TuneRequest`, shows progress and
the problems met, and prints the tables; :mod:`ctxwarden.tune` does the work.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from ctxwarden.cli._common import stdout_console

__all__ = ["tune"]


def tune(
    traces: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="TRACES...",
            help="Recorded sessions: JSON/JSONL files (OpenAI or Anthropic messages, runs "
            "with 'traj'), folders of them, ctxwarden SQLite stores.",
        ),
    ] = None,
    budget: Annotated[
        int | None, typer.Option("--budget", help="Input token budget to tune for (required).")
    ] = None,
    model: Annotated[str, typer.Option("--model", help="Model whose tokens are counted.")] = (
        "gpt-4o"
    ),
    db: Annotated[
        str | None, typer.Option("--db", help="Also read a store: sqlite:///x.db, postgresql://")
    ] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's sessions (with --db).")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Policy TOML to write.")] = Path(
        "policy.toml"
    ),
    report: Annotated[
        Path,
        typer.Option("--report", help="Report path prefix: writes .png, .html and .json."),
    ] = Path("tune-report"),
    policy: Annotated[
        Path | None,
        typer.Option("--policy", help="Start from this policy TOML (its other keys are kept)."),
    ] = None,
    trials: Annotated[int, typer.Option("--trials", help="Policies to try.")] = 40,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Processes (the result does not depend on it).")
    ] = min(4, os.cpu_count() or 1),
    seed: Annotated[int, typer.Option("--seed", help="Split and sampler seed.")] = 0,
    summarizer: Annotated[
        str | None,
        typer.Option(
            "--summarizer", help="Replay with this summariser ('offline') and tune its trigger."
        ),
    ] = None,
    cache_read: Annotated[
        float, typer.Option("--cache-read", help="Price of a cached input token (x input).")
    ] = 0.1,
    cache_write: Annotated[
        float, typer.Option("--cache-write", help="Price of an uncached input token (x input).")
    ] = 1.25,
    shrink: Annotated[
        bool,
        typer.Option(
            "--shrink",
            help="Also search below the default's room (ledger, masking, truncation, window).",
        ),
    ] = False,
) -> None:
    """Fit the policy to recorded sessions: retention kept, cost at cache prices cut."""
    from ctxwarden.core.errors import ConfigError
    from ctxwarden.tune.replay import CachePrices
    from ctxwarden.tune.report import comparison, knobs, rich_table
    from ctxwarden.tune.run import TuneRequest, run_tune

    if budget is None:
        raise ConfigError("give the budget to tune for: --budget N (input tokens)")
    err = Console(stderr=True)
    request = TuneRequest(
        traces=tuple(traces or ()),
        budget=budget,
        model=model,
        db=db,
        tenant=tenant,
        out=out,
        report=report,
        base=policy,
        trials=trials,
        jobs=jobs,
        seed=seed,
        prices=CachePrices(cache_read, cache_write),
        summarizer=summarizer,
        shrink=shrink,
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                label = "fitting" if phase == "fit" else "checking"
                tasks[phase] = bar.add_task(label, total=total)
            bar.update(tasks[phase], completed=done)

        output = run_tune(
            request,
            on_problem=lambda p: err.print(
                f"skipped {p}", highlight=False, markup=False, soft_wrap=True
            ),
            progress=progress,
        )
    console = stdout_console()
    result = output.result
    console.print(rich_table(comparison(result)))
    console.print(rich_table(knobs(result)))
    verdict = "holds" if result.holds else "does NOT hold"
    console.print(
        f"The tuned policy {verdict} on the checking half. Wrote {output.policy_file}"
        + "".join(f", {p}" for p in output.report_files)
        + f" ({result.seconds:.0f} s).",
        highlight=False,
    )
