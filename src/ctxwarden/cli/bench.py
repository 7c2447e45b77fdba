"""``ctxwarden bench``: the seeds' experiments and the real traces, as tables, plots, JSON.

With no arguments it runs offline (no key, no network): laptop-shop (seed 003),
agent-chat (seed 000), and the tau-bench, swebench-mini and LoCoMo traces when the
data folder is found (``--data``, ``$CTXWARDEN_DATA``, or ``../shared/data``);
``--peers`` adds litellm's and headroom-ai's compressors to the trace tables.
``--summarizer SPEC`` makes every strategy's summaries and facts real;
``--agent-model SPEC`` lets a real model play the laptop-shop agent (each strategy
holds its own conversation with it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ctxwarden.errors import ConfigError

DEFAULT_DATA = Path("..") / "shared" / "data"


def _data_dir(data: Path | None) -> Path:
    if data is not None:
        if not data.is_dir():
            raise ConfigError(f"--data {data} is not a folder")
        return data
    env = os.environ.get("CTXWARDEN_DATA")
    return Path(env) if env else DEFAULT_DATA


def _trace(explicit: Path | None, default: Path, name: str) -> Path | None:
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"--{name} {explicit}: no such file")
        return explicit
    return default if default.is_file() else None


def bench(
    out: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = Path(
        "ctxwarden-report"
    ),
    data: Annotated[
        Path | None,
        typer.Option("--data", help="Folder with tau-bench/, locomo/, swebench-mini/ data."),
    ] = None,
    tau_bench: Annotated[
        Path | None, typer.Option("--tau-bench", help="tau-bench trajectories JSON.")
    ] = None,
    locomo: Annotated[
        Path | None, typer.Option("--locomo", help="LoCoMo conversations JSON.")
    ] = None,
    swebench: Annotated[
        Path | None, typer.Option("--swebench", help="swebench-mini coding-agent runs JSON.")
    ] = None,
    peers: Annotated[
        bool,
        typer.Option(
            "--peers",
            help="Add litellm's and headroom-ai's compressors to the trace tables "
            '(pip install -e ".[peers]").',
        ),
    ] = False,
    summarizer: Annotated[
        str,
        typer.Option(
            "--summarizer",
            help="'offline', or a model that writes every strategy's summaries and facts: "
            "openai:gpt-4o-mini, anthropic:claude-haiku-4-5, ollama:qwen3:8b, ...",
        ),
    ] = "offline",
    agent_model: Annotated[
        str | None,
        typer.Option(
            "--agent-model",
            help="A real model as the laptop-shop agent, through the OpenAI-compatible "
            "client: openai:gpt-4o-mini, ollama:qwen3:8b, openrouter:..., vllm:MODEL@URL "
            "(key and base URL from OPENAI_API_KEY / OPENAI_BASE_URL and the like).",
        ),
    ] = None,
    no_traces: Annotated[bool, typer.Option("--no-traces", help="Skip the real traces.")] = False,
) -> None:
    """Run the benchmark scenarios and write report.json, report.md and PNG plots."""
    from ctxwarden.bench.report import SWEBENCH_FILE, run_bench

    base = _data_dir(data)
    tau = (
        None
        if no_traces
        else _trace(tau_bench, base / "tau-bench" / "airline-gpt-4o-dev.json", "tau-bench")
    )
    loc = None if no_traces else _trace(locomo, base / "locomo" / "locomo-dev.json", "locomo")
    swe = None if no_traces else _trace(swebench, base / SWEBENCH_FILE, "swebench")
    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,  # an error then prints alone, on one line
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task("starting", total=None)

        def report_step(label: str) -> None:
            progress.update(task, description=label)

        report: dict[str, Any] = run_bench(
            out,
            tau_bench=tau,
            locomo=loc,
            swebench=swe,
            peers=peers,
            summarizer=summarizer,
            agent_model=agent_model,
            progress=report_step,
        )
    Console().print(Markdown((out / "report.md").read_text("utf-8")))
    for name, note in report.get("skipped", {}).items():
        console.print(f"[yellow]{name} skipped:[/] {note} (or --data DIR, or CTXWARDEN_DATA)")
    console.print(f"report written to {out}/ (report.json, report.md, *.png)")
