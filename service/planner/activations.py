"""Activation bytes per rank: what autograd keeps for backward, tensor by tensor. Pure Python.

The Llama block of ``workers.models.llama`` with flash (memory-efficient)
attention, so there is no sequence-squared term, under each
``model.activation_checkpointing`` mode:

* none: every block keeps what autograd saves (``layer_activation_bytes_per_token``).
* full: every block keeps its fp32 input; in backward one block at a time runs
  again and holds its whole activations.
* selective: every block keeps its input and the outputs of its matmuls,
  attention and tensor-parallel all-reduces (``selective_layer_bytes_per_token``);
  in backward one block at a time recomputes its element-wise parts.

With LoRA (``Workload.lora``) the base projections are frozen, so a projection
without an adapter keeps no copy of its input (autograd saves a matmul input
only for its weight's gradient), the norms keep no normalised output (their
scale is frozen), and each adapter keeps its input and its rank-r middle.

The peak of a checkpointed rank is either the end of the forward (kept +
the head's activations) or the first recompute in backward (kept + one
block), whichever is larger: the head's activations are freed by then
(under GPipe those of the other micro-batches are still held).
Measured against ``workers.telemetry.memory`` in tests/integration/test_activation_memory.py.
"""

from __future__ import annotations

from service.planner.workload import (
    FP32,
    INT64,
    Layout,
    LoraShape,
    Workload,
    linear_shapes,
    rank_part,
)
from workers.models.config import ModelConfig


def _widths(cfg: ModelConfig) -> tuple[int, int, int, int, int, int]:
    kv = cfg.n_kv_heads * cfg.head_dim
    q = cfg.n_heads * cfg.head_dim
    kv_attn = q if cfg.n_heads > cfg.n_kv_heads else kv  # GQA repeats K and V to all heads
    return cfg.dim, q, cfg.ffn_hidden, cfg.n_heads, kv, kv_attn


def layer_activation_bytes_per_token(
    cfg: ModelConfig, *, tp: int, precision: str, lora: LoraShape | None = None
) -> int:
    """Bytes one decoder block saves for backward per token (Korthikanti-style, this block).

    Norms run in fp32 and stay whole under TP (no sequence parallelism); under
    bf16 autocast every projection that keeps its input keeps its own bf16 copy.
    """
    h, q, f, a, _, kv_attn = _widths(cfg)
    bf16 = precision == "bf16"
    e = 2 if bf16 else FP32
    # Rotary embedding saves only its cos/sin table (a buffer, counted once per stage).
    attention = e * (2 * q + 2 * kv_attn) + FP32 * a  # q, k, v, output (= wo input), logsumexp
    if lora is None:
        norm = FP32 * h + FP32 + FP32 * h  # input, 1/rms, normalised (fp32)
        attn_in = 3 * 2 * h if bf16 else FP32 * h  # wq, wk, wv inputs
        ffn_in = 2 * 2 * h if bf16 else FP32 * h  # w1, w3 inputs
        ffn = 4 * e * f  # w1 out, silu out, w3 out, product (= w2 input)
        return 2 * norm + attn_in + ffn_in + (attention + ffn) // tp
    norm = FP32 * h + FP32  # input, 1/rms: the frozen scale needs no normalised output

    def inputs(names: tuple[str, ...]) -> int:
        n = sum(lora.adapted(name) for name in names)
        return 2 * h * n if bf16 else (FP32 * h if n else 0)

    ffn = 3 * e * f + (e * f if lora.adapted("down_proj") else 0)
    middles = e * lora.rank * len(lora.targets)  # each adapter's A output, B's input
    return (
        2 * norm
        + inputs(("q_proj", "k_proj", "v_proj"))
        + inputs(("gate_proj", "up_proj"))
        + (attention + ffn) // tp
        + middles
    )


def selective_layer_bytes_per_token(
    cfg: ModelConfig, *, tp: int, precision: str, lora: LoraShape | None = None
) -> int:
    """Bytes one block keeps per token under selective recompute (``workers.models.recompute``).

    Its fp32 input, every matmul output (wq, wk, wv, wo, w1, w3, w2), attention's
    output and logsumexp, and under TP the all-reduced outputs of wo and w2.
    With LoRA each adapter's two matmul outputs too (r and the projection's width).
    """
    h, q, f, a, kv, _ = _widths(cfg)
    e = 2 if precision == "bf16" else FP32
    sharded = e * (q + 2 * kv) + e * q + FP32 * a + 2 * e * f
    whole = 2 * e * h + (2 * e * h if tp > 1 else 0)
    out = FP32 * h + sharded // tp + whole
    if lora is not None:
        for name, (_, width) in linear_shapes(cfg).items():
            out += e * (lora.rank + width) if lora.adapted(name) else 0
    return out


def root_activation_bytes_per_token(cfg: ModelConfig, first: bool, last: bool, work) -> int:
    """Embedding indices (first stage); final norm, head input and log-probs (last stage)."""
    out = INT64 if first else 0  # embedding indices
    if last:
        head_in = 2 * cfg.dim if work.precision == "bf16" else FP32 * cfg.dim
        norm = 2 * FP32 * cfg.dim + FP32 if work.lora is None else FP32 * cfg.dim + FP32
        out += norm + (head_in if work.lora is None else 0) + FP32 * cfg.vocab_size + INT64
    return out


def in_flight(layout: Layout, pp_rank: int) -> float:
    """Micro-batches whose activations one pp rank holds at its peak (in whole-part units).

    GPipe holds all of them; 1F1B at most pp - rank; interleaved 1F1B holds
    (v - 1) * pp + 2 * (pp - 1 - rank) + 1 chunk-micro-batches of 1/v of the
    part each (torch's warm-up), capped by all of them.
    """
    m, pp = layout.microbatches, layout.pp
    if pp == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    if layout.schedule == "1f1b":
        return float(min(m, pp - pp_rank))
    v = layout.stages_per_rank
    return min(v * m, (v - 1) * pp + 2 * (pp - 1 - pp_rank) + 1) / v


def logits_in_flight(layout: Layout) -> int:
    """Micro-batches whose head activations (and logits) the last stage holds at once.

    GPipe runs every forward before any backward; 1F1B and interleaved 1F1B run the
    last stage's backward of a micro-batch right after its forward; without a
    pipeline there is one micro-batch at a time.
    """
    return layout.microbatches if layout.pp > 1 and layout.schedule == "gpipe" else 1


def activation_bytes(
    work: Workload, layout: Layout, *, pp_rank: int = 0, checkpointed: bool | str | None = None
) -> int:
    """Activations one rank holds at its peak under ``checkpointed`` (none|full|selective;
    True means full; None: the workload's own ``activation_checkpointing``).

    On a pipeline rank a stage's output stays in the schedule's cache until its
    backward (one per micro-batch in flight), while its input lies in the schedule's
    receive buffer, which ``buffer_bytes`` counts as ``pipeline_p2p``.
    """
    cfg = work.cfg
    mode = work.recompute if checkpointed is None else checkpointed
    mode = {True: "full", False: "none"}.get(mode, mode)  # type: ignore[arg-type]
    part = rank_part(cfg, layout, pp_rank)
    tokens = work.micro_batch_size * work.seq_len
    kw = {"tp": layout.tp, "precision": work.precision, "lora": work.lora}
    layer = layer_activation_bytes_per_token(cfg, **kw)
    flight = in_flight(layout, pp_rank)
    heads = logits_in_flight(layout)
    root = root_activation_bytes_per_token(cfg, part.first, part.last, work) * tokens
    edges = FP32 * cfg.dim * tokens * flight * (int(not part.last) - int(not part.first))
    if mode == "none":
        return int(part.layers * layer * tokens * flight + root * heads + edges)
    if mode == "full":
        # The recompute makes again all a block keeps but its input, which it kept.
        kept, again = FP32 * cfg.dim, layer - FP32 * cfg.dim
    else:
        kept = selective_layer_bytes_per_token(cfg, **kw)
        again = max(0, layer - kept) + 2 * FP32 * cfg.dim
    # The peak: the end of the forwards, or the first recompute in backward, when the
    # first micro-batch's head activations are freed and the others' are still held.
    peak = max(again * tokens + root * (heads - 1), root * heads)
    return int(part.layers * kept * tokens * flight + edges + peak)
