"""How fast this machine runs Python right now: the reference loop benchmark notes quote.

A shared machine changes speed from one minute to the next (this project's two-core
machines by up to ~2.8x: the loop below has read 3.9 to 12.6 ms on one machine in one
day), more than most changes save. A benchmark that prints this before and after its
cases says which spell its figures were taken in. The loop is the one a note can rerun
by hand: ``python -m timeit "sum(i*i for i in range(100000))"`` (best of 5 repeats of
20 loops, milliseconds per loop; lower is faster).
"""

from __future__ import annotations

import timeit

__all__ = ["REFERENCE_LOOP", "reference_ms"]

REFERENCE_LOOP = "sum(i*i for i in range(100000))"


def reference_ms(repeat: int = 5, number: int = 20) -> float:
    """Milliseconds per run of :data:`REFERENCE_LOOP`, the best of ``repeat`` timings of
    ``number`` runs (as ``python -m timeit`` reports it)."""
    if repeat < 1 or number < 1:
        raise ValueError("repeat and number must be at least 1")
    timings = timeit.Timer(REFERENCE_LOOP).repeat(repeat=repeat, number=number)
    return min(timings) / number * 1000
