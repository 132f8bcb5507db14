"""The recurrent layers of hybrid models, part of :class:`~services.engine.model.config.ModelConfig` (and re-exported
there): Gated DeltaNet (:class:`LinearAttention`), Mamba-2 (:class:`Mamba2`), LFM2's short convolutions
(:class:`ShortConv`) and Mamba-1 (:class:`Mamba1`), each with the shape of its per-sequence state."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class LinearAttention:
    """Gated DeltaNet layers (Qwen3.5, Qwen3-Next; :mod:`services.engine.model.hybrid_decoder`; Kimi Linear's KDA,
    ``channel_decay``): ``layers`` mix tokens through a recurrent state of fixed size instead of attention over a KV
    cache. Per layer and sequence the state is the last ``conv_kernel - 1`` inputs of a depthwise causal convolution
    over the q/k/v rows (``conv_dim`` channels) and a ``[value_heads, key_head_dim, value_head_dim]`` float32 matrix the
    gated delta rule reads and writes."""

    layers: tuple[int, ...]
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    # Kimi Delta Attention (Kimi Linear's; :mod:`services.engine.model.kimi_linear_decoder`): a decay per key dim of
    # each head (:mod:`kernels.kimi_delta`), not one per head; q, k and v heads alike
    channel_decay: bool = False
    # KDA's forget and output gates projected at full width (``f_proj``, ``g_proj``: Ling 3's), not through rank
    # head_dim pairs (Kimi's ``f_a_proj``/``f_b_proj``, ``g_a_proj``/``g_b_proj``)
    full_rank_gates: bool = False
    # KDA's bounded forget gate (Ling 3's ``kda_lower_bound``): the log decay ``bound · sigmoid(exp(A_log) · x)``,
    # not ``-exp(A_log) · softplus(x)``
    decay_bound: float | None = None
    # KDA's convolution and ``A_log`` kept in float32 and its decay rounded to the model dtype (Ling 3's, as
    # transformers keeps them); else both in the model dtype and the decay float32 (Kimi's)
    float32_mixer: bool = False
    # Gated DeltaNet's write strength doubled, ``2 · sigmoid(b)`` (OLMo Hybrid's ``linear_allow_neg_eigval``: the
    # transition's eigenvalues reach -1)
    negative_eigenvalues: bool = False

    def __post_init__(self) -> None:
        if self.channel_decay and (self.key_heads, self.key_head_dim) != (self.value_heads, self.value_head_dim):
            raise ModelLoadError(f"Kimi Delta Attention has as many key heads as value heads, of one width: got "
                                 f"{self.key_heads} of {self.key_head_dim}, {self.value_heads} of "
                                 f"{self.value_head_dim}")
        for name in ("key_heads", "value_heads", "key_head_dim", "value_head_dim"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config linear attention {name} must be >= 1, got {getattr(self, name)}")
        if self.conv_kernel < 2:
            raise ModelLoadError(f"config linear attention conv kernel must be >= 2, got {self.conv_kernel}")
        if self.value_heads % self.key_heads:
            raise ModelLoadError(f"linear attention: {self.value_heads} value heads do not divide into "
                                 f"{self.key_heads} key heads")

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """The convolution's channels: q, k and v rows."""
        return 2 * self.key_dim + self.value_dim

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        return self.value_heads, self.key_head_dim, self.value_head_dim

    def state_bytes(self, dtype_bytes: int) -> int:
        return state_bytes(self, dtype_bytes)


@dataclass(frozen=True)
class Mamba2:
    """Mamba-2 layers (IBM Granite 4.0's ``-H`` models, Bamba, Nemotron-H, Falcon-H1;
    :mod:`services.engine.model.mamba_decoder`): ``layers`` mix tokens through a selective state space instead of
    attention (or, ``beside_attention``, as well as it). Per layer and sequence the state is the last
    ``conv_kernel - 1`` inputs of a depthwise causal convolution over the x/B/C rows (``conv_dim`` channels) and a
    ``[heads, state_size, head_dim]`` float32 matrix."""

    layers: tuple[int, ...]
    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel: int
    conv_bias: bool = True
    dt_min: float = 0.0  # the step sizes' floor: ``time_step_limit``'s lower bound
    # the mixer runs beside the layer's attention, both on its normed input (Falcon-H1's parallel hybrid): these
    # layers keep KV as well as the state
    beside_attention: bool = False

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "state_size", "groups"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config mamba {name} must be >= 1, got {getattr(self, name)}")
        if self.conv_kernel < 2:
            raise ModelLoadError(f"config mamba conv kernel must be >= 2, got {self.conv_kernel}")
        if self.heads % self.groups:
            raise ModelLoadError(f"mamba: {self.heads} heads do not divide into {self.groups} groups")

    @property
    def intermediate(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """The convolution's channels: x, B and C rows."""
        return self.intermediate + 2 * self.groups * self.state_size

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        return self.heads, self.state_size, self.head_dim

    def state_bytes(self, dtype_bytes: int) -> int:
        return state_bytes(self, dtype_bytes)


@dataclass(frozen=True)
class ShortConv:
    """LFM2's gated short convolutions (Liquid AI; :mod:`services.engine.model.lfm2_decoder`): ``layers`` mix tokens
    through a depthwise causal convolution of ``conv_kernel`` taps over ``B · x`` (``conv_dim`` channels, the hidden
    size), gated by ``C``. Per layer and sequence the state is the convolution's last ``conv_kernel - 1`` inputs;
    there is no matrix state."""

    layers: tuple[int, ...]
    conv_dim: int
    conv_kernel: int

    def __post_init__(self) -> None:
        if self.conv_dim < 1:
            raise ModelLoadError(f"config short conv channels must be >= 1, got {self.conv_dim}")
        if self.conv_kernel < 2:
            raise ModelLoadError(f"config short conv kernel must be >= 2, got {self.conv_kernel}")

    @property
    def ssm_shape(self) -> None:
        return None

    def state_bytes(self, dtype_bytes: int) -> int:
        return state_bytes(self, dtype_bytes)


@dataclass(frozen=True)
class Mamba1:
    """Mamba (Mamba-1) layers (AI21 Jamba's; :mod:`services.engine.model.jamba_decoder`): ``layers`` mix tokens
    through a selective state space whose decay differs per channel and state dim (``A [inner, state_size]``, not one
    scalar per head as Mamba-2's). Per layer and sequence the state is the last ``conv_kernel - 1`` inputs of a
    depthwise causal convolution over the ``inner`` channels and an ``[inner, state_size]`` float32 matrix. The step
    sizes come through a rank-``dt_rank`` projection; ``inner_norms``: RMSNorms on the step-size rows and on B and C,
    Jamba's with weights, Falcon-Mamba's without (``inner_norm_weights``), with an epsilon of their own
    (``inner_norm_eps``; None: the model's ``rms_norm_eps``)."""

    layers: tuple[int, ...]
    inner: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool = True
    inner_norms: bool = False
    inner_norm_weights: bool = True
    inner_norm_eps: float | None = None

    def __post_init__(self) -> None:
        for name in ("inner", "state_size", "dt_rank"):
            if getattr(self, name) < 1:
                raise ModelLoadError(f"config mamba {name} must be >= 1, got {getattr(self, name)}")
        if self.conv_kernel < 2:
            raise ModelLoadError(f"config mamba conv kernel must be >= 2, got {self.conv_kernel}")

    @property
    def conv_dim(self) -> int:
        """The convolution's channels: the x rows."""
        return self.inner

    @property
    def ssm_shape(self) -> tuple[int, int]:
        return self.inner, self.state_size

    def state_bytes(self, dtype_bytes: int) -> int:
        return state_bytes(self, dtype_bytes)


def state_bytes(spec: LinearAttention | Mamba2 | ShortConv | Mamba1, dtype_bytes: int) -> int:
    """One sequence's state over all of ``spec``'s layers: the conv rows in the serving dtype, the matrix (where the
    layers have one) in float32."""
    matrix = 0 if spec.ssm_shape is None else math.prod(spec.ssm_shape) * 4
    return len(spec.layers) * (spec.conv_dim * (spec.conv_kernel - 1) * dtype_bytes + matrix)
