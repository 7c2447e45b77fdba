"""Builds on 16 threads at once give the sequential results (the proxy builds on a pool).

Every memo a build reads or writes between calls is a :class:`ctxwarden.core.caching.BoundedCache`
or a :func:`~ctxwarden.core.caching.memoize` d function, shared by all threads: the token
counter's, the entity extractor's, masking's and truncation's. Shrunk to a couple of entries
each, every thread evicts what another just stored, so a get-then-update race (the
``KeyError`` of an ``OrderedDict.move_to_end`` after another thread's eviction) or a value
stored under another history's key would show as an exception or a different context.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator

import pytest

from ctxwarden import Message, ToolCall, build_context
from ctxwarden.core.caching import BoundedCache, all_caches, clear_all, memoize
from ctxwarden.pipeline.engine import BuiltContext

THREADS = 16
BUILDS = int(os.environ.get("CTXWARDEN_HAMMER_BUILDS", "100000"))
BUDGET = 90  # small: each build masks, truncates and drops


def _history(seed: int) -> list[Message]:
    """A user request and two tool rounds, each history its own ids and values."""
    messages = [Message.user(f"Find reservation R{seed} for user_{seed}")]
    for i in range(2):
        call = f"c{seed}_{i}"
        arguments = json.dumps({"reservation_id": f"R{seed}{i}"})
        messages.append(
            Message(
                role="assistant",
                tool_calls=(ToolCall(id=call, name="lookup", arguments=arguments),),
            )
        )
        result = {
            "reservation_id": f"R{seed}{i}X",
            "flights": [f"HAT{seed}{i}{k}" for k in range(8)],
        }
        messages.append(
            Message.tool(json.dumps({**result, "note": "x" * (150 * i)}), call, name="lookup")
        )
    return messages


def _outcome(built: BuiltContext) -> tuple[object, ...]:
    return (
        tuple(m.fingerprint for m in built.messages),
        built.input_tokens,
        tuple((a.message_id, a.action, a.reason) for a in built.audit.actions),
    )


@pytest.fixture
def tiny_caches() -> Iterator[None]:
    """Every bounded cache cut to two entries for the test, restored after."""
    sizes = {cache: cache.maxsize for cache in all_caches()}
    for cache in sizes:
        cache.resize(2)
    try:
        yield
    finally:
        for cache, size in sizes.items():
            cache.resize(size)
        clear_all()


def test_sixteen_threads_build_what_one_thread_builds(tiny_caches: None) -> None:
    histories = [_history(seed) for seed in range(64)]
    clear_all()
    expected = [_outcome(build_context(h, "gpt-4o", BUDGET)) for h in histories]
    assert any(a[1] == "masked" for a in expected[0][2]) or any(
        a[1] in ("dropped", "truncated") for a in expected[0][2]
    ), "the builds must do work the caches remember"
    clear_all()
    per_thread = BUILDS // THREADS
    errors: list[str] = []
    start = threading.Barrier(THREADS)

    def hammer(offset: int) -> None:
        start.wait()
        try:
            for n in range(per_thread):
                k = (offset * 7 + n) % len(histories)
                got = _outcome(build_context(histories[k], "gpt-4o", BUDGET))
                if got != expected[k]:
                    errors.append(f"thread {offset}, build {n}: history {k} built differently")
                    return
        except Exception as exc:  # the test reports it: a race raises
            errors.append(f"thread {offset}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_bounded_cache_keeps_its_cap_and_weight() -> None:
    cache: BoundedCache[str, str] = BoundedCache("test.texts", 3, max_weight=10, weigh=len)
    for key in "abcd":
        cache.put(key, key * 2)
    assert len(cache) == 3 and cache.get("a") is None  # the least recently used went first
    cache.put("e", "e" * 8)  # 8 + the newest two (2 + 2) > 10: older ones leave
    assert cache.get("e") == "e" * 8 and len(cache) <= 2
    assert cache.put_unless("e", "short", keep=lambda old: len(old) > 5) == "e" * 8
    with pytest.raises(ValueError, match="maxsize must be at least 1"):
        BoundedCache("test.bad", 0)


def test_memoize_is_bounded_and_cleared_with_the_rest() -> None:
    calls: list[int] = []

    @memoize(2)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert [square(1), square(1), square(2), square(3), square(1)] == [1, 1, 4, 9, 1]
    assert calls == [1, 2, 3, 1]  # 1 was evicted by 2 and 3
    clear_all()
    square(3)
    assert calls[-1] == 3
