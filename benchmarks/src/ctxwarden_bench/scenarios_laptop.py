"""Scenario laptop-shop (seed 003): a 21-turn shop chat, four seed strategies and ours.

A shop assistant with the seed's two catalogue tools (``get_products``: names and short
summaries; ``get_product_details``: the full JSON of one laptop) answers the seed's 21
questions, translated from Polish in their order and intent. The user states a budget
and a use in turn 2 (the seed's dialogue leaves them implicit; the facts layer is
checked on them). A deterministic scripted agent picks the tool calls each question
needs from the question and the catalogue, and answers from the tool results, so every
run produces the same history, byte for byte.

One request is measured per turn: the one that produces the turn's answer, sent after
the turn's tool results arrived (the seed's per-interaction input tokens). Strategies map
the full history so far to the messages sent, as the seed's agent does:

* ``Basic``: the full history.
* ``OMasking``: every tool result of earlier turns replaced by the seed's placeholder.
* ``Summarization``: after every 10th user turn the history is replaced by the system
  prompt and a user message "Summary of the conversation so far: ..." (rolling: the
  next summary merges the previous one).
* ``OMask+Summ``: both, masking first, as the seed does.
* ``ctxwarden``: :func:`ctxwarden.pipeline.policy.build_context` with the default policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ctxwarden.core.errors import ConfigError, InvalidMessageError
from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden.pipeline.policy import Policy
from ctxwarden.steps.truncate import TruncateToolResults
from ctxwarden_bench.metrics import OursStrategy, price_strategy, reduction_table
from ctxwarden_bench.summarizers import Account, BenchSummarizer, SummarizerSpec, summarizer_for

__all__ = [
    "MASK",
    "QUESTIONS",
    "SYSTEM_PROMPT",
    "TOOLS",
    "catalogue",
    "get_product_details",
    "get_products",
    "laptop_agent",
    "run_laptop",
    "run_tool",
    "scripted_turns",
]

MASK = "[TOOL_OBSERVATION_MASKED]"

SYSTEM_PROMPT = (
    "You are a shop assistant that recommends products from our catalog.\n"
    "Use the Products plugin (GetProducts, GetProductDetails) to read real catalog data "
    "before suggesting items.\nDo not invent products, prices, or stock. If nothing "
    "matches, say so clearly.\nMatch the user's language in your replies."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_products",
            "description": (
                "Get all products from shop. Returns only product names and short summaries."
            ),
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_product_details",
            "description": "Get full detailed description of a product by its name.",
            "parameters": {
                "type": "object",
                "properties": {
                    "product_name": {
                        "type": "string",
                        "description": "Product name, e.g. Laptop Pro 14",
                    }
                },
                "required": ["product_name"],
            },
        },
    },
]

BUDGET_USD = 1500
USE = "mobile programming (coding on the go)"

QUESTIONS: tuple[str, ...] = (
    "List all products in the catalogue with a short description of each.",
    f"I'm looking for a laptop: my use is {USE} and my budget is at most ${BUDGET_USD:,}. "
    "What do you recommend and why?",
    "I need something for gaming. Which model makes sense and what are its key specs?",
    "Compare the Laptop Pro 14 with the DevBook 15 from a developer's point of view "
    "(.NET, Visual Studio / VS Code).",
    "What is the exact technical description of the Creator Studio 16? List the specs and uses.",
    "And the Campus Note 14: who is it for and how does it differ from the BalanceBook 14?",
    "UltraLite 13 vs Silent Lite 13: which one is lighter or more mobile according to the "
    "catalogue?",
    "Give me the details of the Gaming Max 17: CPU, RAM, screen and weight if they are listed.",
    "Do you have anything below 14 inches? List the catalogue models that fit.",
    "Suggest a set: a laptop for university studies, with one sentence of justification per model.",
    "Back to the Laptop Pro 14: repeat its main advantages and limitations from the description.",
    "Silent Lite 13: the full description with details; I care about the battery and the display.",
    "DevBook 15: details from the catalogue. Which workloads is it suited for and which not?",
    "Does any laptop clearly focus on silence or mobility in its description? Which one and why?",
    "I need something for photo/video (a creator workflow). What do you pick from the "
    "catalogue and why?",
    "BalanceBook 14: the full product details from the catalogue.",
    "Again the list of all product names, but names only, on one line, no descriptions.",
    "Campus Note 14: the technical details and who it is for according to the long description.",
    "If budget were no object, which single 'universal' laptop would you recommend and why?",
    "Briefly compare three models: Gaming Max 17, Creator Studio 16 and Laptop Pro 14 — "
    "which is for whom.",
    "Summarise our whole conversation: which models did I consider and what do you finally "
    "recommend?",
)

# The tool plan of each question: list the catalogue first?, then which products to open.
# Names come from the question, or from the catalogue by a rule (see _pick).
_PLANS: tuple[tuple[bool, str | tuple[str, ...]], ...] = (
    (True, ()),
    (True, "budget-use"),
    (True, "gaming"),
    (False, ("Laptop Pro 14", "DevBook 15")),
    (False, ("Creator Studio 16",)),
    (False, ("Campus Note 14", "BalanceBook 14")),
    (False, ("UltraLite 13", "Silent Lite 13")),
    (False, ("Gaming Max 17",)),
    (True, "small"),
    (True, "study"),
    (False, ("Laptop Pro 14",)),
    (False, ("Silent Lite 13",)),
    (False, ("DevBook 15",)),
    (True, "quiet-mobile"),
    (True, "creator"),
    (False, ("BalanceBook 14",)),
    (True, ()),
    (False, ("Campus Note 14",)),
    (True, "universal"),
    (False, ("Gaming Max 17", "Creator Studio 16", "Laptop Pro 14")),
    (False, ()),
)


@cache
def catalogue() -> tuple[Mapping[str, Any], ...]:
    """The laptops shipped as package data (``bench/data/laptops.json``)."""
    text = resources.files("ctxwarden_bench").joinpath("data/laptops.json").read_text("utf-8")
    return tuple(json.loads(text))


def get_products() -> str:
    """Tool: every product's name and short summary, as the seed's GetProducts returns."""
    return json.dumps(
        [{"name": p["name"], "short_summary": p["short_summary"]} for p in catalogue()],
        ensure_ascii=False,
    )


def get_product_details(product_name: str) -> str:
    """Tool: the full JSON of one product (case-insensitive name), or a not-found note."""
    for p in catalogue():
        if p["name"].lower() == product_name.strip().lower():
            return json.dumps(p, ensure_ascii=False)
    return json.dumps({"error": f"Product '{product_name}' not found."})


def _size(name: str) -> int:
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match else 0


def _pick(rule: str) -> tuple[str, ...]:
    """Which products the agent opens for a rule-based question (from catalogue data)."""
    items = catalogue()

    def uses(p: Mapping[str, Any], *words: str) -> bool:
        text = " ".join(p["best_for"]).lower()
        return any(w in text for w in words)

    if rule == "budget-use":
        fits = [
            p for p in items if p["price_usd"] <= BUDGET_USD and uses(p, "development", "mobile")
        ]
        fits.sort(key=lambda p: (-p["ram_gb"], p["weight_kg"]))
        return tuple(p["name"] for p in fits[:2])
    if rule == "gaming":
        return tuple(p["name"] for p in items if uses(p, "gaming"))[:1]
    if rule == "small":
        return tuple(p["name"] for p in items if _size(p["name"]) < 14)
    if rule == "study":
        fits = [p for p in items if uses(p, "studies", "university")]
        return tuple(p["name"] for p in sorted(fits, key=lambda p: p["price_usd"]))[:2]
    if rule == "quiet-mobile":
        fits = [p for p in items if uses(p, "quiet", "mobile work", "frequent travel")]
        return tuple(p["name"] for p in sorted(fits, key=lambda p: p["weight_kg"]))[:2]
    if rule == "creator":
        return tuple(p["name"] for p in items if uses(p, "video editing"))[:1]
    if rule == "universal":
        return ("Laptop Pro 14",)
    raise InvalidMessageError(f"unknown tool plan rule {rule!r}")


def _answer(turn: int, opened: Sequence[Mapping[str, Any]], considered: Sequence[str]) -> str:
    """The scripted reply: built only from the tool results of this turn."""
    if turn == 21:
        return (
            f"You told me you need a laptop for {USE} with a budget of at most "
            f"${BUDGET_USD:,}. We looked at: {', '.join(considered)}. My final recommendation "
            "is the Laptop Pro 14: it fits your budget, is light enough to carry daily and "
            "has the memory for development work."
        )
    if not opened:
        names = [p["name"] for p in catalogue()]
        if turn == 17:
            return ", ".join(names)
        return "Here is our catalogue:\n" + "\n".join(
            f"- {p['name']}: {p['short_summary']}" for p in catalogue()
        )
    parts = []
    for p in opened:
        parts.append(
            f"{p['name']} (${p['price_usd']:,}, {'in stock' if p['in_stock'] else 'sold out'}): "
            f"{p['cpu']}, {p['ram_gb']} GB RAM, {p['storage']}, {p['display']}, "
            f"{p['weight_kg']} kg, about {p['battery_hours']} h of battery. "
            f"Best for {', '.join(p['best_for'][:3])}; keep in mind: {p['limitations'][0]}."
        )
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Turn:
    """One turn: the messages it appended (user, tool steps, answer)."""

    number: int
    question: Message
    tool_steps: tuple[Message, ...]
    answer: Message


def scripted_turns(questions: Sequence[str] = QUESTIONS) -> list[Turn]:
    """Run the scripted agent over ``questions`` (the seed's 21 by default)."""
    turns: list[Turn] = []
    considered: list[str] = []
    call_no = 0
    for number, question in enumerate(questions, start=1):
        list_first, plan = _PLANS[(number - 1) % len(_PLANS)]
        names = _pick(plan) if isinstance(plan, str) else plan
        steps: list[Message] = []
        if list_first:
            call_no += 1
            call = ToolCall(f"call_{call_no:03d}", "get_products", "{}")
            steps += [
                Message.assistant(None, (call,), id=f"t{number}-list"),
                Message.tool(get_products(), call.id, name="get_products", id=f"t{number}-list-r"),
            ]
        if names:
            calls = []
            for name in names:
                call_no += 1
                calls.append(
                    ToolCall(
                        f"call_{call_no:03d}",
                        "get_product_details",
                        json.dumps({"product_name": name}),
                    )
                )
            steps.append(Message.assistant(None, tuple(calls), id=f"t{number}-details"))
            steps += [
                Message.tool(
                    get_product_details(name),
                    c.id,
                    name="get_product_details",
                    id=f"t{number}-r{i}",
                )
                for i, (c, name) in enumerate(zip(calls, names, strict=True))
            ]
        opened = [json.loads(get_product_details(n)) for n in names]
        considered.extend(n for n in names if n not in considered)
        turns.append(
            Turn(
                number,
                Message.user(question, id=f"t{number}-q"),
                tuple(steps),
                Message.assistant(_answer(number, opened, considered), id=f"t{number}-a"),
            )
        )
    return turns


Strategy = Callable[[Sequence[Message]], list[Message]]
FACTS_SCHEMA = {
    "type": "object",
    "properties": {"budget": {"type": "string"}, "use": {"type": "string"}},
}
TABLE_TURNS = (1, 10, 11, 20, 21)


def _mask_before(history: Sequence[Message], start: int) -> list[Message]:
    """The seed's masking: every tool result before ``start`` becomes the placeholder."""
    return [
        m.with_content(MASK) if i < start and m.role == "tool" else m for i, m in enumerate(history)
    ]


def _current_turn_start(history: Sequence[Message]) -> int:
    users = [i for i, m in enumerate(history) if m.role == "user"]
    return users[-1] if users else 0


class SeedStrategy:
    """The seed's hand-written strategies: masking, summarising every N user turns, both.

    Summaries happen after the answer of every ``every``-th user turn and replace the
    history with the system prompt and a user message holding the summary, as the seed's
    ``SummarizeChatAsync`` does; the next summary is given the previous one (rolling).
    A failed summary leaves the history whole (counted in :attr:`account`).
    """

    def __init__(
        self, mask: bool, summarize: bool, summarizer: BenchSummarizer, every: int = 10
    ) -> None:
        self.mask, self.summarize, self.summarizer, self.every = mask, summarize, summarizer, every
        self.summary: str | None = None
        self.cut = 0  # history index where the unsummarised part starts
        self.account = Account()

    def after_turn(self, history: Sequence[Message], counter: TokenCounter) -> None:
        """Called once a turn's answer is in the history (the seed summarises then).

        Like the seed, it counts the user messages of the chat history it holds, and
        the summary message is one of them: after the first summary at turn 10 the
        next fires at turn 19.
        """
        users = sum(1 for m in self(history) if m.role == "user")
        if not self.summarize or users % self.every:
            return
        part = list(history[self.cut :])
        if self.mask:
            part = _mask_before(part, len(part))
        call = self.summarizer.summarize(part, self.summary, counter)
        self.account.add(call.usage, call.error)
        if call.text is not None:
            self.summary, self.cut = call.text, len(history)

    def __call__(self, history: Sequence[Message]) -> list[Message]:
        head: list[Message] = [history[0]]
        if self.summary is not None:
            head.append(
                Message.user("Summary of the conversation so far:\n" + self.summary, id="summary")
            )
        live = list(history[max(self.cut, 1) :])
        if self.mask:
            live = _mask_before(live, _current_turn_start(live))
        return head + live


def run_tool(call: ToolCall) -> str:
    """Run one of the catalogue tools for a real agent; a bad call gets an error result
    the model can read (as a shop backend would answer), never an exception."""
    if call.name == "get_products":
        return get_products()
    if call.name == "get_product_details":
        name = call.parsed_arguments().get("product_name")
        if isinstance(name, str) and name.strip():
            return get_product_details(name)
        return json.dumps({"error": "get_product_details needs a 'product_name' string."})
    known = ", ".join(t["function"]["name"] for t in TOOLS)
    return json.dumps({"error": f"Unknown tool '{call.name}'. The tools are: {known}."})


SEED_POLICY = Policy(truncate=TruncateToolResults(newest_whole=False))
"""The seed's experiment keeps its own setting: every tool result over the threshold is
cut at once, the newest too (the default keeps a result the model has not answered yet
whole while it fits: issue 35), so its per-turn token figures stay the seed's."""


def _strategies(
    model: str, summarizer: BenchSummarizer, ours_budget: int, every: int
) -> dict[str, Strategy]:
    """Fresh strategy objects (they hold state) for one run."""
    return {
        "Basic": list,
        "OMasking": SeedStrategy(True, False, summarizer, every),
        "Summarization": SeedStrategy(False, True, summarizer, every),
        "OMask+Summ": SeedStrategy(True, True, summarizer, every),
        "ctxwarden": OursStrategy(
            model,
            ours_budget,
            schema=FACTS_SCHEMA,
            tools=TOOLS,
            summarizer=summarizer,
            policy=SEED_POLICY,
        ),
    }


def _play_scripted(
    strategies: Mapping[str, Strategy],
    questions: Sequence[str],
    counter: TokenCounter,
    progress: Callable[[str], None] | None,
) -> dict[str, list[list[Message]]]:
    """The scripted agent's one history, mapped by every strategy at every turn."""
    sent: dict[str, list[list[Message]]] = {name: [] for name in strategies}
    history: list[Message] = [Message.system(SYSTEM_PROMPT, id="system")]
    for turn in scripted_turns(questions):
        history += [turn.question, *turn.tool_steps]
        for name, strategy in strategies.items():
            sent[name].append(strategy(history))
        history.append(turn.answer)
        for strategy in strategies.values():
            if isinstance(strategy, SeedStrategy):
                strategy.after_turn(history, counter)
        if progress:
            progress(f"laptop-shop turn {turn.number}")
    return sent


def _play_real(
    agent: Any,
    strategies: Mapping[str, Strategy],
    questions: Sequence[str],
    counter: TokenCounter,
    progress: Callable[[str], None] | None,
) -> tuple[dict[str, list[list[Message]]], dict[str, dict[str, Any]]]:
    """Each strategy's own conversation with the real agent (see :mod:`.real_agent`)."""
    from ctxwarden.core.registry.cost import estimate_cost
    from ctxwarden_bench.summarizers import registry_price

    priced_as, _ = registry_price(agent.model)
    sent: dict[str, list[list[Message]]] = {}
    extra: dict[str, dict[str, Any]] = {}
    for name, strategy in strategies.items():

        def after(history: Sequence[Message], s: Strategy = strategy) -> None:
            if isinstance(s, SeedStrategy):
                s.after_turn(history, counter)

        talk = agent.converse(
            name,
            strategy,
            Message.system(SYSTEM_PROMPT, id="system"),
            questions,
            counter,
            after_turn=after,
            progress=progress,
        )
        sent[name] = talk.contexts
        extra[name] = talk.to_json()
        extra[name]["agent_cost_usd"] = (
            round(estimate_cost(talk.usage, priced_as), 6) if priced_as else None
        )
    return sent, extra


def laptop_agent(agent_model: Any) -> Any:
    """The real shop agent for a spec or client (a ready ToolAgent as is; None: scripted)."""
    from ctxwarden_bench.real_agent import ToolAgent

    if agent_model is None or isinstance(agent_model, ToolAgent):
        return agent_model
    return ToolAgent(agent_model, TOOLS, run_tool)


def run_laptop(
    *,
    model: str = "gpt-4o",
    summarizer: SummarizerSpec = "offline",
    ours_budget: int = 2000,
    turns: int | None = None,
    summarize_every: int = 10,
    agent_model: Any = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Play the turns under every strategy; tokens per turn, the seed's table, checks.

    ``turns`` plays the first N of the seed's 21 questions; ``summarize_every`` is the
    seed strategies' summary period in user turns (the seed's 10). ``agent_model`` (a
    spec, an OpenAI-compatible client or a :class:`~.real_agent.ToolAgent`) replaces
    the scripted agent with a real one; each strategy then talks to it separately.
    """
    if turns is not None and not 1 <= turns <= len(QUESTIONS):
        raise ConfigError(f"turns must be between 1 and {len(QUESTIONS)}, got {turns}")
    if summarize_every < 1:
        raise ConfigError(f"summarize_every must be at least 1, got {summarize_every}")
    questions = QUESTIONS[:turns] if turns else QUESTIONS
    counter = TokenCounter.for_model(model)
    agent = laptop_agent(agent_model)
    try:
        with summarizer_for(summarizer) as summ:
            strategies = _strategies(model, summ, ours_budget, summarize_every)
            if agent is None:
                sent = _play_scripted(strategies, questions, counter, progress)
                extra: dict[str, dict[str, Any]] = {name: {} for name in strategies}
            else:
                sent, extra = _play_real(agent, strategies, questions, counter, progress)
            runs = {
                name: price_strategy(
                    name,
                    contexts,
                    counter,
                    model,
                    summ,
                    strategies[name],
                    tools=TOOLS,
                    extra=extra[name],
                )
                for name, contexts in sent.items()
            }
            described = summ.describe()
    finally:
        if agent is not None and agent is not agent_model:
            agent.close()
    series = {name: run.input_tokens_per_turn for name, run in runs.items()}
    ours = strategies["ctxwarden"]
    assert isinstance(ours, OursStrategy)
    facts_kept = [_holds_budget_and_use(ctx, n) for n, ctx in enumerate(sent["ctxwarden"], start=1)]
    audit = ours.last.audit if ours.last is not None else None
    return {
        "description": f"Seed 003: a {len(questions)}-turn laptop-shop chat; input tokens of "
        "the request that answers each turn, exact gpt-4o counts including the tool "
        "definitions."
        + (
            f" The agent is {agent.name}: each strategy holds its own conversation with it."
            if agent is not None
            else ""
        ),
        "model": model,
        "summarizer": described["name"],
        "summarizer_pricing": described["pricing"],
        "agent": agent.name if agent is not None else "scripted",
        "turns": len(questions),
        "ours_budget": ours_budget,
        "runs": runs,
        "table": reduction_table(series, TABLE_TURNS, "Basic"),
        "facts": ours.facts.to_dict(),
        "facts_held_each_turn_from_2": all(facts_kept[1:]),
        "ours_layers_last_turn": dict(audit.layers) if audit else {},
    }


def _holds_budget_and_use(context: Sequence[Message], turn: int) -> bool:
    """From turn 2 on, the context (before the newest question) states budget and use."""
    if turn < 2:
        return True
    text = "\n".join(m.text for m in context[:-1] if m.role == "system")
    return f"{BUDGET_USD:,}" in text and USE in text
