"""A run of ``python -m ctxwarden_bench.proxy`` judges issue 13's targets itself: each
on the cases it speaks of, missed when one case misses, unknown when the run lacks them."""

from __future__ import annotations

from ctxwarden_bench.proxy import Case
from ctxwarden_bench.proxy_targets import judge


def _case(target: str, client: str, mode: str, clients: int, p50_ms: float, *,
          cpu_ms: float = 3.0, rate: float = 300.0, errors: int = 0) -> Case:  # fmt: skip
    n = 100
    return Case(target, client, mode, clients, latencies=[p50_ms / 1000] * n, warmup=[],
                errors=errors, seconds=n / rate,
                cpu_seconds=cpu_ms * n / 1000 if target == "proxy" else None)  # fmt: skip


def _run(**proxy_changes: dict[str, float]) -> list[Case]:
    """A whole run's cases (1 and 64 clients, both clients, both modes), the proxy's
    figures changed where ``proxy_changes`` says (keyed ``client_mode_clients``)."""
    cases = []
    for clients in (1, 64):
        for mode in ("json", "stream"):
            for client in ("httpx", "sdk"):
                sdk = client == "sdk"
                direct_rate = 30.0 if sdk else 1600.0
                cases.append(_case("direct", client, mode, clients, 1.2, rate=direct_rate))
                figures = {"p50_ms": 3.2, "cpu_ms": 3.0, "rate": 30.0 if sdk else 320.0}
                figures.update(proxy_changes.get(f"{client}_{mode}_{clients}", {}))
                errors = int(figures.pop("errors", 0))
                cases.append(_case("proxy", client, mode, clients, errors=errors, **figures))
    return cases


def test_a_run_within_every_target_meets_all_five() -> None:
    verdicts = judge(_run(), [])
    assert [v.met for v in verdicts] == [True] * 5
    latency, cpu, rate, errors, _ = verdicts
    assert latency.target == "p50 added <= 5 ms at 1 client"
    assert "httpx json +2.0" in latency.figures and "sdk stream +2.0" in latency.figures
    assert cpu.figures.startswith("8 of 8 cases")
    # the SDK's rate is shown beside, with what the same client got directly
    assert "httpx json x64 320/s" in rate.figures
    assert "sdk json x64 30/s (direct 30/s)" in rate.figures
    assert errors.target == "0 errors at 64 concurrent streams"


def test_one_case_over_a_target_misses_it_and_is_named() -> None:
    verdicts = judge(
        _run(sdk_stream_1={"p50_ms": 6.5}, httpx_json_64={"cpu_ms": 5.4, "rate": 140.0},
             httpx_stream_64={"errors": 2}),
        ["s3: 201 stored, 202 expected"],
    )  # fmt: skip
    latency, cpu, rate, errors, stored = verdicts
    assert latency.met is False and "sdk stream +5.3" in latency.figures
    assert cpu.met is False and cpu.figures == "7 of 8 cases; highest 5.40 ms (httpx json x64)"
    assert rate.met is False and "httpx json x64 140/s" in rate.figures
    assert errors.met is False and "httpx stream x64 2 of 100" in errors.figures
    assert stored.met is False and "201 stored" in stored.figures


def test_a_target_the_run_cannot_speak_of_is_unknown_not_met() -> None:
    only_sdk_json = [c for c in _run() if c.client == "sdk" and c.mode == "json"]
    latency, cpu, rate, errors, stored = judge(only_sdk_json, [])
    assert latency.met is True and cpu.met is True and stored.met is True
    assert rate.met is None and rate.figures.startswith("run with --kinds httpx")
    assert errors.met is None and errors.figures == "run with --modes stream"
    assert [v.met for v in judge([c for c in _run() if c.target == "direct"], [])] == [None]
