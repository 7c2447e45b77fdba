"""The ``ctxwarden`` command: one Typer app, one module per command.

This file only builds the app and registers commands from :mod:`ctxwarden.cli`;
a new command is a module there plus one ``_register`` line here. Every command runs
inside :func:`~ctxwarden.cli._common.handle_errors`, so a user mistake prints one
``error: ...`` line on stderr and exits with code 2, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from ctxwarden._version import __version__
from ctxwarden.cli import bench, build, count, mcp, models, serve, tune, worker, wrap
from ctxwarden.cli._common import handle_errors

app = typer.Typer(
    name="ctxwarden",
    help="Keep a long-running LLM agent's context window small, cheap and faithful.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # docstrings and help are Markdown: hard-wrapped lines reflow, [brackets] stay as typed
    rich_markup_mode="markdown",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ctxwarden {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Keep a long-running LLM agent's context window small, cheap and faithful."""


def _register(name: str, command: Callable[..., Any], **settings: Any) -> None:
    app.command(name, **settings)(handle_errors(command))


_register("count", count.count)
_register("models", models.models)
_register("build", build.build)
_register("explain", build.explain)
_register("bench", bench.bench)
_register("serve", serve.serve)
_register("worker", worker.worker)
# wrap passes the agent's own options (after --, or unknown to wrap) through as COMMAND
_register("wrap", wrap.wrap, context_settings={"ignore_unknown_options": True})
_register("mcp", mcp.mcp)
_register("tune", tune.tune)
app.add_typer(serve.tenant_app, name="tenant")

from ctxwarden.cli.session import session_app  # noqa: E402  (needs the registered app above)

app.add_typer(session_app, name="session")


def main() -> None:
    """Console-script entry point (``ctxwarden = ctxwarden.cli.main:main``)."""
    app()
