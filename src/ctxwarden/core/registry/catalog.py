"""The model registry (R3): windows, limits, tokenizers and prices, as data.

The facts live in ``models.toml`` inside the package, so a price change is a data edit,
not a code change. Users add or override models with TOML files of the same shape
(``Registry.with_overrides``, ``load_registry``, or the ``CTXWARDEN_MODELS`` environment
variable: paths separated by ``os.pathsep``); an override is merged field by field, so
``[models."gpt-4o"] price = { input = 2.0 }`` changes one number and keeps the rest.

Names resolve the way people and SDKs write them: exact names and aliases first, then
provider prefixes (``openai:gpt-4o``, ``openrouter:openai/gpt-4o``, ``ollama:qwen3:8b``)
and dated or tagged snapshots (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``,
``gemini-1.5-pro-002``, ``llama3.1:8b-instruct-q4_K_M``). A snapshot takes the family's
entry unless the registry lists it separately (``gpt-4o-2024-05-13`` kept its own price).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ctxwarden.core.caching import memoize
from ctxwarden.core.errors import ConfigError, UnknownModelError

__all__ = [
    "ENCODINGS",
    "ESTIMATORS",
    "LongContextPrice",
    "ModelInfo",
    "Price",
    "Registry",
    "get_model",
    "load_registry",
]

ENCODINGS = ("o200k_base", "cl100k_base")
ESTIMATORS = ("claude", "gemini", "llama", "qwen", "deepseek", "mistral", "other")
ENV_VAR = "CTXWARDEN_MODELS"

_PROVIDER_PREFIXES = frozenset(
    [
        "openai",
        "azure",
        "anthropic",
        "bedrock",
        "vertex",
        "google",
        "google-gla",
        "google-vertex",
        "gemini",
        "deepseek",
        "ollama",
        "openrouter",
        "groq",
        "together",
        "fireworks",
        "vllm",
        "lmstudio",
        "mistral",
    ]
)
# Tried one at a time, repeatedly, after exact names and aliases failed.
_SNAPSHOT_SUFFIXES = (
    (re.compile(r"-\d{4}-\d{2}-\d{2}$"), ""),  # OpenAI dates: gpt-4o-2024-08-06
    (re.compile(r"[-@]\d{8}$"), ""),  # Anthropic dates: -20250929, Vertex @20241022
    (re.compile(r"-v\d+(?::\d+)?$"), ""),  # Bedrock / Vertex versions: -v2:0, -v2
    (re.compile(r"[-:]latest$"), ""),
    (re.compile(r"-(?:preview|exp)(?:-\d{2}-\d{2})?$"), ""),  # gemini-2.5-flash-preview-05-20
    (re.compile(r"-\d{3,4}$"), ""),  # gpt-4-0613, gpt-3.5-turbo-0125, gemini-1.5-pro-002
    (re.compile(r"(:[^-:]+)-.+$"), r"\1"),  # Ollama tag variants: llama3.1:8b-instruct-q4_K_M
)
_BEDROCK_PREFIX = re.compile(r"^(?:[a-z]{2}\.)?anthropic\.")


@dataclass(frozen=True)
class Price:
    """USD per 1M tokens. ``None`` where the provider has no such charge."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True)
class LongContextPrice:
    """A price tier for calls whose prompt has more than ``above`` tokens."""

    above: int
    price: Price


@dataclass(frozen=True)
class ModelInfo:
    """What ctxwarden needs to know about one model.

    ``encoding`` is set for models we count exactly (OpenAI); ``estimator`` names the
    estimate family for the rest. ``estimate_factor`` (tokens per ``o200k_base`` token,
    measured on this model's own tokenizer) replaces the family's factor: a family can
    change tokenizer between versions (Claude Opus 4.7, see ``ctxwarden.core.tokens.counter``).

    ``cache_min_tokens`` is the shortest prefix the provider's prompt cache stores (a
    shorter one is billed as plain input every call); ``cache_breakpoints`` how many
    explicit cache marks a request may carry (Anthropic's ``cache_control``: 4), ``None``
    where the cache finds the prefix itself (OpenAI, Gemini, DeepSeek). The read and write
    prices are ``price.cached_input`` and ``price.cache_write``
    (:class:`~ctxwarden.core.registry.cache_cost.CachePrices` turns them into multipliers).
    """

    name: str
    provider: str
    context_window: int
    max_output_tokens: int
    price: Price
    encoding: str | None = None
    estimator: str | None = None
    estimate_factor: float | None = None
    long_context: LongContextPrice | None = None
    aliases: tuple[str, ...] = ()
    system_messages: str = "many"

    @property
    def one_system_message(self) -> bool:
        """Whether the model's chat template takes one system message, first (many local
        models' templates raise on a second): a build folds its layers into it."""
        return self.system_messages == "one"

    cache_min_tokens: int = 0
    cache_breakpoints: int | None = None

    @property
    def exact(self) -> bool:
        """True when token counts for this model are exact, not estimates."""
        return self.encoding is not None

    @property
    def tokenizer(self) -> str:
        """``o200k_base`` for exact counting, ``~claude`` for an estimate family, and
        ``~claude x1.46`` when the model carries its own factor."""
        if self.encoding:
            return self.encoding
        own = f" x{self.estimate_factor:g}" if self.estimate_factor is not None else ""
        return f"~{self.estimator}{own}"

    def price_for(self, prompt_tokens: int) -> Price:
        """The price tier that applies to one call with ``prompt_tokens`` input tokens."""
        tier = self.long_context
        return tier.price if tier is not None and prompt_tokens > tier.above else self.price


class Registry:
    """An immutable set of models with name resolution; build new ones with overrides."""

    def __init__(self, tables: Mapping[str, Mapping[str, Any]], *, source: str = "<registry>"):
        self._tables = {name: dict(t) for name, t in tables.items()}
        # Equal tables make equal registries, so caches keyed by a registry (token
        # counters) are shared by registries loaded twice from the same files.
        self._key = json.dumps(self._tables, sort_keys=True, default=str)
        self._hash = hash(self._key)
        self._models: dict[str, ModelInfo] = {}
        self._index: dict[str, str] = {}
        built = [_build(name, table, source) for name, table in self._tables.items()]
        for info in built:  # names first, so a clashing alias is blamed on its own model
            self._models[info.name] = info
            self._index[info.name.lower()] = info.name
        for info in built:
            for alias in info.aliases:
                owner = self._index.setdefault(alias.lower(), info.name)
                if owner != info.name:
                    raise ConfigError(
                        f"{source}: model {info.name!r}, field 'aliases': {alias!r} already "
                        f"names model {owner!r}"
                    )

    # -- construction -------------------------------------------------------------------------

    @staticmethod
    @memoize(16)
    def builtin() -> Registry:
        """The registry shipped in the package (``ctxwarden/core/registry/models.toml``)."""
        text = resources.files("ctxwarden.core.registry").joinpath("models.toml").read_text("utf-8")
        source = "ctxwarden/core/registry/models.toml"
        return Registry(_parse(text, source), source=source)

    @staticmethod
    def default() -> Registry:
        """The built-in registry plus the files named by ``CTXWARDEN_MODELS``."""
        return _with_env(os.environ.get(ENV_VAR, ""))

    def with_overrides(self, source: str | Path) -> Registry:
        """A new registry with the models of a TOML file (a ``Path`` or a path string)
        or of TOML text (a string containing ``=`` or a newline) merged in."""
        if isinstance(source, str) and ("=" in source or "\n" in source):
            return self._merged(_parse(source, "<toml text>"), "<toml text>")
        path = Path(source)
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read model registry file: {exc.strerror}") from None
        return self._merged(_parse(text, str(path)), str(path))

    def _merged(self, tables: Mapping[str, Mapping[str, Any]], source: str) -> Registry:
        merged = {name: dict(t) for name, t in self._tables.items()}
        lowered = {name.lower(): name for name in merged}
        for name, table in tables.items():
            target = lowered.get(name.lower()) or self._index.get(name.lower()) or name
            merged[target] = _merge(merged.get(target, {}), table)
        return Registry(merged, source=source)

    # -- lookup -----------------------------------------------------------------------------

    def resolve(self, name: str) -> str:
        """The registry's name for ``name``; :class:`UnknownModelError` if there is none."""
        for candidate in _candidates(name):
            found = self._index.get(candidate)
            if found is not None:
                return found
        raise UnknownModelError(name, lambda: self.suggest(name))

    def suggest(self, name: str, n: int = 5) -> list[str]:
        """Up to ``n`` model names nearest to ``name``, nearest first (for error messages).

        Every form :meth:`resolve` tries (prefix and snapshot stripped) is compared with
        every name and alias; a model ranks by its best pair: containing one in the other
        first (``sonnet`` -> the Sonnets), then by similarity (``gpt4o`` -> ``gpt-4o``)."""
        forms = list(dict.fromkeys(_candidates(name)))
        best: dict[str, tuple[bool, float]] = {}
        for key, model in self._index.items():
            for form in forms:
                score = (_contains(form, key), difflib.SequenceMatcher(None, form, key).ratio())
                if score > best.get(model, (False, 0.0)):
                    best[model] = score
        ranked = sorted(best, key=lambda model: best[model], reverse=True)
        return [m for m in ranked if best[m][0] or best[m][1] >= _SUGGEST_CUTOFF][:n]

    def get(self, name: str) -> ModelInfo:
        """The model called ``name`` (alias, snapshot or prefixed name accepted)."""
        return self._models[self.resolve(name)]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.resolve(name)
        except UnknownModelError:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Registry) and other._key == self._key

    def __hash__(self) -> int:
        return self._hash

    def __iter__(self) -> Iterator[ModelInfo]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    def names(self) -> list[str]:
        return list(self._models)


_SUGGEST_CUTOFF = 0.5  # difflib ratio: "gtp-5" ~ "gpt-5" is 0.8, unrelated names < 0.4


def _contains(a: str, b: str) -> bool:
    """One name inside the other, ignoring fragments too short to mean anything."""
    return (len(a) >= 4 and a in b) or (len(b) >= 4 and b in a)


def _with_env(value: str) -> Registry:
    paths = [p for p in value.split(os.pathsep) if p.strip()]
    return _cached_load(tuple(paths)) if paths else Registry.builtin()


@memoize(16)
def _cached_load(paths: tuple[str, ...]) -> Registry:
    registry = Registry.builtin()
    for path in paths:
        registry = registry.with_overrides(Path(path))
    return registry


def load_registry(paths: Iterable[str | Path] = (), *, use_env: bool = True) -> Registry:
    """The built-in registry, then ``CTXWARDEN_MODELS`` (if ``use_env``), then ``paths``."""
    registry = Registry.default() if use_env else Registry.builtin()
    for path in paths:
        registry = registry.with_overrides(Path(path))
    return registry


def get_model(name: str, registry: Registry | None = None) -> ModelInfo:
    """Look a model up in ``registry``, by default the default registry (built-in plus
    ``CTXWARDEN_MODELS``): one call for code that takes an optional user registry."""
    return (Registry.default() if registry is None else registry).get(name)


# -- name resolution ------------------------------------------------------------------------


def _candidates(name: str) -> Iterator[str]:
    n = name.strip().lower()
    yield n
    head, sep, rest = n.partition(":")
    if sep and head in _PROVIDER_PREFIXES:
        n = rest
        yield n
    if "/" in n:  # openrouter "openai/gpt-4o", Google "models/gemini-1.5-pro"
        n = n.rsplit("/", 1)[1]
        yield n
    if _BEDROCK_PREFIX.match(n):
        n = _BEDROCK_PREFIX.sub("", n)
        yield n
    if n.startswith("claude"):  # OpenRouter writes claude-3.5-sonnet, claude-sonnet-4.5
        n = re.sub(r"(\d)\.(\d)", r"\1-\2", n)
        yield n
    stripped = True
    while stripped:
        stripped = False
        for pattern, replacement in _SNAPSHOT_SUFFIXES:
            shorter = pattern.sub(replacement, n, count=1)
            if shorter != n and shorter:
                n, stripped = shorter, True
                yield n
                break


# -- parsing and validation -----------------------------------------------------------------

_MODEL_KEYS = frozenset(
    [
        "provider",
        "context_window",
        "max_output_tokens",
        "encoding",
        "estimator",
        "estimate_factor",
        "price",
        "long_context",
        "aliases",
        "system_messages",
        "cache",
    ]
)
SYSTEM_MESSAGES = ("many", "one")
_CACHE_KEYS = frozenset({"min_tokens", "breakpoints"})
_PRICE_KEYS = frozenset({"input", "output", "cached_input", "cache_write"})


def _parse(text: str, source: str) -> dict[str, dict[str, Any]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    extra = set(data) - {"models"}
    if extra:
        raise ConfigError(
            f"{source}: unknown top-level key {sorted(extra)[0]!r} (expected [models.<name>])"
        )
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{source}: 'models' must be a table of [models.\"<name>\"] tables")
    for name, table in models.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: model {name!r} must be a table")
        unknown = set(table) - _MODEL_KEYS
        if unknown:
            raise ConfigError(
                f"{source}: model {name!r}, field {sorted(unknown)[0]!r}: unknown field "
                f"(known: {', '.join(sorted(_MODEL_KEYS))})"
            )
    return models


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if (
            key in ("price", "long_context", "cache")
            and isinstance(value, dict)
            and isinstance(out.get(key), dict)
        ):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    # encoding and estimator are alternatives: setting one replaces the other; a measured
    # estimate_factor belongs to the tokenizer it was measured on, so it goes with it
    if "estimator" in override and "encoding" not in override:
        out.pop("encoding", None)
        if base.get("estimator") != override["estimator"] and "estimate_factor" not in override:
            out.pop("estimate_factor", None)
    if "encoding" in override and "estimator" not in override:
        out.pop("estimator", None)
        if "estimate_factor" not in override:
            out.pop("estimate_factor", None)
    return out


def _build(name: str, t: Mapping[str, Any], source: str) -> ModelInfo:
    def bad(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{source}: model {name!r}, field {field!r}: {problem}")

    def positive_int(field: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise bad(field, f"must be a positive integer, got {value!r}")
        return value

    def price(field: str, table: Any, extra: frozenset[str] = frozenset()) -> Price:
        if not isinstance(table, dict):
            raise bad(field, "must be a table like { input = 2.5, output = 10.0 }")
        for key in set(table) - _PRICE_KEYS - extra:
            raise bad(f"{field}.{key}", f"unknown price (known: {', '.join(sorted(_PRICE_KEYS))})")
        for key in ("input", "output"):
            if key not in table:
                raise bad(f"{field}.{key}", "missing (USD per 1M tokens)")
        values: dict[str, float | None] = {}
        for key in _PRICE_KEYS:
            value = table.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise bad(
                    f"{field}.{key}", f"must be a number >= 0 (USD per 1M tokens), got {value!r}"
                )
            values[key] = None if value is None else float(value)
        return Price(
            input=values["input"] or 0.0,
            output=values["output"] or 0.0,
            cached_input=values["cached_input"],
            cache_write=values["cache_write"],
        )

    for field in ("provider", "context_window", "max_output_tokens", "price"):
        if field not in t:
            raise bad(field, "missing")
    provider = t["provider"]
    if not isinstance(provider, str) or not provider:
        raise bad("provider", f"must be a non-empty string, got {provider!r}")
    window = positive_int("context_window", t["context_window"])
    max_out = positive_int("max_output_tokens", t["max_output_tokens"])
    if max_out > window:
        raise bad("max_output_tokens", f"{max_out} exceeds context_window {window}")
    encoding, estimator = t.get("encoding"), t.get("estimator")
    if (encoding is None) == (estimator is None):
        raise bad("encoding", "set exactly one of 'encoding' (exact) or 'estimator' (estimate)")
    if encoding is not None and encoding not in ENCODINGS:
        raise bad("encoding", f"must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    if estimator is not None and estimator not in ESTIMATORS:
        raise bad("estimator", f"must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    factor = t.get("estimate_factor")
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0
    ):
        raise bad("estimate_factor", f"must be a number > 0, got {factor!r}")
    if factor is not None and encoding is not None:
        raise bad(
            "estimate_factor",
            f"applies to estimated models only; {encoding!r} counts exactly "
            "(set 'estimator' instead of 'encoding' to estimate)",
        )
    long_context = None
    if "long_context" in t:
        tier = t["long_context"]
        tier_price = price("long_context", tier, frozenset({"above"}))
        long_context = LongContextPrice(
            positive_int("long_context.above", tier.get("above")), tier_price
        )
    aliases = t.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise bad("aliases", "must be a list of names")
    system_messages = t.get("system_messages", "many")
    if system_messages not in SYSTEM_MESSAGES:
        raise bad(
            "system_messages",
            f"must be 'many' (layers as system messages of their own) or 'one' (the chat "
            f"template takes one system message, first), got {system_messages!r}",
        )
    cache = t.get("cache", {})
    if not isinstance(cache, dict):
        raise bad("cache", "must be a table like { min_tokens = 1024, breakpoints = 4 }")
    for key in set(cache) - _CACHE_KEYS:
        raise bad(f"cache.{key}", f"unknown field (known: {', '.join(sorted(_CACHE_KEYS))})")
    min_tokens = cache.get("min_tokens", 0)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise bad("cache.min_tokens", f"must be an integer >= 0, got {min_tokens!r}")
    marks = cache.get("breakpoints")
    if marks is not None:
        marks = positive_int("cache.breakpoints", marks)
    return ModelInfo(
        name=name,
        provider=provider,
        context_window=window,
        max_output_tokens=max_out,
        price=price("price", t["price"]),
        encoding=encoding,
        estimator=estimator,
        estimate_factor=None if factor is None else float(factor),
        long_context=long_context,
        aliases=tuple(dict.fromkeys(aliases)),
        system_messages=system_messages,
        cache_min_tokens=min_tokens,
        cache_breakpoints=marks,
    )
