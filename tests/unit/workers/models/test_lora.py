"""LoRA on etrain's decoder: peft's count, frozen base, seeded init, base checks, refusals."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.fakes import ADMIN_H
from workers.checkpoint.state import ModelAndOptimizer
from workers.models.config import get_model_config
from workers.models.llama import build_model
from workers.models.lora import (
    base_reference,
    check_base,
    init_lora,
    inject_lora,
    lora_config,
    trainable_count,
)
from workers.optim import build_optimizer
from workers.spec import JobSpec
from workers.spec.model import LORA_TARGETS, LoraSpec, ModelSpec

CFG = get_model_config("gpt-tiny")


def hf_twin() -> LlamaForCausalLM:
    """transformers' Llama with gpt-tiny's shapes."""
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=CFG.vocab_size,
            hidden_size=CFG.dim,
            intermediate_size=CFG.ffn_hidden,
            num_hidden_layers=CFG.n_layers,
            num_attention_heads=CFG.n_heads,
            num_key_value_heads=CFG.n_kv_heads,
            max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    )


@pytest.mark.parametrize(
    "targets", [["q_proj", "v_proj"], list(LORA_TARGETS), ["k_proj", "gate_proj", "down_proj"]]
)
def test_trainable_count_equals_peft(targets):
    spec = LoraSpec(rank=4, alpha=8, target_modules=targets)
    ours = inject_lora(build_model(CFG, seed=0), spec)
    theirs = get_peft_model(hf_twin(), lora_config(spec, hf_names=True))
    trainable, total = theirs.get_nb_trainable_parameters()
    assert trainable_count([ours]) == trainable
    assert sum(p.numel() for p in ours.parameters()) == total


def test_base_frozen_and_out_of_the_optimizer():
    model = inject_lora(build_model(CFG, seed=0), LoraSpec(rank=2))
    opt = build_optimizer(model, train=JobSpec(name="x").train)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        lora = ".lora_A." in name or ".lora_B." in name
        assert p.requires_grad == lora, name
        assert (id(p) in in_opt) == lora, name


def test_checkpoint_state_holds_only_adapters():
    model = inject_lora(build_model(CFG, seed=0), LoraSpec(rank=2))
    opt = build_optimizer(model, train=JobSpec(name="x").train)
    model(torch.randint(0, CFG.vocab_size, (1, 8))).sum().backward()
    opt.step()
    state = ModelAndOptimizer([model], [opt]).state_dict()
    assert state["model"] and all(".lora_" in k for k in state["model"])
    assert state["optim"] and all(".lora_" in k for k in state["optim"] if "state." in k)


def test_init_is_seeded_by_name_and_layout_free():
    a = inject_lora(build_model(CFG, seed=0), LoraSpec(rank=4))
    b = inject_lora(build_model(CFG, seed=0), LoraSpec(rank=4))
    torch.manual_seed(123)  # peft's own init used the global RNG: ours does not
    assert init_lora([a], seed=7) == init_lora([b], seed=7) == 4 * CFG.n_layers * 2
    sa, sb = dict(a.named_parameters()), dict(b.named_parameters())
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    a_q = sa["layers.0.attention.wq.lora_A.default.weight"]
    assert not torch.equal(a_q, sa["layers.1.attention.wq.lora_A.default.weight"])
    assert torch.count_nonzero(sa["layers.0.attention.wq.lora_B.default.weight"]) == 0
    # The model's output is unchanged at start: B = 0.
    tokens = torch.randint(0, CFG.vocab_size, (1, 8))
    assert torch.equal(a(tokens), build_model(CFG, seed=0)(tokens))


def test_base_reference_mismatch_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    ref = base_reference(ModelSpec(hf=str(tmp_path)), seed=1)
    assert ref["fingerprint"]["weights"] == {"model.safetensors": 10}
    check_base(ref, ref)
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)
    with pytest.raises(ValueError, match=r"model\.lora"):
        check_base(ref, base_reference(ModelSpec(hf=str(tmp_path)), seed=1))
    with pytest.raises(ValueError, match=r"train\.seed"):
        check_base({"preset": "gpt-tiny", "seed": 1}, {"preset": "gpt-tiny", "seed": 2})


SUBMIT = {"name": "lora", "model": {"preset": "gpt-tiny", "lora": {"rank": 4}}}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"parallelism": {"strategy": "tp", "tp": 2}, "resources": {"workers": 2}}, "tp"),
        (
            {"parallelism": {"strategy": "hybrid", "tp": 2}, "resources": {"workers": 4}},
            "tensor parallelism",
        ),
        ({"model": {"lora": {"quantize": "4bit"}}}, "GPU-only"),
        (
            {"model": {"lora": {"quantize": "4bit"}}, "resources": {"gpus_per_worker": 1}},
            "needs bitsandbytes on the workers",
        ),
    ],
)
def test_refused_lora_layouts_are_422(client, extra, needle):
    body = {**SUBMIT, **extra}
    body["model"] = {
        "preset": "gpt-tiny",
        "lora": {"rank": 4, **extra.get("model", {}).get("lora", {})},
    }
    r = client.post("/v1/jobs", json=body, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    msgs = " ".join(d["msg"] for d in r.json()["detail"])
    assert "model.lora" in msgs and needle in msgs, msgs


def test_lora_on_fsdp_and_pp_is_accepted():
    for par, workers in (({"strategy": "fsdp"}, 2), ({"strategy": "pp", "pp": 2}, 2)):
        JobSpec.model_validate({**SUBMIT, "parallelism": par, "resources": {"workers": workers}})


def _bf16_lora_run(*, monkeypatch, hold: bool):
    from workers import build, train_loop

    if not hold:
        monkeypatch.setattr(build, "hold_frozen_linears_in", lambda model, dtype: 0)
    spec = JobSpec.model_validate(
        {
            "name": "bf16-lora",
            "model": {"preset": "gpt-tiny", "lora": {"rank": 4}},
            "data": {"seq_len": 16, "num_samples": 16},
            "train": {
                "steps": 3,
                "global_batch_size": 2,
                "micro_batch_size": 1,
                "precision": "bf16",
            },
        }
    )
    env = train_loop.RunEnv(rank=0, world_size=1, device=torch.device("cpu"))
    return train_loop.run(spec, env)


def test_bf16_lora_holds_the_frozen_linears_in_bf16_with_the_same_losses(monkeypatch):
    """Autocast computed those matmuls in bf16 already: the losses stay bit for bit."""
    held = _bf16_lora_run(monkeypatch=monkeypatch, hold=True)
    dtypes = {n: p.dtype for n, p in held.model.named_parameters()}
    assert dtypes["layers.0.attention.wq.base_layer.weight"] == torch.bfloat16
    assert dtypes["layers.0.feed_forward.w1.weight"] == torch.bfloat16  # not adapted, frozen
    assert dtypes["output.weight"] == torch.bfloat16
    assert dtypes["tok_embeddings.weight"] == dtypes["norm.weight"] == torch.float32
    assert dtypes["layers.0.attention.wq.lora_A.default.weight"] == torch.float32
    plain = _bf16_lora_run(monkeypatch=monkeypatch, hold=False)
    assert plain.model.get_parameter("output.weight").dtype == torch.float32
    assert held.losses == plain.losses
