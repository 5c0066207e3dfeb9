"""The model a job's experiment trackers log at its end (``metrics.mlflow.log_model``,
``metrics.wandb.log_model``): its final committed checkpoint exported as ``etrain export``
would, into a folder the tracker uploads.

A LoRA job logs its adapter in peft's format (``adapter_config.json`` +
``adapter_model.safetensors``), a ``model.hf`` job a Hugging Face folder of its
architecture with the tokenizer files, a preset job ``model.safetensors`` with its
``config.json``. The export reads the checkpoint where it lies, with the job's stores.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from workers.checkpoint.export import export_checkpoint, open_checkpoint_dir
from workers.checkpoint.export_lora import export_adapter

# (final checkpoint's URI, an empty folder) -> the folder, holding the exported model.
Exporter = Callable[[str, str], str]


def final_model_exporter(spec) -> Exporter | None:
    """How to export ``spec``'s final checkpoint for its trackers; None when no tracker
    asks for the model."""
    trackers = (spec.metrics.mlflow, spec.metrics.wandb)
    if not any(getattr(t, "log_model", False) for t in trackers):
        return None

    def export(uri: str, out_dir: str) -> str:
        source = open_checkpoint_dir(uri, checkpoint=spec.checkpoint, stores=spec.stores)
        model = spec.model
        if model.lora is not None:
            export_adapter(source, out_dir, lora=model.lora, store=spec.stores)
        else:
            export_checkpoint(
                source,
                out_dir,
                preset=None if model.hf else model.preset,
                hf=model.hf,
                tokenizer=model.tokenizer,
                naming="hf" if model.hf else "etrain",
                source_uri=uri,
                store=spec.stores,
            )
        return os.fspath(out_dir)

    return export
