"""``ctxwarden serve`` and ``ctxwarden tenant add|list|revoke|caps``: parse, then call
:mod:`ctxwarden.service` and :mod:`ctxwarden.store.service_tables`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from ctxwarden.cli._common import RegistryOpt, handle_errors, registry_from
from ctxwarden.session.build_log import KEEP_BUILDS, KEEP_CONTEXTS
from ctxwarden.store import open_store
from ctxwarden.store.service_tables import add_tenant, list_tenants, revoke_tenant, set_caps

__all__ = ["serve", "tenant_app"]

Db = Annotated[
    str,
    typer.Option(
        "--db", envvar="CTXWARDEN_DB", help="Store URL: sqlite:///path.db or postgresql://..."
    ),
]
MaxInput = Annotated[
    int | None,
    typer.Option("--max-input-tokens", min=1, help="Cap on the tokens sent per call."),
]
SpendCap = Annotated[
    float | None,
    typer.Option(
        "--spend-cap", min=0.0, help="Dollars (registry prices) after which calls get 429."
    ),
]


def serve(
    db: Db,
    upstream: Annotated[
        str | None, typer.Option("--upstream", help="OpenAI-compatible base URL (ends in /v1).")
    ] = None,
    anthropic_upstream: Annotated[
        str | None, typer.Option("--anthropic-upstream", help="Anthropic base URL (no /v1).")
    ] = None,
    gemini_upstream: Annotated[
        str | None,
        typer.Option("--gemini-upstream", help="Gemini API base URL (no /v1beta)."),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="Policy TOML for tenants without their own.")
    ] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8400,
    max_body_mb: Annotated[
        float, typer.Option("--max-body-mb", help="Refuse bodies above this (413).")
    ] = 32.0,
    upstream_timeout: Annotated[
        float, typer.Option("--upstream-timeout", help="Seconds before an upstream call is a 504.")
    ] = 600.0,
    max_header_kb: Annotated[
        float,
        typer.Option("--max-header-kb", help="Refuse request headers above this in all (431)."),
    ] = 64.0,
    header_timeout: Annotated[
        float,
        typer.Option("--header-timeout", help="Seconds a client has to send its headers (408)."),
    ] = 15.0,
    summarizer: Annotated[
        str | None,
        typer.Option(
            "--summarizer",
            help="Summarise after calls: 'offline' or a provider spec (openai:gpt-4o-mini).",
        ),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            envvar="CTXWARDEN_BROKER",
            help="Redis URL: run summaries as Celery jobs (ctxwarden worker) instead of in "
            "this process.",
        ),
    ] = None,
    keep_builds: Annotated[
        int,
        typer.Option("--keep-builds", min=1, help="Build audits kept per session (newest)."),
    ] = KEEP_BUILDS,
    keep_contexts: Annotated[
        int,
        typer.Option(
            "--keep-contexts", min=0, help="Of those, how many newest keep the built messages."
        ),
    ] = KEEP_CONTEXTS,
    store_threads: Annotated[
        int | None,
        typer.Option(
            "--store-threads",
            min=0,
            max=64,
            help="Threads for store work and builds; 0 runs them on the event loop. "
            "Default: 0 on SQLite (1 with --broker), 4 on PostgreSQL.",
        ),
    ] = None,
    registry: RegistryOpt = None,
) -> None:
    """Run the context-managing proxy (OpenAI /v1/chat/completions, Anthropic /v1/messages,
    Gemini /v1beta/models/M:generateContent), the session API and /metrics. Upstream keys:
    CTXWARDEN_UPSTREAM_API_KEY and CTXWARDEN_ANTHROPIC_API_KEY (or per tenant),
    CTXWARDEN_GEMINI_API_KEY."""
    from ctxwarden import Policy
    from ctxwarden.service import ServiceConfig
    from ctxwarden.service import serve as run

    config = ServiceConfig.from_env(
        db,
        upstream=upstream,
        anthropic_upstream=anthropic_upstream,
        gemini_upstream=gemini_upstream,
        policy=Policy.from_toml(policy) if policy is not None else None,
        registry=registry_from(registry) if registry else None,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        upstream_timeout=upstream_timeout,
        max_head_bytes=int(max_header_kb * 1024),
        head_timeout=header_timeout,
        summarizer=summarizer,
        broker=broker,
        keep_builds=keep_builds,
        keep_contexts=keep_contexts,
        store_threads=store_threads,
    )
    from ctxwarden.service.config import unkeyed_warnings
    from ctxwarden.telemetry import configure_from_env

    if configure_from_env():  # OTEL_* variables asked for traces (docs/tracing.md)
        typer.echo("ctxwarden: OpenTelemetry traces on", err=True)
    typer.echo(f"ctxwarden serving on http://{host}:{port} (store {db})", err=True)
    for line in unkeyed_warnings(config):
        typer.echo(line, err=True)
    run(config, host=host, port=port)


tenant_app = typer.Typer(
    name="tenant",
    help="API keys of the service's tenants (stored hashed).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@tenant_app.command("add")
@handle_errors
def add(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    db: Db,
    max_input_tokens: MaxInput = None,
    spend_cap: SpendCap = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="This tenant's policy TOML (stored).")
    ] = None,
    upstream_key: Annotated[
        str | None,
        typer.Option(
            "--upstream-key",
            envvar="CTXWARDEN_TENANT_UPSTREAM_API_KEY",
            help="This tenant's key for the OpenAI-compatible upstream (else the server's).",
        ),
    ] = None,
    anthropic_key: Annotated[
        str | None,
        typer.Option(
            "--anthropic-key",
            envvar="CTXWARDEN_TENANT_ANTHROPIC_API_KEY",
            help="This tenant's key for the Anthropic upstream (else the server's).",
        ),
    ] = None,
    gemini_key: Annotated[
        str | None,
        typer.Option(
            "--gemini-key",
            envvar="CTXWARDEN_TENANT_GEMINI_API_KEY",
            help="This tenant's key for the Gemini API upstream (else the server's).",
        ),
    ] = None,
) -> None:
    """Create a tenant (or re-key a revoked one) and print its new API key, once, alone on
    the last line. Upstream keys given here (better through their environment variables,
    kept out of the shell's history) are stored as given: the proxy sends them."""
    from ctxwarden import Policy
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix

    text = policy.read_text(encoding="utf-8") if policy is not None else None
    if text is not None:
        Policy.from_toml(text)  # refuse a bad policy now, not on the first call
    key = new_key()
    with open_store(db) as store:
        add_tenant(
            store,
            name,
            key_hash=hash_key(key),
            key_prefix=shown_prefix(key),
            max_input_tokens=max_input_tokens,
            spend_cap_usd=spend_cap,
            policy=text,
            upstream_api_key=upstream_key,
            anthropic_api_key=anthropic_key,
            gemini_api_key=gemini_key,
        )
    typer.echo(f"tenant {name!r} added; its API key (shown once, stored hashed):")
    typer.echo(key)


@tenant_app.command("list")
@handle_errors
def list_(db: Db) -> None:
    """Tenants with their key prefix, caps, spend and state."""
    with open_store(db) as store:
        rows = list_tenants(store)
    for t in rows:
        state = "active" if t.active else f"revoked {_when(t.revoked_at or 0)}"
        caps = f"max_input_tokens={t.max_input_tokens or '-'} spend_cap={t.spend_cap_usd or '-'}"
        typer.echo(f"{t.tenant}\t{t.key_prefix}…\t{state}\t{caps}\tspent=${t.spent_usd:.4f}")


@tenant_app.command("revoke")
@handle_errors
def revoke(name: Annotated[str, typer.Argument(help="Tenant name.")], db: Db) -> None:
    """Revoke the tenant's key at once (its sessions stay stored)."""
    with open_store(db) as store:
        revoke_tenant(store, name)
    typer.echo(f"tenant {name!r} revoked")


@tenant_app.command("rotate-page-secret")
@handle_errors
def rotate_page_secret(db: Db) -> None:
    """Replace the secret that signs the session pages' cookies: every browser signed in
    to /ui/ must sign in again (on every replica at once)."""
    from ctxwarden.store.page_auth import rotate_secret

    with open_store(db) as store:
        rotate_secret(store)
    typer.echo("page secret rotated: every /ui/ sign-in must be made again")


@tenant_app.command("caps")
@handle_errors
def caps(
    name: Annotated[str, typer.Argument(help="Tenant name.")],
    db: Db,
    max_input_tokens: MaxInput = None,
    spend_cap: SpendCap = None,
    reset_spend: Annotated[bool, typer.Option("--reset-spend", help="Set the spend to 0.")] = False,
) -> None:
    """Change a tenant's caps (an option left out clears that cap)."""
    with open_store(db) as store:
        t = set_caps(store, name, max_input_tokens, spend_cap, reset_spend=reset_spend)
    typer.echo(
        f"tenant {name!r}: max_input_tokens={t.max_input_tokens} spend_cap={t.spend_cap_usd}"
    )


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")
