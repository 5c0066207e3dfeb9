"""Export a committed checkpoint's model weights as one safetensors file and an HF-style config.

A checkpoint (``workers.checkpoint.manager``) holds the model under ``app.model.<fqn>``
next to the optimizer state (``app.optim.*``), sharded however the job was
laid out. Export asks ``torch.distributed.checkpoint`` for the model keys only,
a batch of tensors at a time, in one process without a process group (DCP
reshards whatever layout saved them), and streams them into
``model.safetensors``: memory holds one batch, never the optimizer state and
never the whole model. Next to it go ``config.json`` (Hugging Face Llama
fields) and ``etrain_export.json`` (where it came from).

The checkpoint is read where it lies (:mod:`workers.checkpoint.source`): a local
folder, or ``s3://`` / ``gs://`` objects read with ranged requests (nothing is
downloaded first). Only the output goes to the local file system.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from workers.checkpoint.export_hf import (
    copy_tokenizer_files,
    hf_config,
    source_hf_config,
    source_model_config,
)
from workers.checkpoint.safe_load import SafeLoadPlanner
from workers.checkpoint.source import ExportError, ExportSource, open_checkpoint_dir, read_error
from workers.models.config import ModelConfig, get_model_config
from workers.models.hf_naming import hf_rows, to_hf_name, to_hf_tensor
from workers.models.llama import build_model

__all__ = [
    "ExportError",
    "ExportResult",
    "ExportSource",
    "export_checkpoint",
    "hf_config",
    "open_checkpoint_dir",
]

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
EXPORT_FILE = "etrain_export.json"
MODEL_PREFIX = "app.model."
NAMINGS = ("etrain", "hf")
DEFAULT_BATCH_BYTES = 512 * 1024**2
_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
_SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_HF_DTYPE = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    out_dir: str
    model_file: str
    step: int
    preset: str
    dtype: str
    naming: str
    num_tensors: int
    num_params: int
    bytes: int


@dataclass(frozen=True)
class _Entry:
    fqn: str  # etrain name (the checkpoint key without MODEL_PREFIX)
    name: str  # name in the exported file
    shape: tuple[int, ...]
    stored_dtype: torch.dtype


def _stored_model_tensors(src: ExportSource) -> dict[str, TensorStorageMetadata]:
    """Model tensors the checkpoint holds, by etrain FQN (read from DCP's .metadata)."""
    try:
        metadata = src.reader().read_metadata()
    except Exception as e:
        raise read_error(src.loc, src.uri, e) from e
    return {
        key[len(MODEL_PREFIX) :]: md
        for key, md in metadata.state_dict_metadata.items()
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata)
    }


def _plan_entries(src: ExportSource, cfg: ModelConfig, *, preset: str, naming: str) -> list[_Entry]:
    """One entry per model parameter, in model order; checks the checkpoint matches ``preset``
    (a preset name, or ``model.hf <folder>`` for a job that fine-tuned one)."""
    expected = build_model(cfg, seed=0, device="meta").state_dict()
    stored = _stored_model_tensors(src)
    missing = [k for k in expected if k not in stored]
    extra = [k for k in stored if k not in expected]
    wrong = [k for k, t in expected.items() if k in stored and tuple(stored[k].size) != t.shape]
    if missing or extra or wrong:
        detail = "; ".join(
            f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
            for label, keys in (("missing", missing), ("unexpected", extra), ("other shape", wrong))
            if keys
        )
        raise ExportError(
            f"checkpoint {src.uri} does not hold a {preset!r} model ({detail}); "
            "set preset to the job's model.preset (or hf to its model.hf)"
        )
    entries = [
        _Entry(
            fqn=k,
            name=to_hf_name(k, cfg) if naming == "hf" else k,
            shape=tuple(t.shape),
            stored_dtype=stored[k].properties.dtype,
        )
        for k, t in expected.items()
    ]
    # The pieces of a fused tensor (Phi-3's qkv_proj, gate_up_proj) go together, in row order.
    first = {e.name: i for i, e in reversed(list(enumerate(entries)))}
    return sorted(
        entries, key=lambda e: (first[e.name], hf_rows(e.fqn, cfg) if naming == "hf" else 0)
    )


def _tensors(entries: list[_Entry]) -> dict[str, tuple[int, ...]]:
    """Exported tensor name -> shape: consecutive pieces of one name stack by rows."""
    shapes: dict[str, tuple[int, ...]] = {}
    for e in entries:
        rows = shapes[e.name][0] if e.name in shapes else 0
        shapes[e.name] = (rows + e.shape[0], *e.shape[1:])
    return shapes


def _resolve_dtype(dtype: str | None, entries: list[_Entry]) -> torch.dtype:
    if dtype is None:
        return entries[0].stored_dtype
    if dtype not in _DTYPES:
        raise ExportError(
            f"dtype {dtype!r} is not supported; set dtype to one of: "
            f"{', '.join(_DTYPES)} (or leave it unset to keep the checkpoint's)"
        )
    return _DTYPES[dtype]


def _batches(entries: list[_Entry], max_bytes: int) -> list[list[_Entry]]:
    """Consecutive groups of entries of at most ``max_bytes`` (a larger tensor goes alone)."""
    out: list[list[_Entry]] = [[]]
    size = 0
    for e in entries:
        n = math.prod(e.shape) * e.stored_dtype.itemsize
        if out[-1] and size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(e)
        size += n
    return out


def _load_model_tensors(src: ExportSource, reader, batch: list[_Entry]) -> dict[str, torch.Tensor]:
    """Read ``batch``'s tensors (and nothing else) from the checkpoint into CPU memory."""
    wanted = {e.fqn: torch.empty(e.shape, dtype=e.stored_dtype) for e in batch}
    state = {"app": {"model": wanted}}
    with warnings.catch_warnings():
        # One process, no process group, on purpose: DCP warns that it assumes so.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
        except (Exception, CheckpointException) as e:
            raise read_error(src.loc, src.uri, e) from e
    return state["app"]["model"]


def _safetensors_header(entries: list[_Entry], dtype: torch.dtype, metadata: dict) -> bytes:
    """The length-prefixed JSON header of a safetensors file holding ``entries`` in order."""
    header: dict = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    offset = 0
    for name, shape in _tensors(entries).items():
        n = math.prod(shape) * dtype.itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPE[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # tensor data starts 8-byte aligned
    return struct.pack("<Q", len(blob)) + blob


def _write_model_file(
    src: ExportSource,
    path: Path,
    entries: list[_Entry],
    *,
    dtype: torch.dtype,
    cfg: ModelConfig,
    preset: str,
    naming: str,
    batch_bytes: int,
) -> None:
    """Stream the model tensors into ``path`` (via a temporary file renamed at the end)."""
    metadata = {
        "format": "pt",
        "etrain_step": src.info.step,
        "etrain_preset": preset,
        "etrain_naming": naming,
    }
    tmp = path.with_name(path.name + ".tmp")
    reader = src.reader()  # one reader for every batch: each load re-plans against it
    try:
        with open(tmp, "wb") as f:
            f.write(_safetensors_header(entries, dtype, metadata))
            for batch in _batches(entries, batch_bytes):
                loaded = _load_model_tensors(src, reader, batch)
                for e in batch:
                    t = loaded.pop(e.fqn)
                    if naming == "hf":
                        t = to_hf_tensor(e.fqn, t, cfg)
                    # safetensors is little-endian, as are the hosts torch supports here.
                    f.write(
                        t.to(dtype).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                    )
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written file is never left behind
        raise
    _check_model_file(tmp, entries)
    os.replace(tmp, path)


def _check_model_file(path: Path, entries: list[_Entry]) -> None:
    """Open the written file with the reference safetensors parser (header only, mmap)."""
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
    if names != {e.name for e in entries}:
        raise ExportError(f"{path} does not list the exported tensors; delete it and export again")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _resolve_model(
    preset: str | None, hf: str | None, naming: str, store=None
) -> tuple[ModelConfig, str, str]:
    """(shapes, the model's name for messages, naming): a model.hf export is HF-named."""
    if (preset is None) == (hf is None):
        raise ExportError("export needs the job's model.preset or its model.hf (one of them)")
    naming = "hf" if hf is not None else naming
    return _model_config(preset or "", naming, hf, store), preset or f"model.hf {hf}", naming


def _write_configs(
    out: Path,
    cfg: ModelConfig,
    *,
    dtype: torch.dtype,
    hf: str | None,
    tokenizer: str | None,
    store=None,
) -> None:
    """config.json: the preset's in Llama terms, or the source's (plus its tokenizer files)."""
    if hf is None:
        _write_json(out / CONFIG_FILE, hf_config(cfg, dtype=dtype))
        return
    _write_json(out / CONFIG_FILE, source_hf_config(hf, dtype=dtype, stores=store))
    copy_tokenizer_files(tokenizer or hf, out, store)


def _model_config(preset: str, naming: str, hf: str | None = None, store=None) -> ModelConfig:
    """The preset's (or the model.hf folder's) shapes, once the arguments are supported."""
    if naming not in NAMINGS:
        raise ExportError(
            f"naming {naming!r} is not supported; set naming to one of: {', '.join(NAMINGS)}"
        )
    if hf is not None:
        return source_model_config(hf, store)
    try:
        return get_model_config(preset)
    except ValueError as e:
        raise ExportError(str(e)) from None


def _provenance(
    src: ExportSource,
    *,
    preset: str,
    naming: str,
    dtype: torch.dtype,
    job_id: str | None,
    source_uri: str | None,
) -> dict:
    """``etrain_export.json``: where the exported weights came from."""
    return {
        "job_id": job_id,
        "step": src.info.step,
        "source_uri": source_uri or src.uri,
        "preset": preset,
        "dtype": _HF_DTYPE[dtype],
        "naming": naming,
        "format": "safetensors",
        "exported_at": time.time(),
    }


def export_checkpoint(
    checkpoint: ExportSource | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    preset: str | None = None,
    hf: str | None = None,
    tokenizer: str | None = None,
    dtype: str | None = None,
    naming: str = "etrain",
    job_id: str | None = None,
    source_uri: str | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    store=None,
) -> ExportResult:
    """Write ``model.safetensors``, ``config.json`` and ``etrain_export.json`` into ``out_dir``.

    ``checkpoint`` is a committed checkpoint of a job whose ``model.preset`` is
    ``preset``: what :func:`open_checkpoint_dir` returned (any store), or a
    local ``step_XXXXXXXX`` folder. ``dtype`` (fp32, bf16, fp16) casts the
    weights; unset keeps the checkpoint's. ``naming="etrain"`` keeps etrain's
    parameter names; ``"hf"`` writes Hugging Face Llama names and layout.
    At most ``batch_bytes`` of weights (or one tensor) are in memory at once.

    A job that fine-tuned a Hugging Face folder passes ``hf`` (its ``model.hf``) instead
    of ``preset``: the output is a Hugging Face folder of the source's architecture (HF
    names, the source's config.json, ``lm_head`` untied) with ``tokenizer``'s (default
    ``hf``'s) tokenizer files beside it (``store``: the job's stores section).
    """
    cfg, preset, naming = _resolve_model(preset, hf, naming, store)
    src = checkpoint if isinstance(checkpoint, ExportSource) else open_checkpoint_dir(checkpoint)
    entries = _plan_entries(src, cfg, preset=preset, naming=naming)
    out_dtype = _resolve_dtype(dtype, entries)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_model_file(
        src,
        out / MODEL_FILE,
        entries,
        dtype=out_dtype,
        cfg=cfg,
        preset=preset,
        naming=naming,
        batch_bytes=batch_bytes,
    )
    _write_configs(out, cfg, dtype=out_dtype, hf=hf, tokenizer=tokenizer, store=store)
    provenance = _provenance(
        src, preset=preset, naming=naming, dtype=out_dtype, job_id=job_id, source_uri=source_uri
    )
    _write_json(out / EXPORT_FILE, provenance)
    return ExportResult(
        out_dir=str(out),
        model_file=str(out / MODEL_FILE),
        step=src.info.step,
        preset=preset,
        dtype=_HF_DTYPE[out_dtype],
        naming=naming,
        num_tensors=len(_tensors(entries)),
        num_params=sum(math.prod(e.shape) for e in entries),
        bytes=(out / MODEL_FILE).stat().st_size,
    )
