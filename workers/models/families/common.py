"""What every family module uses: the :class:`Family` record and shared readers; no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from workers.models.hf_fields import read_int, show
from workers.models.hf_rope import rope_params, rope_scaling, rope_theta, scaled_positions


@dataclass(frozen=True)
class Family:
    """How one family of Hugging Face decoders maps onto etrain's.

    ``fields(config, arch, where)`` reads a config.json (a dict) into the
    :class:`~workers.models.config.ModelConfig` fields beyond the shared shapes
    (``ValueError`` naming ``where`` for what etrain cannot reproduce exactly).
    ``renames`` maps etrain names inside a layer to the family's where they differ from
    Llama's; ``fused`` names a checkpoint tensor that stacks several of etrain's by rows
    (in order): loading splits it, export fuses it back.
    """

    name: str
    architectures: tuple[str, ...]
    fields: Callable[[dict, str, str], dict]
    renames: Mapping[str, str] = field(default_factory=dict)
    fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def head_dim(config: dict, where: str, default: int | None = None) -> int | None:
    """The explicit head width (``head_dim``, else the family's default), or None when it
    is hidden_size / num_attention_heads."""
    value = config.get("head_dim", default)
    if value is None:
        return None
    value = read_int({"head_dim": value}, "head_dim", where)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    return None if heads * value == hidden else value


def refuse(config: dict, keys: tuple[str, ...], what: str, where: str) -> None:
    """``ValueError`` if any of ``keys`` is set (truthy) in ``config``."""
    found = [k for k in keys if config.get(k)]
    if found:
        raise ValueError(f"{where}: {', '.join(found)} ({what}) is not implemented by etrain")


_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


def attention_layers(config: dict, where: str, default: Callable[[int], str]) -> dict:
    """``layer_types`` (etrain's ``full`` / ``sliding``) and ``sliding_window`` of ``config``;
    ``default(i)`` gives a layer's Hugging Face type when config.json lists none."""
    n = config["num_hidden_layers"]
    given = config.get("layer_types") or [default(i) for i in range(n)]
    if not isinstance(given, list) or len(given) != n or not set(given) <= set(_TYPES):
        raise ValueError(
            f"{where}: config.json layer_types must list full_attention or "
            f"sliding_attention for each of the {n} layers, got {show(given)}"
        )
    types = tuple(_TYPES[t] for t in given)
    if "sliding" not in types:
        return {"layer_types": (), "sliding_window": None}
    return {"layer_types": types, "sliding_window": read_int(config, "sliding_window", where)}


def rope_fields(config: dict, head: int, where: str, params: dict | None = None) -> dict:
    """``rope_theta``, ``rope_scaling`` and the ``max_seq_len`` they allow."""
    params = rope_params(config, where) if params is None else params
    scaling = rope_scaling(params, config, head, where)
    limit = read_int(config, "max_position_embeddings", where, 2048)
    return {
        "rope_theta": rope_theta(params, config, where),
        "rope_scaling": scaling,
        "max_seq_len": scaled_positions(limit, scaling),
    }


def width(config: dict, explicit: int | None) -> int:
    """The head width (for RoPE factor lists) before ModelConfig validates it."""
    heads = max(int(config["num_attention_heads"]), 1)
    return explicit or int(config["hidden_size"]) // heads
