"""DeepSpeed ZeRO-3 swapping to NVMe (ZeRO-Infinity) on 2 gloo ranks: DeepSpeed's async I/O
op, built against libaio, writes the parameters and the optimizer state to files in the
job's folder under the NVMe offload root, and the job still follows one plain process.

The model is a Hugging Face Llama folder whose MLP and attention weights are large enough
to be swapped (DeepSpeed swaps a rank's piece only from its aio block size, 1 MiB, up).
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

from service.planner.deepspeed_memory import zero_state
from service.planner.planning import layout_of, workload_of
from tests.support.hf_fixtures import make_hf_folder
from tests.support.local_launch import LocalJob, run_local
from workers.models.hf_load import hf_model_config
from workers.spec import JobSpec
from workers.storage.confine import Roots
from workers.storage.nvme import NVME_ENV
from workers.train_loop import RunEnv, run

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

STEPS = 4
OFFLOAD = {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"}


def _spec(folder, offload: dict | None, *, workers: int = 2, name: str = "nvme") -> dict:
    par = {"strategy": "deepspeed", "deepspeed": offload} if offload else {"strategy": "ddp"}
    spec = {
        "name": name,
        "model": {"hf": str(folder)},
        "data": {"seq_len": 16, "num_samples": 64},
        "train": {"steps": STEPS, "global_batch_size": 8, "micro_batch_size": 2, "lr": 1e-2},
        "checkpoint": {"every_steps": 2},
        "resources": {"workers": workers, "cpus_per_worker": 1},
        "parallelism": par,
    }
    return JobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-nvme")
    # 512 x 1024 MLP weights: a 1 MiB piece on each of 2 ranks, swapped.
    make_hf_folder(folder, "llama", seed=3, hidden_size=512, intermediate_size=1024)
    return folder


@pytest.fixture(scope="module")
def results(folder, tmp_path_factory):
    swap = tmp_path_factory.mktemp("nvme-root")
    ckpts = tmp_path_factory.mktemp("nvme-ckpts")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (swap / "nvme-link").symlink_to(elsewhere)
    nvme = _spec(folder, OFFLOAD)
    jobs = [
        LocalJob("nvme", nvme, measure_memory=True, trace_activations=False),
        LocalJob("nvme-save", nvme, checkpoint_root=str(ckpts), stop_at=2),
        LocalJob("nvme-resume", nvme, checkpoint_root=str(ckpts)),
        LocalJob("nvme-link", _spec(folder, OFFLOAD, name="nvme-link")),
    ]
    # The spawned ranks' environment, as the service writes it: the NVMe area, and the
    # roots the ranks may open beneath.
    env = {NVME_ENV: str(swap), **Roots.of([folder], [swap, ckpts]).env()}
    with mock.patch.dict(os.environ, env):
        out = run_local(jobs, world_size=2)
    one = _spec(folder, None, workers=1)
    out["one"] = run(
        JobSpec.model_validate(one), RunEnv(0, 1, torch.device("cpu"), measure_memory=False)
    )
    return {**out, "swap": swap, "elsewhere": elsewhere}


def test_zero3_swapping_to_nvme_follows_one_process(results):
    assert results["nvme"].error is None, results["nvme"].error
    losses, want = results["nvme"].losses, results["one"].losses
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step in losses:
        assert losses[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6), step


def test_the_swap_files_are_on_disk_as_planned_and_gone_at_the_end(results, folder):
    """Each rank's swap files hold its parameter pieces and optimizer state: the bytes the
    planner puts on disk (within 10%); the job's folder is removed as it ends."""
    memory = results["nvme"].memory
    spec = JobSpec.model_validate(_spec(folder, OFFLOAD))
    work, layout = workload_of(spec, hf_model_config(str(folder))), layout_of(spec, 2)
    planned = zero_state(work, 3, 2, layout.zero)
    assert planned.disk_optimizer > 0 and planned.optimizer == 0
    for rank in memory:
        assert rank["swapped_bytes"] == pytest.approx(planned.disk_total, rel=0.1), rank
        # Out of memory: the optimizer state is on disk (only torch's step count is left).
        assert rank["optimizer_bytes"] < 0.01 * planned.disk_optimizer, rank
    assert os.listdir(results["swap"]) == ["nvme-link"]  # the job folder "nvme" is gone


def test_a_job_swapping_to_nvme_resumes_bitwise(results):
    save, resume, whole = results["nvme-save"], results["nvme-resume"], results["nvme"]
    assert save.error is None and resume.error is None, save.error or resume.error
    assert resume.resumed_from == 2
    assert {s: resume.losses[s] for s in (3, 4)} == {s: whole.losses[s] for s in (3, 4)}


def test_a_job_folder_that_is_a_link_out_is_refused_on_the_node(results):
    """The ranks run confined (their write roots: the NVMe root and the checkpoints); a
    job folder swapped for a link to elsewhere is refused where the rank makes it."""
    error = results["nvme-link"].error
    assert error is not None and "ConfinementError" in error and "link" in error, error
    assert os.listdir(results["elsewhere"]) == []
