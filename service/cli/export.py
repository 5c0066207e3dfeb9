"""``etrain export``: pick a job's checkpoint over REST and export it where the CLI runs.

The service knows the job's model preset, its checkpoint storage and its
committed checkpoints; the weights are read straight from checkpoint storage
(a mounted ``file://`` path, ``s3://`` or ``gs://``) by ``workers.checkpoint.export``, with
the credentials of this process's environment. That module (with torch) is
imported only inside :func:`export_job`, when an export actually runs: the one
place the control plane's code imports torch, so every other command stays fast.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.common import JobIdArg, client, session
from service.client import EtrainClient

if TYPE_CHECKING:
    from workers.checkpoint.export import ExportResult
    from workers.checkpoint.export_lora import AdapterExportResult
    from workers.spec import CheckpointSpec, StoresSpec


class ExportFormat(str, Enum):
    """File formats ``etrain export`` writes."""

    safetensors = "safetensors"


class ExportNaming(str, Enum):
    """Parameter names in the exported file: etrain's own, or Hugging Face Llama's."""

    etrain = "etrain"
    hf = "hf"


class ExportDtype(str, Enum):
    """Weight precision of the exported file."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class ExportRefused(Exception):
    """The export cannot run as asked; the message says what to change."""


# ``step`` of an export that takes the job's best checkpoint (``--best``).
BEST = "best"


def pick_checkpoint(
    checkpoints: list[dict[str, Any]], *, job_id: str, step: int | str | None
) -> dict[str, Any]:
    """The checkpoint at ``step``, the newest one when ``step`` is None, or the one the API
    marks best (the lowest held-out loss) when ``step`` is :data:`BEST`."""
    if not checkpoints:
        raise ExportRefused(
            f"job {job_id} has no committed checkpoints yet; export after "
            "its first checkpoint (checkpoint.every_steps) is saved"
        )
    by_step = {int(c["step"]): c for c in checkpoints}
    if step == BEST:
        best = [c for c in checkpoints if c.get("best")]
        if not best:
            raise ExportRefused(
                f"job {job_id} has no evaluated checkpoint to call best (it needs "
                "train.eval_every_steps and an evaluation set); pass --step instead"
            )
        return best[0]
    if step is None:
        return by_step[max(by_step)]
    if step not in by_step:
        steps = ", ".join(str(s) for s in sorted(by_step))
        raise ExportRefused(
            f"job {job_id} has no checkpoint at step {step}; "
            f"available steps: {steps} (pass one with --step)"
        )
    return by_step[step]


def job_preset(job: dict[str, Any]) -> str:
    """The model preset in a job's spec (what the checkpoint's weights are shaped by)."""
    preset = ((job.get("spec") or {}).get("model") or {}).get("preset")
    if not preset:
        raise ExportRefused(
            f"job {job.get('id')} has no spec.model.preset; export supports "
            "jobs that train a built-in preset"
        )
    return str(preset)


def job_checkpoint_section(job: dict[str, Any]) -> CheckpointSpec:
    """The job's ``checkpoint`` section, validated: where its checkpoints may lie."""
    from workers.spec import CheckpointSpec
    from workers.spec.stores import move_legacy_stores

    spec = move_legacy_stores(job.get("spec") or {})  # an older service's form too
    return CheckpointSpec.model_validate(spec.get("checkpoint") or {})


def job_stores_section(job: dict[str, Any]) -> StoresSpec:
    """The job's ``stores`` section, validated: it says how to reach its object stores."""
    from workers.spec.stores import stores_section

    return stores_section(job.get("spec") or {})


def export_job(
    api: EtrainClient,
    job_id: str,
    *,
    step: int | str | None,
    out: Path | None,
    dtype: ExportDtype | None,
    naming: ExportNaming,
) -> ExportResult:
    """Export ``job_id``'s checkpoint at ``step`` (default newest) into ``out``.

    ``out`` defaults to ``./<job id>-step<N>``; the checkpoint is read from the
    job's storage with this process's credentials. Raises ``ClientError`` when
    the service refuses, ``ExportRefused`` when the checkpoint cannot be exported.
    """
    job = api.get_job(job_id)
    if ((job.get("spec") or {}).get("model") or {}).get("lora"):
        raise ExportRefused(
            f"job {job_id} trained LoRA adapters (model.lora), its checkpoints hold no base: "
            "export the adapter with --adapter, or the base with it merged in with --merge"
        )
    model = (job.get("spec") or {}).get("model") or {}
    # A model.hf job exports a Hugging Face folder of its source (its spec also
    # carries the default preset, which does not describe the weights).
    preset = None if model.get("hf") else job_preset(job)
    chosen = pick_checkpoint(api.get_checkpoints(job_id), job_id=job_id, step=step)
    checkpoint, stores = job_checkpoint_section(job), job_stores_section(job)
    # torch loads here, only once there is something to export.
    from workers.checkpoint.export import ExportError, export_checkpoint, open_checkpoint_dir
    from workers.storage.location import quiet_storage_loggers

    quiet_storage_loggers()  # their DEBUG records would print signed headers
    try:
        source = open_checkpoint_dir(chosen["uri"], checkpoint=checkpoint, stores=stores)
        return export_checkpoint(
            source,
            out or Path(f"{job_id}-step{chosen['step']}"),
            preset=preset,
            hf=model.get("hf"),
            tokenizer=model.get("tokenizer"),
            dtype=dtype.value if dtype else None,
            naming=naming.value,
            job_id=job_id,
            source_uri=chosen["uri"],
            store=stores,  # how to reach an object-store model.hf / model.tokenizer
        )
    except ExportError as e:
        raise ExportRefused(str(e)) from None


def export_lora_job(
    api: EtrainClient, job_id: str, *, step: int | str | None, out: Path | None, merge: bool
) -> AdapterExportResult:
    """A LoRA job's adapter in peft's format, or (``merge``) merged into its base."""
    job = api.get_job(job_id)
    lora = ((job.get("spec") or {}).get("model") or {}).get("lora")
    if not lora:
        raise ExportRefused(
            f"job {job_id} has no model.lora: --adapter and --merge export LoRA jobs; "
            "export its full model without them"
        )
    chosen = pick_checkpoint(api.get_checkpoints(job_id), job_id=job_id, step=step)
    checkpoint, stores = job_checkpoint_section(job), job_stores_section(job)
    from workers.checkpoint.export import ExportError, open_checkpoint_dir
    from workers.checkpoint.export_lora import export_adapter, export_merged
    from workers.storage.location import quiet_storage_loggers

    quiet_storage_loggers()
    kind = "merged" if merge else "adapter"
    try:
        source = open_checkpoint_dir(chosen["uri"], checkpoint=checkpoint, stores=stores)
        write = export_merged if merge else export_adapter
        out = out or Path(f"{job_id}-step{chosen['step']}-{kind}")
        return write(source, out, lora=lora, store=stores)  # store: reaches model.hf
    except ExportError as e:
        raise ExportRefused(str(e)) from None


def _export_lora(ctx: typer.Context, job_id: str, *, step, out, merge: bool) -> None:
    s = session(ctx)
    with s.api_errors():
        try:
            r = export_lora_job(client(ctx), job_id, step=step, out=out, merge=merge)
        except ExportRefused as e:
            raise s.fail(str(e)) from None
    s.console.print(
        f"exported job {job_id} step {r.step} {r.what}, {r.num_params:,} parameters, "
        f"{r.bytes:,} bytes, to {r.out_dir}",
        markup=False,
    )


def export(
    ctx: typer.Context,
    job_id: JobIdArg,
    step: Annotated[int | None, typer.Option(help="Checkpoint step (default: newest).")] = None,
    best: Annotated[
        bool,
        typer.Option(
            "--best", help="The best checkpoint: the lowest held-out loss (eval_loss) kept."
        ),
    ] = False,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="Output format.")] = (
        ExportFormat.safetensors
    ),
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: ./<job id>-step<N>).")
    ] = None,
    dtype: Annotated[
        ExportDtype | None, typer.Option(help="Cast weights (default: keep the checkpoint's).")
    ] = None,
    naming: Annotated[
        ExportNaming,
        typer.Option(
            help="Parameter names: etrain's, or Hugging Face Llama's (model.hf jobs: always "
            "Hugging Face's, with the source's config.json and tokenizer files)."
        ),
    ] = ExportNaming.etrain,
    adapter: Annotated[
        bool, typer.Option("--adapter", help="LoRA jobs: the adapter alone, in peft's format.")
    ] = False,
    merge: Annotated[
        bool, typer.Option("--merge", help="LoRA jobs: the base with the adapter merged in.")
    ] = False,
) -> None:
    """Export a job's checkpoint as one model.safetensors plus config.json (reads storage
    directly); a LoRA job's adapter with --adapter, merged into its base with --merge."""
    if best and step is not None:
        raise session(ctx).fail("pass --step or --best, not both")
    step = BEST if best else step
    if adapter or merge:
        return _export_lora(ctx, job_id, step=step, out=out, merge=merge)
    s = session(ctx)
    with s.api_errors():
        try:
            result = export_job(client(ctx), job_id, step=step, out=out, dtype=dtype, naming=naming)
        except ExportRefused as e:
            raise s.fail(str(e)) from None
    s.console.print(
        f"exported job {job_id} step {result.step} ({result.preset}, {result.num_params:,} "
        f"parameters, {result.dtype}, {result.naming} names) to {result.out_dir}: "
        f"model.safetensors ({result.bytes:,} bytes), config.json, etrain_export.json",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``export`` to ``app``."""
    app.command("export")(export)
