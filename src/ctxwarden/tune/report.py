"""What ``ctxwarden tune`` shows: a terminal table, a PNG and a self-contained HTML page.

Three views of one :class:`~ctxwarden.tune.search.TuneResult`: the base and tuned
policies on the checking half (and the fitting half beside), the retention/cost front of
the trials, and how much each knob mattered to each objective. The HTML inlines the
figure as SVG (no script, no CDN), as the session pages do.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

from rich.table import Table

from ctxwarden.tune.replay import Score
from ctxwarden.tune.search import TuneResult

__all__ = ["comparison", "knobs", "result_json", "rich_table", "write_figure", "write_html"]


def _row(label: str, s: Score) -> list[str]:
    return [
        label,
        f"{s.retention:.2%}",
        f"{s.cost:.1%}",
        f"{1 - s.tokens / s.full_tokens:.1%}" if s.full_tokens else "-",
        f"{s.prefix_calls:.0%}",
        str(s.violations + s.over_budget),
        str(s.errors),
    ]


HEADERS = (
    "policy",
    "retention",
    "cost vs full+cache",
    "tokens saved",
    "prefix kept",
    "violations",
    "errors",
)


Grid = tuple[str, tuple[str, ...], list[list[str]]]
"""A table as data: title, headers, rows (rendered for the terminal and for HTML)."""


def comparison(result: TuneResult) -> Grid:
    """Base vs tuned, checking half first (the figures that count), then fitting half."""
    r = result
    title = (
        f"{r.model} @ {r.budget:,} tokens; cache read {r.prices.read:g}x, "
        f"write {r.prices.write:g}x; {len(r.check_sessions)} checking / "
        f"{len(r.fit_sessions)} fitting sessions"
    )
    fit = r.trials[r.tuned_trial].score if r.tuned_trial is not None else r.base_fit
    rows = [
        _row("default, check", r.base_check),
        _row("tuned, check", r.tuned_check),
        _row("default, fit", r.base_fit),
        _row("tuned, fit", fit),
    ]
    return title, HEADERS, rows


def knobs(result: TuneResult) -> Grid:
    """Each knob: default, tuned, and its importance for retention and for cost."""
    imp = result.importance
    rows = [
        [
            name,
            _fmt(default),
            _fmt(result.tuned_params[name]),
            _share(imp.get("retention", {}).get(name)),
            _share(imp.get("cost", {}).get(name)),
        ]
        for name, default in result.base_params.items()
    ]
    heads = ("knob", "default", "tuned", "importance: retention", "importance: cost")
    return "knobs (importance: PED-ANOVA over the trials)", heads, rows


def rich_table(grid: Grid) -> Table:
    title, heads, rows = grid
    table = Table(title=title)
    for i, h in enumerate(heads):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _fmt(value: float) -> str:
    return f"{value:g}" if isinstance(value, int) else f"{value:.3g}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def result_json(result: TuneResult) -> dict[str, Any]:
    r = result
    return {
        "model": r.model,
        "budget": r.budget,
        "seed": r.seed,
        "cache_prices": {"read": r.prices.read, "write": r.prices.write},
        "summarizer": r.summarizer,
        "seconds": round(r.seconds, 1),
        "holds_on_checking_half": r.holds,
        "tuned_trial": r.tuned_trial,
        "default": {"params": r.base_params, "check": r.base_check.to_json()},
        "tuned": {"params": r.tuned_params, "check": r.tuned_check.to_json()},
        "fit_sessions": list(r.fit_sessions),
        "check_sessions": list(r.check_sessions),
        "front": list(r.front),
        "importance": r.importance,
        "trials": [
            {"number": t.number, "params": t.params, "fit": t.score.to_json()} for t in r.trials
        ],
        "problems": list(r.problems),
    }


def _figure(result: TuneResult) -> Any:
    """The retention/cost front (left) and the knobs' importance (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (front, bars) = plt.subplots(1, 2, figsize=(12, 4.8))
    ok = [t for t in result.trials if t.score.feasible]
    bad = [t for t in result.trials if not t.score.feasible]
    on_front = set(result.front)
    front.scatter(
        [t.score.cost for t in ok], [t.score.retention for t in ok], s=14, c="#999", label="trial"
    )
    if bad:
        front.scatter(
            [t.score.cost for t in bad],
            [t.score.retention for t in bad],
            s=14,
            marker="x",
            c="#c33",
            label="violates an invariant",
        )
    pts = sorted((t.score.cost, t.score.retention) for t in ok if t.number in on_front)
    if pts:
        front.plot(
            *zip(*pts, strict=True),
            "-o",
            c="#2a6",
            ms=4,
            label="front (no value the default keeps lost)",
        )
    base = result.base_fit
    front.scatter([base.cost], [base.retention], s=60, c="#24c", marker="s", label="default")
    if result.tuned_trial is not None:
        tuned = result.trials[result.tuned_trial].score
        front.scatter([tuned.cost], [tuned.retention], s=80, c="#e80", marker="*", label="tuned")
    front.set_xlabel("effective input cost / full history, both cached")
    front.set_ylabel("needed-later retention")
    front.set_title("fitting half: every trial")
    front.legend(fontsize=8)
    names = list(result.base_params)
    imp = result.importance
    y = range(len(names))
    for offset, (objective, colour) in enumerate((("retention", "#2a6"), ("cost", "#24c"))):
        values = [imp.get(objective, {}).get(n, 0.0) for n in names]
        bars.barh([i + offset * 0.4 for i in y], values, height=0.4, color=colour, label=objective)
    bars.set_yticks([i + 0.2 for i in y], names, fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel("importance (share)")
    bars.set_title("what each knob did")
    bars.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_figure(result: TuneResult, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = _figure(result)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_html(result: TuneResult, path: Path) -> Path:
    """One page: the two tables and the figure as inline SVG."""
    import matplotlib.pyplot as plt

    fig = _figure(result)
    svg = io.StringIO()
    fig.savefig(svg, format="svg")
    plt.close(fig)
    body = svg.getvalue()
    body = body[body.index("<svg") :]
    page = [
        "<!doctype html><html><head><meta charset='utf-8'><title>ctxwarden tune</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}"
        "td:first-child{text-align:left}</style></head><body>",
        "<h1>ctxwarden tune</h1>",
        _html_table(comparison(result)),
        f"<p>{'The tuned policy holds' if result.holds else 'The tuned policy does NOT hold'}"
        " on the checking half (retention at least the default's, cost no higher, no"
        " violation).</p>",
        _html_table(knobs(result)),
        body,
        "</body></html>",
    ]
    path.write_text("\n".join(page), "utf-8")
    return path


def _html_table(grid: Grid) -> str:
    title, heads, rows = grid
    head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{body}</table>"
