"""Issue 13's targets for ``ctxwarden serve`` (R14), judged on one run of
:mod:`ctxwarden_bench.proxy`, so that a run says whether it met them instead of leaving
the reader to compare a table with the issue.

The targets are for a 2-core machine, a 200-message tool-using conversation (~330 KB
body) and one worker process: p50 added over calling the upstream directly ≤ 5 ms at 1
client (JSON and streams), the proxy's CPU ≤ 5 ms per request, ≥ 150 requests/s, 0
errors at 64 concurrent streams, no stored message lost or duplicated. Each is judged on
the cases the run has: the fewest clients for latency, the most for throughput and
errors. Requests per second are judged on pre-built bodies, what the proxy itself can
serve: through a provider's SDK the client can be the ceiling (the ``openai`` SDK
spends tens of ms preparing each body, so the upstream called directly gets ~30 calls/s
from it), and that figure is printed beside, with the same client's direct one, not
dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxwarden_bench.proxy import Case

ADDED_P50_MS = 5.0
CPU_MS_PER_REQUEST = 5.0
PREBUILT = frozenset({"httpx", "responses-httpx"})
"""The clients that post pre-built bodies (chat or Responses): what the proxy can serve."""
REQUESTS_PER_SECOND = 150.0


@dataclass(frozen=True)
class Verdict:
    """One target: met (True), missed (False), or not decidable from the run (None,
    with why in ``figures``)."""

    target: str
    met: bool | None
    figures: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def word(self) -> str:
        """How a report says it: met, MISSED or unknown."""
        return {True: "met", False: "MISSED", None: "unknown"}[self.met]


def _name(c: Case) -> str:
    return f"{c.client} {c.mode} x{c.clients}"


def _clients(n: int) -> str:
    return f"{n} client{'s' * (n != 1)}"


def judge(cases: Sequence[Case], problems: Sequence[str]) -> list[Verdict]:
    """The five targets, each judged on the cases of ``cases`` it speaks of."""
    proxy = [c for c in cases if c.target == "proxy"]
    direct = {(c.client, c.mode, c.clients): c for c in cases if c.target == "direct"}
    if not proxy:
        return [Verdict("any target", None, "the run has no proxied case")]
    fewest, most = min(c.clients for c in proxy), max(c.clients for c in proxy)
    return [
        _latency(proxy, direct, fewest),
        _cpu(proxy),
        _throughput(proxy, direct, most),
        _stream_errors(proxy, most),
        Verdict(
            "no stored message lost or duplicated",
            not problems,
            f"{len(problems)} problems in the stored sessions"
            + (f": {problems[0]}" if problems else ""),
        ),
    ]


def _latency(proxy: list[Case], direct: dict[tuple[str, str, int], Case], n: int) -> Verdict:
    target = f"p50 added <= {ADDED_P50_MS:g} ms at {_clients(n)}"
    added = []
    for c in (c for c in proxy if c.clients == n):
        base = direct.get((c.client, c.mode, c.clients))
        if base is not None:
            added.append((c, c.pct(0.5) - base.pct(0.5)))
    if not added:
        return Verdict(target, None, "no direct case to compare with")
    shown = ", ".join(f"{c.client} {c.mode} {ms:+.1f}" for c, ms in added)
    return Verdict(target, all(ms <= ADDED_P50_MS for _, ms in added), shown)


def _cpu(proxy: list[Case]) -> Verdict:
    target = f"proxy CPU <= {CPU_MS_PER_REQUEST:g} ms per request"
    per = [(c, ms) for c in proxy if (ms := c.cpu_ms) is not None]
    if not per:
        return Verdict(target, None, "no CPU was read")
    worst, ms = max(per, key=lambda p: p[1])
    met = sum(1 for _, v in per if v <= CPU_MS_PER_REQUEST)
    figures = f"{met} of {len(per)} cases; highest {ms:.2f} ms ({_name(worst)})"
    return Verdict(target, met == len(per), figures)


def _throughput(proxy: list[Case], direct: dict[tuple[str, str, int], Case], n: int) -> Verdict:
    target = f">= {REQUESTS_PER_SECOND:g} requests/s at {_clients(n)}, pre-built bodies"
    top = [c for c in proxy if c.clients == n]
    built = [c for c in top if c.client in PREBUILT]
    through_sdk = [
        f"{_name(c)} {c.per_second:.0f}/s (direct {direct[key].per_second:.0f}/s)"
        if (key := (c.client, c.mode, c.clients)) in direct
        else f"{_name(c)} {c.per_second:.0f}/s"
        for c in top
        if c.client not in PREBUILT
    ]
    ceiling = "the same client calling directly: its ceiling"
    beside = f"; through the SDK ({ceiling}): {', '.join(through_sdk)}"
    if not built:
        return Verdict(target, None, "run with --kinds httpx" + beside * bool(through_sdk))
    shown = ", ".join(f"{_name(c)} {c.per_second:.0f}/s" for c in built)
    met = all(c.per_second >= REQUESTS_PER_SECOND for c in built)
    return Verdict(target, met, shown + beside * bool(through_sdk))


def _stream_errors(proxy: list[Case], n: int) -> Verdict:
    target = f"0 errors at {n} concurrent stream{'s' * (n != 1)}"
    streams = [c for c in proxy if c.clients == n and c.mode == "stream"]
    if not streams:
        return Verdict(target, None, "run with --modes stream")
    shown = ", ".join(f"{_name(c)} {c.errors} of {c.requests}" for c in streams)
    return Verdict(target, all(c.errors == 0 for c in streams), shown)


def report(verdicts: Sequence[Verdict]) -> None:
    print("issue 13's targets (2 cores, 200 messages, one worker):")
    for v in verdicts:
        print(f"  {v.word:<8}{v.target}: {v.figures}")
