"""The policy's tunable parameters: their ranges, and a policy from a set of values.

Only knobs that change what a build keeps or when its prefix moves are searched:

* ``mask.keep_last`` / ``mask.batch_tokens`` / ``mask.min_tokens`` — how many recent
  tool results stay whole, and how much masked output piles up before the mask moves
  (bigger batches: rarer prefix breaks, more tokens per call);
* ``truncate.threshold_tokens`` / ``truncate.target_tokens`` (as a share of the
  threshold) / ``truncate.cut_values_tokens`` — when a long result is cut, to what,
  and how many of the cut part's values are listed after it;
* ``window.refill_ratio`` — the low-water mark: how far the window drops when it must
  move, so the following calls append to a cached prefix (searched from the base
  value up, as the other knobs that keep more are: :func:`params_for`);
* ``ledger.max_tokens`` / ``ledger.free_share`` — the room of the values that left
  the window;
* with a summariser, ``summary.max_messages`` / ``summary.keep_recent`` (as a share)
  / ``summary.fill_ratio`` — when the rolling summary folds history.

Everything else (the budget, per-tool rules, custom steps, recall) is taken from the
base policy as given. Ranges are wide enough to hold the defaults, so the default
policy is itself a point of the space (the search starts from it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ctxwarden.memory.summaries import SummaryTrigger
from ctxwarden.pipeline.policy import Policy
from ctxwarden.steps.mask import MaskObservations
from ctxwarden.steps.truncate import TruncateToolResults

__all__ = ["PARAMS", "Param", "Suggest", "apply_params", "default_params", "params_for"]


@dataclass(frozen=True)
class Param:
    """One searched knob: ``low..high`` (ints with ``step``), or a float range."""

    name: str
    low: float
    high: float
    step: int | None = None  # ints only
    summary: bool = False  # searched only when a summariser runs
    room: bool = False  # more keeps more: never searched below the base (see params_for)


PARAMS: tuple[Param, ...] = (
    Param("mask.keep_last", 1, 10, step=1, room=True),
    Param("mask.batch_tokens", 0, 6000, step=250),
    Param("mask.min_tokens", 10, 200, step=10, room=True),
    Param("truncate.threshold_tokens", 200, 3000, step=50, room=True),
    Param("truncate.target_share", 0.2, 1.0, room=True),
    Param("truncate.cut_values_tokens", 0, 400, step=20, room=True),
    Param("window.refill_ratio", 0.3, 1.0, room=True),
    Param("ledger.max_tokens", 0, 2000, step=50, room=True),
    Param("ledger.free_share", 0.0, 0.6, room=True),
    Param("summary.max_messages", 10, 120, step=5, summary=True),
    Param("summary.keep_share", 0.1, 0.9, summary=True),
    Param("summary.fill_ratio", 0.3, 0.95, summary=True),
)


class Suggest(Protocol):
    """What :func:`params_for` needs of an optuna trial."""

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1) -> int: ...

    def suggest_float(self, name: str, low: float, high: float) -> float: ...


def searched(summarizer: bool) -> tuple[Param, ...]:
    return tuple(p for p in PARAMS if summarizer or not p.summary)


def params_for(
    trial: Suggest, summarizer: bool, base: Mapping[str, float], shrink: bool = False
) -> dict[str, float]:
    """One point of the space, drawn by ``trial``.

    A knob whose larger value keeps more (``room``: the ledger's size, results kept
    whole, the truncation threshold and depth, the window's low-water mark) is searched
    only from the ``base`` value up, unless ``shrink``: the fitting half can show that
    room went unused in the sessions it holds, not in the next ones. Measured on
    tau-bench dev @2,000: a 100-token ledger instead of 600 kept as many values in each
    of 60 fitting sessions and lost 0.65 points on the 60 checking ones; a window dropping to a
    third of its room when it moves (0.30-0.34 instead of 0.75) lost nothing on 20
    fitting sessions, re-checked at 0.9 and 1.1 times the budget too, and 1-2 values
    of 387-541 on the checking half (two seeds of three). The mask's batch, the other cache
    knob, moves freely.
    """
    out: dict[str, float] = {}
    for p in searched(summarizer):
        low = p.low if shrink or not p.room else base[p.name]
        if p.step is not None:
            out[p.name] = trial.suggest_int(p.name, int(low), int(p.high), step=p.step)
        else:
            out[p.name] = trial.suggest_float(p.name, low, p.high)
    return out


def default_params(base: Policy, summarizer: bool) -> dict[str, float]:
    """The base policy's values of the searched knobs (where the search starts)."""
    mask = base.mask or MaskObservations()
    cut = base.truncate or TruncateToolResults()
    trigger = base.summary
    values: dict[str, float] = {
        "mask.keep_last": mask.keep_last,
        "mask.batch_tokens": mask.batch_tokens,
        "mask.min_tokens": mask.min_tokens,
        "truncate.threshold_tokens": cut.threshold_tokens,
        "truncate.target_share": cut.target_tokens / cut.threshold_tokens,
        "truncate.cut_values_tokens": cut.cut_values_tokens,
        "window.refill_ratio": base.window.refill_ratio,
        "ledger.max_tokens": base.ledger.max_tokens,
        "ledger.free_share": base.ledger.free_share,
        "summary.max_messages": trigger.max_messages or 30,
        "summary.keep_share": trigger.keep_recent / (trigger.max_messages or 30),
        "summary.fill_ratio": trigger.fill_ratio or 0.6,
    }
    return {p.name: _clip(p, values[p.name]) for p in searched(summarizer)}


def _clip(p: Param, value: float) -> float:
    value = min(max(value, p.low), p.high)
    if p.step is None:
        return float(value)
    return int(p.low + round((value - p.low) / p.step) * p.step)


def apply_params(base: Policy, params: Mapping[str, Any]) -> Policy:
    """``base`` with the searched knobs set to ``params`` (a disabled step stays off)."""

    def get(name: str, default: Any) -> Any:
        return params.get(name, default)

    policy = base
    if base.mask is not None:
        policy = replace(
            policy,
            mask=replace(
                base.mask,
                keep_last=int(get("mask.keep_last", base.mask.keep_last)),
                batch_tokens=int(get("mask.batch_tokens", base.mask.batch_tokens)),
                min_tokens=int(get("mask.min_tokens", base.mask.min_tokens)),
            ),
        )
    if base.truncate is not None:
        threshold = int(get("truncate.threshold_tokens", base.truncate.threshold_tokens))
        share = get("truncate.target_share", base.truncate.target_tokens / threshold)
        policy = replace(
            policy,
            truncate=replace(
                base.truncate,
                threshold_tokens=threshold,
                target_tokens=max(1, min(threshold, round(threshold * share))),
                cut_values_tokens=int(
                    get("truncate.cut_values_tokens", base.truncate.cut_values_tokens)
                ),
            ),
        )
    policy = replace(
        policy,
        window=replace(
            base.window, refill_ratio=float(get("window.refill_ratio", base.window.refill_ratio))
        ),
        ledger=replace(
            base.ledger,
            max_tokens=int(get("ledger.max_tokens", base.ledger.max_tokens)),
            free_share=float(get("ledger.free_share", base.ledger.free_share)),
        ),
    )
    if "summary.max_messages" in params:
        most = int(params["summary.max_messages"])
        keep = min(most - 1, max(0, round(most * float(params["summary.keep_share"]))))
        trigger: SummaryTrigger = replace(
            base.summary,
            max_messages=most,
            keep_recent=keep,
            fill_ratio=float(params["summary.fill_ratio"]),
        )
        policy = replace(policy, summary=trigger)
    return policy
