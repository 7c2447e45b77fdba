"""The ctxwarden CLI: count, models, --version, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ctxwarden import __version__
from ctxwarden.cli.main import app
from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter
from ctxwarden.formats.count import count_tokens
from ctxwarden.formats.transcript import load_example

runner = CliRunner()

PLAIN = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
]


def invoke(*args: str, input: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=input)


def write(tmp_path: Path, data: Any, name: str = "chat.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"ctxwarden {__version__}"


def test_count_plain_file_is_exact_and_matches_the_library(tmp_path: Path) -> None:
    result = invoke("count", "--model", "gpt-4o", "--json", write(tmp_path, PLAIN))
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokens"] == count_tokens(PLAIN, model="gpt-4o")
    assert report["exact"] is True
    assert (report["model"], report["encoding"], report["messages"]) == ("gpt-4o", "o200k_base", 3)
    assert report["input_cost_usd"] == pytest.approx(report["tokens"] * 2.5 / 1e6)


def test_count_example_with_tools(tmp_path: Path) -> None:
    result = invoke("count", "--example", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    example = load_example()
    expected = TokenCounter.for_model("gpt-4o").count_messages(
        example.messages, list(example.tools)
    )
    assert report["tokens"] == expected.tokens
    assert report["exact"] is False  # tool calls are counted by a documented method
    assert report["tool_calls"] == 6 and report["tool_definitions"] == 6
    human = invoke("count", "--example", "--model", "claude-sonnet-4-5")
    assert human.exit_code == 0
    assert "claude-sonnet-4-5 (anthropic)" in human.stdout and "estimate" in human.stdout


def test_count_reads_stdin_and_the_model_named_in_a_request_body() -> None:
    body = json.dumps({"model": "gpt-3.5-turbo-0125", "messages": PLAIN, "temperature": 0})
    result = invoke("count", "-", "--json", input=body)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["model"], report["encoding"]) == ("gpt-3.5-turbo", "cl100k_base")
    assert report["tokens"] == count_tokens(PLAIN, model="gpt-3.5-turbo")


def test_count_a_model_added_by_registry_file(tmp_path: Path) -> None:
    registry = tmp_path / "models.toml"
    registry.write_text(
        '[models."my-llama"]\nprovider = "vllm"\ncontext_window = 8192\n'
        'max_output_tokens = 2048\nestimator = "llama"\nprice = { input = 0.1, output = 0.1 }\n'
    )
    result = invoke(
        "count",
        "--model",
        "my-llama",
        "--registry",
        str(registry),
        "--json",
        write(tmp_path, PLAIN),
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["provider"], report["context_window"], report["exact"]) == ("vllm", 8192, False)


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        (
            '[{"role": "user", "content": "hi"},\n  {"role": }]',
            ["not valid JSON", "line 2, column"],
        ),
        (
            [{"role": "user", "content": "hi"}, {"content": "x"}],
            ["message 1", "'role'", "missing role"],
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "c1", "content": "{}"},
            ],
            ["message 1", "'tool_call_id'", "no matching tool call"],
        ),
        ({"msgs": []}, ["'messages'"]),
        ("42", ["expected a list of chat messages"]),
    ],
)
def test_bad_transcripts_fail_with_one_line_and_exit_2(
    tmp_path: Path, content: Any, needles: list[str]
) -> None:
    path = write(tmp_path, content)
    result = invoke("count", path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {path}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["count", "--model", "gtp-5", "--example"], "unknown model 'gtp-5'"),
        (["count", "/no/such/file.json"], "cannot read transcript"),
        (["count", "--example", "x.json"], "not both"),
        (["models", "--registry", "/no/such/models.toml"], "cannot read model registry file"),
    ],
)
def test_user_errors_exit_2(args: list[str], needle: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_bad_registry_file_names_file_and_field(tmp_path: Path) -> None:
    registry = tmp_path / "models.toml"
    registry.write_text('[models."gpt-4o"]\nprice = { input = -1 }\n')
    result = invoke("models", "--registry", str(registry))
    assert result.exit_code == 2
    assert f"{registry}: model 'gpt-4o', field 'price.input'" in result.stderr


def test_models_table_json_and_filters(tmp_path: Path) -> None:
    table = invoke("models")
    assert table.exit_code == 0
    for name in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro", "qwen3:8b", "o200k_base"):
        assert name in table.stdout
    listed = json.loads(invoke("models", "--json", "--provider", "anthropic").stdout)
    assert listed and {m["provider"] for m in listed} == {"anthropic"}
    sonnet = next(m for m in listed if m["name"] == "claude-sonnet-4-5")
    assert sonnet["price"] == {
        "input": 3.0,
        "output": 15.0,
        "cached_input": 0.3,
        "cache_write": 3.75,
    }
    registry = tmp_path / "extra.toml"
    registry.write_text(
        '[models."tiny-local"]\nprovider = "ollama"\ncontext_window = 4096\n'
        'max_output_tokens = 4096\nestimator = "qwen"\nprice = { input = 0, output = 0 }\n'
    )
    assert "tiny-local" in invoke("models", "--registry", str(registry)).stdout


def test_installed_script_prints_no_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "ctxwarden"
    if not script.exists():
        pytest.skip("ctxwarden console script not installed in this environment")
    bad = write(tmp_path, '{"messages": [', "broken.json")
    proc = subprocess.run([str(script), "count", bad], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {bad} is not valid JSON")
    ok = subprocess.run(
        [str(script), "count", "--example"], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and "tokens" in ok.stdout


def test_empty_stdin_says_what_to_give() -> None:
    result = invoke("count", "-", input="")
    assert result.exit_code == 2
    assert "no transcript: give a JSON FILE" in result.stderr


def _long_shop_chat() -> list[dict[str, str]]:
    chat = [
        {"role": "system", "content": "You are a clothing shop assistant."},
        {"role": "user", "content": "Hi! My budget is 1500 USD and I wear size L."},
        {"role": "assistant", "content": "Noted: budget 1500 USD, size L."},
    ]
    for t in range(1, 40):
        chat.append({"role": "user", "content": f"Show me jacket J-{t:03d} in another colour."})
        chat.append({"role": "assistant", "content": f"J-{t:03d} comes in navy; {100 + t} USD."})
    return chat


def test_build_and_explain_with_the_offline_summarizer_show_its_layers(tmp_path: Path) -> None:
    chat = write(tmp_path, _long_shop_chat())
    report = tmp_path / "audit.json"
    args = ("-m", "gpt-4o", "-b", "900", "--summarizer", "offline")
    result = invoke("build", *args, "--report", str(report), chat)
    assert result.exit_code == 0, result.output
    sent = json.loads(result.stdout)
    audit = json.loads(report.read_text())
    by_layer: dict[str, int] = {}
    for m in sent:
        text = m["content"] or ""
        name = (
            "summary"
            if text.startswith("Summary of the earlier conversation:")
            else "facts"
            if text.startswith("Known facts")
            else None
        )
        if name:
            by_layer[name] = count_tokens([m], model="gpt-4o") - REPLY_PRIMING
    assert by_layer and by_layer == {k: audit["layers"][k] for k in ("facts", "summary")}
    assert "budget: 1500 USD" in next(
        m["content"] for m in sent if m["content"].startswith("Known")
    )
    assert [a["action"] for a in audit["actions"]].count("summarized") == 1
    shown = invoke("explain", *args, chat)
    assert shown.exit_code == 0, shown.output
    rows = {line.split()[1]: line.split()[3] for line in shown.stdout.splitlines() if "│" in line}
    assert rows["summary"] == f"{audit['layers']['summary']:,}"
    assert rows["facts"] == f"{audit['layers']['facts']:,}"
    assert "summarized" in shown.stdout


def test_build_with_a_summary_share_in_the_policy_file(tmp_path: Path) -> None:
    chat = write(tmp_path, _long_shop_chat())
    policy = tmp_path / "policy.toml"
    policy.write_text("[summary]\nmax_messages = 30\nkeep_recent = 15\nsummary_share = 0.2\n")
    report = tmp_path / "audit.json"
    result = invoke(
        "build", "-m", "gpt-4o", "-b", "2000", "--summarizer", "offline",
        "--policy", str(policy), "--report", str(report), chat,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    audit = json.loads(report.read_text())
    assert 0 < audit["layers"]["summary"] <= 2000 * 0.2
    assert audit["input_tokens"] <= 2000


def test_count_unknown_model_suggests_the_nearest_names() -> None:
    result = invoke("count", "--model", "gpt4o", "--example")
    assert result.exit_code == 2
    assert "unknown model 'gpt4o'. Did you mean: gpt-4o, gpt-4, " in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_count_a_registry_model_with_its_own_encoding_or_factor(tmp_path: Path) -> None:
    from ctxwarden.core.registry.catalog import load_registry
    from ctxwarden.formats.openai import messages_from_openai

    registry = tmp_path / "models.toml"
    registry.write_text(
        '[models."acme-gpt"]\nprovider = "azure"\ncontext_window = 128_000\n'
        'max_output_tokens = 16_384\nencoding = "o200k_base"\n'
        "price = { input = 2.5, output = 10 }\n"
        '[models."claude-opus-4-7"]\nprovider = "anthropic"\ncontext_window = 200_000\n'
        'max_output_tokens = 32_000\nestimator = "claude"\nestimate_factor = 1.46\n'
        "price = { input = 5, output = 25 }\n"
    )
    chat = write(tmp_path, PLAIN)

    def count(model: str) -> dict[str, Any]:
        result = invoke("count", "--model", model, "--registry", str(registry), "--json", chat)
        assert result.exit_code == 0, result.stderr
        return dict(json.loads(result.stdout))

    exact = count("acme-gpt")
    assert (exact["provider"], exact["exact"]) == ("azure", True)
    assert exact["method"] == "openai-chat-formula"
    assert exact["tokens"] == count_tokens(PLAIN, model="gpt-4o")
    newer, older = count("claude-opus-4-7"), count("claude-opus-4-5")
    counter = TokenCounter.for_model("claude-opus-4-7", load_registry([registry]))
    assert counter.factor == 1.46
    assert newer["tokens"] == counter.count_messages(messages_from_openai(PLAIN)).tokens
    assert newer["tokens"] > older["tokens"] and newer["method"] == "estimate:claude"


def test_build_explain_and_session_with_a_registry_model(tmp_path: Path) -> None:
    """A user's model (tests/test_registry.py MY_LLAMA: 6,000-token window, factor 1.5,
    $1 per 1M input) from ``--registry``: its window, counts and price."""
    from test_registry import MY_LLAMA

    from ctxwarden.core.registry.catalog import load_registry
    from ctxwarden.pipeline.engine import build_context

    registry = tmp_path / "models.toml"
    registry.write_text(MY_LLAMA)
    history = _long_shop_chat() * 4
    chat, report = write(tmp_path, history), tmp_path / "audit.json"
    no_registry = invoke("build", "-m", "my-llama", chat)
    assert no_registry.exit_code == 2 and "no budget" in no_registry.stderr
    args = ("-m", "my-llama", "--registry", str(registry))
    result = invoke("build", *args, "--report", str(report), chat)
    assert result.exit_code == 0, result.output
    expected = build_context(history, "my-llama", registry=load_registry([registry]))
    assert json.loads(result.stdout) == expected.to_openai()
    audit = json.loads(report.read_text())
    assert audit["budget"] == 6_000 - 4096
    assert audit["fill_ratio"] == pytest.approx(audit["input_tokens"] / 6_000, abs=1e-4)
    assert audit["input_tokens"] == expected.input_tokens <= audit["budget"]
    assert audit["estimated_cost_usd"] == pytest.approx(audit["input_tokens"] / 1e6)
    explained = invoke("explain", *args, chat)
    assert explained.exit_code == 0, explained.output
    assert f"my-llama: {expected.input_tokens:,} of 1,904 tokens" in explained.stdout
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}", "--session", "s1", *args]
    assert invoke("session", "add", *db, chat).exit_code == 0
    built = invoke("session", "build", *db, "--report", str(report))
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout) == expected.to_openai()
    assert json.loads(report.read_text())["budget"] == 6_000 - 4096


@pytest.mark.parametrize("command", [["build"], ["explain"], ["session", "build"]])
def test_a_bad_registry_file_is_one_line_and_exit_2(tmp_path: Path, command: list[str]) -> None:
    from test_registry import MY_LLAMA

    chat = write(tmp_path, PLAIN)
    bad = tmp_path / "models.toml"
    bad.write_text(MY_LLAMA.replace("context_window = 6_000", 'context_window = "big"'))
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}", "--session", "s1"]
    where = [*db] if command[0] == "session" else [chat]
    for path, needle in [
        (bad, f"{bad}: model 'my-llama', field 'context_window'"),
        (tmp_path / "missing.toml", "cannot read model registry file"),
    ]:
        result = invoke(*command, "--registry", str(path), *where)
        assert result.exit_code == 2, result.output
        assert needle in result.stderr and result.stderr.count("\n") == 1


def test_session_summarize_then_build_with_the_summary_view(tmp_path: Path) -> None:
    """`session summarize` folds by the policy's trigger and stores summary and facts;
    `session build --summarizer offline` shows them; a bad spec is a one-line error."""
    chat = write(tmp_path, _long_shop_chat())
    policy = tmp_path / "policy.toml"
    policy.write_text("[summary]\nmax_messages = 30\nkeep_recent = 10\nsummary_share = 0.3\n")
    db = ["--db", f"sqlite:///{tmp_path / 's.db'}", "--session", "s1"]
    assert invoke("session", "add", *db, chat).exit_code == 0
    assert "summary version 0, covers no message yet" in invoke("session", "show", *db).stdout
    folded = invoke("session", "summarize", *db, "--policy", str(policy))
    assert folded.exit_code == 0, folded.output
    assert folded.stdout.startswith("folded ") and "summary version" in folded.stdout
    again = invoke("session", "summarize", *db, "--policy", str(policy))
    assert again.exit_code == 0 and "nothing folded" in again.stdout
    shown = invoke("session", "show", *db)
    assert "1500" in shown.stdout  # the budget is a stored fact
    assert re.search(r"summary version 1, covers messages 0-\d+\n", shown.stdout)
    built = invoke(
        "session", "build", *db, "-m", "gpt-4o", "-b", "1200",
        "--policy", str(policy), "--summarizer", "offline",
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    sent = json.loads(built.stdout)
    assert any("1500" in str(m["content"]) for m in sent if m["role"] == "system")
    bad = invoke("session", "summarize", *db, "--summarizer", "nope:model")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "error:" in bad.stderr


def test_help_reads_as_written() -> None:
    """Help texts are Markdown: a docstring's hard-wrapped lines reflow into one line
    where the terminal has room, and text in brackets (TOML tables, pip extras) shows
    as typed, neither eaten as markup nor shown escaped."""
    runner = CliRunner()
    root = runner.invoke(app, ["--help"], env={"COLUMNS": "240"}).output
    assert "a JSON list of OpenAI chat messages, or an object with 'messages' and optional" in root
    bench = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "240"}).output
    assert '"./benchmarks[peers]"' in bench
    models = runner.invoke(app, ["models", "--help"], env={"COLUMNS": "240"}).output
    assert '[models."my-llama"]' in models and '\\[models."my-llama"]' not in models
    summarize = runner.invoke(app, ["session", "summarize", "--help"], env={"COLUMNS": "240"})
    assert "(its [summary] trigger)" in summarize.output
