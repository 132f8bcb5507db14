"""The Llama-family decoder and its configuration."""

from services.engine.model.config import ModelConfig
from services.engine.model.llama import LlamaModel

__all__ = ["LlamaModel", "ModelConfig"]
