"""``--chat-template``: the gateway renders conversations with the template given (a Jinja file or its text)
instead of the model's own; one that cannot be read or compiled stops it at startup, naming the flag. The real
``python -m services.gateway`` process, its HTTP ``/tokenize`` (no node is called)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from services.cluster.local import http_url_of, launch
from services.engine.chat_template import template_source
from services.engine.tokenizer import ChatMessage

NO_NODES = ("--prefill", "127.0.0.1:9", "--decode", "127.0.0.1:10")  # the gateway serves without them
TEMPLATE = ("{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[ASSISTANT]{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


def test_a_file_or_a_templates_text_is_read_and_checked(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    assert template_source(str(path)) == template_source(TEMPLATE) == TEMPLATE
    with pytest.raises(ValueError, match=r"--chat-template .*neither a readable file"):
        template_source(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match=r"--chat-template .*not a template transformers can compile"):
        template_source("{% for m in messages %}{{ m.content }}")


def test_the_gateway_renders_with_the_template_given(tmp_path, bundled_tokenizer):
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    args = (*NO_NODES, "--http-listen", "127.0.0.1:0", "--chat-template", str(path))
    with launch("services.gateway", *args, stderr=subprocess.DEVNULL, startup_timeout_s=60) as gateway:
        reply = httpx.post(f"{http_url_of(gateway.address)}/tokenize", json={"messages": CHAT}, timeout=30)
    assert reply.status_code == 200, reply.text
    expected = bundled_tokenizer.encode_plain("[SYSTEM] Be brief.\n[USER] Hi!\n[ASSISTANT]")
    assert reply.json()["tokens"] == expected
    assert expected != bundled_tokenizer.apply_chat_template([ChatMessage(**m) for m in CHAT])  # not the model's


def test_a_template_that_does_not_compile_stops_the_gateway_naming_the_flag():
    started = subprocess.run([sys.executable, "-m", "services.gateway", *NO_NODES, "--listen", "127.0.0.1:0",
                              "--chat-template", "{% if x %}never closed"], capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 1 and "--chat-template" in started.stderr, started.stderr
    assert "Traceback" not in started.stderr
