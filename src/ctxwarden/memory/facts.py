"""Critical facts: a structured record that does not drift (R8).

A rolling summary is text, and text is re-interpreted at every rewrite: "size L"
becomes "a larger size" after three of them (seed 000). Facts are kept apart, as
``key -> value`` pairs stored **verbatim** as extracted, merged by one rule: a fact
once known stays until a newer non-null value replaces it, and every value it ever
had is kept in its history with the message it came from.

The schema is the user's: a pydantic model class, a JSON-schema dict, or ``None``
for free key/value. Small models break JSON (prose around it, fences, ``None``,
trailing commas, missing brackets); :func:`parse_facts_json` repairs what can be
repaired with ``json_repair`` and raises :class:`SummarizationError` for the rest,
so the caller keeps every message and tries again at the next trigger.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeAlias

import json_repair

from ctxwarden.core.errors import ConfigError, SummarizationError
from ctxwarden.core.messages import Message
from ctxwarden.memory.cut_answer import cut_value_path, drop_path

__all__ = [
    "FACTS_HEADING",
    "MAX_FACT_HISTORY",
    "FactExtractor",
    "FactRecord",
    "FactSchema",
    "Facts",
    "is_missing",
    "parse_facts_json",
    "schema_fields",
    "schema_for_prompt",
    "validate_facts",
]

FactSchema: TypeAlias = "type[Any] | Mapping[str, Any] | None"
"""A pydantic model class, a JSON-schema dict (with ``properties``), or ``None``."""

_log = logging.getLogger("ctxwarden.facts")
#: Values a fact's history keeps (the newest): the context shows the current value and
#: the one before it, and a fact an extractor restates differently every turn (a step
#: counter, a running total) must not grow the stored record without end.
MAX_FACT_HISTORY = 32

_MISSING_STRINGS = frozenset({"", "null", "none", "n/a", "na", "unknown", "not mentioned", "-"})
_WRAPPER_KEYS = ("facts", "critical_facts", "result", "data", "extracted_facts")


def is_missing(value: Any) -> bool:
    """True for what small models write when they do not know: null, "", "N/A", [], {}."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip().lower() in _MISSING_STRINGS
    if isinstance(value, (list, tuple, dict, Mapping)):
        return len(value) == 0
    return False


def normalize_key(key: str) -> str:
    """``"Order ID"`` -> ``"order_id"``: free keys from different calls must meet."""
    return re.sub(r"[^\w]+", "_", key.strip().lower()).strip("_")


# -- parsing ----------------------------------------------------------------------------------


def parse_facts_json(text: str, *, truncated: bool = False) -> dict[str, Any]:
    """One JSON object from a model's answer, repaired if needed.

    Accepts prose around the object, ```json fences, Python ``None``/``True``/``False``,
    single quotes, trailing commas and missing closing brackets; unwraps ``{"facts":
    {...}}`` and a list of ``{"key": ..., "value": ...}`` pairs. Anything else raises
    :class:`SummarizationError` quoting the start of the answer.

    A value the end of the answer cut off (``"order": "ORD-``; with ``truncated``, the
    answer stopped by ``max_tokens``, also a bare number) is dropped, not repaired into a
    wrong fact, and logged as a warning on the ``ctxwarden.facts`` logger; the complete
    values are kept (:mod:`ctxwarden.memory.cut_answer`).
    """
    stripped = text.strip()
    if not stripped:
        raise SummarizationError("the fact extractor returned an empty answer")
    try:
        value: Any = json.loads(stripped)
    except (ValueError, RecursionError):
        try:
            value = json_repair.loads(stripped)
        except Exception as exc:  # json_repair raises assorted errors on garbage
            raise SummarizationError(f"could not parse facts JSON: {_quote(stripped)}") from exc
        cut = cut_value_path(stripped, truncated=truncated)
        if cut and drop_path(value, cut):
            _log.warning(
                "facts answer cut off inside %s: value dropped, the complete ones kept",
                ".".join(map(str, cut)),
            )
    value = _unwrap(value)
    if not isinstance(value, dict):
        raise SummarizationError(f"expected one JSON object of facts, got: {_quote(stripped)}")
    return {str(k): v for k, v in value.items()}


def _unwrap(value: Any) -> Any:
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            pairs = [_pair(v) for v in value]
            if all(p is not None for p in pairs):
                return {p[0]: p[1] for p in pairs if p is not None}
            merged: dict[str, Any] = {}
            for v in value:  # several objects in one answer: later ones win
                merged.update(v)
            return merged
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((key, inner),) = value.items()
        if str(key).lower() in _WRAPPER_KEYS and isinstance(inner, (dict, list)):
            return _unwrap(inner)
    return value


def _pair(item: dict[str, Any]) -> tuple[str, Any] | None:
    name = item.get("key", item.get("name", item.get("fact")))
    if isinstance(name, str) and "value" in item and len(item) == 2:
        return name, item["value"]
    return None


def _quote(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


# -- schemas ----------------------------------------------------------------------------------


def _is_pydantic(schema: Any) -> bool:
    return isinstance(schema, type) and hasattr(schema, "model_validate")


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        raise ConfigError(
            "a facts JSON schema needs a non-empty 'properties' object, e.g. "
            '{"properties": {"size": {"type": "string"}}}'
        )
    return props


def schema_fields(schema: FactSchema) -> dict[str, str]:
    """Field name -> a short description (type and the schema's description), in order."""
    if schema is None:
        return {}
    if _is_pydantic(schema):
        fields: dict[str, str] = {}
        for name, info in schema.model_fields.items():  # type: ignore[union-attr]
            kind = getattr(info.annotation, "__name__", None) or str(info.annotation)
            fields[name] = f"{kind}" + (f", {info.description}" if info.description else "")
        return fields
    if isinstance(schema, Mapping):
        out: dict[str, str] = {}
        for name, spec in _properties(schema).items():
            spec = spec if isinstance(spec, Mapping) else {}
            kind = spec.get("type", "any")
            kind = "|".join(kind) if isinstance(kind, list) else str(kind)
            desc = spec.get("description")
            out[str(name)] = kind + (f", {desc}" if desc else "")
        return out
    raise ConfigError(
        f"facts schema must be a pydantic model class, a JSON-schema dict or None, got {schema!r}"
    )


def schema_for_prompt(schema: FactSchema) -> str:
    """The schema as the fact prompt shows it: one ``"key": type, description`` line each."""
    if schema is None:
        return (
            "Free key/value: choose short snake_case keys (e.g. budget, size, order_id, "
            "deadline, name) and put each fact's exact wording as the value."
        )
    lines = [f'  "{name}": {desc} or null' for name, desc in schema_fields(schema).items()]
    return "{\n" + ",\n".join(lines) + "\n}"


def validate_facts(data: Mapping[str, Any], schema: FactSchema) -> dict[str, Any]:
    """Check ``data`` against the schema; return the facts with canonical keys.

    Keys are matched case-insensitively; keys the schema does not declare are dropped
    (small models add extras). A value of the wrong type raises
    :class:`SummarizationError` naming the field. Missing fields are fine: facts
    accumulate over calls.
    """
    if schema is None:
        return {normalize_key(k): v for k, v in data.items() if normalize_key(k)}
    fields = schema_fields(schema)
    by_norm = {normalize_key(name): name for name in fields}
    picked = {by_norm[normalize_key(k)]: v for k, v in data.items() if normalize_key(k) in by_norm}
    if _is_pydantic(schema):
        return _validate_pydantic(picked, schema)
    assert isinstance(schema, Mapping)
    props = _properties(schema)
    return {name: _check_type(name, value, props[name]) for name, value in picked.items()}


def _validate_pydantic(picked: dict[str, Any], model: Any) -> dict[str, Any]:
    from pydantic import TypeAdapter, ValidationError  # only when a pydantic model is given

    present = {k: v for k, v in picked.items() if not is_missing(v)}
    try:
        obj = model.model_validate(present)
        return dict(obj.model_dump(mode="json", exclude_unset=True))
    except ValidationError as exc:
        if any(err["type"] != "missing" for err in exc.errors()):
            raise SummarizationError(f"facts do not match {model.__name__}: {exc}") from exc
    out: dict[str, Any] = {}  # only required fields are absent: check each present one
    for name, value in present.items():
        adapter: Any = TypeAdapter(model.model_fields[name].annotation)
        try:
            out[name] = adapter.dump_python(adapter.validate_python(value), mode="json")
        except ValidationError as exc:
            raise SummarizationError(f"fact {name!r} does not match the schema: {exc}") from exc
    return out


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict, Mapping),
    "null": (type(None),),
}
_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def _check_type(name: str, value: Any, spec: Any) -> Any:
    """Type-check one value against a JSON-schema property; lossless coercions only."""
    if value is None or not isinstance(spec, Mapping):
        return value
    declared = spec.get("type")
    kinds = declared if isinstance(declared, list) else [declared] if declared else []
    for kind in kinds:
        if kind not in _JSON_TYPES:
            raise ConfigError(f"facts schema: property {name!r} has unknown type {kind!r}")
        ok = isinstance(value, _JSON_TYPES[kind]) and not (
            kind in ("number", "integer") and isinstance(value, bool)
        )
        if ok or (kind == "integer" and isinstance(value, float) and value.is_integer()):
            break
    else:
        value = _coerce(name, value, kinds)
    if "enum" in spec and value not in spec["enum"]:
        raise SummarizationError(f"fact {name!r} must be one of {spec['enum']}, got {value!r}")
    return value


def _coerce(name: str, value: Any, kinds: Sequence[str]) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if ("integer" in kinds or "number" in kinds) and _NUMBER.fullmatch(text):
            return int(text) if "." not in text and "integer" in kinds else float(text)
        if "boolean" in kinds and text.lower() in ("true", "false", "yes", "no"):
            return text.lower() in ("true", "yes")
        if "array" in kinds:
            return [value]
    if "string" in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise SummarizationError(
        f"fact {name!r} should be {' or '.join(kinds)}, got {type(value).__name__} {value!r}"
    )


# -- the record -------------------------------------------------------------------------------


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    return value


def _render_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return ", ".join(_render_value(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(_thaw(value), ensure_ascii=False)
    return str(value)


@dataclass(frozen=True)
class FactRecord:
    """One value a fact had, and where it came from (a message id or turn label)."""

    value: Any
    source: str | None = None


#: The facts layer's first line (also what marks a facts layer fed back as history).
FACTS_HEADING = "Known facts (exact values from the conversation; newer values replace older):"


@dataclass(frozen=True)
class Facts(Mapping[str, Any]):
    """The current facts, read like a dict (``facts["budget"]``), with their history.

    Immutable: :meth:`merge` returns a new record. ``history[key]`` lists the distinct
    values in order (the newest :data:`MAX_FACT_HISTORY`); the current value is its last
    entry.
    """

    history: Mapping[str, tuple[FactRecord, ...]] = field(default_factory=dict)
    version: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", MappingProxyType(dict(self.history)))

    def __getitem__(self, key: str) -> Any:
        return self.history[key][-1].value

    def __iter__(self) -> Iterator[str]:
        return iter(self.history)

    def __len__(self) -> int:
        return len(self.history)

    def merge(self, new: Mapping[str, Any], *, source: str | None = None) -> Facts:
        """Facts with ``new`` applied: null-like values are ignored (a fact is never
        forgotten), a different value replaces the current one and joins the history,
        the same value changes nothing. Values are stored exactly as given."""
        history = dict(self.history)
        changed = False
        for key, value in new.items():
            if is_missing(value):
                continue
            frozen = _freeze(value.strip() if isinstance(value, str) else value)
            past = history.get(key, ())
            if past and past[-1].value == frozen:
                continue
            history[key] = (*past[1 - MAX_FACT_HISTORY :], FactRecord(frozen, source))
            changed = True
        return Facts(history, self.version + 1) if changed else self

    def source(self, key: str) -> str | None:
        """The message id (or turn) the current value of ``key`` came from."""
        return self.history[key][-1].source

    def changed_at_each(self, sources: Sequence[str]) -> frozenset[str]:
        """The keys whose last values came one from each of ``sources`` (message ids,
        oldest first): facts restated with a new value at every one of those turns."""
        n = len(sources)
        if n == 0 or not all(sources):
            return frozenset()
        wanted = tuple(sources)
        return frozenset(
            key
            for key, records in self.history.items()
            if len(records) >= n and tuple(r.source for r in records[-n:]) == wanted
        )

    def render(self, *, with_changes: bool = False, leave_out: Collection[str] = ()) -> str:
        """``key: value`` lines a model reads as statements; empty when there are none.

        ``with_changes`` appends the previous value of a fact that changed, so the
        agent sees a correction as a correction. ``leave_out`` names keys not to show
        (they stay in the record).
        """
        shown = [(k, rs) for k, rs in self.history.items() if k not in leave_out]
        if not shown:
            return ""
        lines = [FACTS_HEADING]
        for key, records in shown:
            line = f"{key}: {_render_value(records[-1].value)}"
            if with_changes and len(records) > 1:
                line += f" (earlier: {_render_value(records[-2].value)})"
            lines.append(line)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Current values as plain JSON-ready data."""
        return {key: _thaw(value) for key, value in self.items()}

    def to_json(self) -> dict[str, Any]:
        """Everything (history included) as JSON-ready data, for a store."""
        return {
            "version": self.version,
            "history": {
                k: [{"value": _thaw(r.value), "source": r.source} for r in rs]
                for k, rs in self.history.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Facts:
        """Inverse of :meth:`to_json`."""
        history = {
            str(k): tuple(FactRecord(_freeze(r["value"]), r.get("source")) for r in rs)
            for k, rs in data.get("history", {}).items()
        }
        return cls(history, int(data.get("version", 0)))


class FactExtractor(Protocol):
    """Anything that turns messages into facts merged into the existing ones."""

    async def extract(
        self, messages: Sequence[Message], existing: Facts, schema: FactSchema = None
    ) -> Facts: ...
