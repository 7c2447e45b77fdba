"""What a wrapped run's calls sent and saved, read from the store after the agent exits.

A run's calls are the proxy's logged builds (``ctxwarden_builds``, one per forwarded call)
of the local tenant made since the run started, by session. For each: the tokens the
proxy sent, the tokens of the full history the agent handed it (what it would have sent
without ctxwarden; fewer than sent when the summary, facts or recall layers added more
than the window dropped, and then the saving is negative), and the dollars the
difference is worth at the model's **cached** input price from the registry. Cache
prices make it a floor: without ctxwarden, most of a long history would be read from the
provider's prompt cache, so pricing the tokens not sent at the plain input price would
overstate the saving. A model the registry does not
know has no price: its calls count, their dollars do not (the table says how many).

Concurrent runs of the same data dir share the tenant, so a run's figures include
another run's calls made meanwhile. A session's log keeps its newest 2,000 builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ctxwarden.core.errors import UnknownModelError
from ctxwarden.core.registry.catalog import Registry, get_model
from ctxwarden.session.build_log import KEEP_BUILDS
from ctxwarden.store.base import SessionStore
from ctxwarden.store.service_tables import BuildRecord, latest_builds, list_builds

__all__ = ["RunReport", "SessionLine", "run_report"]

_NOT_CALLS = frozenset({"built", "recalled"})  # a library build, a recall: no upstream call


@dataclass(frozen=True)
class SessionLine:
    """One session's share of the run."""

    session_id: str
    calls: int
    sent_tokens: int
    history_tokens: int
    dollars_saved: float
    unpriced_calls: int  # calls on a model the registry has no price for

    @property
    def saved_tokens(self) -> int:
        return self.history_tokens - self.sent_tokens  # below 0 when layers added more


@dataclass(frozen=True)
class RunReport:
    sessions: tuple[SessionLine, ...]
    url: str

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.sessions)

    @property
    def sent_tokens(self) -> int:
        return sum(s.sent_tokens for s in self.sessions)

    @property
    def history_tokens(self) -> int:
        return sum(s.history_tokens for s in self.sessions)

    @property
    def dollars_saved(self) -> float:
        return sum(s.dollars_saved for s in self.sessions)

    @property
    def unpriced_calls(self) -> int:
        return sum(s.unpriced_calls for s in self.sessions)

    def page(self, session_id: str) -> str:
        """The session's page on the proxy (``/ui/``, signed in with the tenant key)."""
        return f"{self.url}/ui/sessions/{quote(session_id, safe='/:@~')}"

    def lines(self) -> list[str]:
        """The table ``wrap`` prints when the command exits."""
        if not self.sessions:
            return ["ctxwarden: no model call went through the proxy in this run"]
        rows: list[tuple[str, ...]] = [
            ("session", "calls", "tokens sent", "full history", "saved", "$ saved")
        ]
        for s in self.sessions:
            rows.append((s.session_id, *_figures(s.calls, s.sent_tokens, s.history_tokens,
                                                 s.dollars_saved)))  # fmt: skip
        if len(self.sessions) > 1:
            rows.append(("total", *_figures(self.calls, self.sent_tokens, self.history_tokens,
                                            self.dollars_saved)))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out = ["ctxwarden: this run through the proxy"]
        for r in rows:
            figures = (c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))
            cells = [r[0].ljust(widths[0]), *figures]
            out.append("  " + "  ".join(cells))
        note = "$ saved: tokens not sent, at the model's cached-input price (registry)"
        if self.unpriced_calls:
            note += f"; {self.unpriced_calls} call(s) on models without a price not counted"
        out.append("  " + note)
        out += [f"  page: {self.page(s.session_id)}" for s in self.sessions]
        return out


def _figures(calls: int, sent: int, history: int, dollars: float) -> tuple[str, ...]:
    saved = f"{1 - sent / history:.0%}" if history else "-"
    money = f"${dollars:.4f}" if round(dollars, 4) else "$0.0000"  # no "$-0.0000"
    return (str(calls), f"{sent:,}", f"{history:,}", saved, money)


def _saved_dollars(builds: Sequence[BuildRecord], registry: Registry | None) -> tuple[float, int]:
    dollars, unpriced = 0.0, 0
    for b in builds:
        try:
            info = get_model(b.model, registry)
        except UnknownModelError:
            unpriced += 1
            continue
        price = info.price_for(b.history_tokens)
        per_token = price.cached_input if price.cached_input is not None else price.input
        dollars += (b.history_tokens - b.input_tokens) * per_token / 1_000_000
    return dollars, unpriced


def run_report(
    store: SessionStore, tenant: str, since: float, url: str, registry: Registry | None = None
) -> RunReport:
    """The calls of ``tenant`` logged at or after ``since`` (a ``time.time()``), by
    session, oldest session first."""
    lines = []
    for session_id, newest in latest_builds(store, tenant).items():
        if newest.created_at < since:
            continue
        first = max(0, newest.turn - KEEP_BUILDS)
        builds = [
            b
            for b in list_builds(store, tenant, session_id, limit=KEEP_BUILDS + 1, since_turn=first)
            if b.created_at >= since and b.status not in _NOT_CALLS
        ]
        if not builds:
            continue
        dollars, unpriced = _saved_dollars(builds, registry)
        sent = sum(b.input_tokens for b in builds)
        history = sum(b.history_tokens for b in builds)
        line = SessionLine(session_id, len(builds), sent, history, dollars, unpriced)
        lines.append((builds[0].created_at, line))
    lines.sort(key=lambda pair: pair[0])
    return RunReport(tuple(line for _, line in lines), url)
