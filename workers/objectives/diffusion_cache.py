"""``diffusion.cache_latents``: each image's VAE posterior (mean and std) and its caption's
text states, computed once per node and memory-mapped from the node cache by every job
that trains on the same images with the same frozen parts.

The entry is keyed, as the node's tokenized data are, by what it was made from: the data
file's SHA-256, each image file's name, size and modification time (an image beside a
jsonl file can change without the file changing), the VAE's and the text encoder's config
hash and weight sizes, the tokenizer's files and the resolution. One process of the node
builds it under a lock while the others wait; the entry appears whole or not at all (a
folder renamed into place). Each image is encoded alone, without gradients; the noise,
the timestep and the posterior's sample are still drawn per step (seeded per image), so a
job trains on exactly the images it would without the cache, and the cached states equal
a batched encoder's within float rounding.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil

import numpy as np
import torch

from workers.data.images import ImageCaptions
from workers.data.items import EachItemCountsOnce
from workers.data.prepare import file_identity
from workers.data.remote import cache_root, cache_roots
from workers.models.diffusers_folder import tokenizer_files
from workers.models.lora import local_fingerprint
from workers.storage.confine import Roots, open_fd, proc_path
from workers.storage.location import stores_for

FORMAT_VERSION = 1
FILES = ("mean.npy", "std.npy", "states.npy")


class LatentCache(EachItemCountsOnce):
    """The cached items of an :class:`ImageCaptions`: item ``i`` is ``("latent", mean,
    std, states)`` (numpy arrays mapped from the node cache); every image counts once."""

    def __init__(self, folder: str):
        roots = cache_roots()
        self.arrays = {}
        for name in FILES:
            fd = open_fd(os.path.join(folder, name), roots)
            try:
                self.arrays[name] = np.load(proc_path(fd), mmap_mode="r")
            finally:
                os.close(fd)

    def __len__(self) -> int:
        return len(self.arrays["mean.npy"])

    def __getitem__(self, index: int):
        a = self.arrays
        return ("latent", a["mean.npy"][index], a["std.npy"][index], a["states.npy"][index])


def _key(spec, images: ImageCaptions, path: str) -> str:
    folder, roots = spec.model.hf, Roots.from_env()
    stats = []
    for row in images.rows:
        if isinstance(row.image, str):
            fd = open_fd(os.path.join(os.path.dirname(row.path), row.image), roots)
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            stats.append([row.image, st.st_size, st.st_mtime_ns])
    tokenizer = hashlib.sha256()
    for name, data in sorted(tokenizer_files(folder, roots).items()):
        tokenizer.update(name.encode() + b"\0" + data + b"\0")
    ident = {
        "v": FORMAT_VERSION,
        "data": file_identity(path, stores_for(spec.stores), section=images.section),
        "images": stats,
        "vae": local_fingerprint(os.path.join(folder, "vae"), roots),
        "text_encoder": local_fingerprint(os.path.join(folder, "text_encoder"), roots),
        "tokenizer": tokenizer.hexdigest(),
        "resolution": images.resolution,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def latent_cache(spec, images: ImageCaptions, path: str) -> LatentCache:
    """The node cache's entry for ``images`` (read from data file ``path``), built first
    when no process of this node has."""
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    key = _key(spec, images, path)
    out = os.path.join(root, f"latents-{key}")
    with open(os.path.join(root, f"latents-{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(out, "done.json")):
            _build(spec, images, out)
    return LatentCache(out)


def _build(spec, images: ImageCaptions, out: str) -> None:
    from workers.models.diffusers_load import load_frozen

    loaded = load_frozen(spec.model.hf)
    tmp = f"{out}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    arrays = None
    with torch.no_grad():
        for i in range(len(images)):
            pixels, ids = images[i]
            posterior = loaded.vae.encode(torch.from_numpy(pixels)[None]).latent_dist
            states = loaded.text_encoder(torch.from_numpy(ids)[None])[0]
            row = (posterior.mean[0], posterior.std[0], states[0])
            if arrays is None:  # shapes known from the first image
                arrays = [
                    np.lib.format.open_memmap(
                        os.path.join(tmp, name), mode="w+", dtype=np.float32,
                        shape=(len(images), *t.shape),
                    )
                    for name, t in zip(FILES, row, strict=True)
                ]  # fmt: skip
            for array, t in zip(arrays, row, strict=True):
                array[i] = t.float().numpy()
    for array in arrays:
        array.flush()
    with open(os.path.join(tmp, "done.json"), "w") as f:
        json.dump({"images": len(images), "v": FORMAT_VERSION}, f)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(out)  # a stale entry without done.json
    os.rename(tmp, out)
