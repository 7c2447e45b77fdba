"""The tau-bench sample shipped with the bench, so a fresh clone shows a real trace.

Five recorded runs of the tau-bench airline agent (tasks 0, 3, 6, 10 and 11, trial 0, from
``sierra-research/tau-bench``'s ``historical_trajectories/gpt-4o-airline.json``, MIT; the
licence travels beside them in ``data/tau-bench/LICENSE``). ``ctxwarden bench`` replays them
when the data folder (``--data``, ``$CTXWARDEN_DATA`` or ``../shared/data``) holds no
tau-bench file, and says so in the report: five runs are a look at the measure, not its
figure. The full set (200 runs, or the 120-run development subset this repository's
figures are measured on) comes from that upstream repository. LoCoMo is not sampled here:
its licence (CC BY-NC 4.0) forbids shipping it; swebench-mini is not either.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["TAU_SAMPLE_NOTE", "tau_sample"]

TAU_SAMPLE_NOTE = (
    "ran on the sample shipped with ctxwarden_bench (5 runs of tau-bench airline, MIT); "
    "the full set: sierra-research/tau-bench, historical_trajectories/gpt-4o-airline.json, "
    "given with --data DIR (a folder holding tau-bench/airline-gpt-4o-dev.json) or --tau-bench PATH"
)


def tau_sample() -> Path:
    """The sample's file (a real path: the package is installed as files, not a zip)."""
    ref = resources.files("ctxwarden_bench").joinpath("data/tau-bench/airline-gpt-4o-sample.json")
    return Path(str(ref))
