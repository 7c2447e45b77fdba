"""``ctxwarden wrap -- COMMAND ...``: run an agent behind a local proxy in one command.

Parses the options and calls :mod:`ctxwarden.local`: the local tenant, the background
server (started, or the running one reused), the agent's environment, the run's report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Annotated

import typer

from ctxwarden.core.errors import ConfigError

__all__ = ["wrap"]


def wrap(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The agent's command and its arguments (after --).", metavar="COMMAND"),
    ] = None,
    print_env: Annotated[
        bool,
        typer.Option("--print-env", help="Print export lines for your shell instead of running."),
    ] = False,
    stop: Annotated[
        bool, typer.Option("--stop", help="Stop the background servers wrap started, and exit.")
    ] = False,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            envvar="CTXWARDEN_HOME",
            help="Where the store, the local key and the server state live "
            "(default: the user's data dir).",
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db", envvar="CTXWARDEN_DB", help="Store URL (default: SQLite in the data dir)."
        ),
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(
            "--upstream",
            envvar="CTXWARDEN_UPSTREAM",
            help="OpenAI-compatible upstream (default: $OPENAI_BASE_URL, else OpenAI's).",
        ),
    ] = None,
    anthropic_upstream: Annotated[
        str | None,
        typer.Option(
            "--anthropic-upstream",
            envvar="CTXWARDEN_ANTHROPIC_UPSTREAM",
            help="Anthropic upstream (default: $ANTHROPIC_BASE_URL, else Anthropic's).",
        ),
    ] = None,
    gemini_upstream: Annotated[
        str | None,
        typer.Option(
            "--gemini-upstream",
            envvar="CTXWARDEN_GEMINI_UPSTREAM",
            help="Gemini API upstream (default: $GOOGLE_GEMINI_BASE_URL, else Google's).",
        ),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="Policy TOML the server builds with.")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            help="The server's port (default: a free one); fixed for clients configured by "
            "file (Codex's config.toml).",
        ),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session",
            help="The run's id, in CTXWARDEN_SESSION (default: wrap- and a random hex id).",
        ),
    ] = None,
    session_header: Annotated[
        bool,
        typer.Option(
            "--session-header",
            help="Also send the run's id as X-Ctxwarden-Session where the client reads headers "
            "from the environment (Claude Code: ANTHROPIC_CUSTOM_HEADERS).",
        ),
    ] = False,
) -> None:
    """Run COMMAND with OPENAI_BASE_URL, ANTHROPIC_BASE_URL and GOOGLE_GEMINI_BASE_URL
    pointing at a local ctxwarden proxy (started once, in the background, then reused),
    exit with its exit code, and print what the run's calls sent and saved. Upstream keys
    come from your environment (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY) and
    are never written to disk."""
    from ctxwarden.local.agent_env import AgentEnv, export_lines
    from ctxwarden.local.home import Home
    from ctxwarden.local.proxy import local_proxy
    from ctxwarden.local.server import stop_servers
    from ctxwarden.local.tenant import LOCAL_TENANT

    home = Home.at(data_dir)
    if stop:
        for r in stop_servers(home):
            typer.echo(f"stopped ctxwarden serve at {r.url} (pid {r.pid})", err=True)
        return
    if not command and not print_env:
        raise ConfigError("give the agent's command after --, e.g. ctxwarden wrap -- codex")
    if command and command[0].startswith("-"):  # a mistyped option of wrap's, not a command
        raise ConfigError(f"unknown option {command[0]!r}; the agent's command goes after --")
    run_id = AgentEnv.run_id(session)
    env = dict(os.environ)
    proxy = local_proxy(
        home,
        env,
        db=db,
        upstream=upstream,
        anthropic_upstream=anthropic_upstream,
        gemini_upstream=gemini_upstream,
        policy=policy,
        port=port,
    )
    for line in proxy.warnings:
        typer.echo(line, err=True)
    url = proxy.running.url
    agent = AgentEnv(url, proxy.key, run_id, session_header)
    how = "reused" if proxy.running.reused else "started"
    if print_env:
        typer.echo(f"# ctxwarden proxy {how} at {url} (stop: ctxwarden wrap --stop)")
        for line in export_lines(agent.variables()):
            typer.echo(line)
        return
    assert command  # (checked above)
    typer.echo(f"ctxwarden: proxy {how} at {url} (store {proxy.db}, tenant {LOCAL_TENANT})",
               err=True)  # fmt: skip
    since = time.time()
    code = _run(command, agent.apply(env))
    _report(proxy.db, LOCAL_TENANT, since, url, proxy.key_file)
    raise typer.Exit(code)


def _run(command: list[str], env: dict[str, str]) -> int:
    """Run the agent in the foreground and return its exit code (128 + N when a signal
    N ended it, 127 when it is not found). Ctrl-C reaches the agent (same process
    group); wrap waits for it to finish instead of dying first."""
    previous = signal.signal(signal.SIGINT, lambda *_: None)  # reset to default in the child
    try:
        proc = subprocess.run(command, env=env, check=False)
    except FileNotFoundError:
        typer.echo(f"error: command not found: {command[0]}", err=True)
        return 127
    except PermissionError:
        typer.echo(f"error: permission denied: {command[0]}", err=True)
        return 126
    finally:
        signal.signal(signal.SIGINT, previous)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _report(db: str, tenant: str, since: float, url: str, key_file: Path) -> None:
    from ctxwarden.local.report import run_report
    from ctxwarden.store import open_store

    with open_store(db) as store:
        report = run_report(store, tenant, since, url)
    for line in report.lines():
        typer.echo(line, err=True)
    if report.sessions:
        typer.echo(
            f"  (the pages ask for the local tenant's key, kept in {key_file})",
            err=True,
        )
