"""Recorded sessions for ``ctxwarden tune``: files, directories and ctxwarden stores.

What a user has on disk is rarely one clean format, so every source is read leniently:
a bad file, a bad line of a JSONL file or a bad session inside a JSON list is reported
as a :class:`Problem` (the file, the line, what is wrong) and skipped; the rest is read.

Accepted, per file:

* ``.json``: a list of runs with ``traj`` (tau-bench, swebench-mini), a list of
  messages (one session), an object with ``messages`` (a chat-completions or Anthropic
  messages request body, ``system`` included) or ``traj``, or a list of such objects;
* ``.jsonl``: one session per line (any of the shapes above), or one message per line
  (the file is one session);
* ``.db`` / ``.sqlite`` / ``.sqlite3``: a ctxwarden SQLite store (what ``ctxwarden
  serve`` and :class:`~ctxwarden.Session` record), every session of every tenant;
* a directory: those files under it, in name order;
* ``--db URL`` (:func:`read_store`): a store by URL, PostgreSQL included.

Messages in OpenAI chat format or Anthropic's (content blocks with ``tool_use`` and
``tool_result``) are both read; a session is rejected when its tool calls and results
do not pair up, since no provider would accept it either.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxwarden.core.errors import CtxwardenError, InvalidMessageError
from ctxwarden.core.messages import Message
from ctxwarden.core.pairing import validate_pairing
from ctxwarden.formats.anthropic import messages_from_anthropic
from ctxwarden.formats.openai import messages_from_openai

__all__ = ["Problem", "Recorded", "Sessions", "read_sessions", "read_store"]

STORE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
TRACE_SUFFIXES = (".json", ".jsonl", *STORE_SUFFIXES)


@dataclass(frozen=True)
class Recorded:
    """One recorded session: where it came from and its messages."""

    name: str
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class Problem:
    """Something that could not be read: the file, the line (when known) and why."""

    source: str
    line: int | None
    reason: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class Sessions:
    """What the sources held: the sessions read and the problems skipped."""

    sessions: tuple[Recorded, ...]
    problems: tuple[Problem, ...]


def read_sessions(paths: Sequence[str | Path]) -> Sessions:
    """Every session in ``paths`` (files or directories), and every problem met."""
    sessions: list[Recorded] = []
    problems: list[Problem] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            problems.append(Problem(str(path), None, "no such file or directory"))
            continue
        files = sorted(p for p in path.rglob("*") if p.suffix in TRACE_SUFFIXES and p.is_file())
        for file in [path] if path.is_file() else files:
            found, bad = _read_file(file)
            sessions += found
            problems += bad
    return Sessions(tuple(sessions), tuple(problems))


def read_store(url: str, tenant: str | None = None) -> Sessions:
    """Every session of ``tenant`` (default: of every tenant) in the store at ``url``."""
    from ctxwarden.store import open_store
    from ctxwarden.store.service_tables import list_tenants

    store = open_store(url)
    try:
        tenants = [tenant] if tenant else _tenants(store, list_tenants)
        sessions: list[Recorded] = []
        problems: list[Problem] = []
        for t in tenants:
            for stored in store.list_sessions(t):
                name = f"{url}#{t}/{stored.session_id}"
                try:
                    messages = [s.message for s in store.iter_messages(t, stored.session_id)]
                    sessions.append(_checked(name, messages))
                except CtxwardenError as exc:
                    problems.append(Problem(name, None, str(exc)))
        return Sessions(tuple(sessions), tuple(problems))
    finally:
        store.close()


def _tenants(store: Any, list_tenants: Any) -> list[str]:
    """The library's default tenant and every tenant the service registered."""
    names = ["default"]
    names += [r.tenant for r in list_tenants(store) if r.tenant != "default"]
    return names


# -- files ----------------------------------------------------------------------------------


def _read_file(path: Path) -> tuple[list[Recorded], list[Problem]]:
    source = str(path)
    if path.suffix in STORE_SUFFIXES:
        return _read_sqlite(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        return [], [Problem(source, None, f"cannot read: {reason}")]
    if path.suffix == ".jsonl":
        return _read_jsonl(source, text)
    return _read_json(source, text)


def _read_sqlite(path: Path) -> tuple[list[Recorded], list[Problem]]:
    """A ctxwarden store, checked read-only first: any other SQLite file is left untouched."""
    tenants: list[str] = []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ours = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'ctxwarden_sessions'"
            ).fetchone()
            if ours:
                query = "SELECT DISTINCT tenant FROM ctxwarden_sessions ORDER BY tenant"
                tenants = [row[0] for row in conn.execute(query)]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return [], [Problem(str(path), None, f"not a SQLite database: {exc}")]
    if not ours:
        return [], [Problem(str(path), None, "a SQLite file, but not a ctxwarden store")]
    sessions: list[Recorded] = []
    problems: list[Problem] = []
    for tenant in tenants:  # every tenant of the file, registered with the service or not
        found = read_store(f"sqlite:///{path}", tenant)
        sessions += found.sessions
        problems += found.problems
    return sessions, problems


def _read_jsonl(source: str, text: str) -> tuple[list[Recorded], list[Problem]]:
    sessions: list[Recorded] = []
    problems: list[Problem] = []
    single: list[tuple[int, Any]] = []  # a message per line: the file is one session
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(Problem(source, number, f"not valid JSON: {exc.msg}"))
            continue
        if isinstance(value, Mapping) and "role" in value:
            single.append((number, value))
            continue
        try:
            sessions += _sessions_of(f"{source}:{number}", value)
        except CtxwardenError as exc:
            problems.append(Problem(source, number, str(exc)))
    if single:
        try:
            sessions.append(_session(source, [v for _, v in single]))
        except InvalidMessageError as exc:
            index = exc.index if exc.index is not None and exc.index < len(single) else 0
            problems.append(Problem(source, single[index][0], str(exc)))
    return sessions, problems


def _read_json(source: str, text: str) -> tuple[list[Recorded], list[Problem]]:
    """A JSON file; a list of sessions is read item by item, a bad one named by its line."""
    items = _top_level_items(text)
    if items is None:  # not a list of objects: one value, one session
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            return [], [Problem(source, exc.lineno, f"not valid JSON: {exc.msg}")]
        try:
            return _sessions_of(source, data), []
        except CtxwardenError as exc:
            return [], [Problem(source, None, str(exc))]
    sessions: list[Recorded] = []
    problems: list[Problem] = []
    for index, (line, value) in enumerate(items):
        try:
            sessions += _sessions_of(f"{source}[{index}]", value)
        except CtxwardenError as exc:
            problems.append(Problem(source, line, f"session {index}: {exc}"))
    return sessions, problems


def _top_level_items(text: str) -> list[tuple[int, Any]] | None:
    """The items of a top-level JSON list of sessions with the line each starts on, or
    ``None`` when the text is something else (one session, or not JSON at all)."""
    decoder = json.JSONDecoder()
    start = len(text) - len(text.lstrip())
    if not text.startswith("[", start):
        return None
    items: list[tuple[int, Any]] = []
    pos = start + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None  # malformed: json.loads reports the line
        items.append((text.count("\n", 0, pos) + 1, value))
        pos = end
    # a list of messages is one session, not many
    if not items or any(_is_message(v) for _, v in items):
        return None
    return items


def _is_message(value: Any) -> bool:
    return isinstance(value, Mapping) and "role" in value


def _sessions_of(name: str, value: Any) -> list[Recorded]:
    """The sessions one decoded JSON value holds."""
    if isinstance(value, list):
        if all(_is_message(v) for v in value):
            return [_session(name, value)]
        return [s for i, v in enumerate(value) for s in _sessions_of(f"{name}[{i}]", v)]
    if isinstance(value, Mapping):
        if isinstance(value.get("traj"), list):
            return [_session(name, value["traj"])]
        if isinstance(value.get("messages"), list):
            return [_session(name, value["messages"], value.get("system"))]
    raise InvalidMessageError(
        "expected a list of messages, or an object with 'messages' or 'traj' "
        f"(got {type(value).__name__})"
    )


def _session(name: str, raw: list[Any], system: Any = None) -> Recorded:
    if system is not None or _anthropic(raw):
        messages = _numbered(messages_from_anthropic(system, raw))
    else:
        messages = messages_from_openai(raw)
    return _checked(name, messages)


def _anthropic(raw: Sequence[Any]) -> bool:
    """Anthropic turns: content blocks of ``tool_use`` / ``tool_result``, no ``tool`` role."""
    for m in raw:
        if isinstance(m, Mapping):
            if m.get("role") == "tool" or m.get("tool_calls"):
                return False
            content = m.get("content")
            if isinstance(content, list) and any(
                isinstance(b, Mapping) and b.get("type") in ("tool_use", "tool_result")
                for b in content
            ):
                return True
    return False


def _numbered(messages: list[Message]) -> list[Message]:
    """Position ids (``m0``, ``m1``...), as OpenAI transcripts get: two equal messages
    would otherwise share an id made from their content."""
    return [m.with_id(f"m{i}") for i, m in enumerate(messages)]


def _checked(name: str, messages: Sequence[Message]) -> Recorded:
    if not messages:
        raise InvalidMessageError("the session has no messages")
    validate_pairing(list(messages))
    return Recorded(name, tuple(messages))
