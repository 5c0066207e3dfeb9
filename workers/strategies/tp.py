"""Tensor parallelism (Megatron-style) with ``parallelize_module`` over the mesh's ``tp`` dimension.

In every decoder block the attention and MLP input projections (wq, wk, wv,
w1, w3) are split column-wise, so each TP rank computes a slice of the heads
and of the hidden units; the output projections (wo, w2) are split row-wise
and all-reduce their partial sums, so a block's output is whole again on every
rank. Attention derives its local head count from the sharded weights, and
with grouped-query attention each rank holds ``n_heads / tp`` query heads and
``n_kv_heads / tp`` KV heads (contiguous ones), so the repeat factor stays
``n_heads / n_kv_heads`` and every query head meets its own KV head.

Embeddings, norms and the output head stay plain replicated tensors: every TP
rank computes them on the same whole activations, and the gradients flowing
into them are already all-reduced by the block's input redistribution. The
per-head q/k norms of Qwen3 and Gemma 3 see only this rank's heads, so they are
replicated DTensors whose gradients are summed over the TP ranks. Soft-capping,
the softmax scale and the sliding window act per head and need nothing.
With :data:`SEQUENCE_PARALLEL` the two norms of each block instead run on a
sequence shard (their weights become replicated DTensors): the row-wise
projections reduce-scatter instead of all-reducing, the attention and MLP
inputs are all-gathered, and the block output is all-gathered once more.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from workers.strategies import StrategyConfig, register_strategy
from workers.strategies.fsdp import decoder_blocks, shard_data_parallel

# Sequence parallelism for the block norms. It matches plain TP exactly, but
# with replicated embeddings and head each block all-gathers its output again,
# so it only saves the norms' activations (about 13% of them on gpt-small);
# off by default.
SEQUENCE_PARALLEL = False

_COLWISE = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
_ROWWISE = ("attention.wo", "feed_forward.w2")


def block_plan(
    *, sequence_parallel: bool, qk_norm: bool = False, sandwich_norm: bool = False
) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan for one decoder block's submodules.

    ``qk_norm`` (Qwen3, Gemma 3): the per-head q/k norms run on this rank's heads, so
    their weights become replicated DTensors over a head-sharded input (dim 2), whose
    gradients are summed over the TP ranks. ``sandwich_norm`` (Gemma): the
    post-attention / post-MLP norms run where the block's other norms do.
    """
    plan: dict[str, ParallelStyle] = {name: ColwiseParallel() for name in _COLWISE}
    plan.update({name: RowwiseParallel() for name in _ROWWISE})
    if qk_norm:
        heads = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan.update({"attention.q_norm": heads, "attention.k_norm": heads})
    if not sequence_parallel:
        return plan
    if sandwich_norm:
        plan.update(
            {"post_attention_norm": SequenceParallel(), "post_ffn_norm": SequenceParallel()}
        )
    seq = Shard(1)
    # Inside the block the residual stream is a sequence-sharded DTensor: the
    # row-wise projections reduce-scatter into it, the norms run on it, and the
    # attention/MLP inputs are all-gathered from it.
    plan.update(
        {name: RowwiseParallel(output_layouts=seq, use_local_output=False) for name in _ROWWISE}
    )
    plan.update(
        {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(
                input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)
            ),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),)
            ),
        }
    )
    return plan


def sequence_parallel_boundary() -> ParallelStyle:
    """The block's own input/output conversion under sequence parallelism.

    A block takes and returns whole plain hidden states, so the embeddings,
    final norm and head around it (and pipeline stage boundaries) stay as
    they are; the cost is one all-gather per block output.
    """
    return PrepareModuleInputOutput(
        input_layouts=(Replicate(), None),
        desired_input_layouts=(Shard(1), None),
        use_local_input=False,
        output_layouts=(Shard(1),),
        desired_output_layouts=(Replicate(),),
        use_local_output=True,
    )


def _check_divisible(block: nn.Module, tp: int) -> None:
    head_dim = getattr(getattr(block, "attention", None), "head_dim", 1)
    for name in _COLWISE + _ROWWISE:
        linear = block.get_submodule(name)
        width = linear.out_features if name in _COLWISE else linear.in_features
        unit = head_dim if name.startswith("attention.") else 1
        if width % (tp * unit):
            raise ValueError(
                f"parallelism.tp ({tp}) must split {name} ({width} features) into whole "
                f"heads of {unit}; use a tp that divides the model's head counts and FFN size"
            )


def apply_tensor_parallel(model: nn.Module, *, tp_mesh: DeviceMesh) -> nn.Module:
    """Split every decoder block of ``model`` over ``tp_mesh`` in place; returns ``model``.

    Works on a whole model or on one pipeline stage's part (only the blocks
    it holds). A one-rank ``tp_mesh`` leaves the model as it is.
    """
    if tp_mesh.size() == 1:
        return model
    for block in decoder_blocks(model):
        _check_divisible(block, tp_mesh.size())
        plan = block_plan(
            sequence_parallel=SEQUENCE_PARALLEL,
            qk_norm=getattr(block.attention, "q_norm", None) is not None,
            sandwich_norm=getattr(block, "post_ffn_norm", None) is not None,
        )
        parallelize_module(block, tp_mesh, plan)
        if SEQUENCE_PARALLEL:
            parallelize_module(block, tp_mesh, sequence_parallel_boundary())
    return model


@register_strategy("tp")
def apply_tp(model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """Tensor-parallel ``model`` over ``tp``; with more workers than ``tp``, also FSDP over ``dp``.

    The data-parallel part uses ``parallelism.fsdp`` (ZeRO stage 3 by default).
    """
    model = apply_tensor_parallel(model, tp_mesh=mesh["tp"])
    # Ordering constraint: apply TP before FSDP. FSDP shards the TP DTensors
    # again on dim 0 over dp ((dp, tp) placements); it cannot be undone to
    # split an FSDP-sharded parameter column- or row-wise afterwards.
    return shard_data_parallel(model, dp_mesh=mesh["dp"], cfg=cfg)
