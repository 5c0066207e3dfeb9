"""A Stable Diffusion-style diffusers folder (``model.hf`` of ``objective: diffusion``), read
beneath the job's folders: ``model_index.json``, ``unet/``, ``vae/``, ``text_encoder/``,
``tokenizer/`` and ``scheduler/``.

Every file is untrusted input and opened here, by the process that uses it, through
:mod:`workers.storage.confine`: configs and tokenizer files are read bounded (regular files,
no link out of the job's roots); weights are ``safetensors`` only (a pickled ``.bin`` is
refused: loading it could run code), memory-mapped through the descriptor opened beneath
the roots. The models are built from their configs with diffusers' and transformers' own
classes and then given those weights, so nothing outside the folder is fetched and no
``from_pretrained`` walks the folder on its own.

The parts it trains on are the SD 1.x / 2.x family: ``UNet2DConditionModel``,
``AutoencoderKL``, ``CLIPTextModel`` and a CLIP-style tokenizer (``tokenizer.json``, or
``vocab.json`` and ``merges.txt``); the noise schedule is ``DDPMScheduler``'s with the
folder's scheduler config (the training schedule diffusers' own training scripts use).

This module is torch-free: the service checks a folder's layout with :func:`layout_error`;
:mod:`workers.models.diffusers_load` builds the parts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

from workers.storage.confine import Roots, is_file, opened, read_bounded

MAX_JSON_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
PARTS = {  # part: (its config file, its weights file or None)
    "unet": ("config.json", "diffusion_pytorch_model.safetensors"),
    "vae": ("config.json", "diffusion_pytorch_model.safetensors"),
    "text_encoder": ("config.json", "model.safetensors"),
    "scheduler": ("scheduler_config.json", None),
    "tokenizer": ("tokenizer_config.json", None),
}
CLASSES = {  # what model_index.json may name for each part
    "unet": ("UNet2DConditionModel",),
    "vae": ("AutoencoderKL",),
    "text_encoder": ("CLIPTextModel",),
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


def part_where(folder: str, name: str) -> str:
    return f"model.hf {folder!r}: {name}"


def read_json(folder: str, name: str, roots: Roots) -> dict:
    """The JSON object in ``folder``/``name``, read bounded beneath ``roots``."""
    path = os.path.join(folder, name)
    try:
        data = read_bounded(path, roots, MAX_JSON_BYTES, what=part_where(folder, name))
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(
            f"{part_where(folder, name)} is missing; a diffusers folder holds model_index.json, "
            "unet/, vae/, text_encoder/, tokenizer/ and scheduler/ (save_pretrained writes them)"
        ) from None
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{part_where(folder, name)} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{part_where(folder, name)} is not a JSON object")
    return value


def layout_error(folder: str, roots: Roots) -> str | None:
    """Why ``folder`` is not a diffusers folder etrain trains (a part missing, a class it
    does not build, pickled weights only), or None. Reads configs, not weights."""
    try:
        index = read_json(folder, "model_index.json", roots)
        for part, (config, weights) in PARTS.items():
            read_json(folder, f"{part}/{config}", roots)
            if weights and not is_file(os.path.join(folder, part, weights), roots):
                return (
                    f"{part_where(folder, part + '/' + weights)} is missing (etrain reads "
                    "safetensors weights only, never pickled .bin files); save the pipeline "
                    "with safe_serialization"
                )
            named = index.get(part)
            cls = named[1] if isinstance(named, list) and len(named) == 2 else None
            if part in CLASSES and cls not in CLASSES[part]:
                return (
                    f"{part_where(folder, 'model_index.json')} names {part} {cls!r}; objective "
                    f"diffusion trains Stable Diffusion 1.x/2.x-style pipelines ({part}: "
                    f"{' or '.join(CLASSES[part])})"
                )
        tokenizer_files(folder, roots)
    except ValueError as e:
        return str(e)
    return None


def tokenizer_files(folder: str, roots: Roots) -> dict[str, bytes]:
    """The tokenizer's files of ``folder``/tokenizer, each read bounded."""
    files = {}
    for name in TOKENIZER_FILES:
        path = os.path.join(folder, "tokenizer", name)
        if is_file(path, roots):
            files[name] = read_bounded(
                path, roots, MAX_TOKENIZER_BYTES, what=part_where(folder, f"tokenizer/{name}")
            )
    if "tokenizer.json" not in files and not {"vocab.json", "merges.txt"} <= set(files):
        raise ValueError(
            f"{part_where(folder, 'tokenizer/')} holds neither tokenizer.json nor vocab.json and "
            "merges.txt"
        )
    return files


def load_tokenizer(folder: str, roots: Roots | None = None):
    """The tokenizer of ``folder`` (fast), from a private copy of its bounded files: the
    workers' and the submit check's (transformers, no torch)."""
    from transformers import AutoTokenizer

    files = tokenizer_files(folder, Roots.from_env() if roots is None else roots)
    staged = tempfile.mkdtemp(prefix="etrain-sd-tokenizer-")
    try:
        for name, data in files.items():
            with open(os.path.join(staged, name), "wb") as f:
                f.write(data)
        return AutoTokenizer.from_pretrained(staged, local_files_only=True, use_fast=True)
    except Exception as e:  # noqa: BLE001 - a tenant's files: transformers raises any kind
        raise ValueError(
            f"{part_where(folder, 'tokenizer/')} cannot be loaded as a tokenizer "
            f"({type(e).__name__}: {str(e)[:200]}); fix tokenizer_config.json or its files"
        ) from None
    finally:
        shutil.rmtree(staged, ignore_errors=True)


MAX_HEADER_BYTES = 16 << 20
LORA_PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")


@dataclass(frozen=True)
class DiffusionShape:
    """What the planner sizes of a diffusers folder: each part's parameters, those of the
    UNet's nn.Linear and nn.Conv2d layers (weights of 2 or 4 dimensions and their biases:
    what bf16 precision holds in bf16), the UNet's attention projections (``(in, out)``
    features of each, by kind: to_q ... to_out.0) and its first block's width."""

    unet_params: int
    vae_params: int
    text_encoder_params: int
    projections: dict[str, tuple[tuple[int, int], ...]]
    unet_width: int
    unet_matmul_params: int = 0

    def adapter_params(self, rank: int, targets: list[str]) -> int:
        """LoRA parameters of rank ``rank`` on the projection kinds ``targets`` (to_q ...)."""
        return sum(rank * (i + o) for t in targets for i, o in self.projections.get(t, ()))


def shape_of(parts: dict[str, dict[str, tuple[int, ...]]], unet_width: int) -> DiffusionShape:
    """The :class:`DiffusionShape` of ``parts``: each part's (unet, vae, text_encoder)
    tensor shapes by name."""
    unet = parts["unet"]
    projections: dict[str, list[tuple[int, int]]] = {p: [] for p in LORA_PROJECTIONS}
    for name, dims in unet.items():
        for kind in LORA_PROJECTIONS:
            if name.endswith(f".{kind}.weight") and len(dims) == 2:
                projections[kind].append((int(dims[1]), int(dims[0])))
    layers = {n.removesuffix(".weight") for n, d in unet.items() if n.endswith(".weight")}
    layers = {n for n in layers if len(unet[f"{n}.weight"]) in (2, 4)}
    matmul = [d for n, d in unet.items() if n.rpartition(".")[0] in layers]
    return DiffusionShape(
        unet_params=sum(map(_numel, unet.values())),
        vae_params=sum(map(_numel, parts["vae"].values())),
        text_encoder_params=sum(map(_numel, parts["text_encoder"].values())),
        projections={k: tuple(v) for k, v in projections.items()},
        unet_width=unet_width,
        unet_matmul_params=sum(map(_numel, matmul)),
    )


def safetensors_header(path: str, roots: Roots) -> dict:
    """The JSON header of a safetensors file (its tensors' names, dtypes and shapes),
    read bounded beneath ``roots``: the weights themselves are not read."""
    with opened(path, roots) as f:
        size = int.from_bytes(f.read(8), "little")
        if not 2 <= size <= MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (header of {size} bytes)")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is no object)")
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def diffusion_shape(folder: str, roots: Roots) -> DiffusionShape:
    """The :class:`DiffusionShape` of ``folder``, from its weights' headers and configs."""
    parts = {}
    for part in ("unet", "vae", "text_encoder"):
        header = safetensors_header(os.path.join(folder, part, PARTS[part][1]), roots)
        parts[part] = {name: tuple(entry.get("shape", ())) for name, entry in header.items()}
    widths = read_json(folder, "unet/config.json", roots).get("block_out_channels") or [320]
    return shape_of(parts, int(widths[0]))
