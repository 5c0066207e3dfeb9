"""A Llama-style decoder-only transformer in plain PyTorch.

The model holds no parallelism code: data, tensor and pipeline parallelism are
applied from outside by ``workers.strategies`` (torchtitan style). To make that
possible the module names follow torchtitan exactly (``tok_embeddings``,
``layers["<i>"]``, ``attention.wq`` ...), attention derives its local head count
from the weight shapes at forward time, and the top-level modules may be set to
``None`` by pipeline splitting. The block and what other families change in it
live in :mod:`workers.models.layers`, the rotary tables in :mod:`workers.models.rope`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from workers.models.config import ModelConfig
from workers.models.layers import Attention, FeedForward, RMSNorm, TransformerBlock, document_mask
from workers.models.recompute import run_block
from workers.models.rope import apply_rotary_emb, precompute_freqs_cis

__all__ = [
    "Attention",
    "FeedForward",
    "RMSNorm",
    "Transformer",
    "TransformerBlock",
    "apply_rotary_emb",
    "build_model",
    "precompute_freqs_cis",
]


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
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, eps=cfg.norm_eps, offset=cfg.norm_offset)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # Non-persistent: derived from the config, so they stay out of checkpoints.
        self.register_buffer("freqs_cis", self._freqs_cis(device=None), persistent=False)
        if cfg.local_rope_theta is not None:  # Gemma 3's sliding layers
            local = self._freqs_cis(device=None, local=True)
            self.register_buffer("freqs_cis_local", local, persistent=False)
        # Activation checkpointing (model.activation_checkpointing): "full" keeps each
        # block's input and recomputes its forward in backward, "selective" keeps the
        # matmul and attention outputs and recomputes the rest (True means "full").
        self.checkpoint_blocks: bool | str = False

    def _freqs_cis(self, *, device, local: bool = False, seq_len: int = 0) -> torch.Tensor:
        cfg = self.cfg
        return precompute_freqs_cis(
            head_dim=cfg.head_dim,
            max_seq_len=max(cfg.max_seq_len, seq_len),
            theta=cfg.local_rope_theta if local else cfg.rope_theta,
            device=device,
            scaling=cfg.local_rope_scaling if local else cfg.rope_scaling,
            seq_len=seq_len,
        )

    def reset_rope(self) -> None:
        """Recompute the rotary tables in place (after ``to_empty()``)."""
        self.freqs_cis = self._freqs_cis(device=self.freqs_cis.device)
        if self.cfg.local_rope_theta is not None:
            self.freqs_cis_local = self._freqs_cis(device=self.freqs_cis.device, local=True)

    def _rope(self, seqlen: int, local: bool) -> torch.Tensor:
        """The table a layer rotates with for a sequence of ``seqlen``: the buffer, or
        for a length-dependent scaling past its original context one made for ``seqlen``."""
        scaling = self.cfg.local_rope_scaling if local else self.cfg.rope_scaling
        buffer = self.freqs_cis_local if local else self.freqs_cis
        long = scaling is not None and scaling.length_dependent
        if long and seqlen > scaling.original_max_position_embeddings:
            return self._freqs_cis(device=buffer.device, local=local, seq_len=seqlen)[:seqlen]
        return buffer[:seqlen]

    def init_weights(self, *, generator: torch.Generator | None = None) -> None:
        """(Re)initialise parameters and the rotary buffer in place.

        Linears and the embedding get N(0, 0.02); the residual output projections
        (``wo``, ``w2``) are scaled by ``1/sqrt(2 * n_layers)`` so the residual
        stream does not grow with depth; norms start at a scale of one. Also call this after
        ``to_empty()`` on a model built on the meta device.
        """
        std = 0.02
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        with torch.no_grad():
            self.reset_rope()
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

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Return logits ``[B, T, V]`` (or hidden states when stages were removed).
        ``positions`` ``[B, T]``: packed rows' positions, restarting at 0 with each document
        (RoPE per position, attention within each document); None: 0..T-1."""
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.cfg.embed_scale:  # Gemma: sqrt(dim), in the activations' dtype
                h = h * torch.tensor(self.cfg.dim**0.5, dtype=h.dtype)
        seqlen = h.shape[1]
        if seqlen > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {seqlen} exceeds model max_seq_len {self.cfg.max_seq_len}"
            )
        tables = {False: self._rope(seqlen, local=False)}
        if self.cfg.local_rope_theta is not None:
            tables[True] = self._rope(seqlen, local=True)
        if positions is not None:  # packed rows: each row's positions and documents
            docs = document_mask(positions)
            tables = {local: (table[positions], docs) for local, table in tables.items()}
        mode = {True: "full", False: "none"}.get(self.checkpoint_blocks, self.checkpoint_blocks)
        mode = mode if torch.is_grad_enabled() else "none"
        for layer in self.layers.values():
            h = run_block(layer, h, tables[layer.uses_local_rope], mode)
        h = self.norm(h) if self.norm is not None else h
        if self.output is None:
            return h
        logits = self.output(h)
        cap = self.cfg.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


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
