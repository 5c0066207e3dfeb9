"""Tokenize once into memory-mapped token shards with an index; train from them.

A prepared folder holds ``tokens.npy`` (uint32, ``num_samples * (seq_len + 1)``
tokens), for masked shapes ``targets.npy`` (uint8, 1 where a token is trained
on), ``counts.npy`` (uint32, counted labels per sample) and ``index.json``
(shape, seq_len, sample count, the source file's name/size/mtime/SHA-256 and
the tokenizer's hash). ``etrain data prepare`` writes one; a job that names a
raw file with a tokenizer has its worker write one per node into a cache keyed
by everything the samples depend on, under a file lock so one process tokenizes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict

import numpy as np

from workers.data.formats import read_rows, require_file
from workers.data.tokenizer import check_vocab, load_tokenizer, tokenizer_hash
from workers.data.tokens import Samples, ShapeOptions, tokenize_rows

INDEX = "index.json"
FORMAT_VERSION = 1
CACHE_ENV = "ETRAIN_DATA_CACHE"


def file_identity(path: str) -> dict:
    """Name, size, mtime and SHA-256 of the source file (what the samples came from)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    st = os.stat(path)
    return {
        "name": os.path.basename(path),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "sha256": h.hexdigest(),
    }


def prepare(
    *, source: str, path: str, tokenizer: str, opts: ShapeOptions, out: str, vocab_size: int | None
) -> dict:
    """Tokenize ``path`` (read as ``source``) with the tokenizer folder ``tokenizer`` into
    folder ``out``; return the index written there."""
    path = require_file(path, source)
    tok = load_tokenizer(tokenizer)
    if vocab_size is not None:
        check_vocab(tok, vocab_size, tokenizer)
    samples = tokenize_rows(tok, read_rows(path, source), opts, path)
    index = {
        "format_version": FORMAT_VERSION,
        **asdict(opts),
        "num_samples": samples.num_samples,
        # Sample i is tokens[i * sample_tokens : (i + 1) * sample_tokens] (and targets alike).
        "sample_tokens": opts.seq_len + 1,
        "masked": samples.targets is not None,
        "files": {
            "tokens": "tokens.npy",
            "counts": "counts.npy",
            **({"targets": "targets.npy"} if samples.targets is not None else {}),
        },
        "source": {"format": source, **file_identity(path)},
        "tokenizer": {"sha256": tokenizer_hash(tokenizer), "size": len(tok)},
        "max_token_id": int(samples.tokens.max()),
    }
    _write(out, samples, index)
    return index


def _write(out: str, samples: Samples, index: dict) -> None:
    """Write the shards into a fresh folder next to ``out``, then move it into place."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, INDEX)):
        raise ValueError(f"--out {out!r} exists and is not a prepared folder; name a new folder")
    tmp = tempfile.mkdtemp(prefix=".prepare-", dir=parent)
    try:
        window = index["seq_len"] + 1
        np.save(os.path.join(tmp, "tokens.npy"), samples.tokens)
        if samples.targets is None:
            counts = np.full(samples.num_samples, window - 1, dtype=np.uint32)
        else:
            np.save(os.path.join(tmp, "targets.npy"), samples.targets)
            counts = samples.targets.reshape(-1, window)[:, 1:].sum(axis=1, dtype=np.uint32)
        np.save(os.path.join(tmp, "counts.npy"), counts)
        with open(os.path.join(tmp, INDEX), "w") as f:
            json.dump(index, f, indent=1)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_index(folder: str) -> dict:
    """The index of a prepared folder; a ValueError naming data.path when it is not one."""
    try:
        with open(os.path.join(folder, INDEX)) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"data.path {folder!r} is not a prepared folder (no readable {INDEX}); write one "
            "with `etrain data prepare`"
        ) from e
    if index.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"data.path {folder!r} was prepared in format {index.get('format_version')}, this "
            f"version reads {FORMAT_VERSION}; run `etrain data prepare` again"
        )
    return index


def cache_root() -> str:
    """Where workers keep the shards they prepare ($ETRAIN_DATA_CACHE, else the temp dir)."""
    return os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "etrain-data-cache")


def ensure_prepared(
    *, source: str, path: str, tokenizer: str, opts: ShapeOptions, vocab_size: int | None
) -> str:
    """The cached prepared folder for these inputs, tokenizing them first if no process on
    this node has (the lock makes the others wait for the one that does)."""
    path = require_file(path, source)
    key = hashlib.sha256(
        json.dumps(
            {
                "v": FORMAT_VERSION,
                "source": source,
                "file": file_identity(path)["sha256"],
                "tokenizer": tokenizer_hash(tokenizer),
                "opts": asdict(opts),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:32]
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    out = os.path.join(root, key)
    with open(os.path.join(root, key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(Exception):
            read_index(out)
            return out
        prepare(
            source=source,
            path=path,
            tokenizer=tokenizer,
            opts=opts,
            out=out,
            vocab_size=vocab_size,
        )
    return out
