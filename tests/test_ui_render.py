"""The session page's content, rendered from a real store without a browser: facts with
their history, the summary, escaping of what messages say, and bad requests."""

from __future__ import annotations

from pathlib import Path

from service_harness import cli

from ctxwarden import Session
from ctxwarden.memory.facts import Facts
from ctxwarden.store.service_tables import BuildRecord, list_builds
from ctxwarden.ui import render_report, render_session, session_page
from ctxwarden.ui.view import layer_names

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(2)> ORD-4471'


def _session(path: Path) -> str:
    url = f"sqlite:///{path / 'ui.db'}"
    with Session(url, "s") as s:
        s.append([{"role": "system", "content": "You sell laptops."}])
        for i in range(14):
            text = HOSTILE if i == 1 else f"question {i} " + "word " * 60
            s.append([{"role": "user", "content": text}])
            s.build(max_input_tokens=300)
            s.append([{"role": "assistant", "content": f"answer {i}"}])
        record = s.record
        facts = Facts().merge({"budget": "$900"}, source="m3").merge({"budget": "$1,200"},
                                                                     source="m9")  # fmt: skip
        s.store.write_summary(
            "default",
            "s",
            expected_version=record.version,
            summary="The user wants a laptop <b>under</b> budget.",
            facts=facts.to_json(),
            covered_up_to_seq=5,
        )
    return url


def test_facts_show_their_history_by_turn_and_the_summary_its_coverage(tmp_path: Path) -> None:
    url = _session(tmp_path)
    with Session(url, "s") as s:
        builds = list_builds(s.store, "default", "s", limit=100)
        page = session_page(s.store, "default", s.record)
        html = render_session(page, root="/ui", tenant="default")
    [fact] = page.facts
    first_seeing = {seq: next(b.turn for b in builds if b.upto_seq >= seq) for seq in (3, 9)}
    assert fact.history == (("$900", "m3", first_seeing[3]), ("$1,200", "m9", first_seeing[9]))
    assert "$1,200" in html and "(replaced $900)" in html
    assert f"turn {first_seeing[9]}" in html
    assert "covers messages up to m5" in html
    assert "The user wants a laptop &lt;b&gt;under&lt;/b&gt; budget." in html


def test_what_messages_say_is_escaped_everywhere(tmp_path: Path) -> None:
    url = _session(tmp_path)
    with Session(url, "s") as s:
        record = s.record
        builds = list_builds(s.store, "default", "s", limit=100)
        served = render_session(session_page(s.store, "default", record, turn=2))
        report = render_report(s.store, "default", record)
    assert any("m2" in {a["message_id"] for a in b.audit["actions"]} for b in builds)
    for html in (served, report):
        assert "ORD-4471" in html  # the hostile message is shown...
        assert "<script>alert" not in html and "<img src=x" not in html  # ...as text
        assert "&lt;script&gt;alert" in html
        assert html.count("<script>") == (1 if html is served else 0)  # only our own script


def test_a_turn_not_in_the_log_says_so(tmp_path: Path) -> None:
    url = _session(tmp_path)
    with Session(url, "s") as s:
        page = session_page(s.store, "default", s.record, turn=999)
        html = render_session(page)
    assert page.missing_turn == 999 and page.turn is not None
    assert page.turn.build.turn == page.builds[-1].turn
    assert "Turn 999 is not in the log (it keeps turns 1–14)" in html


def test_layers_stack_in_their_order_unknown_ones_last() -> None:
    def row(turn: int, layers: dict[str, int]) -> BuildRecord:
        return BuildRecord(f"b{turn}", "s", 0.0, "gpt-4o", 0, 0, "built", {"layers": layers}, turn)

    builds = [row(1, {"window": 3, "zeta": 1, "system": 2, "facts": 0}), row(2, {"alpha": 4})]
    assert layer_names(builds) == ["system", "window", "alpha", "zeta"]  # empty ones left out


def test_session_show_html_of_a_missing_session_is_an_error(tmp_path: Path) -> None:
    url = _session(tmp_path)
    out = tmp_path / "r.html"
    done = cli("session", "show", "--db", url, "--session", "nope", "--html", str(out))
    assert done.returncode == 2 and "no session 'nope'" in done.stderr
    assert not out.exists()
    ok = cli("session", "show", "--db", url, "--session", "s", "--html", str(out))
    assert ok.returncode == 0, ok.stderr
    assert out.read_text("utf-8").startswith("<!doctype html>")
