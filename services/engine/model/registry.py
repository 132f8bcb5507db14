"""Architecture name → family module, imported lazily.

A family module (``llama.py``, ``qwen3.py``, …) holds what that family adds to the shared decoder:
``config_from_hf(cfg)`` for a ``config.json`` and, where GGUF files of it exist, ``config_from_gguf(fields)``
(``GGUF_ARCHITECTURE`` names its ``general.architecture``). Adding a family is one file and one line here.
A family whose layers differ from the shared decoder's names its model class (``model``), and one whose
checkpoints nest the text model names the function that maps their tensor names (``tensor_names``); both
are ``"module:attribute"`` paths, imported only by the processes that load weights.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from services.engine.errors import ModelLoadError
from services.engine.model.config import ModelConfig


@dataclass(frozen=True)
class Family:
    name: str  # ModelConfig.architecture
    module: str
    hf_model_types: tuple[str, ...]
    gguf_architecture: str | tuple[str, ...] | None = None  # llama.cpp's general.architecture (or several)
    model: str = "services.engine.model.decoder:DecoderModel"
    tensor_names: str | None = None  # name -> its name in the model, or None: not read
    # the checkpoints carry multi-token-prediction layers after the last decoder layer (``model.layers.{n}.*``
    # for n >= num_layers), which serve speculative decoding: not read
    mtp_layers: bool = False
    # ``(tensors, config) -> tensors``: lays out what the GGUF loader kept stacked (``gguf_names``) as the
    # family's model takes it
    gguf_tensors: str | None = None


FAMILIES: tuple[Family, ...] = (
    Family("llama", "services.engine.model.llama", ("llama",), "llama"),
    Family("smollm3", "services.engine.model.smollm3", ("smollm3",), "smollm3"),
    Family("llama4", "services.engine.model.llama4", ("llama4_text", "llama4"), "llama4",
           model="services.engine.model.llama4_decoder:Llama4DecoderModel",
           tensor_names="services.engine.model.llama4:llama4_tensor_name"),
    Family("granite", "services.engine.model.granite", ("granite",), "granite"),
    Family("hyperclovax", "services.engine.model.hyperclovax", ("hyperclovax",),
           tensor_names="services.engine.model.hyperclovax:hyperclovax_tensor_name"),
    Family("granite_swa", "services.engine.model.granite_swa", ("granite_swa",)),
    Family("granite_moe_swa", "services.engine.model.granite_swa", ("granitemoe_swa",),
           tensor_names="services.engine.model.granite_moe:granite_moe_tensor_name"),
    Family("granite_hybrid", "services.engine.model.granite_hybrid", ("granitemoehybrid",), "granitehybrid",
           model="services.engine.model.mamba_decoder:MambaDecoderModel",
           tensor_names="services.engine.model.granite_moe:granite_moe_tensor_name",
           gguf_tensors="services.engine.model.mamba_gguf:mamba_from_gguf"),
    Family("bamba", "services.engine.model.bamba", ("bamba",),
           model="services.engine.model.mamba_decoder:MambaDecoderModel",
           tensor_names="services.engine.model.bamba:bamba_tensor_name"),
    Family("jamba", "services.engine.model.jamba", ("jamba",), "jamba",
           model="services.engine.model.jamba_decoder:JambaDecoderModel",
           tensor_names="services.engine.model.jamba:jamba_tensor_name",
           gguf_tensors="services.engine.model.mamba_gguf:mamba_from_gguf"),
    Family("falcon_h1", "services.engine.model.falcon_h1", ("falcon_h1",), "falcon-h1",
           model="services.engine.model.falcon_h1_decoder:FalconH1DecoderModel",
           tensor_names="services.engine.model.bamba:bamba_tensor_name",
           gguf_tensors="services.engine.model.mamba_gguf:mamba_from_gguf"),
    Family("lfm2", "services.engine.model.lfm2", ("lfm2", "lfm2_moe", "lfm3"), ("lfm2", "lfm2moe"),
           model="services.engine.model.lfm2_decoder:Lfm2DecoderModel",
           tensor_names="services.engine.model.lfm2:lfm2_tensor_name",
           gguf_tensors="services.engine.model.lfm2_decoder:conv_from_gguf"),
    Family("nemotron_h", "services.engine.model.nemotron_h", ("nemotron_h",), ("nemotron_h", "nemotron_h_moe"),
           model="services.engine.model.nemotron_h_decoder:NemotronHDecoderModel",
           tensor_names="services.engine.model.nemotron_h:nemotron_h_tensor_name",
           gguf_tensors="services.engine.model.mamba_gguf:mamba_from_gguf"),
    Family("mamba", "services.engine.model.mamba", ("mamba", "falcon_mamba"), "mamba",
           model="services.engine.model.state_space_decoder:Mamba1DecoderModel",
           tensor_names="services.engine.model.mamba:state_space_tensor_name",
           gguf_tensors="services.engine.model.mamba_gguf:mamba_from_gguf"),
    Family("mamba2", "services.engine.model.mamba2", ("mamba2",), "mamba2",
           model="services.engine.model.state_space_decoder:Mamba2DecoderModel",
           tensor_names="services.engine.model.mamba:state_space_tensor_name",
           gguf_tensors="services.engine.model.mamba_gguf:mamba_from_gguf"),
    Family("granite_moe", "services.engine.model.granite_moe", ("granitemoe", "granitemoeshared"), "granitemoe",
           tensor_names="services.engine.model.granite_moe:granite_moe_tensor_name"),
    Family("internlm3", "services.engine.model.internlm3", ("internlm3",)),
    Family("iquestcoder", "services.engine.model.iquestcoder", ("iquestcoder",)),
    Family("helium", "services.engine.model.helium", ("helium",)),
    Family("cwm", "services.engine.model.cwm", ("cwm",)),
    Family("starcoder2", "services.engine.model.starcoder2", ("starcoder2",), "starcoder2",
           model="services.engine.model.layernorm_decoder:LayerNormDecoderModel",
           tensor_names="services.engine.model.starcoder2:starcoder2_tensor_name"),
    Family("phi", "services.engine.model.phi", ("phi",), "phi2",
           model="services.engine.model.layernorm_decoder:LayerNormDecoderModel",
           tensor_names="services.engine.model.phi:phi_tensor_name"),
    Family("gpt_neox", "services.engine.model.gpt_neox", ("gpt_neox",), "gptneox",
           model="services.engine.model.gpt_neox_decoder:GPTNeoXDecoderModel",
           tensor_names="services.engine.model.gpt_neox:gpt_neox_tensor_name"),
    Family("stablelm", "services.engine.model.stablelm", ("stablelm",),
           model="services.engine.model.layernorm_decoder:LayerNormDecoderModel"),
    Family("nemotron", "services.engine.model.nemotron", ("nemotron",), "nemotron",
           model="services.engine.model.layernorm_decoder:LayerNormDecoderModel"),
    Family("jais2", "services.engine.model.jais2", ("jais2",),
           model="services.engine.model.layernorm_decoder:LayerNormDecoderModel"),
    Family("arcee", "services.engine.model.arcee", ("arcee",), "arcee"),
    Family("apertus", "services.engine.model.apertus", ("apertus", "apertus1p5_text", "apertus1p5"),
           tensor_names="services.engine.model.apertus:apertus_tensor_name"),
    Family("qwen2", "services.engine.model.qwen2", ("qwen2",), "qwen2"),
    Family("qwen3", "services.engine.model.qwen3", ("qwen3",), "qwen3"),
    Family("seed_oss", "services.engine.model.seed_oss", ("seed_oss",), "seed_oss"),
    Family("mistral", "services.engine.model.mistral", ("mistral",)),
    Family("ministral", "services.engine.model.ministral", ("ministral",)),
    Family("mistral3", "services.engine.model.mistral3", ("mistral3", "ministral3"), "mistral3",
           tensor_names="services.engine.model.multimodal_text:text_tensor_name"),
    Family("mixtral", "services.engine.model.mixtral", ("mixtral",),
           tensor_names="services.engine.model.mixtral:mixtral_tensor_name"),
    Family("phimoe", "services.engine.model.phimoe", ("phimoe",),
           model="services.engine.model.layernorm_decoder:LayerNormDecoderModel",
           tensor_names="services.engine.model.mixtral:mixtral_tensor_name"),
    Family("qwen2_moe", "services.engine.model.qwen2_moe", ("qwen2_moe",), "qwen2moe"),
    Family("qwen3_moe", "services.engine.model.qwen3_moe", ("qwen3_moe",), "qwen3moe"),
    Family("dbrx", "services.engine.model.dbrx", ("dbrx",),
           model="services.engine.model.dbrx_decoder:DbrxDecoderModel"),
    Family("flint", "services.engine.model.flint", ("flint",),
           tensor_names="services.engine.model.flint:flint_tensor_name"),
    Family("mellum", "services.engine.model.mellum", ("mellum",),
           tensor_names="services.engine.model.mellum:mellum_tensor_name"),
    Family("qwen_vl", "services.engine.model.qwen_vl", ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"),
           ("qwen2vl", "qwen3vl", "qwen3vlmoe"),
           tensor_names="services.engine.model.multimodal_text:text_tensor_name"),
    Family("phi3", "services.engine.model.phi3", ("phi3",), "phi3"),
    Family("gpt_oss", "services.engine.model.gpt_oss", ("gpt_oss",), "gpt-oss",
           model="services.engine.model.gpt_oss_decoder:GptOssDecoderModel",
           gguf_tensors="services.engine.model.gpt_oss_decoder:experts_from_gguf"),
    Family("glm", "services.engine.model.glm", ("glm",)),
    Family("nanochat", "services.engine.model.nanochat", ("nanochat",),
           model="services.engine.model.nanochat_decoder:NanoChatDecoderModel",
           tensor_names="services.engine.model.nanochat:nanochat_tensor_name"),
    Family("glm4", "services.engine.model.glm4", ("glm4",), "glm4"),
    Family("olmo", "services.engine.model.olmo", ("olmo",),
           model="services.engine.model.olmo_decoder:OlmoDecoderModel"),
    Family("olmo2", "services.engine.model.olmo2", ("olmo2",), "olmo2",
           model="services.engine.model.olmo2_decoder:Olmo2DecoderModel"),
    Family("olmo_hybrid", "services.engine.model.olmo_hybrid", ("olmo_hybrid",),
           model="services.engine.model.olmo_hybrid_decoder:OlmoHybridDecoderModel",
           tensor_names="services.engine.model.olmo_hybrid_decoder:olmo_hybrid_tensor_name"),
    Family("olmo3", "services.engine.model.olmo3", ("olmo3",),
           model="services.engine.model.olmo2_decoder:Olmo2DecoderModel"),
    Family("flex_olmo", "services.engine.model.flex_olmo", ("flex_olmo",),
           model="services.engine.model.olmo2_decoder:Olmo2DecoderModel"),
    Family("olmoe", "services.engine.model.olmoe", ("olmoe",), "olmoe"),
    Family("hunyuan", "services.engine.model.hunyuan", ("hunyuan_v1_dense", "hunyuan_v1_moe"),
           ("hunyuan-dense", "hunyuan-moe"),
           tensor_names="services.engine.model.hunyuan:hunyuan_tensor_name"),
    Family("afmoe", "services.engine.model.afmoe", ("afmoe",),
           tensor_names="services.engine.model.afmoe:afmoe_tensor_name"),
    Family("mimo_v2_flash", "services.engine.model.mimo_v2_flash", ("mimo_v2_flash",),
           model="services.engine.model.mimo_decoder:MiMoDecoderModel",
           tensor_names="services.engine.model.mimo_v2_flash:mimo_tensor_name"),
    Family("dots1", "services.engine.model.dots1", ("dots1",), "dots1",
           tensor_names="services.engine.model.glm4_moe:glm4_moe_tensor_name"),
    Family("hy_v3", "services.engine.model.hy_v3", ("hy_v3",),
           tensor_names="services.engine.model.hy_v3:hy_v3_tensor_name", mtp_layers=True),
    Family("exaone", "services.engine.model.exaone", ("exaone",), "exaone",
           tensor_names="services.engine.model.exaone:exaone_tensor_name"),
    Family("exaone4", "services.engine.model.exaone4", ("exaone4", "exaone4_5"), "exaone4",
           model="services.engine.model.olmo2_decoder:Olmo2DecoderModel",
           tensor_names="services.engine.model.exaone4:exaone4_tensor_name"),
    Family("exaone_moe", "services.engine.model.exaone_moe", ("exaone_moe",),
           tensor_names="services.engine.model.exaone_moe:exaone_moe_tensor_name"),
    Family("kolibri1", "services.engine.model.kolibri1", ("kolibri1",),
           tensor_names="services.engine.model.kolibri1:kolibri1_tensor_name"),
    Family("cohere", "services.engine.model.cohere", ("cohere", "cohere2"), ("command-r", "cohere2"),
           model="services.engine.model.cohere_decoder:CohereDecoderModel"),
    Family("cohere_compass", "services.engine.model.cohere_compass", ("cohere_compass_text", "cohere_compass"),
           model="services.engine.model.cohere_decoder:CohereDecoderModel",
           tensor_names="services.engine.model.multimodal_text:text_tensor_name"),
    Family("cohere2_moe", "services.engine.model.cohere", ("cohere2_moe",),
           model="services.engine.model.cohere_decoder:CohereDecoderModel",
           tensor_names="services.engine.model.glm4_moe:glm4_moe_tensor_name"),
    Family("ernie4_5", "services.engine.model.ernie4_5", ("ernie4_5", "ernie4_5_moe"), ("ernie4_5", "ernie4_5-moe"),
           tensor_names="services.engine.model.ernie4_5:ernie4_5_tensor_name"),
    Family("glm4_moe", "services.engine.model.glm4_moe", ("glm4_moe", "solar_open"), "glm4moe",
           tensor_names="services.engine.model.glm4_moe:glm4_moe_tensor_name", mtp_layers=True),
    Family("deepseek", "services.engine.model.deepseek", ("deepseek_v3", "deepseek_v2", "kimi_k2", "kimi_k25",
                                                        "sarvam_mla"),
           "deepseek2", model="services.engine.model.mla_decoder:LatentAttentionDecoderModel",
           tensor_names="services.engine.model.deepseek:deepseek_tensor_name", mtp_layers=True,
           gguf_tensors="services.engine.model.deepseek_gguf:kv_b_from_gguf"),
    Family("sarvam_moe", "services.engine.model.sarvam", ("sarvam_moe",),
           tensor_names="services.engine.model.sarvam:sarvam_moe_tensor_name", mtp_layers=True),
    Family("deepseek_v32", "services.engine.model.deepseek_v32", ("deepseek_v32", "glm_moe_dsa"),
           model="services.engine.model.dsa_decoder:SparseLatentDecoderModel",
           tensor_names="services.engine.model.deepseek:deepseek_tensor_name", mtp_layers=True),
    Family("glm4_moe_lite", "services.engine.model.glm4_moe_lite", ("glm4_moe_lite",),
           model="services.engine.model.mla_decoder:LatentAttentionDecoderModel",
           tensor_names="services.engine.model.glm4_moe:glm4_moe_tensor_name", mtp_layers=True),
    Family("youtu", "services.engine.model.youtu", ("youtu",),
           model="services.engine.model.mla_decoder:LatentAttentionDecoderModel"),
    Family("axk1", "services.engine.model.axk1", ("axk1",),
           model="services.engine.model.mla_decoder:LatentAttentionDecoderModel",
           tensor_names="services.engine.model.deepseek:deepseek_tensor_name", mtp_layers=True),
    Family("kimi_linear", "services.engine.model.kimi_linear", ("kimi_linear",),
           model="services.engine.model.kimi_linear_decoder:KimiLinearDecoderModel",
           tensor_names="services.engine.model.kimi_linear:kimi_linear_tensor_name"),
    Family("bailing_hybrid", "services.engine.model.bailing_hybrid", ("bailing_hybrid",),
           model="services.engine.model.kimi_linear_decoder:KimiLinearDecoderModel",
           tensor_names="services.engine.model.bailing_hybrid:bailing_hybrid_tensor_name", mtp_layers=True),
    Family("minicpm3", "services.engine.model.minicpm3", ("minicpm3",),
           model="services.engine.model.mla_decoder:LatentAttentionDecoderModel"),
    Family("mistral4", "services.engine.model.mistral4", ("mistral4",), "mistral4",
           model="services.engine.model.mla_decoder:LatentAttentionDecoderModel",
           tensor_names="services.engine.model.deepseek:deepseek_tensor_name",
           gguf_tensors="services.engine.model.deepseek_gguf:kv_b_from_gguf"),
    Family("minimax_m2", "services.engine.model.minimax_m2", ("minimax_m2",), "minimax-m2",
           tensor_names="services.engine.model.minimax_m2:minimax_m2_tensor_name", mtp_layers=True),
    Family("qwen3_5", "services.engine.model.qwen3_5", ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe"),
           ("qwen35", "qwen35moe"), model="services.engine.model.hybrid_decoder:HybridDecoderModel",
           tensor_names="services.engine.model.qwen3_5:qwen3_5_tensor_name",
           gguf_tensors="services.engine.model.qwen3_5_gguf:delta_net_from_gguf"),
    Family("qwen3_next", "services.engine.model.qwen3_next", ("qwen3_next",), "qwen3next",
           model="services.engine.model.hybrid_decoder:HybridDecoderModel",
           tensor_names="services.engine.model.qwen3_5:qwen3_5_tensor_name",
           gguf_tensors="services.engine.model.qwen3_5_gguf:qwen3_next_from_gguf"),
    Family("gemma", "services.engine.model.gemma", ("gemma",), "gemma",
           model="services.engine.model.gemma_decoder:GemmaDecoderModel"),
    Family("gemma2", "services.engine.model.gemma2", ("gemma2",), "gemma2",
           model="services.engine.model.gemma_decoder:GemmaDecoderModel"),
    Family("vaultgemma", "services.engine.model.vaultgemma", ("vaultgemma",),
           model="services.engine.model.gemma_decoder:GemmaDecoderModel",
           tensor_names="services.engine.model.vaultgemma:vaultgemma_tensor_name"),
    Family("gemma3", "services.engine.model.gemma3", ("gemma3_text", "gemma3"), "gemma3",
           model="services.engine.model.gemma_decoder:GemmaDecoderModel",
           tensor_names="services.engine.model.multimodal_text:text_tensor_name"),
    Family("gemma4", "services.engine.model.gemma4",
           ("gemma4_text", "gemma4", "gemma4_unified_text", "gemma4_unified"), "gemma4",
           model="services.engine.model.gemma4_decoder:Gemma4DecoderModel",
           tensor_names="services.engine.model.gemma4:gemma4_tensor_name"),
)


def _module(family: Family) -> ModuleType:
    return importlib.import_module(family.module)


def supported_hf() -> str:
    return ", ".join(t for f in FAMILIES for t in f.hf_model_types)


def supported_gguf() -> str:
    return ", ".join(arch for f in FAMILIES for arch in _gguf_architectures(f))


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """The config of a ``config.json``; an unknown ``model_type`` is refused naming it and the supported ones."""
    model_type = cfg.get("model_type")
    for family in FAMILIES:
        if model_type in family.hf_model_types:
            return _module(family).config_from_hf(cfg)
    archs = cfg.get("architectures") or []
    raise ModelLoadError(f"unsupported model_type {model_type!r} (architectures {archs}); supported model types: "
                         f"{supported_hf()}")


def _gguf_architectures(family: Family) -> tuple[str, ...]:
    arch = family.gguf_architecture
    return () if arch is None else (arch,) if isinstance(arch, str) else arch


def config_from_gguf(fields: Mapping[str, Any]) -> ModelConfig:
    arch = fields.get("general.architecture")
    for family in FAMILIES:
        if arch in _gguf_architectures(family):
            return _module(family).config_from_gguf(fields)
    raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported_gguf()}")


def _attribute(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def gguf_tensors_hook(architecture: str) -> Callable[..., dict] | None:
    """The family's GGUF tensor layout hook (``Family.gguf_tensors``), or None."""
    hook = family(architecture).gguf_tensors
    return None if hook is None else _attribute(hook)


def model_class(architecture: str) -> type:
    """The model class of a family (a :class:`~services.engine.model.decoder.DecoderModel`)."""
    return _attribute(family(architecture).model)


def tensor_renamer(config: ModelConfig) -> Callable[[str], str | None]:
    """The family's map from checkpoint tensor names to the model's; None for a tensor not read (a family's
    own choice, or a multi-token-prediction layer's)."""
    chosen = family(config.architecture)
    rename: Callable[[str], str | None] = (lambda name: name) if chosen.tensor_names is None \
        else _attribute(chosen.tensor_names)
    if not chosen.mtp_layers:
        return rename

    def without_mtp_layers(name: str) -> str | None:  # the layer read in the model's name (a wrapper's nests it)
        renamed = rename(name)
        return None if renamed is None or _layer_index(renamed) >= config.num_layers else renamed

    return without_mtp_layers


def _layer_index(name: str) -> int:
    """The decoder layer a tensor belongs to (-1: none)."""
    match = _LAYER.match(name)
    return -1 if match is None else int(match.group(1))


_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def family(architecture: str) -> Family:
    for candidate in FAMILIES:
        if candidate.name == architecture:
            return candidate
    raise ModelLoadError(f"unknown architecture {architecture!r}; supported: {', '.join(f.name for f in FAMILIES)}")
