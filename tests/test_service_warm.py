"""``ctxwarden serve`` builds once before it listens (:mod:`ctxwarden.service.warm`): the
first proxied call no longer loads the encoding (~0.3 s with a first build's other
one-time work)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ctxwarden.service as service
from ctxwarden.pipeline.engine import build_context
from ctxwarden.service import ServiceConfig, warm

_FRESH = """
import tiktoken.registry as registry
from ctxwarden.service.warm import warm_up
assert "o200k_base" not in registry.ENCODINGS, "loaded before the warm-up"
warm_up()
assert "o200k_base" in registry.ENCODINGS
print("warm")
"""


def test_the_warm_up_loads_the_encoding_in_a_fresh_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "warm"


def test_its_build_runs_the_steps_of_a_tool_loop() -> None:
    """The made-up loop is cut (the cutters run, the ledger takes the cut values): a
    warm-up that a default change turned into a build with nothing to do would leave
    that work to the first call again."""
    built = build_context(warm._loop(), "gpt-4o", warm._BUDGET)
    assert any(a.action == "truncated" for a in built.audit.actions)
    assert built.input_tokens <= warm._BUDGET


def test_serve_warms_up_before_it_listens(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    uvicorn = pytest.importorskip("uvicorn")
    order: list[str] = []
    monkeypatch.setattr(warm, "warm_up", lambda *a, **k: order.append("warm"))
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: order.append("listen"))
    monkeypatch.setattr(service, "_tune_gc", lambda: order.append("gc"))
    config: Any = ServiceConfig(
        db=f"sqlite:///{tmp_path / 's.db'}", upstream="http://127.0.0.1:9/v1"
    )
    service.serve(config, port=0)
    assert order == ["warm", "gc", "listen"]
