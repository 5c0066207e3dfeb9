"""What an export of a ``model.hf`` job adds: the source's config.json and tokenizer files.

A job that fine-tuned a Hugging Face folder exports back to one that
``transformers.AutoModelForCausalLM.from_pretrained`` loads as the same
architecture: its ``config.json`` is the source's (architecture, biases, RoPE
theta, norm eps, token ids, sliding window ...) with only what etrain changed
rewritten (untied ``lm_head``, the weights' dtype), and the tokenizer files are
copied beside it so the folder is complete. A source in an object store
(``s3://`` / ``gs://``) is read there, reached with the job's ``stores`` section's
options and this process's credentials, as the workers read it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from workers.checkpoint.source import ExportError
from workers.data import tokenizer
from workers.models.config import ModelConfig
from workers.models.hf_config import read_hf_config_text
from workers.models.hf_load import hf_config_bytes, hf_model_config, local_folder
from workers.models.hf_remote import is_remote, model_location
from workers.storage.location import stores_for

# Tokenizer (and generation) files a model folder may carry; copied when present: those
# that decide tokenization (workers.data.tokenizer), then the rest.
TOKENIZER_FILES = (
    *tokenizer.TOKENIZER_FILES,
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
)
_HF_DTYPE = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _folder(path: str, what: str, required: str | None = "config.json") -> Path:
    try:
        return local_folder(path, where=what, required=required)
    except ValueError as e:
        raise ExportError(
            f"{e} (export reads the job's {what} folder where the CLI runs: run it where "
            "that path is mounted)"
        ) from None


def source_model_config(hf: str, stores=None) -> ModelConfig:
    """The shapes of the job's ``model.hf`` folder, as an :class:`ExportError` on failure."""
    if not is_remote(hf):
        _folder(hf, "model.hf")
    try:
        return hf_model_config(hf, stores_for(stores))
    except (OSError, ValueError) as e:
        raise ExportError(str(e) if isinstance(e, ValueError) else f"model.hf {hf}: {e}") from None


def source_hf_config(hf: str, *, dtype: torch.dtype, stores=None) -> dict:
    """The source folder's config.json, with tied embeddings untied and ``dtype`` set."""
    if is_remote(hf):
        text = hf_config_bytes(hf, stores_for(stores))
    else:
        text = (_folder(hf, "model.hf") / "config.json").read_bytes()
    config = read_hf_config_text(text)
    config.pop("torch_dtype", None)
    config.update(tie_word_embeddings=False, dtype=_HF_DTYPE[dtype])
    return config


def _copy_remote_tokenizer_files(folder: str, out: Path, stores) -> list[str]:
    try:
        loc = model_location(folder, stores_for(stores), where="tokenizer")
        names = {p.rsplit("/", 1)[-1] for p in loc.fs.ls(loc.root, detail=False)}
        copied = [name for name in TOKENIZER_FILES if name in names]
        for name in copied:
            loc.fs.get_file(loc.join(name), str(out / name))
    except (OSError, ValueError) as e:
        raise ExportError(f"tokenizer files of {folder}: {type(e).__name__}: {e}") from None
    return copied


def copy_tokenizer_files(folder: str, out: Path, stores=None) -> list[str]:
    """Copy the tokenizer files of ``folder`` (model.tokenizer, else model.hf) into ``out``;
    an object-store folder is reached with ``stores`` (the job's section)."""
    if is_remote(folder):
        return _copy_remote_tokenizer_files(folder, out, stores)
    src = _folder(folder, "tokenizer", required=None)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
            copied.append(name)
    return copied


def hf_config(cfg: ModelConfig, *, dtype: torch.dtype) -> dict:
    """A Hugging Face ``LlamaConfig``-shaped dict for ``cfg``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "num_hidden_layers": cfg.n_layers,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": _HF_DTYPE[dtype],
    }
