"""The tiny random model of the prefill/decode pair tests and the mixed engine's output for their prompt."""

from __future__ import annotations

import pytest
import torch

from services.engine.random_llama import PRESETS, random_model
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine


@pytest.fixture(scope="module")
def model():
    return random_model(PRESETS["tiny"], torch.float32)


@pytest.fixture(scope="module")
def expected(model) -> list[int]:
    return engine(model).generate([PROMPT], GREEDY)[0].token_ids
