"""Reading numbers out of a Hugging Face ``config.json``, each within a range; no torch.

Shared by :mod:`workers.models.hf_config` and the families
(:mod:`workers.models.families`): every number a family reads goes through
:func:`read_int` / :func:`read_number`, so none can make the planner or the workers
loop or allocate without end. A failure is a ``ValueError`` that names ``where``.
"""

from __future__ import annotations

from typing import Any

# The range each number read from config.json must lie in: generous (the largest
# published models, ~1T parameters, use at most a few hundred layers, a hidden size of
# 16k-32k, a 256k vocabulary and a 10M context), and bounded, so that neither the planner
# nor the workers can be made to loop or allocate without end by a config.json.
RANGES: dict[str, tuple[int | float, int | float]] = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 65_536),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (2, 4096),
    "intermediate_size": (1, 262_144),
    "vocab_size": (1, 4_194_304),
    "max_position_embeddings": (1, 16_777_216),
    "sliding_window": (1, 16_777_216),
    "original_max_position_embeddings": (1, 16_777_216),
    "rope_theta": (0, 1e12),  # exclusive of 0
    "factor": (1, 1024),
    "low_freq_factor": (0, 1024),  # exclusive of 0
    "high_freq_factor": (0, 1024),  # exclusive of 0
    "beta_fast": (0, 1024),  # exclusive of 0
    "beta_slow": (0, 1024),  # exclusive of 0
    "attention_factor": (0, 1024),  # exclusive of 0
    "mscale": (0, 1024),  # exclusive of 0
    "mscale_all_dim": (0, 1024),  # exclusive of 0
    "short_factor": (0, 1e6),  # each entry; exclusive of 0
    "long_factor": (0, 1e6),  # each entry; exclusive of 0
    "query_pre_attn_scalar": (0, 1e6),  # exclusive of 0
    "attn_logit_softcapping": (0, 1e6),  # exclusive of 0
    "final_logit_softcapping": (0, 1e6),  # exclusive of 0
}
MAX_POSITIONS = int(RANGES["max_position_embeddings"][1])


def show(value: object) -> str:
    """``value`` for a message, cut short (a config.json value may be a 1 MiB string)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def read_int(config: dict, key: str, where: str, default: int | None = None) -> int:
    """``config[key]`` (or ``default``) as an integer in ``RANGES[key]``."""
    value = config.get(key, default)
    low, high = RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{where}: config.json {key} must be an integer from {low} to {high:,}, "
            f"got {show(value)}"
        )
    return value


def read_number(value: object, key: str, where: str) -> float:
    """``value`` as a float in ``RANGES[key]`` (above its low end when that is 0)."""
    low, high = RANGES[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (low < value <= high if low == 0 else low <= value <= high):
        above = f"above {low} up to" if low == 0 else f"from {low} to"
        raise ValueError(
            f"{where}: config.json {key} must be a number {above} {high:g}, got {show(value)}"
        )
    return float(value)


def optional_number(config: dict, key: str, where: str) -> float | None:
    """``config[key]`` as a number in range, or None when it is absent or null."""
    value = config.get(key)
    return None if value is None else read_number(value, key, where)


def numbers(values: Any, key: str, where: str, length: int) -> tuple[float, ...]:
    """A list of ``length`` numbers, each in ``RANGES[key]``."""
    if not isinstance(values, list) or len(values) != length:
        raise ValueError(f"{where}: config.json {key} must be a list of {length} numbers")
    return tuple(read_number(v, key, where) for v in values)


def check_activation(config: dict, key: str, allowed: dict[str, str], where: str) -> str:
    """etrain's name of the activation ``config[key]`` names (``ValueError`` if none)."""
    value = config.get(key, next(iter(allowed)))
    if value not in allowed:
        raise ValueError(
            f"{where}: {key} {show(value)} is not implemented by etrain for this "
            f"architecture ({', '.join(allowed)})"
        )
    return allowed[value]
