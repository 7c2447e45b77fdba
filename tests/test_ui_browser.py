"""The session pages in a real headless Chromium (Debian's ``chromium``; playwright drives
it, no browser download): sign in, open a session built turn by turn from a recorded
tau-bench trace, select a turn, and check the chart against the stored audit, the values
that left the context, tenant isolation and that nothing is fetched from anywhere else.
The same page written by ``ctxwarden session show --html`` is checked as a file."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from service_harness import ProxyServer, add_tenant, cli, db_url

from ctxwarden import Session
from ctxwarden.memory.entities import extract_entities
from ctxwarden.store.service_tables import BuildRecord, list_builds, logged_context
from ctxwarden_bench.traces import load_tau_bench

__all__ = ["db_url"]

CHROMIUM = Path(shutil.which("chromium") or "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(  # CI installs it (.ci/run): there a missing one fails
    not CHROMIUM.exists() and not os.environ.get("CI"),
    reason="needs Debian's chromium (apt-get install chromium)",
)
BUDGET = 1600


def fill_from_trace(url: str, tenant: str, session_id: str, trace: Path) -> None:
    """A tau-bench run replayed as an agent would: the messages up to each assistant turn
    appended, then a build (the context that turn's model call would get)."""
    runs = load_tau_bench(trace)
    run = max(runs[:30], key=len)
    with Session(url, session_id, tenant=tenant) as s:
        done = 0
        for i, m in enumerate(run):
            if m.role == "assistant" and i > 1:
                s.append(run[done:i])
                done = i
                s.build(max_input_tokens=BUDGET)
        s.append(run[done:])


def lost_value(url: str, tenant: str, session_id: str) -> tuple[BuildRecord, str]:
    """A turn before the newest and a value one of its newly dropped messages carried that
    its built context holds nowhere, found from the store alone."""
    with Session(url, session_id, tenant=tenant) as s:
        builds = list_builds(s.store, tenant, session_id, limit=1000)
        for prev, b in pairwise(builds[:-1]):  # not the newest: the page shows that one
            rows = logged_context(s.store, tenant, session_id, b.build_id)
            if rows is None:
                continue
            sent = json.dumps(rows, ensure_ascii=False)
            before = {(a["action"], a["message_id"]) for a in prev.audit["actions"]}
            for a in b.audit["actions"]:
                if a["action"] != "dropped" or (a["action"], a["message_id"]) in before:
                    continue
                seq = int(a["message_id"][1:])
                [original] = s.store.range(tenant, session_id, seq, seq + 1)
                for e in extract_entities(original.message):
                    if len(e.value) >= 4 and e.value not in sent:
                        return b, e.value
    raise AssertionError("the trace at this budget drops no value at any turn")


class Requests:
    """Every request the browser makes; any not to ``allowed`` is aborted and kept."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.seen: list[str] = []

    def handle(self, route: Any) -> None:
        url = route.request.url
        self.seen.append(url)
        parts = urlsplit(url)
        local = parts.scheme in ("file", "data", "about") or parts.hostname in self.allowed
        route.continue_() if local else route.abort()

    def outside(self) -> list[str]:
        out = []
        for url in self.seen:
            parts = urlsplit(url)
            if parts.scheme not in ("file", "data", "about") and parts.hostname not in self.allowed:
                out.append(url)
        return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking"],
        )
        try:
            yield b
        finally:
            b.close()


@dataclass
class Served:
    proxy: ProxyServer
    key: str
    tenant: str
    session_id: str
    other_session: str
    url: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tau_bench_path: Path) -> Iterator[Served]:
    url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'ui.db'}"
    tenant, other = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    key = add_tenant(url, tenant)
    add_tenant(url, other)
    fill_from_trace(url, tenant, "airline-run", tau_bench_path)
    with Session(url, "theirs", tenant=other) as s:
        s.append([{"role": "user", "content": "another tenant's secret ORD-9911"}])
        s.build(max_input_tokens=500)
    proxy = ProxyServer(url, upstream="http://127.0.0.1:9/v1")  # never called
    try:
        yield Served(proxy, key, tenant, "airline-run", "theirs", url)
    finally:
        proxy.stop()


def signed_in(browser: Any, served: Served, **options: Any) -> tuple[Any, Any, Requests]:
    """A browser context signed in through the form, every request of it logged."""
    requests = Requests({"127.0.0.1"})
    context = browser.new_context(**options)
    context.route("**/*", requests.handle)
    page = context.new_page()
    page.goto(served.proxy.url + "/ui/")
    page.fill("#key", served.key)
    page.click("button[type=submit]")
    return context, page, requests


def _bar_segments(page: Any, turn: int) -> list[tuple[str, int, float]]:
    rows = page.eval_on_selector_all(
        f'a.bar[data-turn="{turn}"] rect.seg',
        "els => els.map(e => [e.dataset.layer, +e.dataset.tokens, +e.getAttribute('height')])",
    )
    return [(str(layer), int(tokens), float(h)) for layer, tokens, h in rows]


def _nonzero(layers: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in layers.items() if v}


def test_sign_in_select_a_turn_and_read_what_was_dropped(
    browser: Any, served: Served, tmp_path: Path
) -> None:
    turn_build, value = lost_value(served.url, served.tenant, served.session_id)
    with Session(served.url, served.session_id, tenant=served.tenant) as s:
        builds = list_builds(s.store, served.tenant, served.session_id, limit=1000)
    context, page, requests = signed_in(browser, served, viewport={"width": 1280, "height": 900})
    try:
        page.wait_for_selector("table.list")
        cookie = next(c for c in context.cookies() if c["name"] == "ctxwarden_ui")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert served.key not in cookie["value"]
        assert served.other_session not in page.inner_text("table.list")  # another tenant's

        page.click(f'a[href$="/sessions/{served.session_id}"]')
        page.wait_for_selector("#chart svg")
        assert page.locator("a.bar").count() == len(builds)
        assert f"Turn {builds[-1].turn} " in page.inner_text("#turn h2")  # the newest first

        # select the turn with the script (no reload), as a person would: click its bar
        page.locator(f'a.bar[data-turn="{turn_build.turn}"] rect.hit').click()
        page.wait_for_selector(f'#turn[data-turn="{turn_build.turn}"]')
        assert f"?turn={turn_build.turn}" in page.url
        panel = page.inner_text("#turn")
        assert f"Turn {turn_build.turn}" in panel

        # the chart's layers at that turn are the stored audit's, drawn to one scale
        segments = _bar_segments(page, turn_build.turn)
        assert {layer: tokens for layer, tokens, _ in segments} == _nonzero(
            turn_build.audit["layers"]
        )
        ratios = {round(h / tokens, 6) for _, tokens, h in segments}
        assert max(ratios) - min(ratios) < 1e-3
        shown = page.eval_on_selector_all(
            "#turn table.layers td[data-layer]",
            "els => els.map(e => [e.dataset.layer, e.textContent.replace(/,/g, '')])",
        )
        assert {k: int(v) for k, v in shown} == dict(turn_build.audit["layers"])
        totals: dict[str, int] = {}
        every = page.eval_on_selector_all(
            "a.bar rect.seg", "els => els.map(e => [e.dataset.layer, +e.dataset.tokens])"
        )
        for layer, tokens in every:
            totals[layer] = totals.get(layer, 0) + int(tokens)
        stored: dict[str, int] = {}
        for b in builds:
            for layer, tokens in b.audit["layers"].items():
                if tokens:
                    stored[layer] = stored.get(layer, 0) + tokens
        assert totals == stored

        # a value a message dropped at this turn carried, gone from the context, is listed
        assert value in page.inner_text("#turn ul.lost")

        # another tenant's session is a 404, like one that does not exist
        assert page.goto(f"{served.proxy.url}/ui/sessions/{served.other_session}").status == 404
        assert page.goto(f"{served.proxy.url}/ui/sessions/no-such").status == 404
        page.goto(f"{served.proxy.url}/ui/sessions/{served.session_id}?turn={turn_build.turn}")
        shot = tmp_path / "ui-session.png"
        page.set_viewport_size({"width": 1280, "height": 1150})
        page.screenshot(path=str(shot))
        if os.environ.get("CTXWARDEN_UI_SCREENSHOT"):
            shutil.copy(shot, os.environ["CTXWARDEN_UI_SCREENSHOT"])
    finally:
        context.close()
    assert requests.seen and requests.outside() == []
    assert not any(served.key in url for url in requests.seen)  # never in an address


def test_the_pages_read_and_select_turns_without_javascript(browser: Any, served: Served) -> None:
    context, page, requests = signed_in(browser, served, java_script_enabled=False)
    try:
        page.goto(f"{served.proxy.url}/ui/sessions/{served.session_id}")
        bars = page.locator("a.bar")
        assert bars.count() > 3
        page.locator('a.bar[data-turn="3"] rect.hit').click()  # a plain link: the page reloads
        page.wait_for_url("**?turn=3")
        assert "Turn 3" in page.inner_text("#turn h2")
        page.click("form.signout button")
        page.goto(f"{served.proxy.url}/ui/sessions/{served.session_id}")
        assert page.locator("#key").count() == 1  # signed out: back to the form
    finally:
        context.close()
    assert requests.outside() == []


def test_a_wrong_or_revoked_key_does_not_sign_in(browser: Any, served: Served) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(served.proxy.url + "/ui/")
        page.fill("#key", "cwk_" + "x" * 43)
        page.click("button[type=submit]")
        assert "unknown or revoked" in page.inner_text(".error")
        assert not [c for c in context.cookies() if c["name"] == "ctxwarden_ui"]
        context.add_cookies(
            [{"name": "ctxwarden_ui", "value": "0" * 64, "url": served.proxy.url + "/ui/"}]
        )
        page.goto(f"{served.proxy.url}/ui/sessions/{served.session_id}")
        assert page.locator("#key").count() == 1
    finally:
        context.close()
    name = f"brief-{uuid.uuid4().hex[:6]}"
    key = add_tenant(served.url, name)
    context, page, _ = signed_in(browser, replace(served, key=key))
    try:
        assert "Sessions" in page.inner_text("h1")
        assert cli("tenant", "revoke", name, "--db", served.url).returncode == 0
        page.reload()
        assert page.locator("#key").count() == 1  # revoked: signed out at once
    finally:
        context.close()


def test_session_show_html_writes_one_offline_file(
    browser: Any, db_url: str, tmp_path: Path, tau_bench_path: Path
) -> None:
    fill_from_trace(db_url, "default", "airline-run", tau_bench_path)
    out = tmp_path / "report.html"
    done = cli("session", "show", "--db", db_url, "--session", "airline-run", "--html", str(out))
    assert done.returncode == 0, done.stderr
    with Session(db_url, "airline-run") as s:
        builds = list_builds(s.store, "default", "airline-run", limit=1000)
    pick = builds[len(builds) // 2]
    requests = Requests(set())
    context = browser.new_context()
    context.route("**/*", requests.handle)
    page = context.new_page()
    try:
        page.goto(out.as_uri())
        assert page.locator(f"#turn-{builds[-1].turn}").is_visible()  # the newest by default
        page.locator(f'a.bar[data-turn="{pick.turn}"] rect.hit').click()
        assert page.locator(f"#turn-{pick.turn}").is_visible()
        assert not page.locator(f"#turn-{builds[-1].turn}").is_visible()
        segments = _bar_segments(page, pick.turn)
        assert {k: t for k, t, _ in segments} == _nonzero(pick.audit["layers"])
    finally:
        context.close()
    assert [u for u in requests.seen if not u.startswith("file:")] == []
