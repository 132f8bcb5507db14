"""The description of Mamba (Mamba-1) layers (:class:`Mamba1`), part of
:class:`~services.engine.model.config.ModelConfig` (and re-exported there)."""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.errors import ModelLoadError


@dataclass(frozen=True)
class Mamba1:
    """Mamba (Mamba-1) layers (AI21 Jamba's; :mod:`services.engine.model.jamba_decoder`): ``layers`` mix tokens
    through a selective state space whose decay differs per channel and state dim (``A [inner, state_size]``, not one
    scalar per head as Mamba-2's). Per layer and sequence the state is the last ``conv_kernel - 1`` inputs of a
    depthwise causal convolution over the ``inner`` channels and an ``[inner, state_size]`` float32 matrix. The step
    sizes come through a rank-``dt_rank`` projection; ``inner_norms``: Jamba's RMSNorms on the step-size rows and on
    B and C."""

    layers: tuple[int, ...]
    inner: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool = True
    inner_norms: bool = False

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
        from services.engine.model.config import state_bytes

        return state_bytes(self, dtype_bytes)
