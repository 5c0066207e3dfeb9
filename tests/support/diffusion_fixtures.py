"""A tiny Stable Diffusion-style pipeline built here from configs (nothing can be
downloaded): a UNet conditioned on a CLIP text encoder, a VAE, a DDPM scheduler and the
tests' BPE tokenizer, saved as a diffusers folder (``unet/``, ``vae/``, ``text_encoder/``,
``tokenizer/``, ``scheduler/``, ``model_index.json``)."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.support.hf_fixtures import make_tokenizer

TEXT_LENGTH = 32  # the text encoder's positions, and the tokenizer's model_max_length


def make_tiny_sd(path: str | Path, *, prediction: str = "epsilon", seed: int = 0):
    """Save the tiny pipeline under ``path`` (``prediction``: the scheduler's
    prediction_type); return it."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDPMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 32),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=32,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=384,
            max_position_embeddings=TEXT_LENGTH,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=2,
        )
    )
    path = Path(path)
    tokenizer = make_tokenizer(path / "tokenizer-src", vocab_size=384)
    tokenizer.model_max_length = TEXT_LENGTH
    scheduler = DDPMScheduler(
        num_train_timesteps=1000,
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        prediction_type=prediction,
        steps_offset=1,  # as Stable Diffusion 1.5's scheduler_config.json
        clip_sample=False,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(path)
    return pipe


# Stable Diffusion 1.5's parts, by their configs (the fields that size them).
SD15_UNET = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 2,
    "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    "cross_attention_dim": 768,
    "attention_head_dim": 8,
    "norm_num_groups": 32,
}
SD15_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 512,
}
SD15_TEXT = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "vocab_size": 49408,
    "max_position_embeddings": 77,
}


@functools.cache
def sd15_shape():
    """The planner's :class:`DiffusionShape` of Stable Diffusion 1.5, from its parts built
    on the meta device (no weights)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from workers.models.diffusers_folder import shape_of

    with torch.device("meta"):
        unet = UNet2DConditionModel(**SD15_UNET)
        vae = AutoencoderKL(**SD15_VAE)
        text = CLIPTextModel(CLIPTextConfig(**SD15_TEXT))
    parts = {"unet": unet, "vae": vae, "text_encoder": text}
    shapes = {
        part: {name: tuple(p.shape) for name, p in model.named_parameters()}
        for part, model in parts.items()
    }
    return shape_of(shapes, SD15_UNET["block_out_channels"][0])
