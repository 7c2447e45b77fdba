"""``ctxwarden bench``: run every scenario, then write report.json, report.md and plots.

:func:`run_bench` is what the CLI calls. Every number in the report is computed in that
invocation (no stored figures). By default the scenarios are offline and deterministic;
the real traces run when their files are given (:func:`default_trace_paths` finds the
project's ``../shared/data`` layout). ``summarizer`` (a provider spec) makes every
strategy's summaries and facts real, LoCoMo's included; ``agent_model`` replaces the
scripted laptop-shop agent with a real one. The report names both.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxwarden_bench.metrics import StrategyRun
from ctxwarden_bench.retention import sawtooth_builder
from ctxwarden_bench.summarizers import BenchSummarizer, SummarizerSpec, summarizer_for
from ctxwarden_bench.traces import (
    engine_builder,
    load_locomo,
    load_tau_bench,
    locomo_recall,
    plain_builder,
    tau_retention,
)

__all__ = ["default_trace_paths", "render_markdown", "run_bench", "write_plots"]

Progress = Callable[[str], None] | None
TAU_BUDGETS = (2000, 4000, 1600)
SWEBENCH_BUDGETS = (4000, 8000)
LOCOMO_BUDGET = 4000
LOCOMO_PATH_QUESTIONS = 5
SESSION_ROW = "ctxwarden (session)"
"""The row built through a stored Session (append, build before each call): the
service's path, which must equal the in-memory agent-loop row."""
SERVED_NOT_RUN = (
    "needs a job broker: pass --broker redis://HOST:6379/N (ctxwarden serve enqueues the "
    "summary, ctxwarden worker folds it)"
)
"""Why the LoCoMo ``serve + worker`` row is missing from a run without a broker."""
SWEBENCH_FILE = Path("swebench-mini") / "swebench-verified-mini-gemini3-dev.json"


def default_trace_paths(
    root: str | Path = "..",
) -> tuple[Path | None, Path | None, Path | None]:
    """``(tau_bench, locomo, swebench)`` files under ``<root>/shared/data`` when they exist."""
    base = Path(root) / "shared" / "data"
    tau = base / "tau-bench" / "airline-gpt-4o-dev.json"
    loc = base / "locomo" / "locomo-dev.json"
    swe = base / SWEBENCH_FILE
    return tuple(p if p.exists() else None for p in (tau, loc, swe))  # type: ignore[return-value]


def _scenario_json(result: Mapping[str, Any]) -> dict[str, Any]:
    runs: Mapping[str, StrategyRun] = result["runs"]
    out = {k: v for k, v in result.items() if k != "runs"}
    out["strategies"] = {name: run.to_json() for name, run in runs.items()}
    return out


def _priced(r: dict[str, Any]) -> dict[str, Any]:
    from ctxwarden.core.registry.cost import estimate_cost
    from ctxwarden.core.registry.usage import Usage

    r["cost_usd"] = r["effective_cost_usd"] = round(
        estimate_cost(Usage(input_tokens=r["total_input_tokens"]), "gpt-4o"), 6
    )
    return r


def _tau(path: Path, progress: Progress, peers: bool) -> dict[str, Any]:

    runs = load_tau_bench(path)
    strategies: dict[str, Any] = {}
    for budget in TAU_BUDGETS:
        with _session_builder() as session:
            builders = {
                "plain window": plain_builder(),
                "sawtooth window": sawtooth_builder(),
                "ctxwarden (agent loop)": engine_builder(),
                SESSION_ROW: session,
                "ctxwarden (cold builds)": engine_builder(loop=False),
                **_peer_builders(peers),
            }
            for name, builder in builders.items():
                r = tau_retention(runs, budget, builder, progress=progress).to_json()
                strategies[f"{name} @{budget}"] = _priced(_with_errors(r, builder))
    return {
        "description": "tau-bench airline: at every tool call, the share of its argument "
        "values (>= 3 characters) seen earlier that are still in the built context, per "
        "value; ids: the user, reservation, flight and payment ids among them (gpt-4o "
        "counts, default policy).",
        "file": str(path),
        "strategies": strategies,
    }


def _swebench(path: Path, progress: Progress, peers: bool) -> dict[str, Any]:
    from ctxwarden_bench.swebench import load_swebench, swebench_retention

    runs = load_swebench(path)
    strategies: dict[str, Any] = {}
    for budget in SWEBENCH_BUDGETS:
        with _session_builder() as session:
            builders = {
                "plain window": plain_builder(),
                "sawtooth window": sawtooth_builder(),
                "ctxwarden (agent loop)": engine_builder(),
                SESSION_ROW: session,
                **_peer_builders(peers),
            }
            for name, builder in builders.items():
                r = swebench_retention(runs, budget, builder, progress=progress).to_json()
                strategies[f"{name} @{budget}"] = _priced(_with_errors(r, builder))
    return {
        "description": "swebench-mini (a bash coding agent): at every command, the share of "
        "its needed-later tokens (paths, dotted names, identifiers seen earlier; data "
        "README section 3) still in the built context (gpt-4o counts, default policy).",
        "file": str(path),
        "strategies": strategies,
    }


def _peer_builders(peers: bool) -> dict[str, Any]:
    """Fresh peer builders (one set per budget, so their error counts are per row)."""
    if not peers:
        return {}
    from ctxwarden_bench.peers import peer_builders

    return dict(peer_builders())


def _with_errors(row: dict[str, Any], builder: Any) -> dict[str, Any]:
    """A row also says how often its builder raised (a peer: the history was then sent
    as is; ctxwarden: a BudgetError, the plain window sent instead)."""
    if hasattr(builder, "errors"):
        row["errors"] = builder.errors
        row["error_examples"] = list(builder.error_examples)
    return row


@contextmanager
def _session_builder() -> Iterator[Any]:
    """A :class:`~ctxwarden_bench.session_path.SessionBuilder` on a fresh SQLite file:
    the service's path (one stored session per run, built before each call)."""
    from ctxwarden_bench.session_path import SessionBuilder

    with tempfile.TemporaryDirectory() as tmp, SessionBuilder(f"sqlite:///{tmp}/bench.db") as b:
        yield b


def _locomo_paths(
    convs: list[dict[str, Any]],
    progress: Progress,
    *,
    broker: str | None = None,
    served_db: str | None = None,
    questions: int = LOCOMO_PATH_QUESTIONS,
) -> dict[str, Any]:
    """The first ``questions`` (:data:`LOCOMO_PATH_QUESTIONS`) questions of each
    conversation asked of the whole transcript, in memory and through a session
    (append → summarize_sync → build), with the offline summariser: recall, fill, and
    contexts equal. With a ``broker`` (Redis URL) also through ``ctxwarden serve`` +
    ``ctxwarden worker`` (:class:`~ctxwarden_bench.served_path.ServedPath`, on
    ``served_db`` or a temporary SQLite file); without one, ``not_run`` says why that
    row is missing."""
    from ctxwarden_bench.served_path import SERVED_ROW, ServedPath
    from ctxwarden_bench.session_path import LoCoMoPath, locomo_paths, session_locomo_path

    not_run: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as started:
        paths: dict[str, LoCoMoPath] = {
            "session": session_locomo_path(f"sqlite:///{tmp}/locomo.db")
        }
        if broker:
            paths[SERVED_ROW] = started.enter_context(ServedPath(broker, served_db)).path
        else:
            not_run[SERVED_ROW] = SERVED_NOT_RUN
        rows = locomo_paths(
            convs,
            LOCOMO_BUDGET,
            paths=paths,
            questions=questions,
            progress=progress,
        )
    served = " and as a client of ctxwarden serve + ctxwarden worker" if broker else ""
    return {
        "description": f"the first {questions} questions of each conversation, "
        'each asked of the whole transcript: build_context(summarizer="offline"), a '
        f"session's append → summarize_sync → build{served} (default policy, "
        f"{LOCOMO_BUDGET:,} tokens); each path must send the in-memory context",
        "rows": rows,
        "not_run": not_run,
    }


def _locomo(
    path: Path,
    progress: Progress,
    summarizer: BenchSummarizer,
    *,
    broker: str | None = None,
    served_db: str | None = None,
) -> dict[str, Any]:
    from ctxwarden.core.registry.cost import estimate_cost
    from ctxwarden.core.registry.usage import Usage

    convs = load_locomo(path)
    result = locomo_recall(
        convs,
        LOCOMO_BUDGET,
        progress=progress,
        summarizer=summarizer if summarizer.real else None,
    )
    for r in result.values():
        r["cost_usd"] = r["effective_cost_usd"] = round(
            estimate_cost(Usage(input_tokens=r["total_input_tokens"]), "gpt-4o")
            + r.get("summarizer_cost_usd", 0.0),
            6,
        )
    out = {
        "description": f"LoCoMo: answer recall of each question's context at "
        f"{LOCOMO_BUDGET:,} tokens (gpt-4o counts); ctxwarden's summaries by "
        f"{result['ctxwarden']['summarizer']}.",
        "file": str(path),
        "strategies": result,
    }
    if not summarizer.real:  # the service's path, beside the in-memory one
        out["paths"] = _locomo_paths(convs, progress, broker=broker, served_db=served_db)
    return out


def run_bench(
    out_dir: str | Path = "ctxwarden-report",
    *,
    tau_bench: str | Path | None = None,
    locomo: str | Path | None = None,
    swebench: str | Path | None = None,
    peers: bool = False,
    summarizer: SummarizerSpec = "offline",
    agent_model: Any = None,
    progress: Progress = None,
    laptop_turns: int | None = None,
    chat_rounds: int | None = None,
    sampled: Mapping[str, str] | None = None,
    broker: str | None = None,
    served_db: str | None = None,
) -> dict[str, Any]:
    """Run the scenarios (and the traces given), write the report files, return the report.

    ``summarizer`` is ``"offline"``, a provider spec or a model object (see
    :func:`~.summarizers.get_summarizer`); ``agent_model`` an OpenAI-compatible spec or
    client for laptop-shop's agent. Both are built before anything runs, so a bad spec
    or a missing key fails at once. ``progress`` receives a short label after each step.
    ``peers`` adds litellm's and headroom-ai's compressors to the trace tables (needs
    ``pip install -e ".[peers]"``). ``laptop_turns`` / ``chat_rounds`` shorten the
    scenarios (a quick try of a paid model; the seeds' targets hold only for the full
    21 turns and 50 rounds). ``sampled`` names the traces that ran on a shipped sample
    rather than the full data, with a note the report prints (see :mod:`.sample`).
    ``broker`` (a Redis URL) adds LoCoMo's ``serve + worker`` path row: ``ctxwarden
    serve`` and ``ctxwarden worker`` started as processes on ``served_db`` (default: a
    temporary SQLite file); without it the report says that row was not run and why.
    """
    from ctxwarden_bench.scenarios_agent_chat import ROUNDS, run_agent_chat
    from ctxwarden_bench.scenarios_laptop import laptop_agent, run_laptop

    out = Path(out_dir)
    with summarizer_for(summarizer) as summ:
        agent = laptop_agent(agent_model)
        try:
            out.mkdir(parents=True, exist_ok=True)
            laptop = run_laptop(
                summarizer=summ, agent_model=agent, turns=laptop_turns, progress=progress
            )
            chat = run_agent_chat(summarizer=summ, rounds=chat_rounds or ROUNDS, progress=progress)
            report: dict[str, Any] = {
                "summarizer": summ.describe(),
                "agent": laptop["agent"],
                "scenarios": {
                    "laptop-shop": _scenario_json(laptop),
                    "agent-chat": _scenario_json(chat),
                },
                "skipped": {},
            }
            if sampled:
                report["sampled"] = dict(sampled)
            if tau_bench is None:
                report["skipped"]["tau-bench"] = "no data file; pass --tau-bench PATH to run it"
            else:
                report["scenarios"]["tau-bench"] = _tau(Path(tau_bench), progress, peers)
            if swebench is None:
                report["skipped"]["swebench-mini"] = "no data file; pass --swebench PATH to run it"
            else:
                report["scenarios"]["swebench-mini"] = _swebench(Path(swebench), progress, peers)
            if locomo is None:
                report["skipped"]["locomo"] = "no data file; pass --locomo PATH to run it"
            else:
                report["scenarios"]["locomo"] = _locomo(
                    Path(locomo), progress, summ, broker=broker, served_db=served_db
                )
        finally:
            if agent is not None and agent is not agent_model:
                agent.close()
    (out / "report.json").write_text(json.dumps(report, indent=2), "utf-8")
    plots = write_plots(report, out)
    (out / "report.md").write_text(render_markdown(report, plots), "utf-8")
    return report


# -- Markdown ---------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(report: Mapping[str, Any], plots: Mapping[str, str] | None = None) -> str:
    """The report's tables as Markdown (the seed's layouts)."""
    sc = report["scenarios"]
    parts = ["# ctxwarden bench report", "", *_setup_lines(report)]
    lap = sc["laptop-shop"]
    turns = sorted({int(t) for row in lap["table"].values() for t in row})
    parts += ["## laptop-shop (seed 003)", "", lap["description"], ""]
    parts.append(
        _table(
            ["strategy", *[f"turn {t}" for t in turns]],
            [
                [name] + [f"{row[t]['tokens']:,} ({row[t]['pct_of_baseline']:.1f}%)" for t in turns]
                for name, row in lap["table"].items()
            ],
        )
    )
    parts += [
        "",
        f"Facts layer holds budget and use from turn 2: {lap['facts_held_each_turn_from_2']}",
    ]
    if lap.get("agent", "scripted") != "scripted":
        parts += ["", *_agent_table(lap)]
    chat = sc["agent-chat"]
    parts += ["", "## agent-chat (seed 000)", "", chat["description"], ""]
    parts.append(
        _table(
            ["strategy", "input tokens", "cost", "with caching", "% of none", "facts lost"],
            [
                [
                    name,
                    f"{s['total_input_tokens']:,}",
                    f"${s['cost_usd']:.2f}",
                    f"${s['effective_cost_usd']:.2f}",
                    f"{100 * chat['share_of_none'][name]:.1f}%",
                    ", ".join(s["facts_lost"]) or "none",
                ]
                for name, s in chat["strategies"].items()
            ],
        )
    )
    for key in ("tau-bench", "swebench-mini"):
        if key in sc:
            parts += ["", f"## {key}", "", sc[key]["description"], "", _retention_table(sc[key])]
    if "locomo" in sc:
        parts += ["", "## locomo", "", sc["locomo"]["description"], ""]
        parts.append(
            _table(
                ["strategy", "answer recall", "reduction", *_CACHE_COLUMNS, "input tokens"],
                [
                    [
                        name,
                        f"{s['answer_recall']:.3f}",
                        f"{100 * s['reduction']:.1f}%",
                        *_cache_cells(s),
                        f"{s['total_input_tokens']:,}",
                    ]
                    for name, s in sc["locomo"]["strategies"].items()
                ],
            )
        )
        if "paths" in sc["locomo"]:
            parts += ["", *_paths_lines(sc["locomo"]["paths"])]
    failures = [
        f"{key} / {name}: {s['summarizer_failures']} ({'; '.join(s.get('summarizer_errors', []))})"
        for key, scenario in sc.items()
        for name, s in scenario["strategies"].items()
        if s.get("summarizer_failures")
    ]
    if failures:
        parts += ["", "Summariser calls that failed (messages kept, the window used instead):"]
        parts += [f"- {line}" for line in failures]
    for name, note in report.get("sampled", {}).items():
        parts += ["", f"_{name} {note}_"]
    for name, note in report.get("skipped", {}).items():
        parts += ["", f"_{name} skipped: {note}_"]
    for title, file in (plots or {}).items():
        parts += ["", f"![{title}]({file})"]
    return "\n".join(parts) + "\n"


def _paths_lines(paths: Mapping[str, Any]) -> list[str]:
    """LoCoMo's paths table (one row per path, the in-memory one first) and the rows
    not run, each with its reason."""
    rows = [
        [
            name,
            f"{r['same_as_build_context']} of {r['questions']}"
            if "same_as_build_context" in r
            else "(the reference)",
            f"{r['answer_recall']:.3f}",
            f"{100 * r['fill']:.1f}%",
        ]
        for name, r in paths["rows"].items()
    ]
    lines = [
        "Paths: " + paths["description"],
        "",
        _table(["path", "same context as build_context", "answer recall", "fill"], rows),
    ]
    for name, why in paths.get("not_run", {}).items():
        lines += ["", f"_{name} not run: {why}_"]
    return lines


_CACHE_COLUMNS = (
    "cost vs full+cache",
    "vs full+cache (OpenAI-style)",
    "vs full+cache (model's prices)",
    "vs sawtooth",
    "whole-prefix calls",
)
"""The cache-price columns of every retention row (R21): the row's effective input cost
as an agent loop sends it (a build before every assistant message) at Anthropic's
0.1x / 1.25x, against the full history with caching; the same at OpenAI-style 0.1x / 1x
and at the bench model's own prices (those the default policy weighs its rewrites at);
against the plain sawtooth window (Anthropic prices); and the share of calls whose
previous context is a whole prefix (:class:`~ctxwarden_bench.retention.LoopCost`)."""


def _cache_cells(row: Mapping[str, Any]) -> list[str]:
    if "cache_cost_vs_full" not in row:
        return ["n/a"] * len(_CACHE_COLUMNS)
    return [
        f"{100 * row['cache_cost_vs_full']:.0f}%",
        f"{100 * row['cache_cost_vs_full_openai']:.0f}%",
        f"{100 * row.get('cache_cost_vs_full_model', 0):.0f}%",
        f"{100 * row['cache_cost_vs_sawtooth']:.0f}%",
        f"{100 * row['whole_prefix_share']:.0f}%",
    ]


def _retention_table(scenario: Mapping[str, Any]) -> str:
    """Retention rows: every needed value, the id subset (tau-bench) or the names
    (swebench-mini: :func:`~ctxwarden_bench.swebench.group_of`), reduction, and the
    invariant and budget checks of the same builds."""
    rows = scenario["strategies"]
    ids = any("retention_ids" in s for s in rows.values())
    names = any("retention_names" in s for s in rows.values())
    header = ["strategy", "retention", *(["ids"] if ids else []), *(["names"] if names else [])]
    header.append("reduction")
    header += [*_CACHE_COLUMNS, "violations", "newest dropped", "over budget", "errors"]
    header.append("input tokens")
    return _table(
        header,
        [
            [
                name,
                f"{100 * s['retention']:.1f}%",
                *([f"{100 * s.get('retention_ids', 0):.1f}%"] if ids else []),
                *([f"{100 * s.get('retention_names', 0):.1f}%"] if names else []),
                f"{100 * s['reduction']:.1f}%",
                *_cache_cells(s),
                str(s["violations"]),
                str(s.get("newest_dropped", 0)),
                str(s["over_budget"]),
                str(s.get("errors", 0)),
                f"{s['total_input_tokens']:,}",
            ]
            for name, s in rows.items()
        ],
    )


def _setup_lines(report: Mapping[str, Any]) -> list[str]:
    """Which summariser and which laptop-shop agent produced the numbers."""
    summ = report.get("summarizer")
    if not summ:
        return []
    kind = "a model" if summ["real_model"] else "no model"
    return [
        f"Summariser: **{summ['name']}** ({kind}; {summ['pricing']}).",
        f"laptop-shop agent: **{report.get('agent', 'scripted')}**.",
        "",
    ]


def _agent_table(lap: Mapping[str, Any]) -> list[str]:
    """The real agent's own figures: requests, provider-reported tokens, cost."""
    rows = []
    for name, s in lap["strategies"].items():
        cost = s.get("agent_cost_usd")
        rows.append(
            [
                name,
                str(s["agent_requests"]),
                str(s["agent_tool_calls"]),
                str(s["agent_unanswered_turns"]),
                f"{sum(s['provider_input_tokens_per_turn']):,}",
                f"{s['total_input_tokens']:,}",
                f"{s['agent_input_tokens']:,}",
                "n/a" if cost is None else f"${cost:.4f}",
            ]
        )
    header = [
        "strategy",
        "requests",
        "tool calls",
        "unanswered",
        "answering prompts (provider)",
        "(our count)",
        "all prompts (provider)",
        "agent cost",
    ]
    return [
        f"Real agent {lap['agent']}, each strategy its own conversation:",
        "",
        _table(header, rows),
    ]


# -- plots ------------------------------------------------------------------------------------


def write_plots(report: Mapping[str, Any], out: Path) -> dict[str, str]:
    """One PNG of input tokens per turn for each scenario, and agent-chat dollars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    files: dict[str, str] = {}
    for key, xlabel in (("laptop-shop", "turn"), ("agent-chat", "round")):
        strategies = report["scenarios"][key]["strategies"]
        fig, ax = plt.subplots(figsize=(9, 5))
        colours = plt.get_cmap("tab10")
        for i, (name, s) in enumerate(strategies.items()):
            series = s["input_tokens_per_turn"]
            ax.plot(
                range(1, len(series) + 1), series, label=name, color=colours(i % 10), marker="."
            )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("input tokens per request")
        ax.set_title(f"{key}: input tokens per {xlabel}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"{key}-tokens.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files[f"{key}: input tokens per {xlabel}"] = name
    chat = report["scenarios"]["agent-chat"]["strategies"]
    fig, ax = plt.subplots(figsize=(9, 5))
    names = list(chat)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [chat[n]["cost_usd"] for n in names], 0.4, label="no caching")
    ax.bar(
        [x + 0.2 for x in xs],
        [chat[n]["effective_cost_usd"] for n in names],
        0.4,
        label="with prompt caching",
    )
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"dollars per {report['scenarios']['agent-chat']['rounds']}-round dialogue")
    ax.set_title("agent-chat: cost per strategy (Claude Sonnet prices)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "agent-chat-cost.png", dpi=110)
    plt.close(fig)
    files["agent-chat: cost per strategy"] = "agent-chat-cost.png"
    return files
