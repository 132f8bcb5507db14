"""One typed snapshot of an engine's counters and gauges: :meth:`LLMEngine.stats` (on the engine thread).

Nodes report it (``services.engine_node.status`` makes the ``NodeStatus``, whose fields these mirror)
without reaching into the engine's parts. Plain values only (no torch), taken at one moment.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.kv_layout_spec import KVLayoutSpec


@dataclass(frozen=True)
class EngineStats:
    # requests and prompts (since start)
    requests_total: int  # admitted
    prompt_tokens_total: int
    generated_tokens_total: int  # output tokens sampled by this engine
    prefix_hit_requests_total: int  # admitted with a prefix-cache hit
    prefix_hit_tokens_total: int
    preemptions_total: int
    offloads_total: int  # preemptions whose KV was kept (host memory or the cache-store)
    resumes_total: int
    recomputes_total: int
    requests_running: int
    requests_waiting: int
    # the KV pool
    kv_layout: KVLayoutSpec
    block_size: int
    blocks_total: int
    blocks_free: int  # free and holding no cached prefix
    blocks_cached: int  # free but holding a cached prefix
    blocks_reserved: int  # reserved for incoming KV (decode role)
    evictions_total: int  # cached prefix blocks reused
    kv_bytes_total: int  # the pool's size in bytes
    # admission
    admission_policy: str
    admission_headroom_blocks: int
    new_token_ratio: float  # 0.0 unless the policy is new_token_ratio
    # the KV offload and the cache-store
    offloaded_bytes_total: int
    offloaded_remote_bytes_total: int
    offload_host_bytes_used: int  # host copies and bytes staged for the cache-store
    store_fetched_bytes_total: int  # resumes' copies and adopted requests' KV read from the cache-store
    store_written_blocks_total: int  # the output cache's blocks stored
    store_breaker_trips_total: int  # the offload's and the output cache's stores, together
    handovers_out_total: int
    handovers_in_total: int
    # a hybrid model's state checkpoints (prefix hits of its recurrent state; all 0 for other models)
    state_checkpoints_total: int  # how many it keeps (--state-checkpoints)
    state_checkpoints_used: int  # holding a prefix's state
    state_checkpoint_saves_total: int  # states saved at a block boundary
    state_checkpoint_hits_total: int  # requests that started from one
    state_bytes_total: int  # the memory of the recurrent states, slots and checkpoints (all of a Mamba's)
    # the model
    model_name: str
    weights_digest: str
    deterministic: bool  # batch-invariant numerics (EngineConfig.deterministic)
