"""Step time and communication share of a layout on a cluster. Pure Python.

Compute is 6 x parameters x tokens (forward + backward) plus causal
attention, at an assumed model-FLOPs utilisation of the GPU's dense peak,
stretched by the pipeline bubble (pp - 1) / (v x microbatches). Communication
is the bytes each rank sends with ring collectives (all-reduce 2(n-1)/n,
all-gather and reduce-scatter (n-1)/n of the buffer) over the link its group
lives on: the intra-node link when the group's consecutive ranks fit in one
node (tp innermost, then dp, then pp), else the network. Communication is
counted as not overlapped, so the share is an upper bound. CPU offload adds
the host link (PCIe 4.0 x16 assumed) but not the optimizer step on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.planner.hardware import LINKS, ClusterHardware, Link
from service.planner.memory_model import FP32, Layout, Workload
from workers.models.config import count_params

MFU = 0.4  # assumed fraction of the dense peak a well-tuned step reaches
COMM_DOMINATES = 0.5  # warn when communication is more than this share of the step


@dataclass(frozen=True)
class StepEstimate:
    """Estimated seconds per optimizer step, split into compute and communication."""

    compute_s: float
    comm_s: float
    comm_by_group: dict

    @property
    def step_s(self) -> float:
        """Compute plus communication (no overlap assumed)."""
        return self.compute_s + self.comm_s

    @property
    def comm_share(self) -> float:
        """Fraction of the step spent communicating."""
        return self.comm_s / self.step_s if self.step_s else 0.0


def _group_link(span_ranks: int, hw: ClusterHardware, gpus_per_worker: int) -> Link | None:
    """The link a group of ``span_ranks`` consecutive ranks talks over."""
    per_node = (hw.gpus_per_node or 0) // max(1, gpus_per_worker)
    if per_node and span_ranks <= per_node:
        return hw.link
    return hw.network or hw.link


def _ring(n: int, kind: str) -> float:
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def _comm_seconds(nbytes: float, link: Link | None) -> float:
    return nbytes / (link.gbps * 1e9) if link else 0.0


def estimate_step(
    work: Workload, layout: Layout, hw: ClusterHardware, *, gpus_per_worker: int = 1
) -> StepEstimate | None:
    """Seconds per optimizer step of ``layout``; None without a known GPU throughput."""
    tflops = hw.tflops(work.precision)
    if tflops is None or not work.on_gpu:
        return None
    cfg = work.cfg
    n = count_params(cfg)
    tokens = work.global_batch_size * work.seq_len
    # Causal attention: 6 * layers * seq * dim per token for QK^T and AV, forward + backward.
    # LoRA: the frozen base needs no weight gradients, a third less backward work.
    flops = tokens * ((4 if work.lora else 6) * n + 6 * cfg.n_layers * work.seq_len * cfg.dim)
    if work.recompute == "full":
        flops *= 8 / 6  # one more forward (selective redoes only element-wise ops)
    compute = flops / layout.world / (tflops * 1e12 * MFU)
    if layout.pp > 1:
        compute *= 1 + (layout.pp - 1) / (layout.stages_per_rank * layout.microbatches)

    calls = work.calls_per_step(layout)
    micro = calls * (layout.microbatches if layout.pp > 1 else 1)  # micro-batches per dp rank
    act = work.micro_batch_size * work.seq_len * cfg.dim
    local = n / layout.pp / layout.tp  # parameters one rank's part holds before FSDP
    groups: dict[str, float] = {}
    if layout.tp > 1:
        layers = cfg.n_layers / layout.pp
        # Two all-reduces of the block's activations forward, two backward.
        nbytes = micro * layers * 4 * act * work.compute_bytes * _ring(layout.tp, "all_reduce")
        groups["tp"] = _comm_seconds(nbytes, _group_link(layout.tp, hw, gpus_per_worker))
    if layout.dp > 1:
        link = _group_link(layout.tp * layout.dp, hw, gpus_per_worker)
        gathers = calls * (2 if layout.zero_stage == 3 else 1)
        if layout.shards_params:
            nbytes = (gathers * local * work.compute_bytes + local * FP32) * _ring(layout.dp, "ag")
        else:
            nbytes = local * FP32 * _ring(layout.dp, "all_reduce")
        groups["dp"] = _comm_seconds(nbytes, link)
        if layout.cpu_offload and (layout.fsdp or layout.zero is not None):
            # Shards go host -> device for every all-gather and gradients come back.
            shard = local / layout.dp
            nbytes = (gathers + 1) * shard * FP32
            groups["offload"] = _comm_seconds(nbytes, LINKS["pcie4"])
    if layout.pp > 1:
        # Each micro-batch crosses every stage boundary forward and back.
        nbytes = 2 * micro * act * FP32 * layout.stages_per_rank
        groups["pp"] = _comm_seconds(nbytes, _group_link(layout.world, hw, gpus_per_worker))
    return StepEstimate(compute_s=compute, comm_s=sum(groups.values()), comm_by_group=groups)
