"""The swebench-mini runs replayed through ``/v1/responses`` with the real ``openai`` SDK.

Run: ``python -m ctxwarden_bench.responses_replay [--data PATH] [--budgets 4000,8000]
[--runs N] [--client sdk|httpx] [--policy FILE] [--callgrind]``.

Each recorded run of the coding agent (``../shared/data/swebench-mini``) is replayed as
a Responses client would hold it: at every bash call, the agent sends its history up to
there (the system prompt as ``instructions``, the rest as input items) with
``client.responses.create`` to ``ctxwarden serve`` (a process of its own for each
budget, so that no message is in its caches before the run sends it; SQLite in a
temporary file), under ``X-Ctxwarden-Max-Input-Tokens``. The upstream is scripted: it
records the request the proxy forwarded and answers with the run's own next assistant
turn as a response (a message and a ``function_call`` item), so the agent's next call
echoes what the proxy stored, as a real loop does.

What upstream received is measured as the library's build is
(:func:`ctxwarden_bench.swebench.swebench_retention`): the needed-later tokens kept,
the reduction, pair violations, calls over the budget. Beside it, on the same runs: the
library's ``build_context`` in an agent loop
(:func:`~ctxwarden_bench.retention.engine_builder`), and a stored
:class:`~ctxwarden.Session` built in process (:class:`SessionBuilder`: the build path
the proxy takes, its sticky decisions kept in the store); and the proxy process's CPU
per call (from ``/proc``), the p50 of a call through the proxy beside the same request
sent to upstream directly just before it (``--client sdk``, the default: the SDK's
``responses.create``; ``httpx``: the body built before the clock starts), and its
sync-and-build time per call
(``ctxwarden_build_seconds``). All three build from the runs as a Responses client holds
them (:func:`as_responses_client`: a tool result has no tool name on that wire), so the
context upstream got is compared with the library's call for call, and the command fails
when one differs or when a stored session branched (each call's history must extend the
stored one).

``--callgrind`` runs the proxy under ``valgrind --tool=callgrind``, counting only while
the proxied pass runs, and reports the instructions it executed per call instead of
judging its CPU and p50: on a machine whose speed swings 2x within minutes, the CPU
figure cannot tell two versions apart and the count can (two runs of the first 10 runs
@4,000 differed by 0.03%). ``--runs 10`` takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import orjson

from ctxwarden.core.messages import Message
from ctxwarden.formats.responses import message_items, messages_from_responses
from ctxwarden.session import Session
from ctxwarden.store import open_store
from ctxwarden_bench.coding_truncation import find_traces
from ctxwarden_bench.local_servers import LocalJSONServer, serving
from ctxwarden_bench.machine_speed import REFERENCE_LOOP, reference_ms
from ctxwarden_bench.process_cpu import read_cpu, seconds_between
from ctxwarden_bench.proxy import _build_seconds, percentile_ms
from ctxwarden_bench.proxy_cost import (
    callgrind_command,
    callgrind_counting,
    callgrind_instructions,
)
from ctxwarden_bench.proxy_targets import ADDED_P50_MS, CPU_MS_PER_REQUEST, Verdict
from ctxwarden_bench.retention import Retention, engine_builder, policy_file
from ctxwarden_bench.swebench import BUDGETS, load_swebench, swebench_retention

__all__ = [
    "Caller",
    "ProxyBuilder",
    "Recorded",
    "ScriptedUpstream",
    "SessionBuilder",
    "as_responses_client",
    "main",
    "with_history_ids",
]

MODEL = "gpt-4o"


class ScriptedUpstream(LocalJSONServer):
    """A Responses upstream on a free loopback port: answers each request with
    :attr:`output` as a completed response and keeps the last request's body."""

    prefix = "/v1"

    def __init__(self) -> None:
        super().__init__()
        self.output: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}
        self.calls = 0

    def answer(self, body: bytes) -> tuple[int, Any]:
        self.last = json.loads(body)
        self.calls += 1
        return 200, self.response()

    def response(self) -> dict[str, Any]:
        usage = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 1020}  # fmt: skip
        return {"id": f"resp_{self.calls}", "object": "response", "created_at": 1_700_000_000,
                "status": "completed", "model": MODEL, "output": self.output,
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "store": False, "usage": usage}  # fmt: skip


class SessionBuilder:
    """A :data:`~ctxwarden_bench.retention.Builder` that appends each call's new messages
    to a stored session (one per run) and builds it: the proxy's build, without HTTP."""

    def __init__(self, store: Any, policy: Any = None) -> None:
        self.store = store
        self.policy = policy
        self._sessions: dict[int, tuple[Session, list[int]]] = {}

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        found = self._sessions.get(id(before[0]))
        if found is None:
            made = Session(self.store, uuid.uuid4().hex, policy=self.policy)
            found = self._sessions[id(before[0])] = (made, [0])
        session, seen = found
        session.append(before[seen[0] :])
        seen[0] = len(before)
        return list(session.build(model=MODEL, max_input_tokens=budget).messages)


class Caller:
    """One way of sending a Responses request to ``base_url``: the ``openai`` SDK's
    ``responses.create`` (``sdk``), or the body built before the clock starts and posted
    over ``httpx`` (``httpx``: what the route itself costs)."""

    def __init__(self, base_url: str, key: str, client: str) -> None:
        import httpx
        import openai

        self.client = client
        self._sdk: openai.OpenAI | None = None
        self._http: httpx.Client | None = None
        if client == "httpx":
            sent_as = {"authorization": f"Bearer {key}", "content-type": "application/json"}
            self._http = httpx.Client(base_url=base_url, timeout=120, headers=sent_as)
        else:
            self._sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)

    def __call__(self, request: dict[str, Any], headers: dict[str, str]) -> float:
        """Send ``request``; the seconds until its reply was read."""
        if self._http is not None:
            body = orjson.dumps(request)
            started = time.perf_counter()
            self._http.post("/responses", content=body, headers=headers).raise_for_status()
        else:
            assert self._sdk is not None
            started = time.perf_counter()
            self._sdk.responses.create(**request, extra_headers=headers)
        return time.perf_counter() - started

    def close(self) -> None:
        for client in (self._sdk, self._http):
            if client is not None:
                client.close()


class ProxyBuilder:
    """A :data:`~ctxwarden_bench.retention.Builder` whose context is what upstream got
    from the proxy: each call sends the history through ``proxy`` (one session per run
    and budget), upstream answering with the run's next turn; with ``direct``, the same
    request is sent to upstream itself first (:attr:`direct_seconds`: what the proxy
    adds is the difference)."""

    def __init__(
        self,
        proxy: Caller,
        upstream: ScriptedUpstream,
        runs: Sequence[Sequence[Message]],
        direct: Caller | None = None,
    ):
        self.proxy, self.upstream, self.direct = proxy, upstream, direct
        self._runs = {id(run[0]): run for run in runs}
        self._sessions: dict[int, str] = {}
        self.sessions: list[str] = []
        self.seconds: list[float] = []
        self.direct_seconds: list[float] = []

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        run = self._runs[id(before[0])]
        session = self._sessions.get(id(run))
        if session is None:
            session = self._sessions[id(run)] = f"swe-{budget}-{uuid.uuid4().hex[:10]}"
            self.sessions.append(session)
        self.upstream.output = message_items(run[len(before)])
        items = [i for m in before[1:] for i in message_items(m)]
        request = {"model": MODEL, "instructions": before[0].text, "input": items}
        if self.direct is not None:
            self.direct_seconds.append(self.direct(request, {}))
        headers = {"X-Ctxwarden-Session": session, "X-Ctxwarden-Max-Input-Tokens": str(budget)}
        self.seconds.append(self.proxy(request, headers))
        sent = self.upstream.last
        return with_history_ids(
            before, messages_from_responses(sent["input"], sent.get("instructions"))
        )


def with_history_ids(before: Sequence[Message], ctx: Sequence[Message]) -> list[Message]:
    """``ctx`` (read back from the wire, where messages have no ids) with the ids of the
    history's messages they are, so that the checks keyed by id (a message sent twice, the
    newest kept) read it as they read the library's build: the first unused history
    message with the same meaning, or the result of the same call (a cut result); a
    message the build made keeps an id of its own."""
    from ctxwarden.service.history import message_key

    by_key: dict[bytes, list[str]] = {}
    for m in before:
        by_key.setdefault(message_key(m), []).append(m.id)
    by_call = {m.tool_call_id: m.id for m in before if m.role == "tool"}
    used: set[str] = set()
    out = []
    for i, m in enumerate(ctx):
        found = next((x for x in by_key.get(message_key(m), ()) if x not in used), None)
        if found is None and m.tool_call_id is not None:
            found = by_call.get(m.tool_call_id)
        found = found or f"built-{i}"
        used.add(found)
        out.append(m.with_id(found))
    return out


def as_responses_client(run: Sequence[Message]) -> list[Message]:
    """``run`` as a Responses client holds it: each message through the wire format and
    back, ids kept (a tool result carries no tool name there, and a name is counted), so
    the library and the session build from what the proxy receives and their contexts
    can be compared with its call for call."""
    items = [i for m in run[1:] for i in message_items(m)]
    back = messages_from_responses(items, run[0].text)
    if len(back) != len(run):
        raise ValueError(f"a run of {len(run)} messages came back as {len(back)}")
    return [m.with_id(old.id) for old, m in zip(run, back, strict=True)]


class Recorded:
    """A :data:`~ctxwarden_bench.retention.Builder` that keeps what ``builder`` built,
    call by call, as the wire shows it (roles, texts, calls, results' call ids)."""

    def __init__(self, builder: Any) -> None:
        self.builder = builder
        self.contexts: list[list[tuple[Any, ...]]] = []

    def __call__(
        self, before: Sequence[Message], counts: Sequence[int], budget: int
    ) -> list[Message]:
        ctx = self.builder(before, counts, budget)
        self.contexts.append([_shown(m) for m in ctx])
        return list(ctx)


def _shown(m: Message) -> tuple[Any, ...]:
    calls = tuple((c.id, c.name, c.arguments) for c in m.tool_calls)
    return m.role, m.text, calls, m.tool_call_id


def _verdicts(cpu_ms: float, added_p50_ms: float) -> list[Verdict]:
    """The proxy's two per-call targets on this replay, the chat route's (issue 13's
    :mod:`~ctxwarden_bench.proxy_targets`), judged on its figures."""
    return [
        Verdict(
            f"CPU per call <= {CPU_MS_PER_REQUEST:g} ms",
            cpu_ms <= CPU_MS_PER_REQUEST,
            f"{cpu_ms:.1f}",
        ),
        Verdict(
            f"p50 added <= {ADDED_P50_MS:g} ms",
            added_p50_ms <= ADDED_P50_MS,
            f"{added_p50_ms:+.1f}",
        ),
    ]


def _row(name: str, r: Retention, budget: int, extra: str = "") -> str:
    return (f"{name:<8} {budget:>6} {r.retention:>9.1%} {r.reduction:>9.1%} {r.calls:>6} "
            f"{r.violations:>10} {r.over_budget:>5} {extra}")  # fmt: skip


def _branches(db: str, tenant: str) -> list[str]:
    with open_store(db) as store:
        return sorted(s.session_id for s in store.list_sessions(tenant) if "~b" in s.session_id)


@contextmanager
def _serving(
    db: str, upstream_url: str, served: Sequence[str], counted: Path | None = None
) -> Iterator[tuple[Any, str]]:
    """``ctxwarden serve`` on ``db`` in a new process, forwarding to ``upstream_url``:
    the process and its ``/v1`` base URL; stopped on the way out. With ``counted``, under
    callgrind (writing there), counting only once switched on
    (:func:`~ctxwarden_bench.proxy_cost.callgrind_counting`)."""
    wrapper = callgrind_command(counted) if counted is not None else []
    args = ["--db", db, "--upstream", upstream_url, *served]
    timeout = 600.0 if counted else 30.0  # valgrind starts the interpreter ~50x slower
    with serving(args, wrapper=wrapper, timeout=timeout) as (proxy, base):
        yield proxy, base + "/v1"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ctxwarden_bench.responses_replay",
                                 description=__doc__)  # fmt: skip
    ap.add_argument("--data", help="the swebench-mini file or the data folder")
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--runs", type=int, default=0, help="replay only the first N runs")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--client", choices=("sdk", "httpx"), default="sdk",
                    help="sdk: the openai SDK's responses.create (default); httpx: the same "
                    "requests as bodies built before each call, posted over httpx (the "
                    "route's own cost, without the SDK's preparation between calls)")  # fmt: skip
    ap.add_argument("--callgrind", action="store_true",
                    help="run the proxy under valgrind's callgrind and report the "
                    "instructions it executes per call (a figure two versions can be "
                    "compared by on a noisy machine; its CPU and p50 are then not "
                    "judged)")  # fmt: skip
    ap.add_argument("--policy", type=Path, help="a policy TOML file for all three builders "
                    "(`ctxwarden serve --policy`) instead of the default")  # fmt: skip
    args = ap.parse_args(argv)
    if args.callgrind and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        ap.error("--callgrind needs valgrind (apt-get install valgrind)")
    policy = policy_file(args.policy)
    served = ["--policy", str(args.policy)] if args.policy is not None else []
    path = find_traces(args.data)
    if path is None:
        ap.error("swebench-mini traces not found (set --data or $CTXWARDEN_DATA)")
    runs = load_swebench(path)
    runs = [as_responses_client(r) for r in (runs[: args.runs] if args.runs else runs)]
    budgets = [int(b) for b in args.budgets.split(",")]
    from ctxwarden.service.keys import hash_key, new_key, shown_prefix
    from ctxwarden.store.service_tables import add_tenant

    figures: dict[str, Any] = {"runs": len(runs), "budgets": {}}
    unequal = 0  # calls whose context upstream got is not the library's
    with tempfile.TemporaryDirectory(prefix="ctxwarden-replay-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'replay.db'}"
        key, tenant = new_key(), "replay"
        with open_store(db) as store:
            add_tenant(store, tenant, key_hash=hash_key(key), key_prefix=shown_prefix(key))
        upstream = ScriptedUpstream()
        with upstream:
            print(f"{len(runs)} swebench-mini runs; {'':>6}retention, reduction, "
                  "pair violations, calls over budget", flush=True)  # fmt: skip
            print(f"{'builder':<8} {'budget':>6} {'retention':>9} {'reduction':>9} "
                  f"{'calls':>6} {'violations':>10} {'over':>5}")  # fmt: skip
            for budget in budgets:
                reference = Recorded(engine_builder(MODEL, policy=policy))
                library = swebench_retention(runs, budget, reference)
                print(_row("library", library, budget), flush=True)
                with open_store(f"sqlite:///{Path(tmp) / f'session-{budget}.db'}") as own:
                    stored = swebench_retention(runs, budget, SessionBuilder(own, policy))
                print(_row("session", stored, budget), flush=True)
                # a proxy of its own per budget: one that had replayed these runs at
                # another budget would find their messages' entities, counts and cuts
                # in its caches, which no message a real proxy receives does
                counted = Path(tmp) / f"callgrind-{budget}.out" if args.callgrind else None
                with _serving(db, upstream.url, served, counted) as (proxy, base):
                    through, direct = (
                        Caller(base, key, args.client),
                        Caller(upstream.url, key, args.client),
                    )
                    builder = ProxyBuilder(through, upstream, runs, direct)
                    sent = Recorded(builder)
                    speed0 = reference_ms()
                    cpu0, built0 = read_cpu(proxy.pid), _build_seconds(base, "responses")
                    with callgrind_counting(proxy.pid) if counted else nullcontext():
                        proxied = swebench_retention(runs, budget, sent)
                    cpu = seconds_between(cpu0, read_cpu(proxy.pid))
                    built1 = _build_seconds(base, "responses")
                    speed1 = reference_ms()
                    through.close()
                    direct.close()
                calls = max(len(builder.seconds), 1)
                build_ms = (built1[0] - built0[0]) / max(built1[1] - built0[1], 1) * 1000
                cpu_ms = cpu / calls * 1000
                p50 = percentile_ms(builder.seconds, 0.5)
                direct_p50 = percentile_ms(builder.direct_seconds, 0.5)
                same = sum(a == b for a, b in zip(reference.contexts, sent.contexts, strict=True))
                unequal += len(sent.contexts) - same
                instructions = callgrind_instructions(counted) / calls if counted else None
                equal = f"{same}/{len(sent.contexts)} contexts equal to the library's"
                if instructions is None:
                    note = (f"proxy CPU {cpu_ms:.1f} ms/call, sync+build {build_ms:.1f} ms, "
                            f"{args.client} call p50 {p50:.1f} ms (direct {direct_p50:.1f}: "
                            f"{p50 - direct_p50:+.1f}), {equal}")  # fmt: skip
                else:
                    note = f"proxy {instructions / 1e6:.2f}M instructions/call (callgrind), {equal}"
                print(_row("proxy", proxied, budget, note), flush=True)
                verdicts = [] if counted else _verdicts(cpu_ms, p50 - direct_p50)
                if verdicts:
                    judged = "; ".join(f"{v.target}: {v.word} ({v.figures})" for v in verdicts)
                    print(f"{'':<8} {budget:>6} {judged} (issue 36); the machine: "
                          f"reference loop {speed0:.2f} ms before, {speed1:.2f} ms after "
                          f"(`python -m timeit \"{REFERENCE_LOOP}\"`, lower is faster)",
                          flush=True)  # fmt: skip
                figures["budgets"][str(budget)] = {
                    "library": library.to_json(), "session": stored.to_json(),
                    "proxy": proxied.to_json(),
                    "proxy_cpu_ms_per_call": cpu_ms, "proxy_build_ms": build_ms,
                    "client": args.client, "call_p50_ms": p50,
                    "direct_call_p50_ms": direct_p50, "added_p50_ms": p50 - direct_p50,
                    "calls": len(builder.seconds),
                    "proxy_pid": proxy.pid,
                    "contexts_equal_to_library": same,
                    "targets": [v.as_dict() for v in verdicts],
                    "reference_ms_before": speed0, "reference_ms_after": speed1,
                    "proxy_instructions_per_call": instructions,
                }  # fmt: skip
        branches = _branches(db, tenant)
        figures["branches"] = branches
        print(f"stored sessions: {len(branches)} branches (each call extended its session)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if branches or unequal else 0


if __name__ == "__main__":
    raise SystemExit(main())
