"""One proxied call, apart from its wire format: sync, build, audit; then store the reply.

:func:`prepare` runs before any byte goes upstream, so every refusal (a budget smaller
than what must be kept, a malformed message, an unknown model without a budget) is a
plain error response. It appends the client's new messages
(:func:`~ctxwarden.service.history.sync_history`) and builds with
:meth:`ctxwarden.Session.build_unlogged` — the build every caller uses — within the
smallest of the client's ``X-Ctxwarden-Max-Input-Tokens``, the tenant's cap and the
policy's budget. The build's audit (status ``forwarded``) and sticky decisions are
logged once the context is written upstream, while upstream reads it
(:mod:`~ctxwarden.service.forward`), and in any case before the call ends: a crash in
between (a millisecond or so) leaves no row for that call, as a crash before it was
sent does. :func:`finish` stores the reply (marked ``partial`` when the stream was cut),
the usage and its price, closes the build's row and moves the head past the reply in one
transaction: a crash leaves all of it or none (then the row still says ``forwarded`` and
the next call extends the head as before).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctxwarden import BuiltContext, Session, TokenCounter, Usage, estimate_cost, get_model
from ctxwarden.core.errors import BudgetError, ConfigError, UnknownModelError, VersionConflict
from ctxwarden.core.messages import Message
from ctxwarden.core.tokens.counter import REPLY_PRIMING
from ctxwarden.service.history import message_key, sync_history
from ctxwarden.service.hub import Hub
from ctxwarden.service.prepared import Call, Prepared, Replay
from ctxwarden.service.recall_rounds import proxy_recall
from ctxwarden.service.replay import REQUEST_META
from ctxwarden.store.service_tables import CallEnd, add_spend, end_call

__all__ = ["Call", "Prepared", "Replay", "charge", "finish", "prepare"]


def _budget(hub: Hub, call: Call) -> int | None:
    """The smallest of the client's ask, the tenant's cap and the policy's budget."""
    asks = [b for b in (call.max_input_tokens, call.tenant.record.max_input_tokens) if b]
    if not asks:
        return None
    try:
        window: int | None = get_model(call.model, hub.config.registry).context_window
    except UnknownModelError:
        window = None
    policy = call.tenant.policy
    if policy.max_input_tokens is not None or window is not None:
        asks.append(policy.budget_for(window))
    return min(asks)


def _fits(
    hub: Hub,
    call: Call,
    counter: TokenCounter,
    budget: int | None,
    tools: Sequence[Mapping[str, Any]] | None,
) -> Callable[[list[Message], tuple[Session, int] | None], None]:
    """The build's first refusal, made before the call's messages are stored: a newest
    user message that, with the system prompt and the request's tools, the budget cannot
    hold (a 30 MB message, a tool list larger than the budget) is a
    :class:`~ctxwarden.core.errors.BudgetError` and nothing of the call is kept. The same
    sum the build makes (:mod:`ctxwarden.pipeline.engine`), so it refuses nothing the
    build would take. The system prompt is the call's own when it starts the new
    messages, else the one the session stored (``extends``: the session the messages
    extend and the tokens it holds), read only when the stored history could not all fit
    beside the newest message anyway (a read the build makes next, from the session's
    memo)."""

    def check(new: list[Message], extends: tuple[Session, int] | None) -> None:
        newest = next((m for m in reversed(new) if m.role == "user"), None)
        limit = budget if budget is not None else _policy_budget(hub, call)
        if newest is None or limit is None:
            return
        system = 0
        for m in new:
            if m.role != "system":
                break
            system += counter.count_message(m)
        minimum = REPLY_PRIMING + counter.count_tools(tools) + system
        minimum += counter.count_message(newest)
        if extends is not None and new[0].role != "system":
            session, stored_tokens = extends
            if minimum + stored_tokens > limit:
                minimum += sum(map(counter.count_message, session.leading_system()))
        if minimum > limit:
            raise BudgetError(
                f"budget of {limit:,} tokens cannot hold the system prompt and the newest "
                f"user message: budget must be at least {minimum:,} tokens",
                minimum=minimum,
            )

    return check


def _policy_budget(hub: Hub, call: Call) -> int | None:
    """The budget a build without an asked one takes: the policy's for the model."""
    try:
        window: int | None = get_model(call.model, hub.config.registry).context_window
    except UnknownModelError:
        window = None
    try:
        return call.tenant.policy.budget_for(window)
    except ConfigError:
        return None


def _with_summary_job(
    hub: Hub, call: Call, session: Session
) -> Callable[[BuiltContext], BuiltContext] | None:
    """With ``--broker``: enqueue a summary the build found due; a deferral is a warning
    in the build's audit (added before the build is logged)."""
    jobs = hub.summaries
    if jobs is None:
        return None

    def amend(built: BuiltContext) -> BuiltContext:
        deferred = jobs.after_build(call.tenant, session, call.model, built)
        if deferred is None:
            return built
        warnings = (*built.audit.warnings, deferred)
        return replace(built, audit=replace(built.audit, warnings=warnings))

    return amend


def _amend(
    first: Callable[[BuiltContext], BuiltContext] | None,
    then: Callable[[BuiltContext], BuiltContext] | None,
) -> Callable[[BuiltContext], BuiltContext] | None:
    """``first`` and then the route's own amendment (:attr:`Call.amend`), either absent."""
    if first is None or then is None:
        return first or then
    return lambda built: then(first(built))


def prepare(hub: Hub, call: Call) -> Prepared | Replay:
    """Sync the history, build the context, store the build's audit (see the module);
    a retry of the session's last call is its :class:`Replay` (:mod:`.replay`)."""
    tenant = call.tenant.name
    counter = TokenCounter.for_model(call.model, hub.config.registry)
    budget = _budget(hub, call)
    tools = call.tools or None
    if proxy_recall(call.tenant.policy, call.tools):  # offered upstream: counted in the budget
        from ctxwarden.session.recall import recall_tool

        tools = [*(tools or ()), recall_tool()]
    synced = sync_history(
        hub.store,
        lambda sid: hub.session(tenant, sid, call.model),
        tenant,
        call.client_id,
        call.keys,
        call.parse,
        counter.count_message,
        check=_fits(hub, call, counter, budget, tools),
        request=call.request if call.retry else None,  # (only a retry is recognised)
    )
    if synced.replayed is not None:
        return Replay(call, synced.replayed, synced.session.session_id)
    if synced.forked:
        hub.metrics.branches.labels(call.api).inc()
    kw: dict[str, Any] = {"max_input_tokens": budget} if budget is not None else {}
    pending = synced.session.build_unlogged(
        model=call.model,
        policy=call.tenant.policy,
        tools=tools,
        # the summary is laid out, and a due one planned, as the summariser the service
        # runs (--summarizer, also given with --broker) would: the worker's fold and the
        # next build's view are the ones build_context(summarizer=...) makes
        summarizer=hub.config.summarizer,
        build_id=uuid.uuid4().hex,
        status="forwarded",
        amend=_amend(_with_summary_job(hub, call, synced.session), call.amend),
        **kw,
    )
    built = pending.built
    prepared = Prepared(call, synced, pending)
    m, api = hub.metrics, call.api
    m.labelled(m.history_tokens, api).inc(prepared.history_tokens)
    m.labelled(m.input_tokens, api).inc(built.input_tokens)
    m.labelled(m.saved_tokens, api).inc(prepared.saved_tokens)
    if built.audit.fill_ratio is not None:
        m.labelled(m.fill_ratio, api).observe(built.audit.fill_ratio)
    return prepared


def charge(hub: Hub, call: Call, session: Session, usage: Usage) -> None:
    """Upstream's usage on the session, its price on the tenant's spend, in the metrics
    (each upstream request of a call: the reply's, and the proxy's recall rounds)."""
    session.record_usage(usage, call.model)
    add_spend(hub.store, call.tenant.name, _dollars(hub, call, usage))
    _count_tokens(hub, call, usage)


def _dollars(hub: Hub, call: Call, usage: Usage) -> float:
    try:
        return estimate_cost(usage, call.model, hub.config.registry)
    except UnknownModelError:
        return 0.0  # a model without prices: tokens still count


def _count_tokens(hub: Hub, call: Call, usage: Usage) -> None:
    m = hub.metrics
    m.labelled(m.cached_tokens, call.api).inc(usage.cached_input_tokens)
    m.labelled(m.output_tokens, call.api).inc(usage.output_tokens)


def finish(
    hub: Hub, prepared: Prepared, reply: Message | None, usage: Usage | None, status: str
) -> None:
    """Store the reply, the usage and its price, close the build and move the head past
    the reply: one transaction (the reply's append), so a failure leaves none of it."""
    call, synced = prepared.call, prepared.synced
    session, head = synced.session, synced.head
    prepared.pending.log()  # (written already unless upstream failed before the request went)
    dollars = _dollars(hub, call, usage) if usage is not None else 0.0
    end = CallEnd(
        call.tenant.name,
        session.session_id,
        prepared.build_id,
        status,
        usage=usage,
        model=call.model,
        dollars=dollars,
    )
    if reply is not None and call.request is not None:  # what a retry is recognised by
        reply = replace(reply, meta={**reply.meta, REQUEST_META: call.request})
    if reply is not None:
        chain = synced.chain.copy()
        chain.update(message_key(reply))
        counter = TokenCounter.for_model(call.model, hub.config.registry)
        moved = replace(
            head,
            count=head.count + 1,
            chain=chain.hexdigest(),
            history_tokens=head.history_tokens + counter.count_message(reply),
        )
        with_reply = replace(end, head=moved, expected=head)
        try:  # right after the history it answers, or not at all
            session.append(
                [reply],
                expect_next=head.count,
                also=lambda tx, _seqs: end_call(hub.store, with_reply, tx),
            )
        except VersionConflict:  # another replica served a call of this session meanwhile
            reply, end = None, replace(end, status="reply_not_stored")
    if reply is None:
        end_call(hub.store, end)
        if status.startswith("upstream_"):  # unanswered: nothing of it is cached upstream
            session.forget_sent()
    if usage is not None:
        _count_tokens(hub, call, usage)
