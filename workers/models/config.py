"""Model shapes and presets, without torch: the service plans with these.

The control plane must not import torch, so everything it needs to size a
model (presets, parameter counts) lives here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1-style RoPE frequency scaling (transformers' ``rope_type: llama3``).

    Wavelengths longer than ``original_max_position_embeddings / low_freq_factor``
    are stretched by ``factor``, those shorter than ``.../ high_freq_factor`` kept,
    and the band between interpolated smoothly.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and 0 < self.low_freq_factor < self.high_freq_factor):
            raise ValueError(
                "RoPE scaling needs factor >= 1 and 0 < low_freq_factor < high_freq_factor"
            )
        if self.original_max_position_embeddings < 1:
            raise ValueError("RoPE scaling needs original_max_position_embeddings >= 1")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder; validated on construction."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Pretrained models (model.hf): Qwen2's q/k/v projections carry a bias, and
    # export names the source architecture. Presets keep the defaults.
    qkv_bias: bool = False
    architecture: str = "LlamaForCausalLM"
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "dim",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "ffn_hidden",
            "max_seq_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise ValueError(
                f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if (self.dim // self.n_heads) % 2:
            raise ValueError(
                f"head dim (model.dim / model.n_heads = {self.dim // self.n_heads}) must be "
                "even for RoPE"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_heads


PRESETS: dict[str, ModelConfig] = {
    # Byte-level toy models that train on CPU in seconds.
    "gpt-tiny": ModelConfig(
        vocab_size=256,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=128,
        max_seq_len=1024,
    ),
    "gpt-small": ModelConfig(
        vocab_size=256,
        dim=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        ffn_hidden=688,
        max_seq_len=2048,
    ),
    # Published shapes: Llama 3.2 1B, Llama 2 7B, Llama 3 70B.
    "llama-1b": ModelConfig(
        vocab_size=128256,
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_hidden=8192,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
    "llama-7b": ModelConfig(
        vocab_size=32000,
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=32,
        ffn_hidden=11008,
        max_seq_len=4096,
    ),
    "llama-70b": ModelConfig(
        vocab_size=128256,
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_hidden=28672,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}


def get_model_config(preset: str) -> ModelConfig:
    """Return the :class:`ModelConfig` of a named preset; ``ValueError`` lists the known ones."""
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(
            f"unknown model preset {preset!r}; set one of: {', '.join(PRESETS)}"
        ) from None


def count_params(cfg: ModelConfig) -> int:
    """Number of parameters of ``build_model(cfg)``, computed from the shapes alone."""
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    attention = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv_dim
    if cfg.qkv_bias:
        attention += cfg.dim + 2 * kv_dim
    feed_forward = 3 * cfg.dim * cfg.ffn_hidden
    block = attention + feed_forward + 2 * cfg.dim  # two RMSNorm weights
    return cfg.n_layers * block + 2 * cfg.vocab_size * cfg.dim + cfg.dim
