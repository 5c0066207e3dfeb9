"""The specs a report submits: the user's spec with one thing changed per variant.

Each variant keeps the spec's global batch (so every run does the same maths)
and is named ``report-<kind>-<variant>``. The server validates them; nothing
here second-guesses it beyond what a variant needs to be well-formed.
"""

from __future__ import annotations

import copy
from typing import Any

MEMORY_STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "zero2": {"strategy": "fsdp", "fsdp": {"zero_stage": 2, "cpu_offload": False}},
    "zero3": {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": False}},
    "zero3-offload": {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": True}},
    "ds-zero0": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 0}},
    "ds-zero1": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 1}},
    "ds-zero2": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}},
    "ds-zero3": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
    "ds-zero3-offload": {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    },
}
# What a ``ds-*`` variant keeps of the spec's own ``parallelism.deepspeed``: everything but
# the stage and offload the variant sets, and the config file (its ZeRO tuning is read in).
_DS_SET_BY_VARIANT = ("zero_stage", "offload_optimizer", "offload_param", "config")
_DS_CONFIG_SKIPPED = ("stage", "offload_optimizer", "offload_param")


def _section(spec: dict[str, Any], key: str) -> dict[str, Any]:
    """``spec[key]`` as a mapping (created when missing; ValueError when not a mapping)."""
    value = spec.setdefault(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping")
    return value


def variant(
    spec: dict[str, Any], kind: str, name: str, *, steps: int | None = None
) -> dict[str, Any]:
    """A copy of ``spec`` named ``report-<kind>-<name>``, with ``train.steps`` set when given
    (its warm-up shortened to fit: the server requires warmup_steps < steps)."""
    out = copy.deepcopy(spec)
    out["name"] = f"report-{kind}-{name}"
    if steps is not None:
        train = _section(out, "train")
        train["steps"] = steps
        warm = train.get("warmup_steps")
        if isinstance(warm, int) and warm >= steps:
            train["warmup_steps"] = steps - 1
    return out


def scaling_specs(
    spec: dict[str, Any], workers: list[int], *, steps: int | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """One fixed-size spec per world size (an elastic range becomes that size; an explicit
    data-parallel degree is dropped so it follows the workers)."""
    out = []
    for n in workers:
        one = variant(spec, "scaling", f"w{n}", steps=steps)
        _section(one, "resources")["workers"] = n
        _section(one, "parallelism").pop("dp", None)
        out.append((n, one))
    return out


def deepspeed_tuning(spec: dict[str, Any], stage: int) -> dict[str, Any]:
    """What a ``ds-*`` variant at ZeRO ``stage`` keeps of the spec's own
    ``parallelism.deepspeed``: its tuning (``reduce_bucket_size``, the stage-3 limits...),
    given directly or in its ``config``'s ``zero_optimization`` ("auto" left out), but not
    the stage and offload the variant sets; ``overlap_comm`` only at stages 2 and 3 (the
    server refuses it below, where gradients are reduced once, after backward)."""
    parallelism = spec.get("parallelism")
    section = parallelism.get("deepspeed") if isinstance(parallelism, dict) else None
    if not isinstance(section, dict):
        return {}
    config = section.get("config")
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    out = {
        k: v
        for k, v in (zero.items() if isinstance(zero, dict) else ())
        if k not in _DS_CONFIG_SKIPPED and v != "auto"
    }
    out.update({k: v for k, v in section.items() if k not in _DS_SET_BY_VARIANT})
    if stage < 2:
        out.pop("overlap_comm", None)
    return out


def _names_error(names: list[str], at_least: int) -> str | None:
    """What is wrong with ``names`` as strategies to run (None when nothing is)."""
    unknown = [n for n in names if n not in MEMORY_STRATEGIES]
    if unknown or not names:
        return f"unknown {', '.join(unknown) or '(none given)'}"
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return f"{', '.join(repeated)} given twice"
    if len(names) < at_least:
        return f"give at least {at_least} (got {', '.join(names)})"
    return None


def memory_specs(
    spec: dict[str, Any],
    *,
    steps: int | None = None,
    strategies: list[str] | None = None,
    kind: str = "memory",
    at_least: int = 1,
) -> list[tuple[str, dict[str, Any]]]:
    """The spec as each of ``strategies`` (default: every one of MEMORY_STRATEGIES), named
    ``report-<kind>-<strategy>``; its ``parallelism`` is the strategy's, and a ``ds-*`` one
    keeps the spec's DeepSpeed tuning (:func:`deepspeed_tuning`). ValueError naming
    ``--strategies`` when a name is unknown or repeated, or fewer than ``at_least`` are given."""
    names = list(MEMORY_STRATEGIES) if strategies is None else strategies
    why = _names_error(names, at_least)
    if why:
        raise ValueError(f"--strategies: {why}; choose from {', '.join(MEMORY_STRATEGIES)}")
    out = []
    for name in names:
        one = variant(spec, kind, name, steps=steps)
        one["parallelism"] = copy.deepcopy(MEMORY_STRATEGIES[name])
        ds = one["parallelism"].get("deepspeed")
        if ds is not None:
            ds.update(deepspeed_tuning(spec, ds["zero_stage"]))
        out.append((name, one))
    return out


def accumulation_specs(
    spec: dict[str, Any], micros: list[int], *, steps: int | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """(micro, spec) per micro-batch size at the spec's global batch. The accumulation
    steps follow from the data-parallel degree the API gives (:func:`accumulation_steps`)."""
    out = []
    for micro in micros:
        one = variant(spec, "accumulation", f"m{micro}", steps=steps)
        train = _section(one, "train")
        train["micro_batch_size"] = micro
        train.setdefault("global_batch_size", 16)
        out.append((micro, one))
    return out


def accumulation_steps(spec: dict[str, Any], dp: int) -> int:
    """Micro-batches per optimizer step of ``spec`` at data-parallel degree ``dp`` (the
    API's ``data_parallel``); ValueError naming the micro-batch when the global batch is
    not a multiple of micro x dp."""
    train = _section(spec, "train")
    micro, global_batch = train["micro_batch_size"], train["global_batch_size"]
    if not isinstance(global_batch, int) or global_batch % (micro * dp):
        raise ValueError(
            f"train.global_batch_size ({global_batch}) is not a multiple of "
            f"--micro {micro} x data-parallel degree {dp}"
        )
    return global_batch // (micro * dp)
