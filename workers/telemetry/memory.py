"""Per-rank memory, measured the same way under every strategy.

State bytes are the local shards a rank really holds (a DTensor counts its
local tensor only): parameters, gradients, optimizer state. Activations are
the bytes autograd saves for backward during one micro-batch (or one pipeline
call), counted through saved-tensor hooks with each storage counted once.
On GPU the CUDA allocator's peak is reported as well; on CPU the peak is
parameters + gradients + optimizer state + activations of one micro-batch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor


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


class ActivationMeter:
    """Counts the peak bytes autograd saves for backward while active (a context manager)."""

    def __init__(self):
        self.peak = 0
        self.resident_params = 0
        self._live: dict[int, int] = {}
        self._hooks = None

    def _pack(self, t: torch.Tensor):
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            # A weight (or its transpose) saved for backward is state: params_bytes,
            # or gathered_params_bytes for FSDP's unsharded copies.
            return t
        local = _local(t) if isinstance(t, DTensor) else t
        try:
            key, size = local.untyped_storage().data_ptr(), local.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
            return t
        self._live.setdefault(key, size)
        self.peak = max(self.peak, sum(self._live.values()))
        return t

    def note_resident_params(self, parts: list[nn.Module]) -> None:
        """Record the parameter bytes held right after a forward (call before backward).

        Under FSDP ZeRO-2 the gathered (unsharded) parameters stay until
        backward; under ZeRO-3 they were freed. DDP and TP hold what they always hold.
        """
        held = sum(_nbytes(p) for part in parts for p in part.parameters())
        self.resident_params = max(self.resident_params, held)

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._live.clear()
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
