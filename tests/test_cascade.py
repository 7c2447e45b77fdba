"""The cascade as data (issue 38): ``Policy.cascade`` orders the steps; TOML reorders it or
places a user step by name; a bad list is a ConfigError naming the entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxwarden import Message, Policy, build_context
from ctxwarden.cli.main import app
from ctxwarden.core.errors import ConfigError
from ctxwarden.pipeline.cascade import DEFAULT_CASCADE, steps_for
from ctxwarden.steps.drop_tagged import DropTagged

_DROP = '[[steps]]\nuse = "ctxwarden.steps.drop_tagged:DropTagged"\ntag = "debug"\n'


def _toml_list(names: list[str]) -> str:
    return "cascade = [" + ", ".join(f'"{n}"' for n in names) + "]\n"


def _names(policy: Policy) -> list[str]:
    return [step.name for step in steps_for(policy)]


def _history() -> list[Message]:
    return [
        Message.system("You are a support agent."),
        Message.user("My order is ORD-1."),
        Message.assistant("debug: cache miss on order lookup", meta={"tags": ["debug"]}),
        Message.assistant("Looking it up."),
        Message.user("Any news?"),
    ]


def test_the_default_order_is_the_one_list() -> None:
    assert Policy().cascade == DEFAULT_CASCADE
    assert _names(Policy()) == [
        "layers",
        "window",
        "truncate",
        "mask",
        "recall",
        "fit",
        "priority",
        "layout",
    ]
    rules = Policy.from_toml("[tools.lookup]\npin = true\n")
    assert _names(rules)[0] == "tool_pins" and _names(rules)[-1] == "tool_rules"
    off = Policy.from_toml("truncate = false\nrecall = false\n")
    assert "truncate" not in _names(off) and "recall" not in _names(off)
    mine = Policy(steps=(DropTagged("debug"),))
    assert _names(mine)[3:6] == ["mask", "drop_tagged", "recall"]


def test_the_default_list_written_out_builds_the_same() -> None:
    written = Policy.from_toml(_toml_list(list(DEFAULT_CASCADE)) + _DROP)
    plain = Policy.from_toml(_DROP)
    history = _history()
    a = build_context(history, "gpt-4o", 2000, policy=written)
    b = build_context(history, "gpt-4o", 2000, policy=plain)
    assert a.to_openai() == b.to_openai() and a.audit.steps == b.audit.steps


def test_a_toml_cascade_reorders_and_places_a_user_step_by_name() -> None:
    order = list(DEFAULT_CASCADE)
    order.remove("steps")
    order.insert(order.index("window") + 1, "drop_tagged")  # before the editing steps
    t, m = order.index("truncate"), order.index("mask")
    order[t], order[m] = "mask", "truncate"
    policy = Policy.from_toml(_toml_list(order) + _DROP)
    assert policy.cascade == tuple(order)
    assert _names(policy) == [
        "layers",
        "window",
        "drop_tagged",
        "mask",
        "truncate",
        "recall",
        "fit",
        "priority",
        "layout",
    ]
    built = build_context(_history(), "gpt-4o", 2000, policy=policy)
    assert list(built.audit.steps[:5]) == ["layers", "window", "drop_tagged", "mask", "truncate"]
    assert "debug: cache miss" not in str(built.to_openai())


def test_unnamed_user_steps_run_where_steps_is() -> None:
    first, second = DropTagged("a", name="drop_a"), DropTagged("b", name="drop_b")
    order = ["drop_b", *DEFAULT_CASCADE]
    policy = Policy(steps=(first, second), cascade=tuple(order))
    names = _names(policy)
    assert names[0] == "drop_b" and names.index("drop_a") == names.index("mask") + 1


@pytest.mark.parametrize(
    ("cascade", "named"),
    [
        ([*DEFAULT_CASCADE, "compress"], "unknown step 'compress'"),
        ([*DEFAULT_CASCADE, "mask"], "step 'mask' is named twice"),
        ([n for n in DEFAULT_CASCADE if n != "fit"], "'fit' are missing"),
        ([n for n in DEFAULT_CASCADE if n not in ("layout", "priority")], "'priority', 'layout'"),
        ([*DEFAULT_CASCADE, 3], "must be a string, got 3"),
    ],
)
def test_a_bad_cascade_is_a_config_error_naming_it(cascade: list[object], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Policy(cascade=cascade)  # type: ignore[arg-type]
    assert named in str(caught.value)
    if all(isinstance(n, str) for n in cascade):
        with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
            Policy.from_toml(_toml_list(cascade))  # type: ignore[arg-type]


def test_user_steps_must_be_placed_and_named_apart() -> None:
    without = [n for n in DEFAULT_CASCADE if n != "steps"]
    assert Policy(cascade=tuple(without)).cascade == tuple(without)  # no steps: fine
    with pytest.raises(ConfigError, match="'drop_tagged' are not placed"):
        Policy.from_toml(_toml_list(without) + _DROP)
    twins = (DropTagged("a"), DropTagged("b"))
    assert Policy(steps=twins).steps == twins  # twins under "steps": fine
    with pytest.raises(ConfigError, match="2 of the policy's steps are named 'drop_tagged'"):
        Policy(steps=twins, cascade=("drop_tagged", *DEFAULT_CASCADE))
    with pytest.raises(ConfigError, match="must be a list of step names"):
        Policy.from_toml('cascade = "layers"\n')


def test_explain_shows_the_cascade(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["explain", "--example"])
    assert done.exit_code == 0, done.output
    flat = " ".join(done.output.split())
    assert "cascade: tool_pins (off) → layers → window → truncate → mask" in flat
    assert "fit → priority → layout → tool_rules (off)" in flat
    policy = tmp_path / "p.toml"
    order = ["drop_tagged" if n == "steps" else n for n in DEFAULT_CASCADE]
    policy.write_text(_toml_list(order) + "mask = false\n" + _DROP, encoding="utf-8")
    done = CliRunner().invoke(app, ["explain", "--example", "--policy", str(policy)])
    assert done.exit_code == 0, done.output
    assert "truncate → mask (off) → drop_tagged → recall" in " ".join(done.output.split())
