"""The ``data`` section of the job spec: where samples come from and how they are shaped."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from workers.spec.base import MAX_STEPS, Spec, printable

FILE_SOURCES = ("text", "jsonl", "parquet", "prepared")


class DataSpec(Spec):
    """Where training samples come from."""

    source: Literal["synthetic", "text", "jsonl", "parquet", "prepared"] = Field(
        "synthetic",
        description="synthetic (seeded random tokens); text (a UTF-8 file, one document), "
        "jsonl (one JSON object per line) or parquet (read with pyarrow), tokenized with "
        "model.tokenizer (else model.hf's tokenizer) once per node into cached token shards "
        "($ETRAIN_DATA_CACHE, default <tmp>/etrain-data-cache; one process tokenizes, the "
        "others wait for it); without a tokenizer text and jsonl are read as bytes (token = "
        "byte, shape text only). prepared: a folder written by `etrain data prepare` "
        "(memory-mapped; its index fixes the shape; no tokenizer needed).",
    )
    path: str | None = Field(
        None,
        description="Absolute path of the file (or prepared folder) to read; must exist "
        "on every worker and lie inside the tenant's data area, <data dir>/tenants/<tenant> "
        "(ETRAIN_POLICY_DATA_ROOT), or a shared data root (ETRAIN_POLICY_SHARED_DATA_ROOTS), "
        "resolved through '..' and symlinks. Or an object: s3://bucket/key or gs://bucket/key "
        "under an object-store prefix the operator lists for the tenant "
        "(ETRAIN_POLICY_OBJECT_STORES), reached with stores.s3 (s3://) or stores.gcs (gs://), "
        "as its scheme selects (on s3://, with stores.s3.credentials_secret unless the tenant "
        "may use the service's keys); rows are streamed, each node tokenizes it once into "
        "its cache (keyed by URL, size and ETag), a prepared folder is copied once "
        "per node and memory-mapped; object-store data needs a tokenizer. At submit, when the "
        "service can read it, its first 200 rows are checked (valid JSON / parquet, the "
        "fields the shape reads; a prepared folder's index; of an object, its first MiB or "
        "a parquet file's columns; of a local parquet file, its columns and the rows of its "
        "first row group within 4 MiB decoded, or only its columns when that row group's "
        "columns are larger uncompressed) and a problem is a 422 naming the file and row.",
    )
    shape: Literal["text", "instruction", "chat"] = Field(
        "text",
        description="text: documents packed into one stream with EOS between them, cut into "
        "non-overlapping samples of seq_len + 1 tokens (the tail dropped); instruction: one "
        "sample per row, prompt then completion + EOS, padded; chat: one sample per row, "
        "the messages (role/content) rendered with the tokenizer's chat template. For "
        "instruction and chat the loss counts only completion / assistant tokens: it is the "
        "mean over the counted tokens of the whole global batch, whatever the world size "
        "and micro-batching. instruction and chat need a tokenizer and jsonl or parquet rows.",
    )
    text_field: str = Field("text", max_length=256, description="Row field for shape text.")
    prompt_field: str = Field("prompt", max_length=256, description="Prompt field (instruction).")
    completion_field: str = Field(
        "completion", max_length=256, description="Completion field (instruction)."
    )
    messages_field: str = Field("messages", max_length=256, description="Messages field (chat).")
    truncate: bool = Field(
        False,
        description="Cut instruction/chat samples longer than seq_len + 1 tokens; when false "
        "such a sample is an error naming the file and row.",
    )
    seq_len: int = Field(
        128,
        ge=8,
        le=131072,
        description="Tokens per sample. Prepared data must have been prepared with the same.",
    )
    num_samples: int = Field(
        4096,
        ge=1,
        le=MAX_STEPS,
        description="Samples per epoch for source synthetic (ignored otherwise).",
    )

    @field_validator("path")
    @classmethod
    def _printable_path(cls, v: str | None) -> str | None:
        return printable(v, "data.path")

    @model_validator(mode="after")
    def _path_matches_source(self) -> DataSpec:
        if self.source in FILE_SOURCES and not self.path:
            raise ValueError(f"data.path is required when data.source is {self.source!r}")
        if self.source == "synthetic" and self.path:
            raise ValueError(
                "data.path is only used with data.source text, jsonl, parquet or prepared; "
                "remove it"
            )
        if self.shape != "text" and self.source in ("synthetic", "text"):
            raise ValueError(
                f"data.shape {self.shape} reads fields of rows; data.source {self.source} has "
                "none: use jsonl or parquet (or prepared)"
            )
        return self
