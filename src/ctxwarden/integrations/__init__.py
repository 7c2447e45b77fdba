"""Adapters for the frameworks agents are built in (R19).

Each submodule is one import away and loads its framework only when imported, so
``import ctxwarden`` (and this package) loads none of them:

- :mod:`ctxwarden.integrations.langchain`: ``ContextMiddleware``, a LangChain v1
  ``AgentMiddleware`` (``pip install 'ctxwarden[langchain]'``);
- :mod:`ctxwarden.integrations.openai_agents`: ``CtxwardenSession`` and
  ``context_filter`` for the OpenAI Agents SDK (``ctxwarden[openai-agents]``);
- :mod:`ctxwarden.integrations.pydantic_ai`: ``ContextCapability`` and
  ``history_processor`` for pydantic-ai (``ctxwarden[pydantic-ai]``).

Every adapter is non-destructive: the framework's own state keeps the full history;
only what one model call receives is built, by the same ``build_context`` every other
caller uses, with the previous build passed so decisions stay sticky. Each exposes the
last build's audit as ``.last_audit``.
"""
