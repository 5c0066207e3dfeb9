"""A config.json's RoPE settings as etrain's (theta, :class:`RopeScaling`); no torch.

transformers 5 writes them as ``rope_parameters`` (``rope_type``, ``rope_theta`` and
the scaling's numbers; Gemma 3 nests one such object per layer type), 4.x as
``rope_scaling`` (``type`` or ``rope_type``) with ``rope_theta`` at the top level.
Every ``rope_type`` transformers implements for these decoders maps: ``default``,
``llama3``, ``linear``, ``dynamic``, ``yarn`` and ``longrope`` (Phi-3's old ``su``).
"""

from __future__ import annotations

import math

from workers.models.config import ROPE_TYPES, RopeScaling
from workers.models.hf_fields import (
    MAX_POSITIONS,
    numbers,
    optional_number,
    read_int,
    read_number,
    show,
)

_ALIASES = {"su": "longrope"}


def rope_params(config: dict, where: str) -> dict:
    """The flat RoPE settings of ``config`` (``rope_parameters``, else ``rope_scaling``)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: config.json rope_parameters must be an object")
    return params


def rope_theta(params: dict, config: dict, where: str, default: float = 10000.0) -> float:
    """RoPE base of ``params`` (or the top-level ``rope_theta``); partial rotary is refused."""
    if params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{where}: partial rotary embeddings are not implemented by etrain")
    theta = params.get("rope_theta", config.get("rope_theta", default))
    return read_number(theta, "rope_theta", where)


def _original(params: dict, config: dict, where: str) -> int:
    """The pretraining context: the scaling's, the config's top-level one, else max positions."""
    key = "original_max_position_embeddings"
    source = params if key in params else config if key in config else None
    if source is None:
        return read_int(config, "max_position_embeddings", where, 2048)
    return read_int(source, key, where)


def _yarn_attention(params: dict, factor: float, where: str) -> float:
    """YaRN's cos/sin factor as transformers infers it (``attention_factor`` or mscale)."""
    given = optional_number(params, "attention_factor", where)
    if given is not None:
        return given

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = (optional_number(params, k, where) for k in ("mscale", "mscale_all_dim"))
    if m and m_all:
        return float(mscale(factor, m) / mscale(factor, m_all))
    return mscale(factor)


def _longrope(params: dict, config: dict, head_dim: int, where: str) -> dict:
    original = _original(params, config, where)
    factor = optional_number(params, "factor", where)
    if factor is None:
        factor = read_int(config, "max_position_embeddings", where, 2048) / original
    attention = optional_number(params, "attention_factor", where)
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {
        "factor": max(factor, 1.0),
        "original_max_position_embeddings": original,
        "attention_factor": attention,
        "short_factor": numbers(params.get("short_factor"), "short_factor", where, head_dim // 2),
        "long_factor": numbers(params.get("long_factor"), "long_factor", where, head_dim // 2),
    }


def _fields(kind: str, params: dict, config: dict, head_dim: int, where: str) -> dict:
    """The :class:`RopeScaling` fields of a ``kind`` scaling."""
    if kind == "longrope":
        return _longrope(params, config, head_dim, where)
    if "factor" not in params:
        raise ValueError(f"{where}: config.json {kind} RoPE scaling has no factor")
    out: dict = {"factor": read_number(params["factor"], "factor", where)}
    if kind == "dynamic":  # NTK past max_position_embeddings, as transformers
        out["original_max_position_embeddings"] = read_int(
            config, "max_position_embeddings", where, 2048
        )
    if kind in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = _original(params, config, where)
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if key not in params:
                raise ValueError(
                    f"{where}: config.json llama3 RoPE scaling is incomplete (no {key})"
                )
            out[key] = read_number(params[key], key, where)
    if kind == "yarn":
        for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
            out[key] = optional_number(params, key, where) or default
        out["truncate"] = bool(params.get("truncate", True))
        out["attention_factor"] = _yarn_attention(params, out["factor"], where)
    return out


def rope_scaling(params: dict, config: dict, head_dim: int, where: str) -> RopeScaling | None:
    """The scaling ``params`` declares, or None for plain RoPE; unknown kinds are refused."""
    kind = params.get("rope_type", params.get("type", "default"))
    kind = _ALIASES.get(kind, kind)
    if kind == "default":
        return None
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"{where}: RoPE scaling {show(kind)} is not implemented by etrain (default, "
            f"{', '.join(ROPE_TYPES)})"
        )
    scope = f"{where} (RoPE scaling)"
    try:
        return RopeScaling(rope_type=kind, **_fields(kind, params, config, head_dim, scope))
    except ValueError as exc:
        if str(exc).startswith(scope):
            raise
        raise ValueError(f"{where}: config.json {kind} RoPE scaling: {exc}") from None


def scaled_positions(limit: int, scaling: RopeScaling | None) -> int:
    """Positions a scaled model trains on: ``dynamic`` and ``yarn`` extend the pretraining
    context by their factor (transformers computes their tables for any length)."""
    if scaling is not None and scaling.rope_type in ("dynamic", "yarn"):
        extended = int(scaling.factor * scaling.original_max_position_embeddings)
        limit = max(limit, min(extended, MAX_POSITIONS))
    return limit
