"""Weight loaders: GGUF files and Hugging Face safetensors directories, into Hugging Face tensor names.
``load_model_config`` and what it imports stay torch-free (the gateway reads the config without loading weights)."""

from services.engine.weights.loader import LoadedWeights, load_weights
from services.engine.weights.model_config_reader import load_model_config

__all__ = ["LoadedWeights", "load_model_config", "load_weights"]
