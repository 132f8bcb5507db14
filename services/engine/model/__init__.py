"""The decoder of every supported family, its configuration and the registry of families."""

from services.engine.model.config import ModelConfig, MoEConfig
from services.engine.model.decoder import DecoderModel

__all__ = ["DecoderModel", "MoEConfig", "ModelConfig"]
