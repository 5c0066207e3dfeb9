"""Render images with a Stable Diffusion-style pipeline and an adapter etrain exported.

    python examples/sd_generate.py BASE_FOLDER "a red square" --adapter ADAPTER --out red.png

``BASE_FOLDER`` is the job's ``model.hf`` (a diffusers folder); ``ADAPTER`` the folder
``etrain export JOB --adapter --out ADAPTER`` wrote (``pytorch_lora_weights.safetensors``),
loaded with diffusers' own ``load_lora_weights``. A folder written by ``etrain export JOB
--merge`` is a whole pipeline: pass it as ``BASE_FOLDER`` without ``--adapter``.
"""

from __future__ import annotations

import argparse
import sys


def render(base: str, adapter: str | None, prompt: str, *, steps: int, seed: int, size=None):
    """The image (PIL) the pipeline renders for ``prompt`` with ``adapter`` loaded."""
    import torch
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        base, safety_checker=None, requires_safety_checker=False
    )
    if adapter:
        pipe.load_lora_weights(adapter)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    out = pipe(prompt, num_inference_steps=steps, generator=generator, height=size, width=size)
    return out.images[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the diffusers folder (model.hf), or a merged export")
    parser.add_argument("prompt")
    parser.add_argument("--adapter", help="the folder etrain export --adapter wrote")
    parser.add_argument("--out", default="generated.png")
    parser.add_argument("--steps", type=int, default=25, help="denoising steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=None, help="pixels (default: the UNet's)")
    args = parser.parse_args(argv)
    image = render(
        args.base, args.adapter, args.prompt, steps=args.steps, seed=args.seed, size=args.size
    )
    image.save(args.out)
    print(f"{args.out}: {image.size[0]} x {image.size[1]}, {args.prompt!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
