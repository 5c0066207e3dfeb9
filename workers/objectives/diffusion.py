"""The denoising objective of Stable Diffusion-style image models (a UNet conditioned on a
text encoder's states, in a VAE's latent space): the math, independent of the world size.

An item is one image with its caption. Everything random about an item is drawn from a
generator seeded by the job's seed, the item's epoch and its index (:func:`draws`): the
VAE posterior's sample, the noise and the timestep. So a step's loss is the same on any
number of ranks, after a resize and after a resume, and an image seen again in a later
epoch gets new noise. Per item, with ``z`` the VAE latent times its scaling factor, ``ε``
the noise and ``t`` the timestep:

- the UNet sees ``add_noise(z, ε, t)`` (the scheduler's own) and the caption's states;
- its target is ``ε`` (``epsilon``) or ``get_velocity(z, ε, t)`` (``v_prediction``), as
  the scheduler's ``prediction_type`` says;
- the item's loss is the mean squared error over the latent's elements, in fp32; a step's
  loss is the mean over its global batch's items.

The VAE and the text encoder run without gradients (:class:`Frozen`). The trained part is
the UNet with LoRA adapters (peft, through diffusers' ``add_adapter``) on its attention
projections, laid out by the job's data-parallel strategy (:func:`place`); the data are
images with captions (:func:`dataset`, :class:`workers.data.images.ImageCaptions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from workers.data.formats import read_rows
from workers.data.images import ImageCaptions, caption_ids, image_rows
from workers.models.diffusers_folder import load_tokenizer, read_json
from workers.models.diffusers_load import (
    load_frozen,
    load_scheduler,
    load_unet,
    lora_config,
)
from workers.models.lora import hold_frozen_linears_in
from workers.objectives.diffusion_cache import latent_cache
from workers.spec.objective import DIFFUSION_LORA_TARGETS, DiffusionSpec
from workers.storage.confine import Roots
from workers.storage.location import stores_for
from workers.strategies import StrategyConfig, get_strategy

# Mixes seed, epoch and index into one generator seed (63 bits).
_STRIDE = 1_000_003
_MASK = (1 << 63) - 1


def item_seed(seed: int, epoch: int, index: int) -> int:
    """The generator seed of item ``index`` in ``epoch`` of a job seeded ``seed``."""
    return ((seed * _STRIDE + epoch) * _STRIDE + index) & _MASK


@dataclass(frozen=True)
class Draws:
    """What is random about one item: the VAE posterior's standard normal sample, the noise
    (both the latent's shape) and the timestep."""

    posterior: torch.Tensor
    noise: torch.Tensor
    timestep: int


def draws(seed: int, epoch: int, index: int, latent_shape, timesteps: int) -> Draws:
    """An item's :class:`Draws`, from its own generator on the CPU (the same on any
    device and rank)."""
    gen = torch.Generator().manual_seed(item_seed(seed, epoch, index))
    posterior = torch.randn(latent_shape, generator=gen)
    noise = torch.randn(latent_shape, generator=gen)
    timestep = int(torch.randint(0, timesteps, (1,), generator=gen))
    return Draws(posterior, noise, timestep)


@dataclass
class Frozen:
    """The parts that do not train: the VAE, the text encoder (both None when the latents
    and text states come from the node cache) and the noise scheduler."""

    vae: torch.nn.Module | None
    text_encoder: torch.nn.Module | None
    scheduler: object
    scaling_factor: float | None = None  # the VAE's (read from it when it is here)

    def __post_init__(self):
        if self.scaling_factor is None:
            self.scaling_factor = self.vae.config.scaling_factor

    @property
    def prediction(self) -> str:
        return self.scheduler.config.prediction_type

    @torch.no_grad()
    def encoded(self, pixels, input_ids):
        """``(posterior mean, posterior std, text states)`` of ``pixels`` ``[B, 3, R, R]``
        and ``input_ids`` ``[B, L]``."""
        posterior = self.vae.encode(pixels).latent_dist
        return posterior.mean, posterior.std, self.text_encoder(input_ids)[0]

    @torch.no_grad()
    def inputs(self, pixels, input_ids, items: list, *, seed: int):
        """``(noisy latents, timesteps, text states, targets)`` of a micro-batch: ``pixels``
        ``[B, 3, R, R]``, ``input_ids`` ``[B, L]``, ``items`` the sampler's ``(epoch,
        index)`` of each row."""
        return self.noised(*self.encoded(pixels, input_ids), items, seed=seed)

    @torch.no_grad()
    def noised(self, mean, std, states, items: list, *, seed: int):
        """:meth:`inputs` from the VAE posterior's ``mean`` and ``std`` and the text
        ``states`` (computed now, or read from the node cache)."""
        timesteps = self.scheduler.config.num_train_timesteps
        shape = tuple(mean.shape[1:])
        drawn = [draws(seed, epoch, index, shape, timesteps) for epoch, index in items]
        device = mean.device
        eps = torch.stack([d.posterior for d in drawn]).to(device)
        latents = (mean + std * eps) * self.scaling_factor
        noise = torch.stack([d.noise for d in drawn]).to(device)
        t = torch.tensor([d.timestep for d in drawn], dtype=torch.long, device=device)
        noisy = self.scheduler.add_noise(latents, noise, t)
        if self.prediction == "v_prediction":
            target = self.scheduler.get_velocity(latents, noise, t)
        elif self.prediction == "epsilon":
            target = noise
        else:
            raise ValueError(
                f"the scheduler's prediction_type {self.prediction!r} is not trained here; "
                "epsilon and v_prediction are"
            )
        return noisy, t, states, target


def item_losses(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each item's mean squared error over its latent's elements, in fp32."""
    error = F.mse_loss(prediction.float(), target.float(), reduction="none")
    return error.flatten(1).mean(1)


def options(spec) -> DiffusionSpec:
    return spec.diffusion or DiffusionSpec()


def rows(spec, dataset):
    """Every image is an item."""
    del spec
    return dataset


def dataset(spec, section, *, seed: int) -> ImageCaptions:
    """The images with captions of data ``section``, their captions tokenized with the
    model folder's tokenizer to its text encoder's length."""
    del seed  # the order is the sampler's; the draws are seeded per item
    folder, roots = spec.model.hf, Roots.from_env()
    where = section.section
    length = read_json(folder, "text_encoder/config.json", roots).get("max_position_embeddings")
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"model.hf {folder!r}: text_encoder/config.json has no positions")
    found = image_rows(
        read_rows(section.path, section.source, stores_for(spec.stores), section=where),
        section.path,
        image_field=section.image_field,
        caption_field=section.caption_field,
        section=where,
    )
    ids = caption_ids(found, load_tokenizer(folder, roots), length, section=where)
    images = ImageCaptions(
        found, ids, resolution=options(spec).resolution, roots=roots, section=where
    )
    return latent_cache(spec, images, section.path) if options(spec).cache_latents else images


def place(spec, env, mesh) -> list[torch.nn.Module]:
    """This rank's UNet: the folder's weights, frozen (its linear and convolution layers in
    bf16 under bf16 precision), with LoRA adapters (seeded, the same on every rank) on the
    attention projections model.lora names, in the strategy's layout."""
    unet = load_unet(spec.model.hf).to(env.device).requires_grad_(False)
    torch.manual_seed(spec.train.seed)  # peft's gaussian init draws from the global RNG
    unet.add_adapter(lora_config(spec.model.lora, DIFFUSION_LORA_TARGETS, init="gaussian"))
    if spec.model.activation_checkpointing != "none":  # selective runs as full here
        unet.enable_gradient_checkpointing()
    if spec.train.precision == "bf16":  # autocast computes them in bf16 anyway
        hold_frozen_linears_in(unet, torch.bfloat16, kinds=(torch.nn.Linear, torch.nn.Conv2d))
    unet.train()
    if mesh is None:
        return [unet]
    cfg = StrategyConfig(parallelism=spec.parallelism, precision=spec.train.precision)
    return [get_strategy(spec.parallelism.strategy)(unet, mesh=mesh, cfg=cfg)]


def build(spec, parts, *, reference) -> Diffusion:
    """The frozen parts (VAE, text encoder, scheduler) on the trained UNet's device."""
    del reference
    device = next(parts[0].parameters()).device
    if options(spec).cache_latents:  # the node cache holds what the VAE and encoder give
        folder = spec.model.hf
        vae = read_json(folder, "vae/config.json", Roots.from_env())
        frozen = Frozen(None, None, load_scheduler(folder), vae.get("scaling_factor", 0.18215))
        return Diffusion(frozen, seed=spec.train.seed)
    loaded = load_frozen(spec.model.hf)
    frozen = Frozen(loaded.vae.to(device), loaded.text_encoder.to(device), loaded.scheduler)
    return Diffusion(frozen, seed=spec.train.seed)


class Diffusion:
    """The denoising loss (:class:`workers.objectives.Objective`): a step's loss is the mean
    of its global batch's images' losses (each image counts once: the dataset is
    ``masked`` with one label per item, so ``scale`` is dp_size / the batch's images)."""

    metric_fields: tuple[str, ...] = ()
    rows_per_item = 0  # no token sequences: tokens/s reads 0, samples/s is images/s
    perplexity = False

    def __init__(self, frozen: Frozen, *, seed: int):
        self.frozen, self.seed = frozen, seed
        parts = {"vae": frozen.vae, "text_encoder": frozen.text_encoder}
        self.frozen_parts = {name: m for name, m in parts.items() if m is not None}

    def batch(self, dataset, items: list, device: torch.device):
        """``(pixels, caption ids, items)`` on ``device``; from the node cache
        (``diffusion.cache_latents``), ``(posterior mean, std, text states, items)``."""
        rows = [dataset[index] for _epoch, index in items]
        cached = isinstance(rows[0][0], str)  # ("latent", mean, std, states)
        columns = zip(*(row[1:] if cached else row for row in rows), strict=True)
        tensors = [torch.from_numpy(np.stack(c)).to(device) for c in columns]
        return (*tensors, list(items))

    def _inputs(self, batch):
        *tensors, items = batch
        if len(tensors) == 3:  # cached: the posterior and the states
            return self.frozen.noised(*tensors, items, seed=self.seed)
        return self.frozen.inputs(*tensors, items, seed=self.seed)

    def prepare(self, model, batch):
        del model
        return self._inputs(batch)

    def forward(self, model, batch):
        noisy, t, states, _ = batch
        return model(noisy, t, encoder_hidden_states=states, return_dict=False)[0]

    def loss(self, out, batch, *, scale: float | None, n_calls: int):
        del n_calls  # images are always counted: scale is dp_size / the global batch's images
        loss = item_losses(out, batch[3]).sum() * scale
        return loss, loss.detach().double(), None

    def eval_batch(self, dataset, items: list, *, seq_len: int, device: torch.device):
        """A batch whose padding items (None) are image 0 weighted 0: every rank forwards
        the same number of rows (a sharded UNet gathers its weights in each forward)."""
        del seq_len
        real = [item if item is not None else (0, 0) for item in items]
        weights = torch.tensor([float(item is not None) for item in items], device=device)
        return (*self.batch(dataset, real, device), weights)

    def eval_sum(self, model, batch) -> torch.Tensor:
        *batch, weights = batch
        inputs = self._inputs(batch)
        out = self.forward(model, inputs)
        return (item_losses(out, inputs[3]) * weights).sum().double()
