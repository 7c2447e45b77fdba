"""``ctxwarden tune``: fit the policy to the user's own recorded sessions (R22).

:func:`tune` reads sessions (:mod:`.sources`), searches the policy's knobs with optuna's
TPE on half of them (:mod:`.search`, :mod:`.space`), scores retention and cost at cache
prices by replaying them as the agent loop that recorded them (:mod:`.replay`), checks
the result on the other half, and :mod:`.report` / :mod:`.policy_file` write what it
found. optuna is the ``tune`` extra, imported only when a search starts.
"""

from __future__ import annotations

from ctxwarden.tune.replay import CachePrices, Score, score_policy
from ctxwarden.tune.search import TrialResult, TuneResult, split_sessions, tune_policy
from ctxwarden.tune.sources import Problem, Recorded, Sessions, read_sessions, read_store

__all__ = [
    "CachePrices",
    "Problem",
    "Recorded",
    "Score",
    "Sessions",
    "TrialResult",
    "TuneResult",
    "read_sessions",
    "read_store",
    "score_policy",
    "split_sessions",
    "tune_policy",
]
