"""The server's own process, tuned for serving: its garbage collector and its C allocator.

``ctxwarden serve`` calls :func:`tune_process` once, after building the app; nothing else
does (a program that embeds :func:`~ctxwarden.service.create_app` keeps its own settings).
Only the rhythm of collecting and of giving memory back changes, so nothing any call
stores or returns does.
"""

from __future__ import annotations

import ctypes
import gc
import os

__all__ = ["tune_process"]

_M_TRIM_THRESHOLD = -1  # mallopt's parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
HEAP_BLOCKS_UP_TO = 16 * 1024 * 1024
"""Blocks up to this size come from the heap, not from a mapping of their own."""
KEEP_FREE_UP_TO = 128 * 1024 * 1024
"""Free memory at the top of the heap is given back only beyond this."""
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def tune_process() -> None:
    """The collector and the allocator of this process, as ``ctxwarden serve`` runs them."""
    _tune_gc()
    _tune_malloc()


def _tune_gc() -> None:
    """A build makes and drops thousands of small objects, so the youngest generation is
    collected every ~50,000 net allocations instead of 700 (most of a build's containers
    die by reference count before), and what startup made (modules, the app, the schemas)
    is frozen out of full collections, which otherwise walk it every few hundred calls. At
    64 concurrent calls, whose parsed bodies are all young, collecting every 10,000 cost
    ~0.15 ms of each call's CPU and every 50,000 ~0.02 ms."""
    first, *rest = gc.get_threshold()
    gc.set_threshold(max(first, 50_000), *rest)
    gc.collect()
    gc.freeze()


def _tune_malloc() -> bool:
    """glibc's malloc maps each block over 128 KB on its own and gives the top of its heap
    back to the system once a little of it is free (both thresholds move with use, up to
    a few hundred KB). Every proxied call makes such blocks and drops them: the body read
    (~330 KB for 200 messages), the body sent upstream. Each came back as fresh pages
    that the kernel faults in and zeroes: one more 340 KB buffer cost ~0.3 ms instead of
    ~0.03, and the whole call ~6% more CPU (``python -m ctxwarden.bench.proxy_cost``,
    alternated). Blocks up to 16 MB now come from the heap, which keeps up to 128 MB free.
    Returns whether it tuned: not on another C library, nor when the user set glibc's
    ``MALLOC_*_`` variables or its tunables (theirs stand)."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # no such name here (not Linux)
        return False
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if not glibc or any(map(os.environ.__contains__, _USER_SETTINGS)) or "malloc" in tunables:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mapped = mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO)
    return bool(mapped and mallopt(_M_TRIM_THRESHOLD, KEEP_FREE_UP_TO))
