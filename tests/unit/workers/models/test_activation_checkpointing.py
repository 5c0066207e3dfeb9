"""Activation checkpointing (model.activation_checkpointing: full, selective): the same
numbers, fewer saved tensors, and as many saved as the planner counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from service.planner import plan_job
from workers.models.config import RopeScaling, get_model_config
from workers.models.llama import build_model
from workers.spec import parse_spec

CFG = get_model_config("gpt-tiny")
BATCH, SEQ = 2, 32
# Everything the families add to the block (docs/model-families.md): a Gemma 3-like block
# with Gemma 2's soft-capping, a sliding layer with its own RoPE base, and yarn RoPE.
FAMILY_CFG = dataclasses.replace(
    CFG,
    explicit_head_dim=32,
    qk_norm=True,
    norm_offset=1.0,
    embed_scale=True,
    activation="gelu_tanh",
    sandwich_norm=True,
    attn_scale=0.2,
    attn_softcap=1.5,
    final_softcap=2.0,
    layer_types=("sliding", "full"),
    sliding_window=6,
    local_rope_theta=500.0,
    rope_scaling=RopeScaling(factor=4.0, original_max_position_embeddings=16, rope_type="yarn"),
)


def _loss_and_saved(checkpointed: bool | str, cfg=CFG) -> tuple[torch.Tensor, dict, int]:
    """Loss, parameter gradients and the bytes autograd saved during the forward."""
    model = build_model(cfg, seed=0)
    model.checkpoint_blocks = checkpointed
    tokens = torch.randint(
        0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1)
    )
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        # Count each storage once (a view saved twice is one tensor in memory).
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1)
        )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, sum(saved.values())


@pytest.mark.parametrize("cfg", [CFG, FAMILY_CFG], ids=["llama", "family-features"])
@pytest.mark.parametrize("mode", [True, "full", "selective"])
def test_checkpointing_changes_no_number(mode, cfg):
    loss, grads, _ = _loss_and_saved(False, cfg)
    loss_ckpt, grads_ckpt, _ = _loss_and_saved(mode, cfg)
    assert torch.equal(loss, loss_ckpt)
    assert grads.keys() == grads_ckpt.keys()
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=0, atol=0, msg=name)


def test_checkpointing_keeps_no_block_activation_through_the_forward():
    """A forward with checkpointing holds what the root (embedding, final norm, head, loss)
    saves and the blocks' inputs, not the blocks' activations."""
    _, _, saved_all = _loss_and_saved(False)
    _, _, saved_ckpt = _loss_and_saved(True)
    assert saved_ckpt < saved_all / 3, (saved_ckpt, saved_all)


def test_the_spec_field_reaches_the_planner():
    def activations(mode: str) -> int:
        spec = parse_spec(
            {
                "name": "ac",
                "model": {"preset": "llama-7b", "activation_checkpointing": mode},
                "data": {"seq_len": 4096},
                "resources": {"workers": 8, "gpus_per_worker": 1},
                "parallelism": {"strategy": "fsdp"},
                "train": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16"},
            }
        )
        return plan_job(
            spec, cluster={"gpu": "h100", "gpus_per_node": 8}
        ).per_rank.activations_bytes

    assert activations("full") < activations("none") / 5
