"""The session pages as HTML: one small Jinja2 template set, used by ``ctxwarden serve``
(``/ui/``) and by ``ctxwarden session show --html`` alike (R15).

Everything a page needs is in the page: the stylesheet and the one script are inlined,
the chart is inline SVG, nothing is fetched from anywhere else (no CDN, no web font, no
build step), so the file written by ``--html`` opens offline and the served pages work
behind any firewall. The pages read without JavaScript: every bar of the chart is a
link to its turn (``?turn=N`` when served; ``#turn-N`` in the file, which holds every
turn and shows the targeted one by CSS). The script only selects a turn in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from ctxwarden.core.caching import memoize
from ctxwarden.core.registry.catalog import Registry
from ctxwarden.store import SessionStore, StoredSession
from ctxwarden.ui.chart import COLORS, Chart, chart
from ctxwarden.ui.view import SessionPage, TurnView, session_page

__all__ = ["render_login", "render_report", "render_session", "render_sessions", "render_turn"]


def _num(value: Any) -> str:
    return "—" if value is None else f"{int(value):,}"


def _usd(value: Any) -> str:
    if value is None:
        return "—"
    v = float(value)
    return f"${v:,.4f}" if v < 10 else f"${v:,.2f}"


def _when(ts: Any) -> str:
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short(value: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if value >= size:
            scaled = value / size
            return (
                f"{scaled:.0f}{unit}"
                if math.isclose(scaled, round(scaled))
                else f"{scaled:.1f}{unit}"
            )
    return str(value)


def _bars(c: Chart, selected: int | None, href: Callable[[int], str]) -> Markup:
    """The chart's bars as SVG, one f-string per element. Formatted here, not in the
    template: at 2,000 turns the template's escaping of each of ~110,000 numbers was
    most of the page's time (0.58 s of 0.73 s); what is text (layer names, the links)
    is still escaped."""
    out = []
    top = f'y="12" height="{c.base - 12:.1f}"'
    for b in c.bars:
        parts = "; ".join(f"{s.layer} {s.tokens:,}" for s in b.segments)
        warn = f"; {b.warnings} warning(s)" if b.warnings else ""
        title = (
            f"turn {b.turn}: {b.input_tokens:,} of {b.budget:,} tokens; {parts}; "
            f"full history {b.history_tokens:,}{warn}"
        )
        cls = "bar selected" if selected == b.turn else "bar"
        out.append(
            f'<a class="{cls}" href="{escape(href(b.turn))}" data-turn="{b.turn}">'
            f"<title>{escape(title)}</title>"
            f'<rect class="hit" x="{b.x:.1f}" {top} width="{b.width * 1.6:.1f}"/>'
        )
        for s in b.segments:
            out.append(
                f'<rect class="seg" data-layer="{escape(s.layer)}" data-tokens="{s.tokens}" '
                f'x="{b.x:.1f}" y="{s.y:.2f}" width="{b.width:.1f}" height="{s.height:.2f}" '
                f'fill="{s.color}"/>'
            )
        hx, hw = b.x + b.width, b.width * 0.35 if b.width > 3 else 1.0
        out.append(
            f'<rect class="hist" data-tokens="{b.history_tokens}" x="{hx:.1f}" '
            f'y="{b.history_y:.2f}" width="{hw:.1f}" height="{b.history_height:.2f}"/>'
        )
        if b.history_clipped:
            out.append(f'<text class="cap" x="{hx:.1f}" y="10">▲</text>')
        if b.warnings:
            cx, cy = b.x + b.width / 2, c.base + 6
            out.append(f'<circle class="warn" cx="{cx:.1f}" cy="{cy:.1f}" r="2"/>')
        out.append("</a>\n")
    return Markup("".join(out))


@memoize(1)
def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("ctxwarden.ui", "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, usd=_usd, when=_when, short=_short)
    env.globals.update(
        colors=COLORS, static=False, script=False, tenant=None, turns_url=None, nonce=None
    )
    return env


def render_login(root: str, *, error: str | None = None) -> str:
    return _env().get_template("login.html").render(root=root, home=root + "/", error=error)


def render_sessions(rows: Sequence[Mapping[str, Any]], root: str, tenant: str) -> str:
    """The tenant's sessions (``rows``: see :func:`ctxwarden.ui.data.session_rows`)."""
    return (
        _env()
        .get_template("sessions.html")
        .render(rows=rows, root=root, home=root + "/", tenant=tenant)
    )


def render_session(
    page: SessionPage,
    *,
    root: str = "",
    tenant: str | None = None,
    static: bool = False,
    nonce: str | None = None,
) -> str:
    """A session's page; ``static`` writes the self-contained file (every turn in it,
    no script); ``nonce`` marks the page's script for a Content-Security-Policy."""
    selected = page.turn.build.turn if page.turn is not None else None
    sid = page.record.session_id

    def turn_href(turn: int) -> str:
        return f"#turn-{turn}" if static else f"?turn={turn}"

    laid_out = chart(page.builds, page.layers)
    return (
        _env()
        .get_template("session.html")
        .render(
            page=page,
            chart=laid_out,
            bars=_bars(laid_out, selected, turn_href),
            root=root,
            home=root + "/" if not static else "#",
            tenant=tenant,
            static=static,
            script=not static,
            nonce=nonce,
            turns_url=None if static else f"{root}/sessions/{quote(sid, safe='')}/turns/",
        )
    )


def render_turn(turn: TurnView) -> str:
    """One turn's details alone (what the script swaps in)."""
    return _env().get_template("_turn.html").render(t=turn)


def render_report(
    store: SessionStore, tenant: str, record: StoredSession, registry: Registry | None = None
) -> str:
    """The self-contained file of ``ctxwarden session show --html``: the page with every
    logged turn in it, readable offline and without JavaScript."""
    page = session_page(store, tenant, record, registry=registry, every_turn=True)
    return render_session(page, static=True)
