"""Model shapes and presets, without torch: the service plans with these.

The control plane must not import torch, so everything it needs to size a
model (presets, parameter counts) lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE_TYPES = ("llama3", "linear", "dynamic", "yarn", "longrope")
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as transformers computes it (``rope_type`` in its config.json).

    ``llama3`` (Llama 3.1) stretches wavelengths longer than ``original / low_freq_factor``
    by ``factor``, keeps those shorter than ``original / high_freq_factor`` and interpolates
    between; ``linear`` divides every frequency by ``factor``; ``dynamic`` (NTK) raises the
    base once a sequence is longer than ``original_max_position_embeddings``; ``yarn``
    blends interpolated and extrapolated frequencies between ``beta_fast`` and ``beta_slow``
    rotations and scales cos/sin by ``attention_factor``; ``longrope`` (Phi-3's ``su``)
    divides by ``short_factor`` or, for a sequence longer than the original context,
    ``long_factor``, and scales cos/sin by ``attention_factor``.
    """

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 1
    rope_type: str = "llama3"
    # yarn: ramp bounds (in rotations) and whether the correction range is rounded.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # yarn / longrope: multiplies cos and sin (resolved from the config's numbers).
    attention_factor: float = 1.0
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"RoPE scaling {self.rope_type!r} is not one of {ROPE_TYPES}")
        if not self.factor >= 1:
            raise ValueError("RoPE scaling needs factor >= 1")
        if self.rope_type == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError("RoPE scaling needs 0 < low_freq_factor < high_freq_factor")
        if self.original_max_position_embeddings < 1:
            raise ValueError("RoPE scaling needs original_max_position_embeddings >= 1")
        if self.rope_type == "longrope" and len(self.short_factor) != len(self.long_factor):
            raise ValueError("longrope RoPE scaling needs short_factor and long_factor alike")

    @property
    def length_dependent(self) -> bool:
        """Whether the frequencies depend on the sequence length (past the original one)."""
        return self.rope_type in ("dynamic", "longrope")


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
    # What other families change (workers.models.families maps their config.json here;
    # docs/model-families.md). An explicit head width (Qwen3, Gemma) when it is not
    # dim / n_heads; RMSNorm of each head's q and k (Qwen3, Gemma 3).
    explicit_head_dim: int | None = None
    qk_norm: bool = False
    # Gemma: norms scale by (1 + weight), embeddings are multiplied by sqrt(dim), the MLP
    # gate is gelu (tanh), and attention and MLP outputs are normed before the residual.
    norm_offset: float = 0.0
    embed_scale: bool = False
    activation: str = "silu"
    sandwich_norm: bool = False
    # tanh soft-capping of attention scores / of the logits; the softmax scale (default
    # head_dim ** -0.5).
    attn_softcap: float | None = None
    final_softcap: float | None = None
    attn_scale: float | None = None
    # Per-layer attention: "full" or "sliding" (a causal window of sliding_window
    # positions); empty means every layer full. Sliding layers may use their own RoPE.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    local_rope_theta: float | None = None
    local_rope_scaling: RopeScaling | None = None

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
        if self.explicit_head_dim is None and self.dim % self.n_heads:
            raise ValueError(
                f"model.dim ({self.dim}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.head_dim < 1 or self.head_dim % 2:
            raise ValueError(f"head dim ({self.head_dim}) must be even for RoPE")
        self._check_variant()

    def _check_variant(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {ACTIVATIONS}")
        if self.layer_types and len(self.layer_types) != self.n_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} of {self.n_layers} layers")
        if not set(self.layer_types) <= {"full", "sliding"}:
            raise ValueError(f"layer_types must be 'full' or 'sliding', got {self.layer_types}")
        if "sliding" in self.layer_types and not (self.sliding_window or 0) >= 1:
            raise ValueError("sliding layers need sliding_window >= 1")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.explicit_head_dim or self.dim // self.n_heads

    def layer_type(self, i: int) -> str:
        """``"full"`` or ``"sliding"``: the attention of layer ``i``."""
        return self.layer_types[i] if self.layer_types else "full"


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
    kv_dim, q_dim = cfg.n_kv_heads * cfg.head_dim, cfg.n_heads * cfg.head_dim
    attention = 2 * cfg.dim * q_dim + 2 * cfg.dim * kv_dim
    if cfg.qkv_bias:
        attention += q_dim + 2 * kv_dim
    if cfg.qk_norm:
        attention += 2 * cfg.head_dim
    feed_forward = 3 * cfg.dim * cfg.ffn_hidden
    block = attention + feed_forward + (4 if cfg.sandwich_norm else 2) * cfg.dim  # RMSNorms
    return cfg.n_layers * block + 2 * cfg.vocab_size * cfg.dim + cfg.dim
