"""A Llama-style decoder-only transformer in plain PyTorch.

The model holds no parallelism code: data, tensor and pipeline parallelism are
applied from outside by ``workers.strategies`` (torchtitan style). To make that
possible the module names follow torchtitan exactly (``tok_embeddings``,
``layers["<i>"]``, ``attention.wq`` ...), attention derives its local head count
from the weight shapes at forward time, and the top-level modules may be set to
``None`` by pipeline splitting.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workers.models.config import ModelConfig
from workers.models.recompute import run_block


def precompute_freqs_cis(
    *, head_dim: int, max_seq_len: int, theta: float, device=None, scaling=None
) -> torch.Tensor:
    """Rotary factors ``[max_seq_len, head_dim // 2, 2]`` holding (cos, sin) per position and pair.

    Real rather than complex (torchtitan's layout) because ``model.to(bfloat16)``
    casts complex buffers to real and silently drops the sine part. ``scaling``
    (a :class:`~workers.models.config.RopeScaling`) applies Llama 3.1's frequency scaling.
    """
    freqs = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    if scaling is not None:
        freqs = _llama3_scaled(freqs, scaling)
    t = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def _llama3_scaled(freqs: torch.Tensor, s) -> torch.Tensor:
    """Llama 3.1 RoPE scaling of inverse frequencies (as Meta's reference and transformers)."""
    wavelen = 2 * math.pi / freqs
    context = s.original_max_position_embeddings
    low_wavelen, high_wavelen = context / s.low_freq_factor, context / s.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, freqs / s.factor, freqs)
    smooth = (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, T, H, D]`` by ``freqs_cis`` ``[T, D/2, 2]``; computed in fp32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos = freqs_cis[None, :, None, :, 0].float()
    sin = freqs_cis[None, :, None, :, 1].float()
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale; normalises in fp32 for stability."""

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of ``x`` and scale it."""
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).type_as(x)

    def reset_parameters(self) -> None:
        """Set the scale back to ones."""
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary position embeddings."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        # Qwen2-style q/k/v biases (cfg.qkv_bias) shard with their weights under TP.
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, kv_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        """Attend over ``x`` ``[B, T, D]`` causally."""
        bsz, seqlen, _ = x.shape
        # Head counts come from the (possibly tensor-parallel sharded) weights, so
        # column-wise sharding of wq/wk/wv needs no change here.
        xq = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        xq = apply_rotary_emb(xq, freqs_cis)
        xk = apply_rotary_emb(xk, freqs_cis)
        n_rep = xq.shape[2] // xk.shape[2]
        if n_rep > 1:
            xk = xk.repeat_interleave(n_rep, dim=2)
            xv = xv.repeat_interleave(n_rep, dim=2)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP to ``x``."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: attention then feed-forward, each with a residual."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        """Run one block over hidden states ``x`` ``[B, T, D]``."""
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Llama-style decoder: tokens ``[B, T]`` to logits ``[B, T, V]``.

    Pipeline splitting may delete entries of ``layers`` and set ``tok_embeddings``,
    ``norm`` or ``output`` to ``None``; the forward then takes or returns hidden
    states instead.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # A ModuleDict keyed by the original index keeps checkpoint names stable
        # when a pipeline stage deletes the layers it does not own.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # Non-persistent: derived from the config, so it stays out of checkpoints.
        self.register_buffer("freqs_cis", self._freqs_cis(device=None), persistent=False)
        # Activation checkpointing (model.activation_checkpointing): "full" keeps each
        # block's input and recomputes its forward in backward, "selective" keeps the
        # matmul and attention outputs and recomputes the rest (True means "full").
        self.checkpoint_blocks: bool | str = False

    def _freqs_cis(self, *, device) -> torch.Tensor:
        return precompute_freqs_cis(
            head_dim=self.cfg.head_dim,
            max_seq_len=self.cfg.max_seq_len,
            theta=self.cfg.rope_theta,
            device=device,
            scaling=self.cfg.rope_scaling,
        )

    def init_weights(self, *, generator: torch.Generator | None = None) -> None:
        """(Re)initialise parameters and the rotary buffer in place.

        Linears and the embedding get N(0, 0.02); the residual output projections
        (``wo``, ``w2``) are scaled by ``1/sqrt(2 * n_layers)`` so the residual
        stream does not grow with depth; norms start at one. Also call this after
        ``to_empty()`` on a model built on the meta device.
        """
        std = 0.02
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            self.freqs_cis = self._freqs_cis(device=self.freqs_cis.device)
            for name, module in self.named_modules():
                if isinstance(module, RMSNorm):
                    module.reset_parameters()
                elif isinstance(module, (nn.Linear, nn.Embedding)):
                    is_residual_out = name.endswith(".wo") or name.endswith(".w2")
                    nn.init.normal_(
                        module.weight,
                        mean=0.0,
                        std=out_std if is_residual_out else std,
                        generator=generator,
                    )
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return logits ``[B, T, V]`` (or hidden states when stages were removed)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        seqlen = h.shape[1]
        if seqlen > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {seqlen} exceeds model max_seq_len {self.cfg.max_seq_len}"
            )
        freqs_cis = self.freqs_cis[:seqlen]
        mode = {True: "full", False: "none"}.get(self.checkpoint_blocks, self.checkpoint_blocks)
        mode = mode if torch.is_grad_enabled() else "none"
        for layer in self.layers.values():
            h = run_block(layer, h, freqs_cis, mode)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def build_model(cfg: ModelConfig, *, seed: int, device: str | torch.device = "cpu") -> Transformer:
    """Build a :class:`Transformer` initialised deterministically from ``seed``.

    The same seed gives bitwise-identical parameters on every worker. Weights are
    drawn on the CPU (so the stream does not depend on the accelerator) and then
    moved to ``device``. With ``device="meta"`` nothing is allocated or
    initialised; use ``to_empty()`` and :meth:`Transformer.init_weights` later.
    """
    device = torch.device(device)
    if device.type == "meta":
        with torch.device("meta"):
            return Transformer(cfg)
    model = Transformer(cfg)
    model.init_weights(generator=torch.Generator(device="cpu").manual_seed(seed))
    return model.to(device)
