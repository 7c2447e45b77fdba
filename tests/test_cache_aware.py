"""Cache-aware compaction (R21): prices from the registry, the append-only builds between
compactions on the library's and the session's path, the audit's prefix breaks, and the
dev traces' cost at Anthropic cache prices against the full history with caching."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from ctxwarden import build_context
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.registry import Registry, get_model
from ctxwarden.core.registry.cache_cost import (
    ANTHROPIC,
    OPENAI,
    CachePrices,
    CallPrefix,
    cautious_prices,
    rewrite_pays,
    session_cache_cost,
    tail_edit_pays,
)
from ctxwarden.memory.entity_ledger import DEFAULT_HEADER
from ctxwarden.pipeline.compaction import RECALL_MOVED, CacheConfig, recall_moved
from ctxwarden.pipeline.policy import Policy
from ctxwarden.session.session import Session
from ctxwarden.steps.base import Draft
from ctxwarden.steps.edit import TAIL_EDIT_ANSWERS
from ctxwarden.steps.ledger import LEDGER_ID, LEDGER_MORE_ID
from ctxwarden.steps.recall_relevant import RECALL_ID
from ctxwarden.steps.state import BuildState
from ctxwarden_bench.retention import engine_builder, sawtooth_builder

DATA = Path(os.environ.get("CTXWARDEN_DATA", Path(__file__).parents[2] / "shared" / "data"))
TAU = DATA / "tau-bench" / "airline-gpt-4o-dev.json"
SWEBENCH = DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"


# -- prices --------------------------------------------------------------------------------


def test_registry_cache_rules_and_prices_as_multipliers() -> None:
    sonnet = get_model("claude-sonnet-4-5")
    assert (sonnet.cache_min_tokens, sonnet.cache_breakpoints) == (1024, 4)
    prices = CachePrices.for_model(sonnet)
    assert (round(prices.read, 3), round(prices.write, 3), prices.min_tokens) == (0.1, 1.25, 1024)
    gpt = CachePrices.for_model(get_model("gpt-4o"))
    assert (gpt.read, gpt.write, get_model("gpt-4o").cache_breakpoints) == (0.5, 1.0, None)
    local = CachePrices.for_model(get_model("llama3.1:8b"))  # no prices: no cache discount
    assert (local.read, local.write, local.min_tokens) == (1.0, 1.0, 0)
    with pytest.raises(ConfigError, match=r"cache\.min_tokens"):
        Registry.builtin().with_overrides('[models."gpt-4o"]\ncache = { min_tokens = -1 }')
    with pytest.raises(ConfigError, match=r"cache\.ttl.*unknown"):
        Registry.builtin().with_overrides('[models."gpt-4o"]\ncache = { ttl = 5 }')


def test_a_call_pays_reads_for_its_shared_prefix_and_writes_for_the_rest() -> None:
    assert ANTHROPIC.call(1000, 800) == pytest.approx(0.1 * 800 + 1.25 * 200)
    assert OPENAI.call(1000, 800) == pytest.approx(0.1 * 800 + 200)
    short = CachePrices(0.1, 1.25, min_tokens=1024)
    assert short.call(1000, 800) == pytest.approx(1250)  # under the minimum: nothing cached
    calls = [CallPrefix(100, 0, False), CallPrefix(150, 100, True), CallPrefix(120, 50, False)]
    cost = session_cache_cost(calls, ANTHROPIC)
    assert cost.units == pytest.approx(125 + (10 + 62.5) + (5 + 87.5))
    assert (cost.whole_prefix_calls, cost.later_calls, cost.whole_prefix_share) == (1, 2, 0.5)


def test_a_rewrite_pays_when_the_tokens_it_frees_are_read_often_enough() -> None:
    # (1.25 - 0.1) * 1,000 = 1,150 against 0.1 * 500 * calls
    assert not rewrite_pays(2000, 1000, 500, 20, ANTHROPIC)
    assert rewrite_pays(2000, 1000, 500, 30, ANTHROPIC)
    assert rewrite_pays(100, 500, 10, 0, CachePrices(0.1, 1.25, 1024))  # never cached anyway


def test_a_tail_edit_pays_for_the_reads_and_the_room_it_frees_while_the_loop_goes_on() -> None:
    # 1.15 * 500 = 575 against 0.1 * 1,500 * 10 * ln(1.5) = 608 + 1.15 * 1,500 * 10 / 15
    assert tail_edit_pays(500, 1500, 5, 10, 0.5, ANTHROPIC)
    assert not tail_edit_pays(3000, 500, 5, 10, 0.5, ANTHROPIC)
    # a loop one call old is less likely to go on: the same cut pays less
    assert tail_edit_pays(1200, 1500, 5, 10, 0.5, ANTHROPIC)
    assert not tail_edit_pays(1200, 1500, 5, 1, 0.5, ANTHROPIC)
    assert not tail_edit_pays(10, 0, 5, 10, 0.5, ANTHROPIC)  # frees nothing


def test_cautious_prices_weigh_a_rewrite_at_the_dearer_write_premium() -> None:
    gpt = CachePrices.for_model(get_model("gpt-4o"))  # 0.5x / 1x: writing is cheap
    assert (cautious_prices(gpt).read, cautious_prices(gpt).write) == (0.1, 1.25)
    sonnet = CachePrices.for_model(get_model("claude-sonnet-4-5"))
    assert cautious_prices(sonnet) == sonnet
    assert cautious_prices(gpt).min_tokens == gpt.min_tokens
    cautious = CacheConfig()
    assert cautious.prices == "cautious"
    assert cautious.decision_prices(get_model("gpt-4o")).write == 1.25
    assert cautious.prices_for(get_model("gpt-4o")) == gpt  # the audit: the model's own
    assert CacheConfig(prices="model").decision_prices(get_model("gpt-4o")) == gpt


def coding_run(steps: int, lines: int = 120) -> list[Message]:
    """A coding agent: each step a command and a long output full of values."""
    out = [Message.system("You fix bugs. " * 20, id="s"), Message.user("Fix issue 1.")]
    for i in range(steps):
        call = ToolCall(f"c{i}", "bash", json.dumps({"command": f"grep -n x src/m{i}.py"}))
        out.append(Message.assistant(f"Looking at module {i}.", (call,), id=f"a{i}"))
        body = "\n".join(
            f"src/m{i}.py:{j}: v = f_{i}_{j}(ref=REF-{i:03d}-{j:04d})" for j in range(lines)
        )
        out.append(Message.tool(body, f"c{i}", id=f"t{i}"))
    return out


def test_a_result_sent_whole_is_cut_in_a_tail_edit_once_answered_twice() -> None:
    """Between compactions a long result sent whole (unanswered) is cut once the model
    has answered it and gone on: the rewrite starts at the cut, the context before it is
    served from the cache, the cut lists the values it removed, and the build stays held
    (no window move, the same ledger)."""
    run = coding_run(12)
    builds = loop(run, 8000)
    tails = 0
    for before, after in itertools.pairwise(builds):
        pb = after.audit.prefix_break
        if pb is None or "tail edit" not in pb.cause:
            continue
        tails += 1
        assert after.state.held_calls == before.state.held_calls + 1
        assert after.messages[: pb.at] == before.messages[: pb.at]
        cut = after.messages[pb.at]
        assert cut.role == "tool" and cut.meta.get("truncated_from")
        assert cut.meta.get("values_listed")
        answers = [m for m in after.messages[pb.at :] if m.role == "assistant"]
        assert len(answers) >= TAIL_EDIT_ANSWERS
        assert pb.rewritten_tokens < before.audit.input_tokens - pb.shared_tokens
        assert after.state.window_start == before.state.window_start
        assert after.state.ledger_sent == before.state.ledger_sent
    assert tails >= 2
    assert all(b.audit.input_tokens <= 8000 for b in builds)


def test_room_a_tail_edit_frees_is_weighed_at_the_lower_low_water_share() -> None:
    """A token of room saves what a compaction rewrites per token the context grows
    between compactions: the share of the room the last build that was not held left the
    context at, or the policy's refill ratio when that is lower. Early in a loop (the
    context left at its first, short build) room is worth little, and a cut that would
    rewrite more than it frees waits for the compaction."""
    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.steps.base import StepContext
    from ctxwarden.steps.edit import left_share

    def ctx(compacted: int) -> StepContext:
        state = BuildState(compacted_tokens=compacted)
        counter = TokenCounter.for_model("gpt-4o")
        return StepContext(counter=counter, budget=8114, policy=Policy(), previous=state, fixed=114)

    assert left_share(ctx(2114)) == 0.25 and left_share(ctx(6114)) == 0.75
    assert left_share(ctx(0)) == 0.0  # (no build yet)
    rewritten, freed, calls, so_far = 3000, 4000, 1.0, 3
    assert tail_edit_pays(rewritten, freed, calls, so_far, 0.5, ANTHROPIC)
    assert not tail_edit_pays(rewritten, freed, calls, so_far, 0.25, ANTHROPIC)


def test_an_early_compaction_that_keeps_the_previous_context_whole_rewrites_only_its_tail() -> None:
    """The rewrite an early compaction is weighed by starts where it first differs from
    the previous context; one that sends the previous context whole and adds to it keeps
    all of it (it was weighed as rewriting everything, as if nothing were kept)."""
    from ctxwarden.core.tokens.counter import TokenCounter
    from ctxwarden.pipeline.engine import _DIGEST, _FINGERPRINT, _rewrite_terms
    from ctxwarden.steps.base import StepContext

    counter = TokenCounter.for_model("gpt-4o")
    sent = [
        Message.system("You fix bugs.", id="s"),
        Message.user("Fix the failing test in tests/test_io.py", id="u"),
        Message.assistant("Looking at the file first.", id="a"),
    ]
    added = Message.user("It still fails on Windows paths.", id="u2")
    prefix = tuple(_DIGEST(_FINGERPRINT(m)) for m in sent)
    ctx = StepContext(
        counter=counter, budget=4000, policy=Policy(), previous=BuildState(prefix=prefix)
    )
    compacted = Draft(history=[*sent, added], sys_end=1, newest=3, ordered=(*sent, added))
    kept, rewritten, _, _ = _rewrite_terms(compacted, 1000, ctx, 0)
    assert rewritten == counter.total([added]) and kept > counter.total(sent)
    changed = Draft(history=sent, sys_end=1, newest=2, ordered=(sent[0], sent[2]))
    kept, rewritten, _, _ = _rewrite_terms(changed, 1000, ctx, 0)  # differs at the second
    assert rewritten == counter.total([sent[2]])


def test_the_cache_section_of_a_policy() -> None:
    policy = Policy.from_toml('[cache]\nappend_only = false\nprices = "openai"\n')
    assert policy.cache == CacheConfig(append_only=False, prices="openai")
    assert Policy.from_toml('[cache]\nprices = "model"\n').cache.prices == "model"
    assert Policy().cache.early_compaction
    assert not Policy.from_toml("[cache]\nearly_compaction = false\n").cache.early_compaction
    with pytest.raises(ConfigError, match=r"cache\.prices"):
        Policy.from_toml('[cache]\nprices = "cheap"\n')


# -- the build -----------------------------------------------------------------------------


def agent_run(steps: int, result_tokens: int = 120) -> list[Message]:
    """A tool-calling agent: each step a call and a result with a fresh id in it."""
    out = [Message.system("You look up orders. " * 20, id="s"), Message.user("Find order 1.")]
    for i in range(steps):
        call = ToolCall(f"c{i}", "lookup", json.dumps({"order": f"ORD-{1000 + i}"}))
        out.append(Message.assistant("", (call,), id=f"a{i}"))
        body = f"order ORD-{1000 + i} for customer CUST-{7000 + i}: " + "item " * result_tokens
        out.append(Message.tool(body, f"c{i}", id=f"t{i}"))
    return out


def loop(history: list[Message], budget: int, policy: Policy | None = None) -> list:  # type: ignore[type-arg]
    builds = []
    previous = None
    for k, m in enumerate(history):
        if m.role == "assistant":
            previous = build_context(
                history[:k], "gpt-4o", budget, policy=policy, previous=previous
            )
            builds.append(previous)
    return builds


def _causes(builds: list) -> list[str]:  # type: ignore[type-arg]
    return [b.audit.prefix_break.cause for b in builds[1:] if b.audit.prefix_break is not None]


def test_an_early_compaction_for_held_back_edits_can_be_turned_off() -> None:
    """By default a held build that fits also compacts when applying the masks it held
    back now pays for the rewrite; ``[cache] early_compaction = false`` sends it held
    (no second build of the context to weigh it), and only a build that must shrink
    compacts."""
    run = agent_run(40)
    on = loop(run, 2500)
    off = loop(run, 2500, Policy.from_toml("[cache]\nearly_compaction = false\n"))
    early = [c for c in _causes(on) if "applying them frees" in c]
    assert early and early[0].startswith("mask: ")
    assert _causes(off) and not any("applying them frees" in c for c in _causes(off))
    assert all(b.audit.input_tokens <= 2500 for b in off + on)
    # the two loops are the same up to the early compaction
    at = next(i for i, b in enumerate(on) if b.audit.prefix_break is not None
              and "applying them frees" in b.audit.prefix_break.cause)  # fmt: skip
    assert [b.messages for b in off[:at]] == [b.messages for b in on[:at]]
    assert off[at].messages != on[at].messages


def _full_compactions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the compacting builds the engine folds in full (not forecasts)."""
    import ctxwarden.pipeline.engine as engine

    fold, folded = engine._fold, [0]

    def counted(draft, ctx, steps, pre):  # type: ignore[no-untyped-def]
        folded[0] += ctx.compacting and not ctx.forecast
        return fold(draft, ctx, steps, pre)

    monkeypatch.setattr(engine, "_fold", counted)
    return folded


def _always_weighed(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctxwarden.pipeline.engine as engine

    monkeypatch.setattr(engine, "_rewrite_may_pay", lambda *_: True)


def test_an_early_compaction_is_foreseen_before_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A held build with edits held back weighs an early compaction; it first foresees it
    with the ledger blocks as sent (no ledger rendered, the bulk of a compacting build),
    and builds it in full only when that forecast is near paying
    (``engine.FORECAST_MARGIN``). The contexts are those of weighing every one in full."""
    run = agent_run(40)
    folded = _full_compactions(monkeypatch)
    foreseen = loop(run, 2500)
    built = folded[0]
    _always_weighed(monkeypatch)
    folded[0] = 0
    weighed = loop(run, 2500)
    assert built < folded[0]  # fewer compactions built in full
    assert [b.messages for b in foreseen] == [b.messages for b in weighed]
    assert [b.audit.prefix_break for b in foreseen] == [b.audit.prefix_break for b in weighed]
    assert any("applying them frees" in c for c in _causes(foreseen))  # (still compacts early)


@pytest.mark.skipif(not SWEBENCH.exists(), reason=f"swebench-mini data not found at {SWEBENCH}")
def test_the_forecast_leaves_the_coding_runs_contexts_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On coding agent runs (swebench-mini dev) at 8,000 tokens, where most calls weigh an
    early compaction: the same contexts as weighing each one in full, with a fraction of
    the full compacting builds."""
    from ctxwarden_bench.responses_replay import Recorded
    from ctxwarden_bench.swebench import load_swebench, swebench_retention

    runs = load_swebench(SWEBENCH)[:8]
    folded = _full_compactions(monkeypatch)
    foreseen = Recorded(engine_builder())
    swebench_retention(runs, 8000, foreseen)
    built = folded[0]
    _always_weighed(monkeypatch)
    folded[0] = 0
    weighed = Recorded(engine_builder())
    swebench_retention(runs, 8000, weighed)
    assert foreseen.contexts == weighed.contexts
    assert built < 0.7 * folded[0]


def test_a_held_build_whose_window_moves_settles_no_ledger_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A held build whose window must move is not sent (the engine compacts), so its fit
    stops at the move: no ledger is settled for the moved window in it (a rendering the
    compacting build does again), and the loop is the same."""
    import ctxwarden.steps.ledger as ledger

    run = agent_run(40)
    plain = loop(run, 2500)
    seen, held = [], ledger.held_ledger

    def spy(start, ctx):  # type: ignore[no-untyped-def]
        seen.append(ctx.hold and start != ctx.previous.window_start)
        return held(start, ctx)

    monkeypatch.setattr(ledger, "held_ledger", spy)
    watched = loop(run, 2500)
    assert any("window must move" in c for c in _causes(watched))
    assert seen and not any(seen)
    assert [b.messages for b in watched] == [b.messages for b in plain]
    assert _causes(watched) == _causes(plain)


def _compacting_settlings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the ledger settlings of compacting builds (forecasts apart)."""
    import ctxwarden.steps.ledger as ledger

    settled, blocks = [0], ledger._Settling.blocks

    def counted(self, draft, window):  # type: ignore[no-untyped-def]
        settled[0] += self.ctx.compacting and not self.ctx.forecast
        return blocks(self, draft, window)

    monkeypatch.setattr(ledger._Settling, "blocks", counted)
    return settled


def _unbounded_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit as if nothing bounded the blocks a compaction sends: it settles them for
    every window it tries."""
    import ctxwarden.steps.ledger as ledger

    monkeypatch.setattr(ledger.EntityLedgerBlocks, "compaction_span", lambda *_: None)


def test_a_compaction_settles_no_ledger_for_a_window_it_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the window's low-water mark does not depend on the ledger's blocks (a ledger
    with a low-water mark, counted exactly: ``EntityLedgerBlocks.compaction_span`` is the
    cap at both ends), a compaction whose window must move settles the ledger only for
    the window it moves to: the same contexts and breaks as settling it for both, with
    fewer settlings."""
    run = agent_run(60, result_tokens=400)
    settled = _compacting_settlings(monkeypatch)
    moved = loop(run, 8000)
    fewer = settled[0]
    _unbounded_blocks(monkeypatch)
    settled[0] = 0
    both = loop(run, 8000)
    assert any("window must move" in c for c in _causes(moved))
    assert 0 < fewer < settled[0]
    assert [b.messages for b in moved] == [b.messages for b in both]
    assert _causes(moved) == _causes(both)


@pytest.mark.skipif(not SWEBENCH.exists(), reason=f"swebench-mini data not found at {SWEBENCH}")
def test_a_compaction_whose_move_is_the_same_wherever_the_blocks_fall_settles_them_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 4,000 tokens the ledger has no low-water mark: the blocks a compaction sends
    take anything up to the cap, so the window's low-water mark lies between those of
    the two ends. Where the window is above both and a move to either keeps the same
    blocks, the ledger is settled only for the window it moves to. On coding agent runs
    (swebench-mini dev): the same contexts and audited breaks as settling it for both,
    with fewer settlings. (Run 38 holds a compaction where the ledger carried from the
    previous build ends past the window's start: it is settled for both windows then.)"""
    from ctxwarden_bench.swebench import load_swebench, swebench_retention

    every = load_swebench(SWEBENCH)
    runs = [*every[:6], every[38]]

    def replay() -> tuple[list[list[Message]], list[str]]:
        contexts: list[list[Message]] = []
        causes: list[str] = []
        builder = engine_builder()

        def recorded(before, counts, budget):  # type: ignore[no-untyped-def]
            ctx = builder(before, counts, budget)
            contexts.append(ctx)
            made = builder._built.audit.prefix_break
            causes.append("" if made is None else f"{made.cause} {made.rewritten_tokens}")
            return ctx

        swebench_retention(runs, 4000, recorded)
        return contexts, causes

    settled = _compacting_settlings(monkeypatch)
    once = replay()
    fewer = settled[0]
    _unbounded_blocks(monkeypatch)
    settled[0] = 0
    both = replay()
    assert any("window must move" in c for c in once[1])
    assert 0 < fewer < 0.9 * settled[0]
    assert once == both


def test_between_compactions_every_build_keeps_the_previous_context_whole() -> None:
    builds = loop(agent_run(40), 2500)
    breaks = [b.audit.prefix_break for b in builds[1:] if b.audit.prefix_break is not None]
    whole = [b for b in builds[1:] if b.audit.prefix_break is None]
    assert breaks and len(whole) > 2 * len(breaks)  # compactions are rare
    for before, after in itertools.pairwise(builds):
        if after.audit.prefix_break is None:  # append-only: the old context is a prefix
            assert after.messages[: len(before.messages)] == before.messages
            assert after.audit.prefix_shared_tokens >= before.audit.input_tokens - 3
        else:
            assert after.state.held_calls == 0
    for b in breaks:  # each break says where, why and what it cost
        assert b.cause and b.rewritten_tokens > 0 and b.cost_units > 0 and b.cost_usd
    # a compaction shrinks to the low-water mark, so it is followed by appends
    assert all(b.audit.input_tokens <= 2500 for b in builds)
    assert any("window must move" in b.cause for b in breaks)


def test_a_compaction_keeps_the_ledger_block_it_sent_and_adds_the_new_values_after_it() -> None:
    """A window move adds values to the ledger: the block sent before stays in place (the
    cache still serves it) and a second block shows only what it does not, so the
    rewrite starts after the kept block; no value that left the context is lost."""
    run = agent_run(60)
    builds = loop(run, 2500)
    stacked = 0
    for before, after in itertools.pairwise(builds):
        blocks = [m for m in after.messages if m.id in (LEDGER_ID, LEDGER_MORE_ID)]
        shown = "\n".join(
            m.text + " ".join(c.arguments for c in m.tool_calls) for m in after.messages
        )
        seen = "\n".join(m.text for m in run[: after.state.history_length] if m.role == "tool")
        assert all(v in shown for v in set(re.findall(r"(?:ORD|CUST)-\d+", seen)))
        if len(blocks) < 2 or after.audit.prefix_break is None:
            continue
        stacked += 1
        kept, more = blocks
        assert (kept.id, more.id) == (LEDGER_ID, LEDGER_MORE_ID)
        assert kept.text == next(m.text for m in before.messages if m.id == LEDGER_ID)
        assert after.audit.prefix_break.at == after.messages.index(more)  # kept block cached
        ids = set(re.findall(r"(?:ORD|CUST)-\d+", more.text))
        assert ids and not ids & set(re.findall(r"(?:ORD|CUST)-\d+", kept.text))
        assert after.state.ledger_base_sent == kept.text
        assert BuildState.from_dict(json.loads(json.dumps(after.state.to_dict()))) == after.state
    assert stacked >= 3
    # a new value block that outgrows the kept one is rendered again as one block
    assert any(
        b.audit.prefix_break is not None
        and sum(m.id == LEDGER_ID for m in b.messages) == 1
        and all(m.id != LEDGER_MORE_ID for m in b.messages)
        and a.state.ledger_base_sent
        for a, b in itertools.pairwise(builds)
    )


def _renewed(builds: list) -> list[tuple[int, object, object]]:  # type: ignore[type-arg]
    """(tokens, build, next build) of each compaction that sent the ledger as one new block
    although the previous context had one."""
    from ctxwarden.core.tokens.counter import TokenCounter

    count = TokenCounter.for_model("gpt-4o").count_message
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(builds)):
        blocks = [m for m in b.messages if m.id in (LEDGER_ID, LEDGER_MORE_ID)]
        if b.audit.prefix_break is None or len(blocks) != 1 or not a.state.ledger_sent:
            continue
        if blocks[0].text in (a.state.ledger_sent, a.state.ledger_base_sent):
            continue
        out.append((count(blocks[0]), b, builds[i + 2] if i + 2 < len(builds) else None))
    return out


def test_a_ledger_rendered_anew_refills_to_its_low_water_mark_when_its_cap_has_grown() -> None:
    """A ledger a compaction renders anew fills ``LEDGER_REFILL`` of its cap when that
    is at least ``ledger.max_tokens`` (the cap grew with the budget), so the next
    compactions stack their new values after it instead of rendering it whole again,
    and the window's low-water mark leaves it the room it grows back into; a cap near
    its floor is filled."""
    from dataclasses import replace

    from ctxwarden.core.tokens.counter import REPLY_PRIMING, TokenCounter
    from ctxwarden.steps.ledger import LEDGER_REFILL

    base = Policy()
    grown = replace(base, ledger=replace(base.ledger, max_tokens=100))  # cap ~600
    run = agent_run(90)
    count = TokenCounter.for_model("gpt-4o").count_message
    fixed = REPLY_PRIMING + count(run[0])
    cap = int((2500 - fixed) * grown.ledger.free_share)
    builds = loop(run, 2500, grown)
    renewed = _renewed(builds)
    assert renewed and all(tokens <= cap * LEDGER_REFILL for tokens, _, _ in renewed)
    # the next compaction keeps the block and stacks the new values after it
    stacked = [
        n
        for _, b, n in renewed
        if n is not None
        and [m.text for m in n.messages if m.id == LEDGER_ID]
        == [m.text for m in b.messages if m.id == LEDGER_ID]
    ]
    assert stacked
    # a compaction leaves the window half the room the ledger leaves at its cap
    room = 2500 - fixed - cap
    for _, b, _ in renewed:
        window = sum(count(m) for m in b.messages if b.layers[m.id] in ("window", "current"))
        assert window <= room * base.window.refill_ratio
    full = replace(base, ledger=replace(base.ledger, max_tokens=400))  # 0.6 * ~600 < 400
    assert any(tokens > cap * LEDGER_REFILL for tokens, _, _ in _renewed(loop(run, 2500, full)))


def test_a_compaction_keeps_the_system_prompt_and_the_task_cached() -> None:
    """A coding agent's one task opens the window through every compaction (the window
    cannot start after the newest user message): the ledger and the other layers follow
    it, so a compaction that renders the ledger again still shares the system prompt
    and the task with the previous context; the Anthropic breakpoints mark the end of
    the layers after the task."""
    run = coding_run(30)
    builds = loop(run, 6000)
    compactions = 0
    for before, after in itertools.pairwise(builds):
        layers = [m for m in after.messages if m.id in (LEDGER_ID, LEDGER_MORE_ID)]
        if not layers:
            continue
        assert [m.id for m in after.messages[:2]] == ["s", run[1].id]
        assert after.messages[2] == layers[0] and after.layers[run[1].id] == "current"
        pb = after.audit.prefix_break
        if pb is None or "window must move" not in pb.cause:
            continue
        compactions += 1
        assert pb.at >= 2 and after.messages[:2] == before.messages[:2]
        assert pb.shared_tokens > 0 and after.audit.prefix_shared_tokens == pb.shared_tokens
        assert {layers[-1].id, run[1].id} <= set(after.audit.cache_breakpoints)
    assert compactions >= 3


def test_where_the_template_takes_one_system_message_the_layers_stay_before_the_task() -> None:
    """A model whose chat template takes one system message gets the layers folded into
    it: a ledger after the task would still precede it there, so for such a model the
    usual layout is kept and the prefix the audit prices is the one the wire sends."""
    from ctxwarden.steps.layout import system_in_place

    assert system_in_place(get_model("gpt-4o")) and system_in_place(None)
    assert system_in_place(get_model("claude-sonnet-4-5"))  # in place, as user text
    assert system_in_place(get_model("gemini-2.5-pro"))
    assert not system_in_place(get_model("mistral-nemo:12b"))  # one system message: folded
    run = coding_run(30)
    previous = None
    with_ledger = 0
    for k, m in enumerate(run):
        if m.role == "assistant":
            previous = build_context(run[:k], "mistral-nemo:12b", 6000, previous=previous)
            assert sum(x.role == "system" for x in previous.messages) == 1
            if DEFAULT_HEADER in previous.messages[0].text:
                with_ledger += 1  # folded into the prompt, before the task
                assert previous.messages[1].id == run[1].id
    assert with_ledger >= 3


def test_on_the_anthropic_wire_the_layers_after_the_task_are_text_of_its_user_turn() -> None:
    """Anthropic's wire sends a system message that follows the task in place, as a text
    block of the task's user turn: the ``system`` parameter holds the system prompt alone,
    so a compaction that renders the ledger again leaves the system prompt and the task
    cached there too (the breakpoints mark the task's end and the ledger's), and the
    prefix the audit prices is the one that wire sends."""
    from ctxwarden.formats.anthropic import messages_to_anthropic
    from ctxwarden.service.anthropic_json import request_json
    from ctxwarden.steps.layout import system_in_place

    assert system_in_place(get_model("claude-sonnet-4-5"))
    run = coding_run(30)
    previous = None
    after_task = compactions = 0
    for k, m in enumerate(run):
        if m.role != "assistant":
            continue
        before, previous = (
            previous,
            build_context(run[:k], "claude-sonnet-4-5", 6000, previous=previous),
        )
        if LEDGER_ID not in previous.layers:
            continue
        assert [x.id for x in previous.messages[:3]] == ["s", run[1].id, LEDGER_ID]
        after_task += 1
        marks = previous.audit.cache_breakpoints
        system, turns = messages_to_anthropic(previous.messages, cache_breakpoints=marks)
        assert system is not None and [b["text"] for b in system] == [run[0].text]
        task_turn = turns[0]["content"]
        assert task_turn[0]["text"] == run[1].text and "cache_control" in task_turn[0]
        ledger = previous.messages[2]
        assert task_turn[1]["text"] == ledger.text
        assert request_json(previous.messages, marks) == tuple(  # the proxy's fast path
            orjson.dumps(x) if x is not None else None for x in (system, turns)
        )
        pb = previous.audit.prefix_break
        if before is not None and pb is not None and "window must move" in pb.cause:
            # the old request wrote a cache entry at the task's end, which this one reads
            old_system, old_turns = messages_to_anthropic(
                before.messages, cache_breakpoints=before.audit.cache_breakpoints
            )
            assert old_system == system and old_turns[0]["content"][0]["text"] == run[1].text
            if LEDGER_ID in before.layers:
                compactions += 1
                assert old_turns[0]["content"][0] == task_turn[0]
    assert after_task >= 3 and compactions >= 1


def test_on_the_gemini_wire_the_layers_after_the_task_are_text_of_its_user_turn() -> None:
    """Gemini's ``systemInstruction`` holds the system prompt alone; the ledger that a
    compaction put after the task is a text part of the task's user turn, so the prompt
    and the task stay a cached prefix when the ledger is rendered again."""
    from ctxwarden.formats.gemini import messages_to_gemini

    run = coding_run(30)
    previous = None
    after_task = 0
    for k, m in enumerate(run):
        if m.role != "assistant":
            continue
        previous = build_context(run[:k], "gemini-2.5-pro", 6000, previous=previous)
        if LEDGER_ID not in previous.layers:
            continue
        assert [x.id for x in previous.messages[:3]] == ["s", run[1].id, LEDGER_ID]
        after_task += 1
        system, contents = messages_to_gemini(previous.messages)
        assert system == {"parts": [{"text": run[0].text}]}
        ledger = previous.messages[2]
        assert contents[0]["parts"][:2] == [{"text": run[1].text}, {"text": ledger.text}]
        roles = [c["role"] for c in contents]
        assert all(a != b for a, b in itertools.pairwise(roles))  # turns alternate
    assert after_task >= 3


def test_layers_after_the_task_are_recognised_when_the_context_comes_back_as_history() -> None:
    """A framework that hands the built context back as the next history: the ledger
    blocks after the task are carried (their values kept), not stacked as history."""
    from ctxwarden.pipeline.carried import strip_layers

    built = loop(coding_run(30), 6000)[-1]
    layers = [m for m in built.messages if m.id in (LEDGER_ID, LEDGER_MORE_ID)]
    assert layers and built.messages[2] == layers[0]
    stripped, carried = strip_layers(list(built.messages))
    assert stripped == [m for m in built.messages if m not in layers]
    body = "\n".join(m.text.split("\n", 1)[1] for m in layers)
    assert carried.ledger.split("\n", 1)[1] == body


def order_questions(questions: int = 12) -> list[Message]:
    """A chat of questions, each answered with three lookups (~150-token results) and
    then text."""
    out = [Message.system("You look up orders. " * 20, id="s")]
    for q in range(questions):
        out.append(Message.user(f"Where is order ORD-{q}?", id=f"u{q}"))
        for i in range(3):
            call = ToolCall(f"c{q}{i}", "lookup", json.dumps({"order": f"ORD-{q}", "i": i}))
            out.append(Message.assistant("", (call,), id=f"a{q}{i}"))
            out.append(Message.tool(f"ORD-{q}/{i}: " + "item " * 150, f"c{q}{i}", id=f"t{q}{i}"))
        out.append(Message.assistant(f"Order ORD-{q} is on its way.", id=f"r{q}"))
    return out


def test_the_layers_stay_before_the_window_when_its_start_moves_with_each_question() -> None:
    """In a chat the window's first message changes at most compactions while the ledger
    often does not: the layers go after the window's first message only when that keeps
    more of the previous context cached, and between compactions they stay where they
    were."""
    builds = loop(order_questions(), 1500)
    assert any(LEDGER_ID in b.layers for b in builds)
    for before, after in itertools.pairwise(builds):
        if after.audit.prefix_break is None:  # held: the layers did not move
            assert after.messages[: len(before.messages)] == before.messages
    moved = [b for b in builds if LEDGER_ID in b.layers and b.messages[1].id == LEDGER_ID]
    assert moved  # the ledger right after the system prompt once the window moved on


def chat(turns: int) -> list[Message]:
    """A long chat whose user keeps asking about things said long before (recall's case)."""
    out = [Message.system("You are a travel diary assistant.", id="s")]
    for t in range(turns):
        town = f"Town{t % 7}"
        out.append(Message.user(f"In {town} I met guide{t} and ate dish{t}. " * 6, id=f"u{t}"))
        out.append(Message.assistant(f"Lovely, {town} again! " * 8, id=f"a{t}"))
        old = max(t - 20, 0)
        out.append(Message.user(f"Was dish{old} good, the one guide{old} chose?", id=f"q{t}"))
        out.append(Message.assistant(f"You loved dish{old}.", id=f"r{t}"))
    return out


def test_the_recall_block_follows_the_request_without_a_compaction() -> None:
    """Recall places its block right before the newest user message: the next build
    places a new one before the new request, and the old one is gone. That is a change
    at the tail, not of the window: the build stays held (only what followed the old
    block is written again), where it used to compact at every chat turn."""
    builds = loop(chat(40), 2500)
    recalled = [b for b in builds if b.audit.layers.get("recall")]
    assert len(recalled) >= 15
    moved = [
        b for b in builds if b.audit.prefix_break and b.audit.prefix_break.cause == RECALL_MOVED
    ]
    assert len(moved) > 10
    for before, after in itertools.pairwise(builds):
        if after.audit.prefix_break is not None and after.audit.prefix_break.cause == RECALL_MOVED:
            at = after.audit.prefix_break.at
            assert before.messages[at].id == RECALL_ID  # the old block, and only it, is gone
            assert after.messages[:at] == before.messages[:at]
            assert after.messages[at : len(before.messages) - 1] == before.messages[at + 1 :]
            assert after.audit.prefix_break.rewritten_tokens < 200
    compactions = [b for b in builds[1:] if b.state.held_calls == 0]
    assert len(compactions) < len(builds) // 3


def test_recall_moved_reads_only_the_removal_of_the_block_before_a_user_message() -> None:
    system, u1, a1, u2 = (
        Message.system("s", id="s"),
        Message.user("a", id="u1"),
        Message.assistant("b", id="a1"),
        Message.user("c", id="u2"),
    )
    held = Draft([system, u1, a1, u2], 1, 3, ordered=(system, u1, a1, u2))
    now = ("S", "U1", "A1", "U2")  # the held build's digests
    assert recall_moved(held, ("S", "R", "U1"), now)  # [system, recall, u1]: the block went
    assert not recall_moved(held, ("S", "R", "X"), now)  # and something after it changed
    assert not recall_moved(held, ("S", "R", "R2", "U1"), now)  # two messages went
    assert not recall_moved(held, ("S", "U1", "R"), now)  # a block not before a user message
    assert not recall_moved(held, ("S", "U1"), now)  # nothing went: a plain append


def test_without_append_only_the_prefix_moves_more_often_and_costs_more() -> None:
    # (13 breaks against 19, 0.76x the cost. Until the window could start after a long
    # turn's request, a build without append-only also masked one more result of the
    # whole turn at every call: 50 breaks, 0.38x; with a request every ten steps, as
    # before, 13 against 18, 0.83x)
    run = agent_run(80)
    held = loop(run, 2000)
    eager = loop(run, 2000, Policy(cache=CacheConfig(append_only=False)))
    n_held = sum(b.audit.prefix_break is not None for b in held)
    n_eager = sum(b.audit.prefix_break is not None for b in eager)
    assert n_held + 4 < n_eager

    def cost(builds: list) -> float:  # type: ignore[type-arg]
        calls = [
            CallPrefix(b.audit.input_tokens, b.audit.prefix_shared_tokens, False) for b in builds
        ]
        return session_cache_cost(calls, ANTHROPIC).units

    assert cost(held) < 0.8 * cost(eager)


def test_the_compaction_state_round_trips() -> None:
    builds = loop(agent_run(12), 2500)
    state = builds[-1].state
    assert state.input_tokens == builds[-1].audit.input_tokens
    again = BuildState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state
    assert BuildState.from_dict({"history_length": 3}).held_calls == 0  # an older state


def test_a_session_builds_the_same_append_only_contexts(tmp_path: Path) -> None:
    run = agent_run(30)
    url = f"sqlite:///{tmp_path / 's.db'}"
    previous = None
    with Session(url, "agent") as s:
        s.append(run[:2])
        for k in range(2, len(run)):
            if run[k].role == "assistant":
                built = s.build(max_input_tokens=2500)
                previous = build_context(run[:k], "gpt-4o", 2500, previous=previous)
                assert built.to_openai() == previous.to_openai()
                assert built.audit.prefix_break == previous.audit.prefix_break
            s.append([run[k]])
    assert previous is not None and previous.state.held_calls >= 0


def test_explain_shows_the_prefix_and_the_loop_cost(tmp_path: Path) -> None:
    from ctxwarden.cli.main import app
    from ctxwarden.formats.openai import messages_to_openai

    path = tmp_path / "run.json"
    path.write_text(json.dumps(messages_to_openai(agent_run(30))), encoding="utf-8")
    result = CliRunner().invoke(app, ["explain", str(path), "-b", "2500"])
    assert result.exit_code == 0, result.output
    assert "shared with the previous build" in result.output
    assert "of the full history with caching" in result.output


# -- the dev traces ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not TAU.exists(), reason=f"tau-bench data not found at {TAU}")
@pytest.mark.parametrize("budget", [2000, 4000])
def test_default_builds_cost_less_than_the_full_history_with_caching_on_tau(budget: int) -> None:
    """The 120 dev runs as an agent loop, the default policy for gpt-4o (its rewrites
    weighed at the cautious prices: Anthropic's, whose write premium is the dearer).
    Measured at Anthropic prices: 89.1% @2,000, 99.5% @4,000 (100.2% when the rewrites
    were weighed at gpt-4o's own 0.5x / 1x, before the tail edits; at OpenAI-style
    0.1x / 1x 85.8% and 97.7%)."""
    from ctxwarden_bench.traces import load_tau_bench, tau_retention

    ours = tau_retention(load_tau_bench(TAU), budget, engine_builder())
    assert ours.cost.anthropic < ours.cost.full_anthropic
    assert ours.cost.openai < ours.cost.full_openai
    assert ours.violations == 0 and ours.over_budget == 0
    assert ours.retention >= (0.996 if budget == 2000 else 1.0)


@pytest.mark.slow
@pytest.mark.skipif(not SWEBENCH.exists(), reason=f"swebench-mini data not found at {SWEBENCH}")
@pytest.mark.parametrize("budget", [4000, 8000])
def test_default_builds_cost_less_than_the_full_history_with_caching_on_coding(
    budget: int,
) -> None:
    """The 44 dev runs as an agent loop, the default policy for gpt-4o. Measured at
    Anthropic prices: 56.4% @4,000, 68.2% @8,000 (99.3% of the sawtooth window's cost,
    issue 37's target: at or below it, at retention .9858 against its .9043; 68.9% and
    100.3%, retention .9843, while a tail edit weighed the room it frees at the policy's
    low-water mark alone, :func:`~ctxwarden.steps.edit.left_share`;
    56.6% and 100.1% while a repeated nag took the
    sent copy's place and the sent one left between compactions, the held context a
    little smaller; 100.4% before markup tags left the ledger;
    68.9% and 100.3% while a long turn's window could not start after its request,
    whose tokens per call were read over the whole turn; 72.3% before the ledger
    refilled to its
    low-water mark, :func:`~ctxwarden.steps.ledger.ledger_low_water`; at gpt-4o's own
    prices 27% and 43%); 75.9%
    and 76.8% while the ledger sat before the task and each compaction wrote the task
    again (:mod:`ctxwarden.steps.layout`); 75.5% and 89.0% when the rewrites were
    weighed at gpt-4o's own prices, before the tail edits. Retention 0.9637 and 0.9858
    (issue 37 asks for at least 0.984 @8,000)."""
    from ctxwarden_bench.swebench import load_swebench, swebench_retention

    runs = load_swebench(SWEBENCH)
    ours = swebench_retention(runs, budget, engine_builder())
    assert ours.cost.anthropic < ours.cost.full_anthropic
    assert ours.violations == 0 and ours.over_budget == 0
    assert ours.retention >= (0.9516 if budget == 4000 else 0.984)
    if budget == 8000:
        assert ours.cost.anthropic <= 0.70 * ours.cost.full_anthropic
        saw = swebench_retention(runs, budget, sawtooth_builder())
        assert ours.retention > saw.retention
        assert ours.cost.anthropic <= ours.cost.sawtooth_anthropic


@pytest.mark.skipif(not TAU.exists(), reason=f"tau-bench data not found at {TAU}")
def test_a_message_kept_among_dropped_blocks_stays_while_held() -> None:
    """A user message, protected while blocks after it were dropped, is not dropped
    between compactions once a newer user message comes (it rewrote everything after
    it: on dev run 3 @4,000, twice). Only a compaction moves the window."""
    from ctxwarden_bench.traces import load_tau_bench

    builds = loop(list(load_tau_bench(TAU)[3]), 4000)
    assert any(
        getattr(b.state.memos.get("fit"), "kept_from", "") for b in builds
    )  # blocks were dropped inside a turn
    causes = [b.audit.prefix_break.cause for b in builds if b.audit.prefix_break is not None]
    assert causes and not [c for c in causes if "changed" in c]


def test_a_request_repeated_word_for_word_does_not_push_out_the_sent_one() -> None:
    """An agent's harness repeats its nag ("provide exactly one action") word for word.
    The first nag, kept while the blocks after it were dropped, stays in the held builds
    once the second comes: the new copy was never sent, so it does not take the sent
    one's place (it did, and the first left the window between compactions: "the window
    changed", a rewrite of everything after it; swebench-mini dev runs 21, 30, 31 and 39
    @4,000, 26 and 31 @8,000)."""
    nag = "Please always provide EXACTLY ONE action in triple backticks."
    history = agent_run(4)

    def steps(first: int, n: int) -> list[Message]:
        calls = [
            ToolCall(f"c{i}", "lookup", json.dumps({"order": f"ORD-{i}"}))
            for i in range(first, first + n)
        ]
        return [
            m
            for c in calls
            for m in (
                Message.assistant("", (c,), id=f"a{c.id}"),
                Message.tool(f"order {c.arguments}: " + "item " * 120, c.id, id=f"t{c.id}"),
            )
        ]

    history += [Message.assistant("Two commands.", id="x1"), Message.user(nag, id="q1")]
    history += steps(100, 14)
    history += [Message.assistant("Two more.", id="x2"), Message.user(nag, id="q2")]
    history += steps(200, 3)
    builds = loop(history, 2000)
    assert any(getattr(b.state.memos.get("fit"), "kept_from", "") for b in builds)
    assert not [c for c in _causes(builds) if "changed" in c]
    at = [k for k, m in enumerate(history) if m.role == "assistant"]  # where loop() built
    q2 = next(k for k, m in enumerate(history) if m.id == "q2")
    after_q2 = [b for k, b in zip(at, builds, strict=True) if k > q2]
    assert after_q2 and all("q1" in [m.id for m in b.messages] for b in after_q2)
