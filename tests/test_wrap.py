"""``ctxwarden wrap``: an agent (a script calling both base URLs with the real ``openai``
and ``anthropic`` SDKs) run behind a local proxy in one command, on a fresh data dir with
nothing configured but the upstream keys (the upstreams here are scripted servers, named
through wrap's environment variables). And ``serve``/``wrap`` name the routes that have
no upstream key."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from agent_history import file_text
from llm_servers import (
    Recorded,
    Reply,
    ScriptedServer,
    anthropic_message,
    gemini_response,
    openai_completion,
)
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from service_harness import CLI, free_port

from ctxwarden.core.errors import ConfigError
from ctxwarden.local.agent_env import AgentEnv, export_lines, upstream_key, upstream_url
from ctxwarden.service.config import ServiceConfig, unkeyed_warnings

TESTS = Path(__file__).resolve().parent
OPENAI_KEY = "sk-test-openai-5b7d1c"
ANTHROPIC_KEY = "sk-test-anthropic-93ae0f"
GEMINI_KEY = "sk-test-gemini-41c2aa"

AGENT = f"""
import os, sys
sys.path.insert(0, {str(TESTS)!r})
import anthropic, openai
from agent_history import coding_history
from google import genai

key = os.environ["OPENAI_API_KEY"]
assert key.startswith("cwk_") and os.environ["ANTHROPIC_API_KEY"] == key, key
assert os.environ["GEMINI_API_KEY"] == key and "GOOGLE_API_KEY" not in os.environ
history = coding_history()
with openai.OpenAI(max_retries=0) as client:  # OPENAI_BASE_URL and OPENAI_API_KEY
    first = client.chat.completions.create(model="gpt-4o", messages=history)
    history += [{{"role": "assistant", "content": first.choices[0].message.content}},
                {{"role": "user", "content": "And the linter?"}}]
    client.chat.completions.create(model="gpt-4o", messages=history)
with anthropic.Anthropic(max_retries=0) as client:  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY
    reply = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, system="You review diffs.",
        messages=[{{"role": "user", "content": "Review the diff of parser.py"}}],
    )
google = genai.Client()  # GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY
gemini = google.models.generate_content(model="gemini-2.5-flash", contents="Summarise the plan")
print("openai:", first.choices[0].message.content, "anthropic:", reply.content[0].text,
      "gemini:", gemini.text)
sys.exit(int(sys.argv[1]))
"""


def _reply(request: Recorded) -> Reply:
    if request.path.endswith("/chat/completions"):
        return Reply(body=openai_completion("tests pass"))
    if request.path.endswith(":generateContent"):
        return Reply(body=gemini_response([{"text": "plan ok"}]))
    return Reply(body=anthropic_message("looks good", model="claude-sonnet-4-5"))


@pytest.fixture
def upstream() -> Iterator[ScriptedServer]:
    server = ScriptedServer(_reply).start()
    try:
        yield server
    finally:
        server.stop()


def _env(home: Path, upstream: ScriptedServer, **keys: str | None) -> dict[str, str]:
    """The user's environment: the upstream keys, and nothing of ctxwarden's but the data
    dir and the upstream URLs (instead of the providers')."""
    ours = ("CTXWARDEN_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env.update(CTXWARDEN_HOME=str(home), CTXWARDEN_UPSTREAM=upstream.url + "/v1",
               CTXWARDEN_ANTHROPIC_UPSTREAM=upstream.url,
               CTXWARDEN_GEMINI_UPSTREAM=upstream.url)  # fmt: skip
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    given = {"OPENAI_API_KEY": OPENAI_KEY, "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
             "GEMINI_API_KEY": GEMINI_KEY, **keys}  # fmt: skip
    env.update({k: v for k, v in given.items() if v is not None})
    return env


def _wrap(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "wrap", *args], capture_output=True, text=True, timeout=240, env=env
    )


def _state(home: Path) -> dict[str, int]:
    [path] = home.glob("serve-*.json")
    data: dict[str, int] = json.loads(path.read_text())
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A data dir that does not exist yet; its servers are stopped after the test."""
    path = tmp_path / "data"
    try:
        yield path
    finally:
        if path.exists():
            subprocess.run([CLI, "wrap", "--stop", "--data-dir", str(path)], timeout=60)


async def _recall_over_stdio(env: dict[str, str], handle: str) -> str:
    params = StdioServerParameters(command=CLI, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        got = await client.call_tool("ctxwarden_recall", {"handle": handle})
        assert not got.is_error, got.content
        text: str = got.content[0].text  # type: ignore[union-attr]
        return text


def _table(stderr: str) -> dict[str, list[str]]:
    """The summary table's rows by first cell (session id, or ``total``)."""
    rows: dict[str, list[str]] = {}
    lines = stderr.splitlines()
    start = lines.index("ctxwarden: this run through the proxy")
    for line in lines[start + 2 :]:
        cells = line.split()
        if len(cells) != 6 or not cells[1].isdigit():
            break
        rows[cells[0]] = cells[1:]
    return rows


def test_wrap_runs_an_agent_and_a_second_run_reuses_the_tenant(
    home: Path, upstream: ScriptedServer, tmp_path: Path
) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT, encoding="utf-8")
    env = _env(home, upstream)

    done = _wrap(env, "--", sys.executable, str(agent), "7")
    assert done.returncode == 7, done.stderr  # the agent's exit code
    assert "openai: tests pass anthropic: looks good gemini: plan ok" in done.stdout
    assert "proxy started at http://127.0.0.1:" in done.stderr
    assert "no upstream key" not in done.stderr

    # every call went through the proxy with the user's own keys, never the tenant key
    sent = upstream.requests
    assert [r.path for r in sent] == ["/v1/chat/completions"] * 2 + [
        "/v1/messages", "/v1/models/gemini-2.5-flash:generateContent"]  # fmt: skip
    assert {r.headers.get("authorization") for r in sent[:2]} == {f"Bearer {OPENAI_KEY}"}
    assert sent[2].headers.get("x-api-key") == ANTHROPIC_KEY
    assert sent[3].headers.get("x-goog-api-key") == GEMINI_KEY
    assert "cwk_" not in json.dumps([r.headers for r in sent])
    assert "[tool result masked" in json.dumps(sent[0].json["messages"])  # built, not passed

    # the table: three sessions (the coding agent's two calls, the review, the Gemini
    # call), a total, saved
    rows = _table(done.stderr)
    assert rows.pop("total")[0] == "4"
    assert sorted(r[0] for r in rows.values()) == ["1", "1", "2"]
    coding = next(r for r in rows.values() if r[0] == "2")
    sent_tokens, history = (int(v.replace(",", "")) for v in coding[1:3])
    assert 0 < sent_tokens < history and coding[3].endswith("%") and coding[4].startswith("$")
    assert float(coding[4].lstrip("$")) > 0
    pages = re.findall(r"page: (http://127\.0\.0\.1:\d+/ui/sessions/\S+)", done.stderr)
    assert len(pages) == 3

    # the page is real: signed in with the local key, it shows the session
    key = (home / "local-key").read_text().strip()
    assert stat.S_IMODE((home / "local-key").stat().st_mode) == 0o600
    base = pages[0].split("/ui/")[0]
    with httpx2.Client(base_url=base, timeout=30) as web:
        web.post("/ui/login", data={"key": key})
        page = web.get(pages[0])
        assert page.status_code == 200 and pages[0].rsplit("/", 1)[1] in page.text

    # the upstream keys were never written to the data dir (store, logs, state)
    for path in home.iterdir():
        data = path.read_bytes()
        for secret in (OPENAI_KEY, ANTHROPIC_KEY, GEMINI_KEY):
            assert secret.encode() not in data, path

    # the MCP server an agent starts (claude mcp add ctxwarden -- ctxwarden mcp) reads
    # wrap's store and tenant with no option, and gives the masked result back whole
    assert anyio.run(_recall_over_stdio, env, "cw:msg:m3") == file_text(0)

    # a second run: the same server, the same tenant and key, the agent's exit code 0
    first_state = _state(home)
    again = _wrap(env, "--", sys.executable, str(agent), "0")
    assert again.returncode == 0, again.stderr
    assert f"proxy reused at http://127.0.0.1:{first_state['port']}" in again.stderr
    assert _state(home) == first_state
    assert (home / "local-key").read_text().strip() == key
    tenants = subprocess.run(
        [CLI, "tenant", "list", "--db", f"sqlite:///{home / 'ctxwarden.db'}"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert [line.split("\t")[:2] for line in tenants.stdout.splitlines()] == [
        ["local", key[:12] + "…"]
    ]
    assert _table(again.stderr)["total"][0] == "4"  # this run's calls only

    # --print-env: the same proxy, the lines a shell evaluates
    printed = _wrap(env, "--print-env")
    assert printed.returncode == 0, printed.stderr
    assert f"export OPENAI_BASE_URL=http://127.0.0.1:{first_state['port']}/v1" in printed.stdout
    assert f"export ANTHROPIC_API_KEY={key}" in printed.stdout
    assert f"export GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:{first_state['port']}" in (
        printed.stdout
    )
    assert f"export GEMINI_API_KEY={key}" in printed.stdout

    # --stop ends the background server
    stopped = _wrap(env, "--stop")
    assert stopped.returncode == 0 and _alive(first_state["pid"]) is False
    assert not list(home.glob("serve-*.json"))


def test_wrap_names_the_route_without_a_key_and_passes_exit_codes(
    home: Path, upstream: ScriptedServer
) -> None:
    env = _env(home, upstream, ANTHROPIC_API_KEY=None)
    done = _wrap(env, "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    assert "no upstream key for the anthropic route (ANTHROPIC_API_KEY is not set)" in done.stderr
    assert "openai route" not in done.stderr
    assert "no model call went through the proxy" in done.stderr
    missing = _wrap(env, "--", "no-such-agent-5e1f")
    assert missing.returncode == 127 and "command not found: no-such-agent-5e1f" in missing.stderr
    nothing = _wrap(env)
    assert nothing.returncode == 2 and "give the agent's command after --" in nothing.stderr
    typo = _wrap(env, "--prnt-env")
    assert typo.returncode == 2 and "unknown option '--prnt-env'" in typo.stderr
    bad = _wrap(env, "--session", "no spaces", "--print-env")
    assert bad.returncode == 2 and "a session id must be" in bad.stderr
    port = free_port()  # a fixed port (Codex's config.toml names it): another server
    fixed = _wrap(env, "--print-env", "--port", str(port))
    assert f"export OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in fixed.stdout, fixed.stderr
    assert len(list(home.glob("serve-*.json"))) == 2


def test_serve_names_the_routes_without_a_key(tmp_path: Path, upstream: ScriptedServer) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXWARDEN_")}
    env["CTXWARDEN_UPSTREAM_API_KEY"] = "sk-up"
    port = free_port()
    args = [CLI, "serve", "--db", f"sqlite:///{tmp_path / 's.db'}", "--port", str(port),
            "--upstream", upstream.url + "/v1", "--anthropic-upstream", upstream.url]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(2)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()
    assert lines[0].startswith(f"ctxwarden serving on http://127.0.0.1:{port}")
    assert lines[1].startswith(
        "warning: no upstream key for the anthropic route (CTXWARDEN_ANTHROPIC_API_KEY is not set)"
    )


def test_unkeyed_warnings_name_each_route() -> None:
    both = ServiceConfig("sqlite:///x.db", upstream="http://u/v1", anthropic_upstream="http://a",
                         gemini_upstream="http://g")  # fmt: skip
    assert both.unkeyed_routes == ("openai", "anthropic", "gemini")
    gemini_line = unkeyed_warnings(both)[-1]
    assert gemini_line.startswith(
        "warning: no upstream key for the gemini route (CTXWARDEN_GEMINI_API_KEY is not set)"
    )
    assert gemini_line.endswith("unless the tenant has its own (tenant add --gemini-key)")
    keyed = ServiceConfig("sqlite:///x.db", upstream="http://u/v1", upstream_api_key="k")
    assert unkeyed_warnings(keyed) == []
    [line] = unkeyed_warnings(
        ServiceConfig("sqlite:///x.db", upstream="http://u/v1"), tenant_keys=False
    )
    assert "openai route (CTXWARDEN_UPSTREAM_API_KEY is not set)" in line


def test_the_agents_environment() -> None:
    """Each client's own variables point at the proxy with the tenant key; a key or URL
    that is already this proxy's is not taken as the upstream's."""
    agent = AgentEnv("http://127.0.0.1:9", "cwk_x", AgentEnv.run_id("wrap-1"), True)
    user = {"ANTHROPIC_AUTH_TOKEN": "oauth", "GOOGLE_API_KEY": "AIza-real", "PATH": "/bin"}
    env = agent.apply(user)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == "cwk_x"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-Ctxwarden-Session: wrap-1"
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9"
    assert env["GEMINI_API_KEY"] == "cwk_x" and "GOOGLE_API_KEY" not in env
    assert "ANTHROPIC_AUTH_TOKEN" not in env and env["PATH"] == "/bin"
    plain = AgentEnv("u", "k", AgentEnv.run_id())
    assert "ANTHROPIC_CUSTOM_HEADERS" not in plain.variables()
    assert re.fullmatch(r"wrap-[0-9a-f]{12}", plain.session)
    assert export_lines({"A": "x y"}) == ["export A='x y'"]
    assert upstream_key({"OPENAI_API_KEY": "cwk_x"}, "openai") is None
    assert upstream_key({"OPENAI_API_KEY": "sk-1"}, "openai") == "sk-1"
    assert upstream_key({"CTXWARDEN_ANTHROPIC_API_KEY": "a", "ANTHROPIC_API_KEY": "b"},
                        "anthropic") == "a"  # fmt: skip
    own = ("http://127.0.0.1:9",)
    assert upstream_url({"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, "openai", own) == (
        "https://api.openai.com/v1"
    )
    assert upstream_url({"OPENAI_BASE_URL": "https://openrouter.ai/api/v1/"}, "openai") == (
        "https://openrouter.ai/api/v1"
    )
    assert upstream_url({}, "anthropic") == "https://api.anthropic.com"
    assert upstream_url({}, "gemini") == "https://generativelanguage.googleapis.com"
    assert upstream_key({"GOOGLE_API_KEY": "g", "GEMINI_API_KEY": "m"}, "gemini") == "m"


def test_a_lost_key_file_rekeys_the_local_tenant(tmp_path: Path) -> None:
    from ctxwarden.local.tenant import local_tenant_key
    from ctxwarden.service.keys import hash_key
    from ctxwarden.store import open_store
    from ctxwarden.store.service_tables import tenant_by_key_hash

    db, keys = f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "local-key"
    first, made = local_tenant_key(db, keys)
    assert made and local_tenant_key(db, keys) == (first, False)
    keys.unlink()
    with pytest.raises(ConfigError, match="has a key wrap does not hold"):
        local_tenant_key(db, keys, own_store=False)  # a store of the user's: not revoked
    with open_store(db) as store:
        assert tenant_by_key_hash(store, hash_key(first)) is not None
    second, made = local_tenant_key(db, keys)
    assert made and second != first and keys.read_text().strip() == second


def test_stop_leaves_a_process_that_took_a_stale_pid(tmp_path: Path) -> None:
    """A state file whose pid now belongs to another process: --stop removes the file and
    leaves the process alone."""
    from ctxwarden.local.home import Home
    from ctxwarden.local.server import stop_servers

    home = Home.at(tmp_path / "data")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = {"pid": other.pid, "port": free_port(), "db": home.db, "started_at": 0.0}
        home.state_file("0123456789abcdef").write_text(json.dumps(state))
        assert stop_servers(home) == []
        assert other.poll() is None and not list(home.path.glob("serve-*.json"))
    finally:
        other.kill()
        other.wait(timeout=10)


def test_a_new_key_or_policy_means_another_server() -> None:
    """The configuration's id changes with an upstream key or the policy's content (the
    running server holds the old ones), and says nothing of the key."""
    from ctxwarden.local.server import ServeConfig

    base = ServeConfig("sqlite:///x.db", "http://u/v1", "http://a", openai_key="sk-1")
    ids = {
        c.config_id("cwk_secret")
        for c in (
            base,
            ServeConfig("sqlite:///x.db", "http://u/v1", "http://a", openai_key="sk-2"),
            ServeConfig("sqlite:///x.db", "http://u/v1", "http://a", openai_key="sk-1",
                        policy="/p.toml", policy_sha256="1"),
            ServeConfig("sqlite:///x.db", "http://u/v1", "http://a", openai_key="sk-1",
                        policy="/p.toml", policy_sha256="2"),
        )
    }  # fmt: skip
    assert len(ids) == 4 and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)
    assert base.config_id("cwk_secret") == base.config_id("cwk_secret")
    assert "sk-1" not in " ".join(base.args(8400))
