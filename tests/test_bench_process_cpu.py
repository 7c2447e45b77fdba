"""The CPU a server process used, read from ``/proc``: in nanoseconds from its threads
while they all live, from clock ticks (which keep an ended thread's time) otherwise."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ctxwarden_bench.process_cpu import CpuReading, read_cpu, seconds_between

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux /proc")


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_few_milliseconds_read_finer_than_a_clock_tick() -> None:
    before = read_cpu(os.getpid())
    _spin(0.004)  # less than half a 10 ms tick
    after = read_cpu(os.getpid())
    used = seconds_between(before, after)
    assert 0.004 <= used < 0.05
    assert threading.get_native_id() in after.threads


def test_a_thread_that_ended_between_readings_is_counted_from_the_ticks() -> None:
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        go.wait()
        _spin(0.05)
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    before = read_cpu(os.getpid())
    assert thread.native_id in before.threads
    go.set()
    thread.join()
    # join returns once the thread's Python work is done; the kernel may list the task a
    # moment longer on a busy machine (seen once in CI): wait until it is gone
    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + 5
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)
    after = read_cpu(os.getpid())
    assert done.is_set() and thread.native_id not in after.threads
    # its 50 ms left with it: the live threads alone would miss them
    assert seconds_between(before, after) == after.ticks - before.ticks >= 0.03


def test_the_choice_between_the_two_counts() -> None:
    before = CpuReading({1: 1_000_000, 2: 0}, ticks=1.0, kernel=0.1)
    grown = CpuReading({1: 3_000_000, 2: 500_000, 3: 250_000}, ticks=1.0, kernel=0.1)
    assert seconds_between(before, grown) == pytest.approx(0.00275)  # a new thread too
    ended = CpuReading({1: 3_000_000}, ticks=1.02, kernel=0.1)
    assert seconds_between(before, ended) == pytest.approx(0.02)
