"""A coding agent's history for the wrap and MCP tests: a dozen file reads, so the
default policy masks the older results (``[tool result masked ...; cw:msg:m3]``). The
results hold non-ASCII text, tabs and trailing spaces, so a byte-for-byte recall is
checked on more than ASCII."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["coding_history", "file_text"]


def file_text(i: int) -> str:
    """The read of file ``i``: unique words (``zebra<i>``), “quotes”, a tab, an emoji."""
    head = f"# mod{i}.py — naïve “quotes” \t🦓 \n"
    return head + "\n".join(f"def f{i}_{j}(x):  return x*{j}  # zebra{i}" for j in range(30))


def coding_history(task: str = "Fix the failing test in parser.py", reads: int = 12) -> list[Any]:
    """system, the task, ``reads`` read_file calls with their results, and a new request;
    the first result is stored as ``m3`` (system m0, task m1, call m2)."""
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
    ]
    for i in range(reads):
        arguments = json.dumps({"path": f"src/mod{i}.py"})
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "read_file", "arguments": arguments}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": file_text(i)})
    messages.append({"role": "user", "content": "Now run the tests."})
    return messages
