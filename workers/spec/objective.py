"""``objective``: what a job trains its model to do.

Each objective is a module of :mod:`workers.objectives` (named in :data:`OBJECTIVES`)
that builds the batch and the loss; this registry is what the spec knows of it without
torch: the data shapes it trains on, the strategies it runs on (a refused one with the
reason, which the 422 gives) and the spec section holding its options. Adding an
objective is its module and one line here (``docs/objectives.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from workers.contract import STRATEGIES
from workers.spec.base import Spec, printable


@dataclass(frozen=True)
class Objective:
    """What the spec knows of one objective."""

    summary: str
    shapes: tuple[str, ...]  # data.shape values it trains on
    # Strategies it does not run on, each with the reason (the 422 says it).
    refused: dict[str, str] = field(default_factory=dict)
    section: str | None = None  # the spec section of its options, if it has any
    packing: bool = True  # whether data.packing applies


_DPO_PIPELINE = (
    "DPO needs each sequence's whole log-probability under the trained model and under a "
    "frozen reference, and a pipeline's schedule computes one loss per micro-batch on its "
    "last stage through one model"
)
_DPO_TP = (
    "DPO's reference model and its per-sequence log-probabilities are checked against one "
    "process on data-parallel layouts only"
)

_DIFFUSION_LAYOUT = (
    "objective diffusion trains a UNet with LoRA; its layouts are data-parallel (the "
    "UNet replicated or sharded, the VAE and text encoder frozen beside it on every rank)"
)

OBJECTIVES: dict[str, Objective] = {
    "causal_lm": Objective(
        summary="next-token cross entropy (pre-training, full or LoRA fine-tuning)",
        shapes=("text", "instruction", "chat"),
    ),
    "dpo": Objective(
        summary="direct preference optimisation on (prompt, chosen, rejected) rows of "
        "data.shape preference, against a frozen reference model (options: dpo)",
        shapes=("preference",),
        refused={"tp": _DPO_TP, "pp": _DPO_PIPELINE, "hybrid": _DPO_PIPELINE},
        section="dpo",
        packing=False,
    ),
    "diffusion": Objective(
        summary="the denoising loss of a Stable Diffusion-style UNet, with LoRA on its "
        "attention, on images with captions (data.shape image; model.hf a diffusers folder; "
        "options: diffusion)",
        shapes=("image",),
        refused={"tp": _DIFFUSION_LAYOUT, "pp": _DIFFUSION_LAYOUT, "hybrid": _DIFFUSION_LAYOUT},
        section="diffusion",
        packing=False,
    ),
}

# model.lora.target_modules of a language model -> the UNet's attention projections.
DIFFUSION_LORA_TARGETS = {
    "q_proj": "to_q",
    "k_proj": "to_k",
    "v_proj": "to_v",
    "o_proj": "to_out.0",
}


class DpoSpec(Spec):
    """Options of ``objective: dpo``."""

    beta: float = Field(
        0.1,
        gt=0,
        le=100,
        description="How far the trained model may move from the reference: the rewards "
        "are beta x (log-prob ratio to the reference); IPO's regularisation is 1 / (2 beta).",
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="sigmoid: -log sigmoid(beta x (chosen - rejected log-ratio)), summed over "
        "each answer's tokens (the DPO paper); ipo: (chosen - rejected log-ratio, each "
        "averaged over its answer's tokens, - 1 / (2 beta))^2 (IPO, as TRL computes it).",
    )
    reference: str = Field(
        "base",
        max_length=4096,
        description="The frozen reference model: base (the model the job starts from: "
        "model.hf or the seeded preset; with model.lora the same weights with the adapters "
        "off, no second copy; without, a frozen copy sharded like the trained model), or "
        "the absolute path (or s3:// / gs:// URL) of another Hugging Face folder of the same "
        "architecture and vocabulary, read under model.hf's rules.",
    )

    @field_validator("reference")
    @classmethod
    def _base_or_folder(cls, v: str) -> str:
        if v == "base" or v.startswith(("/", "s3://", "gs://")):
            return printable(v, "dpo.reference")
        raise ValueError(
            "dpo.reference must be base or the absolute path (or s3:// / gs:// URL) of a "
            "Hugging Face model folder"
        )

    @property
    def reference_folder(self) -> str | None:
        """The reference's own folder, or None when it is the base model."""
        return None if self.reference == "base" else self.reference


class DiffusionSpec(Spec):
    """Options of ``objective: diffusion``."""

    resolution: int = Field(
        512,
        ge=8,
        le=2048,
        multiple_of=8,
        description="Side of the square the images are trained at: each is made RGB, resized "
        "so its shorter side is this (bicubic), centre-cropped and scaled to [-1, 1]; a "
        "multiple of the VAE's downsampling factor (8 for Stable Diffusion).",
    )
    cache_latents: bool = Field(
        False,
        description="Encode each image with the VAE, and its caption with the text encoder, "
        "once per node into the node cache ($ETRAIN_DATA_CACHE, keyed by the data file, the "
        "images' names, sizes and times, the VAE, text encoder and tokenizer, and the "
        "resolution) and read them from there: the workers then hold neither the VAE nor "
        "the text encoder, and a step skips both. The noise, the timestep and the VAE "
        "posterior's sample are still drawn per step, as without the cache.",
    )


def diffusion_error(spec: Any) -> str | None:
    """Why ``spec``'s model section cannot train ``objective: diffusion``, or None."""
    model = spec.model
    if model.hf is None:
        return (
            "objective diffusion trains a diffusers folder: set model.hf to it (model_index.json, "
            "unet/, vae/, text_encoder/, tokenizer/, scheduler/)"
        )
    if model.hf.startswith(("s3://", "gs://")):
        return (
            "objective diffusion reads a diffusers folder on the workers' disks: set model.hf "
            "to its absolute path (copy it from the object store first)"
        )
    if model.tokenizer is not None:
        return (
            "objective diffusion uses the tokenizer of model.hf's tokenizer/ folder (it must "
            "match the text encoder): remove model.tokenizer"
        )
    if model.lora is None:
        return (
            "objective diffusion trains LoRA adapters on the UNet's attention: add model.lora "
            "(e.g. {rank: 4, alpha: 4})"
        )
    others = [t for t in model.lora.target_modules if t not in DIFFUSION_LORA_TARGETS]
    if others:
        return (
            f"model.lora.target_modules {', '.join(others)} are not in a UNet; with objective "
            "diffusion the targets are q_proj, k_proj, v_proj, o_proj (the attention's "
            "to_q, to_k, to_v, to_out.0)"
        )
    return None


def reference_vocabulary_error(ref_vocab: int, vocab: int, folder: str) -> str | None:
    """Why ``folder`` (dpo.reference) cannot be the reference of a model of ``vocab`` tokens,
    or None: the log-probabilities of one token sequence must mean the same tokens."""
    if ref_vocab == vocab:
        return None
    return (
        f"dpo.reference {folder} has a vocabulary of {ref_vocab} tokens, the trained model "
        f"{vocab}: name a reference of the same tokenizer, or base"
    )


def objective_error(spec: Any) -> str | None:
    """Why ``spec``'s objective cannot train as the spec says (naming the fields to change),
    or None."""
    name = spec.objective
    obj = OBJECTIVES[name]
    strategy = spec.parallelism.strategy
    if strategy in obj.refused:
        runs_on = [s for s in STRATEGIES if s not in obj.refused]
        return (
            f"parallelism.strategy {strategy} is not available with objective {name}: "
            f"{obj.refused[strategy]}; use parallelism.strategy {' or '.join(runs_on)}"
        )
    for other, other_obj in OBJECTIVES.items():
        if other != name and other_obj.section and getattr(spec, other_obj.section) is not None:
            return (
                f"{other_obj.section} holds options of objective {other}; remove it or set "
                f"objective: {other}"
            )
    for data in _data_sections(spec):
        if data.shape not in obj.shapes:
            fits = [n for n, o in OBJECTIVES.items() if data.shape in o.shapes]
            return (
                f"{data.section}.shape {data.shape} is not trained by objective {name} (it "
                f"trains on {' or '.join(obj.shapes)}); set {data.section}.shape to one of "
                f"those, or objective: {' or '.join(fits)}"
            )
    if spec.data.packing and not obj.packing:
        return f"data.packing does not apply to objective {name}: remove data.packing"
    return diffusion_error(spec) if name == "diffusion" else None


def _data_sections(spec: Any) -> list:
    """The data sections whose rows the objective trains or evaluates on."""
    data = spec.data
    sections = [data] if data.sources is None else list(data.sources)
    return sections + ([data.eval] if data.eval is not None else [])
