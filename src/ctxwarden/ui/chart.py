"""The turn-by-turn chart as geometry: one stacked bar of input tokens by layer per turn,
the budget as a line over them, and the full history beside each bar (R15).

Computed here, drawn by the template as inline SVG (no script, no library). The y axis
is linear up to the larger of the budgets and the inputs (plus a margin), so the bars
read against the budget line; a full history taller than the chart is drawn to the top
with a cap mark and its figure in the bar's title, since on a long session it outgrows
the budget by orders of magnitude and would flatten every bar.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxwarden.store.service_tables import BuildRecord

__all__ = ["COLORS", "Bar", "Chart", "Segment", "chart"]

COLORS = {
    "system": "#6b7280",
    "facts": "#b45309",
    "ledger": "#a16207",
    "summary": "#7c3aed",
    "recall": "#db2777",
    "pinned": "#0f766e",
    "window": "#2563eb",
    "current": "#16a34a",
}
_OTHER = "#9ca3af"
HEIGHT = 200.0
TOP = 12.0
LEFT = 48.0


@dataclass(frozen=True)
class Segment:
    layer: str
    tokens: int
    y: float
    height: float
    color: str


@dataclass(frozen=True)
class Bar:
    turn: int
    x: float
    width: float
    segments: tuple[Segment, ...]
    input_tokens: int
    budget: int
    history_tokens: int
    history_y: float
    history_height: float
    history_clipped: bool
    warnings: int


@dataclass(frozen=True)
class Chart:
    bars: tuple[Bar, ...]
    width: float
    height: float
    scale_max: int
    budget_path: str  # an SVG path along each bar's budget
    ticks: tuple[tuple[float, int], ...]  # (y, tokens)
    layers: tuple[tuple[str, str], ...]  # (layer, color) for the legend

    @property
    def base(self) -> float:
        return TOP + HEIGHT


def _nice(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value``."""
    step = 1
    while step * 10 <= value:
        step *= 10
    for m in (1, 2, 5, 10):
        if m * step >= value:
            return m * step
    return 10 * step


def chart(builds: Sequence[BuildRecord], layers: Sequence[str]) -> Chart:
    """The geometry of ``builds`` (oldest first), stacking ``layers`` bottom up."""
    n = len(builds)
    bar_w = max(2.0, min(18.0, 900.0 / max(n, 1) * 0.6))
    gap = max(1.0, bar_w * 0.25)
    hist_w = max(1.0, bar_w * 0.35)
    step = bar_w + hist_w + gap
    top_value = max([1, *(max(b.input_tokens, int(b.audit.get("budget", 0))) for b in builds)])
    scale_max = _nice(top_value * 1.1)
    per_token = HEIGHT / scale_max
    base = TOP + HEIGHT
    bars = []
    path = []
    for i, b in enumerate(builds):
        x = LEFT + i * step
        stacked = dict(b.audit.get("layers", {}))
        y = base
        segments = []
        for layer in layers:
            tokens = int(stacked.get(layer, 0))
            if tokens <= 0:
                continue
            h = tokens * per_token
            y -= h
            segments.append(Segment(layer, tokens, y, h, COLORS.get(layer, _OTHER)))
        budget = int(b.audit.get("budget", 0))
        hist_h = min(HEIGHT, b.history_tokens * per_token)
        by = base - budget * per_token
        path.append(f"{'M' if i == 0 else 'L'}{x:.1f},{by:.1f}H{x + step:.1f}")
        bars.append(
            Bar(
                turn=b.turn,
                x=x,
                width=bar_w,
                segments=tuple(segments),
                input_tokens=b.input_tokens,
                budget=budget,
                history_tokens=b.history_tokens,
                history_y=base - hist_h,
                history_height=hist_h,
                history_clipped=b.history_tokens * per_token > HEIGHT,
                warnings=len(b.audit.get("warnings", [])),
            )
        )
    ticks = tuple((base - v * per_token, v) for v in range(0, scale_max + 1, scale_max // 4 or 1))
    used = [(name, COLORS.get(name, _OTHER)) for name in layers]
    return Chart(
        bars=tuple(bars),
        width=LEFT + n * step + 8,
        height=base + 22,
        scale_max=scale_max,
        budget_path="".join(path),
        ticks=ticks,
        layers=tuple(used),
    )
