"""etrain's decoder and the tokenizer for generation, from a checkpoint or a folder.

A committed checkpoint holds the model under ``app.model.<fqn>`` (the optimizer state
beside it is never read): the model tensors alone are read through DCP in this process,
resharded from whatever layout saved them, into a :class:`Transformer` shaped by the
job's preset or its ``model.hf`` config.json. A LoRA checkpoint holds only the adapters
and names its base in the manifest: the base is rebuilt (the preset's seeded weights, or
the ``model.hf`` folder's, whose fingerprint must still be the trained-on one), the
adapters are injected as in training and filled from the checkpoint; nothing is written.

A folder (``--model``) is a Hugging Face one (``transformers`` names, as ``etrain export``
writes for model.hf jobs and ``--merge``) or an export in etrain's names.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from workers.checkpoint.export import (
    _Entry,
    _load_model_tensors,
    _plan_entries,
    _stored_model_tensors,
)
from workers.checkpoint.export_hf import source_model_config
from workers.checkpoint.export_lora import base_config, base_of
from workers.checkpoint.source import ExportError, ExportSource, open_checkpoint_dir
from workers.data.tokenizer import load_tokenizer, local_tokenizer
from workers.models.config import ModelConfig, get_model_config
from workers.models.hf_load import hf_config_bytes, hf_model_config, load_pretrained, materialize
from workers.models.llama import Transformer, build_model
from workers.models.lora import hf_fingerprint, inject_lora, is_lora_param
from workers.spec import CheckpointSpec
from workers.spec.model import ModelSpec
from workers.spec.stores import StoresSpec, move_legacy_stores, stores_section
from workers.storage.location import is_remote, stores_for

ETRAIN_NAMES = "tok_embeddings.weight"  # in an export with etrain's names (--naming etrain)


class ByteTokenizer:
    """Bytes as tokens (0..255): what a preset job trains on without ``model.tokenizer``."""

    eos_token_id = None
    chat_template = None

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``."""
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of byte tokens (ids above 255 dropped, bad UTF-8 replaced)."""
        return bytes(i for i in ids if i < 256).decode(errors="replace")


def job_sections(spec: dict[str, Any]) -> tuple[ModelSpec, CheckpointSpec, StoresSpec]:
    """The ``model``, ``checkpoint`` and ``stores`` sections of a job's spec (JSON form)."""
    spec = move_legacy_stores(spec)  # an older service's form too
    return (
        ModelSpec.model_validate(spec.get("model") or {}),
        CheckpointSpec.model_validate(spec.get("checkpoint") or {}),
        stores_section(spec),
    )


def _empty(cfg: ModelConfig) -> Transformer:
    """A decoder of shape ``cfg`` in host memory, its weights not yet set."""
    with torch.device("meta"):
        model = Transformer(cfg)
    materialize(model, device="cpu")
    return model


def _hf_model(root: str, stores: StoresSpec | None = None) -> Transformer:
    """The decoder with the weights of the Hugging Face folder ``root`` (local or a store)."""
    cfg = source_model_config(root, stores)
    model = _empty(cfg)
    try:
        load_pretrained([model], root, cfg, stores=stores_for(stores))
    except (OSError, ValueError) as e:
        raise ExportError(f"{root}: {e}") from None
    return model


def _etrain_named(root: str) -> bool:
    """Whether the folder's single weights file holds etrain's names (an etrain export)."""
    path = os.path.join(root.removeprefix("file://"), "model.safetensors")
    if is_remote(root) or not os.path.isfile(path):
        return False
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return ETRAIN_NAMES in f.keys()  # noqa: SIM118 (not a dict)


def model_from_folder(root: str) -> Transformer:
    """The decoder with the weights of folder ``root``: a Hugging Face model folder (its
    config.json and safetensors), or an ``etrain export`` in etrain's names."""
    if not _etrain_named(root):
        return _hf_model(root).eval()
    from safetensors.torch import load_file

    folder = root.removeprefix("file://")
    model = _empty(hf_model_config(folder))
    model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")))
    return model.eval()


def _model_state(src: ExportSource, cfg: ModelConfig, what: str) -> dict[str, torch.Tensor]:
    """The checkpoint's model tensors (every one, checked against ``cfg``'s shapes)."""
    entries = _plan_entries(src, cfg, preset=what, naming="etrain")
    return _load_model_tensors(src, src.reader(), entries)


def _lora_model(src: ExportSource, model: ModelSpec, stores: StoresSpec) -> Transformer:
    """The LoRA checkpoint's base with its adapters injected and loaded."""
    if model.lora is None:
        raise ExportError(f"checkpoint {src.uri} holds LoRA adapters but the job has no model.lora")
    base = base_of(src)
    cfg = base_config(base, stores)
    if "preset" in base:
        net = build_model(cfg, seed=int(base["seed"]))
    else:
        if hf_fingerprint(base["hf"], stores_for(stores)) != base.get("fingerprint"):
            raise ExportError(
                f"the base model.hf {base['hf']} changed since the adapters of {src.uri} were "
                "trained on it (its config.json or weight files differ)"
            )
        net = _hf_model(base["hf"], stores)
    inject_lora(net, model.lora)
    wanted = {n for n, _ in net.named_parameters() if is_lora_param(n)}
    stored = _stored_model_tensors(src)
    if set(stored) != wanted:
        raise ExportError(
            f"checkpoint {src.uri} does not hold this job's adapters (model.lora rank and "
            "target_modules must be the trained ones)"
        )
    entries = [
        _Entry(fqn=k, name=k, shape=tuple(md.size), stored_dtype=md.properties.dtype)
        for k, md in stored.items()
    ]
    net.load_state_dict(_load_model_tensors(src, src.reader(), entries), strict=False)
    return net


def model_from_checkpoint(spec: dict[str, Any], uri: str) -> Transformer:
    """The decoder with the weights of the job's committed checkpoint at ``uri``, read where
    it lies (object stores reached and confined by the job's ``stores`` and
    ``checkpoint.storage``)."""
    model, checkpoint, stores = job_sections(spec)
    src = open_checkpoint_dir(uri, checkpoint=checkpoint, stores=stores)
    if (src.info.extra or {}).get("lora_base"):
        return _lora_model(src, model, stores).eval()
    if model.hf is not None:
        cfg, what = source_model_config(model.hf, stores), f"model.hf {model.hf}"
    else:
        cfg, what = get_model_config(model.preset), model.preset
    net = _empty(cfg)
    net.load_state_dict(_model_state(src, cfg, what))
    return net.eval()


def tokenizer_at(path: str | None, stores: StoresSpec | None = None):
    """The tokenizer in folder ``path`` (local or a store), or bytes when ``path`` is None."""
    if path is None:
        return ByteTokenizer()
    try:
        return load_tokenizer(local_tokenizer(path, stores_for(stores)))
    except (OSError, ValueError) as e:
        raise ExportError(f"tokenizer {path}: {e}") from None


def job_tokenizer(spec: dict[str, Any]):
    """The job's tokenizer: ``model.tokenizer``, else ``model.hf``'s, else bytes."""
    model, _, stores = job_sections(spec)
    return tokenizer_at(model.tokenizer or model.hf, stores)


def folder_tokenizer(root: str):
    """The tokenizer beside the weights of folder ``root`` (bytes when it has none)."""
    local = root.removeprefix("file://")
    has = is_remote(root) or os.path.isfile(os.path.join(local, "tokenizer.json"))
    return tokenizer_at(root if has else None)


def config_eos(root: str | None, stores: StoresSpec | None = None) -> set[int]:
    """The EOS ids the folder's config.json names (none when it names none)."""
    if root is None:
        return set()
    try:
        eos = json.loads(hf_config_bytes(root, stores_for(stores))).get("eos_token_id")
    except (OSError, ValueError):
        return set()
    ids = eos if isinstance(eos, list) else [eos]
    return {int(i) for i in ids if isinstance(i, int)}


def encode_prompt(tok, text: str, *, chat: bool) -> list[int]:
    """The prompt's token ids: as the tokenizer encodes ``text``, or (``chat``) ``text`` as one
    user message rendered by its chat template, with the assistant's turn opened."""
    if not chat:
        if isinstance(tok, ByteTokenizer):
            return tok.encode(text)
        return list(tok(text)["input_ids"])
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template (tokenizer_config.json chat_template or "
            "chat_template.jinja); generate without chat"
        )
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tok(rendered, add_special_tokens=False)["input_ids"])
