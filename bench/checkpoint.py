"""Checkpoint cost: synchronous save against the disk's raw write speed, asynchronous
blocking against a synchronous save, and restore time.

One process, no process group: a Llama-style model of about 23 M parameters with
AdamW state after one step (about 275 MB: fp32 weights and two moments) goes
through etrain's own ``CheckpointManager`` (DCP shards, manifest, rename) and
``AsyncSaver`` (DCP ``async_save``: staging copy, then a background write), as
the train loop uses them. Per repeat, in this order:

* raw: the same number of bytes written sequentially to one file (8 MiB
  chunks, then fsync), the disk's speed in this run;
* sync: ``CheckpointManager.save`` (DCP writes and fsyncs each file);
* async: ``AsyncSaver.start`` (what blocks training) and the time until the
  commit, with a training-sized matmul loop running meanwhile;
* restore: ``CheckpointManager.load`` into a fresh model and optimizer.

The same runs go to a loopback S3 endpoint (moto's server in its own process;
slower than memory, as real object storage is), except the raw-disk baseline.
Medians over ``--repeats``; the disk numbers here are noisy.

    .venv/bin/python bench/checkpoint.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.async_checkpoint import AsyncSaver  # noqa: E402
from workers.checkpoint import CheckpointManager, ModelAndOptimizer  # noqa: E402
from workers.models.config import ModelConfig, count_params  # noqa: E402
from workers.models.llama import build_model  # noqa: E402
from workers.storage import resolve_storage  # noqa: E402

CONFIG = ModelConfig(vocab_size=16000, dim=384, n_layers=6, n_heads=6, n_kv_heads=6,
                     ffn_hidden=1024, max_seq_len=128)


def build_state() -> ModelAndOptimizer:
    """The model and AdamW after one step, so both moments exist."""
    model = build_model(CONFIG, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x = torch.randint(0, CONFIG.vocab_size, (2, 32))
    model(x).float().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return ModelAndOptimizer([model], [opt])


def raw_write_s(path: Path, nbytes: int) -> float:
    """Seconds to write ``nbytes`` sequentially to one file and fsync it."""
    chunk = os.urandom(8 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    path.unlink()
    return elapsed


def busy_until(done) -> int:
    """Stand-in for training while an async save runs: matmuls until ``done()``."""
    a, n = torch.randn(256, 256), 0
    while not done():
        a = torch.tanh(a @ a)
        n += 1
    return n


class S3Endpoint:
    """moto's S3 server as a child process on a free loopback port, with one bucket."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")),
                                      "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
        deadline = time.monotonic() + 60
        while True:
            try:
                import boto3

                boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(
                    Bucket="bench")
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def location(self):
        """A fresh prefix in the bucket."""
        return resolve_storage(f"s3://bench/{uuid.uuid4().hex[:8]}", endpoint_url=self.url,
                               region="us-east-1")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def one_repeat(work: Path, state: ModelAndOptimizer, step: int, *, s3: S3Endpoint | None) -> dict:
    """Raw, sync, async and restore timings for one repeat (S3 when ``s3`` is given)."""
    root = s3.location() if s3 else work / "ckpt"
    manager = CheckpointManager(root, keep_last=1, rank=0)
    t0 = time.perf_counter()
    info = manager.save(step=step, app_state=state, extra={})
    sync_s = time.perf_counter() - t0
    raw_s = float("nan") if s3 else raw_write_s(work / "raw.bin", info.bytes)
    saver = AsyncSaver(manager)
    t0 = time.perf_counter()
    saver.start(step=step + 1, app_state=state, extra={}, loss=0.0)
    blocking_s = saver.inflight.blocking_s
    busy_until(saver.written_here)
    outcome = saver.finish()
    total_s = time.perf_counter() - t0
    assert outcome.info is not None, outcome.error
    fresh = build_state()
    t0 = time.perf_counter()
    manager.load(outcome.info, app_state=fresh)
    restore_s = time.perf_counter() - t0
    return {"bytes": info.bytes, "raw_s": raw_s, "sync_s": sync_s, "async_block_s": blocking_s,
            "async_total_s": total_s, "restore_s": restore_s}


def print_table(runs: list[dict], where: str) -> None:
    """Medians and the two ratios the issue asks for."""
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    mb = med["bytes"] / 1e6
    print(f"\n{where}, {mb:.0f} MB of state ({count_params(CONFIG) / 1e6:.1f} M params, "
          f"AdamW), median of {len(runs)}\n")
    print(f"{'measurement':<44}{'seconds':>9}{'MB/s':>9}")
    for label, key in [("raw sequential write (baseline)", "raw_s"),
                       ("synchronous save (DCP + commit)", "sync_s"),
                       ("asynchronous save: training blocked", "async_block_s"),
                       ("asynchronous save: until committed", "async_total_s"),
                       ("restore (DCP load)", "restore_s")]:
        if med[key] == med[key]:  # not NaN
            print(f"{label:<44}{med[key]:>9.3f}{mb / med[key]:>9.0f}")
    if med["raw_s"] == med["raw_s"]:
        print(f"\n(a) sync save speed / raw write speed   = {med['raw_s'] / med['sync_s']:.2f}"
              "   (target >= 0.7)")
    target = "target <= 0.1" if where.startswith("S3") else "local disk: report only"
    print(f"(b) async blocking / sync save time     = "
          f"{med['async_block_s'] / med['sync_s']:.2f}   ({target})")


def main(argv: list[str] | None = None) -> int:
    """Run the repeats in a temporary folder on the disk under test."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="folder on the disk to measure")
    p.add_argument("--targets", default="local,s3")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="etrain-bench-ckpt-", dir=args.dir))
    state = build_state()
    targets = args.targets.split(",")
    s3 = S3Endpoint() if "s3" in targets else None
    runs: dict[str, list[dict]] = {t: [] for t in targets}
    try:
        for r in range(args.repeats):
            for t in targets:
                runs[t].append(one_repeat(work, state, step=10 * (r + 1),
                                          s3=s3 if t == "s3" else None))
                print(f"{t} repeat {r + 1}: " + ", ".join(
                    f"{k} {v:.3f}" for k, v in runs[t][-1].items() if k != "bytes"), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if s3 is not None:
            s3.stop()
    for t in targets:
        print_table(runs[t], "local disk" if t == "local" else "S3 on loopback (moto server)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
