"""DeepSpeed ZeRO: DeepSpeed's engine (``deepspeed.initialize``) holds the model and the
job's optimizer and shards them by ZeRO stage, with optional offload to host memory or
(stage 3) to the node's NVMe offload folder (:mod:`workers.storage.nvme`).

The strategy leaves the model as it is (:func:`apply_deepspeed`): the engine needs the
optimizer, which is built after placement, so :func:`initialize` wraps both in
``build_stepper``. The engine's configuration comes from the spec alone
(:func:`workers.spec.deepspeed.engine_config`): the micro-batch and the accumulation steps
follow the global batch at every world size, clipping is ``train.grad_clip``, and the
optimizer is etrain's torch optimizer, its LR scheduled by etrain. The stepper runs each
micro-batch's backward through the engine with the accumulation boundary set by itself,
and one ``engine.step()`` per optimizer step.

Checkpoints: :mod:`workers.checkpoint.deepspeed_state`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import weakref

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.contract import DEEPSPEED, JOB_ID_ENV
from workers.spec.deepspeed import engine_config
from workers.storage.nvme import remove_rank_swap, swap_buffer_elements, swap_folder
from workers.strategies import StrategyConfig, register_strategy
from workers.strategies.mesh import total_grad_norm
from workers.telemetry import engine_memory


@register_strategy(DEEPSPEED)
def apply_deepspeed(model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """``model`` unchanged: the engine places it when it is built with the optimizer
    (:func:`initialize`)."""
    del mesh, cfg
    return model


def _import_deepspeed():
    """``deepspeed``, imported quietly and without its just-in-time communication op."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no "could not detect a GPU" warning
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    # Its shared-memory all-reduce serves inference on CPU only; training reduces over the
    # job's process group. Compiling it would take ~25 s of each rank's start.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    _keep_the_given_dtype()
    return deepspeed


def _keep_the_given_dtype() -> None:
    """Make ZeRO-3's ``Init`` partition parameters in the dtype it is given.

    ``Init._set_dtype`` reads ``dtype or torch.float16 if fp16 else torch.bfloat16 ...``:
    where the accelerator has no fp16 (a CPU without mkldnn fp16, such as an AMD EPYC)
    the given dtype is dropped for bf16. The NVMe parameter swapper is then made for bf16
    beside fp32 parameters, and it swaps none of them (they stay in host memory, against
    the plan). The engine gives the module's own dtype; that one is kept.
    """
    from deepspeed.runtime.zero.partition_parameters import Init

    original = Init._set_dtype
    if getattr(original, "keeps_the_given_dtype", False):
        return

    def set_dtype(self, ds_config, dtype):
        original(self, ds_config, dtype)
        if dtype is not None:
            self.dtype = dtype

    set_dtype.keeps_the_given_dtype = True
    Init._set_dtype = set_dtype


def undo_process_patches() -> None:
    """Give this process back the ``torch.nn.functional.linear`` a ZeRO-3 engine replaced.

    DeepSpeed's ZeRO-3 swaps in its memory-efficient linear for the whole process and
    never puts torch's back, so every later job in the process (a warm worker's next
    job, whatever its strategy) would run DeepSpeed's: other saved tensors, other
    activation memory. Called as each job is built and as a DeepSpeed job ends; it
    imports nothing (a process that never ran DeepSpeed has nothing to undo)."""
    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    original = getattr(
        getattr(zero, "InsertPostInitMethodToModuleSubClasses", None), "linear_bk", None
    )
    if original is not None:
        torch.nn.functional.linear = original


# The default process group DeepSpeed's cached groups were made in (see _fresh_start).
_groups_of: list = [None]


def _fresh_start(deepspeed) -> None:
    """Make this process's DeepSpeed state that of a new process, for a second job in it
    (a warm worker, another world size after a resize, the next job of a test group).

    DeepSpeed clones the world group once per process and keeps it: on a new default
    group, collectives on the old clone would hang, so the references are released as
    DeepSpeed's own teardown does. And ZeRO-3 numbers modules and parameters from
    process-wide counters that every rank must agree on (it checks, by broadcast, at the
    first forward): a rank that ran an earlier job would count on from there.
    """
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.runtime.zero.partition_parameters import Init

    world = torch.distributed.group.WORLD
    if _groups_of[0] is not None and _groups_of[0] is not world:
        deepspeed.utils.groups._release_process_group_references(None)
    _groups_of[0] = world
    Init.param_id = 0
    DeepSpeedZeRoOffload._register_deepspeed_module.__defaults__[0][0] = 0  # count=[0]


def initialize(model: nn.Module, optimizer: torch.optim.Optimizer, *, spec, env) -> EngineStep:
    """The DeepSpeed engine over ``model`` and ``optimizer`` on the job's process group."""
    deepspeed = _import_deepspeed()
    _fresh_start(deepspeed)
    index = env.device.index if env.device.type == "cuda" else 0
    os.environ.setdefault("LOCAL_RANK", str(index or 0))  # the engine reads its device here
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), verbose=False)
    nvme = _nvme(spec, model, dp=env.world_size)
    config = engine_config(
        spec.parallelism.deepspeed,
        train=spec.train,
        accumulation=spec.grad_accum_steps(env.world_size),
        nvme=nvme,
    )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config, dist_init_required=False
    )
    if nvme is None:
        return EngineStep(engine)
    # The rank's swap files go as the job ends (EngineStep.close), else with the engine or
    # at the process's exit.
    rank = torch.distributed.get_rank()
    return EngineStep(
        engine, swap=weakref.finalize(engine, remove_rank_swap, nvme["nvme_path"], rank)
    )


def _nvme(spec, model: nn.Module, *, dp: int) -> dict | None:
    """Where the job swaps to and the parameter swap buffer's size, for an nvme offload:
    a folder of the job's own beneath its NVMe area, checked now, on this node."""
    if not spec.parallelism.deepspeed.uses_nvme:
        return None
    folder = swap_folder(os.environ.get(JOB_ID_ENV) or spec.name)
    pieces = [math.ceil(p.numel() / dp) for p in model.parameters()]
    return {"nvme_path": folder, "buffer_size": swap_buffer_elements(pieces)}


class EngineStep:
    """How the stepper runs an optimizer step through a DeepSpeed ``engine``."""

    def __init__(self, engine, *, swap: weakref.finalize | None = None):
        self.engine = engine
        self._swap = swap  # removes this rank's NVMe swap files
        self.zero = engine.zero_optimization_stage() > 0
        self.memory: dict | None = None  # what the engine held at a measured step

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Backward one micro-batch's loss (already scaled by the stepper); gradients are
        reduced at ``last``, the step's boundary."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self, *, measure: bool = False) -> torch.Tensor:
        """The optimizer step (clipped by the engine); the global gradient norm before
        clipping. ``measure``: record what the engine holds (:attr:`memory`)."""
        norm = None
        if not self.zero:  # ZeRO-0 reduces in backward and does not keep the norm
            norm = total_grad_norm([p for p in self.engine.parameters() if p.grad is not None])
        grads = engine_memory.grads_bytes(self.engine) if measure else 0
        self.engine.step()
        if measure:  # the optimizer state exists from the first step on
            self.memory = engine_memory.state_bytes(self.engine, grads=grads)
        if norm is None:
            norm = torch.tensor(float(self.engine.get_global_grad_norm() or 0.0))
        return norm

    def close(self) -> None:
        """The job has ended on this rank: remove what it swapped to NVMe, and give the
        process back torch's linear."""
        if self._swap is not None:
            self._swap()
        undo_process_patches()
