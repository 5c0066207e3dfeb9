"""Activation memory of a Stable Diffusion 1.5-shaped UNet under objective diffusion's LoRA,
per image, at several resolutions: the figure the planner's diffusion estimate rests on.

    python bench/diffusion_memory.py [--resolutions 256 384 512] [--checkpointing] [--bf16]

The UNet is built from SD 1.5's UNet config (859.5 M parameters, random weights: the
activations depend on the shapes alone), frozen, with rank-8 LoRA on to_q/to_k/to_v/to_out.0
as the job builds it; one forward and backward of one image (fp32, on this machine's CPU,
SDPA attention) under the meter the job's first step uses (``ActivationMeter``: live
storages kept for backward, each counted once). Per resolution: the latent's pixels, the
activations' peak, and bytes per latent pixel (the planner's coefficient); the last column
is the ratio to the smallest resolution's bytes per pixel, which stays near 1 when the
activations grow linearly with the pixels (attention's scores are not kept by SDPA's
memory-efficient kernels). ``--bf16``: as a ``train.precision: bf16`` job runs, the frozen
linear and convolution layers held in bf16 and the step under the CPU's bf16 autocast.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.diffusion_fixtures import SD15_UNET

TEXT_LENGTH, TEXT_DIM = 77, 768


def measure(resolution: int, *, checkpointing: bool, bf16: bool = False) -> tuple[int, float]:
    """(activation bytes of one image, seconds for its forward and backward)."""
    import torch
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig

    from workers.models.lora import hold_frozen_linears_in
    from workers.telemetry.memory import ActivationMeter

    torch.manual_seed(0)
    unet = UNet2DConditionModel(**SD15_UNET)
    unet.requires_grad_(False)
    unet.add_adapter(
        LoraConfig(r=8, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    )
    if checkpointing:
        unet.enable_gradient_checkpointing()
    if bf16:
        hold_frozen_linears_in(unet, torch.bfloat16, kinds=(torch.nn.Linear, torch.nn.Conv2d))
    unet.train()
    side = resolution // 8
    x = torch.randn(1, 4, side, side)
    states = torch.randn(1, TEXT_LENGTH, TEXT_DIM)
    t = torch.tensor([500])
    meter = ActivationMeter([unet])
    t0 = time.perf_counter()
    with meter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = unet(x, t, encoder_hidden_states=states, return_dict=False)[0]
        out.float().pow(2).mean().backward()
    return meter.peak, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[256, 384])
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    rows, base = [], None
    for res in args.resolutions:
        peak, seconds = measure(res, checkpointing=args.checkpointing, bf16=args.bf16)
        pixels = (res // 8) ** 2
        per_pixel = peak / pixels
        base = base or per_pixel
        rows.append((res, pixels, peak / 2**20, per_pixel, per_pixel / base, seconds))
    mode = "gradient checkpointing" if args.checkpointing else "no checkpointing"
    precision = "bf16 (CPU autocast)" if args.bf16 else "fp32"
    print(f"SD 1.5 UNet, rank-8 LoRA on attention, one image, {precision}, {mode}")
    print("| resolution | latent pixels | activations MiB | bytes / latent pixel | ratio | s |")
    print("|---|---|---|---|---|---|")
    for res, pixels, mib, per_pixel, ratio, seconds in rows:
        print(f"| {res} | {pixels} | {mib:.0f} | {per_pixel:.0f} | {ratio:.2f} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
