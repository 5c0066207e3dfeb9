"""Tokenize once into memory-mapped token shards with an index; train from them.

A prepared folder holds ``tokens.npy`` (uint32, ``num_samples * (seq_len + 1)``
tokens), for masked shapes ``targets.npy`` (uint8, 1 where a token is trained
on), ``counts.npy`` (uint32, counted labels per sample) and ``index.json``
(shape, seq_len, sample count, the source file's name/size/mtime/SHA-256 and
the tokenizer's hash). ``etrain data prepare`` writes one; a job that names a
raw file with a tokenizer has its worker write one per node into a cache keyed
by everything the samples depend on, under a file lock so one process tokenizes.
A source on an object store is streamed and keyed by its URL, size and ETag
(else modification time); a prepared folder on an object store is copied once per node
into the cache (keyed by its index's hash) and memory-mapped there.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import asdict

import numpy as np

from workers.data.formats import naming, read_rows, require_file
from workers.data.remote import (
    Stores,
    cache_root,
    cache_roots,
    cached_folder,
    is_remote,
    locate,
    read_small,
    replace_folder,
    store_identity,
)
from workers.data.remote import file_info as remote_file_info
from workers.data.remote import identity as remote_identity
from workers.data.samples import Samples, ShapeOptions, tokenize_rows
from workers.data.tokenizer import check_vocab, load_tokenizer, local_tokenizer, tokenizer_hash
from workers.storage.confine import ConfinementError, Roots, child_name, opened, read_bounded

INDEX = "index.json"
FORMAT_VERSION = 1
# A prepared folder's index.json is small; a bigger one is not an index.
MAX_INDEX_BYTES = 16 << 20


def file_identity(path: str, stores: Stores | None = None, *, section: str = "data") -> dict:
    """Name, size, mtime and SHA-256 of the source file (what the samples came from; opened
    beneath the job's folders); of an object, its URL, name, size, ETag and mtime as the
    store tells them (no second read). Errors name ``section``'s path field."""
    if is_remote(path):
        return remote_identity(path, remote_file_info(path, stores, field=f"{section}.path"))
    h = hashlib.sha256()
    with naming(section), opened(path, Roots.from_env()) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        st = os.fstat(f.fileno())
    return {
        "name": os.path.basename(path),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "sha256": h.hexdigest(),
    }


def prepare(
    *,
    source: str,
    path: str,
    tokenizer: str,
    opts: ShapeOptions,
    out: str,
    vocab_size: int | None,
    stores: Stores | None = None,
    section: str = "data",
) -> dict:
    """Tokenize ``path`` (read as ``source``) with the tokenizer folder ``tokenizer`` into
    folder ``out``; return the index written there. Either may be on an object store
    (``stores``: a URL -> its StorageLocation, as the spec maps it). Errors name the fields
    of the spec's ``section`` that named the file (data or data.eval)."""
    path = require_file(path, source, stores, section=section)
    identity = file_identity(path, stores, section=section)
    tokenizer = local_tokenizer(tokenizer, stores)
    tok = load_tokenizer(tokenizer)
    if vocab_size is not None:
        check_vocab(tok, vocab_size, tokenizer)
    rows = read_rows(path, source, stores, section=section)
    samples = tokenize_rows(tok, rows, opts, path, section=section)
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
        "source": {"format": source, **identity},
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

    def fill(tmp: str) -> None:
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

    replace_folder(out, fill, prefix=".prepare-")


def read_index(folder: str, roots: Roots | None = None, *, section: str = "data") -> dict:
    """The index of a prepared folder, a regular file beneath ``roots`` (default: the job's)
    read bounded; a ValueError naming ``section``'s path field when it is not one."""
    roots = Roots.from_env() if roots is None else roots
    where = f"{section}.path {folder!r}"
    try:
        raw = read_bounded(os.path.join(folder, INDEX), roots, MAX_INDEX_BYTES, what=INDEX)
        index = json.loads(raw)
    except ConfinementError as e:
        raise ValueError(f"{where}: {e}") from None
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(
            f"{where} is not a prepared folder (no readable {INDEX}); write one "
            "with `etrain data prepare`"
        ) from e
    if not isinstance(index, dict):
        raise ValueError(f"{where}: {INDEX} is not an object; prepare it again")
    if index.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{where} was prepared in format {index.get('format_version')}, this "
            f"version reads {FORMAT_VERSION}; run `etrain data prepare` again"
        )
    return index


def local_prepared(path: str, stores: Stores | None = None, *, section: str = "data") -> str:
    """A local prepared folder for ``path``: itself, or for an object-store folder a copy
    in this node's cache keyed by its index's hash (fetched once, under a file lock).
    Errors name ``section``'s path field."""
    if not is_remote(path):
        return path.removeprefix("file://")
    url, field = path.rstrip("/"), f"{section}.path"
    try:
        raw = read_small(f"{url}/{INDEX}", stores, MAX_INDEX_BYTES, field=field)
        index = json.loads(raw)
    except ValueError as e:
        raise ValueError(
            f"{field} {path!r} is not a prepared folder (no readable {INDEX}: {e}); write "
            "one with `etrain data prepare` and copy the folder there"
        ) from e
    if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
        raise ValueError(f"{field} {path!r}: {INDEX} lists no files; prepare it again")
    fs, root = locate(url, stores, field=field)

    def fill(tmp: str) -> None:
        for name in sorted(set(index["files"].values()), key=str):
            child_name(name, where=f"{field} {path!r}: {INDEX}")
            if "/" in name or name.startswith("."):
                raise ValueError(f"{field} {path!r}: {INDEX} names a bad file {name!r}")
            try:
                fs.get_file(f"{root}/{name}", os.path.join(tmp, name))
            except Exception as e:
                raise ValueError(f"{field} {url}/{name}: cannot copy it ({e})") from e
        with open(os.path.join(tmp, INDEX), "wb") as f:
            f.write(raw)  # last: its presence marks the copy complete

    where = json.dumps(store_identity(url, stores), sort_keys=True).encode()
    key = hashlib.sha256(where + b"\0" + raw).hexdigest()[:32]
    out = os.path.join(cache_root(), "prepared", key)
    return cached_folder(out, fill, lambda d: bool(read_index(d, cache_roots(), section=section)))


def ensure_prepared(
    *,
    source: str,
    path: str,
    tokenizer: str,
    opts: ShapeOptions,
    vocab_size: int | None,
    stores: Stores | None = None,
    section: str = "data",
) -> str:
    """The cached prepared folder for these inputs, tokenizing them first if no process on
    this node has (the lock makes the others wait for the one that does). A local file is
    keyed by its SHA-256, an object by its URL, size and ETag (else mtime). Errors name the
    fields of the spec's ``section`` (data or data.eval)."""
    path = require_file(path, source, stores, section=section)
    ident = file_identity(path, stores, section=section)
    tokenizer = local_tokenizer(tokenizer, stores)
    key = hashlib.sha256(
        json.dumps(
            {
                "v": FORMAT_VERSION,
                "source": source,
                # An object: its URL, size and ETag (its mtime where the store gives none).
                "file": ident.get("sha256")
                or {k: ident[k] for k in ("url", "size", "etag" if ident["etag"] else "mtime")},
                "store": store_identity(path, stores),
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
            read_index(out, cache_roots())
            return out
        prepare(
            source=source,
            path=path,
            tokenizer=tokenizer,
            opts=opts,
            out=out,
            vocab_size=vocab_size,
            stores=stores,
            section=section,
        )
    return out
