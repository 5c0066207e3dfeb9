"""The planner's activation estimate against measured activation memory, every strategy.

Each row runs one step on 2 gloo processes (one group for the whole table) and
every rank reports the peak of its live activations during the step
(``workers.telemetry.memory.ActivationMeter``: torch's MemTracker, and on a
pipeline rank ``LiveActivations``; either way a freed tensor leaves the count and
a checkpointed block's recompute enters it). The planner's ``activation_bytes``
must match within TOLERANCE, for activation checkpointing none, full and
selective, for LoRA, and on both stages of a GPipe and a 1F1B pipeline.

What the two count the same way: the model's saved tensors and, on the last
stage, the logits, which the planner keeps as its ``logits_grad`` buffer (the
logits and their gradient have one size; the step holds the logits to the end
of its backward, under GPipe every micro-batch's). The rotary table and the
pipeline's receive buffers are buffers on both sides; a stage's output, held
by the schedule until its backward, is an activation on both.
"""

from __future__ import annotations

import copy

import pytest

from service.planner.memory_model import FP32, activation_bytes, logits_in_flight
from service.planner.planning import layout_of, workload_of
from tests.support.local_launch import LocalJob, run_local
from workers.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.no_ray]

# CPU, fp32: measured 0.98-1.02 of the plan on the rows below (TOLERANCE leaves room
# for transient tensors, e.g. the first recompute's).
TOLERANCE = 0.10
BASE = {
    "model": {"preset": "gpt-small"},
    "data": {"seq_len": 32, "num_samples": 64},
    "resources": {"workers": 2, "cpus_per_worker": 1},
    "train": {"steps": 1, "global_batch_size": 4, "micro_batch_size": 2},
}
LAYOUTS = {
    "ddp": {"strategy": "ddp"},
    "tp": {"strategy": "tp", "tp": 2},
    "fsdp-zero3": {"strategy": "fsdp", "fsdp": {"zero_stage": 3}},
    "pp-1f1b": {"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 2}},
    "pp-gpipe": {"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 2, "schedule": "gpipe"}},
}
LORA = {"rank": 8, "target_modules": ["q_proj", "v_proj", "gate_proj", "down_proj"]}
AC = ("none", "full", "selective")
ROWS = {
    f"{name}-{ac}": (LAYOUTS[name], {"activation_checkpointing": ac})
    for name in ("ddp", "tp", "fsdp-zero3")
    for ac in AC
}
ROWS |= {
    f"{name}-{ac}": (LAYOUTS[name], {"activation_checkpointing": ac})
    for name in ("pp-1f1b", "pp-gpipe")
    for ac in ("none", "full")
}
ROWS |= {
    f"{name}-lora-{ac}": (LAYOUTS[name], {"activation_checkpointing": ac, "lora": LORA})
    for name in ("ddp", "fsdp-zero3")
    for ac in ("none", "selective")
}


def _spec(name: str) -> JobSpec:
    par, model = ROWS[name]
    spec = copy.deepcopy(BASE)
    spec["name"] = name
    spec["parallelism"] = par
    spec["model"].update(model)
    return JobSpec.model_validate(spec)


# A DeepSpeed ZeRO-3 job, and the row after it again in the same processes (a warm
# worker's next job): ZeRO-3 replaces torch's linear for the whole process.
ZERO3 = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
AFTER_ZERO3 = "tp-full"


@pytest.fixture(scope="module")
def measured() -> dict:
    jobs = [
        LocalJob(name, _spec(name).model_dump(mode="json", by_alias=True), measure_memory=True)
        for name in ROWS
    ]
    zero3 = copy.deepcopy(jobs[0].spec) | {"name": "zero3", "parallelism": ZERO3}
    jobs.append(
        LocalJob(
            "zero3", JobSpec.model_validate(zero3).model_dump(mode="json"), measure_memory=True
        )
    )
    again = jobs[list(ROWS).index(AFTER_ZERO3)].spec
    jobs.append(LocalJob(f"{AFTER_ZERO3}-again", again, measure_memory=True))
    return run_local(jobs, world_size=2)


def test_a_job_after_a_zero3_job_in_the_same_process_measures_the_same(measured):
    before, after = measured[AFTER_ZERO3], measured[f"{AFTER_ZERO3}-again"]
    assert measured["zero3"].error is None and after.error is None, measured["zero3"].error
    assert [m["activations_bytes"] for m in after.memory] == [
        m["activations_bytes"] for m in before.memory
    ]


def predicted(spec: JobSpec, rank: int) -> int:
    work, layout = workload_of(spec), layout_of(spec, 2)
    pp_rank = rank // (layout.dp * layout.tp)
    act = activation_bytes(work, layout, pp_rank=pp_rank)
    last = pp_rank == layout.pp - 1
    tokens = work.micro_batch_size * work.seq_len
    logits = FP32 * tokens * work.cfg.vocab_size * logits_in_flight(layout)
    return act + (logits if last else 0)


@pytest.mark.parametrize("row", list(ROWS))
def test_planner_predicts_measured_activations(measured, row):
    res = measured[row]
    assert res.error is None, res.error
    spec = _spec(row)
    for rank, got in enumerate(res.memory):
        want = predicted(spec, rank)
        print(f"ACTCHECK {row} rank {rank}: measured {got['activations_bytes']} planned {want}")
        assert got["activations_bytes"] == pytest.approx(want, rel=TOLERANCE), (row, rank)


def test_checkpointing_and_lora_measure_less(measured):
    """The orderings the planner relies on hold in the measurement itself."""

    def act(row: str) -> int:
        return max(m["activations_bytes"] for m in measured[row].memory)

    for name in ("ddp", "tp", "fsdp-zero3"):
        assert act(f"{name}-full") < act(f"{name}-selective") < act(f"{name}-none"), name
    for name in ("pp-1f1b", "pp-gpipe"):
        assert act(f"{name}-full") < act(f"{name}-none"), name
    # GPipe holds both micro-batches on the last stage, 1F1B one.
    assert (
        measured["pp-1f1b-none"].memory[1]["activations_bytes"]
        < (measured["pp-gpipe-none"].memory[1]["activations_bytes"])
    )
    for name in ("ddp", "fsdp-zero3"):
        assert act(f"{name}-lora-selective") < act(f"{name}-lora-none")
    assert act("ddp-lora-none") < act("ddp-none")
