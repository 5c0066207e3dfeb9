"""Export a LoRA job's adapters in ``peft``'s format, or merged into its base.

A LoRA checkpoint holds only the adapters (``layers.N.attention.wq.lora_A.default.weight``
...) and names its base in the manifest (``lora_base``: a preset and seed, or a
``model.hf`` folder and its fingerprint). :func:`export_adapter` writes
``adapter_config.json`` (``peft``'s ``LoraConfig.save_pretrained``) and
``adapter_model.safetensors`` under the names ``PeftModel.from_pretrained``
expects (``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight``).
etrain rotates adjacent query/key feature pairs where Hugging Face rotates
halves (:mod:`workers.models.hf_naming`), so the output rows of ``lora_B`` for
``q_proj``/``k_proj`` are permuted like the base rows (``lora_A`` acts on the
input side and stays as it is).

:func:`export_merged` lets ``peft`` itself merge (``merge_and_unload``) over
the base loaded with ``transformers`` and saves a full Hugging Face folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from workers.checkpoint import export_diffusion
from workers.checkpoint.export import (
    _Entry,
    _load_model_tensors,
    _stored_model_tensors,
    hf_config,
)
from workers.checkpoint.export_diffusion import is_diffusion_base
from workers.checkpoint.export_fused import fuse_adapters, fused_targets
from workers.checkpoint.source import ExportError, ExportSource, local_base, open_checkpoint_dir
from workers.models.config import ModelConfig, get_model_config
from workers.models.hf_naming import to_hf_name, to_hf_tensor
from workers.models.llama import build_model
from workers.models.lora import ADAPTER, lora_config
from workers.spec.model import LoraSpec
from workers.storage.location import is_remote, stores_for

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
_ADAPTER_KEY = re.compile(rf"^(.+)\.(lora_[AB])\.{ADAPTER}\.weight$")


@dataclass(frozen=True)
class AdapterExportResult:
    """What :func:`export_adapter` / :func:`export_merged` wrote."""

    out_dir: str
    step: int
    num_tensors: int
    num_params: int
    bytes: int
    merged: bool
    what: str = ""  # what was written, for people: "LoRA adapter (peft format)" ...

    def __post_init__(self):
        if not self.what:
            what = (
                "merged model (Hugging Face folder)"
                if self.merged
                else "LoRA adapter (peft format)"
            )
            object.__setattr__(self, "what", what)


def _source(checkpoint: ExportSource | str | os.PathLike) -> ExportSource:
    return checkpoint if isinstance(checkpoint, ExportSource) else open_checkpoint_dir(checkpoint)


def base_of(src: ExportSource) -> dict:
    """The checkpoint's base reference; ExportError for a checkpoint without adapters."""
    base = (src.info.extra or {}).get("lora_base")
    if not base:
        raise ExportError(
            f"checkpoint {src.uri} is not a LoRA checkpoint (its manifest names no "
            "lora_base); export it without --adapter/--merge"
        )
    return base


def base_config(base: dict, store=None) -> ModelConfig:
    """The base's shapes: the preset's, or the model.hf folder's (its config.json; in an
    object store reached with ``store``, the job's stores section)."""
    if "preset" in base:
        return get_model_config(base["preset"])
    from workers.models.hf_load import hf_model_config

    try:
        return hf_model_config(base["hf"], stores_for(store))
    except ValueError as e:
        raise ExportError(f"{e} (the base of this LoRA checkpoint)") from None


def stored_adapters(src: ExportSource) -> dict[str, torch.Tensor]:
    """The checkpoint's adapters as it stores them (FQN -> tensor); ExportError when it
    holds anything else."""
    stored = _stored_model_tensors(src)
    keys = [k for k in stored if _ADAPTER_KEY.match(k)]
    if not keys or len(keys) != len(stored):
        raise ExportError(f"checkpoint {src.uri} does not hold LoRA adapters alone")
    entries = [
        _Entry(fqn=k, name=k, shape=tuple(stored[k].size), stored_dtype=stored[k].properties.dtype)
        for k in keys
    ]
    return _load_model_tensors(src, src.reader(), entries)


def adapter_tensors(
    src: ExportSource, cfg: ModelConfig
) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Every adapter of the checkpoint in peft's names and Hugging Face's row layout, and
    how many adapters each fused module stacks (:mod:`workers.checkpoint.export_fused`)."""
    loaded = stored_adapters(src)
    adapters = {}
    for fqn in sorted(loaded):
        t = loaded[fqn]
        m = _ADAPTER_KEY.match(fqn)
        if m.group(2) == "lora_B":  # output rows follow the base's RoPE layout
            t = to_hf_tensor(f"{m.group(1)}.weight", t, cfg)
        adapters[(m.group(1), m.group(2))] = t
    adapters, stacked = fuse_adapters(adapters, cfg)
    out = {}
    for (module, kind), t in adapters.items():
        name = module if module.startswith("model.") else to_hf_name(f"{module}.weight", cfg)
        out[f"{PEFT_PREFIX}{name.removesuffix('.weight')}.{kind}.weight"] = t.contiguous()
    return out, stacked


def export_adapter(
    checkpoint: ExportSource | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    lora: LoraSpec | dict,
    base_model_name_or_path: str | None = None,
    store=None,
) -> AdapterExportResult:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` into ``out_dir``.

    ``lora`` is the job's ``model.lora``; ``base_model_name_or_path`` goes into
    the config (default: the job's ``model.hf``, or nothing for a preset base);
    ``store`` (the job's stores section) reaches an object-store base.
    """
    src = _source(checkpoint)
    spec = lora if isinstance(lora, LoraSpec) else LoraSpec.model_validate(lora)
    base = base_of(src)
    if is_diffusion_base(base):  # a diffusers UNet's adapters, in diffusers' format
        return _diffusion_export(src, out_dir, spec, base, merged=False)
    cfg = base_config(base, store)
    tensors, stacked = adapter_tensors(src, cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = lora_config(spec, hf_names=True)
    config.target_modules = set(fused_targets(spec.target_modules, cfg))
    config.rank_pattern = {name: k * spec.rank for name, k in stacked.items()}
    config.alpha_pattern = {name: k * spec.alpha for name, k in stacked.items()}
    config.base_model_name_or_path = base_model_name_or_path or base.get("hf")
    config.save_pretrained(str(out))
    save_file(tensors, str(out / ADAPTER_FILE), metadata={"format": "pt"})
    return AdapterExportResult(
        out_dir=str(out),
        step=src.info.step,
        num_tensors=len(tensors),
        num_params=sum(t.numel() for t in tensors.values()),
        bytes=(out / ADAPTER_FILE).stat().st_size,
        merged=False,
    )


def write_preset_base(preset: str, seed: int, out_dir: str | os.PathLike) -> Path:
    """A preset's seeded random base as a Hugging Face folder (a preset LoRA job's base)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = get_model_config(preset)
    model = build_model(cfg, seed=seed)
    hf = LlamaForCausalLM(LlamaConfig.from_dict(hf_config(cfg, dtype=torch.float32)))
    state = {to_hf_name(k): to_hf_tensor(k, v, cfg) for k, v in model.state_dict().items()}
    hf.load_state_dict(state, strict=True)
    hf.save_pretrained(str(out_dir))
    return Path(out_dir)


def _fetch_base(hf: str, tmp: str, store) -> Path:
    """An object-store base folder copied into ``tmp`` (a merge needs the whole model)."""
    from workers.models.hf_remote import model_location

    out = Path(tmp) / "base"
    out.mkdir()
    try:
        loc = model_location(hf, stores_for(store))
        for path in loc.fs.ls(loc.root, detail=False):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if loc.fs.isfile(path):
                loc.fs.get_file(path, str(out / name))
    except (OSError, ValueError) as e:
        raise ExportError(f"--merge: base model.hf {hf}: {type(e).__name__}: {e}") from None
    return out


def _local_base_dir(base: dict, tmp: str, store=None) -> Path:
    if "preset" in base:
        return write_preset_base(base["preset"], int(base["seed"]), Path(tmp) / "base")
    if is_remote(base["hf"]):
        return _fetch_base(base["hf"], tmp, store)
    fix = "--merge reads it: mount or copy it here, or export the adapter alone (--adapter)"
    return Path(local_base(base, "config.json", fix))


def export_merged(
    checkpoint: ExportSource | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    lora: LoraSpec | dict,
    store=None,
) -> AdapterExportResult:
    """The base with the adapters merged in, as a Hugging Face folder (peft merges).

    The base is the job's ``model.hf`` folder (read locally, or copied from its object
    store, reached with ``store``; its tokenizer files are copied beside the weights)
    or the preset's seeded random weights.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    src = _source(checkpoint)
    base = base_of(src)
    if is_diffusion_base(base):
        spec = lora if isinstance(lora, LoraSpec) else LoraSpec.model_validate(lora)
        return _diffusion_export(src, out_dir, spec, base, merged=True)
    out = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = _local_base_dir(base, tmp, store)
        export_adapter(
            src,
            Path(tmp) / "adapter",
            lora=lora,
            base_model_name_or_path=str(base_dir),
            store=store,
        )
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype="auto")
        merged = PeftModel.from_pretrained(model, str(Path(tmp) / "adapter")).merge_and_unload()
        merged.save_pretrained(str(out))
        for name in TOKENIZER_FILES:
            if (base_dir / name).is_file():
                shutil.copy2(base_dir / name, out / name)
    (out / "etrain_export.json").write_text(
        json.dumps(
            {"step": src.info.step, "source_uri": src.uri, "lora_base": base, "merged": True},
            indent=2,
        )
        + "\n"
    )
    files = list(out.glob("*.safetensors"))
    return AdapterExportResult(
        out_dir=str(out),
        step=src.info.step,
        num_tensors=0,
        num_params=sum(p.numel() for p in merged.parameters()),
        bytes=sum(f.stat().st_size for f in files),
        merged=True,
    )


def _diffusion_export(
    src: ExportSource, out_dir, lora: LoraSpec, base: dict, *, merged: bool
) -> AdapterExportResult:
    """:mod:`workers.checkpoint.export_diffusion`'s adapter file, or its merged pipeline."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    adapters = stored_adapters(src)
    write = export_diffusion.export_merged if merged else export_diffusion.export_adapter
    count = write(src, out, base=base, lora=lora, adapters=adapters)
    files = list(out.rglob("*.safetensors"))
    return AdapterExportResult(
        out_dir=str(out),
        step=src.info.step,
        num_tensors=0 if merged else count,
        num_params=count if merged else sum(t.numel() for t in adapters.values()),
        bytes=sum(f.stat().st_size for f in files),
        merged=merged,
        what="merged pipeline (diffusers folder)"
        if merged
        else "UNet LoRA adapter (diffusers format: load_lora_weights)",
    )
