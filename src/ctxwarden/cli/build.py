"""``ctxwarden build`` and ``ctxwarden explain``: the engine from the shell.

``build`` reads a transcript and writes the context to send (OpenAI messages, or
``--format anthropic``) to stdout, and the audit to ``--report``. ``explain`` builds the
same way (or reads a saved report) and prints the audit as tables; then it replays the
transcript as an agent loop (a build before every assistant message, each with the one
before as ``previous``) and prints the loop's input cost at the model's cache prices
against the full history with caching, and what its last build shares with the build
before and what breaking that prefix cost, and the policy's cascade: its steps in order,
those that do not run for it struck through.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ctxwarden.cli._common import (
    RegistryOpt,
    SummarizerTimeoutOpt,
    registry_from,
    stdout_console,
    summarizer_spec,
    transcript_from,
)
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.pipeline.cascade import REQUIRED, USER_STEPS, as_step, steps_for
from ctxwarden.pipeline.compaction import LoopReplay, replay_loop
from ctxwarden.pipeline.engine import BuiltContext, build_context, model_info
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
    loop: bool = False,
) -> tuple[BuiltContext, LoopReplay | None]:
    """The build of the transcript (what ``build`` sends: one build, no previous); with
    ``loop`` (and no model summariser: it would be called at every step), also the
    transcript replayed as an agent loop, whose last build has a previous one, and the
    loop's cost at cache prices."""
    transcript = transcript_from(file, example)
    policy = Policy.from_toml(policy_path) if policy_path else Policy()
    if policy_path is not None and not policy_path.exists():
        raise ConfigError(f"policy file not found: {policy_path}")
    kwargs: dict[str, Any] = {}
    if summarizer is not None:
        kwargs["summarizer"] = summarizer
    reg = registry_from(registry)
    tools = list(transcript.tools) or None

    def one(history: Sequence[Message], previous: BuiltContext | None) -> BuiltContext:
        return build_context(
            history,
            model,
            budget,
            policy=policy,
            tools=tools,
            registry=reg,
            previous=previous,
            **kwargs,
        )

    built = one(transcript.messages, None)
    if not loop or summarizer not in (None, "offline"):
        return built, None
    counter = TokenCounter.for_model(model, reg)
    prices = policy.cache.prices_for(model_info(model, reg))
    replay = replay_loop(transcript.messages, build=one, count=counter.count_message, prices=prices)
    return built, replay


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
    built, _ = _build(file, model, max_input_tokens, policy, spec, example, registry)
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
        built, replay = _build(
            file, model, max_input_tokens, policy, spec, example, registry, loop=True
        )
        audit = built.audit.to_dict()
    console = stdout_console()
    render_audit(audit, console)
    if from_report is None and replay is not None:
        console.print(
            f"as an agent loop ({replay.cost.calls} builds, one before every assistant "
            f"message): input cost at {replay.prices.label} "
            f"{replay.cost_vs_full:.0%} of the full history with caching; "
            f"{replay.cost.whole_prefix_share:.0%} of builds kept the previous context whole"
        )
        _render_prefix(replay.built.audit.to_dict(), console, "its last build")
    if from_report is None:
        chosen = Policy.from_toml(policy) if policy is not None else Policy()
        render_cascade(chosen, console)
        render_tool_rules(chosen, console)


def render_cascade(policy: Policy, console: Console) -> None:
    """Print the policy's cascade (``cascade = [...]``): the steps in the order they run,
    each user step under its name, a step this policy turns off struck through."""
    runs = [step.name for step in steps_for(policy)]
    shown: list[str] = []
    for name in policy.cascade:
        if name == USER_STEPS:
            placed = set(policy.cascade)
            own = [as_step(s).name for s in policy.steps]
            mine = [f"{escape(n)} (steps)" for n in own if n not in placed or n in REQUIRED]
            shown.extend(mine or [f"[strike]{USER_STEPS}[/] (none)"])
        elif name in runs:
            shown.append(escape(name))
        else:
            shown.append(f"[strike]{escape(name)}[/] (off)")
    console.print("cascade: " + " → ".join(shown))


def render_tool_rules(policy: Policy, console: Console) -> None:
    """Print the policy's per-tool rules (``[tools.NAME]``), as each tool gets them."""
    if not policy.tools:
        return
    table = Table(title=escape('Tool rules ([tools.NAME]; "*": every tool)'))
    table.add_column("tool")
    table.add_column("as written")
    table.add_column("applied")
    for name, rule in policy.tools.rules:
        applied = policy.tools.for_tool(name).describe()
        table.add_row(escape(name), escape(rule.describe()), escape(applied))
    console.print(table)


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
    _render_prefix(audit, console)
    for warning in audit["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")


def _render_prefix(audit: dict[str, Any], console: Console, who: str = "prefix") -> None:
    """The prefix shared with the previous build, and what breaking it cost (nothing for
    a build without a previous one)."""
    shared = audit.get("prefix_shared_tokens", 0)
    broken = audit.get("prefix_break")
    if not shared and broken is None:
        return
    line = f"{who}: {shared:,} of {audit['input_tokens']:,} tokens shared with the previous build"
    if broken is None:
        console.print(line + ("; the previous context kept whole" if shared else ""))
        return
    usd = broken.get("cost_usd")
    console.print(
        f"{line}; prefix broken at message {broken['at']} ({broken['cause']}): "
        f"{broken['rewritten_tokens']:,} tokens rewritten, costing "
        f"{broken['cost_units']:,.0f} input tokens' worth more than reading them"
        + (f" (${usd:.5f})" if usd is not None else "")
    )
