"""One system message where the model's chat template takes one (issue 40, item 4).

Rendered through a real published template: Mistral-Nemo-Instruct-2407's ``chat_template``
(``tests/chat_templates/``, source in its README), with jinja2's sandbox as
``transformers``' ``apply_chat_template`` renders it (``raise_exception`` a global).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import ctxwarden
from ctxwarden import Message, Policy, Session, build_context
from ctxwarden.core.errors import ConfigError
from ctxwarden.core.registry.catalog import Registry, get_model
from ctxwarden.pipeline.carried import split_folded, strip_layers
from ctxwarden.pipeline.policy import WindowConfig

TEMPLATE = Path(__file__).parent / "chat_templates" / "mistral-nemo-instruct-2407.jinja"
MODEL = "mistral-nemo:12b"
PROMPT = "You are a travel assistant for Acme Air. Be brief."
# five window messages (user first, as the template's alternation wants), the rest dropped
POLICY = Policy(window=WindowConfig(max_messages=5))


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def render(messages: list[Message]) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    template = env.from_string(TEMPLATE.read_text("utf-8"))
    wire = ctxwarden.messages_to_openai(messages)
    return template.render(messages=wire, bos_token="<s>", eos_token="</s>")


def chat() -> list[Message]:
    msgs = [Message.system(PROMPT)]
    for i in range(30):
        day = f"2024-06-{i % 28 + 1:02d}"
        msgs.append(
            Message.user(
                f"Turn {i}: my booking ref is BK{1000 + i}X and I fly on {day} from gate "
                f"G{i}. My name is Ann Lee, order ORD-{5000 + i}."
            )
        )
        msgs.append(Message.assistant(f"Noted booking BK{1000 + i}X for {day}. Anything else?"))
    msgs.append(Message.user("Which bookings did I mention first?"))
    return msgs


def _many() -> Registry:
    return Registry.builtin().with_overrides(f'[models."{MODEL}"]\nsystem_messages = "many"\n')


def test_the_registry_says_which_models_take_one_system_message() -> None:
    assert get_model(MODEL).one_system_message
    assert get_model("mistral-nemo").one_system_message  # an alias
    assert get_model("mistralai/Mistral-Nemo-Instruct-2407").one_system_message  # vLLM's name
    assert (
        not get_model("gpt-4o").one_system_message and not get_model("qwen3:8b").one_system_message
    )
    assert not _many().get(MODEL).one_system_message
    with pytest.raises(ConfigError, match="system_messages"):
        Registry.builtin().with_overrides(f'[models."{MODEL}"]\nsystem_messages = 2\n')


def test_a_context_for_a_one_system_model_has_one_first_and_renders() -> None:
    history = chat()
    folded = build_context(history, MODEL, 1500, policy=POLICY, summarizer="offline")
    separate = build_context(
        history, MODEL, 1500, policy=POLICY, summarizer="offline", registry=_many()
    )
    # the same build, laid out as four system messages, is what the template refuses
    assert [m.role for m in separate.messages[:4]] == ["system"] * 4
    with pytest.raises(jinja2.exceptions.TemplateError, match="must alternate"):
        render(list(separate.messages))
    roles = [m.role for m in folded.messages]
    assert roles.count("system") == 1 and roles[0] == "system"
    text = render(list(folded.messages))
    assert text.startswith("<s>[INST]") and "Which bookings did I mention first?" in text
    # the prompt first and unchanged (its cache prefix holds), then the same layers
    prompt, layers = split_folded(folded.messages[0].text)
    assert prompt == PROMPT
    assert [n for n, _ in layers] == ["summary", "facts", "ledger"]
    assert [t for _, t in layers] == [m.text for m in separate.messages[1:4]]
    assert folded.messages[1:] == separate.messages[4:]
    assert folded.audit.input_tokens <= 1500
    # the audit still says what each layer costs (the folded message holds them all)
    for layer in ("facts", "ledger", "summary"):
        assert abs(folded.audit.layers[layer] - separate.audit.layers[layer]) <= 4, layer
    assert folded.audit.input_tokens <= separate.audit.input_tokens  # less framing
    # fed back as history, the folded layers are recognised, not stacked
    again, carried = strip_layers(list(folded.messages))
    assert again[0].text == PROMPT and carried.ledger == layers[2][1]


def test_a_session_builds_one_system_message_too(tmp_path: Any) -> None:
    session = Session(f"sqlite:///{tmp_path / 's.db'}", "fold", model=MODEL)
    try:
        session.append(chat())
        built = session.build(MODEL, POLICY, max_input_tokens=1500)
    finally:
        session.close()
    roles = [m.role for m in built.messages]
    assert roles.count("system") == 1 and roles[0] == "system"
    assert "Values from earlier messages:" in built.messages[0].text
    render(list(built.messages))


def test_the_proxy_sends_one_system_message_upstream(tmp_path: Any) -> None:
    """``ctxwarden serve`` for a one-system model: the body it forwards upstream (to an
    Ollama-style OpenAI-compatible server) holds one system message, first."""
    import openai
    from llm_servers import Recorded, Reply, ScriptedServer, openai_completion
    from service_harness import ProxyServer, add_tenant, sid

    def upstream_model(request: Recorded) -> Reply:
        return Reply(body=openai_completion("ok", prompt=50, completion=2))

    db = f"sqlite:///{tmp_path / 'service.db'}"
    upstream = ScriptedServer(upstream_model).start()
    key = add_tenant(db, "acme")
    proxy = ProxyServer(db, upstream=upstream.url + "/v1")
    try:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
        history = ctxwarden.messages_to_openai(chat())
        headers = {"X-Ctxwarden-Session": sid(), "X-Ctxwarden-Max-Input-Tokens": "900"}
        client.chat.completions.create(model=MODEL, messages=history, extra_headers=headers)
        client.close()
        sent = upstream.requests[-1].json["messages"]
    finally:
        proxy.stop()
        upstream.stop()
    roles = [m["role"] for m in sent]
    assert roles.count("system") == 1 and roles[0] == "system"
    assert sent[0]["content"].startswith(PROMPT + "\n\nValues from earlier messages:\n")
    assert sent[-1]["content"] == "Which bookings did I mention first?"
