"""A DeepSpeed job's checkpoint state, in the layout-independent names every strategy
writes.

Checkpoints go through etrain's DCP machinery (manifest commit, retention, async saves,
object stores) like any other: :class:`DeepSpeedState` gives DCP full fp32 parameters
and optimizer state by parameter name, read with DeepSpeed's ``safe_get_full_*`` and
written back with ``safe_set_full_*``. DeepSpeed's own checkpoint files (and their
offline conversion to its universal format) are not used: this keeps the exact
optimizer state with no conversion step, so a DeepSpeed checkpoint resumes bit for bit
at its size, at another size, and under FSDP or DDP (and theirs under DeepSpeed), and
``etrain export`` reads it as any other job's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from workers.checkpoint.state import ModelAndOptimizer


def app_state(engine) -> Stateful:
    """The checkpoint state of a DeepSpeed job (:class:`DeepSpeedState`; at stage 0 the
    engine's optimizer is the torch one itself, and torch's own state dict serves)."""
    if engine.zero_optimization_stage() == 0:
        return ModelAndOptimizer([engine.module], [engine.optimizer])
    return DeepSpeedState(engine)


class DeepSpeedState(Stateful):
    """DCP state of a ZeRO engine under the names :class:`ModelAndOptimizer` writes:
    ``model.<fqn>`` and the flattened ``optim.state.<fqn>.<key>`` and
    ``optim.param_groups.<fqn>.<key>``, each a full tensor (the same on every rank: DCP
    writes it once). Gathering is a collective at stage 3: every rank calls both methods,
    as DCP does."""

    def __init__(self, engine):
        self.engine = engine
        self.zero = engine.optimizer  # DeepSpeed's ZeRO optimizer
        self.inner = engine.optimizer.optimizer  # the job's torch optimizer
        module = engine.module
        self.params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        kept = _persistent(module)
        self.buffers = [(n, b) for n, b in module.named_buffers() if n in kept]

    def _keys(self) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The torch optimizer's per-parameter state keys, and its scalar state (``step``)."""
        _materialize(self.zero)
        states = [s for s in self.inner.state.values() if s]
        if not states:
            return [], {}
        first = states[0]
        tensors = [k for k, v in first.items() if torch.is_tensor(v) and v.dim() > 0]
        scalars = {k: v for k, v in first.items() if k not in tensors and v is not None}
        return tensors, scalars

    def _groups(self) -> dict[str, Any]:
        group = self.inner.param_groups[0]
        return {k: v for k, v in group.items() if k != "params"}

    def state_dict(self) -> dict[str, Any]:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        tensors, scalars = self._keys()
        model = {n: b.detach().clone() for n, b in self.buffers}
        optim: dict[str, Any] = {}
        groups = self._groups()
        for name, p in self.params:
            model[name] = safe_get_full_fp32_param(p).detach().cpu()
            for key in tensors:
                full = safe_get_full_optimizer_state(p, key)
                optim[f"state.{name}.{key}"] = full.detach().cpu()
            for key, value in scalars.items():
                optim[f"state.{name}.{key}"] = _clone(value)
            for key, value in groups.items():
                optim[f"param_groups.{name}.{key}"] = value
        return {"model": model, "optim": optim}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        model, optim = state_dict["model"], state_dict["optim"]
        tensors, scalars = self._keys()
        self._set_module_weights(model)
        for name, buf in self.buffers:
            buf.data.copy_(model[name])
        for name, p in self.params:
            _set_master(p, model[name].to(torch.float32))
            for key in tensors:
                _set_master(p, optim[f"state.{name}.{key}"], key)
        first = self.params[0][0] if self.params else None
        for state in self.inner.state.values():
            for key in scalars:
                value = optim[f"state.{first}.{key}"]
                state[key] = value.clone() if torch.is_tensor(value) else value
        for group in self.inner.param_groups:
            for key in self._groups():
                group[key] = optim[f"param_groups.{first}.{key}"]

    def _set_module_weights(self, model: dict[str, Any]) -> None:
        """The module's own copy of each parameter (what the next forward reads), set on
        this rank alone: whole at stages 1 and 2; at stage 3 this rank's partition of it
        (and the whole of one kept gathered). Every rank read the full values, so nothing
        is gathered or broadcast."""
        with torch.no_grad():
            for name, p in self.params:
                _set_local(p, model[name].to(p.dtype))


def _piece(p: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ZeRO-3 parameter ``p``'s ``full`` value, as DeepSpeed's
    ``_partition_param`` cuts it: ceil(numel / ranks) elements from rank x that size, the
    last rank's padded with zeros."""
    size = p.ds_tensor.ds_numel
    start = size * torch.distributed.get_rank(group=p.ds_process_group)
    flat = full.reshape(-1)[start : start + size]
    return torch.cat([flat, flat.new_zeros(size - flat.numel())]) if flat.numel() < size else flat


def _set_local(p: torch.Tensor, full: torch.Tensor) -> None:
    """Parameter ``p`` (a ZeRO-3 partition or a whole tensor) from its full value."""
    part = getattr(p, "ds_tensor", None)
    if part is None or p.numel() == full.numel():  # whole, or a small one kept gathered
        p.copy_(full)
    if part is not None:
        part.copy_(_piece(p, full))


def _set_master(p: torch.Tensor, full: torch.Tensor, key: str | None = None) -> None:
    """ZeRO's fp32 master copy of ``p`` (``key``: its optimizer state) from the full value.
    At stage 3 this rank's piece goes through DeepSpeed's local setter: its full one
    (``safe_set_full_*``, DeepSpeed 0.19.8) reads past the end of a tensor whose size the
    ranks do not divide (the last, padded piece) and fails on that rank alone."""
    from deepspeed import utils

    if hasattr(p, "ds_tensor"):
        if key is None:
            utils.safe_set_local_fp32_param(p, _piece(p, full))
        else:
            utils.safe_set_local_optimizer_state(p, _piece(p, full), key)
    elif key is None:
        utils.safe_set_full_fp32_param(p, full)
    else:
        utils.safe_set_full_optimizer_state(p, full, key)


def _materialize(zero) -> None:
    """Give the torch optimizer inside ZeRO optimizer ``zero`` its state before its first
    step (a restore fills it in): a step over ZeRO's flat fp32 partitions with zero
    gradients and lr 0, as torch's state-dict code does for a torch optimizer, and the
    state linked to the parameters' fragments as ZeRO does at its first step. A partition
    swapped to NVMe is swapped in for its step and its new state out, as ZeRO's step does."""
    inner = zero.optimizer
    if any(inner.state.values()):
        return
    flats = getattr(zero, "single_partition_of_fp32_groups", None)
    flats = list(flats if flats is not None else zero.fp32_partitioned_groups_flat)
    if len(inner.param_groups) != 1:
        raise ValueError("a DeepSpeed job's optimizer has one parameter group")
    swapped = getattr(zero, "_swappable_optimizer_subgroup", lambda _: False)
    group = inner.param_groups[0]
    params, lr = group["params"], group["lr"]
    for i, flat in enumerate(flats):
        if swapped(i):
            zero._optimizer_states_and_gradient_swap_in(i)
        grad = flat.grad
        try:
            group["params"], group["lr"] = [flat], 0.0
            flat.grad = torch.zeros_like(flat)
            inner.step()
        finally:
            group["params"], group["lr"] = params, lr
            flat.grad = grad
        if swapped(i):
            zero._optimizer_states_and_gradient_swap_out(i)
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):
        zero._lazy_init_hp_params_optimizer_state()


def _persistent(module: nn.Module) -> set[str]:
    """Names of ``module``'s buffers a state dict holds."""
    out = set()
    for prefix, mod in module.named_modules():
        for name in mod._buffers:
            if name not in mod._non_persistent_buffers_set:
                out.add(f"{prefix}.{name}" if prefix else name)
    return out


def _clone(value):
    return value.detach().clone() if torch.is_tensor(value) else value
