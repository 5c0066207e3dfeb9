"""Per-rank memory, measured the same way under every strategy.

State bytes are the local shards a rank really holds (a DTensor counts its
local tensor only): parameters, gradients, optimizer state. Activations are
the peak bytes of tensors forward creates and keeps during one micro-batch (or
one pipeline call): autograd's saved tensors, and under activation
checkpointing the recomputed ones, counted by torch's MemTracker.
On GPU the CUDA allocator's peak is reported as well; on CPU the peak is
parameters + gradients + optimizer state + activations of one micro-batch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule


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
        which tells FSDP's gathered parameters from activations. ``pipeline``: the
        trackers' module hooks cannot follow torch.distributed.pipelining's backward, so
        a pipeline rank counts the storages autograd saves instead (an upper bound: a
        storage, once saved, stays counted)."""
        self.peak = 0
        self.resident_params = 0
        self._parts = parts or []
        self._pipeline = pipeline
        self._tracker = None
        self._saved: dict[int, int] = {}

    def _pack(self, t: torch.Tensor):
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return t  # a weight saved for backward is state, not an activation
        local = _local(t)
        try:
            key, size = local.untyped_storage().data_ptr(), local.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
            return t
        self._saved.setdefault(key, size)
        self.peak = max(self.peak, sum(self._saved.values()))
        return t

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
            self._tracker = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
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
        self._saved.clear()
        return False


def memory_report(parts, optimizers, meter: ActivationMeter | None, device: torch.device) -> dict:
    """This rank's measured memory (call after backward, before zero_grad)."""
    report = state_bytes(parts, optimizers)
    report["activations_bytes"] = meter.peak if meter else 0
    # Gathered copies held from forward to backward on top of this rank's shards.
    report["gathered_params_bytes"] = max(
        0, (meter.resident_params if meter else 0) - report["params_bytes"]
    )
    report["peak_bytes"] = sum(report.values())
    report["peak_source"] = "state+activations"
    if device.type == "cuda":
        report["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        report["peak_source"] = "cuda.max_memory_allocated"
    return report
