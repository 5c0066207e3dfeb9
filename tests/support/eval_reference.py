"""The reference an evaluation under any layout is compared against: one process loads the
checkpoint committed at a step and evaluates the job's evaluation set with it."""

from __future__ import annotations

import torch

from workers.build import build_stepper, stores_of
from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.state import ModelAndOptimizer
from workers.spec import JobSpec
from workers.train_loop import RunEnv, _datasets, spec_model_config


def evaluate_checkpoint(spec: JobSpec, root, step: int) -> float:
    """The evaluation loss of the checkpoint committed at ``step`` under ``root`` (a job's
    checkpoint folder or its StorageLocation), computed in this one process."""
    env = RunEnv(rank=0, world_size=1, device=torch.device("cpu"))
    cfg = spec_model_config(spec, stores_of(spec))
    train, evaluation = _datasets(spec, cfg)
    assert evaluation is not None, "the spec has no evaluation set"
    stepper, _ = build_stepper(spec, env, train, cfg)
    ckpts = CheckpointManager(root, keep_last=None, rank=0)
    infos = [info for info in ckpts.committed() if info.step == step]
    assert infos, f"no checkpoint committed at step {step} under {root}"
    ckpts.load(infos[0], app_state=ModelAndOptimizer(stepper.parts, stepper.optimizers))
    return float(evaluation.run(stepper)["eval_loss"])
