"""The ``data`` section of the job spec: where samples come from and how they are shaped."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from workers.spec.base import MAX_STEPS, Spec, printable

FILE_SOURCES = ("text", "jsonl", "parquet", "prepared")
TEMPLATE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class DataSource(Spec):
    """Where samples come from and how they are shaped (the fields a training source and an
    evaluation source share)."""

    SECTION: ClassVar[str] = "data"  # where the section sits in the spec, for messages
    # Where this instance sits when that depends on it (data.sources.<i>): see ``section``.
    _at: str | None = PrivateAttr(None)

    @property
    def section(self) -> str:
        """Where this section sits in the spec (data, data.eval, data.sources.<i>): every
        message about it names its fields from here."""
        return self._at or self.SECTION

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
    shape: Literal["text", "instruction", "chat", "preference", "image"] = Field(
        "text",
        description="text: documents packed into one stream with EOS between them, cut into "
        "non-overlapping samples of seq_len + 1 tokens (the tail dropped); instruction: one "
        "sample per row, prompt then completion + EOS, padded; chat: one sample per row, "
        "the messages (role/content) rendered with the tokenizer's chat template. For "
        "instruction and chat the loss counts only completion / assistant tokens: it is the "
        "mean over the counted tokens of the whole global batch, whatever the world size "
        "and micro-batching. preference (objective dpo): two samples per row, prompt + "
        "chosen and prompt + rejected, only the answers' tokens counted; the prompt is a "
        "string (the answers strings) or a list of chat messages (the answers an assistant "
        "message, or a list of messages, rendered with the chat template). instruction, "
        "chat and preference need a tokenizer and jsonl or parquet rows. image (objective "
        "diffusion): one image with its caption per row, from jsonl (image_field: a path "
        "relative to the jsonl file's folder, read beneath the tenant's roots, at most 32 MiB "
        "and 64 megapixels) or parquet (the image's bytes, or a struct with a bytes field as "
        "Hugging Face datasets writes an Image column); the caption is tokenized with the "
        "model folder's tokenizer and must fit its text encoder.",
    )
    text_field: str = Field("text", max_length=256, description="Row field for shape text.")
    prompt_field: str = Field("prompt", max_length=256, description="Prompt field (instruction).")
    completion_field: str = Field(
        "completion", max_length=256, description="Completion field (instruction)."
    )
    messages_field: str = Field("messages", max_length=256, description="Messages field (chat).")
    chosen_field: str = Field(
        "chosen", max_length=256, description="Preferred answer field (preference)."
    )
    rejected_field: str = Field(
        "rejected", max_length=256, description="Rejected answer field (preference)."
    )
    image_field: str = Field(
        "image", max_length=256, description="Image field (image): a relative path or bytes."
    )
    caption_field: str = Field("caption", max_length=256, description="Caption field (image).")
    chat_template: str | None = Field(
        None,
        max_length=4096,
        description="Shapes chat and preference: the template the messages are rendered "
        "with instead of the tokenizer's own: the name of one of the tokenizer's named templates "
        "(tokenizer_config.json chat_template as a list of {name, template}), or the absolute "
        "path of a Jinja file (at most 256 KiB of UTF-8) inside the tenant's data area or a "
        "shared data root, read where it is used and rendered in Jinja's sandbox; a template "
        "that does not parse is a 422 naming this field. Unset: the tokenizer's template.",
    )
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
        return printable(v, f"{cls.SECTION}.path")

    @field_validator("chat_template")
    @classmethod
    def _template_name_or_path(cls, v: str | None) -> str | None:
        field = f"{cls.SECTION}.chat_template"
        if v is None or v.startswith("/"):
            return printable(v, field)
        if not TEMPLATE_NAME_RE.fullmatch(v):
            raise ValueError(
                f"{field} must be a template name (letters, digits, '_', '.', '-'; at most 64) "
                "or the absolute path of a Jinja file"
            )
        return v

    @model_validator(mode="after")
    def _path_matches_source(self) -> DataSource:
        at = self.SECTION
        if self.source in FILE_SOURCES and not self.path:
            raise ValueError(f"{at}.path is required when {at}.source is {self.source!r}")
        if self.source == "synthetic" and self.path:
            raise ValueError(
                f"{at}.path is only used with {at}.source text, jsonl, parquet or prepared; "
                "remove it"
            )
        if self.chat_template is not None and self.shape not in ("chat", "preference"):
            raise ValueError(
                f"{at}.chat_template renders chat messages; {at}.shape is {self.shape}: "
                f"remove {at}.chat_template or use shape chat"
            )
        if self.shape in ("preference", "image") and self.source == "prepared":
            raise ValueError(
                f"{at}.shape {self.shape} reads jsonl or parquet rows (each node tokenizes "
                f"them into its cache); set {at}.source jsonl or parquet"
            )
        if self.shape != "text" and self.source in ("synthetic", "text"):
            raise ValueError(
                f"{at}.shape {self.shape} reads fields of rows; {at}.source {self.source} has "
                "none: use jsonl or parquet (or prepared)"
            )
        return self


class EvalDataSpec(DataSource):
    """A held-out evaluation source, read and shaped like ``data`` (its own file, rows and
    fields; its seq_len is data.seq_len)."""

    SECTION: ClassVar[str] = "data.eval"


class SourceSpec(DataSource):
    """One of several training sources mixed by weight (``data.sources``)."""

    SECTION: ClassVar[str] = "data.sources"

    weight: float = Field(
        gt=0,
        le=1e6,
        description="This source's share of the samples: weight / the sum of the weights.",
    )
    eval_fraction: float | None = Field(
        None,
        gt=0,
        le=0.5,
        description="Hold out this fraction of this source's samples (seeded, never trained "
        "on) for the evaluation set: the held-out samples of every source that sets one, "
        "evaluated together as one eval_loss. Excludes data.eval.",
    )


class DataSpec(DataSource):
    """Where training samples come from, and the held-out samples evaluated beside them."""

    sources: list[SourceSpec] | None = Field(
        None,
        min_length=2,
        max_length=16,
        description="Several training sources mixed by weight, each with the fields of data "
        "(source, path, shape, field names, truncate, chat_template; num_samples for "
        "synthetic ones) and a weight; data.seq_len is theirs. Every global batch draws "
        "its samples from the sources in the proportion of their weights (a deterministic "
        "weighted round robin: within one sample per source at any point), and each source "
        "walks its own seeded epochs, so every sample of a source is seen once per that "
        "source's epoch, for any world size, across resizes and resumes. Replaces data's "
        "own source fields; not with data.eval_fraction (a source holds out its own "
        "eval_fraction) or packing.",
    )

    eval: EvalDataSpec | None = Field(
        None,
        description="A held-out evaluation set read from its own source: the same fields as "
        "data (source, path, shape, the field names, truncate; its path obeys the same rules, "
        "at submit and where it is read), seq_len always data.seq_len. Evaluated every "
        "train.eval_every_steps. Excludes eval_fraction.",
    )
    eval_fraction: float | None = Field(
        None,
        gt=0,
        le=0.5,
        description="Hold out this fraction of the training samples (rows for instruction "
        "and chat, seq_len windows for text; at least one) as the evaluation set, chosen at "
        "random from train.seed and never trained on; the same set for any world size, "
        "across resizes and resumes. Excludes eval.",
    )

    packing: bool = Field(
        False,
        description="Shape instruction or chat (or a prepared folder of them): put several "
        "samples end to end in each "
        "seq_len row instead of one padded sample per row (best-fit by length, fixed by the "
        "data alone). Each sample keeps its own positions (from 0) and attends only to its "
        "own tokens, so the loss is the unpacked loss of the same samples; an epoch walks "
        "the packed rows (each sample once), so global_batch_size counts rows. Not with "
        "parallelism.pp > 1. The evaluation set is evaluated unpacked.",
    )

    @model_validator(mode="after")
    def _sources_replace_the_source(self) -> DataSpec:
        if self.sources is None:
            return self
        # A dumped spec carries every default: only values other than those conflict.
        own = sorted(
            name
            for name, info in DataSource.model_fields.items()
            if name != "seq_len" and getattr(self, name) != info.default
        )
        if own:
            raise ValueError(
                f"data.sources replaces data's own source; move data.{', data.'.join(own)} "
                "into the sources"
            )
        for name in ("eval_fraction", "packing"):
            if getattr(self, name):
                raise ValueError(
                    f"data.{name} is not available with data.sources"
                    + ("; give each source its eval_fraction" if name == "eval_fraction" else "")
                )
        if self.eval is not None and any(s.eval_fraction for s in self.sources):
            raise ValueError(
                "data.eval and data.sources.<i>.eval_fraction both name an evaluation set; keep one"
            )
        mixed = []
        for i, src in enumerate(self.sources):
            if "seq_len" in src.model_fields_set and src.seq_len != self.seq_len:
                raise ValueError(
                    f"data.sources.{i}.seq_len ({src.seq_len}) must equal data.seq_len "
                    f"({self.seq_len}); remove it"
                )
            src = src.model_copy(update={"seq_len": self.seq_len})
            src._at = f"data.sources.{i}"
            mixed.append(src)
        object.__setattr__(self, "sources", mixed)
        return self

    def has_eval_set(self) -> bool:
        """Whether some samples are evaluated: data.eval, data.eval_fraction, or a source's
        eval_fraction."""
        held = any(s.eval_fraction for s in self.sources or ())
        return held or self.eval is not None or self.eval_fraction is not None

    def training_sections(self) -> list[DataSource]:
        """The sections training reads: its sources, or data itself."""
        return list(self.sources) if self.sources is not None else [self]

    def sections(self) -> list[DataSource]:
        """Every section naming samples: the training ones, then data.eval when set."""
        return self.training_sections() + ([self.eval] if self.eval is not None else [])

    @model_validator(mode="after")
    def _packs_masked_rows(self) -> DataSpec:
        if self.packing and self.shape == "text" and self.source != "prepared":
            raise ValueError(
                "data.packing packs instruction or chat samples; shape text is already one "
                "stream cut into full rows: remove data.packing"
            )
        return self

    @model_validator(mode="after")
    def _one_eval_set(self) -> DataSpec:
        if self.eval is not None and self.eval_fraction is not None:
            raise ValueError(
                "data.eval and data.eval_fraction both name an evaluation set; keep one"
            )
        if self.eval is None or self.eval.seq_len == self.seq_len:
            return self
        if "seq_len" in self.eval.model_fields_set:
            raise ValueError(
                f"data.eval.seq_len ({self.eval.seq_len}) must equal data.seq_len "
                f"({self.seq_len}); remove data.eval.seq_len"
            )
        # The evaluation source reads samples of the training length (a frozen model: set
        # the copy in place of the given one).
        object.__setattr__(self, "eval", self.eval.model_copy(update={"seq_len": self.seq_len}))
        return self
