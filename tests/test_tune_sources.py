"""Reading recorded sessions for ``ctxwarden tune``: every format, and bad files named
by file and line while the rest is read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from ctxwarden.session import Session
from ctxwarden.tune.sources import read_sessions, read_store

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_user", "arguments": '{"user_id": "sara_doe_496"}'},
        }
    ],
}
OPENAI = [
    {"role": "system", "content": "You are an airline agent."},
    {"role": "user", "content": "I am sara_doe_496."},
    CALL,
    {"role": "tool", "tool_call_id": "c1", "content": '{"name": "Sara"}'},
    {"role": "assistant", "content": "Hello Sara."},
]
ANTHROPIC = {
    "system": "You are a coding agent.",
    "messages": [
        {"role": "user", "content": "Fix src/app/models.py"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls src"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "app"}],
        },
        {"role": "assistant", "content": "Done."},
    ],
}


def _write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1), "utf-8")
    return path


def test_every_format_is_read(tmp_path: Path) -> None:
    _write(tmp_path / "a-openai.json", OPENAI)
    _write(tmp_path / "b-request.json", {"model": "gpt-4o", "messages": OPENAI})
    _write(tmp_path / "c-anthropic.json", ANTHROPIC)
    _write(tmp_path / "d-runs.json", [{"task_id": 1, "traj": OPENAI}, {"traj": OPENAI}])
    _write(tmp_path / "e-lines.jsonl", "\n".join(json.dumps(m) for m in OPENAI))
    _write(tmp_path / "f-sessions.jsonl", f"{json.dumps(OPENAI)}\n{json.dumps(ANTHROPIC)}\n")
    _write(tmp_path / "README.md", "not a trace: ignored")

    found = read_sessions([tmp_path])

    assert found.problems == ()
    assert len(found.sessions) == 8
    anthropic = next(s for s in found.sessions if "c-anthropic" in s.name).messages
    assert [m.role for m in anthropic] == ["system", "user", "assistant", "tool", "assistant"]
    assert anthropic[2].tool_calls[0].parsed_arguments() == {"command": "ls src"}
    assert anthropic[3].tool_call_id == anthropic[2].tool_calls[0].id
    runs = [s for s in found.sessions if "d-runs" in s.name]
    assert [len(s.messages) for s in runs] == [5, 5]
    assert all(s.messages[2].tool_calls[0].name == "get_user" for s in runs)


def test_malformed_files_are_named_by_file_and_line_and_the_rest_is_read(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.json", OPENAI)
    broken = _write(tmp_path / "broken.json", '[\n  {"role": "user",\n  "content": oops}\n]')
    lines = _write(
        tmp_path / "lines.jsonl",
        f"{json.dumps(OPENAI)}\n{{not json\n\n{json.dumps([{'role': 'wizard', 'content': 'x'}])}\n"
        f"{json.dumps(OPENAI)}\n",
    )
    orphan = {"traj": [{"role": "tool", "tool_call_id": "zz", "content": "x"}]}
    runs = _write(
        tmp_path / "runs.json", f"[\n{json.dumps({'traj': OPENAI})},\n\n  {json.dumps(orphan)}\n]"
    )
    (tmp_path / "other.db").write_bytes(b"")
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    (tmp_path / "latin1.json").write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')

    found = read_sessions([tmp_path])

    problems = {(Path(p.source).name, p.line): p.reason for p in found.problems}
    assert set(problems) == {
        ("broken.json", 3),
        ("lines.jsonl", 2),
        ("lines.jsonl", 4),
        ("runs.json", 4),  # where the second run starts
        ("other.db", None),
        ("latin1.json", None),
    }
    assert "not valid JSON" in problems[("broken.json", 3)]
    assert "wizard" in problems[("lines.jsonl", 4)]
    assert "session 1" in problems[("runs.json", 4)]
    assert "not a ctxwarden store" in problems[("other.db", None)]
    assert "UTF-8" in problems[("latin1.json", None)]
    assert str(found.problems[0]).startswith(str(tmp_path / "broken.json") + ":3: ")
    names = sorted(Path(s.name.split("[")[0].split(":")[0]).name for s in found.sessions)
    assert names == ["good.json", "lines.jsonl", "lines.jsonl", "runs.json"]
    assert next(s.messages for s in found.sessions if s.name == str(good))[2].tool_calls
    assert runs.exists() and lines.exists() and broken.exists()


def test_a_missing_path_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    found = read_sessions([tmp_path / "nope.json"])
    assert found.sessions == ()
    assert "no such file" in str(found.problems[0])


def test_ctxwarden_store_file_and_url(tmp_path: Path) -> None:
    """What Session (and the proxy) record is read back, by file and by --db URL."""
    db = tmp_path / "sessions.db"
    url = f"sqlite:///{db}"
    for sid, tenant in (("one", "default"), ("two", "default"), ("three", "acme")):
        with Session(url, sid, tenant=tenant) as session:
            session.append(OPENAI)

    by_file = read_sessions([db])
    by_url = read_store(url, tenant="default")

    assert by_file.problems == () and by_url.problems == ()
    assert sorted(s.name.rsplit("/", 1)[1] for s in by_url.sessions) == ["one", "two"]
    assert len(by_file.sessions) == 3  # every tenant in the file
    assert [m.role for m in by_url.sessions[0].messages] == [m["role"] for m in OPENAI]
