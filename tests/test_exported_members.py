"""The public API: ``__all__`` lists every public name, sorted, and each one resolves."""

from __future__ import annotations

import subprocess
import sys

import ctxwarden


def test_all_is_sorted_and_resolves() -> None:
    assert ctxwarden.__all__ == sorted(ctxwarden.__all__)
    for name in ctxwarden.__all__:
        assert getattr(ctxwarden, name) is not None, name


def test_every_public_attribute_is_exported() -> None:
    public = {
        name
        for name, value in vars(ctxwarden).items()
        if not name.startswith("_") and not getattr(value, "__name__", "").startswith("ctxwarden.")
    }
    public -= {"annotations", "importlib", "TYPE_CHECKING", "Any"}
    assert public <= set(ctxwarden.__all__), public - set(ctxwarden.__all__)


def test_importing_ctxwarden_loads_no_provider_sdk() -> None:
    code = "import sys, ctxwarden; print('openai' in sys.modules, 'anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
