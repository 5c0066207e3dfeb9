"""Autoregressive decoding on etrain's decoder: greedy, or nucleus (top-p) sampling.

Each step runs the whole sequence through ``model(tokens) -> logits`` (no KV cache: the
models this serves are small, and one code path keeps the logits exactly the model's)
and picks the next token from the last position's logits. Decoding stops at an EOS
token (kept in the output, as ``transformers`` keeps it), after ``max_new_tokens``, when
the sequence fills the model's context, or at the wall-time deadline.

Greedy takes ``argmax`` (the first of equal logits), as ``transformers``'
``generate(do_sample=False)`` does. Sampling divides the logits by the temperature,
keeps the smallest set of most likely tokens whose probability reaches ``top_p`` (the
most likely one always), and draws from them renormalised with a CPU generator seeded
by ``seed``: the same seed gives the same tokens on any device.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

STOP_EOS, STOP_LENGTH, STOP_CONTEXT, STOP_TIME = "eos", "max_new_tokens", "max_seq_len", "time"


@dataclass(frozen=True)
class Decoding:
    """How to pick tokens and when to stop."""

    max_new_tokens: int
    greedy: bool = True
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    eos_ids: frozenset[int] = frozenset()
    deadline: float | None = None  # time.monotonic() after which no token is added


@dataclass(frozen=True)
class Generated:
    """The new tokens and why decoding stopped."""

    tokens: list[int]
    stop_reason: str
    seconds: float


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` (1-D) with every token outside the nucleus set to zero: the smallest set of
    most likely tokens whose probability sums to at least ``top_p``."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    before = sorted_p.cumsum(0) - sorted_p  # the probability of the tokens ranked above
    keep = before < top_p
    keep[0] = True
    kept = torch.zeros_like(probs)
    kept[order[keep]] = sorted_p[keep]
    return kept


def next_token(logits: torch.Tensor, d: Decoding, generator: torch.Generator | None) -> int:
    """The token after ``logits`` (the last position's, 1-D)."""
    if d.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.detach().float().cpu() / d.temperature, dim=-1)
    probs = top_p_filter(probs, d.top_p)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def _max_len(model: nn.Module) -> int | None:
    cfg = getattr(model, "cfg", None)
    return getattr(cfg, "max_seq_len", None)


@torch.no_grad()
def generate(model: nn.Module, prompt: Iterable[int], d: Decoding) -> Generated:
    """Continue ``prompt`` (token ids) with ``model`` (in eval mode) as ``d`` says."""
    t0 = time.perf_counter()
    ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt has no tokens; give some text to continue")
    limit = _max_len(model)
    if limit is not None and len(ids) >= limit:
        raise ValueError(
            f"the prompt has {len(ids)} tokens, the model's context holds {limit}: "
            "shorten the prompt"
        )
    device = next(model.parameters()).device
    generator = None if d.greedy else torch.Generator().manual_seed(d.seed)
    new: list[int] = []
    reason = STOP_LENGTH
    while len(new) < d.max_new_tokens:
        if d.deadline is not None and time.monotonic() >= d.deadline:
            reason = STOP_TIME
            break
        if limit is not None and len(ids) >= limit:
            reason = STOP_CONTEXT
            break
        logits = model(torch.tensor([ids], device=device))[0, -1]
        token = next_token(logits, d, generator)
        ids.append(token)
        new.append(token)
        if token in d.eos_ids:
            reason = STOP_EOS
            break
    return Generated(new, reason, time.perf_counter() - t0)
