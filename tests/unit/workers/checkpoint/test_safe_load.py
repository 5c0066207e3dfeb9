"""Restoring a checkpoint runs no code from it (item 6): DCP's pickled ``.metadata``, the
non-tensor values and the RNG files are loaded without executing what a crafted file
names, while checkpoints etrain wrote restore exactly."""

from __future__ import annotations

import io
import os
import pickle
import warnings

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import CheckpointException

from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.safe_load import SafeLoadPlanner, UnsafeCheckpoint, load_metadata
from workers.checkpoint.state import ModelAndOptimizer


class _Payload:
    """Unpickling this creates the folder ``marker``: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _state(seed: int):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _saved(tmp_path):
    model, opt = _state(0)
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=None, rank=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        info = manager.save(step=3, app_state=ModelAndOptimizer([model], [opt]), extra={"k": 1})
    return manager, info, model, opt


def test_a_checkpoint_etrain_wrote_restores_exactly(tmp_path):
    manager, info, model, opt = _saved(tmp_path)
    rng_after_save = torch.get_rng_state()
    other, other_opt = _state(1)
    torch.manual_seed(99)
    assert manager.load(info, app_state=ModelAndOptimizer([other], [other_opt])) == {"k": 1}
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.state_dict()["param_groups"][0]["lr"] == 1e-3
    assert torch.equal(
        other_opt.state_dict()["state"][0]["exp_avg"], opt.state[model.weight]["exp_avg"]
    )
    # The RNG file (written before the save consumed nothing) brings the generator back.
    assert torch.equal(torch.get_rng_state(), rng_after_save)


def test_crafted_metadata_is_refused_without_running_it(tmp_path):
    manager, info, model, opt = _saved(tmp_path)
    marker = tmp_path / "pwned-metadata"
    with open(os.path.join(info.path, ".metadata"), "wb") as f:
        pickle.dump(_Payload(marker), f)
    with pytest.raises(CheckpointException) as err:
        manager.load(info, app_state=ModelAndOptimizer([model], [opt]))
    (failure,) = err.value.failures.values()
    assert "refers to posix.mkdir, which is not part of DCP metadata" in str(failure)
    assert not marker.exists()


def test_metadata_of_another_type_is_refused():
    with pytest.raises(UnsafeCheckpoint, match="not DCP Metadata"):
        load_metadata(io.BytesIO(pickle.dumps({"a": 1})))


def test_a_crafted_rng_file_is_refused_without_running_it(tmp_path):
    manager, info, model, opt = _saved(tmp_path)
    marker = tmp_path / "pwned-rng"
    torch.save({"cpu": _Payload(marker)}, os.path.join(info.path, "rng", "rank_0.pt"))
    with pytest.raises(pickle.UnpicklingError):
        manager.load(info, app_state=ModelAndOptimizer([model], [opt]))
    assert not marker.exists()


def test_non_tensor_values_load_without_running_code(tmp_path):
    marker = tmp_path / "pwned-bytes"
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    buf.seek(0)
    planner = SafeLoadPlanner()
    planner.flatten_state_dict = False
    planner.state_dict = {}

    class Item:  # the one field load_bytes reads
        class dest_index:  # noqa: N801
            fqn = "x"

    with pytest.raises(pickle.UnpicklingError):
        planner.load_bytes(Item, buf)
    assert not marker.exists()
    ok = io.BytesIO()
    torch.save({"lr": 0.1, "betas": (0.9, 0.95)}, ok)
    ok.seek(0)
    planner.load_bytes(Item, ok)
    assert planner.state_dict["x"] == {"lr": 0.1, "betas": (0.9, 0.95)}
