"""``/v1/embeddings`` and gRPC ``Gateway.Embed`` on the session's live cluster (real processes, the bundled model,
float32), through the official ``openai`` package: each embedding is transformers' last hidden state of the
input's last token, L2-normalised (``normalize: false``: as it is; ``dimensions``: its first values, normalised
after); floats, base64, token ids and gRPC agree; a prompt's second run is served from the prefix cache; bad input
is a 400 naming the input, a passed deadline a DEADLINE_EXCEEDED; afterwards no block is held anywhere."""

from __future__ import annotations

import base64

import grpc
import numpy as np
import openai
import pytest
import torch
from pdserve.v1 import gateway_pb2

from tests.e2e.conftest import wait_idle
from tests.engine.prompts import STORY, long_text

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TEXTS = ["The capital of France is", "Hello", STORY]


@pytest.fixture(scope="module")
def client(cluster):
    with openai.OpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as made:
        yield made


def _last_state(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].float()


def _close(got, expected: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), expected, atol=2e-4, rtol=2e-3)


def test_embeddings_are_transformers_last_hidden_states_normalised(client, stub, bundled_tokenizer, hf_bundled_model):
    ids = [bundled_tokenizer.encode(text) for text in TEXTS]
    states = [_last_state(hf_bundled_model, one) for one in ids]
    answer = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in answer.data] == [0, 1, 2] and answer.model == MODEL
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(map(len, ids))
    for data, state in zip(answer.data, states, strict=True):
        assert len(data.embedding) == state.numel() == 576
        _close(data.embedding, state / state.norm())

    # the openai package asks for base64 and decodes it unless told a format: here floats, as sent
    as_ids = client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")  # one list of token ids
    _close(as_ids.data[0].embedding, states[0] / states[0].norm())  # alone, not batched: within float32 sums
    short = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=64).data[0].embedding
    _close(short, states[0][:64] / states[0][:64].norm())
    raw = client.embeddings.create(model=MODEL, input=TEXTS[0], extra_body={"normalize": False}).data[0].embedding
    _close(raw, states[0])

    reply = stub.Embed(gateway_pb2.EmbedRequest(prompt=STORY, request_id="story"), timeout=60)
    assert reply.request_id == "story" and reply.prefill_node
    assert reply.usage.prompt_tokens == len(ids[2]) and reply.usage.cached_tokens >= 16, "its blocks were cached"
    _close(list(reply.embedding), states[2] / states[2].norm())
    wait_idle(stub)


def test_base64_is_little_endian_float32_as_openai_sends_it(cluster, client):
    import httpx

    floats = client.embeddings.create(model=MODEL, input="Hello").data[0].embedding
    body = httpx.post(f"{cluster.http_url}/v1/embeddings", json={"input": "Hello", "encoding_format": "base64"},
                      timeout=60).json()
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == pytest.approx(floats, abs=0) and body["object"] == "list"
    assert body["id"].startswith("embd-")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": ["fine", ""]}, "input[1]"),
    ({"input": [[1, 2], [999999]]}, "input[1]"),
    ({"input": "Hello", "dimensions": 577}, "dimensions"),
    ({"input": "Hello", "encoding_format": "int8"}, "encoding_format"),
    ({"input": 3.5}, "input"),
])
def test_bad_input_is_a_400_naming_it_and_changes_nothing(cluster, stub, body, param):
    import httpx

    answer = httpx.post(f"{cluster.http_url}/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
    wait_idle(stub)


def test_a_passed_deadline_ends_the_call_and_frees_everything(stub, bundled_tokenizer):
    ids = bundled_tokenizer.encode(long_text(30))  # token ids: the gateway passes them on at once
    assert len(ids) > 1000, "seconds of prefill on this CPU"
    with pytest.raises(grpc.RpcError) as ended:
        stub.Embed(gateway_pb2.EmbedRequest(token_ids=ids), timeout=0.3)
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_idle(stub)
    reply = stub.Embed(gateway_pb2.EmbedRequest(prompt="Hello"), timeout=60)  # and it serves on
    assert len(reply.embedding) == 576
