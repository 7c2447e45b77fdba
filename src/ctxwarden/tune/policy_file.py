"""Write a tuned policy as TOML that :meth:`~ctxwarden.Policy.from_toml` loads back.

The file is the base policy's own TOML (when one was given: its per-tool rules, steps
and anything else stay as the user wrote them) with the tuned knobs and the budget set,
and a comment header saying what it was tuned on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ctxwarden.pipeline.policy import Policy

__all__ = ["dumps_toml", "policy_toml", "tuned_tables"]


def tuned_tables(policy: Policy, summarizer: bool) -> dict[str, dict[str, Any]]:
    """The sections and keys the tuner sets, read from ``policy``."""
    tables: dict[str, dict[str, Any]] = {}
    if policy.mask is not None:
        m = policy.mask
        tables["mask"] = {
            "keep_last": m.keep_last,
            "batch_tokens": m.batch_tokens,
            "min_tokens": m.min_tokens,
        }
    if policy.truncate is not None:
        t = policy.truncate
        tables["truncate"] = {
            "threshold_tokens": t.threshold_tokens,
            "target_tokens": t.target_tokens,
            "cut_values_tokens": t.cut_values_tokens,
        }
    tables["window"] = {"refill_ratio": round(policy.window.refill_ratio, 4)}
    tables["ledger"] = {
        "max_tokens": policy.ledger.max_tokens,
        "free_share": round(policy.ledger.free_share, 4),
    }
    if summarizer:
        s = policy.summary
        tables["summary"] = {
            "max_messages": s.max_messages,
            "keep_recent": s.keep_recent,
            "fill_ratio": None if s.fill_ratio is None else round(s.fill_ratio, 4),
        }
    return tables


def policy_toml(
    policy: Policy,
    *,
    budget: int,
    summarizer: bool,
    base: Mapping[str, Any] | None = None,
    header: Sequence[str] = (),
) -> str:
    """The TOML text of ``base`` (parsed TOML) with ``policy``'s tuned knobs and ``budget``."""
    data: dict[str, Any] = {k: v for k, v in (base or {}).items()}
    data["max_input_tokens"] = budget
    for name, values in tuned_tables(policy, summarizer).items():
        section = data.get(name)
        merged = dict(section) if isinstance(section, Mapping) else {}
        merged.update({k: v for k, v in values.items() if v is not None})
        data[name] = merged
    lines = [f"# {line}" for line in header]
    return "\n".join(lines) + ("\n" if lines else "") + dumps_toml(data)


def dumps_toml(data: Mapping[str, Any]) -> str:
    """A small TOML writer for policy data: scalars, arrays, tables, arrays of tables."""
    out: list[str] = []
    _table(out, data, ())
    return "\n".join(out).lstrip("\n") + "\n"


def _table(out: list[str], data: Mapping[str, Any], path: tuple[str, ...]) -> None:
    plain = {k: v for k, v in data.items() if not _is_table(v) and not _is_table_array(v)}
    for key, value in plain.items():
        out.append(f"{_key(key)} = {_value(value)}")
    for key, value in data.items():
        if _is_table(value):
            out.append("")
            out.append(f"[{'.'.join(_key(p) for p in (*path, key))}]")
            _table(out, value, (*path, key))
        elif _is_table_array(value):
            for item in value:
                out.append("")
                out.append(f"[[{'.'.join(_key(p) for p in (*path, key))}]]")
                _table(out, item, (*path, key))


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
