"""What an export of a ``model.hf`` job adds: the source's config.json and tokenizer files.

A job that fine-tuned a Hugging Face folder exports back to one that
``transformers.AutoModelForCausalLM.from_pretrained`` loads as the same
architecture: its ``config.json`` is the source's (architecture, biases, RoPE
theta, norm eps, token ids, sliding window ...) with only what etrain changed
rewritten (untied ``lm_head``, the weights' dtype), and the tokenizer files are
copied beside it so the folder is complete.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from workers.checkpoint.source import ExportError
from workers.models.config import ModelConfig
from workers.models.hf_config import read_hf_config_text
from workers.models.hf_load import hf_model_config, local_folder

# Tokenizer (and generation) files a model folder may carry; copied when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
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


def source_model_config(hf: str) -> ModelConfig:
    """The shapes of the job's ``model.hf`` folder, as an :class:`ExportError` on failure."""
    _folder(hf, "model.hf")
    try:
        return hf_model_config(hf)
    except ValueError as e:
        raise ExportError(str(e)) from None


def source_hf_config(hf: str, *, dtype: torch.dtype) -> dict:
    """The source folder's config.json, with tied embeddings untied and ``dtype`` set."""
    text = (_folder(hf, "model.hf") / "config.json").read_bytes()
    config = read_hf_config_text(text)
    config.pop("torch_dtype", None)
    config.update(tie_word_embeddings=False, dtype=_HF_DTYPE[dtype])
    return config


def copy_tokenizer_files(folder: str, out: Path) -> list[str]:
    """Copy the tokenizer files of ``folder`` (model.tokenizer, else model.hf) into ``out``."""
    src = _folder(folder, "tokenizer", required=None)
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
            copied.append(name)
    return copied
