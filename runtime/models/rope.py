"""Rotary position embedding (RoPE), shared by every family: the inverse frequencies, with the scalings of
Hugging Face Llama configs (``linear``, ``llama3``).

The values follow ``transformers``' ``_compute_default_rope_parameters`` and
``_compute_llama3_parameters`` step for step, so that a model imported from a Llama 3.1 checkpoint
rotates exactly as it was trained; any other scaling is refused where the config is read. ``rope_tables``
and ``apply_rope`` rotate queries and keys by them (the half-split form of Hugging Face's Llama-style models).
"""

from __future__ import annotations

import math

import torch

from runtime.config import RopeScalingArgs


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScalingArgs | None, device: torch.device | None = None
                  ) -> torch.Tensor:
    """``head_dim / 2`` float32 inverse frequencies of the half-split rotary embedding."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: wavelengths longer than the original context / low_freq_factor are divided by factor,
    # shorter than original / high_freq_factor kept, and the band between interpolated smoothly
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                scaling: RopeScalingArgs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``[batch, seq, 1, head_dim / 2]``, for the given positions."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling, position_ids.device)
    angles = position_ids.float()[..., None] * inv_freq
    return angles.cos()[:, :, None, :].to(dtype), angles.sin()[:, :, None, :].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of each head by the position's angles, in the tables' dtype
    (fp32 tables with ``model.rope_fp32``: the rotation in fp32, the result back in ``x``'s dtype)."""
    x1, x2 = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
