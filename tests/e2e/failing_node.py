"""``FAILING_NODE_ROLE=prefill|decode python -m tests.e2e.failing_node ARGS...``: a real node of that role whose
engine thread raises on purpose — test-only, nothing of it is in the services.

``FAILING_NODE_TRIGGER=PATH``: the engine thread raises ``RuntimeError("injected engine failure")`` on the
first turn of its loop after PATH exists (the test decides when). ``FAILING_NODE_AT_WORK=1``: it raises on
the first step it schedules (the first request that reaches its engine). The rest is the node's own
``main`` (health, streams, exit code: ``services/engine_node/serve.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from services.engine.engine import LLMEngine

INJECTED = "injected engine failure"


def _inject() -> None:
    trigger = os.environ.get("FAILING_NODE_TRIGGER", "")
    has_unfinished, begin_step = LLMEngine.has_unfinished, LLMEngine.begin_step

    def has_unfinished_or_fail(engine: LLMEngine) -> bool:  # every turn of the engine thread's loop
        if trigger and Path(trigger).exists():
            raise RuntimeError(INJECTED)
        return has_unfinished(engine)

    def begin_step_or_fail(engine: LLMEngine):
        if os.environ.get("FAILING_NODE_AT_WORK"):
            raise RuntimeError(INJECTED)
        return begin_step(engine)

    LLMEngine.has_unfinished = has_unfinished_or_fail  # type: ignore[method-assign]
    LLMEngine.begin_step = begin_step_or_fail  # type: ignore[method-assign]


def main() -> int:
    _inject()
    if os.environ["FAILING_NODE_ROLE"] == "prefill":
        from services.prefill_node.main import main as node_main
    else:
        from services.decode_node.main import main as node_main
    return node_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
