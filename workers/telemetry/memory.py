"""Per-rank memory, measured the same way under every strategy.

State bytes are the local shards a rank really holds (a DTensor counts its
local tensor only): parameters, gradients, optimizer state. Activations are
the peak bytes of tensors forward creates and keeps during one micro-batch (or
one pipeline call): autograd's saved tensors, and under activation
checkpointing the recomputed ones, counted by torch's MemTracker (on a
pipeline rank, whose schedule the tracker cannot follow, by ``LiveActivations``).
On GPU the CUDA allocator's peak is reported as well; on CPU the peak is
parameters + gradients + optimizer state + activations of one micro-batch.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch._guards import active_fake_mode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def state_bytes(parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict:
    """Bytes of parameters, gradients and optimizer state held by this rank."""
    params = [p for part in parts for p in part.parameters()]
    opt = sum(
        _nbytes(v)
        for o in optimizers
        for st in o.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    return {
        "params_bytes": sum(_nbytes(p) for p in params),
        "grads_bytes": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": opt,
    }


def _with_activation_peak(base: type) -> type:
    """torch's MemTracker (or FSDPMemTracker) that also keeps the activations' own peak.

    The tracker follows every storage created under it (a dispatch mode, with weak
    references, so a freed tensor leaves the count) and sorts it by role: parameters,
    buffers, gradients, optimizer state, activations (made in forward, and in the
    recompute of a checkpointed block), temporaries (made in backward) and, with
    FSDPMemTracker, FSDP's all-gathered parameters and buffers. Its own peak snapshot
    is taken at the peak of the total; this keeps the activations' peak, which is what
    the planner predicts.
    """

    class Tracker(base):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.activation_peak = 0

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            # No gradient hooks: torch's would fail on frozen (LoRA base) parameters,
            # and gradients are measured by state_bytes, not here.
            del install_grad_hooks
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

        def _update_snap(self, *args, **kwargs) -> None:
            super()._update_snap(*args, **kwargs)
            state = getattr(self, "_fsdp_state", None)
            if state is not None and state.name in ("PRE_FW", "PRE_BW"):
                # FSDP is gathering a block: its parameters count as activations until
                # FSDPMemTracker files them as unsharded parameters at the end of the hook.
                return
            act = self._ref_class.ACT
            for snap in self._curr_mem_snap.values():
                self.activation_peak = max(self.activation_peak, snap.get(act, 0))

    return Tracker


_Tracker = _with_activation_peak(MemTracker)
_FSDPTracker = _with_activation_peak(FSDPMemTracker)


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
        return None


class LiveActivations(TorchDispatchMode):
    """The live bytes of the storages forward makes, and their peak (a dispatch mode).

    An op run outside backward, or inside it with grad mode on (the recompute of an
    activation-checkpointed block), makes activations: each storage it returns that
    none of its inputs holds (views and in-place results add nothing) is counted
    until it is freed (a weak reference's callback), however long autograd, the
    pipeline schedule or the caller keeps it. Backward's own temporaries and
    gradients (grad mode off in the autograd engine) are not activations. Ops with
    no tensor input (``torch.empty``, ``zeros``) are skipped: in a training step they
    are the pipeline's communication buffers, which the planner counts as buffers.
    Unlike torch's MemTracker it needs no module hooks, so it follows
    ``torch.distributed.pipelining``, whose schedules run several micro-batches'
    forwards and backwards out of order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size

    def _count(self, t: torch.Tensor, inputs: set[int | None]) -> None:
        try:
            st = t.untyped_storage()
            key, size = st.data_ptr(), st.nbytes()
        except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
            return
        if size == 0 or key in inputs or key in self._seen:
            return
        self._seen.add(key)
        self.live += size
        weakref.finalize(st, self._freed, key, size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor run its local ops under this mode
        out = func(*args, **(kwargs or {}))
        if active_fake_mode() is not None:
            return out  # DTensor's sharding propagation: fake tensors, no memory
        if torch._C._current_graph_task_id() != -1 and not torch.is_grad_enabled():
            return out
        ins = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not ins:
            return out
        inputs = {_storage_ptr(t) for t in ins}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._count(t, inputs)
        self.peak = max(self.peak, self.live)
        return out


class ActivationMeter:
    """The peak bytes of activations while active (a context manager around forward and
    backward of a micro-batch or pipeline call).

    Activations are what forward creates and keeps alive, saved-for-backward tensors
    above all, whether a block keeps them through the forward or makes them again
    in the backward recompute of activation checkpointing, counted as live storages
    (each once, freed ones leave the count) by torch's memory trackers.
    """

    def __init__(self, parts: list[nn.Module] | None = None, *, pipeline: bool = False):
        """``parts``: the rank's model parts; one FSDP2 part is tracked with FSDPMemTracker,
        which tells FSDP's gathered parameters from activations. ``pipeline``: torch's
        trackers' module hooks cannot follow torch.distributed.pipelining's schedules,
        so a pipeline rank counts with ``LiveActivations``."""
        self.peak = 0
        self.resident_params = 0
        self._parts = parts or []
        self._pipeline = pipeline
        self._tracker = None

    def note_resident_params(self, parts: list[nn.Module]) -> None:
        """Record the parameter bytes held right after a forward (call before backward).

        Under FSDP ZeRO-2 the gathered (unsharded) parameters stay until
        backward; under ZeRO-3 they were freed. DDP and TP hold what they always hold.
        """
        held = sum(_nbytes(p) for part in parts for p in part.parameters())
        self.resident_params = max(self.resident_params, held)

    def __enter__(self):
        parts = self._parts
        if self._pipeline:
            self._tracker = LiveActivations()
        elif len(parts) == 1 and isinstance(parts[0], FSDPModule):
            self._tracker = _FSDPTracker(parts[0])
        else:
            self._tracker = _Tracker()
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc):
        tracker, self._tracker = self._tracker, None
        tracker.__exit__(*exc)
        self.peak = max(self.peak, getattr(tracker, "activation_peak", 0))
        self.peak = max(self.peak, getattr(tracker, "peak", 0))
        return False


def memory_report(
    parts,
    optimizers,
    meter: ActivationMeter | None,
    device: torch.device,
    frozen=None,
    *,
    state: dict | None = None,
) -> dict:
    """This rank's measured memory (call after backward, before zero_grad); ``frozen``: the
    objective's frozen modules beside the trained ones by name (a DPO ``reference`` model,
    a ``vae``), the parameters of each this rank holds as ``<name>_bytes``. ``state``: the
    state bytes measured by the strategy itself (a DeepSpeed engine's), else counted here."""
    report = dict(state) if state is not None else state_bytes(parts, optimizers)
    swapped = report.pop("swapped_bytes", None)  # on disk: not in the peak
    for name, module in (frozen or {}).items():
        report[f"{name}_bytes"] = sum(_nbytes(p) for p in module.parameters())
    report["activations_bytes"] = meter.peak if meter else 0
    # Gathered copies held from forward to backward on top of this rank's shards.
    report["gathered_params_bytes"] = max(
        0, (meter.resident_params if meter else 0) - report["params_bytes"]
    )
    report["peak_bytes"] = sum(report.values())
    report["peak_source"] = "state+activations"
    if swapped is not None:
        report["swapped_bytes"] = swapped
    if device.type == "cuda":
        report["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        report["peak_source"] = "cuda.max_memory_allocated"
    return report
