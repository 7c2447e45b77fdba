"""Scenario agent-chat (seed 000): 50 rounds with heavy tool results, dollars per strategy.

A research-and-shopping assistant with five tools answers 50 user rounds. Tool results
are article-like (``read_article``, ``open_page``: about 1,800 tokens) or search-like
(``web_search``, ``product_search``, ``ticket_lookup``: about 600 tokens), 1.5 calls a
round on average, all generated deterministically from a seed out of sentence templates
(varied, readable text; no lorem ipsum). In rounds 1-3 the user states three facts the
agent needs to the end: a clothing size, a budget and a ticket number.

One request is measured per round: the one sent after the round's tool results. Strategies
follow the seed's ladder, each adding one layer: none; window 8; window 20; window 20
with the first 3 messages pinned; + rolling summary (seed's 30 / 15 trigger); +
tool-result truncation (articles to 800 characters, other results to 500); full
three-tier (+ critical facts, one extraction call per summary cycle); and ctxwarden's
engine. Dollars use the registry's Claude Sonnet price (the seed's model); summary and
fact-extraction calls are priced as Sonnet calls too. The effective cost prices the
longest common prefix shared with the previous request as cache reads.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from ctxwarden.core.messages import Message, ToolCall
from ctxwarden.core.registry.usage import Usage
from ctxwarden.core.tokens.counter import TokenCounter
from ctxwarden_bench.metrics import OursStrategy, price_strategy
from ctxwarden_bench.scenarios_laptop import SEED_POLICY
from ctxwarden_bench.summarizers import Account, BenchSummarizer, SummarizerSpec, summarizer_for

__all__ = ["PLANTED", "TOOLS", "generate_rounds", "run_agent_chat"]

MODEL = "claude-sonnet-4-5"
ROUNDS = 50

PLANTED: dict[str, tuple[str, str]] = {
    # fact -> (what the user says, a pattern the context must match)
    "size": ("By the way, I wear size L in jackets.", r"\bsize\W{1,3}(?:is\s+)?L\b"),
    "budget": ("My budget is 3,000 UAH for the whole order.", r"3,000 UAH"),
    "ticket": ("My support ticket number is TCK-48213.", r"TCK-48213"),
}

_TOPICS = (
    "waterproof hiking jackets",
    "merino base layers",
    "trail running shoes",
    "down parkas",
    "softshell trousers",
    "rain shells for cycling",
    "insulated gloves",
    "winter boots",
    "travel backpacks",
    "fleece mid-layers",
    "ski goggles",
    "thermal socks",
)
_MATERIALS = (
    "Gore-Tex",
    "eVent",
    "recycled nylon",
    "merino wool",
    "Polartec fleece",
    "goose down",
    "PrimaLoft",
    "ripstop polyester",
    "Cordura",
    "softshell laminate",
)
_BRANDS = (
    "Northline",
    "Karpaty Gear",
    "Fjellstad",
    "Altura Outdoor",
    "Blue Ridge Co.",
    "Sirocco",
    "Hoverla Works",
    "Tundra Peak",
    "Kestrel",
    "Marmota",
)
_CITIES = ("Kyiv", "Lviv", "Kraków", "Vienna", "Oslo", "Munich", "Tallinn", "Odesa")
_ARTICLE_SENTENCES = (
    "{brand} introduced its first {topic} in {year}, after testing prototypes in {city}.",
    "Most {topic} rely on {material}, which balances weight against durability.",
    "Independent tests in {year} measured a water column of {n},000 mm for the best models.",
    "Reviewers note that fit matters more than fabric when layering {topic}.",
    "The price range runs from about {n}00 to {m},{n}00 UAH, depending on the membrane.",
    "Retailers in {city} report that demand for {topic} doubles every October.",
    "A lighter shell saves {n}0 grams but usually gives up abrasion resistance.",
    "Care instructions recommend washing {material} at 30 degrees and reproofing twice a year.",
    "Sizing differs between brands: {brand} cuts slim, while others leave room for a fleece.",
    "Warranty terms for {topic} usually cover seams and zips for {n} years.",
    "The {year} standard EN 343 classifies rainwear by water resistance and breathability.",
    "Several makers moved production to recycled fibres, cutting emissions by {n}0 percent.",
    "Field reports from {city} praise {brand} for ventilation zips under the arms.",
    "Critics argue that marketing figures for breathability rarely match real use.",
)
_SEARCH_SNIPPETS = (
    "{brand} {topic} review: {n} models tested in {city}, with {material} coming out on top.",
    "Buyer's guide {year}: how to choose {topic} for a budget under {m},000 UAH.",
    "Forum thread: is {material} worth the price for everyday {topic}?",
    "Sale: {brand} cuts prices on {topic} by {n}0% until the end of the month.",
    "Size chart for {brand} {topic}, with measurements for chest, waist and sleeve.",
    "Comparison: {material} against the cheaper membranes after {n} seasons of use.",
)
_QUESTIONS = (
    "Can you find a good review of {topic}?",
    "What do people say about {brand} {topic}?",
    "Compare {material} with cheaper alternatives for {topic}.",
    "Are there any discounts on {topic} this week?",
    "Which {topic} would you pick for a trip to {city}?",
    "Check how {brand} sizes run compared with other brands.",
    "What is the status of my support request, and can you look for {topic} as well?",
)
_TOOL_DEFS: tuple[tuple[str, str, str], ...] = (
    (
        "read_article",
        "title",
        "Read a full encyclopedia-style article about a topic. Returns "
        "the article text (several paragraphs). Use for background and care instructions.",
    ),
    (
        "web_search",
        "query",
        "Search the web. Returns up to six results with title, url and a "
        "short snippet. Use for reviews, prices, discounts and opinions.",
    ),
    (
        "product_search",
        "query",
        "Search the shop's catalogue. Returns matching products with "
        "price, sizes in stock and rating. Respect the customer's size and budget.",
    ),
    (
        "ticket_lookup",
        "ticket",
        "Look up a support ticket by its number. Returns the ticket's "
        "status, history and the promised resolution date.",
    ),
    ("open_page", "url", "Open a web page returned by web_search and return its main text."),
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"The {arg} to use."}},
                "required": [arg],
            },
        },
    }
    for name, arg, desc in _TOOL_DEFS
]
_ARTICLE_TOOLS = ("read_article", "open_page")


class _Text:
    """Deterministic template filler: readable, varied, sized in tokens."""

    def __init__(self, rng: random.Random, counter: TokenCounter) -> None:
        self.rng, self.counter = rng, counter

    def fill(self, template: str, topic: str) -> str:
        r = self.rng
        return template.format(
            topic=topic,
            brand=r.choice(_BRANDS),
            material=r.choice(_MATERIALS),
            city=r.choice(_CITIES),
            year=r.randint(1998, 2025),
            n=r.randint(2, 9),
            m=r.randint(2, 9),
        )

    def article(self, topic: str, tokens: int) -> str:
        parts = [f"{topic.title()}\n"]
        size = self.counter.count_text(parts[0])
        while size < tokens:
            para = " ".join(self.fill(self.rng.choice(_ARTICLE_SENTENCES), topic) for _ in range(5))
            parts.append(para)
            size += self.counter.count_text(para) + 1
        return "\n\n".join(parts)

    def search(self, topic: str, tokens: int) -> str:
        lines, size, k = [], 0, 0
        while size < tokens:
            k += 1
            snippet = " ".join(
                self.fill(self.rng.choice(_SEARCH_SNIPPETS), topic) for _ in range(2)
            )
            slug = re.sub(r"\W+", "-", topic)
            line = f"{k}. {snippet.split(':')[0]}\n   https://example.org/{slug}/{k}\n   {snippet}"
            lines.append(line)
            size += self.counter.count_text(line) + 1
        return "\n".join(lines)


def _system_prompt() -> str:
    rules = [
        "You are a helpful assistant for an outdoor clothing shop and a careful researcher.",
        "Always respect the customer's size, budget and open support tickets.",
        "Use read_article for background, web_search for reviews and prices, product_search "
        "for what we sell, ticket_lookup for support requests and open_page to read a result.",
        "Quote prices in UAH, say when an item is out of stock, and never invent products.",
        "When results disagree, say so and explain which source you trust and why.",
        "Keep answers short: a recommendation, two reasons, and what to check before buying.",
    ]
    detail = (
        "Guideline {k}: before recommending {topic}, check the fit notes, the membrane, the "
        "care instructions and the warranty, and compare at least two brands."
    )
    rules += [detail.format(k=k, topic=t) for k, t in enumerate(_TOPICS, start=1)]
    return "\n".join(rules * 2)


def generate_rounds(seed: int = 7, rounds: int = ROUNDS, model: str = MODEL) -> list[list[Message]]:
    """The messages each round appends: user, tool call(s), results, answer."""
    rng = random.Random(seed)
    text = _Text(rng, TokenCounter.for_model(model))
    facts = [said for said, _ in PLANTED.values()]
    out: list[list[Message]] = []
    call_no = 0
    for r in range(1, rounds + 1):
        topic = rng.choice(_TOPICS)
        question = text.fill(rng.choice(_QUESTIONS), topic)
        if r <= len(facts):
            question = f"{facts[r - 1]} {question}"
        msgs = [Message.user(question, id=f"r{r}-u")]
        n_calls = 2 if rng.random() < 0.5 else 1
        calls, results = [], []
        for c in range(n_calls):
            call_no += 1
            name = rng.choice(
                _ARTICLE_TOOLS
                if c == 0 and rng.random() < 0.5
                else ("web_search", "product_search", "ticket_lookup")
            )
            arg = _TOOL_DEFS[[t[0] for t in _TOOL_DEFS].index(name)][1]
            call = ToolCall(f"toolu_{call_no:04d}", name, f'{{"{arg}": "{topic}"}}')
            body = text.article(topic, 1800) if name in _ARTICLE_TOOLS else text.search(topic, 600)
            calls.append(call)
            results.append(Message.tool(body, call.id, name=name, id=f"r{r}-t{c}"))
        msgs.append(Message.assistant(None, tuple(calls), id=f"r{r}-c"))
        msgs += results
        answer = " ".join(text.fill(rng.choice(_ARTICLE_SENTENCES), topic) for _ in range(6))
        msgs.append(Message.assistant(f"Here is what I found. {answer}", id=f"r{r}-a"))
        out.append(msgs)
    return out


def _truncated(m: Message) -> Message:
    """The seed's truncation: articles keep their first 800 characters, others 500."""
    limit = 800 if m.name in _ARTICLE_TOOLS else 500
    if m.role != "tool" or len(m.text) <= limit:
        return m
    return m.with_content(m.text[:limit] + f"...[truncated {len(m.text) - limit} chars]")


def _block_end(body: Sequence[Message], i: int) -> int:
    """Move ``i`` forward past tool results, so a slice never starts with an orphan."""
    while i < len(body) and body[i].role == "tool":
        i += 1
    return i


class LadderStrategy:
    """The seed's strategies as one configurable ladder (window, pinning, rolling summary
    with the 30 / 15 trigger, truncation, critical facts), layout as the seed draws it:
    system, summary, facts, pinned, window.

    A failed summary (or fact extraction) keeps the state it had: the window still
    holds the newest messages, nothing folded is dropped, and the next round tries
    again; :attr:`account` counts the failure."""

    def __init__(
        self,
        counter: TokenCounter,
        summarizer: BenchSummarizer,
        *,
        window: int | None = None,
        pin: int = 0,
        summary: bool = False,
        truncate: bool = False,
        facts: bool = False,
    ) -> None:
        from ctxwarden.memory.facts import Facts

        self.counter, self.summarizer = counter, summarizer
        self.window, self.pin, self.summary, self.truncate = window, pin, summary, truncate
        self.facts_on = facts
        self.facts = Facts()
        self.text: str | None = None
        self.cut = 0  # index in the body (history without the system prompt)
        self.account = Account()

    def _pinned_end(self, body: Sequence[Message]) -> int:
        return _block_end(body, min(self.pin, len(body))) if self.pin else 0

    def _maybe_summarize(self, body: Sequence[Message]) -> None:
        start = max(self.cut, self._pinned_end(body))
        live = len(body) - start
        if not self.summary or live <= 30:
            return
        users = [i for i, m in enumerate(body) if m.role == "user"]
        end = _block_end(body, min(len(body) - 15, users[-1]))
        fold = list(body[start:end])
        call = self.summarizer.summarize(fold, self.text, self.counter)
        self.account.add(call.usage, call.error)
        if call.text is None:
            return
        if self.facts_on:
            found = self.summarizer.extract(fold, self.facts)
            self.facts = found.facts
            self.account.add(
                found.usage
                if self.summarizer.real
                else Usage(  # what the extraction call would cost on a model
                    input_tokens=self.counter.count_messages(fold).tokens + 100,
                    output_tokens=self.counter.count_text(self.facts.render() or "{}"),
                ),
                found.error,
            )
        self.text, self.cut = call.text, end

    def __call__(self, history: Sequence[Message]) -> list[Message]:
        body = history[1:]
        self._maybe_summarize(body)
        pinned_end = self._pinned_end(body)
        start = max(self.cut, pinned_end)
        if self.window is not None:
            start = _block_end(body, max(start, len(body) - self.window))
        kept = list(body[:pinned_end]) + list(body[start:])
        if self.truncate:
            kept = [_truncated(m) for m in kept]
        head = [history[0]]
        if self.text:
            head.append(
                Message.system("Summary of the earlier conversation:\n" + self.text, id="s")
            )
        if self.facts_on and len(self.facts):
            head.append(Message.system(self.facts.render(), id="f"))
        return head + kept


def _facts_present(context: Sequence[Message], round_no: int) -> list[str]:
    """The planted facts already stated by ``round_no`` that this context lacks."""
    text = "\n".join(m.text for m in context)
    return [
        name
        for k, (name, (_, pattern)) in enumerate(PLANTED.items(), start=1)
        if k <= round_no and not re.search(pattern, text)
    ]


def run_agent_chat(
    *,
    model: str = MODEL,
    summarizer: SummarizerSpec = "offline",
    ours_budget: int = 6000,
    seed: int = 7,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Play ``rounds`` rounds (the seed's 50) under every strategy; dollars, cache,
    facts kept."""
    with summarizer_for(summarizer) as summ:
        return _run(model, summ, ours_budget, seed, rounds, progress)


def _run(
    model: str,
    summ: BenchSummarizer,
    ours_budget: int,
    seed: int,
    rounds: int,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    from ctxwarden.core.errors import ConfigError
    from ctxwarden.memory.summaries import SummaryTrigger

    if rounds < 1:
        raise ConfigError(f"rounds must be at least 1, got {rounds}")
    counter = TokenCounter.for_model(model)

    def ladder(**kw: Any) -> LadderStrategy:
        return LadderStrategy(counter, summ, **kw)

    strategies: dict[str, Callable[[Sequence[Message]], list[Message]]] = {
        "none": list,
        "window 8": ladder(window=8),
        "window 20": ladder(window=20),
        "window 20 + pinning": ladder(window=20, pin=3),
        "+ rolling summary": ladder(window=20, pin=3, summary=True),
        "+ tool-result truncation": ladder(window=20, pin=3, summary=True, truncate=True),
        "full three-tier": ladder(window=20, pin=3, summary=True, truncate=True, facts=True),
        "ctxwarden": OursStrategy(
            model,
            ours_budget,
            trigger=SummaryTrigger(max_messages=30, keep_recent=15, fill_ratio=None),
            tools=TOOLS,
            summarizer=summ,
            policy=SEED_POLICY,  # the seed's experiment keeps its own setting (issue 35)
        ),
    }
    history = [Message.system(_system_prompt(), id="system")]
    sent: dict[str, list[list[Message]]] = {name: [] for name in strategies}
    missing: dict[str, int] = {name: 0 for name in strategies}
    lost: dict[str, set[str]] = {name: set() for name in strategies}
    for r, msgs in enumerate(generate_rounds(seed, rounds, model), start=1):
        history += msgs[:-1]
        for name, strategy in strategies.items():
            ctx = strategy(history)
            sent[name].append(ctx)
            gone = _facts_present(ctx, r)
            missing[name] += len(gone)
            lost[name].update(gone)
        history.append(msgs[-1])
        if progress:
            progress(f"agent-chat round {r}")
    runs = {}
    for name, contexts in sent.items():
        runs[name] = price_strategy(
            name,
            contexts,
            counter,
            model,
            summ,
            strategies[name],
            tools=TOOLS,
            extra={"facts_missing_rounds": missing[name], "facts_lost": sorted(lost[name])},
        )
    none_cost = runs["none"].cost_usd
    return {
        "description": f"Seed 000: a {rounds}-round agent chat, 5 tools, article (~1,800 "
        "tokens) and search (~600) results, 1.5 calls a round; Claude Sonnet prices from "
        "the registry.",
        "model": model,
        "summarizer": summ.label,
        "summarizer_pricing": summ.describe()["pricing"],
        "rounds": rounds,
        "ours_budget": ours_budget,
        "runs": runs,
        "share_of_none": {n: run.cost_usd / none_cost for n, run in runs.items()},
    }
