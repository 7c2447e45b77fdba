"""Every exception ctxwarden raises, in one tree.

User mistakes (bad input, bad configuration) are kept apart from runtime failures
(a provider that times out, a database that is locked), so callers can tell "fix
your call" from "try again later"::

    CtxwardenError
    ├── UsageError                  the caller must change something
    │   ├── InvalidMessageError     a message (or transcript) is malformed
    │   ├── UnknownModelError       a model name not in the registry
    │   ├── UnknownHandleError      a recall handle that names no message
    │   ├── ConfigError             a policy / registry / spec file is wrong
    │   ├── BudgetError             the budget cannot hold what must be kept
    │   └── MissingDependencyError  an optional extra is not installed
    └── RuntimeFailure              the call was right, the world was not
        ├── ProviderError           a model call failed (after retries)
        │   └── ProviderTimeout
        ├── StoreError              the session store failed
        │   └── VersionConflict     an optimistic write lost a race
        └── SummarizationError      a summary or fact extraction failed

Messages say what to do next ("install ctxwarden[anthropic]", "budget must be at
least 1,412 tokens").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = [
    "BudgetError",
    "ConfigError",
    "CtxwardenError",
    "InvalidMessageError",
    "MissingDependencyError",
    "ProviderError",
    "ProviderTimeout",
    "RuntimeFailure",
    "StoreError",
    "StoreUnavailable",
    "SummarizationError",
    "UnknownHandleError",
    "UnknownModelError",
    "UsageError",
    "VersionConflict",
]


class CtxwardenError(Exception):
    """Base of every ctxwarden exception."""


class UsageError(CtxwardenError):
    """The caller must change something: input, configuration or environment."""


class InvalidMessageError(UsageError, ValueError):
    """A message or transcript is malformed; ``index`` and ``field`` locate it."""

    def __init__(self, reason: str, *, index: int | None = None, field: str | None = None):
        self.reason = reason
        self.index = index
        self.field = field
        where = []
        if index is not None:
            where.append(f"message {index}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + reason)


class UnknownModelError(UsageError, KeyError):
    """A model name that the registry does not know.

    ``suggestions`` are known names ranked nearest first (the registry ranks them); the
    message shows the first five. The registry passes a function: ranking costs about a
    millisecond, and callers that fall back quietly (an unlisted model counted by its
    family, once per build) never read the message."""

    def __init__(self, model: str, suggestions: Sequence[str] | Callable[[], Sequence[str]] = ()):
        self.model = model
        self._suggestions = suggestions
        super().__init__(model)

    @property
    def suggestions(self) -> tuple[str, ...]:
        """Known names nearest to :attr:`model`, nearest first."""
        if callable(self._suggestions):
            self._suggestions = tuple(self._suggestions())
        return tuple(self._suggestions)

    def __str__(self) -> str:  # KeyError would quote the message
        close = self.suggestions[:5]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return (
            f"unknown model {self.model!r}.{hint} Add it with a registry TOML file "
            "(see `ctxwarden models --help`)."
        )


class UnknownHandleError(UsageError, LookupError):
    """A recall handle (``cw:msg:<id>``) that is malformed or names no message."""

    def __init__(self, handle: str, reason: str):
        self.handle = handle
        super().__init__(f"cannot recall {handle!r}: {reason}")


class ConfigError(UsageError, ValueError):
    """A policy, registry or provider spec is wrong."""


class BudgetError(UsageError, ValueError):
    """The token budget cannot hold what must always be kept."""

    def __init__(self, message: str, *, minimum: int | None = None):
        self.minimum = minimum
        super().__init__(message)


class MissingDependencyError(UsageError, ImportError):
    """An optional extra is needed: the message names the ``pip install`` to run."""

    def __init__(self, feature: str, extra: str):
        self.extra = extra
        super().__init__(
            f"{feature} needs an optional dependency: pip install 'ctxwarden[{extra}]'"
        )


class RuntimeFailure(CtxwardenError):
    """The call was right but something outside failed; retrying may help."""


class ProviderError(RuntimeFailure):
    """A model provider call failed after retries."""

    def __init__(self, message: str, *, status: int | None = None, provider: str | None = None):
        self.status = status
        self.provider = provider
        super().__init__(message)


class ProviderTimeout(ProviderError):
    """A model provider did not answer in time."""


class StoreError(RuntimeFailure):
    """The session store failed (locked, unreachable, corrupt)."""


class VersionConflict(StoreError):
    """An optimistic write found the session changed since it was read."""


class StoreUnavailable(StoreError):
    """The store's server does not answer (down, unreachable, no free connection): nothing
    of the operation was written; the service answers 503."""


class SummarizationError(RuntimeFailure):
    """A summary or fact extraction failed; the messages are left in place."""
