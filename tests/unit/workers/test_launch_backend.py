"""The process group a job's workers get: gloo on CPUs; on GPUs NCCL for CUDA tensors and gloo
for the CPU tensors of etrain's own small collectives (checkpoint votes, broadcasts)."""

from __future__ import annotations

import pytest
from torch.distributed.distributed_c10d import BackendConfig

from workers.launch import build_trainer, process_group_backend
from workers.spec import JobSpec


@pytest.mark.parametrize(
    ("use_gpu", "devices"),
    [(False, {"cpu": "gloo", "cuda": "gloo"}), (True, {"cpu": "gloo", "cuda": "nccl"})],
)
def test_torch_reads_the_backend_as_one_backend_per_device(use_gpu, devices):
    # torch's own parser of init_process_group's backend string (no NCCL needed to parse).
    parsed = BackendConfig(process_group_backend(use_gpu)).get_device_backend_map()
    assert {d: str(b) for d, b in parsed.items() if d in devices} == devices


@pytest.mark.parametrize(("gpus", "backend"), [(0, "gloo"), (1, "cpu:gloo,cuda:nccl")])
def test_the_trainer_is_built_with_that_backend(tmp_path, gpus, backend):
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "model": {"preset": "gpt-tiny"},
            "resources": {"workers": 2, "gpus_per_worker": gpus},
            "checkpoint": {"storage": f"file://{tmp_path}"},
        }
    )
    trainer = build_trainer(spec, job_id="j-test")
    assert trainer.backend_config.backend == backend  # Ray would pick plain "nccl" on GPUs
