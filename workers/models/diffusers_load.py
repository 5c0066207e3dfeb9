"""The parts of a diffusers folder (:mod:`workers.models.diffusers_folder`), built with
diffusers' and transformers' own classes from their configs and given the folder's
safetensors weights, mapped through the descriptor opened beneath the job's roots."""

from __future__ import annotations

import os
from dataclasses import dataclass

from workers.models.diffusers_folder import PARTS, part_where, read_json
from workers.storage.confine import Roots, open_fd, proc_path


@dataclass
class Loaded:
    """The frozen parts of a folder, built and filled: ``vae`` and ``text_encoder`` (in eval
    mode, without gradients) and ``scheduler`` (a ``DDPMScheduler``)."""

    vae: object
    text_encoder: object
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
            f"{part_where(folder, part + '/' + PARTS[part][1])} does not fit {part}/config.json "
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
    """The parts that do not train: the VAE and text encoder frozen in eval mode, and the
    training scheduler (the tokenizer is the dataset's,
    :func:`workers.models.diffusers_folder.load_tokenizer`)."""
    from diffusers import AutoencoderKL
    from transformers import CLIPTextConfig, CLIPTextModel

    roots = Roots.from_env() if roots is None else roots
    vae = AutoencoderKL.from_config(read_json(folder, "vae/config.json", roots))
    vae = _filled(vae, folder, "vae", roots)
    text_config = CLIPTextConfig.from_dict(read_json(folder, "text_encoder/config.json", roots))
    text_encoder = _filled(CLIPTextModel(text_config), folder, "text_encoder", roots)
    for model in (vae, text_encoder):
        model.requires_grad_(False)
        model.eval()
    return Loaded(vae, text_encoder, load_scheduler(folder, roots))


def lora_config(lora, targets: dict[str, str], *, init: str | bool = True):
    """peft's ``LoraConfig`` of the spec's ``lora`` on the UNet's attention projections;
    ``targets`` maps the spec's q_proj ... o_proj to the UNet's to_q ... to_out.0."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        init_lora_weights=init,
        target_modules=[targets[t] for t in lora.target_modules],
    )


def load_scheduler(folder: str, roots: Roots | None = None):
    """The training noise schedule: ``DDPMScheduler`` with the folder's scheduler config."""
    from diffusers import DDPMScheduler

    roots = Roots.from_env() if roots is None else roots
    return DDPMScheduler.from_config(read_json(folder, "scheduler/scheduler_config.json", roots))
