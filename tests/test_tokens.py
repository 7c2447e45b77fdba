"""Token counting: the published OpenAI formula, offline loading, caching, estimates."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest

import ctxwarden
from ctxwarden.core.messages import ImagePart, Message, TextPart, ToolCall
from ctxwarden.core.registry.catalog import Registry, load_registry
from ctxwarden.core.tokens.counter import (
    ESTIMATE_FACTORS,
    SCRIPT_FACTORS,
    ScriptFactors,
    TokenCounter,
    render_tools,
    script_chars,
)
from ctxwarden.core.tokens.encodings import get_encoding
from ctxwarden.core.tokens.images import image_size, tile_tokens
from ctxwarden.formats.count import count_tokens
from ctxwarden.session.session import count_key


def cookbook_count(messages: list[dict[str, Any]], encoding_name: str) -> int:
    """OpenAI cookbook's num_tokens_from_messages, written out independently."""
    enc = get_encoding(encoding_name)
    total = 0
    for message in messages:
        total += 3
        for key, value in message.items():
            total += len(enc.encode(value))
            if key == "name":
                total += 1
    return total + 3


def test_plain_text_messages_match_published_formula_on_tau_bench(tau_bench_path: Path) -> None:
    runs = json.loads(tau_bench_path.read_text())
    checked = 0
    for run in runs:
        plain = [m for m in run["traj"] if m["role"] in ("system", "user", "assistant")]
        plain = [m for m in plain if isinstance(m.get("content"), str) and "tool_calls" not in m]
        for model, encoding in (("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")):
            assert count_tokens(plain, model=model) == cookbook_count(plain, encoding)
        checked += 1
    assert checked == len(runs) == 120


def test_plain_text_count_is_exact_and_tool_calls_are_labelled() -> None:
    counter = TokenCounter("gpt-4o")
    plain = [Message.system("You are terse."), Message.user("hi there")]
    result = counter.count_messages(plain)
    assert result.exact and result.encoding == "o200k_base"
    with_call = [*plain, Message.assistant(None, (ToolCall("c1", "lookup", '{"q": "x"}'),))]
    assert not counter.count_messages(with_call).exact


def test_tool_call_method_is_name_plus_arguments_plus_framing() -> None:
    counter = TokenCounter("gpt-4o")
    enc = get_encoding("o200k_base")
    call = ToolCall("call_1", "get_user_details", '{"user_id": "mia_li_3668"}')
    msg = Message.assistant(None, (call,))
    expected = 3 + len(enc.encode("assistant")) + 3 + len(enc.encode(call.name))
    expected += len(enc.encode(call.arguments))
    assert counter.count_message(msg) == expected
    result = Message.tool('{"ok": true}', "call_1", name="get_user_details")
    expected_result = 3 + len(enc.encode("tool")) + len(enc.encode('{"ok": true}'))
    expected_result += len(enc.encode("get_user_details")) + 1
    assert counter.count_message(result) == expected_result


def test_tool_definitions_are_rendered_and_counted() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "unit": {"type": "string", "enum": ["c", "f"]},
                    },
                    "required": ["city"],
                },
            },
        }
    ]
    rendered = render_tools(tools)
    assert "type get_weather = (_: {" in rendered
    assert "// City name" in rendered and 'unit?: "c" | "f",' in rendered
    counter = TokenCounter("gpt-4o")
    msgs = [Message.user("weather in Kyiv?")]
    without = counter.count_messages(msgs).tokens
    assert counter.count_messages(msgs, tools).tokens == without + counter.count_tools(tools)
    assert counter.count_tools(tools) > 20


def test_models_choose_their_encoding() -> None:
    assert TokenCounter("gpt-4o").encoding_name == "o200k_base"
    assert TokenCounter("gpt-5-mini").encoding_name == "o200k_base"
    assert TokenCounter("o3").encoding_name == "o200k_base"
    assert TokenCounter("gpt-4").encoding_name == "cl100k_base"
    assert TokenCounter("gpt-3.5-turbo").encoding_name == "cl100k_base"


def test_cjk_and_cyrillic_are_counted_by_the_real_tokenizer() -> None:
    counter = TokenCounter("gpt-4o")
    enc = get_encoding("o200k_base")
    for text in ("你好，世界。今天天气很好。", "Привіт, світе! Як справи?", "日本語のテキスト"):
        assert counter.count_text(text) == len(enc.encode(text))
        assert counter.count_text(text) > 0


def test_other_families_are_estimates() -> None:
    msgs = [Message.user("The quick brown fox jumps over the lazy dog. " * 20)]
    claude = TokenCounter("claude-sonnet-4-5").count_messages(msgs)
    gpt = TokenCounter("gpt-4o").count_messages(msgs)
    assert not claude.exact and claude.method.startswith("estimate:")
    assert claude.tokens > gpt.tokens  # conservative: never under the OpenAI count


def test_unknown_model_is_a_clear_error() -> None:
    with pytest.raises(ctxwarden.UnknownModelError, match="unknown model 'bananas-7'"):
        TokenCounter("bananas-7")


def test_counts_are_cached_per_message() -> None:
    counter = TokenCounter("gpt-4o")
    history = [Message.user(f"message number {i} with some words") for i in range(50)]
    first = counter.count_messages(history).tokens
    calls = 0
    original = counter._message_tokens

    def spy(message: Message) -> tuple[int, bool]:
        nonlocal calls
        calls += 1
        return original(message)

    counter._message_tokens = spy  # type: ignore[method-assign]
    history.append(Message.assistant("a new reply"))
    second = counter.count_messages(history).tokens
    assert calls == 1  # only the new message was tokenized
    assert second == first + counter.count_message(history[-1])


def test_counts_kept_on_a_message_belong_to_their_way_of_counting() -> None:
    """A message counted by several counters (models of other encodings or factors, a
    lower counting limit) keeps each one's count apart: every counter, one message at a
    time or in bulk, gives what a new counter gives for a new copy of the message."""
    long_text = "Пример текста для подсчёта. " * 400
    history = [Message.user(f"message {i} " + ("word " * i)) for i in range(30)]
    history += [Message.user(long_text), Message.assistant("short reply")]
    counters = [
        TokenCounter("gpt-4o"),
        TokenCounter("gpt-4"),
        TokenCounter("claude-opus-4-5"),
        TokenCounter("claude-opus-4-7", registry=Registry.builtin().with_overrides(OPUS_47)),
        TokenCounter("gpt-4o", max_counted_chars=1_000),
    ]
    for _ in range(2):  # the second round reads what the first kept
        for counter in counters:
            fresh = TokenCounter(counter.model, max_counted_chars=counter.max_counted_chars)
            if counter.factor != fresh.factor:
                fresh = TokenCounter(
                    counter.model, registry=Registry.builtin().with_overrides(OPUS_47)
                )
            copies = [dataclasses.replace(m) for m in history]
            expected = [fresh.measure(m) for m in copies]
            assert [counter.measure(m) for m in history] == expected
            assert counter.measured(history) == expected
            assert counter.total(history) == sum(t for t, _ in expected)
    # four ways of counting, four counts: a count read from another's would show
    assert len({c.count_message(history[-2]) for c in counters[:4]}) == 4


def _png(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = (
        struct.pack(">I", len(ihdr))
        + b"IHDR"
        + ihdr
        + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    )
    return b"\x89PNG\r\n\x1a\n" + chunk


def test_image_tokens_follow_the_tile_formula() -> None:
    assert tile_tokens(1024, 1024) == 765
    assert tile_tokens(2048, 4096) == 1105
    assert tile_tokens(4000, 4000, "low") == 85
    assert image_size(_png(640, 480)) == (640, 480)
    url = "data:image/png;base64," + base64.b64encode(_png(640, 480)).decode()
    counter = TokenCounter("gpt-4o")
    msg = Message.user((TextPart("what is this?"), ImagePart(url=url)))
    text_only = counter.count_message(Message.user((TextPart("what is this?"),)))
    assert counter.count_message(msg) == text_only + tile_tokens(640, 480)
    assert counter.count_messages([msg]).exact
    remote = Message.user((ImagePart(url="https://example.com/cat.png"),))
    assert not counter.count_messages([remote]).exact


def test_counting_works_with_sockets_blocked(tmp_path: Path) -> None:
    """A fresh process with an empty cache and every socket refused still counts."""
    script = textwrap.dedent(
        """
        import socket
        def refuse(*a, **k):
            raise OSError("network blocked by test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from ctxwarden.formats.count import count_tokens
        n = count_tokens([{"role": "user", "content": "hello world"}], model="gpt-4o")
        m = count_tokens([{"role": "user", "content": "hello world"}], model="gpt-4")
        print(n, m)
        """
    )
    env = {**os.environ, "CTXWARDEN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TIKTOKEN_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["9", "9"]
    assert len(list((tmp_path / "cache" / "tiktoken").iterdir())) >= 2


OPUS_47 = (
    '[models."claude-opus-4-7"]\nprovider = "anthropic"\ncontext_window = 200_000\n'
    'max_output_tokens = 32_000\nestimator = "claude"\nestimate_factor = 1.46\n'
    "price = { input = 5, output = 25 }\n"
)
MY_GPT = (
    '[models."acme-gpt"]\nprovider = "azure"\ncontext_window = 128_000\n'
    'max_output_tokens = 16_384\nencoding = "o200k_base"\nprice = { input = 2.5, output = 10 }\n'
)


def test_a_registry_models_own_factor_replaces_the_family_factor() -> None:
    registry = Registry.builtin().with_overrides(OPUS_47)
    newer = TokenCounter("claude-opus-4-7", registry=registry)
    older = TokenCounter("claude-opus-4-5")
    assert (newer.family, newer.factor, older.factor) == ("claude", 1.46, 1.09)
    enc = get_encoding("o200k_base")
    text = "The quick brown fox jumps over the lazy dog. " * 20
    raw = 3 + len(enc.encode("user")) + len(enc.encode(text))
    msg = Message.user(text)
    assert newer.count_message(msg) == -(-raw * 146 // 100)  # scaled, rounded up
    assert older.count_message(msg) == -(-raw * 109 // 100)
    # without the entry the name falls back to the family factor
    assert TokenCounter("claude-opus-4-7").factor == ESTIMATE_FACTORS["claude"]
    # a session stores counts per key: the two factors must not share one
    assert count_key(newer) != count_key(older)
    assert count_key(newer) == "o200k_base~claudex1.46"


def test_a_user_model_mapped_to_an_encoding_counts_exactly(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(MY_GPT)
    registry = load_registry([path], use_env=False)
    chat = [Message.system("You are terse."), Message.user("What is 2 + 2?")]
    mine = TokenCounter.for_model("acme-gpt", registry=registry).count_messages(chat)
    gpt = TokenCounter.for_model("gpt-4o").count_messages(chat)
    assert mine == gpt and mine.exact and mine.method == "openai-chat-formula"
    with pytest.raises(ctxwarden.UnknownModelError):
        TokenCounter("acme-gpt")  # only the user's registry knows it


def test_for_model_shares_one_counter_per_model_and_registry(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(OPUS_47)
    first = TokenCounter.for_model("claude-opus-4-7", load_registry([path], use_env=False))
    again = TokenCounter.for_model("claude-opus-4-7", load_registry([path], use_env=False))
    assert first is again  # loaded twice, equal contents: one cache
    assert TokenCounter.for_model("gpt-4o") is TokenCounter.for_model("gpt-4o", Registry.default())
    assert TokenCounter.for_model("claude-opus-4-7") is not first  # default registry: family


def test_for_model_follows_the_environment_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env.toml"
    path.write_text(OPUS_47)
    assert TokenCounter.for_model("claude-opus-4-7").factor == 1.09
    monkeypatch.setenv("CTXWARDEN_MODELS", str(path))
    assert TokenCounter.for_model("claude-opus-4-7").factor == 1.46
    monkeypatch.delenv("CTXWARDEN_MODELS")
    assert TokenCounter.for_model("claude-opus-4-7").factor == 1.09


def test_unknown_model_error_from_the_counter_carries_the_registrys_suggestions() -> None:
    with pytest.raises(ctxwarden.UnknownModelError) as info:
        TokenCounter.for_model("gpt4o")
    assert info.value.suggestions[0] == "gpt-4o"
    assert "Did you mean: gpt-4o," in str(info.value)


UKRAINIAN = (
    "Доброго дня! Я хочу змінити дату свого рейсу з Києва до Львова на наступний вівторок. "
    "Агент перевірив бронювання і повідомив, що зміна можлива з доплатою сорок євро. "
) * 8
ENGLISH = (
    "Good afternoon! I would like to move my flight from Kyiv to Lviv to next Tuesday. "
    "The agent checked the booking and said the change costs forty euros extra. "
) * 8
POLISH = (
    "Dzień dobry! Chciałbym przenieść mój lot z Krakowa do Gdańska na przyszły wtorek. "
    "Agent sprawdził rezerwację i powiedział, że zmiana kosztuje czterdzieści złotych. "
) * 8
CHINESE = (
    "您好，我想把下周二从北京飞往上海的航班改到周四。客服确认了预订信息，并告知改签需要支付手续费。"
    * 8
)


def _o200k(text: str) -> int:
    return len(get_encoding("o200k_base").encode(text))


def test_cyrillic_and_cjk_text_cost_their_scripts_factor_for_claude() -> None:
    claude = TokenCounter("claude-sonnet-4-5")
    factors = SCRIPT_FACTORS["claude"]
    assert claude.count_text(ENGLISH) == -(-_o200k(ENGLISH) * 109 // 100)  # Latin: unchanged
    per_token = {t: claude.count_text(t) / _o200k(t) for t in (UKRAINIAN, ENGLISH, CHINESE)}
    assert per_token[UKRAINIAN] == pytest.approx(factors.cyrillic, abs=0.02)
    assert per_token[CHINESE] == pytest.approx(factors.cjk, abs=0.02)
    # the measured surcharge: Cyrillic ~1.31 / Latin 1.09 per o200k token
    surcharge = per_token[UKRAINIAN] / per_token[ENGLISH]
    assert surcharge == pytest.approx(factors.cyrillic / factors.latin, abs=0.03)
    assert surcharge > 1.15
    # a message is scaled the same way (framing and role at the Latin factor)
    framing = (3 + _o200k("user")) * factors.latin
    message = claude.count_message(Message.user(UKRAINIAN))
    assert abs(message - (claude.count_text(UKRAINIAN) + framing)) <= 1
    llama = TokenCounter("llama-3.1-70b")  # Llama 3's vocabulary barely cares
    assert llama.count_text(UKRAINIAN) / _o200k(UKRAINIAN) < 1.05


def test_mixed_text_lies_between_its_scripts() -> None:
    claude = TokenCounter("claude-sonnet-4-5")
    mixed = UKRAINIAN[:400] + " " + ENGLISH[:400]
    ratio = claude.count_text(mixed) / _o200k(mixed)
    factors = SCRIPT_FACTORS["claude"]
    assert factors.latin + 0.05 < ratio < factors.cyrillic - 0.05
    cyrillic, cjk, ext = script_chars(mixed)
    assert cjk == ext == 0 and cyrillic == sum(ch.isalpha() for ch in UKRAINIAN[:400])


def test_script_chars_counts_latin_letters_with_diacritics_only() -> None:
    assert script_chars("plain ASCII text") == (0, 0, 0)
    assert script_chars("Zażółć gęślą jaźń") == (0, 0, 9)
    assert script_chars("Tiếng Việt, Čeština, Română: ș ț") == (0, 0, 8)
    # signs of the same blocks are not letters: × ÷ and Latin-1 punctuation
    assert script_chars("3 × 4 ÷ 2 « » ¿ © °") == (0, 0, 0)


def test_polish_text_costs_the_latin_ext_factor_for_claude() -> None:
    """Polish costs Claude about 1.19 / 1.09 of English per o200k token (measured on the
    Polish seed paragraphs); before the Latin-ext class it was counted like English."""
    claude = TokenCounter("claude-sonnet-4-5")
    factors = SCRIPT_FACTORS["claude"]
    assert factors.latin_ext > factors.latin
    polish = claude.count_text(POLISH) / _o200k(POLISH)
    english = claude.count_text(ENGLISH) / _o200k(ENGLISH)
    assert english == pytest.approx(factors.latin, abs=0.01)  # English unchanged
    assert polish == pytest.approx(factors.latin_ext, abs=0.02)
    assert polish / english == pytest.approx(factors.latin_ext / factors.latin, abs=0.02)
    # one accented name in English text adds a little, not the Polish surcharge
    named = ENGLISH.replace("Kyiv", "Kraków")
    assert claude.count_text(named) - claude.count_text(ENGLISH.replace("Kyiv", "Krakow")) > 0
    assert claude.count_text(named) / _o200k(named) < factors.latin + 0.03
    # Llama 3 is charged its own measured surcharge
    llama = TokenCounter("llama-3.1-70b")
    ratio = llama.count_text(POLISH) / _o200k(POLISH)
    assert ratio == pytest.approx(SCRIPT_FACTORS["llama"].latin_ext, abs=0.02)


def test_openai_counts_ignore_scripts() -> None:
    chat = [
        {"role": "user", "content": UKRAINIAN},
        {"role": "assistant", "content": CHINESE},
        {"role": "user", "content": POLISH},
    ]
    for model, encoding in (("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")):
        assert count_tokens(chat, model=model) == cookbook_count(chat, encoding)
    assert TokenCounter("gpt-4o").scripts is None


def test_a_models_own_factor_is_the_latin_factor_and_a_floor_for_other_scripts() -> None:
    registry = Registry.builtin().with_overrides(OPUS_47)
    newer = TokenCounter("claude-opus-4-7", registry=registry)
    assert newer.scripts is not None
    assert newer.scripts == ScriptFactors(1.46, 1.46, 1.46, 1.46)
    assert newer.count_text(UKRAINIAN) == -(-_o200k(UKRAINIAN) * 146 // 100)
    cheap = Registry.builtin().with_overrides(OPUS_47.replace("1.46", "1.0"))
    low = TokenCounter("claude-opus-4-7", registry=cheap)
    claude = SCRIPT_FACTORS["claude"]
    assert low.scripts == ScriptFactors(1.0, claude.cyrillic, claude.cjk, claude.latin_ext)
    assert low.count_text(ENGLISH) == _o200k(ENGLISH)
    assert low.count_text(UKRAINIAN) > _o200k(UKRAINIAN) * 1.25
    # differing estimates keep differing session count keys
    keys = {count_key(c) for c in (newer, low, TokenCounter("claude-opus-4-5"))}
    assert len(keys) == 3


def test_session_count_keys_name_every_script_factor() -> None:
    """Counts stored before the per-script factors (key ``...claudex1.09``) no longer
    match, so a session counts those messages again instead of using the lower figure."""
    sonnet = TokenCounter("claude-sonnet-4-5")
    assert count_key(sonnet) == "o200k_base~claudex1.09/1.31/1.36/1.19"
    assert count_key(TokenCounter.for_model("gpt-4o")) == "o200k_base"
    # counts stored before the Latin-ext factor (``.../1.31/1.36``) are counted again, and
    # a counter differing only in that factor keeps its own counts
    assert sonnet.scripts is not None
    other = TokenCounter("claude-sonnet-4-5")
    other.scripts = dataclasses.replace(sonnet.scripts, latin_ext=sonnet.scripts.latin)
    assert count_key(other) == "o200k_base~claudex1.09/1.31/1.36/1.09"
    assert len({count_key(sonnet), count_key(other), "o200k_base~claudex1.09/1.31/1.36"}) == 3
    assert count_key(TokenCounter("mistral-large")) == "o200k_base~mistralx1.15"


def test_a_short_text_counts_what_encode_with_no_special_tokens_gives() -> None:
    """count_text encodes a short text with ``encode_ordinary``: the very tokens of
    ``encode(text, disallowed_special=())`` — special-token text, a lone surrogate and
    a whitespace run included — and the recent-text cache, once full, keeps counting
    the same after evicting its oldest texts."""
    enc = get_encoding("o200k_base")
    counter = TokenCounter("gpt-4o")
    texts = ["<|endoftext|> and <|fim_prefix|>", "x\ud800y", " " * 5000, "naïve café 東京", ""]
    texts += [f" value-{i} {i * 7}" for i in range(3000)]  # past the cache's 2,048 texts
    for text in texts + texts[:10]:
        expected = len(
            enc.encode(
                text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"),
                disallowed_special=(),
            )
        )
        assert counter.count_text(text) == expected, text[:40]
