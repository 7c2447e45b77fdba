"""Token usage of one model call, as providers report it (R3, R12).

Providers split input tokens differently: OpenAI reports ``prompt_tokens`` with the
cached part inside it (``prompt_tokens_details.cached_tokens``); Anthropic reports
``input_tokens`` *excluding* cache reads and writes, which come separately. ``Usage``
normalises both to one shape where ``input_tokens`` is every input token and the cached
and cache-write parts are subsets of it, so cost is computed once, correctly.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Usage"]


@dataclass(frozen=True)
class Usage:
    """Tokens of one call (or a sum of calls). ``cached_input_tokens`` and
    ``cache_write_tokens`` are parts of ``input_tokens``, never added to it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    calls: int = 1

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.cached_input_tokens + self.cache_write_tokens > self.input_tokens:
            raise ValueError(
                "cached_input_tokens + cache_write_tokens cannot exceed input_tokens "
                f"({self.cached_input_tokens} + {self.cache_write_tokens} > {self.input_tokens})"
            )

    @property
    def uncached_input_tokens(self) -> int:
        return self.input_tokens - self.cached_input_tokens - self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            calls=self.calls + other.calls,
        )

    @classmethod
    def from_openai(cls, prompt: int, completion: int, cached: int = 0) -> Usage:
        """OpenAI: ``prompt_tokens`` already includes the cached tokens."""
        return cls(input_tokens=prompt, output_tokens=completion, cached_input_tokens=cached)

    @classmethod
    def from_anthropic(
        cls, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0
    ) -> Usage:
        """Anthropic: ``input_tokens`` excludes cache reads and writes; add them back."""
        return cls(
            input_tokens=input_tokens + cache_read + cache_write,
            output_tokens=output_tokens,
            cached_input_tokens=cache_read,
            cache_write_tokens=cache_write,
        )
