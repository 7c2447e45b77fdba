"""The local proxy a wrapped run talks to: the configuration read from the user's
environment, the route warnings, the local tenant's key, and the server (started or
reused). ``ctxwarden wrap`` calls :func:`local_proxy` and runs the agent against it."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ctxwarden.core.errors import ConfigError
from ctxwarden.local.agent_env import upstream_key, upstream_url
from ctxwarden.local.home import Home
from ctxwarden.local.server import Running, ServeConfig, ensure_server, server_urls
from ctxwarden.local.tenant import local_tenant_key
from ctxwarden.service.config import ServiceConfig, unkeyed_warnings

__all__ = ["LocalProxy", "local_proxy"]

_USER_KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
}


@dataclass(frozen=True)
class LocalProxy:
    """A running local proxy: its server, the store it writes, the local tenant's key (and
    the file it is kept in), and the warnings to show (routes without an upstream key)."""

    running: Running
    db: str
    key: str
    key_file: Path
    warnings: tuple[str, ...]


def local_proxy(
    home: Home,
    env: Mapping[str, str],
    *,
    db: str | None = None,
    upstream: str | None = None,
    anthropic_upstream: str | None = None,
    gemini_upstream: str | None = None,
    policy: Path | None = None,
    port: int | None = None,
) -> LocalProxy:
    """The proxy for this configuration (options first, then ``env``, see
    :mod:`~ctxwarden.local.agent_env`), started now or reused. The configuration is
    checked as ``serve`` checks it before anything starts."""
    if policy is not None and not policy.is_file():
        raise ConfigError(f"--policy {policy}: no such file")
    own = server_urls(home)
    config = ServeConfig(
        db=db or home.db,
        upstream=upstream or upstream_url(env, "openai", own),
        anthropic_upstream=anthropic_upstream or upstream_url(env, "anthropic", own),
        openai_key=upstream_key(env, "openai"),
        anthropic_key=upstream_key(env, "anthropic"),
        gemini_upstream=gemini_upstream or upstream_url(env, "gemini", own),
        gemini_key=upstream_key(env, "gemini"),
        policy=str(policy.resolve()) if policy is not None else None,
        port=port,
        policy_sha256=hashlib.sha256(policy.read_bytes()).hexdigest() if policy else None,
    )
    checked = ServiceConfig(
        config.db,
        upstream=config.upstream,
        anthropic_upstream=config.anthropic_upstream,
        upstream_api_key=config.openai_key,
        anthropic_api_key=config.anthropic_key,
        gemini_upstream=config.gemini_upstream,
        gemini_api_key=config.gemini_key,
    )
    warnings = tuple(unkeyed_warnings(checked, _USER_KEYS, tenant_keys=False))
    key_file = home.key_file_for(config.db)
    key, _ = local_tenant_key(config.db, key_file, own_store=config.db == home.db)
    running = ensure_server(home, config, secret=key)
    return LocalProxy(running, config.db, key, key_file, warnings)
