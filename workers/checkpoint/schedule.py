"""The train loop's checkpoint side: when to save, sync or async, and what to report.

Every decision here is taken identically on all ranks: step-based intervals
are deterministic, the time-based one and "all ranks finished writing" are
votes carried by the step's loss all-reduce, and the automatic interval is
chosen by rank 0 and broadcast at a save point, where all ranks stand.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import torch.distributed as dist

from workers.checkpoint.async_save import AsyncSaver, SaveOutcome
from workers.checkpoint.interval import AutoIntervalPolicy, IntervalDecision, changed
from workers.checkpoint.manager import CheckpointManager
from workers.contract import CheckpointRecord, EventKind
from workers.models.lora import base_reference, check_base
from workers.spec import JobSpec
from workers.storage.location import stores_for


def lora_base(spec: JobSpec, restored_extra: dict | None) -> dict | None:
    """A LoRA job's base reference (None without LoRA); checked against the restored one."""
    if spec.model.lora is None:
        return None
    current = base_reference(  # an object-store model.hf is reached with the spec's options
        spec.model,
        seed=spec.train.seed,
        stores=stores_for(spec.stores),
        part="unet" if spec.objective == "diffusion" else "",
    )
    if restored_extra is not None:
        check_base(restored_extra.get("lora_base"), current)
    return current


class SaveSchedule:
    """Saves for one run of the loop; all methods are called by every rank alike."""

    def __init__(
        self,
        spec: JobSpec,
        env,
        ckpts: CheckpointManager | None,
        *,
        restored_extra: dict | None = None,
    ):
        self.spec, self.env, self.ckpts = spec, env, ckpts
        ck = spec.checkpoint
        self.every_steps = ck.every_steps
        hooks = env.hooks
        self.saver = (
            AsyncSaver(ckpts, wrap_writer=hooks.storage_writer if hooks else None)
            if ckpts is not None and ck.async_
            else None
        )
        self.last_save = time.monotonic()
        # LoRA checkpoints hold only the adapters: they name the base they need.
        self.lora_base = lora_base(spec, restored_extra)
        self.policy: AutoIntervalPolicy | None = None
        self.decision: IntervalDecision | None = None
        if ckpts is not None and ck.interval == "auto":
            seen = (restored_extra or {}).get("interval", {})
            # Every restore follows an interruption (a failure or a resize): counted
            # as a failure, which errs towards checkpointing more often.
            self.policy = AutoIntervalPolicy(
                prior_mtbf_s=ck.mtbf_prior_s,
                initial_steps=ck.every_steps or 100,
                observed_failures=seen.get("failures", 0) + (1 if restored_extra else 0),
                observed_run_s=seen.get("run_s", 0.0),
            )
            self.every_steps = self.policy.initial_steps

    def votes(self) -> tuple[bool, bool]:
        """This rank's votes for the step's all-reduce: (time-based save due, writes done)."""
        every = self.spec.checkpoint.every_seconds
        due = bool(self.ckpts and every and time.monotonic() - self.last_save >= every)
        return due, self.saver is not None and self.saver.written_here()

    def extra_state(self) -> dict:
        """What the manifest keeps for the next run's interval policy."""
        out = {} if self.lora_base is None else {"lora_base": self.lora_base}
        if self.policy is not None:
            out["interval"] = {"failures": self.policy.failures, "run_s": self.policy.run_s}
        return out

    def after_step(
        self,
        *,
        step: int,
        dt: float,
        due_votes: int,
        done_votes: int,
        stepper,
        extra: Callable[[], dict],
        final: bool = False,
    ) -> None:
        """Commit a finished async save; save if one is due now (or ``final``: the run ends
        with this step although the spec runs longer)."""
        if self.ckpts is None:
            return
        if self.policy is not None and self.env.rank == 0:
            self.policy.observe_steps(1, dt)
        if self.saver is not None and self.saver.inflight and done_votes == self.env.world_size:
            self._finish()
        last = step == self.spec.train.steps or final
        if due_votes or last or (self.every_steps and step % self.every_steps == 0):
            self._save(step=step, stepper=stepper, extra=extra())

    def close(self) -> None:
        """Wait for (and commit) the save in flight: the run ends with its checkpoint."""
        if self.saver is not None and self.saver.inflight:
            self._finish()

    def _save(self, *, step: int, stepper, extra: dict) -> None:
        state = stepper.app_state()
        self.last_save = time.monotonic()
        if self.saver is None:
            t0 = time.perf_counter()
            self._flush()
            info = self.ckpts.save(step=step, app_state=state, extra=extra)
            blocking = time.perf_counter() - t0
            self._report(SaveOutcome(step=step, info=info, blocking_s=blocking, total_s=blocking))
            return
        t0 = time.perf_counter()
        if self.saver.inflight:  # at most one in flight: wait for the previous one
            self._finish()
        self.saver.start(step=step, app_state=state, extra=extra, waited_s=time.perf_counter() - t0)

    def _finish(self) -> None:
        self._flush()
        self._report(self.saver.finish())

    def _flush(self) -> None:
        # The steps a checkpoint covers reach the control plane before it commits:
        # a run restored from it never recomputes (and so never re-reports) them.
        if self.env.reporter is not None:
            self.env.reporter.flush(timeout=5.0)

    def _report(self, out: SaveOutcome) -> None:
        env, info = self.env, out.info
        if env.rank == 0 and env.reporter is not None:
            if info is None:
                env.reporter.event(
                    EventKind.CHECKPOINT_FAILED,
                    f"checkpoint of step {out.step} failed: {out.error}",
                    data={"step": out.step, "error": out.error},
                    dedup_key=f"ckpt-fail:{out.step}:{uuid.uuid4().hex[:8]}",
                )
            else:
                env.reporter.checkpoint(
                    CheckpointRecord(
                        step=out.step,
                        uri=info.uri,
                        bytes=info.bytes,
                        save_s=out.total_s,
                        blocking_s=out.blocking_s,
                        eval_loss=info.extra.get("eval_loss"),
                        deleted_steps=list(info.pruned),
                    )
                )
                env.reporter.event(
                    EventKind.CHECKPOINT_SAVED,
                    f"checkpoint saved at step {out.step}",
                    data={
                        "step": out.step,
                        "bytes": info.bytes,
                        "save_s": out.total_s,
                        "blocking_s": out.blocking_s,
                    },
                    dedup_key=f"ckpt:{out.step}:{os.path.basename(info.path)}:{out.total_s}",
                )
        if info is not None and self.policy is not None:
            self._retune(out.blocking_s)

    def _retune(self, blocking_s: float) -> None:
        """Rank 0 re-decides the automatic interval; every rank adopts it."""
        box: list = [None]
        if self.env.rank == 0:
            self.policy.observe_checkpoint(blocking_s)
            new = self.policy.decide()
            if changed(self.decision, new):
                self.decision = new
                if self.env.reporter is not None:
                    self.env.reporter.event(
                        EventKind.CHECKPOINT_INTERVAL,
                        f"checkpoint every {new.steps} steps ({new.reason})",
                        data=new.as_event_data(),
                        dedup_key=f"interval:{uuid.uuid4().hex[:12]}",
                    )
            box = [self.decision.steps if self.decision else self.every_steps]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        self.every_steps = box[0]
