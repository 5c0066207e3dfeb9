"""Sharded checkpoints with torch.distributed.checkpoint and an etrain commit protocol.

Layout under the job's run directory (``<storage>/<job id>/checkpoints``), on
local disk::

    step_00000020/                committed: DCP shards + .metadata + rng/ + manifest.json
    step_00000030.partial-ab12cd34/   being written (or abandoned by a crash): never loaded

and on an object store (``s3://``, ``gs://``), which has no rename::

    step_00000020.ab12cd34/       committed once manifest.json exists; never before

Every rank writes its shards into the attempt's folder; DCP's save ends with a
collective after which the coordinator has written ``.metadata``; rank 0 then
writes ``manifest.json`` (one atomic object, or a fsynced file) and, on local
disk, renames the folder to its final name. A checkpoint is listed and loaded
only if it holds a manifest, so a crash or a store outage mid-save leaves
nothing loadable behind. Restores always go through :meth:`CheckpointManager.latest`.

Retention is decided here and only here: after each commit rank 0 deletes the
committed checkpoints :func:`~workers.checkpoint.retention.retained_steps` does
not keep, and the commit's :class:`CheckpointInfo` lists them (``pruned``), so
the control plane is told what was deleted instead of working it out again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from workers.checkpoint.dcp_io import dcp_reader, dcp_writer
from workers.checkpoint.retention import retained_steps
from workers.checkpoint.safe_load import SafeLoadPlanner, load_tensors
from workers.checkpoint.state import rng_state, set_rng_state
from workers.storage.confine import Roots, check_folder
from workers.storage.location import StorageLocation, resolve_storage

_STEP_DIR = re.compile(r"^step_(\d{8})(?:\.([0-9a-f]{8}))?$")  # final, or an object-store attempt
MANIFEST = "manifest.json"
WRITER_THREADS = 4  # object stores: parallel uploads


def local_writer_threads() -> int:
    """Writer threads for local disk: one per core this process may use, at most
    ``WRITER_THREADS``. Serializing is what a local save waits for, and threads beyond
    the cores only contend (on 2 cores a 276 MB save took 0.27 s with two threads,
    0.31 s with four; median of 14, bench/checkpoint.py's model)."""
    return max(1, min(WRITER_THREADS, len(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint; ``path`` as the store's file system sees it."""

    step: int
    path: str
    bytes: int
    save_s: float
    extra: dict
    uri: str = ""  # the full URI (file://, s3://, gs://)
    committed_at: float = 0.0
    pruned: tuple[int, ...] = ()  # committed steps the retention rule deleted after this commit


def _as_location(root) -> StorageLocation:
    """A StorageLocation as is; a plain local path (tests, tools) as a file:// one."""
    if isinstance(root, StorageLocation):
        return root
    return resolve_storage(f"file://{os.path.abspath(os.fspath(root))}")


class CheckpointManager:
    """Save, list, load and prune committed checkpoints of one job run.

    Every rank constructs one with the same ``root`` (a :class:`StorageLocation`,
    or a local path); ``save``, ``begin``, ``commit`` and ``load`` are collective
    (all ranks call them in the same order).
    """

    def __init__(
        self,
        root: StorageLocation | str | os.PathLike,
        *,
        keep_last: int | None,
        rank: int,
        keep_every: int | None = None,
        keep_best: int | None = None,
    ):
        """``keep_last``, ``keep_every`` and ``keep_best`` are the job's retention rule
        (:func:`retained_steps`; the held-out loss ``keep_best`` ranks by is the manifest's
        ``extra["eval_loss"]``); ``keep_last=None`` keeps every committed checkpoint (tools
        that only read or list them)."""
        self.loc = _as_location(root)
        self.fs, self.local = self.loc.fs, self.loc.scheme == "file"
        # A local folder is checked beneath the job's write roots at each list, save and
        # load: one swapped for a link (to another job's checkpoints) is refused then.
        self.roots = Roots.from_env()
        self.keep_last, self.keep_every, self.keep_best = keep_last, keep_every, keep_best
        self.rank = rank
        self.commit_error: str | None = None  # why rank 0's last commit failed, if it did

    @property
    def root(self) -> str:
        """The checkpoints folder as the store's file system sees it."""
        return self.loc.root

    def _confined(self, *, create: bool = False) -> None:
        """Refuse a local checkpoint folder that is not beneath the job's write roots or has
        a link in its path (made there when ``create``)."""
        if self.local:
            try:
                check_folder(self.root, self.roots, write=True, create=create)
            except FileNotFoundError:
                if create:
                    raise

    def _names(self) -> list[str]:
        self._confined()
        try:
            return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []

    def committed(self, names: list[str] | None = None) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first (the newest commit of a step wins);
        ``names`` is a listing of the folder already made (one round trip to a store)."""
        by_step: dict[int, CheckpointInfo] = {}
        for name in self._names() if names is None else names:
            m = _STEP_DIR.match(name)
            if not m or bool(m.group(2)) == self.local:
                continue  # local disk commits by renaming to step_N; object stores never rename
            path = self.loc.join(name)
            try:
                data = json.loads(self.fs.cat_file(posixpath.join(path, MANIFEST)))
            except FileNotFoundError:
                continue  # not committed
            info = CheckpointInfo(
                step=int(m.group(1)),
                path=path,
                bytes=data["bytes"],
                save_s=data["save_s"],
                extra=data["extra"],
                uri=self.loc.uri_of(name),
                committed_at=data.get("committed_at", 0.0),
            )
            if info.step not in by_step or info.committed_at > by_step[info.step].committed_at:
                by_step[info.step] = info
        return [by_step[k] for k in sorted(by_step)]

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
        staging = self.begin(step)
        # DCP's save finishes with a collective after the coordinator wrote
        # .metadata, so when it returns every rank's shards are stored.
        dcp.save({"app": app_state}, storage_writer=self.writer(staging))
        return self.commit(staging, step=step, extra=extra, save_s=time.perf_counter() - t0)

    def writer(self, staging: str):
        """The DCP storage writer for an attempt folder (streams to object stores).

        On object stores the threads are parallel uploads; on local disk the
        writer starts writeback as it serializes (``workers.checkpoint.local_writer``).
        """
        threads = local_writer_threads() if self.local else WRITER_THREADS
        return dcp_writer(self.loc, staging, thread_count=threads)

    def begin(self, step: int) -> str:
        """Collective: a fresh attempt folder for ``step`` (named by rank 0), with this rank's
        RNG."""
        tag = uuid.uuid4().hex[:8]
        box = [f"step_{step:08d}.partial-{tag}" if self.local else f"step_{step:08d}.{tag}"]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        staging = self.loc.join(box[0])
        self._confined(create=True)
        self.fs.makedirs(posixpath.join(staging, "rng"), exist_ok=True)
        with self.fs.open(posixpath.join(staging, "rng", f"rank_{self.rank}.pt"), "wb") as f:
            torch.save(rng_state(), f)
            if self.local:  # part of the checkpoint: durable before the commit, as the shards
                f.flush()
                os.fsync(f.fileno())
        return staging

    def commit(
        self, staging: str, *, step: int, extra: dict, save_s: float, ok: bool = True
    ) -> CheckpointInfo | None:
        """Collective, once every rank's shards are written: rank 0 commits (unless a rank
        failed, ``ok`` False anywhere) and prunes; every rank gets the committed info,
        whose ``pruned`` lists the committed steps the retention rule deleted."""
        if dist.is_initialized():
            vote = torch.tensor([0.0 if ok else 1.0])
            dist.all_reduce(vote)
            ok = bool(vote.item() == 0)
        info, self.commit_error = None, None
        if self.rank == 0 and ok:
            try:
                info = self._commit(staging, step=step, extra=extra, save_s=save_s)
            except OSError as e:  # the store failed the manifest: nothing became visible
                self.commit_error = f"commit failed: {type(e).__name__}: {e}"
            if info is not None:
                info = dataclasses.replace(info, pruned=self._prune())
        box2 = [info]
        if dist.is_initialized():
            dist.broadcast_object_list(box2, src=0)
        return box2[0]

    def _commit(self, staging: str, *, step: int, extra: dict, save_s: float) -> CheckpointInfo:
        self._confined()
        nbytes = int(self.fs.du(staging, total=True))
        manifest = {
            "step": step,
            "bytes": nbytes,
            "save_s": save_s,
            "extra": extra,
            "committed_at": time.time(),
        }
        if not self.local:
            # One PUT of one object: visible whole or not at all.
            self.fs.pipe_file(posixpath.join(staging, MANIFEST), json.dumps(manifest).encode())
            name = posixpath.basename(staging)
        else:
            name = self._commit_local(Path(staging), manifest, step=step)
        return CheckpointInfo(
            step=step,
            path=self.loc.join(name),
            bytes=nbytes,
            save_s=save_s,
            extra=extra,
            uri=self.loc.uri_of(name),
            committed_at=manifest["committed_at"],
        )

    def _commit_local(self, staging: Path, manifest: dict, *, step: int) -> str:
        # Every file was fsynced by its writer; their names are durable only once
        # their folders are, which must happen before the manifest can be.
        _fsync_dir(staging / "rng")
        _fsync_dir(staging)
        tmp = staging / (MANIFEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, staging / MANIFEST)
        _fsync_dir(staging)
        final = staging.parent / f"step_{step:08d}"
        if final.exists():
            # The same step saved again (a recomputed step after a restore): the
            # new save replaces the old one, which is moved aside before the rename.
            trash = staging.parent / f".trash-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging, final)
        _fsync_dir(staging.parent)  # the rename is the commit
        return final.name

    def _prune(self) -> tuple[int, ...]:
        """Drop committed checkpoints the retention rule does not keep, superseded attempts
        of a step, and abandoned attempts older than the newest commit; return the steps of
        the committed checkpoints deleted (a failed delete is retried at the next commit)."""
        names = self._names()
        done = self.committed(names)
        keep = retained_steps(
            [c.step for c in done],
            keep_last=self.keep_last,
            keep_every=self.keep_every,
            keep_best=self.keep_best,
            losses={c.step: c.extra.get("eval_loss") for c in done},
        )
        kept_paths = {c.path for c in done if c.step in keep}
        newest = done[-1].step if done else -1
        deleted = []
        for name in names:
            m = re.match(r"^step_(\d{8})", name)
            path = self.loc.join(name)
            if not m or path in kept_paths:
                continue
            committed = any(c.path == path for c in done)
            if committed or int(m.group(1)) <= newest:
                try:
                    self.fs.rm(path, recursive=True)
                except OSError:  # retried at the next commit; never worth a failed save
                    continue
                if committed:
                    deleted.append(int(m.group(1)))
        return tuple(sorted(deleted))

    def load(self, info: CheckpointInfo, *, app_state: Stateful) -> dict:
        """Load ``info`` into ``app_state`` (resharding to this layout); return its extra.

        Each rank plans its own reads (``no_dist``): DCP's default load planning
        has no global step (its global plan is the local plans unchanged), so the
        two object collectives it would run cost a restarted group 0.4-1 s for
        nothing. Resharding still comes from each rank's own DTensor layout.
        """
        self._confined()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                {"app": app_state},
                storage_reader=dcp_reader(self.loc, info.path),
                planner=SafeLoadPlanner(),
                no_dist=True,
            )
        rng_file = posixpath.join(info.path, "rng", f"rank_{self.rank}.pt")
        if self.fs.exists(rng_file):
            with self.fs.open(rng_file, "rb") as f:
                set_rng_state(load_tensors(f))  # a dict of tensors: no code runs
        return info.extra


def _fsync_dir(path: Path) -> None:
    """Make the entries of the folder ``path`` (names created, renamed) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
