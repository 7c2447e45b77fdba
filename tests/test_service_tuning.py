"""``serve`` tunes the collector and the allocator of its own process (and only there)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from ctxwarden.service.tuning import _tune_gc


def test_serve_collects_the_young_less_often_and_freezes_startup() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        _tune_gc()
        assert gc.get_threshold() == (50_000, 10, 10)
        assert gc.get_freeze_count() > 0  # startup's objects left out of full collections
        gc.set_threshold(80_000, 10, 10)
        _tune_gc()
        assert gc.get_threshold()[0] == 80_000  # a higher setting is kept
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_building_the_app_leaves_the_collector_alone() -> None:
    from ctxwarden.service import ServiceConfig, create_app

    before = gc.get_threshold()
    create_app(ServiceConfig(db="sqlite:///:memory:", upstream="http://127.0.0.1:9/v1"))
    assert gc.get_threshold() == before


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


# In a process of its own: where a 12 MB block comes from (glibc's mallinfo2: bytes in
# blocks mapped on their own, the heap's size), and whether the heap keeps it once freed.
_PROBE = """
import ctypes, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
info = ctypes.CDLL(None).mallinfo2
info.restype = Info
from ctxwarden.service.tuning import _tune_malloc
tuned = _tune_malloc() if sys.argv[1] == "tune" else False
size = 12 << 20
mapped, used = info().hblkhd, info().uordblks
block = bytearray(size)
mapped, used, held = info().hblkhd - mapped, info().uordblks - used, info().arena
del block
print(tuned, mapped >= size, used >= size, info().arena >= held)
"""


def _probe(mode: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(not _glibc(), reason="the allocator is tuned on glibc only")
def test_serve_takes_big_blocks_from_its_heap_and_keeps_them_there() -> None:
    # (tuned, mapped on its own, taken from the heap, still held by the heap once freed)
    assert _probe("plain") == "False True False True"  # (mapped: the heap never had it)
    assert _probe("tune") == "True False True True"


@pytest.mark.skipif(not _glibc(), reason="the allocator is tuned on glibc only")
def test_the_users_own_allocator_settings_stand() -> None:
    assert _probe("tune", MALLOC_TRIM_THRESHOLD_="1000000") == "False True False True"
    assert _probe("tune", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=1000000").startswith("False")
