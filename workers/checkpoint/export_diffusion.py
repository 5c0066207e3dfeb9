"""Export the UNet adapters of an ``objective: diffusion`` job in the format diffusers loads.

Such a checkpoint holds the UNet's LoRA adapters alone under diffusers' module names with
peft's adapter name (``down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.
default.weight`` ...), and its manifest names the base (``lora_base``: the diffusers folder,
``part: unet``, and the fingerprint of its UNet). :func:`export_adapter` puts the adapters
back into the base's UNet (built from the folder, as training built it) and lets diffusers
write them: ``pytorch_lora_weights.safetensors`` with the adapter's LoRA config in its
metadata (so ``pipeline.load_lora_weights`` scales by ``alpha / rank``).
:func:`export_merged` loads the base pipeline, loads those weights, fuses them into the
UNet and saves the whole pipeline folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from workers.checkpoint.source import ExportError, ExportSource, local_base
from workers.models.diffusers_load import load_unet, lora_config
from workers.spec.model import LoraSpec
from workers.spec.objective import DIFFUSION_LORA_TARGETS

WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def is_diffusion_base(base: dict) -> bool:
    """Whether a checkpoint's ``lora_base`` is a diffusers folder's UNet."""
    return base.get("part") == "unet"


def _base_folder(base: dict) -> str:
    fix = "mount or copy it here (the export rebuilds its UNet)"
    return local_base(base, "model_index.json", fix)


def unet_with_adapters(src: ExportSource, base: dict, lora: LoraSpec, adapters: dict):
    """The base folder's UNet with the checkpoint's ``adapters`` (FQN -> tensor) in it."""
    try:
        unet = load_unet(_base_folder(base))
    except ValueError as e:
        raise ExportError(f"{e} (the base of this LoRA checkpoint)") from None
    unet.add_adapter(lora_config(lora, DIFFUSION_LORA_TARGETS))
    wanted = {k for k, p in unet.named_parameters() if p.requires_grad}
    if set(adapters) != wanted:
        raise ExportError(
            f"checkpoint {src.uri}'s adapters do not fit the UNet of {base['hf']!r} with "
            f"model.lora {lora.target_modules} (e.g. {sorted(set(adapters) ^ wanted)[:2]})"
        )
    unet.load_state_dict(adapters, strict=False)
    return unet


def export_adapter(src: ExportSource, out_dir, *, base: dict, lora: LoraSpec, adapters: dict):
    """Write the adapters as ``pytorch_lora_weights.safetensors`` into ``out_dir``; the
    number of tensors written."""
    from diffusers import StableDiffusionPipeline
    from diffusers.training_utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    unet = unet_with_adapters(src, base, lora, adapters)
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
    StableDiffusionPipeline.save_lora_weights(
        os.fspath(out_dir),
        unet_lora_layers=layers,
        weight_name=WEIGHT_NAME,
        safe_serialization=True,
        unet_lora_adapter_metadata=unet.peft_config["default"].to_dict(),
    )
    return len(layers)


def export_merged(src: ExportSource, out_dir, *, base: dict, lora: LoraSpec, adapters: dict):
    """The base pipeline with the adapters fused into its UNet, saved as a diffusers folder;
    the UNet's parameter count."""
    from diffusers import StableDiffusionPipeline

    with tempfile.TemporaryDirectory() as tmp:
        export_adapter(src, tmp, base=base, lora=lora, adapters=adapters)
        pipe = StableDiffusionPipeline.from_pretrained(
            _base_folder(base), safety_checker=None, requires_safety_checker=False
        )
        pipe.load_lora_weights(tmp, weight_name=WEIGHT_NAME)
        pipe.fuse_lora()
        pipe.unload_lora_weights()
    pipe.save_pretrained(os.fspath(out_dir))
    Path(out_dir, "etrain_export.json").write_text(
        json.dumps({"step": src.info.step, "source_uri": src.uri, "lora_base": base}, indent=2)
        + "\n"
    )
    return sum(p.numel() for p in pipe.unet.parameters())
