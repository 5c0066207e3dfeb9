"""Map-style token datasets: each item is a ``LongTensor`` of ``seq_len + 1`` tokens.

The training loop uses ``x = s[:-1]`` and ``y = s[1:]``. Datasets whose loss
counts only some tokens (instruction and chat data) instead return
``(tokens, labels)`` with ``labels[t] == -100`` where position ``t`` is not
trained on, and tell each sample's counted labels (``counted(i)``). Every item depends only
on the dataset arguments and its index, never on the order of access or the
world size, so an elastic resize or a resume reads exactly the same samples.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from workers.data.formats import jsonl_lines, naming
from workers.data.prepare import ensure_prepared, local_prepared, read_index
from workers.data.remote import cache_roots, is_remote
from workers.data.samples import ShapeOptions
from workers.storage.confine import Roots, is_file, open_fd, opened, proc_path

SOURCES = ("synthetic", "text", "jsonl", "parquet", "prepared")
# Sources read as raw bytes (token = byte) when no tokenizer is given.
_BYTE_SOURCES = ("text", "jsonl")
IGNORE_INDEX = -100

# Synthetic Markov chain: each token has this many likely successors, picked with
# these weights; with probability _NOISE the next token is uniform instead. Peaked
# enough that a tiny model's loss visibly falls within a demo.
_SUCCESSORS = 4
_SUCCESSOR_WEIGHTS = np.array([0.5, 0.25, 0.15, 0.10])
_NOISE = 0.1


class SyntheticDataset:
    """Order-1 Markov chain over ``vocab_size`` tokens with a seeded, peaked transition table."""

    def __init__(self, *, seq_len: int, num_samples: int, vocab_size: int, seed: int) -> None:
        self.seq_len = seq_len
        self.num_samples = num_samples
        self.vocab_size = vocab_size
        self.seed = seed
        table_rng = np.random.default_rng([seed, vocab_size])
        self._successors = table_rng.integers(
            0, vocab_size, size=(vocab_size, _SUCCESSORS)
        ).tolist()

    def __len__(self) -> int:
        """Number of samples."""
        return self.num_samples

    def __getitem__(self, index: int) -> torch.Tensor:
        """Sample ``index``: ``seq_len + 1`` tokens from a generator seeded by (seed, index)."""
        index = _check_index(index, self.num_samples)
        n = self.seq_len + 1
        rng = np.random.default_rng([self.seed, index, 1])
        # Draw every random choice up front so the walk below is plain indexing.
        slots = rng.choice(_SUCCESSORS, size=n, p=_SUCCESSOR_WEIGHTS).tolist()
        noisy = (rng.random(n) < _NOISE).tolist()
        uniform = rng.integers(0, self.vocab_size, size=n).tolist()
        tokens = [uniform[0]]
        for t in range(1, n):
            prev = tokens[-1]
            tokens.append(uniform[t] if noisy[t] else self._successors[prev][slots[t]])
        return torch.tensor(tokens, dtype=torch.long)


class ByteWindowDataset:
    """Non-overlapping windows of ``seq_len + 1`` bytes over a byte buffer (the tail is dropped)."""

    def __init__(self, data: np.ndarray, *, seq_len: int, path: str, section: str = "data") -> None:
        window = seq_len + 1
        if len(data) < window:
            raise ValueError(
                f"{section}.path {path!r} holds {len(data)} bytes, fewer than one sample needs "
                f"(seq_len + 1 = {window}); use a larger file or reduce seq_len"
            )
        self.data = data
        self.seq_len = seq_len
        self.path = path
        self.num_samples = len(data) // window

    def __len__(self) -> int:
        """Number of whole windows."""
        return self.num_samples

    def __getitem__(self, index: int) -> torch.Tensor:
        """Window ``index`` as byte tokens 0..255."""
        index = _check_index(index, self.num_samples)
        window = self.seq_len + 1
        chunk = np.asarray(self.data[index * window : (index + 1) * window], dtype=np.int64)
        return torch.from_numpy(chunk)


class TokenDataset:
    """Samples of a prepared folder (:mod:`workers.data.prepare`), memory-mapped."""

    def __init__(
        self,
        folder: str,
        *,
        vocab_size: int | None = None,
        roots: Roots | None = None,
        section: str = "data",
    ) -> None:
        """The prepared ``folder``, every file of it opened beneath ``roots`` (default: the
        job's folders; the node cache's for a copy or a tokenization made there); errors
        name ``section``'s path field (data or data.eval)."""
        roots = Roots.from_env() if roots is None else roots
        self.index = index = read_index(folder, roots, section=section)
        self.seq_len, self.num_samples = index["seq_len"], index["num_samples"]
        self.masked = bool(index["masked"])
        if vocab_size is not None and index["max_token_id"] >= vocab_size:
            raise ValueError(
                f"{section}.path {folder!r} holds token ids up to {index['max_token_id']} but "
                f"the model's vocab_size is {vocab_size}; prepare it with the model's tokenizer"
            )

        def load(name: str) -> np.ndarray:
            with naming(section):
                return _load_npy(os.path.join(folder, name), roots)

        self.tokens = load("tokens.npy")
        self.targets = load("targets.npy") if self.masked else None
        self.counts = np.asarray(load("counts.npy"), dtype=np.int64)

    def __len__(self) -> int:
        """Number of samples."""
        return self.num_samples

    def __getitem__(self, index: int):
        """Sample ``index``: its tokens, and for masked data also its labels."""
        index = _check_index(index, self.num_samples)
        w = self.seq_len + 1
        tokens = torch.from_numpy(np.asarray(self.tokens[index * w : (index + 1) * w], np.int64))
        if self.targets is None:
            return tokens
        keep = torch.from_numpy(np.asarray(self.targets[index * w + 1 : (index + 1) * w], bool))
        return tokens, torch.where(keep, tokens[1:], IGNORE_INDEX)

    def counted(self, index: int) -> int:
        """How many labels of sample ``index`` the loss counts."""
        return int(self.counts[_check_index(index, self.num_samples)])


def _load_npy(path: str, roots: Roots) -> np.ndarray:
    """The array file at ``path`` memory-mapped, opened beneath ``roots`` (numpy maps a path:
    it is given the descriptor's, so it maps the file that was checked)."""
    fd = open_fd(path, roots)
    try:
        return np.load(proc_path(fd), mmap_mode="r", allow_pickle=False)
    finally:
        os.close(fd)


def _check_index(index: int, length: int) -> int:
    index = int(index)
    if not 0 <= index < length:
        raise IndexError(f"sample index {index} out of range for a dataset of {length} samples")
    return index


def _require_file(path: str | None, source: str, section: str) -> str:
    if not path:
        raise ValueError(f"{section}.path is required when {section}.source is {source!r}")
    with naming(section):
        found = is_file(path, Roots.from_env())
    if not found:
        raise ValueError(
            f"{section}.path {path!r} does not exist or is not a file; set {section}.path to "
            "a readable file"
        )
    return path


def _read_text(path: str, section: str) -> np.ndarray:
    with naming(section), opened(path, Roots.from_env()) as f:
        if os.fstat(f.fileno()).st_size == 0:
            # np.memmap refuses empty files; an empty array gives the "too short" error instead.
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(f, dtype=np.uint8, mode="r")


def _read_jsonl(path: str, section: str) -> np.ndarray:
    texts: list[bytes] = []
    with naming(section), opened(path, Roots.from_env()) as f:
        for lineno, record in jsonl_lines(path, f, section=section):
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(
                    f"{section}.path {path!r} line {lineno}: expected an object with a string "
                    "'text' field"
                )
            texts.append(record["text"].encode("utf-8"))
    return np.frombuffer(b"\n".join(texts), dtype=np.uint8)


def build_dataset(
    *,
    source: str,
    path: str | None,
    seq_len: int,
    num_samples: int,
    vocab_size: int,
    seed: int,
    section: str = "data",
) -> SyntheticDataset | ByteWindowDataset:
    """Build the dataset for ``source`` ("synthetic", "text" or "jsonl").

    ``num_samples`` is used by "synthetic" only; file sources yield as many
    windows as the file holds. File sources are byte-level and need
    ``vocab_size >= 256``. Errors name the fields of the spec's ``section`` (data or
    data.eval).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if source == "synthetic":
        if num_samples < 1:
            raise ValueError(f"{section}.num_samples must be >= 1, got {num_samples}")
        if vocab_size < 2:
            raise ValueError(f"model vocab_size must be >= 2 for synthetic data, got {vocab_size}")
        return SyntheticDataset(
            seq_len=seq_len, num_samples=num_samples, vocab_size=vocab_size, seed=seed
        )
    if source not in _BYTE_SOURCES:
        raise ValueError(
            f"{section}.source {source!r} is not read byte-level; set one of: "
            f"synthetic, {', '.join(_BYTE_SOURCES)} (or use dataset_for with a tokenizer)"
        )
    if vocab_size < 256:
        raise ValueError(
            f"{section}.source {source!r} is byte-level and needs a model vocab_size >= 256, "
            f"got {vocab_size}"
        )
    path = _require_file(path, source, section)
    data = _read_text(path, section) if source == "text" else _read_jsonl(path, section)
    return ByteWindowDataset(data, seq_len=seq_len, path=path, section=section)


def dataset_for(
    data, *, tokenizer: str | None, vocab_size: int, seed: int, stores=None
) -> SyntheticDataset | ByteWindowDataset | TokenDataset:
    """The dataset of a job's data section ``data``: ``data`` or ``data.eval`` (its
    ``section``, which every error names: ``data.eval.path`` for the evaluation source).

    ``prepared`` reads a folder written by ``etrain data prepare``. With a
    ``tokenizer`` folder, file sources are tokenized once per node (a cached
    prepared folder); without one, text and jsonl are read as bytes. Object-store
    paths are reached with ``stores`` (a URL -> its StorageLocation, from the spec).
    """
    section = getattr(data, "section", "data")
    if data.source == "prepared":
        roots = cache_roots() if is_remote(data.path) else None  # a copy in the node cache
        folder = local_prepared(data.path, stores, section=section)
        ds = TokenDataset(folder, vocab_size=vocab_size, roots=roots, section=section)
        if ds.seq_len != data.seq_len:
            raise ValueError(
                f"{section}.path {data.path!r} was prepared with seq_len {ds.seq_len}, the spec "
                f"says data.seq_len {data.seq_len}; set data.seq_len: {ds.seq_len}"
            )
        return ds
    if data.source == "synthetic" or tokenizer is None:
        return _untokenized(data, section, vocab_size=vocab_size, seed=seed)
    folder = ensure_prepared(
        source=data.source,
        path=data.path,
        tokenizer=tokenizer,
        opts=ShapeOptions.of(data),
        vocab_size=vocab_size,
        stores=stores,
        section=section,
    )
    return TokenDataset(folder, vocab_size=vocab_size, roots=cache_roots(), section=section)


def _untokenized(
    data, section: str, *, vocab_size: int, seed: int
) -> SyntheticDataset | ByteWindowDataset:
    """The dataset of a section read without a tokenizer: synthetic, or bytes of a local
    text or jsonl file (a shape that reads fields, parquet and object stores need one)."""
    if data.shape != "text" or data.source == "parquet":
        shape = data.shape != "text"
        what = f"{section}.shape {data.shape!r}" if shape else f"{section}.source parquet"
        raise ValueError(
            f"{what} needs a tokenizer: set model.tokenizer (or model.hf) to a folder "
            "with tokenizer.json"
        )
    if is_remote(data.path):
        raise ValueError(
            f"{section}.path {data.path!r}: object-store data is tokenized; set model.tokenizer "
            "(or model.hf) to a folder with tokenizer.json, or copy the file to a local path"
        )
    return build_dataset(
        source=data.source,
        path=data.path,
        seq_len=data.seq_len,
        num_samples=data.num_samples,
        vocab_size=vocab_size,
        seed=seed,
        section=section,
    )
