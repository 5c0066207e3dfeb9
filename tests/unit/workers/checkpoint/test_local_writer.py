"""The local-disk DCP writer: DCP's format and fsyncs unchanged, writeback started as it
writes, torch.save's zip CRC skipped only inside its own writes; and a committed local
checkpoint whose files and folders were all fsynced before the commit."""

from __future__ import annotations

import io
import os
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.utils.serialization import config as serialization_config

import workers.checkpoint.local_writer as local_writer
from workers.checkpoint.dcp_io import dcp_writer
from workers.checkpoint.local_writer import LocalCheckpointWriter, WritebackFile
from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.state import ModelAndOptimizer
from workers.storage.location import resolve_storage


def state() -> dict:
    return {
        "w": torch.randn(64, 32),
        "b": torch.arange(10.0),
        "step": torch.tensor(3.0),
        "lr": 0.5,
        "betas": (0.9, 0.99),
        "flag": True,
    }


def test_writeback_starts_every_so_many_bytes_and_the_bytes_are_intact(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(local_writer, "start_writeback", started.append)
    path = tmp_path / "f.bin"
    with open(path, "wb") as raw:
        f = WritebackFile(raw, every=3000)
        for i in range(10):
            assert f.write(bytes([i]) * 1000) == 1000
        assert f.tell() == 10_000 and started == [raw.fileno()] * 3
    assert path.read_bytes() == b"".join(bytes([i]) * 1000 for i in range(10))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_kernel_takes_the_writeback_hint_and_the_bytes_stay(tmp_path):
    """The ctypes binding is right (a wrong signature would be refused with EINVAL), and a
    descriptor the kernel refuses is a False, never an exception."""
    with open(tmp_path / "f.bin", "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        assert local_writer.start_writeback(f.fileno()) is True
    assert (tmp_path / "f.bin").read_bytes() == b"x" * 100_000
    r, w = os.pipe()  # sync_file_range refuses pipes (ESPIPE)
    try:
        assert local_writer.start_writeback(r) is False
    finally:
        os.close(r)
        os.close(w)


def test_dcp_writes_load_back_and_every_file_is_fsynced(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd)))
    saved = state()
    dcp.save(
        saved, storage_writer=LocalCheckpointWriter(tmp_path / "ck", thread_count=2), no_dist=True
    )
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__0_1.distcp"]
    assert len(synced) == len(files)
    loaded = {
        "w": torch.zeros(64, 32),
        "b": torch.zeros(10),
        "step": torch.tensor(0.0),
        "lr": 0.0,
        "betas": (0.0, 0.0),
        "flag": False,
    }
    dcp.load(loaded, storage_reader=FileSystemReader(tmp_path / "ck"), no_dist=True)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value) if torch.is_tensor(value) else loaded[key] == value


def test_the_crc_is_skipped_only_inside_the_writers_own_writes(tmp_path):
    dcp.save(
        state(), storage_writer=LocalCheckpointWriter(tmp_path / "ck", thread_count=1), no_dist=True
    )
    assert serialization_config.save.compute_crc32
    buf = io.BytesIO()
    torch.save(torch.arange(100.0), buf)
    assert zipfile.ZipFile(buf).testzip() is None  # CRCs present and right


def test_dcp_writer_uses_it_on_local_disk(tmp_path):
    writer = dcp_writer(resolve_storage(f"file://{tmp_path}"), str(tmp_path / "ck"), thread_count=3)
    assert isinstance(writer, LocalCheckpointWriter)
    assert writer.sync_files and writer.thread_count == 3


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to name fds")
def test_a_local_commit_fsyncs_every_file_and_folder_first(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))
    )
    manager = CheckpointManager(tmp_path, keep_last=None, rank=0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    info = manager.save(step=7, app_state=ModelAndOptimizer([model], [opt]), extra={})
    staging = Path(synced[0]).parent.parent  # the first fsync is the RNG file's
    final = Path(info.path)
    written = {p.relative_to(final) for p in final.rglob("*") if p.is_file()}
    # .metadata and the manifest are fsynced as *.tmp, then renamed
    fsynced = {
        Path(p.removesuffix(".tmp")).relative_to(staging)
        for p in synced
        if p.startswith(f"{staging}/")
    }
    assert written <= fsynced
    assert {Path("rng")} <= fsynced and str(staging) in synced
    assert synced[-1] == str(tmp_path)  # the rename, after everything else
