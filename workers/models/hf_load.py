"""Load a Hugging Face checkpoint folder (``model.hf``) straight into each rank's shard.

The train loop builds the decoder on the meta device, applies the strategy as for
any model (pipeline split, TP, FSDP), then calls :func:`materialize` and
:func:`load_pretrained` on this rank's parts. Each parameter reads only its local
part: a DTensor's placements give its local shape and global offset, and
``safe_open(...).get_slice(name)[rows, cols]`` reads just that block from the
(memory-mapped) safetensors file, which is opened per tensor so its mapping never
outlives one read. ``wq``/``wk`` (and their biases) are stored in Hugging Face's
RoPE layout, permuted within each head: the block of whole heads covering the
local rows is read, permuted and cut. Under DDP (and in one process) the layout
is the whole model on every rank, so each rank reads it all.

A folder in an object store (``s3://`` / ``gs://``, reached through ``stores``: the
spec's ``stores.s3`` / ``stores.gcs`` options) reads the same blocks by byte
range (:mod:`workers.models.hf_remote`); the slicing and RoPE logic is shared.

Parameters whose names contain ``lora_`` are not in the checkpoint (LoRA adapters
initialise themselves); a peft ``.base_layer`` maps to the plain projection.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from workers.models.config import ModelConfig, get_model_config
from workers.models.hf_config import (
    MAX_CONFIG_BYTES,
    check_layout,
    config_from_hf,
    read_hf_config_text,
)
from workers.models.hf_index import INDEX, MAX_INDEX_BYTES, SINGLE, weight_map
from workers.models.hf_naming import (
    from_hf_tensor,
    hf_rows,
    hf_shape,
    is_rope_permuted,
    to_hf_name,
)
from workers.models.hf_remote import (
    RemoteWeights,
    Stores,
    is_remote,
    model_location,
    read_small,
)
from workers.models.llama import Transformer
from workers.storage.confine import (
    ConfinementError,
    Roots,
    is_file,
    open_fd,
    proc_path,
    read_bounded,
)

log = logging.getLogger(__name__)

# Name components that wrappers (DDP, torch.compile, activation checkpointing, peft)
# insert into parameter names; none is a name of etrain's own modules.
_WRAPPERS = {
    "module",
    "_orig_mod",
    "_checkpoint_wrapped_module",
    "_fsdp_wrapped_module",
    "base_layer",
}


def local_folder(
    root: str,
    *,
    where: str = "model.hf",
    required: str | None = "config.json",
    roots: Roots | None = None,
) -> Path:
    """The local folder ``root`` names (``file://`` stripped), opened beneath ``roots``
    (default: the job's, :meth:`Roots.from_env`); ``ValueError`` naming ``where`` if it is
    an object-store URL, or lacks the ``required`` regular file (or is no folder), and
    :class:`ConfinementError` if it lies outside the job's folders."""
    path = Path(root.removeprefix("file://"))
    if "://" in str(root).removeprefix("file://"):
        raise ValueError(f"{where}: {root!r} is not a local folder (file:// or a path)")
    roots = Roots.from_env() if roots is None else roots
    try:
        os.close(open_fd(str(path), roots, directory=True))
        ok = not required or is_file(str(path / required), roots)
    except (FileNotFoundError, NotADirectoryError):
        ok = False
    except ConfinementError as e:
        raise ConfinementError(f"{where}: {e}") from None
    if not ok:
        raise ValueError(
            f"{where}: {root!r} is not a folder with {required or 'files'}; "
            "name a Hugging Face model folder"
        )
    return path


def hf_config_bytes(root: str, stores: Stores | None = None, roots: Roots | None = None) -> bytes:
    """``config.json`` of the model folder ``root``: local (beneath ``roots``, default the
    job's), or in an object store reached through ``stores`` (a URL -> its StorageLocation)."""
    if is_remote(root):
        return read_small(model_location(root, stores), "config.json", MAX_CONFIG_BYTES)
    folder = local_folder(root, roots=roots)
    return read_bounded(
        str(folder / "config.json"),
        Roots.from_env() if roots is None else roots,
        MAX_CONFIG_BYTES,
        what="model.hf config.json",
    )


def hf_model_config(root: str, stores: Stores | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of the model folder ``root`` (its ``config.json``)."""
    return config_from_hf(read_hf_config_text(hf_config_bytes(root, stores)))


def spec_model_config(spec, stores: Stores | None = None) -> ModelConfig:
    """The job's model shape: its preset's, or (model.hf) its config.json's, checked
    against the job's layout (tp, pipeline stages, seq_len); ``stores`` reaches an
    object-store model.hf."""
    if spec.model.hf is None:
        return get_model_config(spec.model.preset)
    cfg = hf_model_config(spec.model.hf, stores)
    par = spec.parallelism
    stages = par.pp * (2 if par.pipeline.schedule == "interleaved_1f1b" else 1)
    check_layout(
        cfg,
        tp=par.tp,
        stages=stages if par.pp > 1 else 1,
        seq_len=spec.data.seq_len,
        where="model.hf",
    )
    return cfg


def weight_files(root: str, roots: Roots | None = None) -> dict[str, str]:
    """Hugging Face tensor name -> the safetensors file holding it (single or sharded), as
    a path in ``root``. The index is read bounded and beneath ``roots`` (default: the
    job's); every file it names must be a relative name inside the folder."""
    roots = Roots.from_env() if roots is None else roots
    folder = local_folder(root, roots=roots)
    if is_file(str(folder / INDEX), roots):
        raw = read_bounded(str(folder / INDEX), roots, MAX_INDEX_BYTES, what=f"model.hf {INDEX}")
        return {name: str(folder / file) for name, file in weight_map(raw).items()}
    if is_file(str(folder / SINGLE), roots):
        with _opened_weights(str(folder / SINGLE), roots) as f:
            return {name: str(folder / SINGLE) for name in f.keys()}  # noqa: SIM118 (not a dict)
    raise ValueError(
        f"model.hf: {root!r} has neither {SINGLE} nor {INDEX}; etrain reads safetensors weights"
    )


@contextlib.contextmanager
def _opened_weights(path: str, roots: Roots):
    """safetensors' reader on the file at ``path``, opened beneath ``roots`` (safetensors
    takes a path: it is given the descriptor's, so it maps the file that was checked)."""
    fd = open_fd(path, roots)
    try:
        with safe_open(proc_path(fd), framework="pt") as f:
            yield f
    finally:
        os.close(fd)


class LocalWeights:
    """The safetensors weights of a local folder: each read opens the file beneath the
    job's folders and maps it for one block."""

    bytes_fetched = 0  # memory-mapped, not fetched

    def __init__(self, root: str, roots: Roots | None = None):
        """Index the tensors of the local folder ``root`` (beneath ``roots``)."""
        self.roots = Roots.from_env() if roots is None else roots
        self.files = weight_files(root, self.roots)

    def names(self):
        """Every tensor name the folder holds."""
        return self.files.keys()

    def shape(self, name: str) -> list[int]:
        """The stored shape of tensor ``name``."""
        with _opened_weights(self.files[name], self.roots) as f:
            return list(f.get_slice(name).get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        """``tensor[index]``, read from the mapped file."""
        with _opened_weights(self.files[name], self.roots) as f:
            return f.get_slice(name)[index]


def open_weights(root: str, stores: Stores | None = None) -> LocalWeights | RemoteWeights:
    """The weights of ``root``: a local folder, or an object-store one reached through
    ``stores`` (read by byte range)."""
    if is_remote(root):
        return RemoteWeights(model_location(root, stores))
    return LocalWeights(root)


def _plain_name(name: str) -> str:
    name = name.removeprefix("base_model.model.")
    return ".".join(part for part in name.split(".") if part not in _WRAPPERS)


def materialize(part: nn.Module, *, device: torch.device | str) -> None:
    """Allocate a meta-built (possibly sharded) part on ``device`` and recompute its RoPE table.

    Parameters are left uninitialised: :func:`load_pretrained` fills them.
    """
    part.to_empty(device=device)
    with torch.no_grad():
        for module in part.modules():
            if isinstance(module, Transformer):
                module.reset_rope()


def _local_box(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(local tensor to fill, its shape, its offset in the global tensor)."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements
        )
        return param.to_local(), tuple(shape), tuple(offset)
    return param, tuple(param.shape), (0,) * param.dim()


def _read_block(weights, hf_name: str, fqn: str, shape, offset, cfg: ModelConfig) -> torch.Tensor:
    """Rows/cols ``offset : offset + shape`` of ``fqn`` (in ``hf_name``) in etrain layout."""
    start, stop = offset[0], offset[0] + shape[0]
    permute = is_rope_permuted(fqn)
    if permute:  # read the whole heads covering the rows, permute, cut
        hd = cfg.head_dim
        start, stop = start // hd * hd, math.ceil(stop / hd) * hd
    cols = [slice(o, o + n) for o, n in zip(offset[1:], shape[1:], strict=True)]
    base = hf_rows(fqn, cfg)  # a piece of a fused tensor (Phi-3) starts further down
    block = weights.read(hf_name, (slice(base + start, base + stop), *cols))
    if permute:
        block = from_hf_tensor(fqn, block, cfg)
        block = block[offset[0] - start : offset[0] - start + shape[0]]
    return block


def _source(fqn: str, names, root: str, cfg: ModelConfig) -> str:
    hf_name = to_hf_name(fqn, cfg)
    if hf_name == "lm_head.weight" and hf_name not in names:
        hf_name = "model.embed_tokens.weight"  # tied embeddings load untied
    if hf_name not in names:
        raise ValueError(f"model.hf: {root!r} has no tensor {hf_name!r} (etrain {fqn!r})")
    return hf_name


@torch.no_grad()
def load_pretrained(
    parts: Iterable[nn.Module],
    root: str,
    cfg: ModelConfig,
    *,
    stores: Stores | None = None,
    weights: LocalWeights | RemoteWeights | None = None,
) -> int:
    """Fill every non-LoRA parameter of ``parts`` with its local part of ``root``'s weights.

    ``stores`` (a URL -> its StorageLocation) reaches an object-store ``root``;
    ``weights`` (from :func:`open_weights`) may be given instead. Returns how many
    parameters were loaded. ``ValueError`` (naming model.hf) for a missing tensor
    or a shape that differs from the config's.
    """
    weights = weights or open_weights(root, stores)
    names = weights.names()
    loaded = 0
    for part in parts:
        for name, param in part.named_parameters():
            fqn = _plain_name(name)
            if "lora_" in fqn:
                continue
            hf_name = _source(fqn, names, root, cfg)
            stored, want = weights.shape(hf_name), hf_shape(fqn, list(param.shape), cfg)
            if stored != want:
                raise ValueError(
                    f"model.hf: tensor {hf_name!r} has shape {stored}, config.json says {want}"
                )
            local, shape, offset = _local_box(param)
            if local.numel():
                block = _read_block(weights, hf_name, fqn, shape, offset, cfg)
                local.copy_(block.to(local.dtype))
            loaded += 1
    if weights.bytes_fetched:
        log.info("model.hf: fetched %d bytes of %s for this rank", weights.bytes_fetched, root)
    return loaded


def load_device(spec, device: torch.device) -> torch.device:
    """Where the parameters live: host memory under FSDP CPU offload, else ``device``."""
    return torch.device("cpu") if spec.parallelism.fsdp.cpu_offload else device


def loads_before_strategy(spec, mesh) -> bool:
    """Whether the whole model is loaded before the strategy (DDP replicas, one process).

    DDP needs real parameters when it wraps (it broadcasts them); every other
    strategy is applied on the meta device and loads each rank's shard after.
    """
    return mesh is None or spec.parallelism.strategy == "ddp"
