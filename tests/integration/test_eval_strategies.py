"""Stepper.evaluate under every layout equals one process's evaluation of the same weights.

One group of two gloo processes builds each layout from the same seed (the weights every
layout starts from are the same) and evaluates a held-out set whose size is no multiple of
the calls per rank (padding rows on some ranks); one process evaluates the same set.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow

LAYOUTS = {
    "ddp2": {"strategy": "ddp"},
    "fsdp2-zero3": {"strategy": "fsdp", "fsdp": {"zero_stage": 3}},
    "tp2": {"strategy": "tp", "tp": 2},
    "pp2-1f1b": {"strategy": "pp", "pp": 2, "pipeline": {"schedule": "1f1b", "microbatches": 2}},
    "pp2-gpipe": {"strategy": "pp", "pp": 2, "pipeline": {"schedule": "gpipe", "microbatches": 2}},
}
EVAL_SAMPLES = 7


def _spec(parallelism: dict, workers: int) -> dict:
    return {
        "name": "eval",
        "model": {"preset": "gpt-tiny"},
        "data": {"source": "synthetic", "seq_len": 16, "num_samples": 40},
        "parallelism": parallelism,
        "resources": {"workers": workers},
        "train": {"steps": 1, "global_batch_size": 4, "micro_batch_size": 1},
    }


def evaluate(spec_dict: dict, rank: int, world_size: int) -> float:
    """Build the job's model and layout as the loop does, then evaluate the held-out set."""
    from workers.data.eval_set import IndexView, eval_count, eval_items, holdout
    from workers.spec import JobSpec
    from workers.train_loop import RunEnv, _build, _dataset, _stores, spec_model_config

    spec = JobSpec.model_validate(spec_dict)
    env = RunEnv(rank=rank, world_size=world_size, device=torch.device("cpu"))
    cfg = spec_model_config(spec, _stores(spec))
    dataset = _dataset(spec, cfg)
    _train, held = holdout(len(dataset), 0.25, seed=spec.train.seed)
    view = IndexView(dataset, held[:EVAL_SAMPLES])
    stepper, _ = _build(spec, env, dataset, cfg)
    items = eval_items(len(view), dp_size=stepper.coords.dp_size, per_call=stepper.per_call)
    count = eval_count(view, len(view), seq_len=spec.data.seq_len)
    return stepper.evaluate(view, items, count=count, seq_len=spec.data.seq_len)


def _group(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        got = {
            name: evaluate(_spec(p, world_size), rank, world_size) for name, p in LAYOUTS.items()
        }
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(got, f)


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> dict[str, float]:
    out = str(tmp_path_factory.mktemp("eval") / "losses.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_group, args=(2, port, out), nprocs=2, join=True, start_method="spawn")
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_evaluation_equals_one_process(distributed, layout):
    reference = evaluate(_spec({"strategy": "ddp"}, 1), 0, 1)
    assert distributed[layout] == pytest.approx(reference, rel=1e-6)
    assert 2.0 < reference < 10.0  # a real cross entropy over a 256-token vocabulary
