"""The model registry: the shipped data, name resolution, and user overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxwarden.core.errors import ConfigError, UnknownModelError, UsageError
from ctxwarden.core.registry.catalog import ModelInfo, Registry, get_model, load_registry
from ctxwarden_bench.calibrate import claude_version, ctok_version, registry_check

REQUIRED = [
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-5",
    "gpt-5-mini",
    "o3",
    "o4-mini",
    "gpt-3.5-turbo",
    "gpt-4",
    "claude-3-5-sonnet",
    "claude-3-5-haiku",
    "claude-sonnet-4",
    "claude-sonnet-4-5",
    "claude-opus-4",
    "claude-opus-4-1",
    "claude-haiku-4-5",
    "gemini-1.5-pro",
    "gemini-1.5-flash",
    "gemini-2.5-pro",
    "gemini-2.5-flash",
    "deepseek-chat",
    "llama3.1:8b",
    "qwen3:8b",
]


@pytest.fixture
def builtin() -> Registry:
    return Registry.builtin()


def test_required_models_are_shipped(builtin: Registry) -> None:
    missing = [name for name in REQUIRED if name not in builtin.names()]
    assert missing == []


def test_openai_models_count_exactly_with_the_right_encoding(builtin: Registry) -> None:
    cl100k = {m.name for m in builtin if m.encoding == "cl100k_base"}
    assert {"gpt-4", "gpt-3.5-turbo"} <= cl100k
    for name in ("gpt-4o", "gpt-4.1", "gpt-5", "o3", "o4-mini"):
        assert builtin.get(name).encoding == "o200k_base"
    for m in builtin:
        assert m.exact == (m.provider == "openai"), m.name
        assert (m.encoding is None) != (m.estimator is None), m.name


def test_anthropic_cache_prices_follow_the_published_multipliers(builtin: Registry) -> None:
    # Claude 3 Haiku is the published exception: writes $0.30, reads $0.03 on $0.25 input
    claude = [m for m in builtin if m.provider == "anthropic" and m.name != "claude-3-haiku"]
    assert len(claude) >= 7
    for m in claude:
        assert m.price.cache_write == pytest.approx(1.25 * m.price.input), m.name
        assert m.price.cached_input == pytest.approx(0.1 * m.price.input), m.name
        assert m.estimator == "claude"


def test_limits_are_consistent_and_local_models_are_free(builtin: Registry) -> None:
    for m in builtin:
        assert 0 < m.max_output_tokens <= m.context_window, m.name
        if m.price.cached_input is not None:
            assert m.price.cached_input < m.price.input, m.name
    for name in ("llama3.1:8b", "qwen3:8b"):
        info = builtin.get(name)
        assert (info.provider, info.price.input, info.price.output) == ("ollama", 0.0, 0.0)
    assert builtin.get("gpt-4o").price.cache_write is None  # OpenAI has no write charge


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # not gpt-4o
        ("gpt-4o-2024-05-13", "gpt-4o-2024-05-13"),  # listed on its own: launch price
        ("GPT-4o", "gpt-4o"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-4-1106-preview", "gpt-4-turbo"),  # not gpt-4, despite the suffixes
        ("gpt-3.5-turbo-0125", "gpt-3.5-turbo"),
        ("o4-mini-2025-04-16", "o4-mini"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-3-5-sonnet-latest", "claude-3-5-sonnet"),
        ("claude-sonnet-4-0", "claude-sonnet-4"),
        ("openai:gpt-4o", "gpt-4o"),
        ("openrouter:openai/gpt-4o", "gpt-4o"),
        ("openrouter:anthropic/claude-3.5-sonnet", "claude-3-5-sonnet"),
        ("anthropic:claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("us.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet"),
        ("claude-3-5-sonnet-v2@20241022", "claude-3-5-sonnet"),
        ("models/gemini-1.5-pro-002", "gemini-1.5-pro"),
        ("gemini-2.5-flash-preview-05-20", "gemini-2.5-flash"),
        ("ollama:qwen3:8b", "qwen3:8b"),
        ("qwen3", "qwen3:8b"),
        ("llama3.1:8b-instruct-q4_K_M", "llama3.1:8b"),
        ("deepseek/deepseek-chat", "deepseek-chat"),
    ],
)
def test_names_resolve(builtin: Registry, name: str, expected: str) -> None:
    assert builtin.resolve(name) == expected
    assert name in builtin


@pytest.mark.parametrize(
    "name", ["o3-mini", "gpt-4o-realtime-preview-2024-12-17", "gpt-4-32k", "llama3.1:70b", ""]
)
def test_other_models_are_not_guessed(builtin: Registry, name: str) -> None:
    with pytest.raises(UnknownModelError):
        builtin.get(name)
    assert name not in builtin


def test_unknown_model_error_suggests_and_is_a_user_error(builtin: Registry) -> None:
    with pytest.raises(UnknownModelError) as info:
        builtin.get("gpt-4-32k")
    assert isinstance(info.value, UsageError) and isinstance(info.value, KeyError)
    assert "gpt-4-32k" in str(info.value) and "gpt-4," in str(info.value)


def test_long_context_tier_applies_above_the_threshold(builtin: Registry) -> None:
    pro = builtin.get("gemini-2.5-pro")
    assert pro.price_for(200_000).input == 1.25
    assert pro.price_for(200_001).input == 2.50
    assert builtin.get("gpt-4o").price_for(10_000_000) == builtin.get("gpt-4o").price


def test_partial_override_changes_one_price_and_keeps_the_rest(builtin: Registry) -> None:
    custom = builtin.with_overrides('[models."gpt-4o"]\nprice = { input = 2.0 }\n')
    assert custom.get("gpt-4o-2024-08-06").price.input == 2.0
    assert custom.get("gpt-4o").price.output == 10.0
    assert custom.get("gpt-4o").context_window == 128_000
    assert builtin.get("gpt-4o").price.input == 2.5  # the original is untouched


def test_override_by_alias_and_switching_tokenizer(builtin: Registry) -> None:
    custom = builtin.with_overrides('[models."qwen3"]\nestimator = "llama"\n')
    info = custom.get("qwen3:8b")
    assert (info.estimator, info.encoding) == ("llama", None)
    switched = builtin.with_overrides('[models."claude-3-haiku"]\nencoding = "o200k_base"\n')
    assert switched.get("claude-3-haiku").exact


def test_user_file_adds_a_model(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        '[models."mistral-small"]\nprovider = "mistral"\ncontext_window = 32_000\n'
        'max_output_tokens = 8_000\nestimator = "mistral"\nestimate_factor = 1.3\n'
        'price = { input = 0.2, output = 0.6 }\naliases = ["mistral-small-latest"]\n'
    )
    registry = load_registry([path], use_env=False)
    info = registry.get("mistral:mistral-small-latest")
    assert info == ModelInfo(
        name="mistral-small",
        provider="mistral",
        context_window=32_000,
        max_output_tokens=8_000,
        price=info.price,
        estimator="mistral",
        estimate_factor=1.3,
        aliases=("mistral-small-latest",),
    )
    assert (info.price.input, info.price.output, info.price.cached_input) == (0.2, 0.6, None)
    assert len(registry) == len(Registry.builtin()) + 1


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[models."x"]\nprovider = "a"\n', "model 'x', field 'context_window': missing"),
        ('[models."gpt-4o"]\ncontext_windw = 5\n', "field 'context_windw': unknown field"),
        ('[models."gpt-4o"]\ncontext_window = -1\n', "field 'context_window': must be a positive"),
        ('[models."gpt-4o"]\nmax_output_tokens = 999999\n', "exceeds context_window"),
        ('[models."gpt-4o"]\nprice = { input = "cheap" }\n', "field 'price.input'"),
        ('[models."gpt-4o"]\nprice = { inptu = 1.0 }\n', "field 'price.inptu': unknown price"),
        ('[models."gpt-4o"]\nencoding = "p50k_base"\n', "field 'encoding': must be one of"),
        ('[models."gpt-4o"]\nestimator = "gpt"\n', "field 'estimator': must be one of"),
        (
            '[models."gpt-4o"]\naliases = ["gpt-4"]\n',
            "model 'gpt-4o', field 'aliases': 'gpt-4' already names model 'gpt-4'",
        ),
        ('[model."gpt-4o"]\nprovider = "x"\n', "unknown top-level key 'model'"),
        ('[models."gpt-4o"]\nestimate_factor = 1.1\n', "applies to estimated models only"),
        ('[models."claude-3-haiku"]\nestimate_factor = 0\n', "must be a number > 0"),
        ("[models.\nbroken", "not valid TOML"),
    ],
)
def test_bad_override_file_names_file_and_field(tmp_path: Path, toml: str, needle: str) -> None:
    path = tmp_path / "bad-models.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        Registry.builtin().with_overrides(path)
    assert str(info.value).startswith(f"{path}: ")
    assert needle in str(info.value)


def test_missing_override_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read model registry file"):
        load_registry([tmp_path / "nope.toml"])


def test_env_var_adds_files_to_the_default_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env.toml"
    path.write_text('[models."deepseek-chat"]\nprice = { input = 0.5 }\n')
    monkeypatch.setenv("CTXWARDEN_MODELS", str(path))
    assert get_model("deepseek-chat").price.input == 0.5
    monkeypatch.delenv("CTXWARDEN_MODELS")
    assert get_model("deepseek-chat").price.input == 0.28


def test_unknown_model_suggests_the_nearest_names_ranked() -> None:
    with pytest.raises(UnknownModelError) as info:
        get_model("gpt4o")
    assert info.value.suggestions[:2] == ("gpt-4o", "gpt-4")
    assert "Did you mean: gpt-4o, gpt-4, " in str(info.value)
    assert str(info.value).count(",") == 4  # five names, no more


@pytest.mark.parametrize(
    ("name", "first"),
    [
        ("gtp-5", "gpt-5"),
        ("claude-sonet-4.5", "claude-sonnet-4-5"),
        ("anthropic:claude-sonet-4-5-20250929", "claude-sonnet-4-5"),  # prefix, date stripped
        ("llama3:8b", "llama3.1:8b"),
        ("gemini-pro", "gemini-2.5-pro"),
        ("o3-mini", "o4-mini"),
        ("gpt-4o-realtime-preview-2024-12-17", "gpt-4o"),
    ],
)
def test_suggestions_rank_the_nearest_first(builtin: Registry, name: str, first: str) -> None:
    assert builtin.suggest(name)[0] == first


def test_suggestions_by_containment_and_none_for_nonsense(builtin: Registry) -> None:
    sonnets = {m.name for m in builtin if "sonnet" in m.name}
    assert set(builtin.suggest("sonnet", n=10)) == sonnets
    assert builtin.suggest("bananas-7") == []
    with pytest.raises(UnknownModelError) as info:
        builtin.get("bananas-7")
    assert "Did you mean" not in str(info.value)


def test_override_switching_tokenizer_drops_the_measured_factor(builtin: Registry) -> None:
    assert builtin.get("claude-3-haiku").estimate_factor == 1.09
    exact = builtin.with_overrides('[models."claude-3-haiku"]\nencoding = "o200k_base"\n')
    assert exact.get("claude-3-haiku").estimate_factor is None  # it would be an error
    other = builtin.with_overrides('[models."claude-3-haiku"]\nestimator = "other"\n')
    assert other.get("claude-3-haiku").estimate_factor is None  # measured on Claude's tokens
    same = builtin.with_overrides('[models."claude-3-haiku"]\nestimator = "claude"\n')
    assert same.get("claude-3-haiku").estimate_factor == 1.09
    own = builtin.with_overrides('[models."claude-3-haiku"]\nestimate_factor = 1.2\n')
    assert own.get("claude-3-haiku").estimate_factor == 1.2
    assert own.get("claude-3-haiku").tokenizer == "~claude x1.2"


def test_registries_with_equal_tables_are_equal(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[models."gpt-4o"]\nprice = { input = 2.0 }\n')
    first, second = load_registry([path], use_env=False), load_registry([path], use_env=False)
    assert first is not second and first == second and hash(first) == hash(second)
    assert first != Registry.builtin()
    assert (
        Registry.builtin().with_overrides('[models."gpt-4o"]\nprice = { input = 2.0 }\n') == first
    )


@pytest.mark.parametrize(
    ("name", "version", "ctok"),
    [
        ("claude-3-haiku", (3,), "3.0"),
        ("claude-3-5-sonnet", (3, 5), "3.0"),
        ("claude-opus-4", (4,), "3.0"),
        ("claude-opus-4-20250514", (4,), "3.0"),
        ("claude-sonnet-4-5", (4, 5), "3.0"),
        ("claude-opus-4-7", (4, 7), "4.7"),
        ("claude-sonnet-4.8", (4, 8), "4.7"),
        ("claude-opus-5", (5,), "4.7"),
        ("gpt-4o", None, None),
    ],
)
def test_claude_versions_route_like_ctok(
    name: str, version: tuple[int, ...] | None, ctok: str | None
) -> None:
    assert (claude_version(name), ctok_version(name)) == (version, ctok)


def test_every_shipped_claude_model_carries_its_own_factor(builtin: Registry) -> None:
    claude = [m for m in builtin if m.estimator == "claude"]
    assert len(claude) == 11
    for m in claude:
        # measured on ctok v3 (bench/calibrate.py); 4.7+ would need the v4.7 figure
        assert (ctok_version(m.name), m.estimate_factor) == ("3.0", 1.09), m.name


def test_registry_check_flags_a_newer_claude_left_on_the_family_factor(
    builtin: Registry,
) -> None:
    overall = {"3.0": 1.0898, "4.7": 1.4510}  # calibrate's overall ratios, as input
    assert all(c.ok for c in registry_check(builtin, overall))
    entry = (
        '[models."claude-opus-4-7"]\nprovider = "anthropic"\ncontext_window = 200_000\n'
        'max_output_tokens = 32_000\nestimator = "claude"\nprice = { input = 1, output = 1 }\n'
    )
    newer = builtin.with_overrides(entry)
    flagged = [c for c in registry_check(newer, overall) if not c.ok]
    assert [(c.model, c.version, c.registry, c.measured) for c in flagged] == [
        ("claude-opus-4-7", "4.7", 1.09, 1.46)
    ]
    fixed = builtin.with_overrides(entry + "estimate_factor = 1.46\n")
    assert all(c.ok for c in registry_check(fixed, overall))
    unmeasured = registry_check(fixed, {"3.0": 1.0898})
    assert [c.model for c in unmeasured if not c.ok] == ["claude-opus-4-7"]


# -- a user's own model, passed as a registry (not through CTXWARDEN_MODELS) ---------------

MY_LLAMA = """
[models."my-llama"]
provider = "ollama"
context_window = 6_000
max_output_tokens = 2_000
estimator = "llama"
estimate_factor = 1.5
price = { input = 1.0, output = 2.0, cached_input = 0.25 }
"""
"""A custom model the default registry does not know: its window, factor and prices
differ from anything the name alone suggests (a llama, counted at 1.02 by family).
Imported by the engine, session and CLI tests."""


def my_llama() -> Registry:
    return Registry.builtin().with_overrides(MY_LLAMA)


def test_a_user_registry_prices_its_own_models() -> None:
    from ctxwarden.core.registry.cost import SessionCost, estimate_cost
    from ctxwarden.core.registry.usage import Usage

    registry = my_llama()
    assert get_model("my-llama", registry).context_window == 6_000
    with pytest.raises(UnknownModelError):
        get_model("my-llama")  # the default registry: not there
    usage = Usage(1_000_000, 100_000, cached_input_tokens=200_000)
    assert estimate_cost(usage, "my-llama", registry) == pytest.approx(0.8 + 0.05 + 0.2)
    with pytest.raises(UnknownModelError):
        estimate_cost(usage, "my-llama")
    costs = SessionCost(registry)
    costs.add(usage, "my-llama")
    costs.add(Usage(1000, 10), "gpt-4o")  # the built-in models are still there
    assert costs.by_model["my-llama"].dollars == pytest.approx(1.05)
    assert costs.total == pytest.approx(1.05 + (1000 * 2.5 + 10 * 10) / 1e6)
