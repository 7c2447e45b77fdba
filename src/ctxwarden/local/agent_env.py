"""What the wrapped agent's environment says, and where the server's upstreams come from.

For the agent (each client's own variables, so no agent needs to change):

- ``OPENAI_BASE_URL`` = the proxy's ``/v1`` and ``OPENAI_API_KEY`` = the local tenant's
  key: the ``openai`` SDK, the OpenAI Agents SDK and the Codex CLI read both;
- ``ANTHROPIC_BASE_URL`` = the proxy and ``ANTHROPIC_API_KEY`` = the same key: the
  ``anthropic`` SDK and Claude Code read both;
- ``GOOGLE_GEMINI_BASE_URL`` = the proxy and ``GEMINI_API_KEY`` = the same key: the
  Gemini CLI and the ``google-genai`` SDK read both (``GOOGLE_API_KEY``, which the SDK
  prefers, is removed from the agent's environment);
- ``CTXWARDEN_SESSION`` = a per-run id (``wrap-`` and 12 hex digits), and
  ``CTXWARDEN_URL``: an agent of your own can send the id as ``X-Ctxwarden-Session``
  (``default_headers=``), and ``ctxwarden mcp`` started by the agent looks there first.

No SDK above reads extra request headers from the environment except Claude Code
(``ANTHROPIC_CUSTOM_HEADERS``), and Claude Code interleaves several conversations in one
run (the main loop, sub-agents, short side calls): one session id for all of them would
make the proxy fork a branch at every switch. So ``wrap`` sets no session header unless
asked (``--session-header``, which sets ``ANTHROPIC_CUSTOM_HEADERS``); without one the
proxy gives each conversation its own session from its system prompt and first message.

For the server, from the user's environment as it was before ``wrap``: the upstream
keys (``CTXWARDEN_UPSTREAM_API_KEY``, else ``OPENAI_API_KEY``; ``CTXWARDEN_ANTHROPIC_API_KEY``,
else ``ANTHROPIC_API_KEY``; ``CTXWARDEN_GEMINI_API_KEY``, else ``GEMINI_API_KEY``, else
``GOOGLE_API_KEY``) and the upstream URLs (``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL`` /
``GOOGLE_GEMINI_BASE_URL`` when set, so an agent already pointed at OpenRouter or a gateway
stays pointed there, else the providers' own). A value that is already this proxy's (a
``cwk_`` key, a URL of a server of this data dir: a shell where ``--print-env`` was
evaluated) is ignored, so the proxy never forwards to itself.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ctxwarden.service.keys import KEY_PREFIX

__all__ = [
    "ANTHROPIC_DEFAULT",
    "GEMINI_DEFAULT",
    "OPENAI_DEFAULT",
    "AgentEnv",
    "export_lines",
    "upstream_key",
    "upstream_url",
]

OPENAI_DEFAULT = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT = "https://api.anthropic.com"
GEMINI_DEFAULT = "https://generativelanguage.googleapis.com"
_KEYS = {
    "openai": ("CTXWARDEN_UPSTREAM_API_KEY", "OPENAI_API_KEY"),
    "anthropic": ("CTXWARDEN_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
    "gemini": ("CTXWARDEN_GEMINI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"),
}
_URLS = {
    "openai": ("OPENAI_BASE_URL", OPENAI_DEFAULT),
    "anthropic": ("ANTHROPIC_BASE_URL", ANTHROPIC_DEFAULT),
    "gemini": ("GOOGLE_GEMINI_BASE_URL", GEMINI_DEFAULT),
}
SESSION_HEADER = "X-Ctxwarden-Session"


def upstream_key(env: Mapping[str, str], api: str) -> str | None:
    """The user's upstream key for ``api`` ("openai", "anthropic" or "gemini"), see the
    module."""
    for name in _KEYS[api]:
        value = env.get(name, "").strip()
        if value and not value.startswith(KEY_PREFIX):
            return value
    return None


def upstream_url(env: Mapping[str, str], api: str, own: tuple[str, ...] = ()) -> str:
    """The upstream URL for ``api`` from the user's base URL variable, unless it is one of
    ``own`` (this data dir's servers), else the provider's."""
    name, default = _URLS[api]
    value = env.get(name, "").strip().rstrip("/")
    if not value or any(value.startswith(url) for url in own):
        return default
    return value


@dataclass(frozen=True)
class AgentEnv:
    """The variables the wrapped command gets (added to the user's environment)."""

    url: str
    key: str
    session: str
    session_header: bool = False

    @staticmethod
    def run_id(session: str | None = None) -> str:
        """``session`` checked as the proxy checks the header (a bad one is an
        :class:`~ctxwarden.core.errors.InvalidMessageError`), else ``wrap-`` and 12 hex digits."""
        from ctxwarden.service.history import valid_session_id

        return valid_session_id(session) if session else f"wrap-{uuid.uuid4().hex[:12]}"

    def variables(self) -> dict[str, str]:
        out = {
            "OPENAI_BASE_URL": f"{self.url}/v1",
            "OPENAI_API_KEY": self.key,
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": self.key,
            "GOOGLE_GEMINI_BASE_URL": self.url,
            "GEMINI_API_KEY": self.key,
            "CTXWARDEN_URL": self.url,
            "CTXWARDEN_SESSION": self.session,
        }
        if self.session_header:
            out["ANTHROPIC_CUSTOM_HEADERS"] = f"{SESSION_HEADER}: {self.session}"
        return out

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with :meth:`variables` set, and without ``ANTHROPIC_AUTH_TOKEN`` (the
        ``anthropic`` SDK would send it as ``Authorization: Bearer``, which the proxy reads
        before ``x-api-key`` as the tenant key) or ``GOOGLE_API_KEY`` (``google-genai``
        prefers it to ``GEMINI_API_KEY``)."""
        dropped = ("ANTHROPIC_AUTH_TOKEN", "GOOGLE_API_KEY")
        out = {k: v for k, v in env.items() if k not in dropped}
        return {**out, **self.variables()}


def export_lines(variables: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines a POSIX shell can ``eval``."""
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]
