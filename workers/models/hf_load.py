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

Parameters whose names contain ``lora_`` are not in the checkpoint (LoRA adapters
initialise themselves); a peft ``.base_layer`` maps to the plain projection.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from workers.models.config import ModelConfig, get_model_config
from workers.models.hf_config import check_layout, config_from_hf, read_hf_config_text
from workers.models.hf_naming import from_hf_tensor, is_rope_permuted, to_hf_name
from workers.models.llama import Transformer

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
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
    root: str, *, where: str = "model.hf", required: str | None = "config.json"
) -> Path:
    """The local folder ``root`` names (``file://`` stripped); ``ValueError`` naming ``where``
    if it is an object-store URL, or lacks the ``required`` file (or is no folder)."""
    path = Path(root.removeprefix("file://"))
    if "://" in str(root).removeprefix("file://"):
        raise ValueError(
            f"{where}: {root!r}: object-store model folders are not readable by the workers "
            "yet; copy the folder to a shared data path and name that"
        )
    if not path.is_dir() or (required and not (path / required).is_file()):
        raise ValueError(
            f"{where}: {root!r} is not a folder with {required or 'files'}; "
            "name a Hugging Face model folder"
        )
    return path


def hf_model_config(root: str) -> ModelConfig:
    """The :class:`ModelConfig` of the model folder ``root`` (its ``config.json``)."""
    text = (local_folder(root) / "config.json").read_bytes()
    return config_from_hf(read_hf_config_text(text))


def spec_model_config(spec) -> ModelConfig:
    """The job's model shape: its preset's, or (model.hf) its config.json's, checked
    against the job's layout (tp, pipeline stages, seq_len)."""
    if spec.model.hf is None:
        return get_model_config(spec.model.preset)
    cfg = hf_model_config(spec.model.hf)
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


def weight_files(root: str) -> dict[str, Path]:
    """Hugging Face tensor name -> the safetensors file holding it (single or sharded)."""
    folder = local_folder(root)
    if (folder / INDEX).is_file():
        index = json.loads((folder / INDEX).read_text())
        return {name: folder / file for name, file in index["weight_map"].items()}
    if (folder / SINGLE).is_file():
        with safe_open(str(folder / SINGLE), framework="pt") as f:
            return {name: folder / SINGLE for name in f.keys()}  # noqa: SIM118 (not a dict)
    raise ValueError(
        f"model.hf: {root!r} has neither {SINGLE} nor {INDEX}; etrain reads safetensors weights"
    )


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
                module.freqs_cis = module._freqs_cis(device=module.freqs_cis.device)


def _local_box(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(local tensor to fill, its shape, its offset in the global tensor)."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements
        )
        return param.to_local(), tuple(shape), tuple(offset)
    return param, tuple(param.shape), (0,) * param.dim()


def _read_block(
    file: Path, hf_name: str, fqn: str, shape, offset, cfg: ModelConfig
) -> torch.Tensor:
    """Rows/cols ``offset : offset + shape`` of ``hf_name`` in etrain layout."""
    start, stop = offset[0], offset[0] + shape[0]
    permute = is_rope_permuted(fqn)
    if permute:  # read the whole heads covering the rows, permute, cut
        hd = cfg.head_dim
        start, stop = start // hd * hd, math.ceil(stop / hd) * hd
    with safe_open(str(file), framework="pt") as f:
        sliced = f.get_slice(hf_name)
        cols = [slice(o, o + n) for o, n in zip(offset[1:], shape[1:], strict=True)]
        index = (slice(start, stop), *cols)
        block = sliced[index]
    if permute:
        block = from_hf_tensor(fqn, block, cfg)
        block = block[offset[0] - start : offset[0] - start + shape[0]]
    return block


def _global_shape(file: Path, hf_name: str) -> list[int]:
    with safe_open(str(file), framework="pt") as f:
        return list(f.get_slice(hf_name).get_shape())


def _source(fqn: str, files: dict[str, Path], root: str) -> tuple[str, Path]:
    hf_name = to_hf_name(fqn)
    if hf_name == "lm_head.weight" and hf_name not in files:
        hf_name = "model.embed_tokens.weight"  # tied embeddings load untied
    if hf_name not in files:
        raise ValueError(f"model.hf: {root!r} has no tensor {hf_name!r} (etrain {fqn!r})")
    return hf_name, files[hf_name]


@torch.no_grad()
def load_pretrained(parts: Iterable[nn.Module], root: str, cfg: ModelConfig) -> int:
    """Fill every non-LoRA parameter of ``parts`` with its local part of ``root``'s weights.

    Returns how many parameters were loaded. ``ValueError`` (naming model.hf) for a
    missing tensor or a shape that differs from the config's.
    """
    files = weight_files(root)
    loaded = 0
    for part in parts:
        for name, param in part.named_parameters():
            fqn = _plain_name(name)
            if "lora_" in fqn:
                continue
            hf_name, file = _source(fqn, files, root)
            if _global_shape(file, hf_name) != list(param.shape):
                raise ValueError(
                    f"model.hf: tensor {hf_name!r} has shape {_global_shape(file, hf_name)}, "
                    f"config.json says {list(param.shape)}"
                )
            local, shape, offset = _local_box(param)
            if local.numel():
                block = _read_block(file, hf_name, fqn, shape, offset, cfg)
                local.copy_(block.to(local.dtype))
            loaded += 1
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
