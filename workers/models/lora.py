"""LoRA on etrain's decoder through ``peft``: inject, initialise, describe the base.

``peft.inject_adapter_in_model`` replaces the targeted ``nn.Linear`` modules of
the plain :class:`~workers.models.llama.Transformer` with ``peft``'s
``lora.Linear`` in place (no ``PeftModel`` wrapper, so top-level names and the
strategies' view of the model stay as they are) and freezes every other
parameter. The base weight then lives at ``<module>.base_layer.weight`` and the
adapters at ``<module>.lora_A.default.weight`` / ``lora_B.default.weight``.

Initialisation does not use ``peft``'s (the global RNG, the local shard): each
adapter's full tensor is drawn on the CPU from a generator seeded by the job's
seed and the parameter's name, then the slice this rank holds is copied in. So
every rank, every layout and a single process start from the same adapters.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from workers.storage.confine import Roots, list_folder, open_fd, read_bounded

if TYPE_CHECKING:
    from peft import LoraConfig

# Hugging Face projection names (the spec's) -> etrain's module names.
HF_TO_ETRAIN = {
    "q_proj": "wq",
    "k_proj": "wk",
    "v_proj": "wv",
    "o_proj": "wo",
    "gate_proj": "w1",
    "up_proj": "w3",
    "down_proj": "w2",
}
ADAPTER = "default"
# ``spec`` arguments below are the job's ``model.lora`` (workers.spec.model.LoraSpec; not
# imported: the spec package sits above the models in the workers' layers).


def lora_config(spec: Any, *, hf_names: bool = False) -> LoraConfig:
    """The ``peft`` LoraConfig of ``spec`` (targets in etrain's or Hugging Face's names)."""
    from peft import LoraConfig  # imported here: peft (and transformers) load in seconds

    targets = (
        list(spec.target_modules) if hf_names else [HF_TO_ETRAIN[t] for t in spec.target_modules]
    )
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM" if hf_names else None,
    )


def inject_lora(model: nn.Module, spec: Any) -> nn.Module:
    """Add adapters to ``model`` in place and freeze everything else; returns ``model``.

    Works on a model built on the meta device too (the adapters are then on
    meta until the model is materialised; :func:`init_lora` fills them).
    """
    from peft import inject_adapter_in_model

    inject_adapter_in_model(lora_config(spec), model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(is_lora_param(name))
    return model


@torch.no_grad()
def hold_frozen_linears_in(
    model: nn.Module, dtype: torch.dtype, kinds: tuple[type, ...] = (nn.Linear,)
) -> int:
    """Store every frozen ``nn.Linear`` (the adapted projections' base layers, the others,
    the output head) in ``dtype``; returns how many. Call it after :func:`inject_lora`.
    ``kinds``: the layer types held so (a UNet's ``nn.Conv2d`` too).

    With ``train.precision: bf16`` autocast casts those weights to bf16 for every
    matmul (and convolution) anyway, so keeping them in bf16 gives the same numbers with
    half the memory: a frozen weight needs no fp32 master copy. Embeddings and norms
    (small, not autocast) and the adapters stay as they are.
    """
    count = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if isinstance(module, kinds) and own and not any(p.requires_grad for p in own):
            module.to(dtype)
            count += 1
    return count


def is_lora_param(name: str) -> bool:
    """True for an adapter parameter's name (any wrapper prefix)."""
    return ".lora_A." in name or ".lora_B." in name


def canonical_name(name: str) -> str:
    """``name`` without wrapper prefixes (DDP's ``module.``, activation checkpointing's)."""
    parts = [p for p in name.split(".") if p not in ("module", "_checkpoint_wrapped_module")]
    return ".".join(parts)


def _full_adapter(name: str, shape: torch.Size, *, seed: int) -> torch.Tensor:
    """The initial value of adapter ``name``: A ~ kaiming-uniform (peft's default), B = 0."""
    if ".lora_B." in name:
        return torch.zeros(shape)
    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    out = torch.empty(shape)
    # nn.init.kaiming_uniform_(a=sqrt(5)) as peft does: bound = 1 / sqrt(fan_in).
    bound = 1.0 / math.sqrt(shape[1])
    return out.uniform_(-bound, bound, generator=gen)


@torch.no_grad()
def init_lora(parts: Iterable[nn.Module], *, seed: int) -> int:
    """Set every adapter of ``parts`` to its seeded initial value; returns how many.

    Call it after the strategy and after the base is materialised: a sharded
    (DTensor) adapter receives only its local slice of the full tensor, split
    locally (no communication), so the result does not depend on the layout.
    """
    count = 0
    for part in parts:
        for name, param in part.named_parameters():
            if not is_lora_param(name):
                continue
            full = _full_adapter(canonical_name(name), param.shape, seed=seed)
            if isinstance(param, DTensor):
                local = distribute_tensor(
                    full, param.device_mesh, param.placements, src_data_rank=None
                ).to_local()
                param.to_local().copy_(local)
            else:
                param.copy_(full)
            count += 1
    return count


def trainable_count(parts: Iterable[nn.Module]) -> int:
    """Trainable parameters over ``parts`` counted as unsharded (peft's count)."""
    return sum(p.numel() for part in parts for p in part.parameters() if p.requires_grad)


def base_reference(model_spec, *, seed: int, stores=None, part: str = "") -> dict:
    """What a LoRA checkpoint's adapters were trained on: preset + seed, or model.hf + fingerprint.

    The fingerprint of a Hugging Face folder is its ``config.json``'s hash and
    the sizes of its weight files (cheap to read anywhere, changes with the weights);
    ``part``: the subfolder of the adapted model (a diffusers folder's ``unet``).
    """
    if model_spec.hf is None:
        return {"preset": model_spec.preset, "seed": seed}
    if part:
        folder = model_spec.hf.removeprefix("file://").rstrip("/")
        fingerprint = local_fingerprint(f"{folder}/{part}", Roots.from_env())
        return {"hf": model_spec.hf, "part": part, "fingerprint": fingerprint}
    return {"hf": model_spec.hf, "fingerprint": hf_fingerprint(model_spec.hf, stores)}


def hf_fingerprint(path: str, stores=None) -> dict:
    """``config.json`` sha256 and each ``*.safetensors`` file's size of the folder at ``path``
    (an object-store one reached through ``stores``, a URL -> its StorageLocation)."""
    from workers.models.hf_remote import is_remote, model_location

    if not is_remote(path):
        return local_fingerprint(path.removeprefix("file://"), Roots.from_env())
    loc = model_location(path, stores)
    fs, root = loc.fs, loc.root
    with fs.open(f"{root.rstrip('/')}/config.json", "rb") as f:
        config_sha = hashlib.sha256(f.read()).hexdigest()
    sizes = {
        info["name"].rsplit("/", 1)[-1]: int(info["size"])
        for info in fs.ls(root, detail=True)
        if info["name"].endswith(".safetensors")
    }
    return {"config_sha256": config_sha, "weights": dict(sorted(sizes.items()))}


def local_fingerprint(folder: str, roots: Roots) -> dict:
    """:func:`hf_fingerprint` of a local folder, every file opened beneath ``roots``."""
    from workers.models.hf_config import MAX_CONFIG_BYTES

    config = read_bounded(f"{folder}/config.json", roots, MAX_CONFIG_BYTES, what="config.json")
    sizes = {}
    for name in list_folder(folder, roots):
        if name.endswith(".safetensors"):
            fd = open_fd(f"{folder}/{name}", roots)
            try:
                sizes[name] = os.fstat(fd).st_size
            finally:
                os.close(fd)
    return {
        "config_sha256": hashlib.sha256(config).hexdigest(),
        "weights": dict(sorted(sizes.items())),
    }


def check_base(saved: dict | None, current: dict) -> None:
    """Refuse to put adapters on a base other than the one they were trained on."""
    if saved is None:
        raise ValueError(
            "the newest checkpoint holds no model.lora base reference (not a LoRA checkpoint?): "
            "resume it without model.lora, or start in a new checkpoint.path"
        )
    if saved != current:
        raise ValueError(
            "model.lora: the checkpoint's adapters were trained on base "
            f"{json.dumps(saved, sort_keys=True)}, but this job's base is "
            f"{json.dumps(current, sort_keys=True)}; use the same model.preset/model.hf "
            "and train.seed, or a new checkpoint.path"
        )
