"""``etrain data prepare``: tokenize a dataset once into memory-mapped token shards.

Runs where the CLI runs, on files this machine can read or on ``s3://`` / ``gs://``
objects (reached with the spec's ``stores.s3`` / ``stores.gcs`` options and
this machine's credentials, rows streamed): the result is a local folder
(``tokens.npy``, ``targets.npy`` for instruction/chat, ``counts.npy``,
``index.json``) that a job names with ``data.source: prepared`` and
``data.path: DIR``, so its workers train without tokenizing. The options come
from a job spec file (its ``data`` section and ``model.tokenizer`` /
``model.hf``), from flags, or both (flags win). The tokenizer code (and with it
torch) is imported only inside :func:`prepare_command`, when it runs.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.common import session

data_app = typer.Typer(help="Prepare datasets for training.", no_args_is_help=True)


class Shape(str, Enum):
    """How rows become samples."""

    text = "text"
    instruction = "instruction"
    chat = "chat"


class Source(str, Enum):
    """File formats ``etrain data prepare`` reads."""

    text = "text"
    jsonl = "jsonl"
    parquet = "parquet"


def merged_options(spec: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The data section of ``spec`` with the flags given on top; ``tokenizer`` from
    the flag, else model.tokenizer, else model.hf."""
    data = dict(spec.get("data") or {})
    model = spec.get("model") or {}
    tokenizer = flags.pop("tokenizer", None) or model.get("tokenizer") or model.get("hf")
    data.update({k: v for k, v in flags.items() if v is not None})
    return {
        "data": data,
        "tokenizer": tokenizer,
        "model": model,
        "checkpoint": spec.get("checkpoint"),  # an old spec's checkpoint.s3 / gcs
        "stores": spec.get("stores"),
    }


def model_vocab_size(model: dict[str, Any]) -> int | None:
    """The vocab_size of the spec's model (a local model.hf's config.json, else its preset),
    or None when the spec names no model: the tokenizer must fit it."""
    from workers.models.config import get_model_config
    from workers.models.hf_config import config_from_hf, read_hf_config_text

    hf = model.get("hf")
    if hf:
        config = Path(str(hf).removeprefix("file://")) / "config.json"
        if "://" in str(hf).removeprefix("file://") or not config.is_file():
            return None  # an object-store folder: the workers check it
        return config_from_hf(read_hf_config_text(config.read_bytes())).vocab_size
    preset = model.get("preset")
    return get_model_config(preset).vocab_size if preset else None


def prepare_command(options: dict[str, Any], out: Path) -> dict[str, Any]:
    """Validate the merged options as a data section and write the prepared folder."""
    from workers.data.prepare import prepare
    from workers.data.samples import ShapeOptions
    from workers.spec.data import DataSpec
    from workers.spec.stores import stores_section
    from workers.storage.location import stores_for

    data = DataSpec.model_validate(options["data"])
    # The spec's stores.s3 / stores.gcs options (old specs: checkpoint.s3 / checkpoint.gcs)
    # reach s3:// / gs:// inputs.
    stores = stores_section(options)
    if data.source in ("synthetic", "prepared"):
        raise ValueError(
            f"data.source {data.source!r} has nothing to prepare; use text, jsonl or parquet"
        )
    if not options["tokenizer"]:
        raise ValueError(
            "no tokenizer: pass --tokenizer DIR or set model.tokenizer (or model.hf) in the spec"
        )
    opts = ShapeOptions.of(data)
    return prepare(
        source=data.source,
        path=data.path,
        tokenizer=options["tokenizer"],
        opts=opts,
        out=str(out),
        vocab_size=model_vocab_size(options.get("model") or {}),
        stores=stores_for(stores),
    )


@data_app.command("prepare")
def prepare(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Folder to write the shards and index into.")],
    spec: Annotated[
        Path | None, typer.Option(help="Job spec (YAML/JSON): its data and model sections.")
    ] = None,
    source: Annotated[Source | None, typer.Option(help="File format.")] = None,
    path: Annotated[
        str | None, typer.Option(help="The data file (a path, s3:// or gs://).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer folder (tokenizer.json, tokenizer_config.json).")
    ] = None,
    shape: Annotated[Shape | None, typer.Option(help="text, instruction or chat.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Tokens per sample.")] = None,
    truncate: Annotated[
        bool | None, typer.Option("--truncate/--no-truncate", help="Cut long samples.")
    ] = None,
    text_field: Annotated[str | None, typer.Option(help="Row field for shape text.")] = None,
    prompt_field: Annotated[str | None, typer.Option(help="Prompt field.")] = None,
    completion_field: Annotated[str | None, typer.Option(help="Completion field.")] = None,
    messages_field: Annotated[str | None, typer.Option(help="Messages field (chat).")] = None,
) -> None:
    """Tokenize a text, jsonl or parquet file once into memory-mapped token shards (train
    from them with data.source: prepared, data.path: OUT)."""
    s = session(ctx)
    raw = (s.load_file(spec) or {}) if spec is not None else {}
    if not isinstance(raw, dict):
        raise s.fail(f"{spec} is not a job spec (a mapping)")
    flags = {
        "source": source.value if source else None,
        "path": path,
        "tokenizer": tokenizer,
        "shape": shape.value if shape else None,
        "seq_len": seq_len,
        "truncate": truncate,
        "text_field": text_field,
        "prompt_field": prompt_field,
        "completion_field": completion_field,
        "messages_field": messages_field,
    }
    try:
        index = prepare_command(merged_options(raw, flags), out)
    except ValueError as e:  # pydantic's ValidationError is one too
        raise s.fail(str(e)) from None
    s.console.print(
        f"prepared {index['num_samples']} {index['shape']} samples of {index['seq_len'] + 1} "
        f"tokens from {index['source']['name']} into {out} (train with data.source: prepared, "
        f"data.path: {out.resolve()})",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``data`` (with ``prepare``) to ``app``."""
    app.add_typer(data_app, name="data")
