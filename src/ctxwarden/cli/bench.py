"""``ctxwarden bench``: the seeds' experiments and the real traces, as tables, plots, JSON.

With no arguments it runs offline (no key, no network): laptop-shop (seed 003),
agent-chat (seed 000), and the tau-bench, swebench-mini and LoCoMo traces when the
data folder is found (``--data``, ``$CTXWARDEN_DATA``, or ``../shared/data``);
``--peers`` adds litellm's and headroom-ai's compressors to the trace tables.
``--summarizer SPEC`` makes every strategy's summaries and facts real;
``--agent-model SPEC`` lets a real model play the laptop-shop agent (each strategy
holds its own conversation with it). ``--broker redis://...`` adds LoCoMo's
``serve + worker`` row: the questions asked through ``ctxwarden serve`` and a
``ctxwarden worker`` (without a broker the report says that row was not run).

The bench is its own distribution, ``ctxwarden_bench`` in ``benchmarks/`` of a clone (the
runtime wheel carries no bench code and no matplotlib); this command runs it when it is
installed and otherwise says how to install it. With no tau-bench file in the data folder
it replays the few tau-bench runs the bench ships (and the report says so).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ctxwarden.core.errors import ConfigError, UsageError

DEFAULT_DATA = Path("..") / "shared" / "data"
INSTALL_HINT = (
    "ctxwarden bench needs the bench, a separate distribution (ctxwarden_bench, with "
    "matplotlib): from the root of a ctxwarden clone run  pip install -e ./benchmarks  "
    "(or pip install -e . -e ./benchmarks)"
)


def _bench_report() -> Any:
    """``ctxwarden_bench.report``, or a clear error saying how to install it."""
    try:
        from ctxwarden_bench import report
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "ctxwarden_bench":
            raise  # the bench is there but something it needs is not: say that instead
        raise UsageError(INSTALL_HINT) from exc
    return report


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
            '(pip install -e "./benchmarks[peers]").',
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
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            help="Redis URL: adds LoCoMo's 'serve + worker' path row (ctxwarden serve and "
            "ctxwarden worker started as processes, a scripted upstream).",
        ),
    ] = None,
    served_db: Annotated[
        str | None,
        typer.Option(
            "--served-db",
            help="Store URL the 'serve + worker' row's processes share (default: a "
            "temporary SQLite file).",
        ),
    ] = None,
) -> None:
    """Run the benchmark scenarios and write report.json, report.md and PNG plots."""
    if served_db is not None and broker is None:
        raise UsageError("--served-db is the store of the 'serve + worker' row: give --broker too")
    report_module = _bench_report()
    from ctxwarden_bench.sample import TAU_SAMPLE_NOTE, tau_sample

    base = _data_dir(data)
    tau = (
        None
        if no_traces
        else _trace(tau_bench, base / "tau-bench" / "airline-gpt-4o-dev.json", "tau-bench")
    )
    sampled: dict[str, str] = {}
    if tau is None and not no_traces:
        tau = tau_sample()  # a fresh clone still shows a real trace
        sampled["tau-bench"] = TAU_SAMPLE_NOTE
    loc = None if no_traces else _trace(locomo, base / "locomo" / "locomo-dev.json", "locomo")
    swe = None if no_traces else _trace(swebench, base / report_module.SWEBENCH_FILE, "swebench")
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

        report: dict[str, Any] = report_module.run_bench(
            out,
            tau_bench=tau,
            locomo=loc,
            swebench=swe,
            peers=peers,
            summarizer=summarizer,
            agent_model=agent_model,
            progress=report_step,
            sampled=sampled,
            broker=broker,
            served_db=served_db,
        )
    text = (out / "report.md").read_text("utf-8")
    if sys.stdout.isatty():
        Console().print(Markdown(text))
    else:  # piped or logged: the tables whole (rich would cut their cells to 80 columns)
        typer.echo(text)
    for name, note in report.get("sampled", {}).items():
        console.print(f"[yellow]{name}[/] {note}")
    for name, note in report.get("skipped", {}).items():
        console.print(f"[yellow]{name} skipped:[/] {note} (or --data DIR, or CTXWARDEN_DATA)")
    console.print(f"report written to {out}/ (report.json, report.md, *.png)")
