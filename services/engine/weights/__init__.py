"""Weight loaders: GGUF files and Hugging Face safetensors directories, into Hugging Face tensor names."""

from services.engine.weights.loader import LoadedWeights, load_model_config, load_weights

__all__ = ["LoadedWeights", "load_model_config", "load_weights"]
