"""Embedding requests (``PrefillRole.admit_embedding`` / ``embed``) on the real bundled model in float32: each is the
final hidden state of its prompt's last token, transformers' ``last_hidden_state`` of the same weights, however the
prompts are batched, chunked or served from the prefix cache; nothing of theirs is read out or kept held."""

from __future__ import annotations

import pytest
import torch

from services.engine.decode_graphs import eager_capture
from services.engine.prefill_role import FirstToken
from tests.conftest import make_engine
from tests.engine.prompts import STORY, long_text

pytestmark = pytest.mark.slow


def _reference(hf_model, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model.model(input_ids=torch.tensor([prompt])).last_hidden_state[0, -1].float()


@pytest.fixture(scope="module")
def prompts(bundled_tokenizer) -> list[list[int]]:
    texts = ["Hello", "The capital of France is", STORY, long_text(3), "Summarise: " + STORY]
    return [bundled_tokenizer.encode(text) for text in texts]


def test_each_embedding_is_transformers_last_hidden_state_batched_chunked_and_cached(
        fp32_model, bundled_tokenizer, hf_bundled_model, prompts):
    engine = make_engine(fp32_model, bundled_tokenizer, max_num_batched_tokens=48)
    assert max(map(len, prompts)) > 48, "a prompt is prefilled in several chunks"
    first = engine.embed(prompts)  # all at once: batched steps
    again = engine.embed([prompts[2], prompts[-1]])  # STORY's blocks are cached now; so is the prefix of the last
    for prompt, got in zip([*prompts, prompts[2], prompts[-1]], [*first, *again], strict=True):
        expected = _reference(hf_bundled_model, prompt)
        assert len(got) == expected.numel() == fp32_model.config.hidden_size
        torch.testing.assert_close(torch.tensor(got), expected, atol=2e-4, rtol=2e-4)
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks and not engine.held


def test_an_embedding_request_reads_no_kv_out_frees_its_blocks_at_once_and_leaves_them_cached(
        fp32_model, bundled_tokenizer, prompts):
    engine = make_engine(fp32_model, bundled_tokenizer)
    for request_id, cached in (("e", False), ("again", True)):
        engine.admit_embedding(request_id, prompts[3])
        items = []
        while not any(isinstance(item, FirstToken) for item in items):
            items += engine.handoff_progress(engine.step())
        (first,) = items  # no ReadyBlocks: its KV never leaves
        assert (first.request_id, first.cached_tokens > 0) == (request_id, cached)
        assert len(first.embedding) == fp32_model.config.hidden_size
        assert engine.kv.num_free_blocks == engine.kv.num_blocks and not engine.held, "its one token ended it"
        engine.end_prefill(request_id)  # what the node calls: nothing left to free


def test_one_token_prompts_are_embedded_where_decode_graphs_run_the_one_token_steps(
        fp32_model, bundled_tokenizer, hf_bundled_model):
    """A step of one-token prompts looks like a decode step; a graph gives logits only, so it runs eager."""
    engine = make_engine(fp32_model, bundled_tokenizer, graph_capture=eager_capture, num_kv_blocks=64)
    assert engine.runner.graphs is not None
    got = engine.embed([[42], [7]])
    for prompt, values in zip([[42], [7]], got, strict=True):
        torch.testing.assert_close(torch.tensor(values), _reference(hf_bundled_model, prompt), atol=2e-4, rtol=2e-4)


def test_a_base_model_saved_bare_as_embedding_models_are_serves_transformers_embeddings(tmp_path, bundled_tokenizer):
    """Qwen3-Embedding's checkpoints are transformers' ``Qwen3Model`` (no ``model.`` prefix, the 4B and 8B without an
    LM head): read under ``model.`` names, the head tied; each embedding is ``Qwen3Model``'s last hidden state."""
    from transformers import AutoConfig, AutoModel

    from services.engine.config import EngineConfig
    from services.engine.engine import LLMEngine
    from tests.engine.tiny_families import SHAPE

    config = AutoConfig.for_model("qwen3", vocab_size=len(bundled_tokenizer.hf), head_dim=32, rope_theta=1000000.0,
                                  tie_word_embeddings=False, **SHAPE)
    torch.manual_seed(7)
    reference = AutoModel.from_config(config, dtype=torch.float32).eval()
    reference.save_pretrained(str(tmp_path))
    bundled_tokenizer.hf.save_pretrained(str(tmp_path))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:
        names = set(saved.keys())
    assert "embed_tokens.weight" in names and not any(n.startswith(("model.", "lm_head")) for n in names)

    engine = LLMEngine.from_config(EngineConfig(model_path=str(tmp_path), dtype="float32", num_kv_blocks=64))
    prompts = [bundled_tokenizer.encode(text) for text in ("Hello", "The capital of France is", STORY)]
    for prompt, got in zip(prompts, engine.embed(prompts), strict=True):
        with torch.inference_mode():
            expected = reference(input_ids=torch.tensor([prompt])).last_hidden_state[0, -1].float()
        torch.testing.assert_close(torch.tensor(got), expected, atol=2e-4, rtol=2e-4)
