"""The families whose checkpoints carry multi-token-prediction weights beside the model (``mtp.*``, which transformers
ignores on load) leave them unread, wherever the name holds them; every other name is renamed as before."""

from __future__ import annotations

import pytest

from services.engine.model.registry import config_from_hf, tensor_renamer
from services.engine.model.tensor_renames import is_mtp_weight


@pytest.mark.parametrize("cfg", [{"model_type": "exaone4_5", "text_config": {"model_type": "exaone4"}},
                                 {"model_type": "exaone_moe"}, {"model_type": "mellum"}],
                         ids=["exaone4_5", "exaone_moe", "mellum"])
def test_multi_token_prediction_weights_are_not_read(cfg):
    rename = tensor_renamer(config_from_hf(cfg))
    assert rename("mtp.layers.0.eh_proj.weight") is None and rename("model.mtp.norm.weight") is None
    assert rename("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"


def test_only_mtp_names_are_multi_token_prediction_weights():
    assert is_mtp_weight("mtp.0.weight") and is_mtp_weight("model.mtp.layers.0.weight")
    assert not is_mtp_weight("model.layers.0.mlp.gate.weight") and not is_mtp_weight("model.smtp.weight")
