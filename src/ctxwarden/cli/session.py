"""``ctxwarden session ...``: a stored conversation from the shell (R13).

Mounted by the main CLI with ``app.add_typer(session_app, name="session")``. Each
command parses its options and calls :class:`~ctxwarden.session.session.Session`; nothing else
lives here. Errors print one ``error: ...`` line (exit 2 for a user mistake, 1 for a
runtime failure), never a traceback.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxwarden.cli._common import (
    RegistryOpt,
    SummarizerTimeoutOpt,
    handle_errors,
    registry_from,
    summarizer_spec,
)
from ctxwarden.core.errors import InvalidMessageError
from ctxwarden.formats.transcript import decode_json, read_text

__all__ = ["session_app"]

session_app = typer.Typer(
    name="session",
    help="Store a conversation and build its context from the store (SQLite or PostgreSQL).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

SessionSummarizerOpt = Annotated[
    str | None,
    typer.Option("--summarizer", help="'offline' or a provider spec (openai:gpt-4o-mini, ...)."),
]
Db = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="CTXWARDEN_DB",
        help="Store URL: sqlite:///path.db or postgresql://user@host/db.",
    ),
]
SessionId = Annotated[str, typer.Option("--session", "-s", help="Session id.")]
Tenant = Annotated[str, typer.Option("--tenant", help="Tenant the session belongs to.")]


def _read_messages(file: str | None) -> list[Any]:
    """A JSON list of OpenAI messages, ``{"messages": [...]}`` or one message object."""
    if file in (None, "-"):
        if file is None and sys.stdin.isatty():
            raise InvalidMessageError("no messages: give a JSON FILE or pipe JSON on stdin")
        text, source = sys.stdin.read(), "<stdin>"
    else:
        text, source = read_text(file), file
    data = decode_json(text, source=source)
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        data = data["messages"]
    return data if isinstance(data, list) else [data]


def _dump(data: Any) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False, indent=2))


@session_app.command("add")
@handle_errors
def add(
    db: Db,
    session: SessionId,
    file: Annotated[
        str | None, typer.Argument(metavar="FILE", help="Messages JSON ('-' or omitted: stdin).")
    ] = None,
    tenant: Tenant = "default",
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model the token counts are for.")
    ] = "gpt-4o",
    registry: RegistryOpt = None,
) -> None:
    """Append messages (all or none: one invalid message stores nothing)."""
    from ctxwarden.formats.openai import message_from_openai
    from ctxwarden.session.session import Session

    models = registry_from(registry)
    with Session(db, session, tenant=tenant, model=model, registry=models) as s:
        # ids left to the store (m<seq>), as Session.append does with dicts
        parsed = [message_from_openai(m, index=i) for i, m in enumerate(_read_messages(file))]
        seqs = s.append(parsed)  # checks ids and pairing against the stored last block
        typer.echo(f"added {len(seqs)} message(s) to {session}; it now holds {len(s)}", err=True)


@session_app.command("build")
@handle_errors
def build(
    db: Db,
    session: SessionId,
    tenant: Tenant = "default",
    model: Annotated[str, typer.Option("--model", "-m", help="Model to build for.")] = "gpt-4o",
    max_input_tokens: Annotated[
        int | None,
        typer.Option("--max-input-tokens", "-b", help="Input budget (default: policy/model)."),
    ] = None,
    policy: Annotated[Path | None, typer.Option("--policy", help="Policy TOML file.")] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write the audit JSON here.")
    ] = None,
    registry: RegistryOpt = None,
    summarizer: SessionSummarizerOpt = None,
    summarizer_timeout: SummarizerTimeoutOpt = None,
) -> None:
    """Print the context to send (OpenAI messages JSON), read from the store."""
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.session.session import Session

    loaded = Policy.from_toml(policy) if policy is not None else None
    models = registry_from(registry)
    spec = summarizer_spec(summarizer, summarizer_timeout)
    chosen = _summarizer(spec)[0] if spec is not None else None
    with Session(db, session, tenant=tenant, model=model, registry=models, summarizer=chosen) as s:
        kw: dict[str, Any] = (
            {} if max_input_tokens is None else {"max_input_tokens": max_input_tokens}
        )
        built = s.build(policy=loaded, **kw)
    for warning in built.audit.warnings:  # stdout is the context: warnings go to stderr
        typer.echo(f"warning: {warning}", err=True)
    if report is not None:
        report.write_text(json.dumps(built.audit.to_dict(), indent=2), encoding="utf-8")
    _dump(built.to_openai())


@session_app.command("summarize")
@handle_errors
def summarize(
    db: Db,
    session: SessionId,
    tenant: Tenant = "default",
    model: Annotated[str, typer.Option("--model", "-m", help="Model the session counts for.")] = (
        "gpt-4o"
    ),
    summarizer: SessionSummarizerOpt = "offline",
    policy: Annotated[
        Path | None, typer.Option("--policy", help="Policy TOML file (its [summary] trigger).")
    ] = None,
    registry: RegistryOpt = None,
    summarizer_timeout: SummarizerTimeoutOpt = None,
) -> None:
    """Fold what the policy's summary trigger says into the stored summary and facts."""
    from ctxwarden.pipeline.policy import Policy
    from ctxwarden.session.session import Session

    trigger = (Policy.from_toml(policy) if policy is not None else Policy()).summary
    chosen, extractor = _summarizer(
        summarizer_spec(summarizer or "offline", summarizer_timeout) or "offline"
    )
    models = registry_from(registry)
    with Session(db, session, tenant=tenant, model=model, registry=models) as s:
        written = s.summarize_sync(chosen, extractor, trigger=trigger)
    if written is None:
        typer.echo("no summary trigger fired: nothing folded")
        return
    level = ", meta-summary written" if written.meta else ""
    typer.echo(
        f"folded {written.folded} message(s) up to seq {written.covered_up_to_seq}{level}; "
        f"summary version {written.session.version}"
    )
    if written.error:
        typer.echo(f"warning: {written.error}", err=True)


def _summarizer(spec: str) -> tuple[Any, Any]:
    """The summariser and fact extractor a spec names ('offline' or a provider spec)."""
    from ctxwarden.pipeline.summarize import resolve_summarizer

    chosen, extractor, _free = resolve_summarizer(spec)
    return chosen, extractor


@session_app.command("show")
@handle_errors
def show(
    db: Db,
    session: SessionId,
    tenant: Tenant = "default",
    html: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write the session's page, every logged turn, to this file."
        ),
    ] = None,
) -> None:
    """Print the session's size, summary, facts, usage and cost; ``--html`` writes the
    turn-by-turn page (the one ``ctxwarden serve`` shows at /ui/) as one offline file."""
    from ctxwarden.core.errors import ConfigError
    from ctxwarden.session.session import Session
    from ctxwarden.store import open_store

    if html is not None:  # a report of a session that is not there is a typo, not a page
        with open_store(db) as store:
            if store.get_session(tenant, session) is None:
                raise ConfigError(
                    f"no session {session!r} of tenant {tenant!r} in {db} "
                    "(see `ctxwarden session list`)"
                )
    with Session(db, session, tenant=tenant) as s:
        record = s.record
        if html is not None:
            from ctxwarden.ui import render_report

            html.write_text(render_report(s.store, tenant, record, s.registry), "utf-8")
            typer.echo(f"wrote {html}", err=True)
        usage = record.total_usage
        covered = (  # (messages are numbered from 0, as in `session export`)
            f"covers messages 0-{record.summary_upto}"
            if record.summary_upto >= 0
            else "covers no message yet"
        )
        typer.echo(
            f"session {session} (tenant {tenant}): {record.next_seq} messages, "
            f"summary version {record.version}, {covered}"
        )
        typer.echo(
            f"usage: {usage.input_tokens} input ({usage.cached_input_tokens} cached), "
            f"{usage.output_tokens} output tokens in {usage.calls} call(s); ${record.dollars:.4f}"
        )
        facts = s.facts
        typer.echo("facts:" + ("" if facts else " none"))
        for key, value in facts.to_dict().items():
            typer.echo(f"  {key}: {json.dumps(value, ensure_ascii=False)}")
        levels = s.summary_state
        typer.echo(
            f"summary tiers: {len(levels.summaries)} level-one since the meta-summary, "
            f"meta-summary {'yes' if levels.meta_summary else 'none'}, {levels.cycles} cycle(s)"
        )
        ledger = s.ledger
        seeded = f" (seeded: messages before {ledger.since} not read)" if ledger.since else ""
        typer.echo(
            f"entity ledger: {len(ledger.ledger)} value(s) of messages "
            f"{ledger.since}-{ledger.upto}{seeded}"
            if ledger.upto >= 0
            else "entity ledger: none yet (no build has stored one)"
        )
        typer.echo("summary:" + (f"\n{record.summary}" if record.summary else " none"))


@session_app.command("export")
@handle_errors
def export(
    db: Db,
    session: SessionId,
    tenant: Tenant = "default",
    with_meta: Annotated[
        bool, typer.Option("--with-meta", help="Keep ctxwarden metadata (ids, pins, priority).")
    ] = False,
) -> None:
    """Print every message in order as OpenAI JSON."""
    from ctxwarden.session.session import Session

    with Session(db, session, tenant=tenant) as s:
        _dump(s.export(with_meta=with_meta))


@session_app.command("list")
@handle_errors
def list_(db: Db, tenant: Tenant = "default") -> None:
    """List the tenant's sessions: id, messages, summary version, last update."""
    from ctxwarden.store import open_store

    with open_store(db) as store:
        for rec in store.list_sessions(tenant):
            when = datetime.fromtimestamp(rec.updated_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
            typer.echo(f"{rec.session_id}\t{rec.next_seq}\tv{rec.version}\t{when}")
