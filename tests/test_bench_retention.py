"""Needed-later retention (tau-bench every value, swebench-mini tokens), the invariant
checks of every built context, and the peers' adapters."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden_bench.retention import (
    Mentions,
    call_retention,
    engine_builder,
    invariant_problems,
    newest_kept,
    plain_builder,
)
from ctxwarden_bench.swebench import (
    distinctive,
    group_of,
    load_swebench,
    needed_tokens,
    swebench_retention,
)
from ctxwarden_bench.traces import needed_values

DATA = Path(os.environ.get("CTXWARDEN_DATA", Path(__file__).parents[2] / "shared" / "data"))
SWEBENCH = DATA / "swebench-mini" / "swebench-verified-mini-gemini3-dev.json"


def bash(cid: str, command: str, mid: str) -> Message:
    return Message.assistant(
        "THOUGHT", (ToolCall(cid, "bash", json.dumps({"command": command})),), id=mid
    )


def coding_run() -> list[Message]:
    listing = "\n".join(f"src/pkg/module_{i}.py" for i in range(40)) + "\nsrc/pkg/core_utils.py"
    return [
        Message.system("You run one bash command per turn.", id="s"),
        Message.user("Fix the bug in foo/bar.py where parseArgs fails.", id="task"),
        bash("c1", "ls -R src", "a1"),
        Message.tool(listing, "c1", id="t1"),
        bash("c2", "cat src/pkg/core_utils.py foo/bar.py && grep -n parseArgs x", "a2"),
    ]


def test_swebench_needed_tokens_follow_the_data_readme() -> None:
    run = coding_run()
    earlier, given = Mentions(run[:4]), Mentions(run[:2])
    command = run[4].tool_calls[0].parsed_arguments()["command"]
    # foo/bar.py and parseArgs are in the task (always kept); 'cat', 'grep', '-n' are not
    # distinctive; only the path the listing showed is needed later
    assert needed_tokens(command, earlier, given) == ["src/pkg/core_utils.py"]
    assert distinctive("parseArgs") and distinctive("1234") and not distinctive("grep")
    assert not distinctive("a.b")  # shorter than 4


def test_swebench_names_leave_out_a_sentences_full_stop_and_a_call_chains_dot() -> None:
    """The README's split keeps ``.``, so a word that ends a sentence (``expected.``)
    and a method called on a call's result (``.strip``) are needed tokens wherever an
    earlier message ends a sentence with the word or calls the method, and it splits a
    backslash off an escape, gluing its letter to the word after it: the measure asked
    counts them, the names column leaves them out."""
    command = "python -c \"print(run().strip()); print('works as expected.')\" src/pkg/a.py"
    earlier = Mentions(
        [Message.user("It works as expected. Then x.strip() and .strip src/pkg/a.py")]
    )
    found = needed_tokens(command, earlier, Mentions())
    assert found == [".strip", "expected.", "src/pkg/a.py"]
    assert [group_of(t, command) for t in found] == ["punctuated", "punctuated", "names"]
    assert group_of(".gitignore", "cat .gitignore") == "names"  # a dot file is a name
    escaped = 'printf "done\\nos.makedirs\\n" && ls /tmp/nos.makedirs_log'
    assert group_of("nos.makedirs", escaped) == "punctuated"  # "\\n" glued to a name
    assert group_of("nos.makedirs", "ls nos.makedirs") == "names"
    run = [
        Message.system("You run one bash command per turn.", id="s"),
        Message.user("Fix it.", id="task"),
        bash("c1", "ls", "a1"),
        Message.tool("src/pkg/a.py works as expected. Use x.strip()", "c1", id="t1"),
        bash("c2", command, "a2"),
    ]
    row = swebench_retention([run], 100_000, plain_builder()).to_json()
    assert (row["values_names"], row["values_punctuated"], row["retention_names"]) == (1, 1, 1.0)


def test_swebench_retention_drops_what_a_small_window_cannot_hold() -> None:
    run = coding_run()
    wide = swebench_retention([run], 100_000, plain_builder())
    assert (wide.values, wide.retention, wide.reduction) == (1, 1.0, 0.0)
    narrow = swebench_retention([run], 60, plain_builder())  # the listing does not fit
    assert narrow.retention == 0.0 and narrow.newest_dropped == 1
    ours = swebench_retention([run], 300, engine_builder())
    assert ours.retention == 1.0 and ours.over_budget == 0 and ours.violations == 0


def test_tau_needed_values_are_every_leaf_of_three_characters_once() -> None:
    earlier = Mentions(
        [Message.user("I am mia_li_3668, flying JFK to SEA on 2024-05-20 with 2 bags, 100 usd")]
    )
    args = {
        "user_id": "mia_li_3668",
        "flights": [{"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}],
        "bags": 2,  # shorter than 3 characters
        "amount": 100,  # a number counts as str() writes it
        "insurance": True,  # booleans are no values
        "again": "JFK",  # once per call
        "unseen": "LAX",  # not in an earlier message
    }
    assert needed_values(args, earlier) == [
        ("mia_li_3668", "ids"),
        ("JFK", "other"),
        ("SEA", "other"),
        ("2024-05-20", "other"),
        ("100", "other"),
    ]


def test_invariant_problems_see_orphans_missing_system_and_duplicates() -> None:
    run = coding_run()[:4]  # what the last call is built from
    assert invariant_problems(run, run) == []
    assert invariant_problems(run, [run[0], run[3]]) == ["orphan_result c1"]
    assert invariant_problems(run, run[1:]) == ["system prompt missing"]
    assert invariant_problems(run, [*run, run[1]]) == ["message task twice"]
    assert newest_kept(run, run) and not newest_kept(run, run[:-1])


def test_call_retention_counts_over_budget_and_violations() -> None:
    run = coding_run()

    def everything(before: Sequence[Message], counts: Sequence[int], budget: int) -> list[Message]:
        return list(before[1:])  # drops the system prompt, ignores the budget

    r = call_retention([run], 50, everything, lambda m, e, b: [("src/pkg/core_utils.py", "tokens")])
    assert r.over_budget == 1 and r.violations == 2 and len(r.examples) == 2
    assert r.to_json()["retention_tokens"] == 0.5  # the first call comes before the listing


@pytest.mark.skipif(not SWEBENCH.exists(), reason=f"swebench-mini data not found at {SWEBENCH}")
def test_swebench_plain_window_on_two_real_runs() -> None:
    runs = load_swebench(SWEBENCH)[:2]
    r = swebench_retention(runs, 4000, plain_builder())
    assert r.values > 30 and 0.5 < r.retention <= 1.0
    assert r.violations == 0 and r.over_budget == 0
    ours = swebench_retention(runs, 4000, engine_builder())
    assert ours.violations == 0 and ours.over_budget == 0
    assert ours.retention >= r.retention


def test_peers_are_measured_like_ours() -> None:
    pytest.importorskip("litellm")
    pytest.importorskip("headroom")
    from ctxwarden_bench.peers import PEERS, peer_builders

    builders = peer_builders(names=("litellm trim_messages", "litellm compress"))
    assert set(builders) <= set(PEERS)
    run = coding_run()
    for builder in builders.values():
        r = swebench_retention([run], 100_000, builder)
        assert (r.values, r.retention, r.over_budget, builder.errors) == (1, 1.0, 0, 0)
    with pytest.raises(ValueError, match="unknown peer"):
        peer_builders(names=("nope",))
