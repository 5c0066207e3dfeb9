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
