"""Step time with ``metrics.tensorboard`` on and off (one CPU process, gpt-tiny).

Runs ``workers.train_loop.run`` in this process, rank 0 of 1, with a local checkpoint
root (no checkpoint is due within the run), alternating off/on ``--repeats`` times, and
prints the median per-step time of each (first ``--warmup`` steps excluded) and the ratio.

    .venv/bin/python bench/tensorboard_overhead.py --steps 300 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from workers.spec import JobSpec
from workers.train_loop import RunEnv, run


def _spec(steps: int, tensorboard: bool) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "tb-bench",
            "data": {"seq_len": 32, "num_samples": 4096},
            "resources": {"workers": 1},
            "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 8},
            "checkpoint": {"every_steps": 100_000},
            "metrics": {"tensorboard": tensorboard},
        }
    )


def _median_step(steps: int, warmup: int, tensorboard: bool) -> float:
    with tempfile.TemporaryDirectory() as root:
        env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoint_root=root)
        times = run(_spec(steps, tensorboard), env).step_times[warmup:]
        if tensorboard:
            assert any(Path(root, "tensorboard").iterdir())
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    got: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for on in (False, True):
            got[on].append(_median_step(args.steps, args.warmup, on))
    off, on = statistics.median(got[False]), statistics.median(got[True])
    print(f"steps={args.steps} warmup={args.warmup} repeats={args.repeats}")
    for flag in (False, True):
        reps = [round(t * 1e3, 3) for t in got[flag]]
        label = "on: " if flag else "off:"
        print(f"tensorboard {label} {statistics.median(got[flag]) * 1e3:.3f} ms/step  {reps}")
    print(f"on/off ratio: {on / off:.4f}")


if __name__ == "__main__":
    main()
