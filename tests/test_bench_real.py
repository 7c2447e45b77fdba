"""``ctxwarden bench --agent-model / --summarizer`` against a fake OpenAI-compatible model.

The real ``openai`` SDK talks to an in-process HTTP server (tests/llm_servers.py). The
fake model answers from the request: with tool definitions it is the shop agent (list
the products, open one, then answer); with ``response_format`` JSON it extracts facts;
otherwise it writes a summary. Its ``prompt_tokens`` are a function of the request
that our own count cannot produce, so the report's provider figures are traceable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    openai_completion,
    openai_error,
    openai_tool_calls,
)
from typer.testing import CliRunner

from ctxwarden.cli.main import app
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.registry.cost import estimate_cost
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.formats.openai import message_from_openai
from ctxwarden.llm import OpenAICompatible, RetryPolicy
from ctxwarden_bench.metrics import OursStrategy
from ctxwarden_bench.real_agent import ToolAgent
from ctxwarden_bench.report import run_bench
from ctxwarden_bench.scenarios_agent_chat import LadderStrategy
from ctxwarden_bench.scenarios_laptop import (
    MASK,
    TOOLS,
    SeedStrategy,
    run_laptop,
    run_tool,
)
from ctxwarden_bench.summarizers import get_summarizer
from ctxwarden_bench.traces import locomo_recall

FAST = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02)
SUMMARY = "Summary: the user compared laptops; budget $1,500, mobile programming."
FACTS = {"budget": "$1,500", "use": "mobile programming (coding on the go)"}


def prompt_tokens(body: dict[str, Any]) -> int:
    """The fake's usage: a function of the request our counter cannot reproduce."""
    return 1000 + 7 * len(body["messages"])


@dataclass
class FakeModel:
    """Answers each request from its content (see the module docstring)."""

    fail_summaries: bool = False
    always_tools: bool = False
    agent: list[dict[str, Any]] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)  # prompt tokens of text answers
    summaries: list[dict[str, Any]] = field(default_factory=list)
    facts: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: Recorded) -> Reply:
        body = request.json
        if request.path != "/v1/chat/completions":
            return Reply(404, openai_error("not found", "invalid_request_error"))
        if "tools" in body:
            return self._agent(body)
        if body.get("response_format", {}).get("type") == "json_object":
            self.facts.append(body)
            if self.fail_summaries:
                return Reply(500, openai_error("facts model down"))
            return Reply(body=openai_completion(json.dumps(FACTS), prompt=200, completion=20))
        self.summaries.append(body)
        if self.fail_summaries:
            return Reply(500, openai_error("summariser down"))
        return Reply(body=openai_completion(SUMMARY, prompt=300, completion=40))

    def _agent(self, body: dict[str, Any]) -> Reply:
        self.agent.append(body)
        messages = body["messages"]
        prompt = prompt_tokens(body)
        n = len(messages)  # call ids follow the context, so equal contexts get equal replies
        if self.always_tools or messages[-1]["role"] == "user":
            call = (f"call_{n}", "get_products", {})
            return Reply(body=openai_tool_calls([call], prompt=prompt, model="fake-model"))
        last_call = next(m for m in reversed(messages) if m.get("tool_calls"))
        if last_call["tool_calls"][0]["function"]["name"] == "get_products":
            call = (f"call_{n}", "get_product_details", {"product_name": "Laptop Pro 14"})
            return Reply(body=openai_tool_calls([call], prompt=prompt, model="fake-model"))
        question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        self.answered.append(prompt)
        answer = f"The Laptop Pro 14 fits. (You asked: {question[:60]})"
        return Reply(body=openai_completion(answer, prompt=prompt, completion=30))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeModel, ScriptedServer]]:
    model = FakeModel()
    server = ScriptedServer(responder=model).start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    try:
        yield model, server
    finally:
        server.stop()


def fast_client(server: ScriptedServer, model: str) -> OpenAICompatible:
    return OpenAICompatible(model, base_url=server.url + "/v1", api_key="sk-test", retry=FAST)


STRATEGIES = ["Basic", "OMasking", "Summarization", "OMask+Summ", "ctxwarden"]


def test_real_agent_and_summariser_drive_laptop_shop(
    fake: tuple[FakeModel, ScriptedServer],
) -> None:
    model, _ = fake
    result = run_laptop(
        agent_model="openai:fake-model",
        summarizer="openai:gpt-4o-mini",
        turns=3,
        summarize_every=2,
    )
    runs = result["runs"]
    assert list(runs) == STRATEGIES
    assert result["agent"] == "openai:fake-model"
    assert result["summarizer"] == "openai:gpt-4o-mini"
    # the model saw the seed's tool definitions in every agent request
    assert model.agent and all(body["tools"] == TOOLS for body in model.agent)
    assert all(body["model"] == "fake-model" for body in model.agent)
    # each strategy held its own 3-turn conversation: list, open, answer per turn
    for run in runs.values():
        assert run.extra["agent_requests"] == 9
        assert run.extra["agent_tool_calls"] == 6
        assert run.extra["agent_unanswered_turns"] == 0
        assert len(run.input_tokens_per_turn) == 3
    assert len(model.agent) == 9 * len(STRATEGIES)
    # provider usage of the answering requests, in order, strategy by strategy
    provider = [
        t for name in STRATEGIES for t in runs[name].extra["provider_input_tokens_per_turn"]
    ]
    assert provider == model.answered
    basic_prompts = [prompt_tokens(b) for b in model.agent[:9]]
    assert runs["Basic"].extra["agent_input_tokens"] == sum(basic_prompts)
    # ...and our exact count of the same contexts, which the fake does not compute
    counter = TokenCounter.for_model("gpt-4o")
    last_basic = [message_from_openai(m) for m in model.agent[8]["messages"]]
    assert (
        runs["Basic"].input_tokens_per_turn[-1] == counter.count_messages(last_basic, TOOLS).tokens
    )
    assert (
        runs["Basic"].input_tokens_per_turn[-1]
        != runs["Basic"].extra["provider_input_tokens_per_turn"][-1]
    )

    # the contexts the strategies built are what the model received
    def turn3(name: str) -> list[dict[str, Any]]:
        k = STRATEGIES.index(name)
        msgs: list[dict[str, Any]] = model.agent[9 * k + 8]["messages"]
        return msgs

    assert len(turn3("Basic")) == 1 + 6 * 2 + 5  # turns 1-2 whole, turn 3 before its answer
    assert any(m.get("content") == MASK for m in turn3("OMasking"))
    summary_msgs = [m for m in turn3("Summarization") if m["role"] == "user"]
    assert summary_msgs[0]["content"] == "Summary of the conversation so far:\n" + SUMMARY
    assert len(turn3("Summarization")) < len(turn3("Basic"))
    facts_layer = [m["content"] for m in turn3("ctxwarden") if m["role"] == "system"]
    assert any("1,500" in text and "mobile programming" in text for text in facts_layer)
    # summariser and extractor calls: real usage, priced at gpt-4o-mini
    summ = runs["Summarization"]
    assert summ.summarizer_usage == Usage(input_tokens=600, output_tokens=80, calls=2)
    assert runs["ctxwarden"].summarizer_usage == Usage(input_tokens=600, output_tokens=60, calls=3)
    assert runs["OMasking"].summarizer_usage.calls == 0
    assert len(model.summaries) == 4 and len(model.facts) == 3
    plain = estimate_cost(Usage(input_tokens=summ.total_input_tokens), "gpt-4o")
    mini = estimate_cost(summ.summarizer_usage, "gpt-4o-mini")
    assert summ.cost_usd == pytest.approx(plain + mini)
    assert mini < estimate_cost(summ.summarizer_usage, "gpt-4o")  # not the agent's price
    assert result["facts_held_each_turn_from_2"] is True


def test_failing_summariser_loses_no_message_and_is_reported(
    fake: tuple[FakeModel, ScriptedServer],
) -> None:
    model, server = fake
    model.fail_summaries = True
    result = run_laptop(
        agent_model="openai:fake-model",
        summarizer=fast_client(server, "gpt-4o-mini"),
        turns=3,
        summarize_every=2,
    )
    runs = result["runs"]
    for name in ("Summarization", "OMask+Summ"):  # fires after turn 2 (turn 3 has 3 users)
        assert runs[name].extra["summarizer_failures"] == 1
        assert runs[name].summarizer_usage.calls == 0
        assert "summariser down" in runs[name].extra["summarizer_errors"][0]
    # every summary failed, so Summarization sent exactly what Basic sent, turn by turn
    assert runs["Summarization"].input_tokens_per_turn == runs["Basic"].input_tokens_per_turn
    k = STRATEGIES.index("Summarization")
    assert model.agent[9 * k + 8]["messages"] == model.agent[8]["messages"]
    assert runs["ctxwarden"].extra["summarizer_failures"] == 3  # facts calls, all failed
    assert result["facts"] == {}


def test_summariser_failure_keeps_every_message_in_each_strategy(
    fake: tuple[FakeModel, ScriptedServer],
) -> None:
    model, server = fake
    model.fail_summaries = True
    counter = TokenCounter.for_model("gpt-4o")
    with get_summarizer(fast_client(server, "gpt-4o-mini")) as summ:
        history = [Message.system("You help.", id="s")]
        for i in range(40):
            history += [
                Message.user(f"question {i}", id=f"u{i}"),
                Message.assistant(f"a{i}", id=f"a{i}"),
            ]
        seed = SeedStrategy(False, True, summ, every=2)
        seed.after_turn(history, counter)
        assert seed(history) == history
        ladder = LadderStrategy(counter, summ, window=None, summary=True, facts=True)
        assert ladder(history) == history  # no window: everything stays
        assert ladder.account.errors and ladder.text is None
        ours = OursStrategy("gpt-4o", 100_000, trigger=_trigger(), summarizer=summ)
        built = ours(history)
        assert [m.id for m in built if not m.id.startswith("ctxwarden:")] == [m.id for m in history]
        assert len(ours.account.errors) == 2  # the facts call and the summary call


def _trigger() -> Any:
    from ctxwarden.memory.summaries import SummaryTrigger

    return SummaryTrigger(max_messages=30, keep_recent=15, fill_ratio=None)


def test_agent_that_never_answers_is_capped_and_the_history_stays_valid(
    fake: tuple[FakeModel, ScriptedServer],
) -> None:
    model, server = fake
    model.always_tools = True
    agent = ToolAgent(fast_client(server, "fake-model"), TOOLS, run_tool, max_tool_rounds=2)
    with agent:
        result = run_laptop(agent_model=agent, turns=2)
    basic = result["runs"]["Basic"]
    assert basic.extra["agent_unanswered_turns"] == 2
    assert basic.extra["agent_requests"] == 6  # 2 tool rounds + the capped try, per turn
    assert basic.extra["agent_tool_calls"] == 4  # the capped try's calls are not run
    second_turn_first = model.agent[3]["messages"]
    # turn 1 left question, 2 call/result pairs and no dangling call; turn 2 asks next
    assert [m["role"] for m in second_turn_first] == ["system", "user"] + [
        "assistant",
        "tool",
    ] * 2 + ["user"]


def test_run_tool_answers_bad_calls_with_an_error_the_model_can_read() -> None:
    assert "Laptop Pro 14" in run_tool(ToolCall("c", "get_products", "{}"))
    details = json.loads(
        run_tool(ToolCall("c", "get_product_details", '{"product_name": "devbook 15"}'))
    )
    assert details["name"] == "DevBook 15"
    assert (
        "product_name"
        in json.loads(run_tool(ToolCall("c", "get_product_details", "not json")))["error"]
    )
    assert "get_products" in json.loads(run_tool(ToolCall("c", "buy_now", "{}")))["error"]


def _locomo_file(path: Path) -> Path:
    """A small LoCoMo-format conversation, long enough for summaries at 4,000 tokens."""
    conv: dict[str, Any] = {"speaker_a": "Ana", "speaker_b": "Ben"}
    for s in range(1, 5):
        conv[f"session_{s}_date_time"] = f"1:00 pm on {s} May, 2023"
        conv[f"session_{s}"] = [
            {
                "speaker": "Ana" if t % 2 == 0 else "Ben",
                "dia_id": f"D{s}:{t}",
                "text": f"In session {s}, turn {t}, we talked about hiking trail number "
                f"{s * 100 + t} near the lake, the weather, the gear we packed and the friends "
                "we met there.",
            }
            for t in range(40)
        ]
    qa = [
        {
            "question": "Which trail did they hike first?",
            "answer": "trail number 100",
            "category": 1,
        }
    ]
    path.write_text(json.dumps([{"conversation": conv, "qa": qa}]), "utf-8")
    return path


def test_locomo_recall_uses_the_real_summariser(
    fake: tuple[FakeModel, ScriptedServer], tmp_path: Path
) -> None:
    from ctxwarden_bench.traces import load_locomo

    model, _ = fake
    convs = load_locomo(_locomo_file(tmp_path / "locomo.json"))
    result = locomo_recall(convs, 4000, summarizer="openai:gpt-4o-mini")
    ours = result["ctxwarden"]
    assert ours["summarizer"] == "openai:gpt-4o-mini"
    assert ours["summarizer_calls"] == len(model.summaries) + len(model.facts) > 0
    assert ours["summarizer_input_tokens"] == 300 * len(model.summaries) + 200 * len(model.facts)
    assert ours["summarizer_cost_usd"] == pytest.approx(
        estimate_cost(
            Usage(
                input_tokens=ours["summarizer_input_tokens"],
                output_tokens=ours["summarizer_output_tokens"],
                calls=ours["summarizer_calls"],
            ),
            "gpt-4o-mini",
        )
    )
    assert any("trail number 100" in m["content"] for b in model.summaries for m in b["messages"])


def test_bench_report_with_real_agent_and_summariser_specs(
    fake: tuple[FakeModel, ScriptedServer], tmp_path: Path
) -> None:
    model, _ = fake
    locomo = _locomo_file(tmp_path / "locomo.json")
    report = run_bench(
        tmp_path / "report",
        agent_model="openai:fake-model",
        summarizer="openai:gpt-4o-mini",
        locomo=locomo,
        laptop_turns=2,
        chat_rounds=12,
    )
    saved = json.loads((tmp_path / "report" / "report.json").read_text("utf-8"))
    assert saved == json.loads(json.dumps(report))
    assert saved["summarizer"]["name"] == "openai:gpt-4o-mini"
    assert saved["summarizer"]["priced_as"] == "gpt-4o-mini"
    assert saved["agent"] == "openai:fake-model"
    lap = saved["scenarios"]["laptop-shop"]["strategies"]
    provider = [t for s in lap.values() for t in s["provider_input_tokens_per_turn"]]
    assert provider == model.answered[: len(provider)] and len(provider) == 2 * len(lap)
    assert lap["Basic"]["agent_cost_usd"] is None  # fake-model is not in the registry
    chat = saved["scenarios"]["agent-chat"]
    assert chat["rounds"] == 12 and chat["summarizer"] == "openai:gpt-4o-mini"
    assert chat["strategies"]["full three-tier"]["summarizer_calls"] > 0
    ours = chat["strategies"]["ctxwarden"]
    assert ours["summarizer_input_tokens"] > 0 and ours["summarizer_failures"] == 0
    loc = saved["scenarios"]["locomo"]["strategies"]["ctxwarden"]
    assert loc["summarizer"] == "openai:gpt-4o-mini" and loc["summarizer_calls"] > 0
    tokens_cost = estimate_cost(Usage(input_tokens=loc["total_input_tokens"]), "gpt-4o")
    assert loc["cost_usd"] == pytest.approx(tokens_cost + loc["summarizer_cost_usd"], abs=1e-6)
    assert loc["summarizer_cost_usd"] > 0
    md = (tmp_path / "report" / "report.md").read_text("utf-8")
    assert "Summariser: **openai:gpt-4o-mini**" in md
    assert "Real agent openai:fake-model" in md


def test_run_bench_reports_summariser_failures(
    fake: tuple[FakeModel, ScriptedServer], tmp_path: Path
) -> None:
    model, server = fake
    model.fail_summaries = True
    report = run_bench(
        tmp_path, summarizer=fast_client(server, "gpt-4o-mini"), laptop_turns=2, chat_rounds=12
    )
    chat = report["scenarios"]["agent-chat"]["strategies"]
    assert chat["+ rolling summary"]["summarizer_failures"] > 0
    assert chat["+ rolling summary"]["summarizer_calls"] == 0
    assert chat["+ rolling summary"]["facts_lost"] == chat["window 20 + pinning"]["facts_lost"]
    assert "Summariser calls that failed" in (tmp_path / "report.md").read_text("utf-8")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--agent-model", "anthropic:claude-haiku-4-5"], "OpenAI-compatible"),
        (["--agent-model", "offline"], "OpenAI-compatible"),
        (["--summarizer", "nope:model"], "unknown provider"),
    ],
)
def test_cli_bad_models_are_one_line_errors(
    args: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path), "--no-traces", *args])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and expected in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "report.json").exists()


def test_cli_agent_that_fails_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ScriptedServer(
        responder=lambda r: Reply(400, openai_error("model not found", "invalid_request_error"))
    ).start()
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        result = CliRunner().invoke(
            app, ["bench", "--out", str(tmp_path), "--no-traces", "--agent-model", "openai:nope"]
        )
    finally:
        server.stop()
    assert result.exit_code == 1  # the provider failed (a runtime failure), not the call
    assert result.output.count("\n") == 1
    assert "agent model openai:nope failed at turn 1 of strategy 'Basic'" in result.output
    assert "model not found" in result.output


def test_get_summarizer_rejects_what_it_cannot_use() -> None:
    with pytest.raises(ConfigError, match="provider spec"):
        get_summarizer(42)
    assert get_summarizer("offline").real is False


def test_cli_report_piped_keeps_whole_tables(tmp_path: Path) -> None:
    """Piped or logged (not a terminal), the report prints as report.md has it: every
    cell whole, not cut to fit 80 columns."""
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path), "--no-traces"])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "report.md").read_text("utf-8")
    table = [line for line in report.splitlines() if line.startswith("| ctxwarden |")]
    assert table and all(line in result.output for line in table)
    assert "…" not in result.output
