"""Each family's tiny checkpoint served by a real cluster (gateway, prefill node, decode node; float32) gives
transformers' greedy tokens: prompts of 1 to 300 tokens, a prefix the prefill node already computed (a hybrid
model's from a checkpoint of its state), and (for the families whose KV or attention differs) requests the decode
node preempts under a small pool (kept in host memory) and resumes. One cluster per kind of layer and KV (Llama with
llama3 rope; DeepSeek-V3.2's rows with their index keys and its sparse attention past its index_topk; see
CLUSTER_FAMILIES); the checkpoints and references are those of tests/engine/test_model_families.py."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from pdserve.v1 import gateway_pb2_grpc

from services.cluster.local import ClusterSpec, start_cluster
from services.engine.weights.model_config_reader import load_model_config
from tests.e2e.conftest import GATEWAY_ARGS, generate, greedy, model_nodes, wait_idle
from tests.engine.test_model_families import NEW_TOKENS, _prompts, assert_matches
from tests.engine.tiny_families import greedy_full_forward, load_reference

pytestmark = pytest.mark.slow

ENGINE_ARGS = ("--dtype", "float32", "--threads", "1", "--max-num-batched-tokens", "64")
# 24 blocks of 16 tokens hold the 300-token prompt alone; the eight pressure requests need ~56: "none" admits
# them anyway, so the decode node preempts (3-5 times here; with 32 tokens each, ~41 blocks, 2-3 times)
PRESSURE_TOKENS = 64
DECODE_ARGS = ("--num-kv-blocks", "24", "--admission-policy", "none")


# one cluster per kind of KV and of recurrent state that crosses P→D: the cluster moves bytes and states whatever math
# computed them, and each family's math is exact in the engine's family test (tests/engine/test_model_families.py,
# which also holds the gateway's torch-free reading of each config to the engine's). Llama's KV (as llama3, with its
# rope), a window on every layer (Phi-3), windows with sinks beside experts (GPT-OSS), sliding layers with their own
# rope and a softcap (Gemma 3), unrotated full layers around rotated sliding ones (Cohere 2), heads per layer in one
# slot and KV shared across layers (Gemma 4's E kind, read through its multimodal wrapper), latent KV (DeepSeek-V3, its
# experts) with index keys (DeepSeek-V3.2); and the states: Gated DeltaNet's beside attention (Qwen3.5), Mamba-2's
# (Granite 4.0-H, its experts), Mamba-2's beside every layer's attention (Falcon-H1: KV and a state on each layer),
# Mamba-1's (Jamba), short convolutions' (LFM3, with its sliding layers), Kimi Delta Attention's (Kimi Linear), and no
# KV at all (Mamba-2's pure model: blocks of no bytes beside its state). Every other family's KV and state is one of
# these (its layer's math, its experts, its wrapper: the engine's tests).
CLUSTER_FAMILIES = ["cohere-2", "deepseek-v3", "deepseek_v32", "falcon_h1", "gemma3", "gemma4-e", "gpt_oss",
                    "granite_hybrid", "jamba", "kimi_linear", "lfm2-lfm3", "llama3", "mamba2", "phi3", "qwen3_5"]
# preempted and resumed by the decode node too: Llama, and the families whose KV differs (windows with their own
# rope, sinks, a fused projection, a recurrent state beside the KV); the engine's family test preempts the others
# (Mixtral's experts, Gemma 2's softcap: their KV is Llama's and Gemma 3's)
PRESSURED = {"llama3", "phi3", "gpt_oss", "gemma3", "qwen3_5", "granite_hybrid"}
# a recurrent state per request, not in the KV blocks: hits need a checkpoint (LFM2's, a convolution's last inputs
# alone, crosses P→D as the others' do; its preemption runs in the engine's family test); checkpoint hits served by
# these (LFM2-MoE's state is LFM2's)
HYBRID = {"qwen3_5", "granite_hybrid", "lfm2-lfm3", "falcon_h1", "kimi_linear", "mamba2"}


@pytest.fixture(scope="module", params=CLUSTER_FAMILIES)
def served(request, family_dir):
    path = family_dir(request.param)
    spec = ClusterSpec(model=str(path), cache_store=False, engine_args=ENGINE_ARGS, decode_args=DECODE_ARGS,
                       prefill_args=("--num-kv-blocks", "64"), gateway_args=GATEWAY_ARGS)
    with start_cluster(spec, stderr=subprocess.DEVNULL) as running, \
            grpc.insecure_channel(running.address) as channel:
        yield request.param, path, gateway_pb2_grpc.GatewayStub(channel)


def test_a_cluster_serves_the_family_with_transformers_tokens(served):
    name, path, stub = served
    reference = load_reference(path)
    prompts = _prompts()
    for label in ("one-token", "short", "long", "shared-prefix"):  # in order: "long" caches the shared prefix
        expected = greedy_full_forward(reference, prompts[label], NEW_TOKENS)
        tokens, _, last = generate(stub, token_ids=prompts[label], sampling=greedy(NEW_TOKENS))
        assert_matches(f"{name}/{label}", expected, tokens)
        if label == "shared-prefix":  # a hybrid model's hit needs a checkpoint, which "long" saved at its end only
            assert last.usage.cached_tokens == (0 if load_model_config(path).has_recurrent_state else 256), last.usage
    if name in HYBRID:
        _hybrid_hits(name, reference, stub, prompts)
    if name in PRESSURED:
        _pressure(name, reference, stub)
    wait_idle(stub)


def _hybrid_hits(name: str, reference, stub, prompts: dict[str, list[int]]) -> None:
    """The prefill node's state checkpoints: "shared-prefix" saved one where it left "long"'s blocks (256), so a third
    prompt with that prefix starts there; "long" again starts from the one it saved at its end (288). The decode node
    goes on from the state the prefill node computed after the hit."""
    third = prompts["long"][:256] + [(i * 611) % 49000 + 9 for i in range(30)]
    for label, ids, cached in (("third", third, 256), ("long-again", prompts["long"], 288)):
        tokens, _, last = generate(stub, token_ids=ids, sampling=greedy(NEW_TOKENS))
        assert_matches(f"{name}/{label}", greedy_full_forward(reference, ids, NEW_TOKENS), tokens)
        assert last.usage.cached_tokens == cached, (label, last.usage)
    # ClusterStatus reports them: the prefill node's two hits (and a decode node keeps no checkpoint)
    prefill, decode = ([n for n in model_nodes(stub) if n.role == role] for role in ("prefill", "decode"))
    assert [n.state_checkpoint_hits_total for n in prefill] == [2], prefill
    assert prefill[0].state_checkpoints_total > 0 and 0 < prefill[0].state_checkpoints_used <= \
        prefill[0].state_checkpoint_saves_total
    assert all(n.state_checkpoints_total == 0 and n.state_checkpoint_hits_total == 0 for n in decode), decode
    assert all(n.state_bytes_total > 0 for n in (*prefill, *decode)), (prefill, decode)  # (through the gateway)


def _pressure(name: str, reference, stub) -> None:
    """Eight requests at once on the decode node's 24 blocks: it preempts, keeps their KV, and resumes them."""
    pressure = [[(i * 31 + j * 7) % 49000 + 5 for j in range(24 + 5 * i)] for i in range(8)]
    expected = [greedy_full_forward(reference, ids, PRESSURE_TOKENS) for ids in pressure]
    with ThreadPoolExecutor(len(pressure)) as pool:
        results = list(pool.map(lambda ids: generate(stub, timeout=300, token_ids=ids,
                                                     sampling=greedy(PRESSURE_TOKENS))[0], pressure))
    for i, (tokens, reference_tokens) in enumerate(zip(results, expected, strict=True)):
        assert_matches(f"{name}/pressure-{i}", reference_tokens, tokens)
    decode = [n for n in model_nodes(stub) if n.role == "decode"]
    assert sum(n.preemptions_total for n in decode) > 0, decode
