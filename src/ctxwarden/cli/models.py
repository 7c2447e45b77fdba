"""``ctxwarden models``: the model registry as a table (or JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ctxwarden.cli._common import RegistryOpt, registry_from
from ctxwarden.core.registry.catalog import ModelInfo


def models(
    registry: RegistryOpt = None,
    provider: Annotated[
        str | None, typer.Option("--provider", "-p", help="Only this provider's models.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
) -> None:
    """List known models: window, output limit, tokenizer and prices (USD per 1M tokens).

    Add or override models with a TOML file in the shape of
    ctxwarden/core/registry/models.toml, e.g.

        [models."my-llama"]
        provider = "ollama"
        context_window = 32768
        max_output_tokens = 8192
        estimator = "llama"
        price = { input = 0.0, output = 0.0 }

    and pass it with --registry or the CTXWARDEN_MODELS environment variable.

    An estimated model may carry its own measured factor (tokens per o200k_base
    token) that replaces its family's: estimate_factor = 1.46 for Claude Opus 4.7+.
    """
    rows = [m for m in registry_from(registry) if provider is None or m.provider == provider]
    if as_json:
        typer.echo(json.dumps([asdict(m) for m in rows], indent=2))
        return
    Console(width=120).print(_table(rows))


def _money(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _table(rows: list[ModelInfo]) -> Table:
    table = Table(title="ctxwarden models (prices: USD per 1M tokens)", title_justify="left")
    table.add_column("model", style="bold")
    table.add_column("provider")
    table.add_column("window", justify="right")
    table.add_column("max out", justify="right")
    table.add_column("tokenizer")
    for price in ("input", "cached", "cache write", "output"):
        table.add_column(price, justify="right")
    for m in rows:
        tiered = "*" if m.long_context else ""
        table.add_row(
            m.name,
            m.provider,
            f"{m.context_window:,}",
            f"{m.max_output_tokens:,}",
            m.tokenizer,
            _money(m.price.input) + tiered,
            _money(m.price.cached_input),
            _money(m.price.cache_write),
            _money(m.price.output) + tiered,
        )
    if any(m.long_context for m in rows):
        table.caption = "* a higher tier applies to long prompts (see models.toml)"
        table.caption_justify = "left"
    return table
