"""``ctxwarden count``: tokens of a transcript for a model, exact or estimated."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ctxwarden.cli._common import RegistryOpt, registry_from, transcript_from
from ctxwarden.core.registry.catalog import ModelInfo
from ctxwarden.core.tokens.counter import TokenCount, TokenCounter
from ctxwarden.formats.transcript import Transcript

DEFAULT_MODEL = "gpt-4o"


def count(
    file: Annotated[
        str | None,
        typer.Argument(
            metavar="FILE", help="Transcript JSON file ('-' for stdin).", show_default=False
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help=f"Model to count for (default: the file's 'model', else {DEFAULT_MODEL}).",
        ),
    ] = None,
    example: Annotated[
        bool, typer.Option("--example", help="Count the support chat shipped with ctxwarden.")
    ] = False,
    registry: RegistryOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Count the input tokens of a transcript: a JSON list of OpenAI chat messages, or an
    object with 'messages' and optional 'tools' (a chat-completions request body)."""
    transcript = transcript_from(file, example)
    models = registry_from(registry)
    name = model or transcript.model or DEFAULT_MODEL
    # the registry's entry when it has one (a --registry model included), else the name's
    # family; neither: the registry's error, with the nearest names
    counter = TokenCounter.for_model(name, registry=models)
    info = models.get(name) if name in models else None
    result = counter.count_messages(transcript.messages, list(transcript.tools) or None)
    report = _report(transcript.source, name, info, result, transcript)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(_human(report))


def _report(
    source: str, name: str, info: ModelInfo | None, result: TokenCount, transcript: Transcript
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "source": source,
        "model": info.name if info else name,
        "provider": info.provider if info else None,
        "messages": len(transcript.messages),
        "tool_calls": sum(len(m.tool_calls) for m in transcript.messages),
        "tool_definitions": len(transcript.tools),
        "tokens": result.tokens,
        "exact": result.exact,
        "encoding": result.encoding,
        "method": result.method,
        "context_window": info.context_window if info else None,
        "window_fraction": round(result.tokens / info.context_window, 6) if info else None,
        "input_cost_usd": None,
    }
    if info is not None:
        report["input_cost_usd"] = round(
            result.tokens * info.price_for(result.tokens).input / 1e6, 8
        )
    return report


def _human(r: dict[str, Any]) -> str:
    provider = f" ({r['provider']})" if r["provider"] else " (not in the registry)"
    how = "exact" if r["exact"] else "estimate"
    if not r["exact"] and r["method"].startswith("openai"):
        how += " (tool calls, tool definitions or images by ctxwarden's documented method)"
    lines = [
        f"{r['source']} · {r['model']}{provider}",
        f"  {r['messages']} messages, {r['tool_calls']} tool calls, "
        f"{r['tool_definitions']} tool definitions",
        f"  {r['tokens']:,} tokens, {how}",
        f"  counted with {r['encoding']}, method {r['method']}",
    ]
    if r["context_window"]:
        lines.append(f"  {r['window_fraction']:.1%} of the {r['context_window']:,}-token window")
    if r["input_cost_usd"] is not None:
        lines.append(f"  ${r['input_cost_usd']:.4f} to send once as uncached input")
    return "\n".join(lines)
