"""The planner with LoRA, selective recompute and a pretrained model's own shape."""

from __future__ import annotations

import dataclasses

import peft
import pytest
import transformers

from service.planner import plan_job
from service.planner.memory_model import (
    FP32,
    Layout,
    LoraShape,
    Workload,
    activation_bytes,
    state_bytes,
)
from service.planner.planning import workload_of
from service.planner.workload import adapter_numel
from tests.support.specs import spec
from workers.models.config import ModelConfig, count_params, get_model_config
from workers.spec import parse_spec

SEVEN_B = get_model_config("llama-7b")
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _work(**kw) -> Workload:
    base = {
        "cfg": SEVEN_B,
        "seq_len": 2048,
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "precision": "bf16",
        "on_gpu": True,
    }
    return Workload(**{**base, **kw})


def test_adapters_count_r_times_in_plus_out_like_peft():
    """peft's trainable count for the same config on a tiny transformers Llama."""
    cfg = ModelConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=48, max_seq_len=64
    )
    hf = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
        )
    )
    for targets in (("q_proj", "v_proj"), ALL):
        model = peft.get_peft_model(
            hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(targets))
        )
        trainable, _ = model.get_nb_trainable_parameters()
        assert cfg.n_layers * adapter_numel(cfg, LoraShape(4, targets)) == trainable
        hf = model.unload()


def test_lora_keeps_no_gradient_or_optimizer_state_for_the_base():
    lora = LoraShape(16, ALL)
    full = state_bytes(_work(precision="fp32"), Layout("ddp", dp=1))
    adapted = state_bytes(_work(precision="fp32", lora=lora), Layout("ddp", dp=1))
    trained = SEVEN_B.n_layers * adapter_numel(SEVEN_B, lora)
    assert adapted.grads == FP32 * trained
    assert adapted.optimizer == 2 * FP32 * trained
    assert adapted.params == full.params + FP32 * trained
    # Under bf16 the frozen projections and head are held in bf16: 2 bytes each.
    half = state_bytes(_work(lora=lora), Layout("ddp", dp=1))
    linear = count_params(SEVEN_B) - SEVEN_B.vocab_size * SEVEN_B.dim
    linear -= (2 * SEVEN_B.n_layers + 1) * SEVEN_B.dim
    assert half.params == adapted.params - 2 * linear
    # ZeRO-3 shards the adapters with the rest.
    sharded = state_bytes(_work(precision="fp32", lora=lora), Layout("fsdp", dp=8))
    assert sharded.grads == pytest.approx(adapted.grads / 8, abs=8)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_selective_recompute_lies_between_full_and_none(precision):
    work = _work(precision=precision)
    lay = Layout("fsdp", dp=8)
    none, full, sel = (
        activation_bytes(work, lay, checkpointed=m) for m in ("none", "full", "selective")
    )
    assert full < sel < none
    assert (
        activation_bytes(dataclasses.replace(work, activation_checkpointing="selective"), lay)
        == sel
    )


def test_lora_saves_fewer_activations_than_full_fine_tuning():
    lay = Layout("ddp", dp=1)
    full = activation_bytes(_work(), lay)
    few = activation_bytes(_work(lora=LoraShape(8, ("q_proj", "v_proj"))), lay)
    every = activation_bytes(_work(lora=LoraShape(8, ALL)), lay)
    assert few < every < full


def test_the_plan_uses_the_pretrained_models_own_shape():
    job = parse_spec(
        spec(
            model={"activation_checkpointing": "selective", "lora": {"rank": 4}},
            data={"seq_len": 64},
            resources={"workers": 1},
            train={"global_batch_size": 2, "micro_batch_size": 1},
        )
    )
    mine = ModelConfig(
        vocab_size=1000, dim=128, n_layers=3, n_heads=4, n_kv_heads=4, ffn_hidden=256,
        max_seq_len=512, qkv_bias=True,
    )  # fmt: skip
    work = workload_of(job, mine)
    assert work.cfg == mine and work.recompute == "selective" and work.lora.rank == 4
    plan = plan_job(job, model_config=mine)
    assert plan.num_params == count_params(mine)
    assert plan.breakdown.activation_checkpointing == "selective"
    assert plan.breakdown.lora_trainable_params == 3 * adapter_numel(mine, work.lora)
    assert plan.per_rank.grads_bytes == FP32 * plan.breakdown.lora_trainable_params
