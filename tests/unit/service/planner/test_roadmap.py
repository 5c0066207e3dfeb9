"""The roadmap's questions, answered by the planner (what POST /v1/plan and `etrain plan`
run), and docs/planner.md states the same verdicts and numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.planner import plan_job
from workers.spec import parse_spec

DOC = Path(__file__).parents[4] / "docs" / "planner.md"
GIB = 1 << 30
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"rank": 16, "alpha": 32, "target_modules": ALL}
ONE_24GB = {"gpu": "rtx4090", "gpus_per_node": 1, "nodes": 1}
NODE_24GB = {"gpu": "rtx4090", "gpus_per_node": 8, "nodes": 1, "host_memory_gb": 512}
NODE_H100 = {"gpu": "h100", "gpus_per_node": 8, "nodes": 1}


def _spec(preset, workers, par, *, ac, lora=None) -> dict:
    return {
        "name": "roadmap",
        "model": {"preset": preset, "activation_checkpointing": ac, "lora": lora},
        "data": {"seq_len": 2048},
        "resources": {"workers": workers, "gpus_per_worker": 1},
        "parallelism": par,
        "train": {"global_batch_size": 8 * workers, "micro_batch_size": 1, "precision": "bf16"},
    }


def _fsdp(stage: int, offload: bool = False) -> dict:
    return {"strategy": "fsdp", "fsdp": {"zero_stage": stage, "cpu_offload": offload}}


def _deepspeed(stage: int, offload: bool | str = False) -> dict:
    """DeepSpeed ZeRO at ``stage``; ``offload``: the optimizer state, and at stage 3 the
    parameters too, in host memory (ZeRO-Infinity on the CPU), or "nvme" on NVMe."""
    ds: dict = {"zero_stage": stage}
    if offload:
        device = "nvme" if offload == "nvme" else "cpu"
        ds["offload_optimizer"] = device
        ds["offload_param"] = device if stage == 3 else "none"
    return {"strategy": "deepspeed", "deepspeed": ds}


# Row name in docs/planner.md -> (spec, cluster).
SCENARIOS = {
    "7B LoRA, 1x24GB, no recompute": (
        _spec("llama-7b", 1, {"strategy": "ddp"}, ac="none", lora=LORA),
        ONE_24GB,
    ),
    "7B LoRA, 1x24GB, full recompute": (
        _spec("llama-7b", 1, {"strategy": "ddp"}, ac="full", lora=LORA),
        ONE_24GB,
    ),
    "70B LoRA, 1x24GB, full recompute": (
        _spec("llama-70b", 1, {"strategy": "ddp"}, ac="full", lora=LORA),
        ONE_24GB,
    ),
    "70B LoRA, 1x24GB + 256 GB host, ZeRO-3 + offload, full recompute": (
        _spec("llama-70b", 1, _fsdp(3, True), ac="full", lora=LORA),
        {**ONE_24GB, "host_memory_gb": 256},
    ),
    "70B LoRA, 1x24GB + 64 GB host, ZeRO-3 + offload, full recompute": (
        _spec("llama-70b", 1, _fsdp(3, True), ac="full", lora=LORA),
        {**ONE_24GB, "host_memory_gb": 64},
    ),
    "70B LoRA, 8x24GB, ZeRO-3, full recompute": (
        _spec("llama-70b", 8, _fsdp(3), ac="full", lora=LORA),
        NODE_24GB,
    ),
    "70B LoRA, 8x24GB, ZeRO-3 + offload, full recompute": (
        _spec("llama-70b", 8, _fsdp(3, True), ac="full", lora=LORA),
        NODE_24GB,
    ),
    "7B full, 8xH100, ZeRO-1": (_spec("llama-7b", 8, _fsdp(1), ac="full"), NODE_H100),
    "7B full, 8xH100, ZeRO-2": (_spec("llama-7b", 8, _fsdp(2), ac="full"), NODE_H100),
    "7B full, 8xH100, ZeRO-3": (_spec("llama-7b", 8, _fsdp(3), ac="full"), NODE_H100),
    "7B full, 8xH100, ZeRO-3 + offload": (
        _spec("llama-7b", 8, _fsdp(3, True), ac="full"),
        NODE_H100,
    ),
    # The same questions with DeepSpeed's ZeRO (service.planner.deepspeed_memory).
    "70B LoRA, 1x24GB, DeepSpeed ZeRO-3, full recompute": (
        _spec("llama-70b", 1, _deepspeed(3), ac="full", lora=LORA),
        ONE_24GB,
    ),
    "70B LoRA, 1x24GB + 256 GB host, DeepSpeed ZeRO-3 + offload, full recompute": (
        _spec("llama-70b", 1, _deepspeed(3, True), ac="full", lora=LORA),
        {**ONE_24GB, "host_memory_gb": 256},
    ),
    "70B LoRA, 1x24GB + 64 GB host, DeepSpeed ZeRO-3 + NVMe offload, full recompute": (
        _spec("llama-70b", 1, _deepspeed(3, "nvme"), ac="full", lora=LORA),
        {**ONE_24GB, "host_memory_gb": 64},
    ),
    **{
        f"7B full, 8xH100, DeepSpeed ZeRO-{stage}{' + offload' if offload else ''}": (
            _spec("llama-7b", 8, _deepspeed(stage, offload), ac="full"),
            NODE_H100,
        )
        for stage, offload in ((0, False), (1, False), (2, False), (2, True), (3, False), (3, True))
    },
}


def answer(name: str) -> tuple[str, str, str]:
    """(verdict, GiB per GPU, host GiB per rank) as the docs table writes them."""
    spec, cluster = SCENARIOS[name]
    plan = plan_job(parse_spec(spec), cluster=cluster)
    return (
        plan.verdict,
        f"{plan.per_rank.total_bytes / GIB:.1f}",
        f"{plan.breakdown.host_bytes / GIB:.1f}",
    )


def _doc_rows() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in SCENARIOS:
            rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_docs_state_the_planners_answer(name):
    assert _doc_rows().get(name) == answer(name), name


def test_the_roadmap_verdicts():
    fits = {name: answer(name)[0] == "fits" for name in SCENARIOS}
    # 7B LoRA fits one 24 GB GPU with full recompute, not without.
    assert fits["7B LoRA, 1x24GB, full recompute"]
    assert not fits["7B LoRA, 1x24GB, no recompute"]
    # 70B LoRA on one 24 GB GPU: only with ZeRO-3 + CPU offload and the host memory for the
    # base; on eight with ZeRO-3 + CPU offload, not without offload.
    assert not fits["70B LoRA, 1x24GB, full recompute"]
    assert fits["70B LoRA, 1x24GB + 256 GB host, ZeRO-3 + offload, full recompute"]
    assert not fits["70B LoRA, 1x24GB + 64 GB host, ZeRO-3 + offload, full recompute"]
    assert fits["70B LoRA, 8x24GB, ZeRO-3 + offload, full recompute"]
    assert not fits["70B LoRA, 8x24GB, ZeRO-3, full recompute"]
    # Each ZeRO stage holds no more per GPU than the one before.
    per_gpu = [
        float(answer(f"7B full, 8xH100, {s}")[1])
        for s in ("ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 + offload")
    ]
    assert per_gpu == sorted(per_gpu, reverse=True) and per_gpu[-1] < per_gpu[0]
    assert re.search(r"\d", DOC.read_text())


def test_the_roadmap_verdicts_with_deepspeed():
    fits = {name: answer(name)[0] == "fits" for name in SCENARIOS}
    # 70B LoRA on one 24 GB GPU: ZeRO-3 alone holds the whole base; with the parameters
    # and optimizer offloaded it fits, the base in host memory.
    assert not fits["70B LoRA, 1x24GB, DeepSpeed ZeRO-3, full recompute"]
    offloaded = "70B LoRA, 1x24GB + 256 GB host, DeepSpeed ZeRO-3 + offload, full recompute"
    assert fits[offloaded] and float(answer(offloaded)[2]) > 130
    # 7B full on 8 H100s: stage 0 replicates all 16 bytes a parameter; each stage holds no
    # more than the one before; stages 1 and 2 differ only in when gradients are dropped.
    stages = ["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-2 + offload", "ZeRO-3", "ZeRO-3 + offload"]
    per_gpu = [float(answer(f"7B full, 8xH100, DeepSpeed {s}")[1]) for s in stages]
    assert not fits["7B full, 8xH100, DeepSpeed ZeRO-0"]
    assert fits["7B full, 8xH100, DeepSpeed ZeRO-3"]
    assert per_gpu == sorted(per_gpu, reverse=True) and per_gpu[1] == per_gpu[2]
    assert per_gpu[-1] < per_gpu[0] / 3


# Llama 3 8B's config.json (the fields etrain reads), for the DPO example's model.hf.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
DPO_EXAMPLE = Path(__file__).parents[4] / "examples" / "llama-3-8b-dpo-lora-8gpu.yaml"
# Row name in docs/planner.md's DPO table -> (changes to the example, cluster).
DPO_SCENARIOS = {
    "8B DPO LoRA, 8x24GB, DDP, reference = base without adapters": ({}, NODE_24GB),
    "8B DPO full, 8xH100, ZeRO-3, frozen reference sharded": (
        {"model": {"lora": None}, "parallelism": _fsdp(3)},
        NODE_H100,
    ),
}


def dpo_answer(name: str) -> tuple[str, str, str, str]:
    """(verdict, GiB per GPU, reference GiB per GPU, host GiB per rank) of a DPO row."""
    import yaml

    from workers.models.hf_config import config_from_hf

    changes, cluster = DPO_SCENARIOS[name]
    spec = yaml.safe_load(DPO_EXAMPLE.read_text())
    spec["model"].update(changes.get("model", {}))
    spec["parallelism"] = changes.get("parallelism", spec["parallelism"])
    plan = plan_job(parse_spec(spec), cluster=cluster, model_config=config_from_hf(LLAMA3_8B))
    reference = plan.breakdown.buffers.get("dpo_reference_model", 0)
    return (
        plan.verdict,
        f"{plan.per_rank.total_bytes / GIB:.1f}",
        f"{reference / GIB:.1f}",
        f"{plan.breakdown.host_bytes / GIB:.1f}",
    )


@pytest.mark.parametrize("name", list(DPO_SCENARIOS))
def test_the_docs_state_the_planners_dpo_answer(name):
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in DPO_SCENARIOS:
            rows[cells[0]] = tuple(cells[1:5])
    assert rows.get(name) == dpo_answer(name), name
    lora = dpo_answer("8B DPO LoRA, 8x24GB, DDP, reference = base without adapters")
    assert lora[0] == "fits" and lora[2] == "0.0"  # no second copy of the weights


SD_EXAMPLE = Path(__file__).parents[4] / "examples" / "sd15-lora-24gb.yaml"
ONE_24GB = {"gpu": "rtx4090", "gpus_per_node": 1, "nodes": 1}
# Row name in docs/planner.md's diffusion table -> changes to the example.
SD_SCENARIOS = {
    "SD 1.5 LoRA r16, 512 px, micro-batch 4, bf16, 1x24GB": {},
    "SD 1.5 LoRA r16, 1024 px, micro-batch 4, fp32, 1x24GB": {
        "diffusion": {"resolution": 1024},
        "train": {"precision": "fp32"},
    },
}


def sd_answer(name: str) -> tuple[str, str, str, str]:
    """(verdict, GiB per GPU, frozen VAE + text encoder GiB, activations GiB) of a row."""
    import yaml

    from tests.support.diffusion_fixtures import sd15_shape

    spec = yaml.safe_load(SD_EXAMPLE.read_text())
    for key, change in SD_SCENARIOS[name].items():
        spec[key] = {**spec[key], **change}
    plan = plan_job(parse_spec(spec), cluster=ONE_24GB, model_config=sd15_shape())
    return (
        plan.verdict,
        f"{plan.per_rank.total_bytes / GIB:.1f}",
        f"{plan.per_rank.buffers_bytes / GIB:.1f}",
        f"{plan.per_rank.activations_bytes / GIB:.1f}",
    )


@pytest.mark.parametrize("name", list(SD_SCENARIOS))
def test_the_docs_state_the_planners_diffusion_answer(name):
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in SD_SCENARIOS:
            rows[cells[0]] = tuple(cells[1:5])
    assert rows.get(name) == sd_answer(name), name
