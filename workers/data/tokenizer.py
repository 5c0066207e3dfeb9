"""Loading a Hugging Face tokenizer folder offline, and fingerprinting it.

The folder holds ``tokenizer.json`` with ``tokenizer_config.json`` (which may
carry the chat template) and optionally ``chat_template.jinja``;
``transformers`` reads them from disk only (``local_files_only``), never the hub.
A folder on an object store (``s3://``, ``gs://``) is first copied, those few
files only and each of bounded size, into a per-node cache folder
(:func:`local_tokenizer`), then read the same way. A local folder is copied too, into
a folder of this process's: each file opened beneath the job's folders
(:mod:`workers.storage.confine`: no link out, regular files only, bounded), so
``transformers``, which opens what it is given by name, reads only checked bytes.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile

from workers.data import remote
from workers.storage.confine import Roots, is_file, read_bounded

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


def local_tokenizer(
    path: str, stores: remote.Stores | None = None, roots: Roots | None = None
) -> str:
    """A local folder holding tokenizer ``path``'s files: for a local folder a private copy
    of its tokenizer files read beneath ``roots`` (default: the job's folders), for an
    object-store folder a node-cache copy (``stores``: a URL -> its StorageLocation, as the
    spec maps it)."""
    if not remote.is_remote(path):
        folder = tokenizer_folder(path)
        if folder in _COPIES.values():  # already this process's copy (prepare after ensure)
            return folder
        return _confined_copy(folder, Roots.from_env() if roots is None else roots)
    return remote.fetch_files(
        path.rstrip("/"),
        TOKENIZER_FILES,
        stores,
        field="model.tokenizer",
        required="tokenizer.json",
        limit=remote.MAX_TOKENIZER_FILE,
    )


_COPIES: dict[tuple[str, str], str] = {}


def _confined_copy(folder: str, roots: Roots) -> str:
    """The tokenizer files of local ``folder``, each a regular file opened beneath ``roots``
    and at most ``MAX_TOKENIZER_FILE`` bytes, copied into a folder of this process's (one
    per content, removed at exit)."""
    files = {}
    for name in TOKENIZER_FILES:
        full = os.path.join(folder, name)
        if is_file(full, roots):
            files[name] = read_bounded(
                full, roots, remote.MAX_TOKENIZER_FILE, what=f"model.tokenizer {name}"
            )
    if "tokenizer.json" not in files:
        raise ValueError(
            f"model.tokenizer {folder!r} has no tokenizer.json; name a folder holding "
            "tokenizer.json and tokenizer_config.json (a Hugging Face model folder)"
        )
    h = hashlib.sha256()
    for name, data in files.items():
        h.update(name.encode() + b"\0" + data + b"\0")
    key = (folder, h.hexdigest())
    if key not in _COPIES or not os.path.isdir(_COPIES[key]):
        out = tempfile.mkdtemp(prefix="etrain-tokenizer-")
        atexit.register(shutil.rmtree, out, True)
        for name, data in files.items():
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
        _COPIES[key] = out
    return _COPIES[key]


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
