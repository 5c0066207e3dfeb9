"""The decoder block of :mod:`workers.models.llama` and the parts every family varies.

One block serves every supported family; :class:`~workers.models.config.ModelConfig`
says what a family changes (docs/model-families.md): q/k norms per head (Qwen3,
Gemma 3), norms scaling by ``1 + w`` and post-attention / post-MLP norms (Gemma),
the gelu (tanh) gate (Gemma), the softmax scale and tanh soft-capping of attention
scores (Gemma 2), and a causal sliding window on the layers ``layer_types`` marks.
A block keeps its own attention type (``attention.sliding_window``,
``uses_local_rope``), so it travels with the layer when a pipeline splits the model.
Module names follow torchtitan (``attention.wq`` ...), which the strategies rely on.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from workers.models.config import ModelConfig
from workers.models.rope import apply_rotary_emb

_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale; normalises in fp32 for stability.

    With ``offset`` 1 (Gemma) the scale is ``1 + weight`` and the weight starts at zero.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of ``x`` and scale it."""
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        scale = self.weight.float() + self.offset if self.offset else self.weight.float()
        return (normed * scale).type_as(x)

    def reset_parameters(self) -> None:
        """Set the scale back to one."""
        nn.init.constant_(self.weight, 1.0 - self.offset)


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """``[B, 1, T, T]`` booleans for packed rows: query ``q`` may attend to key ``k`` when
    ``k <= q`` and both are in the same document (a document starts where its position,
    ``positions`` ``[B, T]``, is 0)."""
    docs = torch.cumsum((positions == 0).to(torch.int32), dim=1)
    same = docs[:, :, None] == docs[:, None, :]
    t = positions.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]


def attend(
    q,
    k,
    v,
    *,
    scale: float | None,
    softcap: float | None,
    window: int | None,
    docs: torch.Tensor | None = None,
):
    """Causal attention of ``q``/``k``/``v`` ``[B, H, T, D]``, optionally within a window of
    ``window`` positions (key > query - window), within the documents of packed rows
    (``docs``: :func:`document_mask`) and with scores soft-capped at ``softcap``."""
    if softcap is None and window is None and docs is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    pos = torch.arange(q.shape[2], device=q.device)
    allowed = pos[None, :] <= pos[:, None]
    if window is not None:
        allowed &= pos[None, :] > pos[:, None] - window
    if docs is not None:
        allowed = allowed & docs
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (scale or q.shape[-1] ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary position embeddings."""

    def __init__(self, cfg: ModelConfig, *, sliding: bool = False) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        kv_dim = cfg.n_kv_heads * cfg.head_dim
        # Qwen2-style q/k/v biases (cfg.qkv_bias) shard with their weights under TP.
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, kv_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        norm = functools.partial(RMSNorm, cfg.head_dim, eps=cfg.norm_eps, offset=cfg.norm_offset)
        self.q_norm = norm() if cfg.qk_norm else None
        self.k_norm = norm() if cfg.qk_norm else None
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_softcap
        self.sliding_window = cfg.sliding_window if sliding else None

    def forward(self, x: torch.Tensor, freqs_cis) -> torch.Tensor:
        """Attend over ``x`` ``[B, T, D]`` causally; ``freqs_cis`` is the RoPE table, or for
        packed rows ``(each row's table [B, T, D/2, 2], document_mask)``."""
        docs = None
        if isinstance(freqs_cis, tuple):  # one argument, so TP's input plan is unchanged
            freqs_cis, docs = freqs_cis
        bsz, seqlen, _ = x.shape
        # Head counts come from the (possibly tensor-parallel sharded) weights, so
        # column-wise sharding of wq/wk/wv needs no change here.
        xq = self.wq(x).view(bsz, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq = apply_rotary_emb(xq, freqs_cis)
        xk = apply_rotary_emb(xk, freqs_cis)
        n_rep = xq.shape[2] // xk.shape[2]
        if n_rep > 1:
            xk = xk.repeat_interleave(n_rep, dim=2)
            xv = xv.repeat_interleave(n_rep, dim=2)
        out = attend(
            xq.transpose(1, 2),
            xk.transpose(1, 2),
            xv.transpose(1, 2),
            scale=self.scale,
            softcap=self.softcap,
            window=self.sliding_window,
            docs=docs,
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    """Gated MLP: ``w2(act(w1 x) * w3 x)``, SwiGLU (silu) or GeGLU (gelu, tanh)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.act = _ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP to ``x``."""
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: attention then feed-forward, each with a residual.

    With ``cfg.sandwich_norm`` (Gemma 2/3) each branch's output is normed again
    (``post_attention_norm``, ``post_ffn_norm``) before it joins the residual.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        sliding = cfg.layer_type(layer) == "sliding"
        norm = functools.partial(RMSNorm, cfg.dim, eps=cfg.norm_eps, offset=cfg.norm_offset)
        self.attention_norm = norm()
        self.attention = Attention(cfg, sliding=sliding)
        self.ffn_norm = norm()
        self.feed_forward = FeedForward(cfg)
        self.post_attention_norm = norm() if cfg.sandwich_norm else None
        self.post_ffn_norm = norm() if cfg.sandwich_norm else None
        # Gemma 3's sliding layers rotate with their own RoPE table.
        self.uses_local_rope = sliding and cfg.local_rope_theta is not None

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        """Run one block over hidden states ``x`` ``[B, T, D]``."""
        out = self.attention(self.attention_norm(x), freqs_cis)
        if self.post_attention_norm is not None:
            out = self.post_attention_norm(out)
        h = x + out
        out = self.feed_forward(self.ffn_norm(h))
        if self.post_ffn_norm is not None:
            out = self.post_ffn_norm(out)
        return h + out
