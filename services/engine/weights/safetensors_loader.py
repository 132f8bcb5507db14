"""Read a Hugging Face checkpoint directory: ``config.json`` and ``model.safetensors`` or the shards its
``model.safetensors.index.json`` lists. Tensors keep their stored dtype (bf16 stays bf16: the model casts
each once to the serving dtype; FP8 weights become bf16); a shard the index names but the
directory lacks is refused by name. A base model saved bare (transformers' ``*Model``: an embedding model's
checkpoint such as Qwen3-Embedding's) is read under ``model.`` names, its missing head tied to the embeddings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import structlog
import torch
from safetensors import SafetensorError, safe_open

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig
from services.engine.model.registry import tensor_renamer
from services.engine.weights.compressed_checkpoint import compressed_renamer, compressed_scheme, decompress_weights
from services.engine.weights.fp8_blocks import dequantize_fp8, fp8_scheme
from services.engine.weights.loader import LoadedWeights
from services.engine.weights.model_config_reader import hf_dir_config, read_hf_config
from services.engine.weights.shards import shard_files

log = structlog.get_logger(__name__)


def load_safetensors_dir(path: Path) -> LoadedWeights:
    """The checkpoint's config and tensors (an FP8 checkpoint's weights dequantised to bf16,
    :mod:`~services.engine.weights.fp8_blocks`; a compressed-tensors one's decompressed,
    :mod:`~services.engine.weights.compressed_checkpoint`)."""
    config = hf_dir_config(path)
    raw = read_hf_config(path)
    fp8, compressed = fp8_scheme(raw), compressed_scheme(raw)
    rename = tensor_renamer(config) if compressed is None else compressed_renamer(tensor_renamer(config))
    files = shard_files(path)
    prefix = "model." if _bare_base_model(files) else ""
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if (model_name := rename(prefix + name)) is not None:  # None: a part not served
                        tensors[model_name] = shard.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({exc})") from exc
    if fp8 is not None:
        dequantize_fp8(tensors, fp8)
    if compressed is not None:
        decompress_weights(tensors, compressed)
    if "lm_head.weight" in tensors and config.tie_word_embeddings:
        config = _tied_or_not(config, tensors, path)
    if prefix and "lm_head.weight" not in tensors and not config.tie_word_embeddings:
        log.warning("a base model without an LM head (an embedding model's checkpoint): its head is tied to the "
                    "embeddings, so its generated text means nothing; its embeddings are its own", model=str(path))
        config = dataclasses.replace(config, tie_word_embeddings=True)
    return LoadedWeights(config=config, tensors=tensors, source=path)


def _bare_base_model(files: list[Path]) -> bool:
    """Whether the checkpoint is a base model saved bare (transformers' ``*Model`` rather than ``*ForCausalLM``,
    as embedding models such as Qwen3-Embedding are): ``embed_tokens.weight`` and no ``model.`` names. Its tensors
    are then read under ``model.`` names."""
    names: set[str] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as shard:
                names.update(shard.keys())
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file}: not a readable safetensors file ({exc})") from exc
    return "embed_tokens.weight" in names and not any(name.startswith("model.") for name in names)


def _tied_or_not(config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> ModelConfig:
    """A config that says tied with a stored head: tied (the head dropped) where the head is the embeddings, else
    untied, as transformers loads such a checkpoint (a vision-language model's top-level flag may say tied beside a
    head of its own: Mistral 3's)."""
    head, embed = tensors["lm_head.weight"], tensors.get("model.embed_tokens.weight")
    if embed is None or (head.shape == embed.shape and torch.equal(head, embed)):
        del tensors["lm_head.weight"]
        return config
    # info, not a warning: the released Mistral 3 and Qwen3-VL-MoE files are read so at every start (their class's
    # default ties, their files store a head)
    log.info("the config ties the LM head to the embeddings, but the checkpoint stores a head of its own: served "
             "untied, as transformers loads it", model=str(path))
    return dataclasses.replace(config, tie_word_embeddings=False)
