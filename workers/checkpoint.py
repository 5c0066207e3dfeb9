"""Sharded checkpoints with torch.distributed.checkpoint and an etrain commit protocol.

Layout under the job's run directory (``<storage>/<job id>/checkpoints``)::

    step_00000020/            committed: DCP shards + .metadata + rng/ + manifest.json
    step_00000030.partial-ab12/   being written (or abandoned by a crash): never loaded

Every rank writes its shards into a staging folder; DCP's save ends with a
collective after which the coordinator has written ``.metadata``; rank 0 then
writes ``manifest.json`` and renames the folder to its final name. The rename
is the commit: a checkpoint is listed and loaded only if its final folder
exists and holds a manifest. Ray Train's own checkpoint registration lags the
newest save, so restores always go through :meth:`CheckpointManager.latest`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

_STEP_DIR = re.compile(r"^step_(\d{8})$")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint."""

    step: int
    path: str
    bytes: int
    save_s: float
    extra: dict


class ModelAndOptimizer(Stateful):
    """DCP app state: model parts and their optimizers under strategy-independent names.

    ``get_state_dict`` strips wrapper prefixes (DDP's ``module.``, FSDP's) and,
    with flattened optimizer state, keys every optimizer tensor by parameter
    FQN. Each rank contributes the keys of the parts it holds (one part, or
    its pipeline stages), which is what lets a checkpoint saved under one
    layout load under another.
    """

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]):
        self.parts, self.optimizers = parts, optimizers

    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state of every local part, keyed by parameter FQN."""
        model, optim = {}, {}
        for part, opt in zip(self.parts, self.optimizers):
            msd, osd = get_state_dict(part, opt, options=self._OPTIONS)
            model.update(msd)
            optim.update(osd)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` produced (resharded to this layout by DCP)."""
        for part, opt in zip(self.parts, self.optimizers):
            set_state_dict(part, opt, model_state_dict=state_dict["model"],
                           optim_state_dict=state_dict["optim"],
                           options=StateDictOptions(flatten_optimizer_state_dict=True,
                                                    strict=len(self.parts) == 1))


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class CheckpointManager:
    """Save, list, load and prune committed checkpoints of one job run.

    Every rank constructs one with the same ``root``; ``save`` and ``load`` are
    collective (all ranks call them in the same order).
    """

    def __init__(self, root: str | os.PathLike, *, keep_last: int | None, rank: int):
        """``keep_last=None`` leaves committed checkpoints to Ray Train's retention.

        Under Ray every checkpoint is registered with Ray Train, whose run
        snapshot must never name a deleted folder (a resubmitted job reloads
        it), so Ray Train deletes them itself (``CheckpointConfig.num_to_keep``).
        """
        self.root = Path(root)
        self.keep_last = keep_last
        self.rank = rank

    def committed(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first. Partial folders are ignored."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            m = _STEP_DIR.match(entry.name)
            manifest = entry / MANIFEST
            if m and manifest.is_file():
                data = json.loads(manifest.read_text())
                found.append(CheckpointInfo(
                    step=int(m.group(1)), path=str(entry), bytes=data["bytes"],
                    save_s=data["save_s"], extra=data["extra"],
                ))
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> CheckpointInfo | None:
        """The newest committed checkpoint, agreed on by all ranks (rank 0 decides)."""
        mine = self.committed()[-1:] if self.rank == 0 else []
        box = [mine[0] if mine else None]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        return box[0]

    def save(self, *, step: int, app_state: Stateful, extra: dict) -> CheckpointInfo:
        """Write a checkpoint of ``step`` and commit it; returns what was committed.

        ``extra`` (scheduler state, sampler cursor, ...) must be JSON-serialisable:
        it goes into the manifest and is identical on every rank.
        """
        t0 = time.perf_counter()
        box = [f"step_{step:08d}.partial-{uuid.uuid4().hex[:8]}"]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        staging = self.root / box[0]
        (staging / "rng").mkdir(parents=True, exist_ok=True)
        torch.save(_rng_state(), staging / "rng" / f"rank_{self.rank}.pt")
        # DCP's save finishes with a collective after the coordinator wrote
        # .metadata, so when it returns every rank's shards are on disk.
        dcp.save({"app": app_state}, checkpoint_id=str(staging))
        info = None
        if self.rank == 0:
            info = self._commit(staging, step=step, extra=extra, save_s=time.perf_counter() - t0)
            self._prune()
        box2 = [info]
        if dist.is_initialized():
            dist.broadcast_object_list(box2, src=0)
        return box2[0]

    def _commit(self, staging: Path, *, step: int, extra: dict, save_s: float) -> CheckpointInfo:
        nbytes = _dir_bytes(staging)
        manifest = {"step": step, "bytes": nbytes, "save_s": save_s, "extra": extra,
                    "committed_at": time.time()}
        tmp = staging / (MANIFEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, staging / MANIFEST)
        final = self.root / f"step_{step:08d}"
        if final.exists():
            # The same step saved again (a recomputed step after a restore): the
            # new save replaces the old one, which is moved aside before the rename.
            trash = self.root / f".trash-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging, final)
        return CheckpointInfo(step=step, path=str(final), bytes=nbytes, save_s=save_s, extra=extra)

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` committed checkpoints; drop stale partial folders."""
        done = self.committed()
        for old in (done[: max(0, len(done) - self.keep_last)] if self.keep_last else []):
            shutil.rmtree(old.path, ignore_errors=True)
        newest = done[-1].step if done else -1
        for entry in self.root.iterdir():
            if ".partial-" in entry.name and int(entry.name[5:13]) <= newest:
                shutil.rmtree(entry, ignore_errors=True)

    def load(self, info: CheckpointInfo, *, app_state: Stateful) -> dict:
        """Load ``info`` into ``app_state`` (resharding to this layout); return its extra."""
        dcp.load({"app": app_state}, checkpoint_id=info.path)
        rng_file = Path(info.path) / "rng" / f"rank_{self.rank}.pt"
        if rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=False))
        return info.extra


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
