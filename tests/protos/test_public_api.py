"""The public API's names are a contract (issue 3): pin them, and the stub generation's idempotence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor
from pdserve.v1 import admin_pb2, cache_store_pb2, decode_pb2, gateway_pb2, prefill_pb2

REPO = Path(__file__).resolve().parents[2]


def fields(message) -> set[str]:
    return set(message.DESCRIPTOR.fields_by_name)


def methods(module, service: str) -> dict[str, tuple[str, str, bool, bool]]:
    descriptor = module.DESCRIPTOR.services_by_name[service]
    return {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        for m in descriptor.methods
    }


def test_gateway_service_and_messages():
    v1 = "pdserve.v1."
    assert methods(gateway_pb2, "Gateway") == {
        "Generate": (v1 + "GenerateRequest", v1 + "GenerateResponse", False, True),
        "ClusterStatus": (v1 + "ClusterStatusRequest", v1 + "ClusterStatusResponse", False, False),
        "Embed": (v1 + "EmbedRequest", v1 + "EmbedResponse", False, False),
    }
    assert {"request_id", "prompt", "token_ids", "truncate_prompt_tokens", "normalize", "dimensions",
            "add_special_tokens"} <= fields(gateway_pb2.EmbedRequest)
    assert fields(gateway_pb2.EmbedResponse) == {"request_id", "embedding", "usage", "prefill_node"}
    request = fields(gateway_pb2.GenerateRequest)
    assert {"request_id", "prompt", "token_ids", "messages", "sampling"} <= request
    assert fields(gateway_pb2.ChatMessage) == {"role", "content"}
    assert {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
            "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"} <= \
        fields(gateway_pb2.SamplingParams)
    response = fields(gateway_pb2.GenerateResponse)
    assert {"request_id", "token_ids", "text", "finish_reason", "usage"} <= response
    assert {"prompt_tokens", "completion_tokens", "cached_tokens"} <= fields(gateway_pb2.Usage)
    assert fields(gateway_pb2.ClusterStatusResponse) == {"nodes", "gateway_metrics_url", "http_url",
                                                         "served_model_name", "model_name", "weights_digest"}
    assert {"address", "role", "healthy", "blocks_total", "blocks_free", "blocks_reserved", "blocks_cached",
            "requests_running", "requests_waiting", "preemptions_total", "prefix_hit_tokens_total",
            "prompt_tokens_total", "metrics_url", "model_name", "weights_digest"} <= fields(gateway_pb2.NodeStatus)
    assert gateway_pb2.NodeStatus.DESCRIPTOR.fields_by_name["role"].type == FieldDescriptor.TYPE_STRING


def test_admin_service_is_part_of_the_contract():
    """The runbook and the Helm chart's docs call ``pdserve.v1.Admin/Drain`` by name."""
    v1 = "pdserve.v1."
    assert methods(admin_pb2, "Admin") == {"Drain": (v1 + "DrainRequest", v1 + "DrainResponse", False, False),
                                           "Rebalance": (v1 + "RebalanceRequest", v1 + "RebalanceResponse", False,
                                                         False)}
    assert fields(admin_pb2.DrainRequest) == {"reason"}
    assert fields(admin_pb2.DrainResponse) == {"already_draining"}
    assert fields(admin_pb2.RebalanceRequest) == {"max_requests", "within_ms", "reason"}
    assert fields(admin_pb2.RebalanceResponse) == {"moved", "kept"}


def test_unset_sampling_fields_are_distinguishable_from_zero():
    unset, zero = gateway_pb2.SamplingParams(), gateway_pb2.SamplingParams(max_tokens=0, temperature=0.0)
    assert not unset.HasField("max_tokens") and not unset.HasField("temperature")
    assert zero.HasField("max_tokens") and zero.HasField("temperature")
    for name in ("top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"):
        assert not unset.HasField(name)  # an explicit 0 (a repetition_penalty of 0 is refused) is not "off"


def test_internal_services_share_node_status():
    node_status = "pdserve.v1.NodeStatus"
    for module, service in ((decode_pb2, "DecodeNode"), (prefill_pb2, "PrefillNode"),
                            (cache_store_pb2, "CacheStore")):
        assert methods(module, service)["NodeStatus"][1] == node_status
    decode = methods(decode_pb2, "DecodeNode")
    assert decode["TransferKV"][2:] == (True, True)
    assert decode["Attach"][2:] == (False, True)
    assert methods(prefill_pb2, "PrefillNode")["Prefill"][2:] == (False, True)
    store = methods(cache_store_pb2, "CacheStore")
    assert store["Put"][2:] == (True, False) and store["Get"][2:] == (False, True)


def test_generation_is_idempotent():
    command = [sys.executable, str(REPO / "protos" / "generate.py")]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    again = subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
    assert "up to date" in again.stdout
