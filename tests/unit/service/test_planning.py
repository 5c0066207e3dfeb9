"""The first planner: memory per rank and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.planner import planning
from service.planner.planning import GIB
from tests.support.specs import PER_RANK_KEYS, spec
from workers.models.config import count_params, get_model_config
from workers.spec import JobSpec, parse_spec


def plan_job(spec: JobSpec, **kwargs) -> dict:
    """The plan as its JSON: what ``POST /v1/plan`` answers."""
    return planning.plan_job(spec, **kwargs).model_dump(mode="json")


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize("preset", ["gpt-tiny", "gpt-small", "llama-1b", "llama-7b"])
@pytest.mark.parametrize(
    ("train", "optimizer_per_param"),
    [
        ({"optimizer": "adamw"}, 8),  # exp_avg + exp_avg_sq in fp32
        ({"optimizer": "sgd", "momentum": 0.9}, 4),  # one momentum buffer
        ({"optimizer": "sgd", "momentum": 0.0}, 0),  # stateless
    ],
    ids=["adamw", "sgd-momentum", "sgd-plain"],
)
def test_per_rank_bytes_follow_the_parameter_count(preset, train, optimizer_per_param):
    plan = plan_job(parse_spec(spec(model={"preset": preset}, train=train)))
    n = count_params(get_model_config(preset))
    per_rank = plan["per_rank"]
    assert plan["num_params"] == n
    assert set(per_rank) == PER_RANK_KEYS
    assert per_rank["params_bytes"] == 4 * n
    assert per_rank["grads_bytes"] == 4 * n
    assert per_rank["optimizer_bytes"] == optimizer_per_param * n
    # DDP's buckets are the gradients (gradient_as_bucket_view): no extra bucket memory.
    # The old estimate added min(4n, 50 MiB) here. What is left: the rotary table and the
    # fp32 logits gradient of one micro-batch (4 x 128 tokens x vocab).
    cfg = get_model_config(preset)
    assert per_rank["buffers_bytes"] == (
        cfg.max_seq_len * cfg.head_dim * 4 + 4 * 4 * 128 * cfg.vocab_size
    )
    assert per_rank["activations_bytes"] > 0
    assert per_rank["total_bytes"] == sum(v for k, v in per_rank.items() if k != "total_bytes")


def test_num_params_of_gpt_tiny():
    # 2 x (attention 2*64*64 + 2*64*32, ffn 3*64*128, norms 2*64) + embed/head 2*256*64 + norm 64
    assert plan_job(parse_spec(spec()))["num_params"] == 2 * (12288 + 24576 + 128) + 32768 + 64


def test_activations_scale_with_micro_batch_and_shrink_with_bf16():
    small = plan_job(parse_spec(spec(train={"global_batch_size": 16, "micro_batch_size": 4})))
    large = plan_job(parse_spec(spec(train={"global_batch_size": 16, "micro_batch_size": 8})))
    bf16 = plan_job(parse_spec(spec(train={"micro_batch_size": 4, "precision": "bf16"})))
    a = small["per_rank"]["activations_bytes"]
    assert abs(large["per_rank"]["activations_bytes"] - 2 * a) <= 1
    assert bf16["per_rank"]["activations_bytes"] < a


def test_a_good_ddp_job_plans_clean():
    plan = plan_job(parse_spec(spec()))
    assert plan["fits"] is True
    assert plan["errors"] == [] and plan["warnings"] == []
    assert plan["recommendation"] == "ddp"
    assert plan["layout"] == {
        "strategy": "ddp",
        "workers": 2,
        "dp": 2,
        "data_parallel": {"min": 2, "max": 2, "current": None},
        "tp": 1,
        "pp": 1,
        "grad_accum_steps": 2,
    }


def test_layout_of_an_elastic_job_uses_min_workers():
    plan = plan_job(
        parse_spec(
            spec(
                resources={"workers": {"min": 1, "max": 4}},
                train={"global_batch_size": 48, "micro_batch_size": 4},
            )
        )
    )
    assert plan["layout"]["workers"] == {"min": 1, "max": 4}
    assert plan["layout"]["dp"] == 1 and plan["layout"]["grad_accum_steps"] == 12
    assert plan["layout"]["data_parallel"] == {"min": 1, "max": 4, "current": None}


def test_async_checkpoint_plans_host_staging_memory():
    sync, asyn = (
        plan_job(parse_spec(spec())),
        plan_job(parse_spec(spec(checkpoint={"async": True}))),
    )
    assert asyn["fits"] and not asyn["errors"], asyn["errors"]
    assert asyn["breakdown"]["host"] != sync["breakdown"]["host"]


def test_tiny_gpu_does_not_fit():
    plan = plan_job(
        parse_spec(spec(resources={"gpus_per_worker": 1})), cluster={"gpu_memory_gb": 0.001}
    )
    assert plan["fits"] is False
    assert plan["recommendation"] is None
    assert any("GiB" in e and "micro_batch_size" in e for e in plan["errors"])


def test_llama_7b_adamw_does_not_fit_an_80gb_gpu_unsharded():
    # 16 bytes/param of weights, grads and AdamW state alone is ~100 GiB for 6.7B parameters.
    plan = plan_job(
        parse_spec(
            spec(
                model={"preset": "llama-7b"},
                resources={"gpus_per_worker": 1},
                data={"seq_len": 128},
                train={"micro_batch_size": 1, "global_batch_size": 2},
            )
        ),
        cluster={"gpu_memory_gb": 80},
    )
    assert plan["per_rank"]["total_bytes"] > 80 * GIB
    assert plan["fits"] is False


@pytest.mark.parametrize("cluster", [None, {}, {"gpu_memory_gb": 0.001}])
def test_cpu_jobs_are_not_checked_against_gpu_memory(cluster):
    plan = plan_job(parse_spec(spec()), cluster=cluster)
    assert plan["fits"] is True and plan["errors"] == []


def test_gpu_job_that_fits():
    plan = plan_job(
        parse_spec(spec(resources={"gpus_per_worker": 1})), cluster={"gpu_memory_gb": 80}
    )
    assert plan["fits"] is True and plan["errors"] == []


def _layout_spec(**par):
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"preset": "gpt-small"},
            "parallelism": par,
            "resources": {"workers": 4, "gpus_per_worker": 1},
            "train": {"global_batch_size": 16, "micro_batch_size": 2, "steps": 10},
        }
    )


def test_tp_group_spanning_nodes_is_refused_with_the_field():
    plan = plan_job(_layout_spec(strategy="tp", tp=4), cluster={"gpus_per_node": 2})
    assert not plan["fits"]
    assert any("parallelism.tp (4)" in e and "<= 2" in e for e in plan["errors"])
    fine = plan_job(_layout_spec(strategy="tp", tp=2), cluster={"gpus_per_node": 2})
    assert not fine["errors"]
    assert fine["fits"] is None and fine["verdict"] == "unknown"  # no GPU memory given
    sized = {"gpus_per_node": 2, "gpu": "a100"}
    assert plan_job(_layout_spec(strategy="tp", tp=2), cluster=sized)["fits"] is True


@pytest.mark.parametrize(
    "cluster,why",
    [
        ({}, "GPUs' model and memory are unknown"),
        ({"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 2}, "the cluster has no GPUs"),
    ],
)
def test_gpu_job_without_known_gpu_memory_is_unknown_not_fits(cluster, why):
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "model": {"preset": "llama-7b"},
            "resources": {"workers": 2, "gpus_per_worker": 1},
        }
    )
    plan = plan_job(spec, cluster=cluster)
    assert plan["fits"] is None and plan["verdict"] == "unknown"
    assert why in plan["unknown_reason"] and "--gpu" in plan["unknown_reason"]
    assert plan["recommendation"] is None and plan["recommended_layout"] is None
    assert all(c["fits"] is None for c in plan["candidates"])


def test_gpu_job_on_a_cluster_without_gpus_is_not_told_to_shrink_to_zero():
    spec = parse_spec(yaml.safe_load((EXAMPLES / "llama-70b-hybrid-32gpu.yaml").read_text()))
    plan = plan_job(spec, cluster={"nodes": 1, "gpus_per_node": 0, "cpus_per_node": 2})
    text = " ".join(plan["errors"] + plan["warnings"])
    assert "<= 0" not in text and not plan["errors"]
    assert "has none now" in text
    assert plan["recommendation"] is None


@pytest.mark.parametrize(
    "par", [{"strategy": "ddp"}, {"strategy": "fsdp"}, {"strategy": "tp", "tp": 2}]
)
def test_candidate_rows_are_unique(par):
    """The job's own layout is listed once, not again as one of the alternatives."""
    cluster = {"gpu": "a100", "gpus_per_node": 4, "nodes": 1}
    rows = [c["layout"] for c in plan_job(_layout_spec(**par), cluster=cluster)["candidates"]]
    assert len(rows) > 3 and len(rows) == len(set(rows))


def _gpt_small_numel():
    cfg = get_model_config("gpt-small")
    h, kv, f, v = cfg.dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden, cfg.vocab_size
    linears = 2 * h * h + 2 * kv * h + 3 * f * h  # what TP splits
    return cfg, linears, 2 * h, v * h  # norms and embedding (or head) stay whole under TP


@pytest.mark.parametrize(
    "par,expected",
    [
        (
            {"strategy": "ddp"},
            lambda n_layers, lin, norms, emb: n_layers * (lin + norms) + 2 * emb + 256,
        ),
        (
            {"strategy": "fsdp"},
            lambda n_layers, lin, norms, emb: (n_layers * (lin + norms) + 2 * emb + 256) / 4,
        ),
        # TP splits the block projections only; FSDP then shards everything over dp = 2. The
        # old estimate divided everything by tp x dp, which is wrong for the replicated parts.
        (
            {"strategy": "tp", "tp": 2},
            lambda n_layers, lin, norms, emb: (n_layers * (lin / 2 + norms) + 2 * emb + 256) / 2,
        ),
        # pp 2 x tp 2: the plan shows the worst rank, the first stage (two micro-batches in
        # flight under 1F1B): 2 layers and the embedding.
        (
            {"strategy": "hybrid", "tp": 2, "pp": 2, "pipeline": {"microbatches": 2}},
            lambda n_layers, lin, norms, emb: 2 * (lin / 2 + norms) + emb,
        ),
    ],
)
def test_model_state_per_rank_follows_the_sharding(par, expected):
    cfg, lin, norms, emb = _gpt_small_numel()
    got = plan_job(_layout_spec(**par))["per_rank"]["params_bytes"]
    assert got == 4 * expected(cfg.n_layers, lin, norms, emb)


def test_elastic_range_with_model_parallel_degrees_plans_in_dp():
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "model": {"preset": "gpt-small"},
            "parallelism": {"strategy": "tp", "tp": 2},
            "resources": {"workers": {"min": 2, "max": 4}},
            "train": {"global_batch_size": 16, "micro_batch_size": 2},
        }
    )
    plan = plan_job(spec)
    assert plan["fits"] and not plan["errors"], plan["errors"]
    assert (plan["layout"]["tp"], plan["layout"]["dp"]) == (2, 1)  # at the minimum size
    ddp = JobSpec.model_validate(
        {
            "name": "t",
            "resources": {"workers": {"min": 1, "max": 4}},
            "train": {"global_batch_size": 48, "micro_batch_size": 4},
        }
    )
    assert plan_job(ddp)["fits"] and not plan_job(ddp)["warnings"]
