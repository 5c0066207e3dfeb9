"""parallelism.deepspeed: a user's deepspeed_config.json read into the spec, refused where
it disagrees with it (both fields named), and the engine configuration etrain builds,
checked against the installed DeepSpeed's own config models."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from tests.support.specs import spec
from workers.spec import JobSpec
from workers.spec.deepspeed import DEEPSPEED_DEFAULTS, TUNING, engine_config


def ds_spec(deepspeed: dict | None = None, **overrides) -> dict:
    """A 2-worker DeepSpeed spec (global batch 16, micro 4: 2 accumulation steps)."""
    parallelism = {"strategy": "deepspeed", "deepspeed": deepspeed or {}}
    return spec(
        parallelism=parallelism,
        resources=overrides.pop("resources", {"workers": 2}),
        train={"global_batch_size": 16, "micro_batch_size": 4, **overrides.pop("train", {})},
        **overrides,
    )


def refusal(data: dict) -> str:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(data)
    return str(err.value)


# A team's config as Accelerate and the DeepSpeed docs write them: it agrees with ds_spec.
AGREEING = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.0,
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": [0.9, 0.999], "eps": 1e-8}},
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "none"},
        "overlap_comm": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": 1000,
    },
    "steps_per_print": 10,
    "wall_clock_breakdown": False,
}


def test_an_agreeing_config_fills_the_unset_zero_options():
    job = JobSpec.model_validate(ds_spec({"config": {**AGREEING, "bf16": {"enabled": "auto"}}}))
    # The driver validates the JSON the service hands it: the same spec again.
    again = JobSpec.model_validate_json(job.model_dump_json())
    assert again == job
    par = again.parallelism.deepspeed
    assert par.zero_config() == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "overlap_comm": True,
        "stage3_prefetch_bucket_size": 1000,
    }


# (config (or a change to AGREEING), fields the refusal must name)
DISAGREEING = {
    "global-batch": (
        {"train_batch_size": 32},
        ["config.train_batch_size", "train.global_batch_size"],
    ),
    "micro-batch": (
        {"train_micro_batch_size_per_gpu": 2},
        ["config.train_micro_batch_size_per_gpu", "train.micro_batch_size"],
    ),
    "accumulation": (
        {"gradient_accumulation_steps": 4},
        ["config.gradient_accumulation_steps", "train.global_batch_size"],
    ),
    "clipping": ({"gradient_clipping": 1.0}, ["config.gradient_clipping", "train.grad_clip"]),
    "optimizer-type": (
        {"optimizer": {"type": "SGD", "params": {}}},
        ["config.optimizer.type", "train.optimizer"],
    ),
    "optimizer-lr": (
        {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}},
        ["config.optimizer.params.lr", "train.lr"],
    ),
    "optimizer-betas": (
        {"optimizer": {"type": "AdamW", "params": {"betas": [0.8, 0.99]}}},
        ["config.optimizer.params.betas", "AdamW betas"],
    ),
    "bf16": ({"bf16": {"enabled": True}}, ["config.bf16.enabled", "train.precision"]),
    "fp16": ({"fp16": {"enabled": True}}, ["config.fp16", "train.precision"]),
    "scheduler": (
        {"scheduler": {"type": "WarmupLR", "params": {}}},
        ["config.scheduler", "train.warmup_steps"],
    ),
    "monitor-writes-files": (
        {"tensorboard": {"enabled": True, "output_path": "/etc"}},
        ["config.tensorboard", "metrics.tensorboard"],
    ),
    "unknown-key": ({"sparse_attention": {}}, ["config.sparse_attention", "zero_optimization"]),
    "zero-stage": (
        {"zero_optimization": {"stage": 1}},
        ["parallelism.deepspeed.zero_stage", "config.zero_optimization"],
    ),
    # DeepSpeed deletes and re-creates folders beneath nvme_path: the service chooses it.
    "nvme-path": (
        {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/"}}},
        ["config.zero_optimization.offload_param.nvme_path", "ETRAIN_POLICY_NVME_ROOT"],
    ),
    "zero-unknown": (
        {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}},
        ["config.zero_optimization.zero_hpz_partition_size"],
    ),
}


@pytest.mark.parametrize("name", list(DISAGREEING))
def test_a_disagreeing_config_is_refused_naming_both_fields(name):
    change, fields = DISAGREEING[name]
    deepspeed = {"zero_stage": 3, "config": {**AGREEING, **change}}
    message = refusal(ds_spec(deepspeed))
    for field in fields:
        assert field in message, (name, field, message)


def test_accumulation_steps_are_refused_for_an_elastic_job():
    data = ds_spec(
        {"config": {"gradient_accumulation_steps": 2}},
        resources={"workers": {"min": 1, "max": 2}},
    )
    assert "elastic" in refusal(data)


@pytest.mark.parametrize(
    ("deepspeed", "words"),
    [
        ({"zero_stage": 0, "offload_optimizer": "cpu"}, "offload_optimizer needs zero_stage"),
        ({"zero_stage": 2, "offload_param": "cpu"}, "offload_param needs zero_stage 3"),
        ({"zero_stage": 1, "overlap_comm": True}, "overlap_comm needs zero_stage 2 or 3"),
    ],
)
def test_options_the_stage_cannot_run_are_refused(deepspeed, words):
    assert words in refusal(ds_spec(deepspeed))


def test_deepspeed_options_under_another_strategy_are_refused():
    data = spec(parallelism={"strategy": "fsdp", "deepspeed": {"zero_stage": 3}})
    assert "parallelism.deepspeed is read by strategy 'deepspeed' only" in refusal(data)
    # A spec dumped with the defaults (as the service hands it to the driver) is no mistake.
    dumped = JobSpec.model_validate(spec()).model_dump(mode="json")
    assert JobSpec.model_validate(dumped).parallelism.strategy == "ddp"


def test_tensor_and_pipeline_degrees_are_refused():
    assert "parallelism.tp must be 1" in refusal(
        spec(parallelism={"strategy": "deepspeed", "tp": 2}, resources={"workers": 2})
    )


@pytest.fixture(scope="module")
def deepspeed_config():
    """The installed DeepSpeed's config classes (no process group: a world of 1)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return DeepSpeedConfig, DeepSpeedZeroConfig


def test_every_zero_option_and_default_is_deepspeeds(deepspeed_config):
    _, zero_config = deepspeed_config
    names = {f.alias or n for n, f in zero_config.model_fields.items()} | set(
        zero_config.model_fields
    )
    assert {"stage", "offload_optimizer", "offload_param", *TUNING} <= names
    defaults = zero_config()
    for key, value in DEEPSPEED_DEFAULTS.items():
        field = key.removeprefix("stage3_")
        assert getattr(defaults, field) == value, key


@pytest.mark.parametrize(
    "deepspeed",
    [
        {"zero_stage": 0},
        {"zero_stage": 1},
        {"zero_stage": 2, "offload_optimizer": "cpu", "overlap_comm": True},
        {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
        {"config": AGREEING},
    ],
)
def test_the_engine_config_is_what_deepspeed_reads(deepspeed_config, deepspeed):
    ds_config, _ = deepspeed_config
    clip = 0.0 if "config" in deepspeed else 0.5  # the config says 0.0
    job = JobSpec.model_validate(ds_spec(deepspeed, train={"grad_clip": clip}))
    config = engine_config(job.parallelism.deepspeed, train=job.train, accumulation=4)
    read = ds_config(config)  # validates as deepspeed.initialize does
    assert read.zero_optimization_stage == job.parallelism.deepspeed.zero_stage
    assert (read.train_micro_batch_size_per_gpu, read.gradient_accumulation_steps) == (4, 4)
    assert read.gradient_clipping == clip
    assert not read.bfloat16_config.enabled and not read.float16_config.enabled
    offload = read.zero_config.offload_optimizer
    assert (offload is not None and offload.device == "cpu") == (
        job.parallelism.deepspeed.offload_optimizer == "cpu"
    )


def test_clipping_off_is_said_to_deepspeed_whose_default_is_on(deepspeed_config):
    ds_config, _ = deepspeed_config
    job = JobSpec.model_validate(ds_spec())
    assert job.train.grad_clip == 0
    config = engine_config(job.parallelism.deepspeed, train=job.train, accumulation=2)
    assert ds_config(config).gradient_clipping == 0.0
    unsaid = {k: v for k, v in config.items() if k != "gradient_clipping"}
    assert ds_config(unsaid).gradient_clipping == 1.0  # why engine_config always says it


def test_nvme_offload_is_zero3_only_and_its_folder_is_the_workers():
    message = refusal(ds_spec({"zero_stage": 2, "offload_optimizer": "nvme"}))
    assert "nvme needs zero_stage 3" in message
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}
    ds = JobSpec.model_validate(ds_spec({"config": config})).parallelism.deepspeed
    assert (ds.offload_optimizer, ds.offload_param, ds.uses_nvme) == ("nvme", "none", True)
    with pytest.raises(ValueError, match="needs a swap folder"):
        ds.zero_config()


def test_the_nvme_engine_config_is_what_deepspeed_reads(deepspeed_config):
    ds_config, _ = deepspeed_config
    both = {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"}
    job = JobSpec.model_validate(ds_spec(both))
    nvme = {"nvme_path": "/nvme/team/j-1", "buffer_size": 262144}
    config = engine_config(job.parallelism.deepspeed, train=job.train, accumulation=2, nvme=nvme)
    zero = ds_config(config).zero_config
    assert zero.offload_param.device == zero.offload_optimizer.device == "nvme"
    assert (
        str(zero.offload_param.nvme_path)
        == str(zero.offload_optimizer.nvme_path)
        == nvme["nvme_path"]
    )
    assert zero.offload_param.buffer_size == 262144
