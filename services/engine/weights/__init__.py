"""Weight loaders: GGUF files and Hugging Face safetensors directories, into Hugging Face tensor names."""

from services.engine.weights.loader import LoadedWeights, load_weights

__all__ = ["LoadedWeights", "load_weights"]
