"""``ctxwarden mcp``: the recall and search tools as an MCP server over stdio
(:mod:`ctxwarden.mcp`)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["mcp"]


def mcp(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="CTXWARDEN_DB",
            help="Store URL (default: the store ctxwarden wrap uses, in its data dir).",
        ),
    ] = None,
    tenant: Annotated[
        str,
        typer.Option("--tenant", envvar="CTXWARDEN_TENANT", help="Whose sessions to read."),
    ] = "local",
) -> None:
    """Serve ctxwarden_recall (a cw:msg: handle's original, byte for byte) and
    ctxwarden_search (the session's dropped history by words, BM25) over stdio, for an
    agent to start: claude mcp add ctxwarden -- ctxwarden mcp. Over HTTP the service
    serves the same tools at /mcp."""
    from ctxwarden.mcp.stdio import run_stdio

    if db is None:
        from ctxwarden.local.home import Home

        db = Home.at().db
    run_stdio(db, tenant)
