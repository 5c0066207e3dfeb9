"""Peak host memory and time per rank while a sharded Hugging Face checkpoint loads.

:func:`write_random_llama` writes a Llama folder straight with safetensors (two
shards and an index; large enough that the signal beats allocator noise) and
:func:`measure_load` loads it on ``world_size`` local gloo processes under each
named layout, sampling each rank's RSS every millisecond while its part is
materialised and filled (``workers.build.load_hf``). Used by
``tests/integration/test_hf_models.py`` (asserts) and benchmarks (tables).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import torch

from tests.support.hf_fixtures import hf_config
from tests.support.local_launch import join_group, rendezvous
from workers.spec import JobSpec
from workers.train_loop import RunEnv

LAYOUTS = {
    "fsdp": {"strategy": "fsdp"},
    "tp": {"strategy": "tp", "tp": 2},
    "ddp": {"strategy": "ddp"},
}


def write_random_llama(
    folder: Path, *, hidden_size: int = 1024, layers: int = 4, intermediate_size: int = 2816
) -> int:
    """A random fp32 Llama (~190 MB by default) in two safetensors shards plus an index;
    returns its bytes."""
    from safetensors.torch import save_file

    from workers.models.hf_load import hf_model_config
    from workers.models.hf_naming import to_hf_name
    from workers.models.llama import build_model

    config = hf_config(
        "llama",
        vocab_size=512,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=intermediate_size,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config.to_json_string())
    model = build_model(hf_model_config(str(folder)), seed=0, device="meta")
    gen = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for shard in (0, 1):
        tensors = {}
        for i, (name, param) in enumerate(model.named_parameters()):
            if i % 2 == shard:
                tensors[to_hf_name(name)] = torch.randn(param.shape, generator=gen) * 0.02
        save_file(tensors, str(folder / f"model-{shard}.safetensors"))
        weight_map.update({name: f"model-{shard}.safetensors" for name in tensors})
        total += sum(t.numel() * 4 for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def rss_peak_during(fn) -> tuple[int, float]:
    """(peak RSS growth in bytes while ``fn`` runs, seconds it took), sampled every ms."""
    import psutil

    proc, peak, done = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    done.set()
    thread.join()
    peak[0] = max(peak[0], proc.memory_info().rss)
    return peak[0] - base, took


def _measure(parallelism: dict, world: int, env: RunEnv, folder: str) -> dict:
    """Peak RSS growth and time of materialising and loading this rank's part."""
    from workers.build import load_hf, new_model, split_and_apply
    from workers.strategies.mesh import build_mesh

    spec = JobSpec.model_validate(
        {
            "name": "m",
            "model": {"hf": folder},
            "data": {"seq_len": 16},
            "resources": {"workers": world},
            "parallelism": parallelism,
            "train": {"global_batch_size": 2, "micro_batch_size": 1},
        }
    )
    model, cfg = new_model(spec, env)
    mesh = build_mesh(spec, world_size=world, device=env.device)
    if parallelism["strategy"] == "ddp":  # the layout replicates: whole model, then wrap
        parts = [model]
    else:
        parts, _ = split_and_apply(spec, env, model, mesh)
    grew, took = rss_peak_during(lambda: load_hf(spec, env, parts, cfg))
    return {"peak_bytes": grew, "seconds": took}


def _memory_worker(rank: int, world: int, port: int, folder: str, out: str, layouts: dict) -> None:
    import torch.distributed as dist

    join_group(rank, world, port)
    env = RunEnv(rank=rank, world_size=world, device=torch.device("cpu"))
    record = {}
    for name, par in layouts.items():
        record[name] = _measure(par, world, env, folder)
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def measure_load(folder: str | Path, *, world_size: int = 2, layouts: dict | None = None) -> list:
    """Per rank, per layout name: ``{"peak_bytes", "seconds"}`` of loading ``folder``."""
    import torch.multiprocessing as mp

    rdv = rendezvous(world_size)  # its port stays bound until the processes end
    port = rdv.port
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _memory_worker,
            args=(world_size, port, str(folder), out, layouts or LAYOUTS),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
