"""``python -m ctxwarden_bench.traces``: the real-trace rows of the bench, per strategy
(LoCoMo answer recall; ``--tau`` / ``--swebench`` the retention rows). Kept apart from the
library in ``__init__`` so the report can use the library without a circle."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ctxwarden_bench.report import _retention_table, _swebench, _tau
from ctxwarden_bench.traces import load_locomo, locomo_recall


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ctxwarden_bench.traces``: LoCoMo answer recall, window only / ours /
    full history, and the policy knobs ours ran with. ``--tau`` / ``--swebench`` print
    the retention rows instead (every needed value, the id subset, violations, over
    budget), ``--peers`` adds litellm's and headroom-ai's compressors to them."""
    import argparse
    import os

    parser = argparse.ArgumentParser(
        prog="python -m ctxwarden_bench.traces",
        description="Real-trace rows of the bench, per strategy.",
    )
    base = Path(os.environ.get("CTXWARDEN_DATA", "../shared/data"))
    parser.add_argument("--locomo", type=Path, default=base / "locomo" / "locomo-dev.json")
    parser.add_argument("--budget", type=int, default=4000, help="input-token budget")
    parser.add_argument("--summarizer", default="offline", help="'offline' or a provider spec")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--tau", nargs="?", type=Path, const=base / "tau-bench" / _TAU_FILE)
    parser.add_argument("--swebench", nargs="?", type=Path, const=base / _SWE_FILE)
    parser.add_argument("--peers", action="store_true", help="add litellm and headroom-ai")
    args = parser.parse_args(argv)
    if args.tau or args.swebench:
        return _retention_rows(args.tau, args.swebench, args.peers, args.json)
    spec = None if args.summarizer == "offline" else args.summarizer
    peers: Sequence[str] = ()
    if args.peers:
        from ctxwarden_bench.peers import PEERS

        peers = PEERS
    result = locomo_recall(load_locomo(args.locomo), args.budget, summarizer=spec, peers=peers)
    if args.json:
        rows = {
            k: {f: v for f, v in r.items() if f != "input_tokens_per_turn"}
            for k, r in result.items()
        }
        print(json.dumps(rows, indent=2))
        return 0
    print(f"LoCoMo answer recall at {args.budget:,} tokens (gpt-4o counts), {args.locomo}")
    for name, r in result.items():
        extra = f"  over budget {r['over_budget']}  errors {r['errors']}" if "errors" in r else ""
        cost = (
            f"  cost vs full+cache {r['cache_cost_vs_full']:.0%} (OpenAI-style "
            f"{r['cache_cost_vs_full_openai']:.0%}, model's prices "
            f"{r['cache_cost_vs_full_model']:.0%}), vs sawtooth {r['cache_cost_vs_sawtooth']:.0%}"
            f", whole-prefix calls {r['whole_prefix_share']:.0%}"
            if "cache_cost_vs_full" in r
            else ""
        )
        print(
            f"{name:26} recall {r['answer_recall']:.4f}  reduction {r['reduction']:6.1%}  "
            f"max input {max(r['input_tokens_per_turn'], default=0):,}  questions "
            f"{r['questions']}{extra}{cost}"
        )
    ours = result["ctxwarden"]
    print(f"ctxwarden: {ours['summarizer']}; policy {ours.get('policy', 'bench loop')}")
    return 0


_TAU_FILE = "airline-gpt-4o-dev.json"
_SWE_FILE = Path("swebench-mini") / "swebench-verified-mini-gemini3-dev.json"


def _retention_rows(tau: Path | None, swebench: Path | None, peers: bool, as_json: bool) -> int:
    """Print the bench's tau-bench and swebench-mini rows (the same code as the report)."""
    for path, run in ((tau, _tau), (swebench, _swebench)):
        if path is None:
            continue
        scenario = run(path, None, peers)
        if as_json:
            rows = {
                k: {f: v for f, v in r.items() if f != "input_tokens_per_turn"}
                for k, r in scenario["strategies"].items()
            }
            print(json.dumps(rows, indent=2))
        else:
            print(f"{scenario['description']}\n{path}\n\n{_retention_table(scenario)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
