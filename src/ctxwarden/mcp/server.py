"""The MCP server: two tools over a store, for any transport (:mod:`.tools` does the work).

Built on the official ``mcp`` SDK (``MCPServer``). What differs between the transports is
an :class:`Access`: whose sessions the caller may read (a fixed tenant on stdio, the
tenant whose key the HTTP request carries) and how a blocking store read is run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import Field

from ctxwarden._version import __version__
from ctxwarden.core.errors import MissingDependencyError, UnknownHandleError
from ctxwarden.mcp.tools import recall_original, search_dropped
from ctxwarden.session.recall import RECALL_TOOL_NAME
from ctxwarden.store.base import SessionStore

try:  # at module level: the SDK reads the tools' annotations (Context) from here
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as exc:  # pragma: no cover - the mcp extra brings it
    raise MissingDependencyError("the MCP server", "mcp") from exc

__all__ = ["SEARCH_TOOL_NAME", "Access", "build_server"]

T = TypeVar("T")
SEARCH_TOOL_NAME = "ctxwarden_search"

_RECALL = (
    "Get back, verbatim, an earlier message of this conversation that the context shows "
    "only in part (a masked or truncated tool result, a recalled passage, a message left "
    "out). Pass the handle shown with it, such as cw:msg:m12."
)
_SEARCH = (
    "Search the earlier messages of this conversation that are no longer in the context "
    "(left out, summarised, masked or truncated) by words; returns the best matches with "
    "their handles (get one whole with ctxwarden_recall)."
)
_INSTRUCTIONS = (
    "ctxwarden keeps this agent's context small: older tool results are masked or cut and "
    "old messages left out, each shown with a handle like cw:msg:m12. Call ctxwarden_recall "
    "with a handle to read the original, or ctxwarden_search with words to find one."
)
Handle = Annotated[str, Field(description="The handle shown in the context, e.g. cw:msg:m12.")]
Words = Annotated[str, Field(description="Words to look for, e.g. a file name, an id, an error.")]
SessionArg = Annotated[
    str | None,
    Field(description="The ctxwarden session id, when known (default: found from the handle)."),
]


class Access(Protocol):
    """Whose sessions a request may read, and how the store is read."""

    @property
    def store(self) -> SessionStore:
        """The store the tools read."""
        ...

    async def tenant(self, headers: Mapping[str, str] | None) -> str:
        """The caller's tenant (raises when the caller may not read any)."""
        ...

    def session(self, headers: Mapping[str, str] | None) -> str | None:
        """The session hint: the session the caller named outside the tool's arguments."""
        ...

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a blocking store read, off the event loop."""
        ...


def build_server(access: Access) -> MCPServer:
    """An ``MCPServer`` exposing ``ctxwarden_recall`` and ``ctxwarden_search``."""
    server: MCPServer = MCPServer(
        "ctxwarden", instructions=_INSTRUCTIONS, version=__version__, log_level="WARNING"
    )

    @server.tool(name=RECALL_TOOL_NAME, description=_RECALL, structured_output=False)
    async def ctxwarden_recall(ctx: Context, handle: Handle, session: SessionArg = None) -> str:
        tenant = await access.tenant(ctx.headers)
        try:
            _, text = await access.run(
                recall_original, access.store, tenant, handle, session, access.session(ctx.headers)
            )
        except UnknownHandleError as exc:
            raise ToolError(str(exc)) from None
        return text

    @server.tool(name=SEARCH_TOOL_NAME, description=_SEARCH)
    async def ctxwarden_search(
        ctx: Context, words: Words, session: SessionArg = None, limit: int = 5
    ) -> dict[str, Any]:
        tenant = await access.tenant(ctx.headers)
        limit = max(1, min(limit, 50))
        found, hits = await access.run(
            search_dropped, access.store, tenant, words, session, access.session(ctx.headers),
            limit,
        )  # fmt: skip
        return {"session": found, "hits": [h.to_dict() for h in hits]}

    return server
