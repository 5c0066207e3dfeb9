"""The hardware table and the cluster a plan is made for."""

from __future__ import annotations

import pytest

from service.planner.hardware import GIB, GPUS, LINKS, cluster_from_nodes, find_gpu, resolve_cluster


@pytest.mark.parametrize(
    ("name", "key", "memory_gib"),
    [
        ("H100-80GB", "h100", 80),
        ("H200", "h200", 141),
        ("A100-80G", "a100", 80),
        ("L40S", "l40s", 48),
        ("NVIDIA GeForce RTX 4090", "rtx4090", 24),
        ("RTX 3060", "rtx3060", 12),
    ],
)
def test_known_gpus_by_the_names_users_and_ray_give(name, key, memory_gib):
    gpu = find_gpu(name)
    assert gpu is GPUS[key] and gpu.memory_gib == memory_gib and gpu.bf16_tflops > 0


def test_links_of_the_issue():
    assert LINKS["pcie4"].gbps == 32 and LINKS["nvlink4"].gbps == 900
    assert LINKS["nvlink4"].is_nvlink and not LINKS["pcie4"].is_nvlink


def test_a_gpu_brings_its_memory_link_and_network():
    hw, errors = resolve_cluster({"nodes": 2, "gpus_per_node": 8, "gpu": "h100"})
    assert errors == []
    assert hw.gpu_memory_bytes == 80 * GIB and hw.link.name == "nvlink4"
    assert hw.network.name == "ib-ndr" and hw.tflops("fp32") == hw.tflops("bf16") / 2


def test_explicit_memory_and_interconnect_win():
    hw, _ = resolve_cluster({"gpu": "h100", "gpu_memory_gb": 40, "interconnect": "pcie"})
    assert hw.gpu_memory_bytes == 40 * GIB and hw.link.name == "pcie4"


def test_mixed_gpus_plan_at_the_smallest_and_slowest():
    hw, _ = resolve_cluster({"gpu": ["rtx4090", "rtx3060"]})
    assert hw.heterogeneous and hw.gpu_memory_bytes == 12 * GIB
    assert hw.bf16_tflops == GPUS["rtx3060"].bf16_tflops


@pytest.mark.parametrize(
    ("cluster", "field"),
    [
        ({"gpu": "tpu"}, "cluster.gpu"),
        ({"interconnect": "carrier-pigeon"}, "cluster.interconnect"),
        ({"network": "dialup"}, "cluster.network"),
    ],
)
def test_unknown_names_are_errors_naming_the_field(cluster, field):
    _, errors = resolve_cluster(cluster)
    assert len(errors) == 1 and errors[0].startswith(field)


def test_cluster_from_ray_resources():
    nodes = [
        {"resources": {"CPU": 8.0, "memory": 32 * GIB}},  # a CPU-only head
        *[
            {
                "resources": {
                    "CPU": 96.0,
                    "GPU": 8.0,
                    "memory": 512 * GIB,
                    "accelerator_type:H100": 1.0,
                }
            }
        ]
        * 2,
    ]
    shape = cluster_from_nodes(nodes)
    assert shape == {
        "nodes": 3,
        "cpus_per_node": 96.0,
        "gpus_per_node": 8,
        "gpu": "H100",
        "host_memory_gb": 512.0,
    }
    hw, errors = resolve_cluster(shape)
    assert errors == [] and hw.gpu_memory_bytes == 80 * GIB
    assert cluster_from_nodes([]) == {}
