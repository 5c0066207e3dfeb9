"""``model.hf`` at submit and plan: read its ``config.json``, refuse what cannot train.

After the access policy allowed the folder (:mod:`service.domain.access_policy`
applies the ``data.path`` rules to ``model.hf`` and ``model.tokenizer``), the
service reads the folder's ``config.json`` (at most
``workers.models.hf_config.MAX_CONFIG_BYTES``), maps it with the same
``config_from_hf`` the workers use, and checks the job's layout against it with
the same ``check_layout``. Every problem is a 422 naming ``model.hf`` and the
fix: no folder, no ``config.json``, no safetensors weights, an architecture
etrain cannot train (the message lists the supported ones), a layout that does
not fit (tp must divide the heads, ...). The resolved shape goes to the planner.

Only regular files are opened (a FIFO named config.json cannot stall a
request), and only local folders: the workers read model folders from a path
they share, so an ``s3://`` / ``gs://`` model folder the policy allowed is still
refused here, with the fix (copy it to a data path), rather than failing on
the workers. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.errors import InvalidSpec
from workers.models.config import ModelConfig
from workers.models.hf_config import (
    MAX_CONFIG_BYTES,
    check_layout,
    config_from_hf,
    read_hf_config_text,
)
from workers.spec import JobSpec

WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
LOC = ("model", "hf")


class ModelRefused(ValueError):
    """``model.hf`` cannot be trained as the spec asks; the message says what to change."""


def _folder(uri: str) -> Path:
    path = uri.removeprefix("file://")
    if "://" in path:
        raise ModelRefused(
            f"model.hf {uri}: etrain's workers read model folders from a path they share, "
            "not from an object store; copy the folder into your data area (or a shared data "
            "root) and name that path"
        )
    folder = Path(path)
    if not folder.is_dir():
        raise ModelRefused(
            f"model.hf {uri} is not a folder the service can see; name a Hugging Face model "
            "folder (config.json + model.safetensors) inside your data area"
        )
    return folder


def _read_config(folder: Path, uri: str) -> dict:
    config = folder / "config.json"
    if not config.is_file():  # also refuses FIFOs and devices, which could block a read
        raise ModelRefused(
            f"model.hf {uri} has no config.json; name the folder transformers' save_pretrained "
            "wrote (config.json + model.safetensors)"
        )
    with open(config, "rb") as f:
        text = f.read(MAX_CONFIG_BYTES + 1)
    return read_hf_config_text(text, where="model.hf")


def _check_weights(folder: Path, uri: str) -> None:
    if not any((folder / name).is_file() for name in WEIGHTS):
        raise ModelRefused(
            f"model.hf {uri} has no weights: etrain reads {WEIGHTS[0]} or a sharded "
            f"{WEIGHTS[1]}; save the model with safe_serialization (the default)"
        )


def model_config_of(spec: JobSpec) -> ModelConfig | None:
    """The shape of ``spec``'s ``model.hf`` checked against its layout (None for a preset).

    :class:`ModelRefused` names model.hf and the fix for any problem.
    """
    uri = spec.model.hf
    if uri is None:
        return None
    folder = _folder(uri)
    try:
        cfg = config_from_hf(_read_config(folder, uri), where="model.hf")
    except (OSError, ValueError) as e:
        raise ModelRefused(str(e) if isinstance(e, ValueError) else f"model.hf {uri}: {e}") from e
    _check_weights(folder, uri)
    par = spec.parallelism
    stages = par.pp * (2 if par.pipeline.schedule == "interleaved_1f1b" else 1)
    try:
        check_layout(
            cfg, tp=par.tp, stages=stages if par.pp > 1 else 1, seq_len=spec.data.seq_len,
            where=f"model.hf ({os.path.basename(folder.as_posix().rstrip('/')) or uri})",
        )  # fmt: skip
    except ValueError as e:
        raise ModelRefused(str(e)) from e
    return cfg


def check_model(spec: JobSpec, *, loc: tuple = ("body",)) -> ModelConfig | None:
    """:func:`model_config_of` as a 422 (InvalidSpec) whose loc is ``model.hf``."""
    try:
        return model_config_of(spec)
    except ModelRefused as e:
        raise InvalidSpec(
            "the job's model cannot be trained",
            [{"loc": [*loc, *LOC], "msg": str(e), "type": "model"}],
        ) from e
