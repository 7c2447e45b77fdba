"""The policy: the budget and the cascade of strategies, as data (R9, R10).

A :class:`Policy` is a frozen dataclass that loads from TOML::

    max_input_tokens = 8000        # or: response_reserve = 4096 (window minus reserve)

    [truncate]                     # false disables a step: truncate = false
    threshold_tokens = 500
    target_tokens = 300
    cut_values_tokens = 120        # list the ids, dates, amounts the cut removed (0: off)
    newest_whole = true            # results not answered yet: whole while they fit
    cutters = { csv = "mypackage.cuts:cut_csv" }   # a kind of your own (ctxwarden.cutters)

    [mask]
    keep_last = 3
    batch_tokens = 1000

    [window]
    pin_first = 2                  # pin the first N non-system messages
    max_messages = 200
    refill_ratio = 0.75            # when the window must move, refill to 75% of its room
                                   # (the low-water mark of a compaction)

    [ledger]
    max_tokens = 600               # or free_share of what is free, when more
    free_share = 0.25
    lookback = 1000                # a cold build reads values this many messages back
    lookback_budgets = 3.0         # and at most 3 budgets' worth of text (default: no bound)

    [recall]                       # relevance recall of left-out history: always on
    share = 0.1                    # of the budget, at most max_tokens
    max_tokens = 800               # (default: auto = true, where the conversation asks)

    recall_tool = true             # ctxwarden serve offers the recall tool and answers it

    # the order the steps run in (the default; ctxwarden.pipeline.cascade): every built-in
    # name once, "steps" where your own [[steps]] run (or one of them by its name)
    cascade = ["tool_pins", "layers", "window", "truncate", "mask", "steps", "recall",
               "fit", "priority", "layout", "tool_rules"]

    [cache]                        # cache-aware compaction (ctxwarden.pipeline.compaction)
    append_only = true             # between compactions nothing already sent changes
    prices = "cautious"            # weigh rewrites at the model's cache prices or
                                   # Anthropic's, whichever makes writing dearer
    hold_layers = true             # hold the facts and summary blocks too (default: yes)
    early_compaction = true        # also compact before it must when held-back masks
                                   # and cuts pay for the rewrite (false: no second build)

    [[steps]]                      # your own step, after masking (ctxwarden.pipeline.cascade)
    use = "mypackage.steps:DropTagged"
    tag = "debug"

    [tools.get_order]              # per-tool rules (steps.tool_rules); "*": every tool
    mask = false                   # never masked; keep_last = N: this tool's own depth
    truncate = "json"              # cut as this kind (false: never cut; a kind of
                                   # [truncate.cutters] too, ctxwarden.cutters); pin = true;
    clear_inputs = true            # a masked result's call loses its arguments too

    [summary]                      # used when a summarizer is given
    max_messages = 30              # seed 000: summarise at 30, keep the last 15
    keep_recent = 15
    fill_ratio = 0.6               # seed 004: or when the budget is 60% full

The cascade runs cheapest first (seed 000), as the ``cascade`` list orders it: pin the
results a tool's rule pins, add the summary and facts layers, slide the window (pinned
messages kept), truncate tool results, mask old observations, run your own steps, recall
relevant left-out history, fit the window to the budget with the entity ledger, as a last
resort evict by priority, lay the context out, and warn of a tool rule the budget broke.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ctxwarden.core.errors import ConfigError
from ctxwarden.cutters.by_kind import CUTTERS
from ctxwarden.memory.summaries import SummaryTrigger
from ctxwarden.pipeline.cascade import DEFAULT_CASCADE, check_cascade, load_step
from ctxwarden.pipeline.compaction import CacheConfig
from ctxwarden.steps.mask import MaskObservations
from ctxwarden.steps.recall_relevant import RecallRelevant
from ctxwarden.steps.tool_rules import ToolRules
from ctxwarden.steps.truncate import TruncateToolResults

__all__ = ["LedgerConfig", "Policy", "WindowConfig"]


@dataclass(frozen=True)
class WindowConfig:
    """The sliding window (R6).

    ``refill_ratio``: when the window has to move, it moves far enough to fill only this
    share of its room, so the next turns append without moving it again; consecutive
    requests then share a byte-identical prefix that provider caches reuse.

    ``task_share`` (default 0: off): keep the agent run's task — the first user message,
    when the model answered it with a tool call — in every build, cut to this share of
    the budget once the window moves (:mod:`ctxwarden.steps.task`; 0.0625 is 1/16). Off
    by default while it costs the coding runs at 8,000 tokens 70.0% of the full history
    with caching, against the 70% the cache-cost issue asks (retention 98.46% -> 98.61%,
    the task in every build instead of 69%; docs/benchmarks.md).
    """

    max_messages: int | None = None
    pin_first: int = 0
    refill_ratio: float = 0.5
    task_share: float = 0.0

    def __post_init__(self) -> None:
        if self.max_messages is not None and self.max_messages < 1:
            raise ConfigError(f"window.max_messages must be >= 1, got {self.max_messages}")
        if self.pin_first < 0:
            raise ConfigError(f"window.pin_first must be >= 0, got {self.pin_first}")
        if not 0.1 <= self.refill_ratio <= 1.0:
            raise ConfigError(f"window.refill_ratio must be in [0.1, 1], got {self.refill_ratio}")
        if not 0.0 <= self.task_share <= 1.0:
            raise ConfigError(f"window.task_share must be in [0, 1], got {self.task_share}")


@dataclass(frozen=True)
class LedgerConfig:
    """The entity ledger: values from messages that left the context, kept compactly.

    Its size is at most ``max_tokens``, or ``free_share`` of what the budget leaves after
    the system prompt and layers when that is more, and never over ``max_share`` of it:
    a larger budget keeps more of the values that left the window (swebench-mini dev,
    needed-later tokens, 4,000 / 8,000 tokens: 94.4% / 97.7% with a fixed 600, 95.1% /
    98.5% with a quarter of what is free). ``max_share`` is 0.9: when the system prompt
    leaves little, the ledger (dense values) is worth more than older verbatim turns —
    the newest turn is kept apart from it (tau-bench dev, every argument value, 1,600 /
    2,000 tokens, with the ranking of :mod:`~ctxwarden.memory.entity_rank`: 97.0% /
    99.6% at 0.8, 97.3% / 99.6% at 0.9 and at 1.0; reduction at 1,600 51.15%, 51.02%,
    50.94%, the plain window's 50.76%).

    A cold build (no ``previous``) of a long history reads the values of at most
    ``lookback`` messages before its window (``None``: all of them), so restarting on
    10,000 messages does not extract entities from all 10,000; a build with ``previous``
    keeps where its ledger began, so an agent loop loses nothing.

    ``lookback_budgets`` (default ``None``: no bound) also bounds that read by its text,
    newest first: no more than that many budgets hold at four characters a token, never
    under 24,000 characters (3.0: 24,000 at a 2,000-token budget; the message crossing it
    is read whole). Extraction costs about its text's length, so it makes a cold build
    O(budget) on a history of long tool results — a stateless replica's first build of
    a session it has not seen: 10,000 messages of agent traffic ~137 -> ~30 ms — but the
    ledger then holds fewer of the values the user stated long ago (that traffic, 1,000
    messages: 43 of 185 in the context instead of 118), so it is a choice, not the
    default. The recorded dev traces (tau-bench, swebench-mini) build the same either way.
    Both bound what lies *before* the window: an agent run whose one request is the
    newest user message keeps its window's start there, so a cold build of such a run
    reads the values of every message it drops after it.
    """

    enabled: bool = True
    max_tokens: int = 600
    max_share: float = 0.9
    free_share: float = 0.25
    lookback: int | None = 1000
    lookback_budgets: float | None = None

    def __post_init__(self) -> None:
        if self.lookback is not None and self.lookback < 0:
            raise ConfigError(f"ledger.lookback must be >= 0 (None: no bound), got {self.lookback}")
        if self.lookback_budgets is not None and not self.lookback_budgets >= 0:
            raise ConfigError(
                "ledger.lookback_budgets must be >= 0 (None: no bound), "
                f"got {self.lookback_budgets}"
            )
        if self.max_tokens < 0:
            raise ConfigError(f"ledger.max_tokens must be >= 0, got {self.max_tokens}")
        if not 0.0 <= self.max_share <= 1.0:
            raise ConfigError(f"ledger.max_share must be in [0, 1], got {self.max_share}")
        if not 0.0 <= self.free_share <= 1.0:
            raise ConfigError(f"ledger.free_share must be in [0, 1], got {self.free_share}")


@dataclass(frozen=True)
class Policy:
    """Budget and cascade. ``None`` for a strategy disables that step."""

    max_input_tokens: int | None = None
    response_reserve: int = 4096
    truncate: TruncateToolResults | None = field(default_factory=TruncateToolResults)
    mask: MaskObservations | None = field(default_factory=MaskObservations)
    window: WindowConfig = field(default_factory=WindowConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    summary: SummaryTrigger = field(default_factory=SummaryTrigger)
    # relevance recall (steps.recall): by default the conversation decides (steps.recall_gate)
    recall: RecallRelevant | None = field(default_factory=lambda: RecallRelevant(auto=True))
    recall_tool: bool = False  # the proxy offers the recall tool and answers its calls
    cache_breakpoints: bool = True
    steps: tuple[Any, ...] = ()  # your own steps (see ctxwarden.pipeline.cascade)
    cascade: tuple[str, ...] = DEFAULT_CASCADE  # the steps' order (pipeline.cascade)
    tools: ToolRules = field(default_factory=ToolRules)  # [tools.NAME] (steps.tool_rules)
    cache: CacheConfig = field(default_factory=CacheConfig)  # cache-aware compaction

    def __post_init__(self) -> None:
        if not isinstance(self.tools, ToolRules):  # a mapping of names to rules, checked
            rules: Any = self.tools
            object.__setattr__(self, "tools", ToolRules(rules or ()))
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            raise ConfigError(f"max_input_tokens must be >= 1, got {self.max_input_tokens}")
        if self.response_reserve < 0:
            raise ConfigError(f"response_reserve must be >= 0, got {self.response_reserve}")
        # a tool's truncate = "kind" names a kind the truncation step has a cutter for
        self.tools.check_kinds(self.truncate.kinds if self.truncate is not None else CUTTERS)
        object.__setattr__(self, "steps", tuple(self.steps))
        # the steps and their order: a ConfigError now, not at the first build
        object.__setattr__(self, "cascade", check_cascade(self.cascade, self.steps))

    def budget_for(self, context_window: int | None, max_input_tokens: int | None = None) -> int:
        """The input budget: explicit, else the model's window minus the response reserve."""
        if max_input_tokens is not None:
            if max_input_tokens < 1:
                raise ConfigError(f"max_input_tokens must be >= 1, got {max_input_tokens}")
            return max_input_tokens
        if self.max_input_tokens is not None:
            return self.max_input_tokens
        if context_window is None:
            raise ConfigError("no budget: pass max_input_tokens, or use a model the registry knows")
        return max(context_window - self.response_reserve, 1)

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "policy") -> Policy:
        """Build a policy from a dict (parsed TOML); unknown keys are errors."""
        sections: dict[str, type[Any]] = {
            "truncate": TruncateToolResults,
            "mask": MaskObservations,
            "window": WindowConfig,
            "ledger": LedgerConfig,
            "summary": SummaryTrigger,
            "recall": RecallRelevant,
            "cache": CacheConfig,
        }
        top = {f.name for f in fields(cls)} - set(sections)
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key == "steps":
                if not isinstance(value, list):
                    raise ConfigError(f"{source}: steps must be an array of [[steps]] tables")
                kwargs["steps"] = tuple(load_step(s, source) for s in value)
            elif key == "tools":
                kwargs["tools"] = ToolRules.from_dict(value, source)
            elif key in sections:
                kwargs[key] = _section(sections[key], key, value, source)
            elif key in top:
                kwargs[key] = value
            else:
                known = ", ".join(sorted(top | set(sections)))
                raise ConfigError(f"{source}: unknown key {key!r} (known: {known})")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_toml(cls, path_or_text: str | Path) -> Policy:
        """Load from a TOML file path or TOML text."""
        path = Path(path_or_text) if not str(path_or_text).lstrip().startswith(("[", "#")) else None
        source = "policy"
        try:
            if path is not None and "\n" not in str(path_or_text) and path.exists():
                source = str(path)
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            elif isinstance(path_or_text, Path):
                raise ConfigError(f"policy file not found: {path_or_text}")
            else:
                data = tomllib.loads(str(path_or_text))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
        return cls.from_dict(data, source=source)

    def with_budget(self, max_input_tokens: int) -> Policy:
        return replace(self, max_input_tokens=max_input_tokens)


def _section(kind: type[Any], key: str, value: Any, source: str) -> Any:
    if value is False:
        if kind in (TruncateToolResults, MaskObservations, RecallRelevant):
            return None
        raise ConfigError(f"{source}: [{key}] cannot be disabled")
    if value is True:
        return kind()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: [{key}] must be a table or true/false")
    names = {f.name for f in fields(kind) if f.init and not f.name.startswith("_")}
    names -= {"name", "count_text"}
    unknown = set(value) - names
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) in [{key}]: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(names))})"
        )
    try:
        return kind(**value)
    except TypeError as exc:
        raise ConfigError(f"{source}: [{key}]: {exc}") from None
