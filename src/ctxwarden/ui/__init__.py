"""Session pages (R15): what the model saw, turn by turn, as server-rendered HTML.

:mod:`.view` reads the data from a store, :mod:`.chart` lays out the chart, and
:mod:`.render` fills the templates; ``ctxwarden serve`` mounts them at ``/ui/``
(:mod:`ctxwarden.service.ui_routes`) and ``ctxwarden session show --html`` writes the
same page as one file. Needs only the core install (Jinja2).
"""

from __future__ import annotations

from ctxwarden.ui.render import (
    render_login,
    render_report,
    render_session,
    render_sessions,
    render_turn,
)
from ctxwarden.ui.view import SessionPage, TurnView, session_page, session_rows, turn_view

__all__ = [
    "SessionPage",
    "TurnView",
    "render_login",
    "render_report",
    "render_session",
    "render_sessions",
    "render_turn",
    "session_page",
    "session_rows",
    "turn_view",
]
