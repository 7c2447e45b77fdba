"""What ``ctxwarden serve`` adds to a call: latency, CPU, throughput, errors (R14).

Run: ``python -m ctxwarden_bench.proxy [--db URL] [--clients 1,64] [--steps 40,10]``.

A local upstream that answers instantly (:mod:`ctxwarden_bench.proxy_upstream`, its own
process) and ``ctxwarden serve`` (its own process, one worker, SQLite in a temporary
file unless ``--db``) are started; then an agent conversation of 200 tool-using
messages (~330 KB of JSON) is sent by 1 and by 64 concurrent clients, each its own
session, each request echoing the previous reply and adding a user message (as an
agent does), JSON and streamed, to the upstream directly and through the proxy (at one
client, ``--paired-up-to``, each step calls the upstream and then the proxy, so that both
run in the same minute of a machine whose speed swings; above it, one case after the
other). Two clients: the real ``openai`` SDK (which spends tens of ms preparing such a
body itself), and pre-built bodies posted over ``httpx2``. Reported per case: p50/p99
latency, the p50/p99 added over calling the upstream directly, requests per second,
errors, and the proxy process's CPU per request (from ``/proc``, in nanoseconds:
:mod:`~ctxwarden_bench.process_cpu`); before and after the
cases, the machine's speed (:func:`~ctxwarden_bench.machine_speed.reference_ms`: this
machine's speed swings by up to ~2.8x). The first call of each
session (it stores the 200 messages) is a warm-up, timed apart. At the end every stored
session is read back: it must hold exactly the history sent plus each reply, once, in
order, on the session id the client named (no branch). Last, issue 13's targets are
judged on the run (:mod:`ctxwarden_bench.proxy_targets`): met, MISSED or unknown, each
with the figures it was judged on. The exit status is 1 for an error or a stored-session
problem, not for a missed target: those figures belong to the machine and the minute.

``--kinds responses`` adds a third client: the ``openai`` SDK's ``responses.create``
through ``/v1/responses``, the same conversation as Responses items (the system prompt as
``instructions``, tool calls as ``function_call`` / ``function_call_output`` items), the
upstream answering with a response object or its stream of events. ``--kinds
responses-httpx`` posts the same requests as pre-built bodies (as ``httpx`` does on the
chat route): the SDK prepares each body for tens of ms, so through it the proxy's figures
include what a cold CPU cache costs it after the client's work; pre-built bodies give the
route's own cost, comparable with the chat route's ``httpx`` case.

``--api anthropic`` runs the same through ``/v1/messages``: the conversation in
Anthropic's format (``system``, alternating turns with ``tool_use`` and ``tool_result``
blocks), the ``anthropic`` SDK as the second client, the upstream answering with
Anthropic's message or stream of events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxwarden.store import open_store
from ctxwarden_bench.local_servers import free_port, serving
from ctxwarden_bench.machine_speed import REFERENCE_LOOP, reference_ms
from ctxwarden_bench.process_cpu import CpuReading, read_cpu, seconds_between
from ctxwarden_bench.proxy_targets import judge, report
from ctxwarden_bench.proxy_upstream import REPLY_TEXT
from ctxwarden_bench.proxy_upstream import running as running_upstream

__all__ = ["Case", "conversation", "main", "percentile_ms"]

MODEL = "gpt-4o"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
_WORDS = (
    "order", "shipment", "customer", "refund", "invoice", "account", "status", "pending",
    "delivered", "warehouse", "carrier", "tracking", "address", "payment", "card", "billing",
    "support", "ticket", "priority", "escalation", "product", "quantity", "price", "discount",
    "coupon", "return", "policy", "window", "business", "days", "label",
)  # fmt: skip


def conversation(messages: int = 200, seed: int = 7) -> list[dict[str, Any]]:
    """A tool-using support agent: per turn a question, a lookup call, its JSON result
    (~5.6 KB) and an answer; ``messages`` in all, system prompt first."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent. " * 8}]
    turn = 0
    while len(out) < messages:
        cid = f"call_{turn}"
        rows = [{"id": f"ORD-{turn}-{i}", "note": words(60)} for i in range(12)]
        out += [
            {"role": "user", "content": f"Turn {turn}: " + words(25)},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function",
                 "function": {"name": "lookup", "arguments": json.dumps({"q": turn})}}]},
            {"role": "tool", "tool_call_id": cid, "content": json.dumps({"rows": rows})},
            {"role": "assistant", "content": words(30)},
        ]  # fmt: skip
        turn += 1
    return out[:messages]


def history_at(base: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """What a client sends at ``step``: the base, then per earlier step the reply it got
    and a new user message."""
    out = list(base)
    for k in range(step):
        out += [
            {"role": "assistant", "content": REPLY_TEXT},
            {"role": "user", "content": f"next {k}"},
        ]
    return out


def anthropic_bodies(base: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """The request an Anthropic client sends at each step (:func:`anthropic_request`)."""
    return [anthropic_request(base, step) for step in range(steps)]


def anthropic_request(base: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """:func:`history_at` as an Anthropic request (``system`` apart, ``tool_result``
    blocks in user turns)."""
    from ctxwarden.formats import message_from_openai, messages_to_anthropic

    system, turns = messages_to_anthropic([message_from_openai(m) for m in history_at(base, step)])
    return {"max_tokens": 256, "messages": turns, "model": ANTHROPIC_MODEL, "system": system}


def responses_request(base: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """:func:`history_at` as a Responses request (the system prompt as ``instructions``,
    the rest as input items)."""
    from ctxwarden.formats import message_from_openai
    from ctxwarden.formats.responses import messages_to_responses

    history = history_at(base, step)
    _, items = messages_to_responses([message_from_openai(m) for m in history[1:]])
    return {"model": MODEL, "instructions": history[0]["content"], "input": items}


def prepared(
    base: list[dict[str, Any]], steps: int, api: str
) -> tuple[list[Any], dict[bool, list[bytes]]]:
    """Each step's request (for the SDKs) and its pre-built bodies, JSON and streamed, kept
    out of this process's garbage collections from here on (:func:`gc.freeze`).

    Why frozen: the Anthropic requests alone are ~10^5 dicts, every one of which a full
    collection walks. The anthropic SDK allocates enough per call to set one off every few
    dozen calls, and it landed in the same proxied call of every run (step 22), adding
    ~100 ms to the client's wait: the "p99 added" read +92 to +127 ms through the
    anthropic SDK and +12 ms frozen. The proxy did not do that work; the bench did."""
    histories: list[Any]
    if api == "anthropic":
        histories = requests = anthropic_bodies(base, steps)
    elif api == "responses":
        histories = requests = [responses_request(base, k) for k in range(steps)]
    else:
        histories = [history_at(base, k) for k in range(steps)]
        requests = [{"model": MODEL, "messages": h} for h in histories]
    bodies = {s: [json.dumps({**r, "stream": s}).encode() for r in requests] for s in (False, True)}
    gc.collect()
    gc.freeze()
    return histories, bodies


async def _anthropic_sdk(sdk: Any, mode: str, session: str, request: dict[str, Any]) -> None:
    """One call through the ``anthropic`` SDK (it serialises the request itself)."""
    extra = {"X-Ctxwarden-Session": session}
    if mode == "stream":
        stream = await sdk.messages.create(**request, stream=True, extra_headers=extra)
        text = "".join(
            [
                e.delta.text
                async for e in stream
                if e.type == "content_block_delta" and e.delta.type == "text_delta"
            ]
        )
    else:
        done = await sdk.messages.create(**request, extra_headers=extra)
        text = done.content[0].text
    if text != REPLY_TEXT:
        raise AssertionError(f"unexpected reply {text!r}")


async def _responses_sdk(sdk: Any, mode: str, session: str, request: dict[str, Any]) -> None:
    """One call through the ``openai`` SDK's ``responses.create``."""
    extra = {"X-Ctxwarden-Session": session}
    if mode == "stream":
        stream = await sdk.responses.create(**request, stream=True, extra_headers=extra)
        kinds = ("response.output_text.delta",)
        text = "".join([e.delta async for e in stream if e.type in kinds])
    else:
        done = await sdk.responses.create(**request, extra_headers=extra)
        text = done.output_text
    if text != REPLY_TEXT:
        raise AssertionError(f"unexpected reply {text!r}")


@dataclass
class Case:
    target: str  # direct | proxy
    client: str  # sdk | httpx
    mode: str  # json | stream
    clients: int
    latencies: list[float]
    warmup: list[float]
    errors: int
    seconds: float
    cpu_seconds: float | None = None
    build_seconds: float | None = None  # the server's own sync + build time, per call

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def per_second(self) -> float:
        """Calls per second of the case's time."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms(self) -> float | None:
        """The server's CPU per call, in ms (``None``: not read, or no call)."""
        if not (self.cpu_seconds and self.requests):
            return None
        return self.cpu_seconds / self.requests * 1000

    def pct(self, q: float) -> float:
        return percentile_ms(self.latencies, q)


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``seconds`` (the nearest rank at or above it), in ms; NaN
    when there are none."""
    data = sorted(seconds)
    return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")


def _build_seconds(base_url: str, api: str) -> tuple[float, float]:
    """``(sum, count)`` of the proxy's ``ctxwarden_build_seconds`` histogram."""
    import urllib.request

    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f'ctxwarden_build_seconds_{part}{{api="{api}"}}'):
                found[part] = float(line.rsplit(" ", 1)[1])
    return found.get("sum", 0.0), found.get("count", 0.0)


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """This process's garbage collector off for one case, after a collection, as
    :mod:`timeit` times code: with the requests frozen (:func:`prepared`), the anthropic
    SDK's own objects still set off a full collection of ~40 ms in the same proxied call
    of every run (the 38th streamed one at 1 client), which the "p99 added" read as the
    proxy's (+40 to +43 ms; the server's collector ran in none of those calls)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _one(kind: str, mode: str, http: Any, sdk: Any, url: str, session: str,
               body: bytes, messages: Any, key: str) -> None:  # fmt: skip
    headers = {"authorization": f"Bearer {key}", "x-api-key": key,
               "x-ctxwarden-session": session, "content-type": "application/json"}  # fmt: skip
    if kind == "responses":
        await _responses_sdk(sdk, mode, session, messages)  # the request
        return
    if kind == "sdk" and url.endswith("/v1/messages"):
        await _anthropic_sdk(sdk, mode, session, messages)  # the request, for Anthropic
        return
    if kind == "sdk":
        extra = {"X-Ctxwarden-Session": session}
        if mode == "stream":
            stream = await sdk.chat.completions.create(
                model=MODEL, messages=messages, stream=True, extra_headers=extra
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        else:
            done = await sdk.chat.completions.create(
                model=MODEL, messages=messages, extra_headers=extra
            )
            text = done.choices[0].message.content
        if text != REPLY_TEXT:
            raise AssertionError(f"unexpected reply {text!r}")
        return
    if mode == "stream":
        async with http.stream("POST", url, content=body, headers=headers) as r:
            raw = b"".join([c async for c in r.aiter_bytes()])
            ended = (b"[DONE]", b"message_stop", b"response.completed")
            if r.status_code != 200 or not any(end in raw for end in ended):
                raise AssertionError(f"status {r.status_code}")
        return
    r = await http.post(url, content=body, headers=headers)
    if r.status_code != 200:
        raise AssertionError(f"status {r.status_code}: {r.text[:200]}")


async def _cases(targets: Sequence[tuple[str, str, int | None]], kind: str, mode: str,
                 clients: int, steps: int, key: str, bodies: dict[bool, list[bytes]],
                 histories: list[Any], api: str = "openai",
                 ) -> list[tuple[Case, list[str]]]:  # fmt: skip
    """One case per target (``(name, base_url, server pid or None)``), run together.

    Each client calls every target in turn, step by step, with a session of its own on
    each: the direct and the proxied calls then run in the same minute of a machine whose
    speed swings, so the latency one adds over the other is not the difference between two
    spells. The proxy's CPU is read from its process, which only the proxied calls reach.
    Requests per second: a target run alone, its calls over the wall time; in turn with
    others, over the time its clients spent in its calls."""
    import httpx2

    http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=clients + 4), timeout=120)
    stream = mode == "stream"
    runs = [_Run(name, base, pid, kind, mode, clients, http, key, api)
            for name, base, pid in targets]  # fmt: skip

    async def call(run: _Run, session: str, step: int, into: list[float]) -> None:
        t = time.perf_counter()
        try:
            await _one(kind, mode, http, run.sdk, run.url, session, bodies[stream][step],
                       histories[step], key)  # fmt: skip
            into.append(time.perf_counter() - t)
        except Exception as exc:
            run.errors += 1
            run.failed.add(session)
            if len(run.seen) < 3:
                run.seen.append(f"{type(exc).__name__}: {str(exc)[:160]}")

    try:
        for run in runs:  # warm-up: the first call of a session stores its 200 messages
            for s in run.sessions:
                await call(run, s, 0, run.warm)
        for run in runs:
            run.cpu0 = read_cpu(run.pid) if run.pid else None
            run.built0 = _build_seconds(run.base, api) if run.pid else (0.0, 0.0)

        async def agent(i: int) -> None:
            for step in range(1, steps + 1):
                for run in runs:
                    await call(run, run.sessions[i], step, run.lat)

        start = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(clients)))
        wall = time.perf_counter() - start
        out = []
        for run in runs:
            cpu = build = None
            if run.pid and run.cpu0 is not None:
                cpu = seconds_between(run.cpu0, read_cpu(run.pid))
                built1 = _build_seconds(run.base, api)
                build = (built1[0] - run.built0[0]) / max(built1[1] - run.built0[1], 1)
            # alone, the wall time; in turn with another target, the time in its own calls
            seconds = wall if len(runs) == 1 else sum(run.lat) / clients
            case = Case(run.name, kind, mode, clients, run.lat, run.warm, run.errors, seconds,
                        cpu, build)  # fmt: skip
            out.append((case, [s for s in run.sessions if s not in run.failed]))
    finally:
        await http.aclose()
    for run in runs:
        for line in run.seen:
            print(f"    error ({run.name}): {line}", flush=True)
    return out  # a failed call's session is not checked


class _Run:
    """One target's clients, sessions and tallies within :func:`_cases`."""

    def __init__(self, name: str, base: str, pid: int | None, kind: str, mode: str,
                 clients: int, http: Any, key: str, api: str) -> None:  # fmt: skip
        self.name, self.base, self.pid = name, base, pid
        self.sdk: Any
        if api == "anthropic":
            import anthropic

            root = base.removesuffix("/v1")
            self.sdk = anthropic.AsyncAnthropic(base_url=root, api_key=key, http_client=http,
                                                max_retries=0)  # fmt: skip
            self.url = root + "/v1/messages"
        else:
            import openai

            self.sdk = openai.AsyncOpenAI(base_url=base, api_key=key, http_client=http,
                                          max_retries=0)  # fmt: skip
            self.url = base + ("/responses" if api == "responses" else "/chat/completions")
        self.sessions = [f"bench-{mode}-{kind}-{clients}-{uuid.uuid4().hex[:8]}"
                         for _ in range(clients)]  # fmt: skip
        self.errors = 0
        self.failed: set[str] = set()
        self.seen: list[str] = []
        self.warm: list[float] = []
        self.lat: list[float] = []
        self.cpu0: CpuReading | None = None
        self.built0 = (0.0, 0.0)


def _check_store(
    db: str,
    sessions: dict[str, int],
    base: list[dict[str, Any]],
    api: str = "openai",
    tenant: str = "bench",
) -> list[str]:
    """Every proxied session holds exactly what was sent plus each reply, once, in order
    (for Anthropic: what the turns sent are as our messages)."""
    from ctxwarden.formats import message_from_openai, messages_from_anthropic
    from ctxwarden.formats.responses import messages_from_responses

    problems = []
    with open_store(db) as store:
        names = {s.session_id for s in store.list_sessions(tenant)}
        branches = sorted(n for n in names if "~b" in n)
        if branches:
            problems.append(f"{len(branches)} branch sessions: {branches[:3]}")
        for session, steps in sessions.items():
            reply = {"role": "assistant", "content": REPLY_TEXT}
            if api == "anthropic":
                request = anthropic_request(base, steps)
                want = messages_from_anthropic(request["system"], [*request["messages"], reply])
            elif api == "responses":
                request = responses_request(base, steps)
                sent = messages_from_responses(request["input"], request["instructions"])
                want = [*sent, message_from_openai(reply)]
            else:
                want = [message_from_openai(m) for m in [*history_at(base, steps), reply]]
            got = [m.message for m in store.iter_messages(tenant, session)]
            if len(got) != len(want):
                problems.append(f"{session}: {len(got)} stored, {len(want)} expected")
            elif any(g.role != w.role or g.text != w.text for g, w in zip(got, want, strict=True)):
                problems.append(f"{session}: stored messages differ from the history sent")
    return problems


def _report(cases: Sequence[Case]) -> None:
    direct = {(c.client, c.mode, c.clients): c for c in cases if c.target == "direct"}
    print(f"{'case':<30} {'req':>5} {'err':>4} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} "
          f"{'+p99':>7} {'req/s':>7} {'cpu ms/req':>10} {'build ms':>8} "
          f"{'warm-up p50':>11}")  # fmt: skip
    for c in cases:
        base = direct.get((c.client, c.mode, c.clients))
        add50 = add99 = ""
        if c.target == "proxy" and base is not None:
            add50 = f"{c.pct(0.5) - base.pct(0.5):+.1f}"
            add99 = f"{c.pct(0.99) - base.pct(0.99):+.1f}"
        cpu = f"{c.cpu_ms:.2f}" if c.cpu_ms is not None else ""
        warm = f"{statistics.median(c.warmup) * 1000:.1f}" if c.warmup else ""
        build = f"{c.build_seconds * 1000:.1f}" if c.build_seconds is not None else ""
        name = f"{c.target} {c.client} {c.mode} x{c.clients}"
        print(f"{name:<30} {c.requests:>5} {c.errors:>4} {c.pct(0.5):>8.1f} {c.pct(0.99):>8.1f} "
              f"{add50:>7} {add99:>7} {c.per_second:>7.0f} {cpu:>10} {build:>8} "
              f"{warm:>11}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxwarden_bench.proxy", description=__doc__)
    ap.add_argument("--db", help="store URL (default: a temporary SQLite file)")
    ap.add_argument("--clients", default="1,64", help="concurrent clients per case")
    ap.add_argument("--steps", default="40,10", help="measured calls per client, per --clients")
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--modes", default="json,stream")
    ap.add_argument("--kinds", default="httpx,sdk",
                    help="httpx (pre-built bodies), sdk, responses (the openai SDK's "
                    "responses.create through /v1/responses) and/or responses-httpx "
                    "(pre-built /v1/responses bodies)")  # fmt: skip
    ap.add_argument("--api", choices=("openai", "anthropic"), default="openai",
                    help="the route: /v1/chat/completions or /v1/messages")  # fmt: skip
    ap.add_argument("--paired-up-to", type=int, default=1, metavar="CLIENTS",
                    help="up to this many clients, each calls the upstream and the proxy in "
                    "turn (the same minute for both); above it, one after the other")  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.clients.split(",")]
    steps = [int(x) for x in args.steps.split(",")]
    if len(steps) != len(counts):
        ap.error("give one --steps value per --clients value")
    tmp = tempfile.TemporaryDirectory(prefix="ctxwarden-bench-proxy-")
    db = args.db or f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    from ctxwarden.core.errors import CtxwardenError
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix
    from ctxwarden.store.service_tables import add_tenant

    # a tenant of its own: a database given with --db may hold an earlier run's
    key, tenant = new_key(), f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with open_store(db) as store:
            add_tenant(store, tenant, key_hash=hash_key(key), key_prefix=shown_prefix(key))
    except CtxwardenError as exc:
        tmp.cleanup()
        ap.error(f"--db: {exc}")
    up_port = free_port()
    with contextlib.ExitStack() as started:  # (left in reverse: proxy, upstream, files)
        started.callback(tmp.cleanup)
        started.enter_context(running_upstream(up_port))
        proxy, proxy_url = started.enter_context(
            serving(["--db", db, "--upstream", f"http://127.0.0.1:{up_port}/v1",
                     "--anthropic-upstream", f"http://127.0.0.1:{up_port}"])
        )  # fmt: skip
        base = conversation(args.messages)
        kinds = args.kinds.split(",")
        routes = {k: "responses" if k.startswith("responses") else args.api for k in kinds}
        made = {r: prepared(base, max(steps) + 1, r) for r in dict.fromkeys(routes.values())}
        for route, (_, bodies) in made.items():
            print(f"conversation: {len(base)} messages, {len(bodies[False][0]) / 1024:.0f} KB "
                  f"{route} body; store {db.split('?')[0]}", flush=True)  # fmt: skip
        speed = [reference_ms()]
        print(f"machine before: reference loop {speed[0]:.1f} ms ({REFERENCE_LOOP})", flush=True)
        cases: list[Case] = []
        stored: dict[str, dict[str, int]] = {r: {} for r in made}
        for clients, n in zip(counts, steps, strict=True):
            for mode in args.modes.split(","):
                for kind in kinds:
                    histories, bodies = made[routes[kind]]
                    targets = [("direct", f"http://127.0.0.1:{up_port}/v1", None),
                               ("proxy", proxy_url + "/v1", proxy.pid)]  # fmt: skip
                    groups = [targets] if clients <= args.paired_up_to else [[t] for t in targets]
                    for group in groups:
                        run = (group, kind, mode, clients, n, key, bodies, histories, routes[kind])
                        with _collector_off():
                            results = asyncio.run(_cases(*run))
                        for case, sessions in results:
                            cases.append(case)
                            if case.target == "proxy":
                                stored[routes[kind]].update((s, n) for s in sessions)
                            tally = f"{case.requests} calls, {case.errors} errors"
                            print(f"  {case.target} {kind} {mode} x{clients}: {tally}", flush=True)
        speed.append(reference_ms())
        print(f"machine after: reference loop {speed[1]:.1f} ms (lower is faster)", flush=True)
        _report(cases)
        problems = [p for r in made for p in _check_store(db, stored[r], base, r, tenant)]
        checked = sum(len(v) for v in stored.values())
        print(f"stored sessions checked: {checked}; problems: {len(problems)}")
        for problem in problems[:10]:
            print("  " + problem)
        verdicts = judge(cases, problems)
        report(verdicts)
        if args.json:
            # every call's latency too, in the order the calls ended (one client: step by
            # step), so that an outlier behind a p99 can be found
            rows = [{**{k: v for k, v in vars(c).items() if k not in ("latencies", "warmup")},
                     "p50_ms": c.pct(0.5), "p99_ms": c.pct(0.99), "requests": c.requests,
                     "latencies_ms": [round(s * 1000, 3) for s in c.latencies]}
                    for c in cases]  # fmt: skip
            figures = {"cases": rows, "problems": problems, "reference_ms": speed,
                       "targets": [v.as_dict() for v in verdicts]}  # fmt: skip
            args.json.write_text(json.dumps(figures, indent=2))
        return 1 if problems or any(c.errors for c in cases) else 0


if __name__ == "__main__":
    raise SystemExit(main())
