"""The job as a Weights & Biases run (``metrics.wandb``), logged by rank 0 off the
training thread.

The run's id and name are the job's: a restarted job continues its run (``resume``). Config:
the whole spec, flattened (``train.lr``). History: each step's numbers
(:func:`workers.telemetry.tracking.measured`) as ``train/<field>`` (``eval/loss`` and
``eval/perplexity`` on the steps that evaluate, ``eval/<field>`` for the other eval_*
fields) against the step metric ``train/step`` (so a restarted run's steps, computed again,
are plotted where they belong). Events: a marker ``events/<kind>`` = 1 at their step, and a
line each of the run's notes (alerts are not available offline). ``log_model``: at the end,
the model artifact ``<job id>-checkpoint`` holding ``checkpoint.json`` (the final
checkpoint's URI, step, size and eval_loss) and ``model/``, the checkpoint exported
(``workers.checkpoint.export_final``), and the summary key ``checkpoint``.

Files: ``offline`` runs are written under ``<checkpoints>/wandb`` (``wandb sync`` sends
them later); on an object store they are written locally and copied there at the end.
``online`` runs keep their local files in a temporary folder, removed at the end. The
client's stdout capture and system metrics are off: it adds no work to the training thread.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile

from workers.storage.confine import Roots, check_folder
from workers.telemetry.tracking import TrackingSink, measured, run_id_for

log = logging.getLogger(__name__)

_INIT_TIMEOUT_S = 10.0  # within the sink's close wait, so a failure is reported
_EVAL_NAMES = {"eval_loss": "eval/loss", "eval_perplexity": "eval/perplexity"}


def history_key(field: str) -> str:
    """The history key of a MetricPoint field: ``train/loss``, ``eval/loss``, ..."""
    if field in _EVAL_NAMES:
        return _EVAL_NAMES[field]
    return f"eval/{field[5:]}" if field.startswith("eval_") else f"train/{field}"


class WandbSink(TrackingSink):
    """One job's W&B run (see the module docstring)."""

    name = "wandb"

    def __init__(
        self,
        section,
        *,
        job_id: str,
        params: dict[str, str],
        reporter,
        checkpoints,
        exporter=None,
    ):
        self.checkpoints = checkpoints
        super().__init__(
            job_id=job_id, params=params, reporter=reporter, section=section, exporter=exporter
        )
        self.run, self.notes = None, []
        self.folder, self.upload_to = None, None  # chosen (and checked) by open
        self.start()

    def _folder(self):
        """``(where the client writes, the store location to copy it to at the end or None)``."""
        place = self.checkpoints.child("wandb") if self.checkpoints is not None else None
        if self.section.mode == "offline" and place is not None and place.scheme == "file":
            return check_folder(place.root, Roots.from_env(), write=True, create=True), None
        tmp = tempfile.mkdtemp(prefix="etrain-wandb-")
        return tmp, place if self.section.mode == "offline" else None

    def open(self) -> None:
        import wandb

        self.folder, self.upload_to = self._folder()
        os.environ.pop("WANDB_API_KEY", None)  # only the job's own secret is sent
        settings = wandb.Settings(
            mode=self.section.mode,
            api_key=self.credentials["WANDB_API_KEY"],
            init_timeout=_INIT_TIMEOUT_S,
            console="off",
            x_disable_stats=True,
            silent=True,
            disable_git=True,
            save_code=False,
        )
        self.run = wandb.init(
            project=self.section.project,
            entity=self.section.entity,
            id=run_id_for(self.job_id),
            name=self.job_id,
            resume="allow",
            dir=self.folder,
            config=self.params,
            settings=settings,
            reinit="create_new",
        )
        for prefix in ("train", "eval", "events"):
            self.run.define_metric(f"{prefix}/*", step_metric="train/step")

    def send(self, items: list[tuple]) -> None:
        notes = len(self.notes)
        for what, step, payload in items:
            if what == "metric":
                row = {history_key(k): v for k, v in measured(payload).items()}
                self.run.log({"train/step": step, **row})
            elif what == "event":
                kind, message = payload
                self.run.log({"train/step": step, f"events/{kind}": 1})
                self.notes.append(f"step {step}: {kind}: {message}")
        if len(self.notes) > notes:
            self.run.notes = "\n".join(self.notes)

    def end(self, checkpoint) -> None:
        import wandb

        if self.section.log_model and checkpoint is not None:
            record = checkpoint.model_dump(mode="json", exclude={"deleted_steps"})
            artifact = wandb.Artifact(
                f"{run_id_for(self.job_id)}-checkpoint", type="model", metadata=record
            )
            with artifact.new_file("checkpoint.json") as f:
                f.write(json.dumps(record))
            with self.exported(checkpoint) as folder:
                if folder is not None:  # copied into the artifact's staging now
                    artifact.add_dir(folder, name="model")
                self.run.log_artifact(artifact)
            self.run.summary["checkpoint"] = checkpoint.uri
        self.run.finish(exit_code=0)
        # finish only tells W&B's service process that the run is over: it closes the run's
        # files afterwards. Tearing the service down waits for that, so the files are whole
        # when they are copied to the store or read (the next run starts a service again).
        wandb.teardown()

    def finish(self) -> None:
        super().finish()
        if self.upload_to is not None:
            self._copy_to_store()
        elif self.section.mode == "online" and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _copy_to_store(self) -> None:
        """The offline run's files, from the local folder to ``<checkpoints>/wandb``."""
        try:
            for root, _dirs, files in os.walk(self.folder):
                for name in files:
                    path = os.path.join(root, name)
                    rel = os.path.relpath(path, self.folder)
                    self.upload_to.fs.put_file(path, self.upload_to.join(rel))
        except Exception as e:  # noqa: BLE001 - the files stay where they are
            log.warning(
                "wandb: offline run not copied to %s (%s); it is in %s",
                self.upload_to.uri,
                type(e).__name__,
                self.folder,
            )
            return
        shutil.rmtree(self.folder, ignore_errors=True)
