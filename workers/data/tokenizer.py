"""Loading a Hugging Face tokenizer folder offline, and fingerprinting it.

The folder holds ``tokenizer.json`` with ``tokenizer_config.json`` (which may
carry the chat template) and optionally ``chat_template.jinja``;
``transformers`` reads them from disk only (``local_files_only``), never the hub.
A folder on an object store (``s3://``, ``gs://``) is first copied, those few
files only and each of bounded size, into a per-node cache folder
(:func:`local_tokenizer`), then read the same way.
"""

from __future__ import annotations

import hashlib
import os

from workers.data import remote

# Files whose bytes decide how text becomes tokens (a template changes chat samples).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


def tokenizer_folder(path: str | None) -> str | None:
    """``path`` as a local folder (``file://`` stripped); None stays None."""
    if path is None:
        return None
    if path.startswith("file://"):
        return path.removeprefix("file://")
    if "://" in path:
        raise ValueError(
            f"model.tokenizer {path!r}: name a local folder, file://, s3:// or gs://; "
            "object-store folders are fetched with local_tokenizer first"
        )
    return path


def local_tokenizer(path: str, stores: remote.Stores | None = None) -> str:
    """A local folder holding tokenizer ``path``'s files: ``path`` itself, or for an
    object-store folder a node-cache copy of its tokenizer files (``stores``: a URL -> its
    StorageLocation, as the spec maps it)."""
    if not remote.is_remote(path):
        return tokenizer_folder(path)
    return remote.fetch_files(
        path.rstrip("/"),
        TOKENIZER_FILES,
        stores,
        field="model.tokenizer",
        required="tokenizer.json",
        limit=remote.MAX_TOKENIZER_FILE,
    )


def load_tokenizer(path: str):
    """The tokenizer in folder ``path`` (a ``PreTrainedTokenizerFast``), read offline."""
    folder = tokenizer_folder(path)
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise ValueError(
            f"model.tokenizer {path!r} has no tokenizer.json; name a folder holding "
            "tokenizer.json and tokenizer_config.json (a Hugging Face model folder)"
        )
    # Imported here: byte-level and prepared data never need transformers.
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    if tok.eos_token_id is None:
        raise ValueError(
            f"model.tokenizer {path!r} defines no EOS token; set eos_token in its "
            "tokenizer_config.json"
        )
    return tok


def tokenizer_hash(path: str) -> str:
    """SHA-256 over the tokenizer files present in folder ``path`` (names and bytes)."""
    folder = tokenizer_folder(path)
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        full = os.path.join(folder, name)
        if os.path.isfile(full):
            h.update(name.encode() + b"\0")
            with open(full, "rb") as f:
                h.update(f.read())
            h.update(b"\0")
    return h.hexdigest()


def check_vocab(tok, vocab_size: int, path: str) -> None:
    """The tokenizer's ids must all be valid rows of the model's embedding."""
    if len(tok) > vocab_size:
        raise ValueError(
            f"model.tokenizer {path!r} has {len(tok)} tokens but the model's vocab_size is "
            f"{vocab_size}; use the tokenizer the model was trained with"
        )
