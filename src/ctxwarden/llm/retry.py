"""Retries for model calls: the policy, ``Retry-After``, and one loop for every provider.

Both official SDKs are built with ``max_retries=0`` and every client goes through
:func:`call_with_retry`, so backoff, ``Retry-After`` handling and the errors raised
are the same for every provider and tested once. The delay arithmetic
(:meth:`RetryPolicy.delay`, :func:`parse_retry_after`) is pure; only the loop sleeps.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ctxwarden.core.errors import ProviderError, ProviderTimeout, UsageError

__all__ = ["Failure", "RetryPolicy", "SDKErrors", "call_with_retry", "parse_retry_after"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a failed call.

    Retried: HTTP 408, 409, 429 and 5xx, connection errors and timeouts. The n-th retry
    waits ``base_delay * 2**(n-1)`` capped at ``max_delay``, spread by ``± jitter``
    (a fraction) so many clients do not retry in step. A ``Retry-After`` from the
    server replaces that delay; one longer than ``max_retry_after`` ends the retries
    at once, since a summariser should fall back rather than block for minutes.
    """

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    jitter: float = 0.2
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise UsageError("retry delays must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise UsageError(f"jitter is a fraction between 0 and 1, got {self.jitter}")

    def delay(
        self,
        retry: int,
        retry_after: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry_after is not None:
            return max(0.0, retry_after)
        backoff = min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))
        return max(0.0, backoff * (1 + self.jitter * (2 * rand() - 1)))


RETRYABLE_STATUS = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, from ``retry-after-ms`` or ``retry-after``.

    ``retry-after`` may be seconds (fractions accepted) or an HTTP date; anything
    unreadable counts as absent.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class Failure:
    """A failed attempt, classified: the error to raise if we give up, and whether to retry."""

    error: ProviderError
    retryable: bool
    retry_after: float | None = None


class SDKErrors:
    """The exception classes of one Stainless-generated SDK (openai and anthropic share
    the shape: ``APIStatusError`` with ``status_code``/``response``, ``APITimeoutError``,
    ``APIConnectionError``, ``APIResponseValidationError``)."""

    def __init__(self, module: Any, provider: str) -> None:
        self.status = module.APIStatusError
        self.timeout = module.APITimeoutError
        self.connection = module.APIConnectionError
        self.validation = module.APIResponseValidationError
        self.provider = provider

    def classify(self, exc: BaseException) -> Failure | None:
        """Map an SDK exception to a :class:`Failure`; ``None`` means "not ours, re-raise"."""
        provider = self.provider
        if isinstance(exc, self.timeout):
            return Failure(
                ProviderTimeout(f"{provider}: request timed out", provider=provider), True
            )
        if isinstance(exc, self.connection):
            msg = f"{provider}: connection failed ({exc})"
            return Failure(ProviderError(msg, provider=provider), True)
        if isinstance(exc, self.validation):
            status = getattr(exc, "status_code", None)
            msg = f"{provider}: the response could not be read ({exc})"
            return Failure(ProviderError(msg, status=status, provider=provider), False)
        if isinstance(exc, self.status):
            status = int(exc.status_code)
            headers = dict(exc.response.headers) if exc.response is not None else {}
            msg = f"{provider}: HTTP {status}: {_short(getattr(exc, 'message', str(exc)))}"
            err = ProviderError(msg, status=status, provider=provider)
            return Failure(err, is_retryable_status(status), parse_retry_after(headers))
        if isinstance(exc, ValueError):  # a 2xx body that is not JSON
            msg = f"{provider}: the response is not valid JSON ({exc})"
            return Failure(ProviderError(msg, provider=provider), False)
        return None


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _gave_up(err: ProviderError, why: str) -> ProviderError:
    return type(err)(f"{err} ({why})", status=err.status, provider=err.provider)


async def call_with_retry(
    attempt: Callable[[], Awaitable[T]],
    classify: Callable[[BaseException], Failure | None],
    policy: RetryPolicy,
    *,
    deadline: float | None = None,
    provider: str = "provider",
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``attempt`` until it succeeds, a failure is final, or attempts run out.

    ``deadline`` bounds the whole call in seconds, retries and waits included: an
    attempt still running when it passes is cancelled, and a retry whose wait would end
    past it is not made (:class:`ProviderTimeout`). The :class:`ProviderError` raised
    names the status and how many attempts were made.
    """
    end = None if deadline is None else clock() + deadline
    for number in range(1, policy.max_attempts + 1):
        try:
            if end is None:
                return await attempt()
            async with asyncio.timeout(max(0.0, end - clock())) as scope:
                return await attempt()
        except (ProviderError, asyncio.CancelledError):
            raise
        except TimeoutError as exc:
            if end is None or not scope.expired():
                raise
            raise ProviderTimeout(
                f"{provider}: no answer within the {deadline:g}s deadline "
                f"({number} attempt{'s' if number > 1 else ''})",
                provider=provider,
            ) from exc
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            last = number == policy.max_attempts
            too_long = (
                failure.retry_after is not None and failure.retry_after > policy.max_retry_after
            )
            if not failure.retryable or last or too_long:
                err = failure.error
                if failure.retryable:
                    why = (
                        f"Retry-After {failure.retry_after:.0f}s exceeds the policy's "
                        f"max_retry_after {policy.max_retry_after:.0f}s"
                        if too_long
                        else f"after {number} attempts"
                    )
                    err = _gave_up(err, why)
                raise err from exc
            wait = policy.delay(number, failure.retry_after)
            if end is not None and clock() + wait >= end:
                why = f"after {number} attempts: the {deadline:g}s deadline leaves no time to retry"
                raise _gave_up(failure.error, why) from exc
            await sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
