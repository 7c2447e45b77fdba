"""What ``ctxwarden serve`` is configured with: data, read once at start-up.

Upstream credentials come from here (or from a tenant's own row), never from the
client: the key a client sends is its ctxwarden tenant key and is not forwarded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ctxwarden.core.errors import ConfigError
from ctxwarden.session.build_log import KEEP_BUILDS, KEEP_CONTEXTS

if TYPE_CHECKING:
    from ctxwarden import Policy, Registry

__all__ = ["DEFAULT_MAX_BODY_BYTES", "KEY_ENV", "ServiceConfig", "unkeyed_warnings"]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Request bodies above this are refused with 413 before they are parsed."""


@dataclass(frozen=True)
class ServiceConfig:
    """The service's settings. ``upstream`` is the OpenAI-compatible base URL (ending in
    ``/v1``, as the openai SDK takes it); ``anthropic_upstream`` Anthropic's (without
    ``/v1``, as the anthropic SDK takes it); ``gemini_upstream`` the Gemini API's (without
    ``/v1beta``, as google-genai's ``base_url`` takes it)."""

    db: str
    upstream: str | None = None
    anthropic_upstream: str | None = None
    policy: Policy | None = None
    registry: Registry | None = None
    upstream_api_key: str | None = None
    anthropic_api_key: str | None = None
    gemini_upstream: str | None = None
    gemini_api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    upstream_timeout: float = 600.0
    connect_timeout: float = 10.0
    summarizer: str | None = None
    broker: str | None = None  # Redis URL: summaries as Celery jobs (ctxwarden.jobs)
    models: tuple[str, ...] = field(default=())
    #: Builds whose audits the store keeps per session, and how many newest of them
    #: keep their built messages too (see :mod:`ctxwarden.session.build_log`).
    keep_builds: int = KEEP_BUILDS
    keep_contexts: int = KEEP_CONTEXTS
    #: Threads that run store work and builds: ``None`` picks by store (SQLite: 0, on
    #: the event loop, or 1 with a broker; PostgreSQL: 4); see :mod:`ctxwarden.service.hub`.
    store_threads: int | None = None
    #: On an SQLite file, copy its log into the database in a thread of its own rather
    #: than in the commit that fills it (:mod:`ctxwarden.store.sqlite_checkpoint`).
    background_checkpoint: bool = True
    #: A request's head (line and headers): at most this many bytes and headers, sent
    #: within this many seconds; past any of them the connection gets 431/408 and ends
    #: (:mod:`ctxwarden.service.http_limits`).
    max_head_bytes: int = 64 * 1024
    max_headers: int = 128
    head_timeout: float = 15.0

    def __post_init__(self) -> None:
        if self.upstream is None and self.anthropic_upstream is None and not self.gemini_upstream:
            raise ConfigError(
                "no upstream: give --upstream URL (OpenAI-compatible, ending in /v1), "
                "--anthropic-upstream URL and/or --gemini-upstream URL"
            )
        for name in ("upstream", "anthropic_upstream", "gemini_upstream"):
            url = getattr(self, name)
            if url is not None and not url.startswith(("http://", "https://")):
                raise ConfigError(f"--{name.replace('_', '-')} must be an http(s) URL, got {url!r}")
        if self.max_body_bytes < 1024:
            raise ConfigError(
                f"max body size must be at least 1024 bytes, got {self.max_body_bytes}"
            )
        if self.broker is not None and not self.broker.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ConfigError(
                f"--broker must be a Redis URL (redis://host:port/db), got {self.broker!r}"
            )
        if self.keep_builds < 1:
            raise ConfigError(f"--keep-builds must be at least 1, got {self.keep_builds}")
        if not 0 <= self.keep_contexts <= self.keep_builds:
            raise ConfigError(
                f"--keep-contexts must be between 0 and --keep-builds ({self.keep_builds}), "
                f"got {self.keep_contexts}"
            )
        if self.store_threads is not None and not 0 <= self.store_threads <= 64:
            raise ConfigError(f"--store-threads must be between 0 and 64, got {self.store_threads}")
        if self.max_head_bytes < 1024 or self.max_headers < 8 or self.head_timeout <= 0:
            raise ConfigError(
                "request head limits: at least 1 KB, 8 headers and a timeout > 0 s, got "
                f"{self.max_head_bytes} bytes, {self.max_headers}, {self.head_timeout} s"
            )
        if self.upstream_timeout <= 0:
            raise ConfigError(f"upstream timeout must be > 0 seconds, got {self.upstream_timeout}")

    @classmethod
    def from_env(cls, db: str, **kw: object) -> ServiceConfig:
        """Fill the upstream keys from ``CTXWARDEN_UPSTREAM_API_KEY`` and
        ``CTXWARDEN_ANTHROPIC_API_KEY`` (and ``CTXWARDEN_GEMINI_API_KEY``) unless given."""
        kw.setdefault("upstream_api_key", os.environ.get("CTXWARDEN_UPSTREAM_API_KEY"))
        kw.setdefault("anthropic_api_key", os.environ.get("CTXWARDEN_ANTHROPIC_API_KEY"))
        kw.setdefault("gemini_api_key", os.environ.get("CTXWARDEN_GEMINI_API_KEY"))
        return cls(db=db, **kw)  # type: ignore[arg-type]

    @property
    def unkeyed_routes(self) -> tuple[str, ...]:
        """The routes (``"openai"``, ``"anthropic"``, ``"gemini"``) with an upstream but no
        server key: their calls go upstream without credentials unless the tenant has its
        own key."""
        routes = (
            ("openai", self.upstream, self.upstream_api_key),
            ("anthropic", self.anthropic_upstream, self.anthropic_api_key),
            ("gemini", self.gemini_upstream, self.gemini_api_key),
        )
        return tuple(api for api, url, key in routes if url and not key)


KEY_ENV = {
    "openai": "CTXWARDEN_UPSTREAM_API_KEY",
    "anthropic": "CTXWARDEN_ANTHROPIC_API_KEY",
    "gemini": "CTXWARDEN_GEMINI_API_KEY",
}
"""The variables ``serve`` reads the upstream keys from."""


def unkeyed_warnings(
    config: ServiceConfig, key_env: Mapping[str, str] = KEY_ENV, *, tenant_keys: bool = True
) -> list[str]:
    """One line per route without an upstream key, for ``serve`` and ``wrap`` to print at
    start (a missing key is otherwise seen only as the provider's 401 on the first call):
    ``key_env`` names the variable to set; ``tenant_keys`` adds that a tenant's own key
    would do."""
    out = []
    for api in config.unkeyed_routes:
        line = f"warning: no upstream key for the {api} route ({key_env[api]} is not set): "
        if tenant_keys:
            flag = {"anthropic": "--anthropic-key", "gemini": "--gemini-key"}.get(
                api, "--upstream-key"
            )
            line += f"its calls go without one unless the tenant has its own (tenant add {flag})"
        else:
            line += "its calls go upstream without one"
        out.append(line)
    return out
