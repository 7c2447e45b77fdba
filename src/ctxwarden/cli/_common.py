"""What every command shares: one-line user errors (exit code 2), the ``--registry``
option and its loader, and reading a transcript."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console

from ctxwarden.core.errors import CtxwardenError, InvalidMessageError, UsageError
from ctxwarden.core.registry.catalog import Registry, load_registry
from ctxwarden.formats.transcript import Transcript, load_example, parse_transcript, read_transcript

P = ParamSpec("P")
R = TypeVar("R")

USER_ERROR = 2  # bad input or configuration: fix the call
RUNTIME_ERROR = 1  # the world failed: retrying may help


def handle_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Print a ctxwarden error as ``error: ...`` on stderr and exit; never a traceback.

    Bugs (any other exception) still raise: a traceback is the right report for those.
    """

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except CtxwardenError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(USER_ERROR if isinstance(exc, UsageError) else RUNTIME_ERROR) from None

    return wrapper


RegistryOpt = Annotated[
    list[Path] | None,
    typer.Option("--registry", help="TOML file adding or overriding models (repeatable)."),
]
"""``--registry FILE``: every command that resolves a model takes it, read by
:func:`registry_from` (a bad file is a one-line error, exit 2)."""


SummarizerTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--summarizer-timeout",
        help="Seconds a summariser call may take in all, retries included (provider specs).",
    ),
]


def summarizer_spec(spec: str | None, timeout: float | None) -> str | None:
    """``spec`` with ``--summarizer-timeout`` added as its ``timeout`` option (a later
    option wins, so it overrides one written in the spec)."""
    if spec is None or timeout is None:
        return spec
    from ctxwarden.llm.spec import check_timeout

    seconds = check_timeout(timeout, "--summarizer-timeout")
    return f"{spec}{'&' if '?' in spec else '?'}timeout={seconds:g}"


def registry_from(paths: list[Path] | None) -> Registry:
    """The default registry (with ``CTXWARDEN_MODELS``) plus ``--registry`` files."""
    return load_registry(paths or ())


def transcript_from(file: str | None, example: bool) -> Transcript:
    """A transcript from FILE, ``-`` / piped stdin, or the packaged example."""
    if example:
        if file is not None:
            raise InvalidMessageError("give either a transcript FILE or --example, not both")
        return load_example()
    if file is not None and file != "-":
        return read_transcript(file)
    text = sys.stdin.read() if file == "-" or not sys.stdin.isatty() else ""
    if not text.strip():
        raise InvalidMessageError(
            "no transcript: give a JSON FILE, '-' for stdin, or --example for the bundled one"
        )
    return parse_transcript(text, source="<stdin>")


#: Columns a table is laid out in when stdout is not a terminal (a pipe, a file, a CI log):
#: rich would take 80 and cut the cells of a wide table ("full+cac…").
PIPED_WIDTH = 160


def stdout_console() -> Console:
    """The console a command prints its tables to: the terminal's width, or
    :data:`PIPED_WIDTH` columns when stdout is not a terminal (``COLUMNS`` still wins)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPED_WIDTH)
