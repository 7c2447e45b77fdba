"""What every framework adapter shares: lazy imports, the missing-extra error, and the
tau-bench replay with the checks each framework's real agent loop must pass.

The replay takes the dev trace with at least 60 messages and the most tool results
(62 messages, 27 tool results: an airline agent downgrading six reservations) and
scripts a framework's own fake model with its assistant messages in order; the
framework runs its real loop, executes real tools that return the recorded results,
and keeps its own history. One closing assistant text is added after the trace's
last tool result so the loop can end.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import REPO, TAU_BENCH

import ctxwarden
from ctxwarden import Message, TokenCounter, pairing_problems, validate_pairing
from ctxwarden_bench.traces import ID_KEYS, json_leaves

MODEL = "gpt-4o"
BUDGET = 4000
CLOSING = "All six reservations are now in economy; the refunds go to the original payments."
FRAMEWORKS = {"langchain": "langchain", "agents": "openai-agents", "pydantic_ai": "pydantic-ai"}
_WORD = re.compile(r"\w+")


@dataclass
class Step:
    """One scripted model response: text and tool calls as recorded (OpenAI shape)."""

    text: str | None
    calls: list[dict[str, Any]]

    @property
    def call_args(self) -> list[tuple[str, dict[str, Any]]]:
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in self.calls]


@dataclass
class Replay:
    system: str
    users: list[str]  # one per turn
    steps: list[list[Step]]  # the model's responses, per turn
    trace: list[dict[str, Any]]  # the OpenAI messages, closing text included
    needed: list[list[str]] = field(default_factory=list)  # per model call, in order
    outputs: dict[tuple[str, str], deque[str]] = field(default_factory=dict)

    @property
    def tool_names(self) -> list[str]:
        return sorted({n for turn in self.steps for s in turn for n, _ in s.call_args})

    def tool_output(self, name: str, args: dict[str, Any]) -> str:
        """The recorded result of this call (calls with equal arguments in order)."""
        return self.outputs[(name, _canonical(args))].popleft()

    def script(self) -> list[Step]:
        return [s for turn in self.steps for s in turn]


def _canonical(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True)


def load_replay() -> Replay:
    if not TAU_BENCH.exists():
        pytest.skip(f"tau-bench dev trace not found at {TAU_BENCH} (set CTXWARDEN_DATA)")
    runs = json.loads(TAU_BENCH.read_text("utf-8"))
    long_runs = [r["traj"] for r in runs if len(r["traj"]) >= 60]
    traj = max(long_runs, key=lambda t: sum(m["role"] == "tool" for m in t))
    trace = _unique_call_ids([*traj, {"role": "assistant", "content": CLOSING}])
    replay = Replay(system=trace[0]["content"], users=[], steps=[], trace=trace)
    outputs: dict[tuple[str, str], deque[str]] = defaultdict(deque)
    calls_by_id: dict[str, tuple[str, dict[str, Any]]] = {}
    for k, m in enumerate(trace[1:], start=1):
        if m["role"] == "user":
            replay.users.append(m["content"])
            replay.steps.append([])
        elif m["role"] == "assistant":
            step = Step(m.get("content"), m.get("tool_calls") or [])
            replay.steps[-1].append(step)
            replay.needed.append(_needed(step, trace[1:k]))
            for c in step.calls:
                calls_by_id[c["id"]] = (
                    c["function"]["name"],
                    json.loads(c["function"]["arguments"]),
                )
        else:
            name, args = calls_by_id[m["tool_call_id"]]
            outputs[(name, _canonical(args))].append(m["content"])
    replay.outputs = dict(outputs)
    assert len(traj) >= 60 and sum(m["role"] == "tool" for m in traj) >= 20
    return replay


def _unique_call_ids(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace with each reused tool-call id (the recording repeats some) made unique,
    in the call and its result: frameworks reject a completed call id used again."""
    seen: set[str] = set()
    renamed: dict[str, str] = {}
    out = []
    for k, m in enumerate(trace):
        m = json.loads(json.dumps(m))
        if m.get("tool_calls"):
            renamed = {}
            for c in m["tool_calls"]:
                if c["id"] in seen:
                    renamed[c["id"]] = c["id"] = f"{c['id']}-{k}"
                seen.add(c["id"])
        elif m["role"] == "tool":
            m["tool_call_id"] = renamed.get(m["tool_call_id"], m["tool_call_id"])
        out.append(m)
    return out


def _words(texts: Sequence[str]) -> set[str]:
    return {w for t in texts for w in _WORD.findall(t)}


def _needed(step: Step, before: list[dict[str, Any]]) -> list[str]:
    """The ids this call passes that an earlier message (after the system prompt) holds:
    the ids the context must still carry when the model makes this call."""
    texts = [m.get("content") or "" for m in before]
    texts += [c["function"]["arguments"] for m in before for c in m.get("tool_calls") or []]
    earlier = _words(texts)
    return [
        v
        for _, args in step.call_args
        for k, v in json_leaves(args)
        if k in ID_KEYS and isinstance(v, str) and v in earlier
    ]


def context_words(messages: Sequence[Message]) -> set[str]:
    return _words(
        [m.text for m in messages] + [c.arguments for m in messages for c in m.tool_calls]
    )


def check_model_calls(
    replay: Replay,
    received: Sequence[Sequence[Message]],
    tools: Sequence[dict[str, Any]] | None,
    budget: int = BUDGET,
) -> None:
    """Every call: system prompt first, pair-safe, within the budget, the ids it needs."""
    counter = TokenCounter.for_model(MODEL)
    assert len(received) == len(replay.script())
    for k, ctx in enumerate(received):
        assert ctx[0].role == "system" and ctx[0].text.startswith(replay.system.strip()), k
        assert pairing_problems(ctx) == [], k
        validate_pairing(ctx, allow_pending_tail=False)
        assert ctx[-1].role in ("user", "tool"), k
        tokens = counter.count_messages(ctx, tools).tokens
        assert tokens <= budget, (k, tokens)
        missing = [v for v in replay.needed[k] if v not in context_words(ctx)]
        assert missing == [], (k, missing)
    assert sum(len(n) for n in replay.needed) >= 10  # the check had ids to look for
    full = counter.count_messages(ctxwarden.messages_from_openai(replay.trace[:-1])).tokens
    assert full > 2 * budget  # the budget forced real cuts


def check_full_history(replay: Replay, history: Sequence[Message]) -> None:
    """The framework's own state holds every message of the conversation, in order."""

    def shape(m: Message) -> tuple[Any, ...]:
        calls = tuple((c.name, json.loads(c.arguments)) for c in m.tool_calls)
        return (m.role, m.text or "", calls)

    expected = [shape(m) for m in ctxwarden.messages_from_openai(replay.trace)]
    assert [shape(m) for m in history] == expected


def check_audit(audit: Any, budget: int = BUDGET) -> None:
    assert isinstance(audit, ctxwarden.Audit)
    assert audit.input_tokens <= budget
    assert {a.action for a in audit.actions} & {"masked", "dropped", "truncated"}


# -- lazy imports ---------------------------------------------------------------------------


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_importing_ctxwarden_loads_no_framework() -> None:
    code = (
        "import sys, ctxwarden, ctxwarden.integrations\n"
        f"print(sorted(m for m in {sorted(FRAMEWORKS)!r} if m in sys.modules))"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("langchain", "langchain", "langchain"),
        ("openai_agents", "agents", "openai-agents"),
        ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ],
)
def test_a_missing_extra_names_itself(module: str, blocked: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from ctxwarden.core.errors import MissingDependencyError\n"
        "try:\n"
        f"    import ctxwarden.integrations.{module}\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert f"pip install 'ctxwarden[{extra}]'" in out.stdout


# -- the docs pages -------------------------------------------------------------------------

DOCS = sorted((REPO / "docs" / "integrations").glob("*.md"))


def test_there_is_a_docs_page_per_framework_and_the_readme_links_it() -> None:
    assert [p.stem for p in DOCS] == ["langchain", "openai-agents", "pydantic-ai"]
    readme = (REPO / "README.md").read_text("utf-8")
    assert all(f"docs/integrations/{p.name}" in readme for p in DOCS)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.stem)
def test_docs_examples_parse_and_import_what_exists(page: Any) -> None:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text("utf-8"), re.S)
    assert blocks
    for code in blocks:
        tree = ast.parse(code)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ctxwarden"):
                module = importlib.import_module(node.module or "")
                assert all(hasattr(module, a.name) for a in node.names), node.module
