"""Truncated results list the values they cut, and the ledger waits until they leave."""

from __future__ import annotations

import json

from ctxwarden import Policy, build_context
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.cutters.values import CUT_VALUES_KEY, with_cut_values
from ctxwarden.steps.base import Edit, StrategyContext
from ctxwarden.steps.mask import MaskObservations
from ctxwarden.steps.truncate import TruncateToolResults, lists_cut_values

COUNTER = TokenCounter.for_model("gpt-4o")


def _search_result(n: int = 40) -> Message:
    items = [
        {"order_id": f"ORD-{10_000 + i}", "customer": f"user_{i}@example.com", "status": "ok"}
        for i in range(n)
    ]
    return Message.tool(json.dumps({"results": items}), "c1", name="search", id="t1")


def test_a_truncated_json_result_stays_json_and_names_what_it_cut() -> None:
    original = _search_result()
    cut = TruncateToolResults(threshold_tokens=200, target_tokens=150).truncate(
        original, COUNTER.count_message
    )
    assert cut is not original and cut.meta["values_listed"] > 0
    doc = json.loads(cut.text)  # still valid JSON
    listed = doc[CUT_VALUES_KEY]
    assert "ORD-10020" in listed  # from the cut tail of the array
    assert "ORD-10020" not in json.dumps(doc["results"])
    # ids and e-mails (tier 3) before the plain status; the note says how many did not fit
    assert listed.endswith("more") and ", ok" not in listed


def test_the_note_respects_its_token_cap_and_zero_turns_it_off() -> None:
    original = _search_result(200)
    head = json.dumps({"results": json.loads(original.text)["results"][:3]})
    text, listed = with_cut_values(original, head, max_tokens=40, count=COUNTER.count_text)
    assert 0 < listed < 400 and "more" in text
    assert COUNTER.count_text(text) - COUNTER.count_text(head) <= 40
    assert with_cut_values(original, head, max_tokens=0, count=COUNTER.count_text) == (head, 0)
    plain = TruncateToolResults(threshold_tokens=200, target_tokens=150, cut_values_tokens=0)
    assert "values_listed" not in plain.truncate(original, COUNTER.count_message).meta


def test_plain_text_gets_the_note_on_a_line_of_its_own() -> None:
    original = Message.tool("Booked: " + ", ".join(f"PNR{i:04d}Z" for i in range(300)), "c", id="t")
    text, listed = with_cut_values(
        original, original.text[:60], max_tokens=60, count=COUNTER.count_text
    )
    assert listed and text.startswith(original.text[:60]) and "\n[values in the cut part:" in text


def _session_with_a_big_result() -> list[Message]:
    msgs = [Message.system("You are a shop agent.", id="sys"), Message.user("Find orders", id="u0")]
    msgs.append(Message.assistant(None, (ToolCall("c1", "search", "{}"),), id="a0"))
    msgs.append(_search_result())
    # answered: the size threshold applies (a result not answered yet is kept whole)
    msgs.append(Message.assistant("I found 40 orders.", id="a0r"))
    msgs.append(Message.user("Thanks, and the refund policy?", id="u1"))
    return msgs


def test_a_listed_truncation_leaves_the_ledger_alone_until_the_result_is_masked() -> None:
    history = _session_with_a_big_result()
    built = build_context(history, "gpt-4o", 3000)
    assert built.audit.by_action("truncated")
    assert "ctxwarden:ledger" not in built.layers  # nothing left the context yet
    assert "ORD-10020" in "\n".join(m.text for m in built.messages)  # in the note
    # three more results push it past the masking window: now the ledger has its values
    for k in range(2, 6):
        history.append(Message.assistant(None, (ToolCall(f"c{k}", "get", "{}"),), id=f"a{k}"))
        history.append(Message.tool("Nothing new here. " * 30, f"c{k}", name="get", id=f"t{k}"))
    history.append(Message.user("And now?", id="u9"))
    policy = Policy(mask=MaskObservations(batch_tokens=100))
    later = build_context(history, "gpt-4o", 3000, previous=built, policy=policy)
    masked = {a.message_id for a in later.audit.by_action("masked")}
    assert "t1" in masked
    ledger = next(m for m in later.messages if m.id == "ctxwarden:ledger")
    assert "ORD-10039" in ledger.text and "ORD-10000" in ledger.text


def test_the_note_lists_the_most_values_that_fit() -> None:
    """The guess-and-step search gives what trying every length would give."""
    from ctxwarden.cutters.values import _lost, _note

    cases = [(n, cap, "") for n, cap in ((40, 30), (200, 60), (200, 120), (300, 17), (25, 400))]
    cases += [(200, 90, "界" * 300), (200, 90, " " * 900)]  # text unlike the note: a poor guess
    for n, cap, filler in cases:
        original = _search_result(n)
        head = json.dumps({"results": json.loads(original.text)["results"][:2]}) + filler
        _, listed = with_cut_values(original, head, max_tokens=cap, count=COUNTER.count_text)
        values = [e.value for e in _lost(original, head)]
        fitting = [
            k
            for k in range(1, len(values) + 1)
            if COUNTER.count_text(_note(values[:k], len(values) - k)) + 8 <= cap
        ]
        assert listed == (max(fitting) if fitting else 0), (n, cap)


def test_the_truncation_marks_what_it_listed_as_a_typed_edit() -> None:
    """The marker the ledger reads (``Edit.listed``) comes from the truncation itself, in
    ``StrategyResult.edits``: no later step reads its meta keys."""
    history = _session_with_a_big_result()
    ctx = StrategyContext(count=COUNTER.count_message, budget=3000, total=COUNTER.total)
    result = TruncateToolResults()(history, ctx)
    assert [a.message_id for a in result.actions] == ["t1"]
    assert result.edits == {"t1": Edit("truncated", listed=True)}
    quiet = TruncateToolResults(cut_values_tokens=0)(history, ctx)
    assert [a.message_id for a in quiet.actions] == ["t1"] and quiet.edits == {}
    cut = next(m for m in result.messages if m.id == "t1")
    assert lists_cut_values(cut)
    assert not lists_cut_values(cut.with_content("[masked]", masked_from=900))


def test_a_text_cut_again_lists_the_same_values_from_one_extraction(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The newest call's own text is cut again at every try (and a result once more when
    answered): its values are read once, and listed as a first read lists them."""
    import ctxwarden.memory.entities as entities

    prose = "Checking the fix. " + " ".join(
        f"Look at src/pkg/mod_{i}.py:{100 + i} and REF{i:04d}X." for i in range(60)
    )
    heads = [prose[:n] for n in (900, 600, 300)]

    def notes(message_id: str) -> list[tuple[str, int]]:
        original = Message.assistant(prose, id=message_id)
        return [
            with_cut_values(original, h, max_tokens=80, count=COUNTER.count_text) for h in heads
        ]

    first_reads = [notes(f"a-prose-{k}")[k] for k in range(3)]  # each cut a first read
    reads: list[str] = []
    read = entities._text_values

    def counted(text: str) -> dict[str, str]:
        reads.append(text)
        return read(text)

    monkeypatch.setattr(entities, "_text_values", counted)
    again = notes("a-prose-once")
    assert reads == [prose]  # one read of the text for the three cuts
    assert again == first_reads and all(listed for _, listed in again)


def test_a_harness_tag_around_a_code_result_is_not_listed_as_a_cut_name() -> None:
    """A coding agent's harness wraps a command's output in tags (``<output_head>``,
    ``</warning>``): the note lists the names of the cut code, never the wrapping, which
    had taken its first places (the dev runs @4,000: 53 of 2,042 listed values)."""
    code = "\n".join(f"    value_{i} = record.field_{i} or defaults.FIELD_{i}" for i in range(60))
    text = (
        "<returncode>0</returncode>\n<warning>\nThe output was too long.\n</warning>"
        f"<output_head>\nclass Record:\n{code}\n</output_head>\n<elided_chars>\n120 "
        "characters elided\n</elided_chars>\n<output_tail>\nimport os.path\n</output_tail>"
    )
    original = Message.tool(text, "c1", id="t1")
    assert original.kind == "code"
    head = "<returncode>0</returncode>"
    note, listed = with_cut_values(original, head, max_tokens=60, count=COUNTER.count_text)
    values = note.split("[values in the cut part: ", 1)[1].rstrip("]").split(", ")
    assert listed >= 5 and values[:2] == ["os.path", "value_0"], values
    assert "value_0" in values
    tags = {"output_head", "/output_head", "/warning", "elided_chars", "/elided_chars"}
    assert tags.isdisjoint(values), values
