"""Every path sends the same context (issue 35): a stored session appended turn by turn and
built before each model call, on SQLite and PostgreSQL, and ``ctxwarden serve`` on the
OpenAI and the Anthropic route, against ``build_context`` on the same history in an agent
loop (``previous`` = its last build).

The default run replays every model call of a fixed subset of the tau-bench and
swebench-mini dev runs (the first runs of each file); ``-m slow`` replays every call of
every dev run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from conftest import SHARED_DATA
from llm_servers import Reply, ScriptedServer, anthropic_message, openai_completion
from responses_servers import response_json
from service_harness import (
    PG_DSN,
    PG_SKIP,
    ProxyServer,
    add_tenant,
    drop_schema,
    module_db,
    pg_url,
)

from ctxwarden import Session, build_context
from ctxwarden.core.errors import BudgetError
from ctxwarden.core.handles import HANDLE_PREFIX
from ctxwarden.core.messages import Message
from ctxwarden.formats.anthropic import messages_from_anthropic, messages_to_anthropic
from ctxwarden.formats.openai import message_to_openai
from ctxwarden.formats.responses import (
    message_items,
    messages_from_responses,
    messages_to_responses,
)
from ctxwarden_bench.session_path import (
    SessionBuilder,
    compare_paths,
    engine_path,
    model_calls,
    sent,
)

__all__ = ["module_db"]  # the fixture, re-exported for pytest

SWEBENCH = SHARED_DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"
SUBSET = {"tau": 6, "swe": 3}  # runs replayed by default (all of their calls)
BUDGETS = {"tau": 3000, "swe": 4000}
CLAUDE = "claude-sonnet-4-5"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'paths.db'}"
        return
    if not PG_DSN:
        pytest.skip(PG_SKIP)
    schema = f"ctxw_paths_{uuid.uuid4().hex[:10]}"
    yield pg_url(schema)
    drop_schema(schema)


def _runs(which: str, tau_bench_path: Path) -> list[list[Message]]:
    from ctxwarden_bench.swebench import load_swebench
    from ctxwarden_bench.traces import load_tau_bench

    if which == "tau":
        return load_tau_bench(tau_bench_path)
    if not SWEBENCH.exists():
        pytest.skip(f"swebench-mini data not found at {SWEBENCH}")
    return load_swebench(SWEBENCH)


# -- the case of the issue -------------------------------------------------------------------


def one_prompt_agent(rounds: int) -> list[dict[str, Any]]:
    """One user message, then ``rounds`` tool calls with ~900-token results (the Claude Code
    pattern: one prompt, then many tool calls)."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Fix the parser bug of ticket PRJ-4471: order ORD-77123 "
         "loses its trailing comma in tests/test_parser.py."},
    ]  # fmt: skip
    for r in range(rounds):
        call = {
            "id": f"call_{r}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"m{r}.py"})},
        }
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = "\n".join(
            f"    line {i}: value_{r}_{i} = compute({i}, {r})  # step" for i in range(70)
        )
        out.append({"role": "tool", "tool_call_id": f"call_{r}", "content": body})  # fmt: skip
    return out


def test_one_prompt_and_twelve_tool_rounds_keep_the_request(store_url: str) -> None:
    """The session built before every model call at 3,000 tokens sends what build_context
    sends, the user's request in every build (it was lost from the second round on)."""
    history = one_prompt_agent(12)
    request = history[1]["content"]
    with Session(store_url, "one-prompt") as s:
        s.append(history[:2])
        previous = None
        for end in range(4, len(history) + 1, 2):  # after each round: the next model call
            s.append(history[end - 2 : end])
            built = s.build(max_input_tokens=3000)
            previous = build_context(history[:end], max_input_tokens=3000, previous=previous)
            assert built.to_openai() == previous.to_openai(), f"round {end // 2 - 1}"
            assert any(m.text == request for m in built.messages), f"round {end // 2 - 1}"
            assert built.input_tokens <= 3000
        assert built.input_tokens > 2000  # the budget is used, not a lone last round


# -- the dev agent loops, session on SQLite and PostgreSQL ------------------------------------


def _check(runs: Sequence[Sequence[Message]], budget: int, store: str, **kw: Any) -> None:
    with SessionBuilder(store, **kw) as session:
        found = compare_paths(
            runs, budget, {"session": session.build}, reference=engine_path(**kw)
        )["session"]
    assert found.calls == sum(len(model_calls(r)) for r in runs) > 0
    assert found.equal == found.calls, found.examples
    assert found.user_missing == 0


@pytest.mark.parametrize("which", ["tau", "swe"])
def test_dev_agent_loops_through_a_session_send_what_build_context_sends(
    which: str, store_url: str, tau_bench_path: Path
) -> None:
    runs = _runs(which, tau_bench_path)[: SUBSET[which]]
    _check(runs, BUDGETS[which], store_url)


# Dev runs outside the subset whose calls once differed between the paths, replayed whole:
# tau-bench run 47 (a held build weighed compacting against the tokens a call adds, counted
# over the session's slice where build_context counted the whole history: call 26 compacted
# in memory and held in the session); runs 5 and 15 with the offline summariser (the recall
# gate read the shape of the few messages after the summary, where build_context read the
# newest 50, those the summary folds among them: one path recalled, the other did not).
ONCE_DIFFERED = [
    pytest.param(47, None, id="tau47"),
    pytest.param(5, "offline", id="tau5-offline"),
    pytest.param(15, "offline", id="tau15-offline"),
]


@pytest.mark.parametrize(("run", "summarizer"), ONCE_DIFFERED)
def test_dev_runs_that_once_differed_send_what_build_context_sends(
    run: int, summarizer: str | None, store_url: str, tau_bench_path: Path
) -> None:
    runs = _runs("tau", tau_bench_path)[run : run + 1]
    _check(runs, BUDGETS["tau"], store_url, summarizer=summarizer)


@pytest.mark.exhaustive
@pytest.mark.parametrize("which", ["tau", "swe"])
def test_every_call_of_every_dev_run_through_a_session(
    which: str, store_url: str, tau_bench_path: Path
) -> None:
    _check(_runs(which, tau_bench_path), BUDGETS[which], store_url)


# -- through ctxwarden serve, both routes ------------------------------------------------------


@pytest.fixture(scope="module")
def served(module_db: str) -> Iterator[tuple[ProxyServer, Any, str]]:
    """``ctxwarden serve`` on SQLite and on PostgreSQL, both routes to one upstream."""
    upstream = ScriptedServer().start()
    db = module_db
    key = add_tenant(db, "acme")
    proxy = ProxyServer(db, upstream=upstream.url + "/v1", anthropic_upstream=upstream.url)
    try:
        yield proxy, upstream, key
    finally:
        proxy.stop()
        upstream.stop()


def _openai_reply(m: Message) -> dict[str, Any]:
    body = openai_completion("", finish_reason="tool_calls" if m.tool_calls else "stop")
    body["choices"][0]["message"] = message_to_openai(m)
    return body


def _anthropic_reply(m: Message) -> dict[str, Any]:
    _, (turn,) = messages_to_anthropic([m])
    body = anthropic_message("", model=CLAUDE)
    blocks = turn["content"] if isinstance(turn["content"], list) else [
        {"type": "text", "text": turn["content"]}
    ]  # fmt: skip
    body["content"] = blocks
    body["stop_reason"] = "tool_use" if m.tool_calls else "end_turn"
    return body


def _wire(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages with ``"content": null`` left out: the proxy stores a reply as it
    means (a call without text), and the wire form of that is either; nothing else is
    normalised."""
    return [{k: v for k, v in m.items() if not (k == "content" and v is None)} for m in messages]


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value (the texts of a body's messages)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _user_kept(text: str, body: Any) -> bool:
    """Whether ``body`` holds the user message ``text``: whole, or the agent's task cut to
    its share (steps.task: its head, then the whole message's handle)."""
    return any(
        s == text or (s.startswith(text[:40]) and HANDLE_PREFIX in s) for s in _strings(body)
    )


def _or_refused(reference: Any, history: Sequence[Message], budget: int) -> Any:
    """The in-memory build, or ``None`` when it refuses (a system prompt and task the
    budget cannot hold: a swebench-mini task is 3,757 tokens by gpt-4o's count, more by
    Claude's estimate)."""
    try:
        return reference(history, budget)
    except BudgetError:
        return None


def _refused(call: Any, error: type[Exception]) -> None:
    """The proxy refuses what the build refuses: a 400 naming the budget, nothing sent."""
    with pytest.raises(error, match=r"context_budget_too_small|budget must be at least"):
        call()


def _replay_served(
    runs: Sequence[Sequence[Message]], budget: int, route: str, served: Any
) -> tuple[int, int]:
    """Each run as a client of the proxy: the whole history before each model call, the
    recorded reply from the upstream; what the upstream received against build_context."""
    proxy, upstream, key = served
    model = CLAUDE if route == "anthropic" else "gpt-4o"
    reference = engine_path(model)
    calls = equal = 0
    oa = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    an = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)
    try:
        for run in runs:
            headers = {"X-Ctxwarden-Session": f"run-{uuid.uuid4().hex[:10]}",
                       "X-Ctxwarden-Max-Input-Tokens": str(budget)}  # fmt: skip
            for k in model_calls(run):
                before = run[:k]
                if route == "openai":
                    want = _or_refused(reference, before, budget)
                    call = partial(
                        oa.chat.completions.create,
                        model=model, messages=sent(before), extra_headers=headers,
                    )  # fmt: skip
                    if want is None:  # the build cannot hold the request: both refuse
                        _refused(call, openai.BadRequestError)
                        calls, equal = calls + 1, equal + 1
                        continue
                    upstream.reply(Reply(body=_openai_reply(run[k])))
                    call()
                    got: Any = _wire(upstream.requests[-1].json["messages"])
                    expected: Any = _wire(want.to_openai())
                elif route == "responses":
                    # the history as a Responses client holds it: the system prompt as
                    # instructions, the rest as items (a result carries no tool name there)
                    items = [i for m in before[1:] for i in message_items(m)]
                    carried = messages_from_responses(items, before[0].text)
                    ided = [m.with_id(f"m{i}") for i, m in enumerate(carried)]
                    want = _or_refused(reference, ided, budget)
                    call = partial(
                        oa.responses.create, model=model, instructions=before[0].text,
                        input=items, extra_headers=headers,
                    )  # fmt: skip
                    if want is None:
                        _refused(call, openai.BadRequestError)
                        calls, equal = calls + 1, equal + 1
                        continue
                    upstream.reply(Reply(body=response_json(message_items(run[k]))))
                    call()
                    body = upstream.requests[-1].json
                    got = (body.get("instructions"), body["input"])
                    expected = messages_to_responses(want.messages)
                else:
                    system, turns = messages_to_anthropic(before)
                    # the history as this route carries it: consecutive messages of one
                    # role are one turn (an answer's text and its call, results and the
                    # user's next words), stored as the proxy reads them back
                    carried = messages_from_anthropic(system, turns)
                    ided = [m.with_id(f"m{i}") for i, m in enumerate(carried)]
                    want = _or_refused(reference, ided, budget)
                    call = partial(
                        an.messages.create,
                        model=model, max_tokens=256, messages=turns, extra_headers=headers,
                        **({"system": system} if system else {}),
                    )  # fmt: skip
                    if want is None:
                        _refused(call, anthropic.BadRequestError)
                        calls, equal = calls + 1, equal + 1
                        continue
                    upstream.reply(Reply(body=_anthropic_reply(run[k])))
                    call()
                    body = upstream.requests[-1].json
                    got = (body.get("system"), body["messages"])
                    expected = want.to_anthropic()
                calls += 1
                equal += got == expected
                user = next((m for m in reversed(before) if m.role == "user"), None)
                assert user is None or _user_kept(user.text, got), "the newest user message"
    finally:
        oa.close()
        an.close()
    return calls, equal


@pytest.mark.parametrize("route", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("which", ["tau", "swe"])
def test_dev_agent_loops_through_serve_send_what_build_context_sends(
    which: str, route: str, served: Any, tau_bench_path: Path
) -> None:
    runs = _runs(which, tau_bench_path)[: SUBSET[which] // 2 or 1]
    calls, equal = _replay_served(runs, BUDGETS[which], route, served)
    assert calls == sum(len(model_calls(r)) for r in runs) > 0
    assert equal == calls


@pytest.mark.exhaustive
@pytest.mark.parametrize("route", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("which", ["tau", "swe"])
def test_every_call_of_every_dev_run_through_serve(
    which: str, route: str, served: Any, tau_bench_path: Path
) -> None:
    runs = _runs(which, tau_bench_path)
    calls, equal = _replay_served(runs, BUDGETS[which], route, served)
    assert equal == calls == sum(len(model_calls(r)) for r in runs)


# -- the bench's rows through Session ------------------------------------------------------------


def test_the_bench_rows_through_a_session_are_the_in_memory_rows(
    tmp_path: Path, tau_bench_path: Path, locomo_path: Path
) -> None:
    """``ctxwarden bench`` reports the service's path beside the in-memory one: a tau-bench
    row through a stored session at each budget, and LoCoMo questions through a session's
    append → summarize_sync → build. Any difference between them fails here."""
    from ctxwarden_bench.report import SESSION_ROW, TAU_BUDGETS, _locomo_paths, _paths_lines, _tau
    from ctxwarden_bench.served_path import SERVED_ROW
    from ctxwarden_bench.traces import load_locomo

    runs = json.loads(tau_bench_path.read_text("utf-8"))[:4]
    small = tmp_path / "tau.json"
    small.write_text(json.dumps(runs), "utf-8")
    rows = _tau(small, None, False)["strategies"]
    for budget in TAU_BUDGETS:
        memory = rows[f"ctxwarden (agent loop) @{budget}"]
        assert rows[f"{SESSION_ROW} @{budget}"] == memory and memory["calls"] > 0
    locomo = _locomo_paths(load_locomo(locomo_path)[:1], None)
    paths = locomo["rows"]
    assert paths["session"]["same_as_build_context"] == paths["session"]["questions"] > 0
    assert paths["session"]["answer_recall"] == paths["build_context"]["answer_recall"]
    # no broker given (the README's first command): the serve + worker row is not run,
    # and the report says so and why, under the paths table it prints
    assert SERVED_ROW not in paths and "--broker" in locomo["not_run"][SERVED_ROW]
    shown = "\n".join(_paths_lines(locomo))
    assert "| session | 5 of 5 |" in shown and f"_{SERVED_ROW} not run: " in shown, shown
