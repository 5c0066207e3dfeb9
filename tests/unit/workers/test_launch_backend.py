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


def test_a_job_pinned_to_gpu_nodes_hands_ray_train_their_label_selector(tmp_path, monkeypatch):
    """The service's GPU_NODES_ENV (a cluster of mixed GPUs), from the Ray job's environment
    or a standby's job environment, becomes the workers' label selector; unset, none."""
    from workers.contract import GPU_NODES_ENV

    spec = JobSpec.model_validate(
        {"name": "pinned", "checkpoint": {"storage": f"file://{tmp_path}"}}
    )
    assert build_trainer(spec, job_id="j-free").scaling_config.label_selector is None
    pinned = build_trainer(spec, job_id="j-pinned", job_env={GPU_NODES_ENV: "n-24a,n-24b"})
    assert pinned.scaling_config.label_selector == {"ray.io/node-id": "in(n-24a,n-24b)"}
    monkeypatch.setenv(GPU_NODES_ENV, "n-24a")
    in_env = build_trainer(spec, job_id="j-env").scaling_config.label_selector
    assert in_env == {"ray.io/node-id": "in(n-24a)"}
