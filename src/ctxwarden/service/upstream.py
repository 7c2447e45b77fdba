"""The upstream provider: one pooled async HTTP client per wire format.

Requests go out with the server's (or the tenant's) upstream key, never the client's
ctxwarden key. Responses are opened streaming in both modes, so the status is known
before any byte goes to the client: a 4xx/5xx is returned whole, with its status and
body; a timeout is a 504 and an unreachable upstream a 502, in the provider's error
shape. ``httpx2`` is the HTTP client the ``openai`` and ``anthropic`` SDKs use; its
connections are :mod:`~ctxwarden.service.upstream_transport`'s.

One client serves every tenant, so it keeps no cookies: an HTTP client's jar would send
a cookie one tenant's response set (a CDN's ``__cf_bm``, a load balancer's affinity) on
every later call, another tenant's too, tying their traffic together upstream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from http.cookiejar import DefaultCookiePolicy
from typing import Any

from ctxwarden.core.errors import MissingDependencyError
from ctxwarden.service.upstream_transport import SENT, Transport

__all__ = ["Upstream", "UpstreamFailure"]

_PASS_HEADERS = ("anthropic-version", "anthropic-beta", "openai-organization", "openai-project")


class UpstreamFailure(Exception):
    """The upstream call failed before a response: ``status`` is what the client gets."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


class Upstream:
    """``kind`` is ``"openai"`` (``Authorization: Bearer``), ``"anthropic"`` (``x-api-key``)
    or ``"gemini"`` (``x-goog-api-key``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        kind: str,
        *,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        try:
            import httpx2
        except ImportError as exc:  # pragma: no cover - the server extra brings it
            raise MissingDependencyError("ctxwarden serve", "server") from exc
        self._httpx = httpx2
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.kind = kind
        self._urls: dict[str, Any] = {}
        # a connection refused or reset while connecting never reached upstream:
        # retrying it is safe (nothing is retried once the request was sent)
        transport = self._transport = Transport(retries=2, max_connections=512, max_keepalive=128)
        self.client = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout, connect=connect_timeout), transport=transport
        )
        self.client.cookies.jar.set_policy(DefaultCookiePolicy(allowed_domains=[]))  # none kept
        # what the client's build_request merges into each request, merged once
        self._defaults = {name.lower(): value for name, value in self.client.headers.items()}
        self._timeout = self.client.timeout.as_dict()

    async def aclose(self) -> None:
        await self.client.aclose()

    def headers(self, key: str | None, client: Mapping[str, str]) -> dict[str, str]:
        out = {"content-type": "application/json", "accept": client.get("accept", "*/*")}
        for name in _PASS_HEADERS:
            if name in client:
                out[name] = client[name]
        key = key or self.api_key
        if self.kind == "anthropic":
            out.setdefault("anthropic-version", "2023-06-01")
            if key:
                out["x-api-key"] = key
        elif self.kind == "gemini":
            if key:
                out["x-goog-api-key"] = key
        elif key:
            out["authorization"] = f"Bearer {key}"
        return out

    async def open(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        sent: Callable[[], Awaitable[None]] | None = None,
    ) -> Any:
        """Send ``body`` to ``path`` and return the response with its body unread;
        ``sent``, when given, is awaited once the request is written, before the
        response is waited for (what it raises closes the connection and is raised).

        The request is built with the client's default headers and timeouts, as its
        ``build_request`` would, and handed to the transport directly: what ``client.send``
        adds around it is for features this client does not use (auth flows, redirects,
        event hooks) or refuses (cookies): 0.7% of a proxied call's instructions (a
        ``urllib`` request built per response to look for cookies, among others), and
        ``build_request`` merged the same defaults into every request again."""
        url = self._urls.get(path)
        if url is None:  # parsed once per path: parsing is most of building a request
            url = self._urls[path] = self._httpx.URL(self.base_url + path)
        extensions: dict[str, Any] = {"timeout": self._timeout}
        if sent is not None:
            extensions[SENT] = sent
        request = self._httpx.Request(
            "POST", url, content=body, headers={**self._defaults, **headers}, extensions=extensions
        )
        try:
            response = await self._transport.handle_async_request(request)
            response.request = request
            return response
        except self._httpx.TimeoutException as exc:
            raise UpstreamFailure(504, f"upstream timed out: {type(exc).__name__}") from exc
        except self._httpx.HTTPError as exc:
            raise UpstreamFailure(502, f"upstream unreachable: {exc}") from exc

    async def get(self, path: str, headers: Mapping[str, str]) -> Any:
        try:
            return await self.client.get(self.base_url + path, headers=dict(headers))
        except self._httpx.TimeoutException as exc:
            raise UpstreamFailure(504, f"upstream timed out: {type(exc).__name__}") from exc
        except self._httpx.HTTPError as exc:
            raise UpstreamFailure(502, f"upstream unreachable: {exc}") from exc

    def is_timeout(self, exc: BaseException) -> bool:
        return isinstance(exc, self._httpx.TimeoutException)

    def is_transport_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._httpx.HTTPError)
