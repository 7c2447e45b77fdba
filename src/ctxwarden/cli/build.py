"""``ctxwarden build`` and ``ctxwarden explain``: the engine from the shell.

``build`` reads a transcript and writes the context to send (OpenAI messages, or
``--format anthropic``) to stdout, and the audit to ``--report``. ``explain`` builds the
same way (or reads a saved report) and prints the audit as tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ctxwarden.cli._common import (
    RegistryOpt,
    SummarizerTimeoutOpt,
    registry_from,
    summarizer_spec,
    transcript_from,
)
from ctxwarden.core.errors import ConfigError
from ctxwarden.pipeline.engine import BuiltContext, build_context
from ctxwarden.pipeline.policy import Policy

PolicyOpt = Annotated[Path | None, typer.Option("--policy", help="Policy TOML file.")]
BudgetOpt = Annotated[
    int | None, typer.Option("--max-input-tokens", "-b", help="Input-token budget.")
]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model the context is for.")]
FileArg = Annotated[
    str | None, typer.Argument(metavar="FILE", help="Transcript JSON ('-' for stdin).")
]
SummarizerOpt = Annotated[
    str | None,
    typer.Option(
        "--summarizer", help="Add summary and facts layers: 'offline' or a provider spec."
    ),
]


def _build(
    file: str | None,
    model: str,
    budget: int | None,
    policy_path: Path | None,
    summarizer: str | None,
    example: bool = False,
    registry: list[Path] | None = None,
) -> BuiltContext:
    transcript = transcript_from(file, example)
    policy = Policy.from_toml(policy_path) if policy_path else Policy()
    if policy_path is not None and not policy_path.exists():
        raise ConfigError(f"policy file not found: {policy_path}")
    kwargs: dict[str, Any] = {}
    if summarizer is not None:
        kwargs["summarizer"] = summarizer
    return build_context(
        transcript.messages,
        model,
        budget,
        policy=policy,
        tools=list(transcript.tools) or None,
        registry=registry_from(registry),
        **kwargs,
    )


def build(
    file: FileArg = None,
    model: ModelOpt = "gpt-4o",
    max_input_tokens: BudgetOpt = None,
    policy: PolicyOpt = None,
    summarizer: SummarizerOpt = None,
    summarizer_timeout: SummarizerTimeoutOpt = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write the audit JSON to this file.")
    ] = None,
    output_format: Annotated[
        str, typer.Option("--format", help="openai (a message list) or anthropic.")
    ] = "openai",
    example: Annotated[bool, typer.Option("--example", help="Use the bundled transcript.")] = False,
    registry: RegistryOpt = None,
) -> None:
    """Build the context to send from a transcript; print it as JSON."""
    if output_format not in ("openai", "anthropic"):
        raise ConfigError(f"--format must be openai or anthropic, got {output_format!r}")
    spec = summarizer_spec(summarizer, summarizer_timeout)
    built = _build(file, model, max_input_tokens, policy, spec, example, registry)
    if output_format == "openai":
        payload: Any = built.to_openai()
    else:
        system, messages = built.to_anthropic()
        payload = {"system": system, "messages": messages}
    if report is not None:
        report.write_text(json.dumps(built.audit.to_dict(), indent=2), encoding="utf-8")
    typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))


def explain(
    file: FileArg = None,
    model: ModelOpt = "gpt-4o",
    max_input_tokens: BudgetOpt = None,
    policy: PolicyOpt = None,
    summarizer: SummarizerOpt = None,
    summarizer_timeout: SummarizerTimeoutOpt = None,
    from_report: Annotated[
        Path | None, typer.Option("--from-report", help="Explain a saved --report file instead.")
    ] = None,
    example: Annotated[bool, typer.Option("--example", help="Use the bundled transcript.")] = False,
    registry: RegistryOpt = None,
) -> None:
    """Build (or load) a context and print its audit as readable tables."""
    if from_report is not None:
        try:
            audit = json.loads(from_report.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read report {from_report}: {exc}") from None
    else:
        spec = summarizer_spec(summarizer, summarizer_timeout)
        built = _build(file, model, max_input_tokens, policy, spec, example, registry)
        audit = built.audit.to_dict()
    render_audit(audit, Console())


def render_audit(audit: dict[str, Any], console: Console) -> None:
    """Print an audit dict: the summary line, tokens per layer, actions, warnings."""
    fill = audit.get("fill_ratio")
    console.print(
        f"[bold]{audit['model']}[/]: {audit['input_tokens']:,} of {audit['budget']:,} tokens "
        f"({audit['budget_ratio']:.0%} of budget"
        + (f", {fill:.1%} of the window)" if fill is not None else ")")
        + f"; {audit['kept_messages']} messages sent from a history of {audit['history_messages']}"
    )
    layers = Table(title="Tokens per layer")
    layers.add_column("layer")
    layers.add_column("tokens", justify="right")
    for name, tokens in audit["layers"].items():
        layers.add_row(name, f"{tokens:,}")
    console.print(layers)
    if audit["actions"]:
        actions = Table(title=f"What was done ({audit['tokens_saved']:,} tokens saved)")
        for col in ("message", "action", "by", "tokens before → after", "why"):
            actions.add_column(col)
        for a in audit["actions"]:
            actions.add_row(
                a["message_id"],
                a["action"],
                a["strategy"],
                f"{a['tokens_before']:,} → {a['tokens_after']:,}",
                a["reason"],
            )
        console.print(actions)
    cost = audit.get("estimated_cost_usd")
    if cost is not None:
        console.print(
            f"cost: ${cost:.5f} uncached, ${audit['effective_cost_usd']:.5f} with the shared "
            f"prefix cached; cacheable prefix {audit['cacheable_prefix_tokens']:,} tokens; "
            f"prompt_cache_key {audit['prompt_cache_key']}"
        )
    for warning in audit["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
