"""OpenAI Agents SDK: ``CtxwardenSession`` (the ``Session`` protocol) and ``context_filter``.

Usage::

    from agents import Agent, RunConfig, Runner
    from ctxwarden.integrations.openai_agents import CtxwardenSession, context_filter

    session = CtxwardenSession("user-42", db="sqlite:///agent.db")
    ctx = context_filter(model="gpt-4o", max_input_tokens=8000)
    result = await Runner.run(agent, "hi", session=session,
                              run_config=RunConfig(call_model_input_filter=ctx))
    ctx.last_audit

The session keeps the full history in ctxwarden's store (SQLite or PostgreSQL, one
schema) and returns exactly the items it was given; the filter builds what each model
call receives. The agent's instructions arrive as ``ModelInputData.instructions``: they
are the system prompt, count against the budget, and go back as instructions, with
ctxwarden's layers (facts, summary, ledger) after them; instructions (or input items)
fed back from an earlier call have those layers replaced, never stacked. The agent's function tools
count too. Items convert as :mod:`ctxwarden.integrations._responses` describes: a
reasoning item stays with the item after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.core.messages import Message
from ctxwarden.integrations._common import (
    FOLD_SEPARATOR,
    ContextBuilder,
    is_layer,
    layer_text,
    split_system,
)
from ctxwarden.integrations._responses import (
    META,
    item_dict,
    items_from_message,
    messages_from_items,
)

try:
    from agents import FunctionTool
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.run_config import CallModelData, ModelInputData
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("ctxwarden.integrations.openai_agents", "openai-agents") from exc

if TYPE_CHECKING:
    from ctxwarden import Audit, BuiltContext, Policy, Summarizer

__all__ = ["ContextFilter", "CtxwardenSession", "context_filter", "messages_from_items"]

_INSTRUCTIONS_ID = "oa:instructions"
_STICKY = "openai_agents"


class ContextFilter:
    """A ``RunConfig.call_model_input_filter`` that builds each call with ctxwarden."""

    def __init__(
        self,
        model: str = "gpt-4o",
        max_input_tokens: int | None = None,
        *,
        policy: Policy | None = None,
        summarizer: str | Summarizer | None = None,
    ) -> None:
        self.builder = ContextBuilder(model, max_input_tokens, policy, summarizer)

    @property
    def last_audit(self) -> Audit | None:
        return self.builder.last_audit

    @property
    def last_build(self) -> BuiltContext | None:
        return self.builder.last

    def build(
        self, data: ModelInputData, tools: list[dict[str, Any]] | None = None
    ) -> ModelInputData:
        """The model input with its context built (instructions first, layers after)."""
        instructions = data.instructions
        history = messages_from_items(data.input)
        firsts = {m.id: m for m in history}
        if instructions:
            history.insert(0, Message.system(instructions, id=_INSTRUCTIONS_ID))
        built = self.builder.build(history, tools or None)
        head, rest = split_system(built.messages)
        kept = [m for m in head if not is_layer(m) and m.id != _INSTRUCTIONS_ID] + rest
        # instructions that were an earlier call's output (fed back) lost their layers
        instructions = next((m.text for m in head if m.id == _INSTRUCTIONS_ID), None)
        layers = layer_text(head)
        if layers:
            instructions = instructions + FOLD_SEPARATOR + layers if instructions else layers
        items: list[TResponseInputItem] = [
            item  # type: ignore[misc]
            for m in kept
            for item in items_from_message(m, firsts.get(m.id))
        ]
        return ModelInputData(input=items, instructions=instructions)

    def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        tools = [_tool_dict(t) for t in data.agent.tools if isinstance(t, FunctionTool)]
        return self.build(data.model_data, tools)


def context_filter(
    model: str = "gpt-4o",
    max_input_tokens: int | None = None,
    *,
    policy: Policy | None = None,
    summarizer: str | Summarizer | None = None,
) -> ContextFilter:
    """A ``call_model_input_filter`` for ``RunConfig``; its ``.last_audit`` is the last build's."""
    return ContextFilter(model, max_input_tokens, policy=policy, summarizer=summarizer)


def _tool_dict(tool: FunctionTool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
        },
    }


class CtxwardenSession:
    """The SDK's ``Session`` protocol over ctxwarden's store; nothing stored is lost.

    Each item is stored as one message (its text for ctxwarden's own tools, the exact
    item in the message's metadata) and read back as given. The store is append-only:
    ``pop_item`` and ``clear_session`` hide items (recorded in the session's sticky
    state) rather than delete them. One ``CtxwardenSession`` owns its session id.
    """

    def __init__(
        self,
        session_id: str,
        db: str = "sqlite:///agent.db",
        *,
        tenant: str = "openai-agents",
        session_settings: SessionSettings | None = None,
        model: str = "gpt-4o",
    ) -> None:
        from ctxwarden import Session

        self.session_id = session_id
        self.session_settings = session_settings
        self._session = Session(db, session_id, tenant=tenant, model=model)

    def close(self) -> None:
        self._session.close()

    # -- the protocol (the store is synchronous: each call runs in a worker thread) -----------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        return await asyncio.to_thread(self._get, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await asyncio.to_thread(self._add, items)

    async def pop_item(self) -> TResponseInputItem | None:
        return await asyncio.to_thread(self._pop)

    async def clear_session(self) -> None:
        await asyncio.to_thread(self._clear)

    # -- the work -------------------------------------------------------------------------------

    def _hidden(self) -> tuple[int, set[int]]:
        state = self._session.record.sticky.get(_STICKY) or {}
        return int(state.get("from", 0)), set(state.get("hidden", ()))

    def _save(self, start: int, hidden: set[int]) -> None:
        s = self._session
        sticky = {_STICKY: {"from": start, "hidden": sorted(h for h in hidden if h >= start)}}
        s.store.save_sticky(s.tenant, s.session_id, sticky)

    def _visible(self) -> list[tuple[int, Any]]:
        start, hidden = self._hidden()
        s = self._session
        return [
            (m.seq, m.message.meta[META]["item"])
            for m in s.store.iter_messages(s.tenant, s.session_id)
            if m.seq >= start and m.seq not in hidden
        ]

    def _get(self, limit: int | None) -> list[TResponseInputItem]:
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        items = [item for _, item in self._visible()]
        if limit is None:
            return items
        return items[-limit:] if limit > 0 else []

    def _add(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        start = self._session.record.next_seq
        messages = []
        for i, item in enumerate(items):
            raw = item_dict(item)
            m = messages_from_items([raw])[0]
            meta: Mapping[str, Any] = {META: {"item": raw}}
            messages.append(replace(m, id=f"oa-item{start + i}", meta=meta))
        self._session.append(messages, check_pairs=False)  # raw items, paired when read

    def _pop(self) -> TResponseInputItem | None:
        visible = self._visible()
        if not visible:
            return None
        seq, item = visible[-1]
        start, hidden = self._hidden()
        self._save(start, hidden | {seq})
        return item  # type: ignore[no-any-return]

    def _clear(self) -> None:
        self._save(self._session.record.next_seq, set())
