"""Latency of the pre-flight planner on the example specs (it runs on every submit).

For each ``examples/*.yaml`` spec, plans it on the cluster it is written for
(CPU examples: no cluster, as a laptop's Ray head reports none; GPU examples:
4 nodes x 8 H100 over InfiniBand NDR) and times ``plan_job`` alone and spec
validation plus ``plan_job`` (what a submit pays), then prints one table.

    .venv/bin/python bench/plan.py [--repeats 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.planner import plan_job  # noqa: E402
from workers.spec import JobSpec  # noqa: E402

GPU_CLUSTER = {"nodes": 4, "gpus_per_node": 8, "gpu": "h100", "network": "ib-ndr"}


def _time(fn, repeats: int) -> list[float]:
    fn()  # warm caches (stage splits) and imports
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def bench(repeats: int) -> list[dict]:
    """One row per example: plan verdict and latency percentiles in milliseconds."""
    rows = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        spec = JobSpec.model_validate(raw)
        cluster = GPU_CLUSTER if spec.resources.gpus_per_worker else None
        plan = plan_job(spec, cluster=cluster)
        plan_ms = _time(lambda spec=spec, cluster=cluster: plan_job(spec, cluster=cluster), repeats)
        submit_ms = _time(
            lambda raw=raw, cluster=cluster: plan_job(JobSpec.model_validate(raw), cluster=cluster),
            repeats,
        )
        rows.append(
            {
                "spec": path.stem,
                "cluster": "4x8 h100" if cluster else "none (cpu)",
                "fits": plan.fits,
                "recommendation": plan.recommendation,
                "candidates": len(plan.candidates),
                "plan_ms_median": statistics.median(plan_ms),
                "plan_ms_p95": sorted(plan_ms)[int(0.95 * len(plan_ms)) - 1],
                "validate_plan_ms_median": statistics.median(submit_ms),
            }
        )
    return rows


def main() -> None:
    """Run and print the table (and optionally write JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = bench(args.repeats)
    header = (
        "spec",
        "cluster",
        "fits",
        "recommendation",
        "candidates",
        "plan ms (median)",
        "plan ms (p95)",
        "validate+plan ms (median)",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print(
            f"| {r['spec']} | {r['cluster']} | {r['fits']} | {r['recommendation']} | "
            f"{r['candidates']} | {r['plan_ms_median']:.2f} | {r['plan_ms_p95']:.2f} | "
            f"{r['validate_plan_ms_median']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
