"""Every example spec validates, and covers every strategy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from workers.spec import STRATEGIES, JobSpec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    spec = JobSpec.model_validate(yaml.safe_load(path.read_text()))
    assert spec.name == path.stem or spec.name in path.stem


def test_examples_cover_every_strategy_on_cpu_and_the_gpu_shapes():
    specs = [JobSpec.model_validate(yaml.safe_load(p.read_text())) for p in EXAMPLES]
    cpu = {s.parallelism.strategy for s in specs if s.resources.gpus_per_worker == 0}
    assert cpu == set(STRATEGIES)
    gpu = {(s.model.preset, s.parallelism.strategy) for s in specs if s.resources.gpus_per_worker}
    assert {("llama-7b", "fsdp"), ("llama-70b", "hybrid")} <= gpu
    big = next(s for s in specs if s.model.preset == "llama-70b")
    assert (big.parallelism.tp, big.parallelism.pp, big.resources.workers) == (8, 4, 32)


def test_examples_cover_fine_tuning_pretrained_models():
    specs = [JobSpec.model_validate(yaml.safe_load(p.read_text())) for p in EXAMPLES]
    tuned = [s for s in specs if s.model.hf]
    full = [s for s in tuned if s.model.lora is None and s.parallelism.strategy == "fsdp"]
    assert any(s.resources.workers == 8 and s.resources.gpus_per_worker == 1 for s in full)
    lora = [s for s in tuned if s.model.lora is not None]
    assert any(s.resources.workers == 1 and s.resources.gpus_per_worker == 1 for s in lora)
    assert {"instruction", "chat"} <= {s.data.shape for s in tuned}
