"""build_context with a summariser: summary and facts layers, failure never loses a message."""

from __future__ import annotations

import json
from collections.abc import Sequence

from typer.testing import CliRunner

from ctxwarden.cli import app
from ctxwarden.conversation import pairing_problems
from ctxwarden.engine import build_context
from ctxwarden.errors import ProviderError
from ctxwarden.messages import Message
from ctxwarden.summarize import SummaryResult
from ctxwarden.tokens import TokenCounter


def shop_chat(turns: int) -> list[Message]:
    msgs = [Message.system("You are a clothing shop assistant.", id="sys")]
    msgs.append(Message.user("Hi! My budget is 1500 USD and I wear size L.", id="u0"))
    msgs.append(Message.assistant("Noted: budget 1500 USD, size L.", id="a0"))
    for t in range(1, turns):
        msgs.append(Message.user(f"Show me jacket model J-{t:03d} in another colour.", id=f"u{t}"))
        msgs.append(
            Message.assistant(
                f"Jacket J-{t:03d} comes in navy and olive; it costs {100 + t} USD.", id=f"a{t}"
            )
        )
    return msgs


def test_offline_summary_and_facts_layers_appear_and_facts_stay_exact() -> None:
    history = shop_chat(40)
    previous = None
    summaries = set()
    for end in range(10, len(history) + 1, 2):
        built = build_context(
            history[:end], "gpt-4o", 1200, summarizer="offline", previous=previous
        )
        previous = built
        assert built.input_tokens <= 1200
        assert pairing_problems(list(built.messages)) == []
        if built.audit.layers["summary"]:
            summaries.add(next(m.text for m in built.messages if m.id == "ctxwarden:summary"))
    facts = next(m.text for m in built.messages if m.id == "ctxwarden:facts")
    assert "1500" in facts and "L" in facts
    assert built.audit.layers["summary"] > 0 and built.audit.layers["facts"] > 0
    assert len(summaries) >= 2  # the summary was rewritten as the conversation went on
    assert (
        TokenCounter.for_model("gpt-4o").count_messages(built.messages).tokens == built.input_tokens
    )


class FailingSummarizer:
    async def summarize(
        self, messages: Sequence[Message], previous: str | None = None
    ) -> SummaryResult:
        raise ProviderError("upstream 500", status=500)

    async def merge(self, summaries: Sequence[str]) -> SummaryResult:
        raise ProviderError("upstream 500", status=500)


def test_failing_summarizer_keeps_every_message_and_says_so() -> None:
    history = shop_chat(40)
    built = build_context(history, "gpt-4o", 100_000, summarizer=FailingSummarizer())
    sent = [m.id for m in built.messages if not m.id.startswith("ctxwarden:")]
    assert sent == [m.id for m in history]
    assert any("summarisation failed" in w for w in built.audit.warnings)
    assert not built.audit.by_action("summarized")


def test_cli_build_with_offline_summarizer(tmp_path: object) -> None:
    transcript = json.dumps([m.to_openai() for m in shop_chat(40)])
    result = CliRunner().invoke(
        app,
        ["build", "-m", "gpt-4o", "-b", "900", "--summarizer", "offline", "-"],
        input=transcript,
    )
    assert result.exit_code == 0, result.output
    sent = json.loads(result.stdout)
    assert sent[0]["role"] == "system"
    assert any("Summary of the earlier conversation" in (m["content"] or "") for m in sent)
