"""Rotary position tables, with every RoPE scaling transformers implements for decoders.

Each inverse-frequency formula follows ``transformers.modeling_rope_utils`` (5.x) op
for op, so a table equals the cos/sin transformers computes for the same positions:
``llama3``, ``linear``, ``dynamic`` (NTK), ``yarn`` and ``longrope`` (Phi-3's ``su``).
``dynamic`` and ``longrope`` depend on the sequence length: past
``original_max_position_embeddings`` the table is recomputed for the batch's length
(transformers does the same from the largest position id it is given).
"""

from __future__ import annotations

import math

import torch

from workers.models.config import RopeScaling


def _positions(head_dim: int, device) -> torch.Tensor:
    return torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim


def _llama3(freqs: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 RoPE scaling of inverse frequencies (as Meta's reference and transformers)."""
    wavelen = 2 * math.pi / freqs
    context = s.original_max_position_embeddings
    low_wavelen, high_wavelen = context / s.low_freq_factor, context / s.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, freqs / s.factor, freqs)
    smooth = (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _dynamic(head_dim: int, theta: float, s: RopeScaling, seq_len: int, device) -> torch.Tensor:
    """NTK: a larger base past the original length (in float32 tensors, as transformers)."""
    length = torch.tensor(max(seq_len, s.original_max_position_embeddings))
    base = theta * ((s.factor * length / s.original_max_position_embeddings) - (s.factor - 1)) ** (
        head_dim / (head_dim - 2)
    )
    return 1.0 / (base.to(device) ** _positions(head_dim, device))


def _correction_range(head_dim: int, theta: float, s: RopeScaling) -> tuple[float, float]:
    def dim_of(rotations: float) -> float:
        ratio = s.original_max_position_embeddings / (rotations * 2 * math.pi)
        return (head_dim * math.log(ratio)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def _yarn(head_dim: int, theta: float, s: RopeScaling, device) -> torch.Tensor:
    """YaRN: interpolated frequencies below the ramp, extrapolated above, blended between."""
    pos_freqs = theta ** _positions(head_dim, device)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)
    low, high = _correction_range(head_dim, theta, s)
    if low == high:
        high += 0.001  # as transformers: no singular ramp
    ramp = (torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)
    keep = 1 - torch.clamp(ramp, 0, 1).to(device)
    return interpolation * (1 - keep) + extrapolation * keep


def inv_freq(
    head_dim: int, theta: float, scaling: RopeScaling | None, *, seq_len: int = 0, device=None
) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` for a sequence of ``seq_len`` positions."""
    kind = scaling.rope_type if scaling is not None else "default"
    if kind == "dynamic" and seq_len > scaling.original_max_position_embeddings:
        return _dynamic(head_dim, theta, scaling, seq_len, device)
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, device)
    if kind == "longrope":
        long = seq_len > scaling.original_max_position_embeddings
        factors = scaling.long_factor if long else scaling.short_factor
        ext = torch.tensor(factors, dtype=torch.float32, device=device)
        return 1.0 / (ext * theta ** _positions(head_dim, device))
    freqs = 1.0 / (theta ** _positions(head_dim, device))
    if kind == "llama3":
        return _llama3(freqs, scaling)
    if kind == "linear":
        return freqs / scaling.factor
    return freqs


def precompute_freqs_cis(
    *, head_dim: int, max_seq_len: int, theta: float, device=None, scaling=None, seq_len: int = 0
) -> torch.Tensor:
    """Rotary factors ``[max_seq_len, head_dim // 2, 2]`` holding (cos, sin) per position and pair.

    Real rather than complex (torchtitan's layout) because ``model.to(bfloat16)``
    casts complex buffers to real and silently drops the sine part. ``scaling`` (a
    :class:`~workers.models.config.RopeScaling`) scales the frequencies, and for yarn
    and longrope cos and sin too; ``seq_len`` is the length a length-dependent scaling
    is computed for.
    """
    freqs = inv_freq(head_dim, theta, scaling, seq_len=seq_len, device=device)
    t = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    factor = scaling.attention_factor if scaling is not None else 1.0
    return torch.stack((angles.cos() * factor, angles.sin() * factor), dim=-1)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, T, H, D]`` by ``freqs_cis`` ``[T, D/2, 2]`` (or ``[B, T, D/2, 2]``:
    each row's own positions, for packed rows); computed in fp32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rows = freqs_cis if freqs_cis.dim() == 4 else freqs_cis[None]
    cos = rows[:, :, None, :, 0].float()
    sin = rows[:, :, None, :, 1].float()
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return out.type_as(x)
