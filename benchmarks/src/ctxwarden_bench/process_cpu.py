"""The CPU another process (a server under test) has used, read from ``/proc``, precise
enough for a few calls of a few milliseconds each.

``/proc/PID/stat`` counts in clock ticks (10 ms here): over 40 calls of ~3 ms it reads
in steps of 0.25 ms per call, as large as what separates two versions and a tenth of a
5 ms target. Each thread's ``schedstat`` counts nanoseconds, but only while the thread
lives: a thread that ends takes its count with it. So a figure between two readings
comes from the threads' nanoseconds when every thread of the first reading is still
there, and from the process's clock ticks (which keep ended threads' time) otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuReading", "read_cpu", "seconds_between"]


@dataclass(frozen=True)
class CpuReading:
    threads: Mapping[int, int]
    """Each live thread's time on a CPU so far, in nanoseconds (``schedstat``)."""
    ticks: float
    """The process's user and system time so far, in seconds (``stat``, clock ticks)."""
    kernel: float
    """Of it, in the kernel (system time), in seconds (clock ticks)."""


def read_cpu(pid: int) -> CpuReading:
    """The CPU process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            continue
    user, system = int(fields[11]), int(fields[12])
    return CpuReading(threads, (user + system) / tick, system / tick)


def seconds_between(before: CpuReading, after: CpuReading) -> float:
    """CPU seconds used between two readings of one process (see the module docstring)."""
    if before.threads.keys() <= after.threads.keys():
        return sum(ns - before.threads.get(tid, 0) for tid, ns in after.threads.items()) / 1e9
    return after.ticks - before.ticks
