"""A vision-language model's chat template kept in its processor's ``chat_template.json`` (Qwen2.5-VL's, Qwen3-VL's,
Mistral 3's): read where the tokenizer has none, as vLLM does; the tokenizer's own wins; a broken file is named."""

from __future__ import annotations

import json

import pytest

from services.engine.tokenizer import ChatMessage, Tokenizer

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}|{{ m['content'] }}>{% endfor %}"


@pytest.fixture
def without_template(tmp_path, bundled_tokenizer):
    bundled_tokenizer.hf.save_pretrained(str(tmp_path))
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    for file in tmp_path.glob("chat_template.*"):
        file.unlink()
    assert Tokenizer.load(tmp_path).hf.chat_template is None
    return tmp_path


def test_the_processor_s_template_is_read_where_the_tokenizer_has_none(without_template):
    (without_template / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tokenizer = Tokenizer.load(without_template)
    assert tokenizer.hf.chat_template == TEMPLATE
    prompt = tokenizer.apply_chat_template([ChatMessage("user", "hi")])
    assert tokenizer.decode(prompt, skip_special_tokens=False).startswith("<user|hi>")


def test_the_tokenizer_s_own_template_wins(without_template):
    (without_template / "chat_template.jinja").write_text("{{ 'own' }}")
    (without_template / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    assert Tokenizer.load(without_template).hf.chat_template == "{{ 'own' }}"


@pytest.mark.parametrize(("text", "named"), [
    ("{not json", "not a processor's chat template"),
    (json.dumps({"chat_template": 3}), "its chat_template is not a template's text"),
])
def test_a_broken_processor_template_is_named(without_template, text, named):
    (without_template / "chat_template.json").write_text(text)
    with pytest.raises(ValueError, match=f"chat_template.json: {named}"):
        Tokenizer.load(without_template)
