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

Torch-free at import: the service checks a folder's layout with :func:`layout_error`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

from workers.storage.confine import Roots, is_file, open_fd, proc_path, read_bounded

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


def _where(folder: str, name: str) -> str:
    return f"model.hf {folder!r}: {name}"


def read_json(folder: str, name: str, roots: Roots) -> dict:
    """The JSON object in ``folder``/``name``, read bounded beneath ``roots``."""
    path = os.path.join(folder, name)
    try:
        data = read_bounded(path, roots, MAX_JSON_BYTES, what=_where(folder, name))
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(
            f"{_where(folder, name)} is missing; a diffusers folder holds model_index.json, "
            "unet/, vae/, text_encoder/, tokenizer/ and scheduler/ (save_pretrained writes them)"
        ) from None
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{_where(folder, name)} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{_where(folder, name)} is not a JSON object")
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
                    f"{_where(folder, part + '/' + weights)} is missing (etrain reads "
                    "safetensors weights only, never pickled .bin files); save the pipeline "
                    "with safe_serialization"
                )
            named = index.get(part)
            cls = named[1] if isinstance(named, list) and len(named) == 2 else None
            if part in CLASSES and cls not in CLASSES[part]:
                return (
                    f"{_where(folder, 'model_index.json')} names {part} {cls!r}; objective "
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
                path, roots, MAX_TOKENIZER_BYTES, what=_where(folder, f"tokenizer/{name}")
            )
    if "tokenizer.json" not in files and not {"vocab.json", "merges.txt"} <= set(files):
        raise ValueError(
            f"{_where(folder, 'tokenizer/')} holds neither tokenizer.json nor vocab.json and "
            "merges.txt"
        )
    return files


@dataclass
class Loaded:
    """The parts of a folder, built and filled: ``unet``, ``vae``, ``text_encoder`` (both in
    eval mode, frozen), ``tokenizer`` and ``scheduler`` (a ``DDPMScheduler``)."""

    unet: object
    vae: object
    text_encoder: object
    tokenizer: object
    scheduler: object


def _weights(folder: str, part: str, roots: Roots) -> dict:
    from safetensors.torch import load_file

    path = os.path.join(folder, part, PARTS[part][1])
    fd = open_fd(path, roots)
    try:
        return load_file(proc_path(fd))
    finally:
        os.close(fd)


def _filled(model, folder: str, part: str, roots: Roots):
    missing, unexpected = model.load_state_dict(_weights(folder, part, roots), strict=False)
    if missing or unexpected:
        names = (missing or unexpected)[:3]
        raise ValueError(
            f"{_where(folder, part + '/' + PARTS[part][1])} does not fit {part}/config.json "
            f"({'missing' if missing else 'unexpected'} tensors, e.g. {', '.join(names)})"
        )
    return model


def load_unet(folder: str, roots: Roots | None = None):
    """The UNet of ``folder``, in fp32, trainable as it stands."""
    from diffusers import UNet2DConditionModel

    roots = Roots.from_env() if roots is None else roots
    config = read_json(folder, "unet/config.json", roots)
    return _filled(UNet2DConditionModel.from_config(config), folder, "unet", roots)


def load_frozen(folder: str, roots: Roots | None = None) -> Loaded:
    """Every part but a trained UNet (``unet`` is None): the VAE and text encoder frozen in
    eval mode, the tokenizer and the training scheduler."""
    from diffusers import AutoencoderKL, DDPMScheduler
    from transformers import CLIPTextConfig, CLIPTextModel

    roots = Roots.from_env() if roots is None else roots
    vae = AutoencoderKL.from_config(read_json(folder, "vae/config.json", roots))
    vae = _filled(vae, folder, "vae", roots)
    text_config = CLIPTextConfig.from_dict(read_json(folder, "text_encoder/config.json", roots))
    text_encoder = _filled(CLIPTextModel(text_config), folder, "text_encoder", roots)
    for model in (vae, text_encoder):
        model.requires_grad_(False)
        model.eval()
    schedule = read_json(folder, "scheduler/scheduler_config.json", roots)
    scheduler = DDPMScheduler.from_config(schedule)
    return Loaded(None, vae, text_encoder, load_tokenizer(folder, roots), scheduler)


def load_tokenizer(folder: str, roots: Roots | None = None):
    """The tokenizer of ``folder`` (fast), from a private copy of its bounded files."""
    from transformers import AutoTokenizer

    files = tokenizer_files(folder, Roots.from_env() if roots is None else roots)
    staged = tempfile.mkdtemp(prefix="etrain-sd-tokenizer-")
    try:
        for name, data in files.items():
            with open(os.path.join(staged, name), "wb") as f:
                f.write(data)
        return AutoTokenizer.from_pretrained(staged, local_files_only=True, use_fast=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
