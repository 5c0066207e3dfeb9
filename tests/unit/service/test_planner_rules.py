"""Known answers of the pre-flight planner and its layout rules."""

from __future__ import annotations

import time

import pytest

from service.planner import planning
from service.planner.planning import GIB
from workers.models.config import count_params, get_model_config
from workers.spec import JobSpec


def plan_job(spec: JobSpec, **kwargs) -> dict:
    """The plan as its JSON: what ``POST /v1/plan`` answers."""
    return planning.plan_job(spec, **kwargs).model_dump(mode="json")


H100_NODE = {"nodes": 1, "gpus_per_node": 8, "gpu": "h100"}


def _gpu_spec(
    preset: str,
    *,
    workers: int,
    seq_len: int = 128,
    mbs: int = 1,
    gbs: int | None = None,
    **parallelism,
) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "p",
            "model": {"preset": preset},
            "data": {"seq_len": seq_len},
            "parallelism": parallelism or {"strategy": "ddp"},
            "resources": {"workers": workers, "gpus_per_worker": 1},
            "train": {
                "precision": "bf16",
                "micro_batch_size": mbs,
                "global_batch_size": gbs or mbs * workers,
            },
        }
    )


def _state(plan: dict) -> int:
    r = plan["per_rank"]
    return r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]


# -- known answers ------------------------------------------------------------------


def test_7b_adamw_bf16_ddp_does_not_fit_8x80gb():
    """16 bytes of model state per parameter (ZeRO paper: 2 + 2 + 12; here fp32 params 4 +
    fp32 grads 4 + two moments 8): 16 x 6.74e9 = 107.8 GB (112 GB for a round 7B) > 80 GB."""
    n = count_params(get_model_config("llama-7b"))
    plan = plan_job(_gpu_spec("llama-7b", workers=8), cluster=H100_NODE)
    assert _state(plan) == 16 * n
    assert _state(plan) > 80 * GIB
    assert plan["fits"] is False
    (error,) = plan["errors"]
    assert "model state 100.4 GiB" in error and "80.0 GiB" in error
    assert "set parallelism.strategy 'fsdp'" in error  # one node holds it sharded
    assert plan["recommendation"] == "fsdp"


def test_7b_fsdp_zero3_fits_8x80gb_with_about_14gb_of_state_per_rank():
    """8 x 4096 tokens per step, no accumulation: state 2 x 6.74e9 bytes, activations on top."""
    n = count_params(get_model_config("llama-7b"))
    plan = plan_job(
        _gpu_spec("llama-7b", workers=8, seq_len=4096, strategy="fsdp", fsdp={"zero_stage": 3}),
        cluster=H100_NODE,
    )
    assert plan["fits"] is True and plan["errors"] == []
    assert _state(plan) == 2 * n  # 16 bytes / 8 ranks
    assert 13e9 < _state(plan) < 14e9
    assert plan["per_rank"]["total_bytes"] < 80 * GIB
    assert plan["warnings"] == []  # FSDP is what this model needs here
    assert plan["step_estimate"]["comm_share"] < 0.2


def test_fsdp_gradient_accumulation_holds_unsharded_gradients():
    """FSDP2 without sync between micro-batches keeps fp32 unsharded gradients (4 x 6.74e9)."""
    n = count_params(get_model_config("llama-7b"))
    plan = plan_job(
        _gpu_spec("llama-7b", workers=8, seq_len=1024, gbs=64, strategy="fsdp"), cluster=H100_NODE
    )
    assert plan["breakdown"]["buffers"]["fsdp_unsharded_grad_accumulation"] == 4 * n
    assert any(
        "8 micro-batches per step keeps unsharded gradients" in w
        and "set resources.workers to 64" in w
        for w in plan["warnings"]
    )


def test_70b_on_32x80gb_keeps_tp_in_a_node_and_pp_or_fsdp_across_nodes():
    spec = _gpu_spec("llama-70b", workers=32, seq_len=1024, strategy="fsdp")
    plan = plan_job(spec, cluster={"nodes": 4, "gpus_per_node": 8, "gpu": "h100"})
    assert plan["fits"] is False  # FSDP alone: 80 layers of activations on every rank
    rec = plan["recommended_layout"]
    assert rec["fits"] and rec["tp"] == 8
    assert rec["pp"] > 1 or rec["dp"] > 1
    assert rec["tp"] * rec["pp"] * rec["dp"] == 32
    assert "tp 8" in plan["errors"][0]


def test_a_24gb_and_a_12gb_gpu_are_planned_at_12gb():
    spec = _gpu_spec("gpt-small", workers=2)
    for cluster in (
        {"nodes": 1, "gpus_per_node": 2, "gpu": ["rtx4090", "rtx3060"]},
        {"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": [24, 12]},
    ):
        plan = plan_job(spec, cluster=cluster)
        assert plan["breakdown"]["gpu_memory_bytes"] == 12 * GIB
        assert any("planned at the smallest (12 GiB)" in w for w in plan["warnings"])


def test_a_model_that_needs_12gb_does_not_fit_the_pair():
    # llama-1b, AdamW: 16 x 1.5e9 = 23 GiB of state: fits 24 GiB, not 12.
    spec = _gpu_spec("llama-1b", workers=2)
    plan = plan_job(spec, cluster={"nodes": 1, "gpus_per_node": 2, "gpu": ["rtx4090", "rtx3060"]})
    assert plan["fits"] is False and "smallest GPU has 12.0 GiB" in plan["errors"][0]


# -- layout rules ---------------------------------------------------------------------


def test_unneeded_fsdp_is_accepted_with_a_warning_naming_ddp():
    plan = plan_job(_gpu_spec("gpt-small", workers=4, strategy="fsdp"), cluster=H100_NODE)
    assert plan["fits"] is True
    assert plan["recommendation"] == "ddp"
    warning = next(w for w in plan["warnings"] if "is not needed" in w)
    assert "parallelism.strategy 'fsdp' is not needed" in warning
    assert "set parallelism.strategy 'ddp'" in warning


def test_unneeded_tp_when_fsdp_fits_one_node():
    spec = _gpu_spec("llama-7b", workers=8, strategy="tp", tp=2)
    plan = plan_job(spec, cluster=H100_NODE)
    assert any("tp 2 x pp 1 is not needed" in w and "'fsdp'" in w for w in plan["warnings"])


def test_tp_larger_than_a_node_is_refused():
    spec = _gpu_spec("llama-7b", workers=16, strategy="tp", tp=16)
    plan = plan_job(spec, cluster={"nodes": 2, "gpus_per_node": 8, "gpu": "h100"})
    assert plan["fits"] is False
    assert any("parallelism.tp (16)" in e and "<= 8" in e for e in plan["errors"])


def test_tp_without_nvlink_warns_and_prefers_zero():
    spec = _gpu_spec("gpt-small", workers=2, strategy="tp", tp=2, seq_len=1024, mbs=8)
    plan = plan_job(spec, cluster={"nodes": 1, "gpus_per_node": 2, "gpu": "l40s"})
    warning = next(w for w in plan["warnings"] if "without NVLink" in w)
    assert "pcie4 (32 GB/s)" in warning and "'fsdp'" in warning


def test_communication_dominated_layout_warns():
    # 7B sharded over 16 single-GPU nodes on 10 GbE: gathers dwarf a tiny batch's compute.
    spec = _gpu_spec("llama-7b", workers=16, strategy="fsdp")
    plan = plan_job(
        spec, cluster={"nodes": 16, "gpus_per_node": 1, "gpu": "h100", "network": "ethernet-10g"}
    )
    step = plan["step_estimate"]
    assert step["comm_share"] > 0.5
    assert any("communication dominates" in w for w in plan["warnings"])


def test_candidates_estimate_step_time_and_communication_share():
    plan = plan_job(_gpu_spec("llama-7b", workers=8, strategy="fsdp"), cluster=H100_NODE)
    names = {c["layout"] for c in plan["candidates"]}
    assert {"ddp dp=8", "fsdp zero3 dp=8", "tp tp=8 dp=1"} <= names
    for c in plan["candidates"]:
        assert c["step_s"] > 0 and 0 <= c["comm_share"] < 1


def test_unknown_gpu_name_is_an_error_naming_the_field():
    plan = plan_job(_gpu_spec("gpt-small", workers=2), cluster={"gpu": "tpu-v5"})
    assert any(e.startswith("cluster.gpu 'tpu-v5' is unknown") for e in plan["errors"])


def test_offload_needs_host_memory_per_node():
    spec = _gpu_spec(
        "llama-7b", workers=8, strategy="fsdp", fsdp={"zero_stage": 3, "cpu_offload": True}
    )
    plan = plan_job(spec, cluster={**H100_NODE, "host_memory_gb": 64})
    assert plan["per_rank"]["params_bytes"] == 0  # on the host
    assert plan["breakdown"]["host"]["cpu_offload_state"] > 13e9
    assert any("host memory per node" in e and "cpu_offload false" in e for e in plan["errors"])
    assert plan_job(spec, cluster={**H100_NODE, "host_memory_gb": 512})["fits"]


def test_more_gpus_than_the_cluster_has_is_a_warning():
    plan = plan_job(_gpu_spec("gpt-small", workers=16), cluster=H100_NODE)
    assert any("needs 16 GPUs but the cluster has 8" in w for w in plan["warnings"])


@pytest.mark.parametrize("example", ["llama-7b-fsdp-8gpu", "llama-70b-hybrid-32gpu"])
def test_planning_an_example_takes_milliseconds(example):
    import pathlib

    import yaml

    path = pathlib.Path(__file__).resolve().parents[3] / "examples" / f"{example}.yaml"
    spec = JobSpec.model_validate(yaml.safe_load(path.read_text()))
    cluster = {"nodes": 4, "gpus_per_node": 8, "gpu": "h100"}
    plan_job(spec, cluster=cluster)
    t0 = time.perf_counter()
    plan_job(spec, cluster=cluster)
    assert time.perf_counter() - t0 < 0.25  # typically a few ms; loose for shared CI


ZERO1_WARNING = (
    "parallelism.fsdp.zero_stage 1 runs as stage 2: FSDP2 has no "
    "optimizer-state-only mode, so gradients are sharded too (less memory than "
    "ZeRO-1); set zero_stage 2 to make this explicit"
)


def _zero(strategy: str, stage: int) -> dict:
    return plan_job(
        JobSpec.model_validate(
            {"name": "z", "parallelism": {"strategy": strategy, "fsdp": {"zero_stage": stage}}}
        )
    )


def test_zero_stage_1_is_planned_as_stage_2_and_says_so():
    zero1, zero2 = _zero("fsdp", 1), _zero("fsdp", 2)
    assert zero1["fits"] and zero1["errors"] == []
    assert ZERO1_WARNING in zero1["warnings"]
    assert zero1["per_rank"] == zero2["per_rank"]  # the memory of what actually runs
    assert not any("zero_stage" in w for w in zero2["warnings"] + _zero("fsdp", 3)["warnings"])


def test_zero_stage_is_not_mentioned_for_ddp_which_shards_nothing():
    assert not any("zero_stage" in w for w in _zero("ddp", 1)["warnings"])
