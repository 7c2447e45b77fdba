"""ctxwarden as an MCP server: recall and search of a session's dropped history (R18, R20).

Coding agents load their tools from MCP servers, not from the proxy's requests, so an
agent whose context shows a ``cw:msg:`` handle (a masked or truncated result, a message
left out) gets the original back through this server:

- ``ctxwarden_recall(handle)``: the original of the message, byte for byte, from the store;
- ``ctxwarden_search(words)``: the session's dropped history ranked by BM25 for the words,
  each hit with its handle.

Two transports, one set of tools (:mod:`.tools`, :mod:`.server`): ``ctxwarden mcp``
over stdio on a store URL (the agent starts it), and streamable HTTP on the service at
``/mcp`` (:mod:`.http`), where the tenant key is required as on every other route.
Needs the ``mcp`` extra (``pip install "ctxwarden[mcp]"``).
"""
