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
from tests.engine.tiny_families import FAMILIES, greedy_full_forward, load_reference

pytestmark = pytest.mark.slow

ENGINE_ARGS = ("--dtype", "float32", "--threads", "1", "--max-num-batched-tokens", "64")
# 24 blocks of 16 tokens hold the 300-token prompt alone; the eight pressure requests need ~56: "none" admits
# them anyway, so the decode node preempts (3-5 times here; with 32 tokens each, ~41 blocks, 2-3 times)
PRESSURE_TOKENS = 64
DECODE_ARGS = ("--num-kv-blocks", "24", "--admission-policy", "none")


# one cluster per family: Llama runs as llama3, Gemma 3 as its text checkpoint, Phi-3 with its window, Granite MoE
# with its shared MLP, ERNIE 4.5 as its MoE (its interleaved rope with the experts), latent attention as DeepSeek-V3
# (the others differ only in how the config and tensors are read, in the rope tables and in the routing, which the
# engine's family test covers; Seed-OSS's layer is Qwen2's with an o_proj bias; OLMo 2's runs as OLMo 3's, which adds
# sliding layers with their own rope; OLMoE's is MiniMax-M2's whole-projection q/k norms with Qwen3-MoE's routing;
# Qwen3.5's hybrid layers, whose recurrent state travels beside the KV, run as its dense model: its MoE and Qwen3-Next
# add experts every MoE cluster has, and Qwen3-Next's projections differ only as the checkpoint stores them; Granite
# 4.0-H's Mamba-2 layers run with its experts, its dense MLP being Granite MoE's shared one, and Bamba's with a dense
# MLP; Falcon-H1's, beside every layer's attention (KV and a state on each layer), run with the mixer's norm (its
# kind without runs in the engine's family test); Jamba's Mamba-1 state, a matrix per channel, crosses P→D as the
# others' do (its checkpoint hits and preemption run in the engine's tests, as theirs do); Nemotron-H's blocks hold the
# same Mamba-2 layer, Llama's attention without rope and a squared-ReLU MLP each, Nemotron 3's experts GLM-4.5's
# routing with that MLP as the experts' and the shared one's; Granite's dense layer is Llama's
# with Granite MoE's multipliers; SmolLM3's is Llama's, some layers without rope; LFM2-MoE's state is LFM2's, its
# experts sigmoid-routed as GLM-4.5's; the Qwen-VL wrappers' text layers are Qwen3's and Qwen3-MoE's, read through a
# wrapper as Mistral 3's is; Mistral 4's layer is DeepSeek-V3's with Ministral 3's temperature, both served here; Gemma
# 2's is Gemma 3's with a softcap in the attention backend; Gemma 4's KV (heads per layer in one slot, KV shared across
# layers) crosses P→D as its E-model kind, whose text model is read through the multimodal wrapper, and its 31B kind
# adds experts and keys as values, which the engine's family test serves; Llama 4's KV is Llama's, its layer's norms,
# temperature and experts the engine's; Qwen2's layer runs in Qwen2-MoE's, its attention with the biases, Qwen3's in
# Qwen3-MoE's, with the q/k norms, and Mixtral's renormalised softmax top-k experts in Qwen3-MoE's, its sliding window
# in Phi-3's and GPT-OSS's, beside the latter's experts; Mistral's window on every layer runs in Phi-3's, its head_dim
# apart from hidden / heads in Gemma 4's; Cohere's layer, attention and the MLP side by side on one LayerNorm
# (GPT-NeoX's, on two, is Phi-2's in the LayerNorm decoder, which the engine's family test serves), runs as
# Cohere 2's, which adds its sliding layers with rope around full ones without; EXAONE 4.0's is OLMo 3's with Qwen3's
# per-head q/k norms and Cohere 2's unrotated full layers; Hunyuan's is Qwen3's with the norms after rope; Kimi K2.5's
# text model is DeepSeek-V3's; Solar Open's layer is GLM-4.5's without its q/k norms; Hy3's, Qwen3's attention with
# GLM-4.5's routing; Kimi Linear's Kimi Delta Attention state, a matrix per head decayed per key dim, crosses P→D with
# its checkpoint hits, and Ling 3's KDA layers differ only in their gates' projections; the 2026 one-part families
# (A.X-K1, MiniCPM3, nanochat, GLM-4-9B, Ministral, Gemma 4 12B, Apertus 1.5, OLMo, Flint, North, DBRX, and OLMo
# Hybrid, Qwen3.5's DeltaNet state beside OLMo 3's attention) differ in parts the engine's tests show on their own,
# their KV and state ones the cluster already moves); Mamba-2's model has no KV at all (blocks of no bytes cross P→D
# beside its state, with checkpoint hits), Mamba's and Falcon-Mamba's the same with Jamba's Mamba-1 state.
# The gateway's torch-free reading of every family's config is held to the engine's by the family test.
CLUSTER_FAMILIES = sorted(set(FAMILIES) - {"llama-yarn", "gemma3-multimodal", "phi3-longrope", "granite_moe",
                                           "ernie4_5", "deepseek-v2", "glm4_moe_lite", "seed_oss", "olmo2", "olmoe",
                                           "qwen3_5-moe", "qwen3_next", "granite_hybrid-dense",
                                           "granite_hybrid-attention", "nemotron_h", "nemotron_h-moe", "mistral3-text",
                                           "qwen_vl", "qwen_vl-2.5", "qwen_vl-moe", "granite", "smollm3", "lfm2-moe",
                                           "mistral4", "gemma2", "gemma4", "llama4", "qwen2", "qwen3", "mixtral",
                                           "mistral", "cohere", "exaone4", "hunyuan", "deepseek-kimi_k25",
                                           "glm4_moe-solar_open", "hy_v3", "lfm2", "exaone", "dots1",
                                           "deepseek_v32-glm5", "afmoe", "mimo_v2_flash", "arcee", "apertus",
                                           "internlm3", "iquestcoder", "helium", "deepseek-sarvam_mla",
                                           "sarvam_moe", "youtu", "gemma", "cwm", "vaultgemma", "hyperclovax",
                                           "flex_olmo", "jais2", "starcoder2", "exaone4-4.5", "exaone_moe",
                                           "mellum", "granite_swa", "granite_moe_swa", "phimoe",
                                           "cohere2_moe", "kolibri1", "hunyuan-a13b", "nemotron",
                                           "phi", "stablelm", "stablelm-parallel", "bamba", "falcon_h1-no_norm",
                                           "gpt_neox", "gpt_neox-sequential", "ministral", "glm",
                                           "minicpm3", "axk1", "gemma4-unified", "nanochat",
                                           "bailing_hybrid", "apertus-1p5", "olmo", "flint",
                                           "cohere_compass", "cohere_compass-text", "olmo_hybrid",
                                           "dbrx", "mamba", "mamba-falcon"})
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
